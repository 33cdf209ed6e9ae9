//! Control plane: the commit modifier in a set (`serve --etcd`). Usage records and
//! the biases in force go through etcd, so every node keeps the same ledger and
//! serves the same biases.
//!
//! - `usage/{cdn}/{day}` ([`SharedUsage`]): one CDN's records of one UTC day
//!   (`YYYY-MM-DD`), written by the node whose API or feed took them: read, merged,
//!   written back if still at the revision read (again if another node wrote
//!   between), under a lease of [`USAGE_TTL`]. Every node, the writer included, merges
//!   a day into its ledger when the watch brings a new revision of it.
//! - `commit/{name}` ([`SharedBiases`]): the biases of the set's latest evaluation of
//!   a name. Evaluations fall on multiples of the period, the same instants on every
//!   node. At each, every connected node computes the biases from the shared ledger
//!   and the biases in force, and writes them unless the set already has that
//!   evaluation (compare-and-swap on the revision it saw: the first node wins). Every
//!   node puts in force what the key says, its own result included, when the watch
//!   brings it: no node's history or start time can make it serve other biases.
//! - An evaluation further ahead of a node's clock than a period (and than a minute,
//!   [`crate::control::decide::times::AHEAD_MS`]: clocks a second or two apart must not
//!   refuse each other's) is not taken (a clock far ahead, or a key written by hand), and the next evaluation writes over it: it
//!   cannot hold the set.
//! - Failing static, a node evaluates nothing and holds the biases in force; usage
//!   posted to it is refused (503): the set cannot take it, and the sender retries.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tracing::{info, warn};

use crate::config::Policy;
use crate::control::decide::drains::DrainError;
use crate::control::decide::keys::CdnDay;
use crate::control::decide::times;
use crate::control::levers::command::{UsageRecord, UsageRefused, UsageTaken};
use crate::control::modifiers::commit::bias::Bias;
use crate::control::modifiers::commit::ledger::{Record, Taken};
use crate::control::modifiers::commit::{Commit, OutsideBand};

use super::etcd::MAX_VALUE;
use super::node::{put_audit, ClusterLink, Done};
use super::refused::Refused;
use super::{sane_name, Key, Store};

/// How long a day of usage stays in etcd: the ledger keeps this month and the last.
pub(crate) const USAGE_TTL: Duration = Duration::from_secs(64 * 86_400);
/// Most CDNs in one name's biases. (Days of usage and names with biases are bounded
/// by the policy: `scope.rs`.)
const MAX_BIASED_CDNS: usize = 64;
const DAY_MS: u64 = 86_400_000;
/// Tries of a read, merge and write of one day before the POST gives up.
const TRIES: usize = 8;

/// One CDN's usage records of one UTC day, as stored.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedUsage {
    /// `[start (Unix ms), seconds, bytes]`, in order of start.
    pub records: Vec<(u64, u32, f64)>,
}

/// The biases of the set's latest evaluation of a name, as stored.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SharedBiases {
    /// The evaluation: a multiple of the name's period (Unix ms).
    #[serde(deserialize_with = "times::bounded")]
    pub at_unix_ms: u64,
    /// The node that made it.
    pub node: String,
    /// By CDN.
    pub biases: BTreeMap<String, Bias>,
}

/// Key of one CDN's usage of one day.
pub(crate) fn usage_key(prefix: &str, cdn: &str, day: &str) -> String {
    Key::Usage {
        cdn: cdn.to_string(),
        day: day.to_string(),
    }
    .under(prefix)
}

/// Key of a name's biases.
pub(crate) fn commit_key(prefix: &str, name: &str) -> String {
    Key::Commit {
        name: name.to_string(),
    }
    .under(prefix)
}

/// The UTC day of `ms`, `YYYY-MM-DD`.
pub(crate) fn day_of(ms: u64) -> String {
    times::rfc3339(ms.min(times::MAX_TIME_MS))[..10].to_string()
}

