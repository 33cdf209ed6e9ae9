//! Control plane: one drain (`DrainRule`), from the policy or the API, resolved against
//! the current policy to what it cuts, and why one is refused (`DrainError`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::config::{DrainScope, HostPolicy, Match, Policy};
use crate::control::decide::times;

/// Runtime overrides expire by default after this long, so a forgotten one reverts.
pub(crate) const DEFAULT_OVERRIDE_TTL: Duration = Duration::from_secs(2 * 3600);

/// One drain, from the policy or the API.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainRule {
    /// `policy` or `api-N`.
    pub id: String,
    /// The steered name (absolute, lowercase).
    pub name: String,
    pub cdn: String,
    /// Region names, countries, `continent:XX`, CIDR blocks; empty = everywhere.
    #[serde(default)]
    pub scope: Vec<String>,
    #[serde(default)]
    pub reason: String,
    /// Milliseconds since the Unix epoch; `None` = until removed.
    #[serde(default, deserialize_with = "times::bounded_opt")]
    pub until_unix_ms: Option<u64>,
    #[serde(default)]
    pub immediate: bool,
    /// In a set (`--etcd`): the node whose API took it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<String>,
    /// In a set: when that node wrote it to etcd (Unix ms).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "times::bounded_opt"
    )]
    pub written_at_unix_ms: Option<u64>,
    /// The tenant whose drain this is part of (a drain of a tenant is one rule per
    /// name of the tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Who made it: the API token's name (`None` for the policy's drains).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    /// The ticket the request carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
}

/// Why a drain is refused. The API answers 400 for a request that names what the
/// policy does not have, 409 for one that conflicts with the drains in force, 404 for
/// an override that does not exist.
#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("{0} is not a steered name")]
    NotSteered(String),
    #[error("no steered name has the tenant `{0}`")]
    NoTenant(String),
    #[error("no steered name of tenant `{tenant}` has a CDN `{cdn}`")]
    NoTenantName { tenant: String, cdn: String },
    /// The API token may not do this: what it lacks (403).
    #[error("{0}")]
    Forbidden(crate::config::tokens::TokenError),
    #[error("{name} has no CDN `{cdn}` (CDNs: {known})")]
    UnknownCdn {
        name: String,
        cdn: String,
        known: String,
    },
    #[error("where: `{entry}` is not a region of {name}, and {why}")]
    BadScope {
        entry: String,
        name: String,
        why: String,
    },
    #[error("`until` is in the past")]
    UntilPassed,
    #[error("refused: this drain would take every CDN out of region `{0}`")]
    EmptiesRegion(String),
    #[error("no drain override `{0}`")]
    NoSuchOverride(String),
    #[error("refused: {name} would have {scopes} different location scopes of drains, at most {max}: drain by region name, or reuse the `where` of a drain in force")]
    TooManyScopes {
        name: String,
        scopes: usize,
        max: usize,
    },
    /// The set holds as many drains as it keeps: a new one would apply nowhere.
    #[error("refused: the set holds {held} drain overrides, at most {max}: end one first")]
    TooManyDrains { held: usize, max: usize },
    /// A resume of a tenant whose failover is not frozen (409).
    #[error("refused: the failover of tenant `{0}` is not frozen: nothing to resume")]
    NotFrozen(String),
    /// The audit log cannot be written: no change is made unaudited (503).
    #[error("{0}")]
    NotAudited(String),
    /// In a set: etcd cannot take it now (the set must agree on every override).
    #[error("etcd unreachable, the set cannot take an override now: {0}")]
    Unavailable(String),
}

impl DrainError {
    /// Whether the request conflicts with the drains in force (rather than being wrong
    /// on its own).
    pub fn is_conflict(&self) -> bool {
        matches!(
            self,
            DrainError::EmptiesRegion(_)
                | DrainError::TooManyScopes { .. }
                | DrainError::TooManyDrains { .. }
                | DrainError::NotFrozen(_)
        )
    }
}

/// What identifies a drain across reloads (its stepper is kept by this).
pub(crate) type DrainKey = (String, String, String);

impl DrainRule {
    pub fn key(&self) -> DrainKey {
        (self.name.clone(), self.cdn.clone(), self.scope.join(","))
    }

    /// Whether it has expired at `now_ms`.
    pub fn expired(&self, now_ms: u64) -> bool {
        self.until_unix_ms.is_some_and(|u| u <= now_ms)
    }

    /// The host and the scope it applies to in `policy`, or why it cannot apply.
    pub fn resolve<'p>(
        &self,
        policy: &'p Policy,
    ) -> Result<(&'p HostPolicy, Vec<DrainScope>), DrainError> {
        let host = policy
            .host(&self.name)
            .ok_or_else(|| DrainError::NotSteered(self.name.clone()))?;
        if !host.cdns.iter().any(|c| c.name == self.cdn) {
            let known: Vec<&str> = host.cdns.iter().map(|c| c.name.as_str()).collect();
            return Err(DrainError::UnknownCdn {
                name: self.name.clone(),
                cdn: self.cdn.clone(),
                known: known.join(", "),
            });
        }
        let mut scope = Vec::new();
        for entry in &self.scope {
            if let Some(r) = host.regions.iter().position(|r| r.name == *entry) {
                scope.push(DrainScope::Region(r));
                continue;
            }
            match Match::parse(entry) {
                Ok(Match::Any) => {}
                Ok(m) => scope.push(DrainScope::Match(m)),
                Err(e) => {
                    return Err(DrainError::BadScope {
                        entry: entry.clone(),
                        name: self.name.clone(),
                        why: e,
                    })
                }
            }
        }
        Ok((host, scope))
    }

    /// The rules a drain request makes: itself, or for a drain of a tenant (`tenant`
    /// set, `name` empty) one rule per name of the tenant that has the CDN.
    pub fn expand(self, policy: &Policy) -> Result<Vec<DrainRule>, DrainError> {
        let Some(tenant) = self.tenant.clone().filter(|_| self.name.is_empty()) else {
            return Ok(vec![self]);
        };
        let rules: Vec<DrainRule> = policy
            .hosts
            .iter()
            .filter(|h| h.tenant.as_deref() == Some(&tenant))
            .filter(|h| h.cdns.iter().any(|c| c.name == self.cdn))
            .map(|h| DrainRule {
                name: h.name.to_string(),
                ..self.clone()
            })
            .collect();
        if rules.is_empty() {
            return Err(DrainError::NoTenantName {
                tenant,
                cdn: self.cdn,
            });
        }
        Ok(rules)
    }

    /// The policy's drains as rules.
    pub fn from_policy(policy: &Policy) -> Vec<DrainRule> {
        let mut out = Vec::new();
        for host in &policy.hosts {
            for d in &host.drains {
                out.push(DrainRule {
                    id: "policy".into(),
                    name: host.name.to_string(),
                    cdn: host.cdns[d.cdn].name.clone(),
                    scope: d
                        .scope
                        .iter()
                        .map(|s| match s {
                            DrainScope::Region(r) => host.regions[*r].name.clone(),
                            DrainScope::Match(m) => m.to_string(),
                        })
                        .collect(),
                    reason: d.reason.clone(),
                    until_unix_ms: d.until.map(crate::clock::unix_ms),
                    immediate: d.immediate,
                    written_by: None,
                    written_at_unix_ms: None,
                    tenant: host.tenant.clone(),
                    author: None,
                    ticket: None,
                });
            }
        }
        out
    }
}
