//! Control plane: where a drain stands (`DrainState`, `DrainStatus`), as `/v1/state`,
//! `/v1/explain` and `explain` show it.

use serde::Serialize;

use super::DrainRule;

/// Where a drain stands, as `/v1/state`, `/v1/explain` and `explain` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum DrainState {
    /// Traffic is moving away, or has.
    #[serde(rename = "in force")]
    InForce,
    /// Removed or expired: traffic is coming back in steps.
    #[serde(rename = "ending")]
    Ending,
    /// A drain of the policy whose `until` has passed: it no longer applies.
    #[serde(rename = "expired: remove it from the policy")]
    Expired,
    /// Over the location-scope cap when it came: it cuts nothing.
    #[serde(rename = "refused: too many location scopes")]
    Refused,
}

impl std::fmt::Display for DrainState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DrainState::InForce => "in force",
            DrainState::Ending => "ending",
            DrainState::Expired => "expired: remove it from the policy",
            DrainState::Refused => "refused: too many location scopes",
        })
    }
}

/// A drain and where it stands.
#[derive(Clone, Debug, Serialize)]
pub struct DrainStatus {
    pub id: String,
    pub name: String,
    pub cdn: String,
    /// Empty: everywhere.
    #[serde(rename = "where")]
    pub scope: Vec<String>,
    pub reason: String,
    pub until_unix_ms: Option<u64>,
    pub immediate: bool,
    /// In a set: the node whose API took it, and when.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written_by: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub written_at_unix_ms: Option<u64>,
    /// The tenant of the name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The API token that made it, and the ticket it gave.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ticket: Option<String>,
    pub status: DrainState,
    /// Percent of the CDN's share moved away now.
    pub removed_percent: u8,
}

impl DrainStatus {
    pub(super) fn new(rule: &DrainRule, status: DrainState, removed_percent: u8) -> DrainStatus {
        DrainStatus {
            id: rule.id.clone(),
            name: rule.name.clone(),
            cdn: rule.cdn.clone(),
            scope: rule.scope.clone(),
            reason: rule.reason.clone(),
            until_unix_ms: rule.until_unix_ms,
            immediate: rule.immediate,
            written_by: rule.written_by.clone(),
            written_at_unix_ms: rule.written_at_unix_ms,
            tenant: rule.tenant.clone(),
            author: rule.author.clone(),
            ticket: rule.ticket.clone(),
            status,
            removed_percent,
        }
    }
}

pub(super) fn scope_text(rule: &DrainRule) -> String {
    if rule.scope.is_empty() {
        "everywhere".into()
    } else {
        rule.scope.join(",")
    }
}