/// The start of `day` (Unix ms), if it is a `YYYY-MM-DD` day.
fn day_start(day: &str) -> Option<u64> {
    if day.len() != 10 {
        return None;
    }
    let t = humantime::parse_rfc3339(&format!("{day}T00:00:00Z")).ok()?;
    let ms = t.duration_since(UNIX_EPOCH).ok()?.as_millis() as u64;
    (day_of(ms) == day).then_some(ms)
}

impl SharedUsage {
    /// Whether the records read for `day` count (the start of the day, Unix ms):
    /// `Err` says why not.
    pub fn check(&self, day: &str) -> Result<u64, Refused> {
        let start = day_start(day).ok_or(Refused::Day)?;
        let mut last = None;
        for &(t, seconds, bytes) in &self.records {
            if !(start..start + DAY_MS).contains(&t) {
                return Err(Refused::NotOfDay {
                    start: t,
                    day: day.to_string(),
                });
            }
            if last.is_some_and(|l| l >= t) {
                return Err(Refused::RecordOrder);
            }
            if !(1..=86_400).contains(&seconds) {
                return Err(Refused::Seconds(seconds));
            }
            if !(bytes.is_finite() && (0.0..=1e18).contains(&bytes)) {
                return Err(Refused::Bytes(bytes));
            }
            last = Some(t);
        }
        Ok(start)
    }

    /// Takes `r` at `start`: what became of it.
    fn merge(&mut self, start: u64, r: Record) -> Taken {
        let new = (start, r.seconds, r.bytes);
        match self.records.binary_search_by_key(&start, |x| x.0) {
            Ok(i) if self.records[i] == new => Taken::Same,
            Ok(i) => {
                self.records[i] = new;
                Taken::Replaced
            }
            Err(i) => {
                self.records.insert(i, new);
                Taken::Added
            }
        }
    }
}

impl SharedBiases {
    /// Whether the biases read count: `Err` says why not.
    pub fn check(&self) -> Result<(), Refused> {
        if !sane_name(&self.node) {
            return Err(Refused::Node);
        }
        if self.biases.len() > MAX_BIASED_CDNS {
            return Err(Refused::Cdns(MAX_BIASED_CDNS));
        }
        for (cdn, b) in &self.biases {
            if !sane_name(cdn) {
                return Err(Refused::Cdn);
            }
            if !(b.points.is_finite() && b.points.abs() <= 100.0) {
                return Err(Refused::Points {
                    cdn: cdn.clone(),
                    points: b.points,
                });
            }
        }
        Ok(())
    }
}

impl ClusterLink {
    /// Writes checked usage records to the set, one (CDN, day) after another; the
    /// reply counts what became of them once all are written. A day written before a
    /// failure stays written (records are idempotent: the sender posts them again).
    pub(crate) fn write_usage(
        &mut self,
        records: Vec<UsageRecord>,
        skipped: u64,
        author: String,
        reply: oneshot::Sender<Result<UsageTaken, UsageRefused>>,
    ) {
        if let Err(e) = self.writable() {
            let why = match e {
                DrainError::Unavailable(why) => why,
                other => other.to_string(),
            };
            let _ = reply.send(Err(UsageRefused::Unavailable(why)));
            return;
        }
        let mut days: BTreeMap<CdnDay, Vec<(u64, Record)>> = BTreeMap::new();
        for (cdn, start, r) in records {
            days.entry(CdnDay::new(cdn, day_of(start)))
                .or_default()
                .push((start, r));
        }
        let (store, prefix, done) = (self.store.clone(), self.prefix.clone(), self.done.clone());
        // Audited once written: who, which (CDN, day)s, and what became of the records.
        let which: Vec<String> = days
            .keys()
            .map(|k| format!("{}/{}", k.cdn, k.day))
            .collect();
        let (audit_key, mut audit) = self.audit_entry(
            "usage",
            serde_json::json!({ "author": author, "days": which }),
        );
        tokio::spawn(async move {
            let mut taken = UsageTaken {
                skipped,
                ..UsageTaken::default()
            };
            for (CdnDay { cdn, day }, records) in days {
                let key = usage_key(&prefix, &cdn, &day);
                match write_day(&store, &key, &records).await {
                    Ok(t) => {
                        taken.added += t.added;
                        taken.replaced += t.replaced;
                        taken.unchanged += t.unchanged;
                    }
                    Err(e) => {
                        warn!(key = %key, error = %e, "usage not written for the set");
                        Done::send(&done, &store, &prefix, reply, Err(e), false).await;
                        return;
                    }
                }
            }
            if taken.added + taken.replaced > 0 {
                info!(
                    added = taken.added,
                    replaced = taken.replaced,
                    "usage written for the set"
                );
                audit["added"] = taken.added.into();
                audit["replaced"] = taken.replaced.into();
                put_audit(store.clone(), audit_key, audit).await;
            }
            Done::send(&done, &store, &prefix, reply, Ok(taken), true).await;
        });
    }

