//! Input: zone keys. One file per key, owner-only (refused otherwise, as every secret
//! is: [`crate::secret`]), the same files on every node of a set:
//!
//! ```text
//! # steerdns DNSSEC key (CSK); keep it owner-only (chmod 600)
//! zone: example.com.
//! algorithm: 13
//! private_key: <base64 of the PKCS#8 document>
//! created: 1764600000
//! publish: 1764600000     # the DNSKEY is served from then on
//! activate: 1764600000    # the key signs from then on
//! ```
//!
//! Times are Unix seconds; later optional fields (`retire`, `remove`) end signing and
//! publication. Every node reads the same times and the same clock, so every node
//! computes the same key set at the same moment.

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use base64::Engine;
use hickory_proto::dnssec::crypto::{signing_key_from_der, EcdsaSigningKey, Ed25519SigningKey};
use hickory_proto::dnssec::rdata::{CDNSKEY, CDS, DNSKEY, DS};
use hickory_proto::dnssec::PublicKey;
use hickory_proto::dnssec::{Algorithm, DigestType, SigningKey};
use hickory_proto::rr::Name;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use serde::{Deserialize, Serialize};

use crate::error::{ConfigIssue, Issues};
use crate::secret::{read_secret_file, SecretError};

/// Why a key cannot be made, read or used. Nothing of a key file is part of the
/// message (a file holding only the bare key must not print it): it names the file,
/// the line and the field, and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// An algorithm `keygen` does not make.
    #[error("algorithm {0} is not offered: 13 (ECDSA P-256, the default) or 15 (Ed25519)")]
    Algorithm(u8),
    /// The crypto library could not make a key.
    #[error("cannot generate a key: {0}")]
    Generate(String),
    /// The key file is unreadable or not owner-only.
    #[error(transparent)]
    Secret(#[from] SecretError),
    /// The key file is not UTF-8.
    #[error("{}: not UTF-8", path.display())]
    NotUtf8 { path: PathBuf },
    /// The key file is not the YAML of a key (serde's message without what it quotes).
    #[error("{}: {}", path.display(), crate::secret::unquoted(&source.to_string()))]
    Malformed {
        path: PathBuf,
        source: serde_yaml::Error,
    },
    /// A key file's text cannot be written.
    #[error("{0}")]
    Encode(serde_yaml::Error),
    /// `zone:` is not a domain name.
    #[error("zone: not a domain name")]
    Zone,
    /// `private_key:` is not base64: where (the decoder's own message names the
    /// character too, a piece of the key).
    #[error("private_key: not base64: {}", base64_problem(.0))]
    NotBase64(base64::DecodeError),
    /// `private_key:` is not a PKCS#8 document of the file's algorithm.
    #[error("private_key: not a PKCS#8 key of algorithm {algorithm}: {error}")]
    NotPkcs8 { algorithm: u8, error: String },
    /// The public key cannot be derived from the private one.
    #[error("private_key: {0}")]
    PublicKey(String),
    /// The DNSKEY's tag or digest cannot be computed.
    #[error("{0}")]
    Dnskey(String),
    /// A problem of the key file `path` (its contents: zone, algorithm, key).
    #[error("{}: {source}", path.display())]
    InFile {
        path: PathBuf,
        source: Box<KeyError>,
    },
}

/// One zone key, loaded.
pub struct Key {
    pub zone: Name,
    pub file: PathBuf,
    pub algorithm: Algorithm,
    pub tag: u16,
    pub dnskey: DNSKEY,
    pub times: Times,
    /// The private key; shared by every signer built from it.
    signing: Arc<dyn SigningKey>,
}

/// When a key enters and leaves service (Unix seconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Times {
    pub created: u64,
    /// Its DNSKEY is served from then on.
    pub publish: u64,
    /// It signs from then on.
    pub activate: u64,
    /// It stops signing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retire: Option<u64>,
    /// Its DNSKEY is withdrawn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remove: Option<u64>,
}

impl Times {
    pub fn published(&self, now: u64) -> bool {
        self.publish <= now && self.remove.is_none_or(|r| now < r)
    }

    pub fn active(&self, now: u64) -> bool {
        self.activate <= now && self.retire.is_none_or(|r| now < r)
    }

    /// Whether the key signs the DNSKEY set at `now`: published and activated, retired
    /// or not. A retired CSK still signs it until it is removed, so that a resolver
    /// holding the parent's DS for it validates the DNSKEY set while the parent's DS
    /// changes over (RFC 7583 §3.3, the double-KSK half of a CSK rollover).
    pub fn signs_keys(&self, now: u64) -> bool {
        self.published(now) && self.activate <= now
    }

