//! Control plane: a state saved by a release before the store of decisions (no
//! `store` in the file) becomes a store holding what was in force: each failover step
//! a timeline that goes on from its level when its next step was due, each drain
//! override its record (under a lease that ends it at its `until`), each freeze its
//! record. The health trackers, the drains' progress, the usage ledger and the
//! performance and commit evaluations are restored as before (`persist.rs`).

use std::time::Duration;

use tokio::time::Instant;

use crate::control::cluster::{
    drain_key, freeze_key, tenant_freeze_key, timeline_key, Freeze, SharedDrain, Timeline,
};
use crate::control::decide::state::ControlState;
use crate::control::store::{SavedKey, SavedStore};

/// The store of a set of one holding what `state` (restored from an old file) has in
/// force at `now` (`now_ms` on the wall clock), written by `node`.
pub(super) fn store_of(
    state: &ControlState,
    prefix: &str,
    node: &str,
    now: Instant,
    now_ms: u64,
) -> SavedStore {
    let mut keys = Vec::new();
    let mut put = |key: String, value: Vec<u8>, lease_left_ms: Option<u64>| {
        keys.push(SavedKey {
            key,
            value: String::from_utf8_lossy(&value).into_owned(),
            lease_left_ms,
            mod_revision: None,
        })
    };
    for (crate::control::decide::keys::NameCdn { name, cdn }, s) in
        state.failover.steps.iter().filter(|(_, s)| s.is_active())
    {
        let next_in = s
            .next_at
            .map_or(0, |at| at.saturating_duration_since(now).as_millis() as u64);
        let timeline = Timeline {
            direction: s.direction,
            from_level: s.level,
            start_unix_ms: now_ms + next_in,
            node: node.to_string(),
            reason: "restored from a state saved before the store".into(),
        };
        put(timeline_key(prefix, name, cdn), json(&timeline), None);
    }
    for rule in &state.drains.overrides {
        let at = rule.written_at_unix_ms.unwrap_or(now_ms);
        let lease = rule.until_unix_ms.map(|u| {
            (Duration::from_millis(u.saturating_sub(now_ms)) + Duration::from_secs(10)).as_millis()
                as u64
        });
        let record = SharedDrain {
            rule: rule.clone(),
            node: node.to_string(),
            at_unix_ms: at,
        };
        put(drain_key(prefix, &rule.id), json(&record), lease);
    }
    let freeze = |reason: &str| Freeze {
        reason: reason.to_string(),
        node: node.to_string(),
        at_unix_ms: now_ms,
    };
    if let Some(why) = &state.failover.frozen {
        put(freeze_key(prefix), json(&freeze(why)), None);
    }
    for (tenant, why) in &state.failover.frozen_tenants {
        put(tenant_freeze_key(prefix, tenant), json(&freeze(why)), None);
    }
    SavedStore { revision: 0, keys }
}

fn json<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap_or_default()
}