    /// Merges into `commit`'s ledger every day of usage the set holds whose revision
    /// is new here. True when a record was new or changed.
    pub(crate) fn follow_usage(&mut self, commit: &mut Commit, policy: &Policy) -> bool {
        let Some(view) = self.latest().map(|s| s.view.clone()) else {
            return false;
        };
        let mut took = false;
        for (key, (u, rev)) in view.usage.iter() {
            if self.usage_seen.get(key) == Some(rev) {
                continue;
            }
            self.usage_seen.insert(key.clone(), *rev);
            let cdn = &key.cdn;
            for &(start, seconds, bytes) in &u.records {
                let r = Record { seconds, bytes };
                took |= commit
                    .record(policy, cdn, start, r)
                    .is_ok_and(|t| t != Taken::Same);
            }
        }
        self.usage_seen.retain(|k, _| view.usage.contains_key(k));
        took
    }

    /// The set's biases of every name that `commit` takes now ([`Commit::takes`]).
    pub(crate) fn newer_biases(&self, commit: &Commit, now_ms: u64) -> Vec<(String, SharedBiases)> {
        let Some(shared) = self.latest() else {
            return Vec::new();
        };
        shared
            .view
            .commits
            .iter()
            .filter(|(name, (b, _))| commit.takes(name, b.at_unix_ms, now_ms))
            .map(|(name, (b, _))| (name.clone(), b.clone()))
            .collect()
    }

    /// The evaluations due now: each name's biases written for the set, unless the
    /// set already has that evaluation (or a later one), or etcd is unreachable
    /// (failing static: the biases in force hold). Nothing is put in force here: every
    /// node takes the set's from the watch.
    pub(crate) fn propose_commit(
        &mut self,
        commit: &mut Commit,
        base: &Policy,
        outside: OutsideBand,
        now_ms: u64,
    ) {
        let due = commit.take_due(base, outside, now_ms);
        if !self.connected() {
            return;
        }
        let Some(shared) = self.latest() else { return };
        for p in due {
            let seen = shared.view.commits.get(&p.name);
            let ahead = seen.is_some_and(|(b, _)| commit.ahead(&p.name, b.at_unix_ms, now_ms));
            if seen.is_some_and(|(b, _)| b.at_unix_ms >= p.at_ms) && !ahead {
                continue;
            }
            if let (true, Some((b, _))) = (ahead, seen) {
                warn!(name = %p.name, at_unix_ms = b.at_unix_ms, node = %b.node, "the set's commit biases are from a clock more than a period ahead: not taken, written over");
            }
            let record = SharedBiases {
                at_unix_ms: p.at_ms,
                node: self.node.clone(),
                biases: p.biases.into_iter().collect(),
            };
            let key = commit_key(&self.prefix, &p.name);
            let value = serde_json::to_vec(&record).unwrap_or_default();
            let rev = seen.map(|(_, r)| *r);
            super::write_evaluation(&self.store, key, value, rev, "commit biases");
        }
    }
}