    /// Its times, in order, to re-sign at each.
    pub fn events(&self) -> impl Iterator<Item = u64> {
        [
            Some(self.publish),
            Some(self.activate),
            self.retire,
            self.remove,
        ]
        .into_iter()
        .flatten()
    }

    /// The key's phase at `now` (see `dnssec::KeyStatus::phase`).
    pub fn phase(&self, now: u64) -> &'static str {
        match (self.published(now), self.active(now)) {
            (true, true) => "active",
            (true, false) if now < self.activate => "published",
            (true, false) => "retired",
            (false, _) if now < self.publish => "waiting",
            (false, _) => "removed",
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeyFile {
    zone: String,
    algorithm: u8,
    private_key: String,
    #[serde(flatten)]
    times: Times,
}

/// What is wrong with the base64 of a key, without its characters.
fn base64_problem(e: &base64::DecodeError) -> String {
    use base64::DecodeError as D;
    match e {
        D::InvalidByte(at, _) => format!("a character outside the alphabet at offset {at}"),
        D::InvalidLength(n) => format!("{n} symbols, not a whole number of bytes"),
        D::InvalidLastSymbol { offset, .. } => {
            format!("a last symbol with extra bits at offset {offset}")
        }
        D::InvalidPadding => "wrong padding".into(),
    }
}

impl KeyError {
    /// The line of the key file the problem is on, when the parser knows it.
    pub fn line(&self) -> Option<usize> {
        match self {
            KeyError::Malformed { source, .. } => source.location().map(|l| l.line()),
            KeyError::InFile { source, .. } => source.line(),
            _ => None,
        }
    }

    /// The message without the file's path, for a report that names the file itself;
    /// never quoting the file either.
    pub fn detail(&self) -> String {
        match self {
            KeyError::Malformed { source, .. } => {
                let message = source.to_string();
                let message = match message.rfind(" at line ") {
                    Some(i) => &message[..i],
                    None => &message,
                };
                crate::secret::unquoted(message)
            }
            KeyError::InFile { source, .. } => source.detail(),
            other => other.to_string(),
        }
    }
}

/// The algorithms `keygen` makes: ECDSA P-256 with SHA-256 (13) and Ed25519 (15).
pub fn algorithm(number: u8) -> Result<Algorithm, KeyError> {
    match number {
        13 => Ok(Algorithm::ECDSAP256SHA256),
        15 => Ok(Algorithm::ED25519),
        n => Err(KeyError::Algorithm(n)),
    }
}

/// A new key for `zone`, published and active from `now`: the file's name and text.
pub fn generate(zone: &Name, number: u8, now: u64) -> Result<(String, String), KeyError> {
    let times = Times {
        created: now,
        publish: now,
        activate: now,
        retire: None,
        remove: None,
    };
    generate_with(zone, number, times)
}

/// A new key for `zone` with `times`: the file's name and text.
pub fn generate_with(zone: &Name, number: u8, times: Times) -> Result<(String, String), KeyError> {
    let alg = algorithm(number)?;
    let pkcs8 = match alg {
        Algorithm::ED25519 => Ed25519SigningKey::generate_pkcs8(),
        _ => EcdsaSigningKey::generate_pkcs8(alg),
    }
    .map_err(|e| KeyError::Generate(e.to_string()))?;
    let file = KeyFile {
        zone: zone.to_lowercase().to_string(),
        algorithm: number,
        private_key: base64::engine::general_purpose::STANDARD.encode(pkcs8.secret_pkcs8_der()),
        times,
    };
    let key = from_file(Path::new("new"), &file)?;
    Ok((key.file_name(), text_of(&file)?))
}

/// A key file's text.
fn text_of(file: &KeyFile) -> Result<String, KeyError> {
    let yaml = serde_yaml::to_string(file).map_err(KeyError::Encode)?;
    Ok(format!(
        "# steerdns DNSSEC key (CSK); keep it owner-only (chmod 600)\n{yaml}"
    ))
}

/// The text of key file `path` with its times replaced by `times` (the key kept).
pub fn rewrite_times(path: &Path, times: Times) -> Result<String, KeyError> {
    let mut file = read(path)?;
    file.times = times;
    text_of(&file)
}

fn read(path: &Path) -> Result<KeyFile, KeyError> {
    let bytes = read_secret_file(path)?;
    let text = String::from_utf8(bytes).map_err(|_| KeyError::NotUtf8 {
        path: path.to_path_buf(),
    })?;
    serde_yaml::from_str(&text).map_err(|source| KeyError::Malformed {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads one key file (owner-only).
pub fn load(path: &Path) -> Result<Key, KeyError> {
    let file = read(path)?;
    from_file(path, &file).map_err(|e| KeyError::InFile {
        path: path.to_path_buf(),
        source: Box::new(e),
    })
}

fn from_file(path: &Path, file: &KeyFile) -> Result<Key, KeyError> {
    let zone = Name::from_str(&file.zone)
        .map_err(|_| KeyError::Zone)?
        .to_lowercase();
    let mut zone = zone;
    zone.set_fqdn(true);
    let alg = algorithm(file.algorithm)?;
    let der = base64::engine::general_purpose::STANDARD
        .decode(file.private_key.trim())
        .map_err(KeyError::NotBase64)?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der));
    let signing: Arc<dyn SigningKey> = signing_key_from_der(&der, alg)
        .map_err(|e| KeyError::NotPkcs8 {
            algorithm: file.algorithm,
            error: e.to_string(),
        })?
        .into();
    let public = signing
        .to_public_key()
        .map_err(|e| KeyError::PublicKey(e.to_string()))?;
    let dnskey = DNSKEY::from_key(&public);
    let tag = dnskey
        .calculate_key_tag()
        .map_err(|e| KeyError::Dnskey(e.to_string()))?;
    Ok(Key {
        zone,
        file: path.to_path_buf(),
        algorithm: alg,
        tag,
        dnskey,
        times: file.times,
        signing,
    })
}

/// Every key file (`*.key`) of `dir`, each problem reported against its file.
pub fn load_dir(dir: &Path) -> Result<Vec<Key>, Issues> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        Issues(vec![ConfigIssue::error(
            dir,
            None,
            "",
            format!("cannot read the key directory: {e}"),
        )])
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "key") && p.is_file())
        .collect();
    files.sort();
    let mut keys = Vec::new();
    let mut issues = Issues::default();
    for f in files {
        match load(&f) {
            Ok(k) => keys.push(k),
            Err(e) => issues.push(ConfigIssue::error(&f, e.line(), "", e.detail())),
        }
    }
    if issues.has_errors() {
        return Err(issues);
    }
    Ok(keys)
}

