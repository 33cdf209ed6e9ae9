//! Input: the API tokens file (`--api-tokens FILE`): who may pull which lever.
//!
//! ```yaml
//! tokens:
//!   - name: oncall-acme                 # shown as the author of what it does
//!     sha256: 5e8848…42d8               # SHA-256 of the token, 64 hex digits
//!     verbs: [drain, undrain, freeze, resume, usage, policy, audit]
//!     names: [a.example.com]            # optional: these names…
//!     tenants: [acme]                   # optional: …and the names of these tenants
//!     regions: [europe, GB]             # optional: drains only with these `where:` entries
//!     cdns: [fastly]                    # optional: usage records only of these CDNs
//!     require_ticket: true              # optional: every mutation carries `ticket`
//! ```
//!
//! Only hashes are stored (`printf %s "$TOKEN" | sha256sum`); a bearer token is hashed
//! and compared with every entry in a time that does not depend on where they differ.
//! Without `names` and `tenants` a token may touch every name; with either, only those
//! names and the names of those tenants. Without `regions` a drain may have any scope;
//! with it, every entry of a drain's `where:` must be listed (so a drain everywhere, a
//! global freeze or resume are refused). Usage records are of a CDN that every tenant
//! may share: a token reports only for the CDNs its `cdns` lists, or, without `cdns`,
//! when it is limited by neither names nor tenants. A drain that would end another
//! author's drain of the same name, CDN and scope sooner needs `undrain` as well (a
//! later `until` only extends it). The file must be readable by its owner only.

use std::path::Path;
use std::sync::Arc;

use serde::Deserialize;

use super::{locate, yaml_issue, HostPolicy, Seg};
use crate::error::{ConfigIssue, Issues};

/// What a token may do: one verb per kind of mutation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verb {
    /// `POST /v1/drains`.
    Drain,
    /// `DELETE /v1/drains/{id}`.
    Undrain,
    /// `POST /v1/failover/freeze`.
    Freeze,
    /// `POST /v1/failover/resume`.
    Resume,
    /// Usage records (`POST /v1/usage`).
    Usage,
    /// A new policy version, a rollback, a halt (`POST /v1/policy`, `/rollback`,
    /// `/halt`); only for a token limited by neither names, tenants nor regions.
    Policy,
    /// Reading the audit log (`GET /v1/audit`) from a source outside `--api-audit-open`
    /// (loopback by default).
    Audit,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Drain => "drain",
            Verb::Undrain => "undrain",
            Verb::Freeze => "freeze",
            Verb::Resume => "resume",
            Verb::Usage => "usage",
            Verb::Policy => "policy",
            Verb::Audit => "audit",
        }
    }

    const ALL: [Verb; 7] = [
        Verb::Drain,
        Verb::Undrain,
        Verb::Freeze,
        Verb::Resume,
        Verb::Usage,
        Verb::Policy,
        Verb::Audit,
    ];
}

/// One token: its name, the hash of its secret and its rights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    /// Shown as the author of every override it makes, and in the audit log.
    pub name: String,
    /// SHA-256 of the secret.
    pub hash: [u8; 32],
    pub verbs: Vec<Verb>,
    /// Steered names it may touch (absolute, lowercase); `None`: not limited by name.
    pub names: Option<Vec<String>>,
    /// Tenants whose names it may touch; `None`: not limited by tenant.
    pub tenants: Option<Vec<String>>,
    /// The `where:` entries its drains may have; `None`: any scope, everywhere too.
    pub regions: Option<Vec<String>>,
    /// The CDNs it may report usage for; `None`: every CDN, for a token limited by
    /// neither names nor tenants (a CDN is shared by every tenant).
    pub cdns: Option<Vec<String>>,
    /// Every mutation must carry a `ticket`.
    pub require_ticket: bool,
}