/// Reads the day at `key`, merges `records` and writes it back if no other node wrote
/// it meanwhile (else again, up to [`TRIES`] times). What became of the records.
async fn write_day(
    store: &Store,
    key: &str,
    records: &[(u64, Record)],
) -> Result<UsageTaken, UsageRefused> {
    let unavailable = |e: super::EtcdError| UsageRefused::Unavailable(e.to_string());
    for _ in 0..TRIES {
        let current = store.get(key).await.map_err(unavailable)?;
        // A value that does not parse (written by hand) is replaced.
        let mut day = current
            .as_ref()
            .and_then(|kv| serde_json::from_slice::<SharedUsage>(&kv.value).ok())
            .unwrap_or_default();
        day.records.sort_by_key(|r| r.0);
        day.records.dedup_by_key(|r| r.0);
        let mut t = UsageTaken::default();
        for &(start, r) in records {
            match day.merge(start, r) {
                Taken::Added => t.added += 1,
                Taken::Replaced => t.replaced += 1,
                Taken::Same => t.unchanged += 1,
            }
        }
        if t.added + t.replaced == 0 {
            return Ok(t);
        }
        let value = serde_json::to_vec(&day).unwrap_or_default();
        if value.len() > MAX_VALUE {
            return Err(UsageRefused::Bad(format!(
                "{} records of one CDN in one day do not fit the {} KiB of an etcd value: send fewer, longer records",
                day.records.len(),
                MAX_VALUE / 1024
            )));
        }
        let written = match current {
            Some(kv) => store
                .replace_keeping_lease(key, kv.mod_revision, &value)
                .await
                .map_err(unavailable)?,
            None => {
                let lease = store.grant(USAGE_TTL).await.map_err(unavailable)?;
                store
                    .create_leased(key, &value, lease)
                    .await
                    .map_err(unavailable)?
            }
        };
        if written {
            return Ok(t);
        }
    }
    Err(UsageRefused::Unavailable(format!(
        "{key}: other nodes kept writing it ({TRIES} tries)"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_are_utc_dates_and_records_must_be_of_theirs() {
        // 2026-12-01T00:00:00Z.
        let dec = 1_796_083_200_000;
        assert_eq!(day_of(dec), "2026-12-01");
        assert_eq!(day_of(dec - 1), "2026-11-30");
        assert_eq!(day_start("2026-12-01"), Some(dec));
        assert_eq!(day_start("2026-13-01"), None);
        assert_eq!(day_start("2026-12-1"), None);
        let ok = SharedUsage {
            records: vec![(dec, 300, 1.0), (dec + 300_000, 300, 2.0)],
        };
        assert_eq!(ok.check("2026-12-01"), Ok(dec));
        assert!(ok.check("2026-11-30").is_err());
        let unordered = SharedUsage {
            records: vec![(dec + 300_000, 300, 1.0), (dec, 300, 2.0)],
        };
        assert!(unordered.check("2026-12-01").is_err());
        let nan = SharedUsage {
            records: vec![(dec, 300, f64::NAN)],
        };
        assert!(nan.check("2026-12-01").is_err());
    }

    #[test]
    fn a_merge_adds_replaces_or_keeps_in_order() {
        let mut day = SharedUsage::default();
        let r = |bytes| Record {
            seconds: 300,
            bytes,
        };
        assert_eq!(day.merge(600, r(1.0)), Taken::Added);
        assert_eq!(day.merge(0, r(1.0)), Taken::Added);
        assert_eq!(day.merge(600, r(1.0)), Taken::Same);
        assert_eq!(day.merge(600, r(2.0)), Taken::Replaced);
        assert_eq!(day.records, vec![(0, 300, 1.0), (600, 300, 2.0)]);
    }
}