impl Key {
    /// `K<zone>+<algorithm>+<tag>.key`, as BIND names its key files.
    pub fn file_name(&self) -> String {
        format!(
            "K{}+{:03}+{:05}.key",
            self.zone,
            u8::from(self.algorithm),
            self.tag
        )
    }

    pub fn signing(&self) -> &Arc<dyn SigningKey> {
        &self.signing
    }

    /// The SHA-256 digest of the DNSKEY, as a DS or CDS carries it.
    fn digest(&self) -> Result<Vec<u8>, KeyError> {
        let digest = self
            .dnskey
            .to_digest(&self.zone, DigestType::SHA256)
            .map_err(|e| KeyError::Dnskey(e.to_string()))?;
        Ok(digest.as_ref().to_vec())
    }

    /// The DS record for the parent (SHA-256), in presentation form.
    pub fn ds(&self) -> Result<String, KeyError> {
        let ds = DS::new(self.tag, self.algorithm, DigestType::SHA256, self.digest()?);
        Ok(format!("{} IN DS {ds}", self.zone))
    }

    /// The CDS record asking the parent for this key's DS (RFC 7344).
    pub fn cds(&self) -> Result<CDS, KeyError> {
        Ok(CDS::new(
            self.tag,
            Some(self.algorithm),
            DigestType::SHA256,
            self.digest()?,
        ))
    }

    /// The CDNSKEY record: this key's DNSKEY, for parents that make the DS themselves.
    pub fn cdnskey(&self) -> CDNSKEY {
        CDNSKEY::with_flags(
            self.dnskey.flags(),
            Some(self.algorithm),
            self.dnskey.public_key().public_bytes().to_vec(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_load_back_with_their_tag() {
        let zone = Name::from_str("example.com.").unwrap();
        for alg in [13, 15] {
            let (name, text) = generate(&zone, alg, 1_700_000_000).unwrap();
            let file: KeyFile = serde_yaml::from_str(&text).unwrap();
            let key = from_file(Path::new(&name), &file).unwrap();
            assert_eq!(key.file_name(), name);
            assert_eq!(u8::from(key.algorithm), alg);
            assert!(key.ds().unwrap().starts_with("example.com. IN DS "));
        }
        let e = generate(&zone, 8, 0).unwrap_err();
        assert!(matches!(e, KeyError::Algorithm(8)));
        assert!(e.to_string().contains("not offered"), "{e}");
    }
}