/// The SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Token {
    /// A token with every right (`--api-token-file`, `STEERDNS_API_TOKEN`).
    pub fn every_right(name: &str, secret: &str) -> Token {
        Token {
            name: name.to_string(),
            hash: sha256(secret.as_bytes()),
            verbs: Verb::ALL.to_vec(),
            names: None,
            tenants: None,
            regions: None,
            cdns: None,
            require_ticket: false,
        }
    }

    /// Whether it may use `verb`; else what it lacks.
    pub fn may(&self, verb: Verb) -> Result<(), TokenError> {
        if self.verbs.contains(&verb) {
            return Ok(());
        }
        Err(TokenError::LacksVerb {
            token: self.name.clone(),
            verb,
            has: self.verbs.clone(),
        })
    }

    /// Whether it may touch `host` with a drain of scope `scope` (empty: everywhere);
    /// else what it lacks.
    pub fn may_touch(&self, host: &HostPolicy, scope: &[String]) -> Result<(), TokenError> {
        let name = host.name.to_string();
        if self.names.is_some() || self.tenants.is_some() {
            let by_name = self.names.as_ref().is_some_and(|n| n.contains(&name));
            let by_tenant = match (&self.tenants, &host.tenant) {
                (Some(ts), Some(t)) => ts.contains(t),
                _ => false,
            };
            if !by_name && !by_tenant {
                return Err(TokenError::LacksName {
                    token: self.name.clone(),
                    name,
                    tenant: host.tenant.clone(),
                });
            }
        }
        self.may_cover(scope)
    }

    /// Whether its `regions` allow a scope of `scope` (empty: everywhere).
    fn may_cover(&self, scope: &[String]) -> Result<(), TokenError> {
        let Some(regions) = &self.regions else {
            return Ok(());
        };
        if scope.is_empty() {
            return Err(TokenError::LacksEverywhere {
                token: self.name.clone(),
                regions: regions.clone(),
            });
        }
        match scope
            .iter()
            .find(|s| !regions.iter().any(|r| r.eq_ignore_ascii_case(s)))
        {
            Some(s) => Err(TokenError::LacksRegion {
                token: self.name.clone(),
                region: s.clone(),
                regions: regions.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Whether it may freeze or resume the names of `tenant` (everywhere).
    pub fn may_touch_tenant(&self, tenant: &str) -> Result<(), TokenError> {
        let limited = self.names.is_some() || self.tenants.is_some();
        if limited
            && !self
                .tenants
                .as_ref()
                .is_some_and(|ts| ts.iter().any(|t| t == tenant))
        {
            return Err(TokenError::LacksTenant {
                token: self.name.clone(),
                tenant: tenant.to_string(),
            });
        }
        self.may_cover(&[])
    }

    /// Whether it may report usage records of `cdn`.
    pub fn may_report(&self, cdn: &str) -> Result<(), TokenError> {
        let listed = match &self.cdns {
            Some(cdns) => cdns.iter().any(|c| c == cdn),
            None => self.names.is_none() && self.tenants.is_none(),
        };
        if !listed {
            return Err(TokenError::LacksCdn {
                token: self.name.clone(),
                cdn: cdn.to_string(),
            });
        }
        Ok(())
    }

    /// Whether it may act on every name everywhere (a global freeze or resume).
    pub fn may_touch_everything(&self) -> Result<(), TokenError> {
        if self.names.is_some() || self.tenants.is_some() {
            return Err(TokenError::LacksEveryName {
                token: self.name.clone(),
            });
        }
        self.may_cover(&[])
    }

    /// Whether a request carrying `ticket` may go ahead.
    pub fn ticket_ok(&self, ticket: Option<&str>) -> Result<(), TokenError> {
        if self.require_ticket && ticket.is_none_or(|t| t.trim().is_empty()) {
            return Err(TokenError::NeedsTicket {
                token: self.name.clone(),
            });
        }
        Ok(())
    }
}

/// What a token lacks for a request: the API answers 403 (400 for a missing ticket).
/// Names the token by its name, never by its secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// A verb it was not given.
    #[error("token `{token}` lacks the verb `{}` (it has: {})", verb.as_str(), verb_list(has))]
    LacksVerb {
        token: String,
        verb: Verb,
        has: Vec<Verb>,
    },
    /// A steered name outside its `names` and `tenants`.
    #[error("token `{token}` lacks the name {name}{}", tenant.as_ref().map_or(String::new(), |t| format!(" (tenant {t})")))]
    LacksName {
        token: String,
        name: String,
        tenant: Option<String>,
    },
    /// A scope of everywhere, for a token limited to some `regions`.
    #[error("token `{token}` lacks the scope everywhere: it may act only in {}", regions.join(", "))]
    LacksEverywhere { token: String, regions: Vec<String> },
    /// A `where:` entry outside its `regions`.
    #[error("token `{token}` lacks the region `{region}` (it may act in {})", regions.join(", "))]
    LacksRegion {
        token: String,
        region: String,
        regions: Vec<String>,
    },
    /// A tenant outside its `tenants`.
    #[error("token `{token}` lacks the tenant {tenant}")]
    LacksTenant { token: String, tenant: String },
    /// Usage of a CDN outside its `cdns` (or, without `cdns`, of any CDN for a token
    /// limited by name or tenant: a CDN is shared by every tenant).
    #[error(
        "token `{token}` lacks the CDN `{cdn}` for usage records (list it in the token's `cdns`)"
    )]
    LacksCdn { token: String, cdn: String },
    /// A drain that would end another author's drain sooner, without `undrain`.
    #[error("token `{token}` would end the drain `{id}` of {author} sooner: that needs the verb `undrain` (a later `until` only extends it)")]
    EndsAnothers {
        token: String,
        id: String,
        author: String,
    },
    /// Every name (a global freeze or resume), for a token limited by name or tenant.
    #[error("token `{token}` lacks every name: it is limited to some names or tenants")]
    LacksEveryName { token: String },
    /// `require_ticket`, and the request has none.
    #[error("token `{token}` requires a ticket: add \"ticket\": \"INC-…\" to the request")]
    NeedsTicket { token: String },
}

