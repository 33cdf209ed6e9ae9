//! Control plane: the status page's history, the shares of the last hour as charts draw
//! them. A sampler ([`spawn_sampler`]) looks at the live snapshot every [`SAMPLE_EVERY`]
//! and, when a new one is served, records each (name, region, CDN) share that changed:
//! one point per change, at most [`MAX_POINTS`] per series, for the first
//! [`MAX_CHARTED_REGIONS`] (name, region) pairs, nothing older than [`WINDOW`] but the
//! value a chart starts from.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::plan::{Live, Plan, Snapshot, Steered};

/// How far back the charts go.
pub(crate) const WINDOW: Duration = Duration::from_secs(3600);
/// Points kept per (name, region, CDN) series: one per change of its share.
pub(crate) const MAX_POINTS: usize = 360;
/// (name, region) pairs with a chart; the page stays readable, the history bounded.
pub(crate) const MAX_CHARTED_REGIONS: usize = 200;
/// How often the sampler looks for a new snapshot.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// A series: (name, region, CDN).
type Key = (String, String, String);

/// The shares of the last hour, one point per change.
#[derive(Debug, Default)]
pub struct History {
    /// (Unix ms, share in tenths of a percent) per series, oldest first.
    series: HashMap<Key, VecDeque<(u64, u16)>>,
    /// The first record (Unix ms): the charts of a server up for less than an hour
    /// start there.
    pub(super) since: Option<u64>,
}

// === impl History ===

impl History {
    /// Records the shares of `plan` at `now_ms`: a point for each series whose share
    /// changed; series no longer in the plan are dropped.
    pub fn record(&mut self, plan: &Plan, now_ms: u64) {
        self.since.get_or_insert(now_ms);
        let mut seen = HashMap::with_capacity(self.series.len());
        for (name, region, shares) in charted(plan) {
            for (cdn, tenths) in shares {
                let key = (name.to_string(), region.to_string(), cdn.to_string());
                let points = self.series.remove(&key).unwrap_or_default();
                seen.insert(key, Self::push(points, now_ms, tenths));
            }
        }
        self.series = seen;
    }

    fn push(mut points: VecDeque<(u64, u16)>, now_ms: u64, tenths: u16) -> VecDeque<(u64, u16)> {
        if points.back().is_none_or(|&(_, last)| last != tenths) {
            points.push_back((now_ms, tenths));
        }
        let start = now_ms.saturating_sub(WINDOW.as_millis() as u64);
        // Keep the last point at or before the window's start: the value there.
        while points.len() > 1 && points[1].0 <= start {
            points.pop_front();
        }
        while points.len() > MAX_POINTS {
            points.pop_front();
        }
        points
    }

    /// The points of a series (oldest first).
    pub fn points(&self, name: &str, region: &str, cdn: &str) -> Option<&VecDeque<(u64, u16)>> {
        self.series
            .get(&(name.to_string(), region.to_string(), cdn.to_string()))
    }

    /// Points held in all.
    pub fn len(&self) -> usize {
        self.series.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

/// (name, region, [(CDN, share in tenths of a percent)]) for the charted regions.
fn charted(plan: &Plan) -> impl Iterator<Item = (&str, &str, Vec<(&str, u16)>)> {
    plan.names()
        .flat_map(|s| (0..s.regions()).map(move |r| (s, r)))
        .take(MAX_CHARTED_REGIONS)
        .map(|(s, r)| (&**s.text(), s.region_name(r), shares(s, r)))
}

/// Each CDN's share of region `r` now, in tenths of a percent, in policy order (zero
/// for a CDN the region does not use now), for clients outside location-scoped drains.
pub(super) fn shares<'p>(steered: Steered<'p>, r: usize) -> Vec<(&'p str, u16)> {
    let choice = steered.choice(r);
    let total: u64 = steered.weights(choice).map(|(_, w)| w).sum();
    steered
        .targets()
        .iter()
        .map(|t| {
            let w = steered
                .weights(choice)
                .find(|(x, _)| x.cdn == t.cdn)
                .map_or(0, |(_, w)| w);
            let tenths = (w * 1000 + total / 2) / total.max(1);
            (&*t.cdn, tenths as u16)
        })
        .collect()
}

/// Watches `live` every [`SAMPLE_EVERY`] and records each new snapshot's shares into
/// `history`, until `stop`.
pub(crate) fn spawn_sampler(
    live: Arc<Live>,
    history: Arc<Mutex<History>>,
    stop: CancellationToken,
) {
    tokio::spawn(async move {
        // A weak reference: the sampler must not keep a replaced snapshot alive (the
        // metrics fold a plan's counts when its last reader goes), and the allocation
        // it pins cannot be reused by a new snapshot, so the comparison is sound.
        let mut last: Weak<Snapshot> = Weak::new();
        let mut tick = tokio::time::interval(SAMPLE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let snapshot = live.load_full();
            if Weak::ptr_eq(&last, &Arc::downgrade(&snapshot)) {
                continue;
            }
            last = Arc::downgrade(&snapshot);
            history
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record(&snapshot.plan, now_ms());
        }
    });
}