/// `drain, undrain`, or `none`.
fn verb_list(verbs: &[Verb]) -> String {
    if verbs.is_empty() {
        return "none".into();
    }
    let has: Vec<&str> = verbs.iter().map(|v| v.as_str()).collect();
    has.join(", ")
}

/// The tokens of a file, plus the one with every right given on the command line.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tokens {
    pub list: Vec<Arc<Token>>,
}

impl Tokens {
    /// The token whose secret is `given`: its hash is compared with every entry, each
    /// comparison taking the same time whatever the bytes.
    pub fn find(&self, given: &str) -> Option<Arc<Token>> {
        let hash = sha256(given.as_bytes());
        let mut found = None;
        for t in &self.list {
            if same_bytes(&hash, &t.hash) && found.is_none() {
                found = Some(t.clone());
            }
        }
        found
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Whether two equal-length byte strings are equal, looking at every byte.
fn same_bytes(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    tokens: Vec<RawToken>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: String,
    sha256: String,
    verbs: Vec<Verb>,
    names: Option<Vec<String>>,
    tenants: Option<Vec<String>>,
    regions: Option<Vec<String>>,
    cdns: Option<Vec<String>>,
    #[serde(default)]
    require_ticket: bool,
}

/// Reads and checks a tokens file: owner-only mode, then every entry; all problems
/// with file, line and field.
pub(crate) fn load(path: &Path) -> Result<Tokens, Issues> {
    let one = |field: &str, msg: String| Issues(vec![ConfigIssue::error(path, None, field, msg)]);
    // The same owner-only check as every other secret file (the hashes are secrets).
    let source = crate::secret::read_secret_text(path).map_err(|e| one("", e.to_string()))?;
    parse(path, &source)
}

/// Checks the text of a tokens file (`path` is only used in messages).
pub(crate) fn parse(path: &Path, source: &str) -> Result<Tokens, Issues> {
    // The file is a secret (its hashes, and whatever was pasted into it by mistake):
    // no message quotes it (`secret::unquoted`, and our own messages below).
    let raw: RawFile = serde_yaml::from_str(source).map_err(|e| {
        let mut issue = yaml_issue(path, source, &e);
        issue.message = crate::secret::unquoted(&issue.message);
        Issues(vec![issue])
    })?;
    let mut issues = Issues::default();
    let mut error = |at: Vec<Seg>, msg: String| {
        issues.push(ConfigIssue::error(
            path,
            locate::line_of(source, &at),
            locate::render(&at),
            msg,
        ))
    };
    let mut list: Vec<Arc<Token>> = Vec::new();
    for (i, t) in raw.tokens.into_iter().enumerate() {
        let at = |k: &str| vec![Seg::Key("tokens".into()), Seg::Index(i), Seg::Key(k.into())];
        if t.name.is_empty()
            || t.name.len() > 64
            || !t
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_' | b'@'))
        {
            error(at("name"), "1 to 64 of A-Z a-z 0-9 . - _ @".into());
        }
        if list.iter().any(|o| o.name == t.name) {
            error(at("name"), "the same name as another entry".into());
        }
        let hash = unhex::<32>(&t.sha256);
        match hash {
            None => error(
                at("sha256"),
                "not a SHA-256 (64 hex digits): printf %s \"$TOKEN\" | sha256sum".into(),
            ),
            Some(h) if list.iter().any(|o| o.hash == h) => {
                error(at("sha256"), "the same token as another entry".into())
            }
            _ => {}
        }
        if t.verbs.is_empty() {
            error(
                at("verbs"),
                "no verb: give some of drain, undrain, freeze, resume, usage, audit".into(),
            );
        }
        let names = t.names.map(|ns| {
            ns.iter()
                .enumerate()
                .filter_map(|(j, n)| {
                    let mut name = n.trim().to_ascii_lowercase();
                    if !name.ends_with('.') {
                        name.push('.');
                    }
                    match hickory_proto::rr::Name::from_ascii(&name) {
                        Ok(_) if name.len() > 1 => Some(name),
                        _ => {
                            let mut p = at("names");
                            p.push(Seg::Index(j));
                            error(p, "not a host name".into());
                            None
                        }
                    }
                })
                .collect()
        });
        if let Some(ts) = &t.tenants {
            for (j, tenant) in ts.iter().enumerate() {
                if !super::valid_tenant(tenant) {
                    let mut p = at("tenants");
                    p.push(Seg::Index(j));
                    error(p, "a tenant is 1 to 64 of a-z 0-9 . - _".into());
                }
            }
        }
        if let Some(rs) = &t.regions {
            if rs.is_empty() {
                error(
                    at("regions"),
                    "empty: leave it out for any scope, or list region names and match entries"
                        .into(),
                );
            }
        }
        list.push(Arc::new(Token {
            name: t.name,
            hash: hash.unwrap_or_default(),
            verbs: t.verbs,
            names,
            tenants: t.tenants,
            regions: t.regions,
            cdns: t.cdns,
            require_ticket: t.require_ticket,
        }));
    }
    if issues.has_errors() {
        return Err(issues);
    }
    Ok(Tokens { list })
}

/// `N` bytes from `2 × N` hex digits (surrounding white space ignored); `None` for
/// anything else. The inverse of [`hex`].
pub(crate) fn unhex<const N: usize>(s: &str) -> Option<[u8; N]> {
    let s = s.trim();
    if s.len() != 2 * N || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH_A: &str = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8";

    #[test]
    fn the_hash_is_sha256() {
        assert_eq!(hex(&sha256(b"password")), HASH_A);
    }

    #[test]
    fn a_token_is_found_by_its_secret_only() {
        let text = format!(
            "tokens:\n  - name: a\n    sha256: {HASH_A}\n    verbs: [drain]\n    names: [a.example.com]\n"
        );
        let t = parse(Path::new("t.yaml"), &text).unwrap();
        let a = t.find("password").expect("found");
        assert_eq!(a.name, "a");
        assert_eq!(
            a.names.as_deref(),
            Some(&["a.example.com.".to_string()][..])
        );
        assert!(t.find("passwore").is_none());
        assert!(t.find("").is_none());
        assert!(a.may(Verb::Drain).is_ok());
        let e = a.may(Verb::Freeze).unwrap_err();
        assert!(matches!(
            e,
            TokenError::LacksVerb {
                verb: Verb::Freeze,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "token `a` lacks the verb `freeze` (it has: drain)"
        );
    }

    #[test]
    fn problems_name_the_line_and_field() {
        let text = "tokens:\n  - name: a\n    sha256: abc\n    verbs: [drain]\n  - name: a\n    sha256: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\n    verbs: []\n    tenants: [Acme]\n";
        let e = parse(Path::new("t.yaml"), text).unwrap_err().to_string();
        for want in [
            "t.yaml:3: tokens[0].sha256",
            "t.yaml:5: tokens[1].name: the same name as another entry",
            "t.yaml:7: tokens[1].verbs",
            "t.yaml:8: tokens[1].tenants[0]",
        ] {
            assert!(e.contains(want), "{want} not in:\n{e}");
        }
        let e = parse(
            Path::new("t.yaml"),
            "tokens:\n  - name: a\n    sha256: x\n    verbs: [drian]\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("t.yaml:4") && e.contains("unknown variant"),
            "{e}"
        );
        // A secret pasted where it does not belong is never quoted back.
        for text in [
            "tokens:\n  - s3cret-pasted-token\n",
            "tokens:\n  - name: s3cret-pasted-token!\n    sha256: s3cret-pasted-token\n    verbs: [s3cret-pasted-token]\n    tenants: [S3cret-pasted-token]\n    names: ['s3cret-pasted-token..']\n",
            "s3cret-pasted-token\n",
            "tokens: s3cret-pasted-token\n",
        ] {
            let e = parse(Path::new("t.yaml"), text).unwrap_err().to_string();
            assert!(e.contains("t.yaml:"), "{e}");
            assert!(!e.contains("s3cret"), "the secret is quoted: {e}");
        }
    }
}
