//! Both planes: the steered series, read from the plans at scrape time: the answer
//! counts (`queries_total` with name, region and CDN), which the data plane keeps in
//! each plan's choices and the [`Tally`] carries over from retired plans, and
//! `effective_weight`, each CDN's share in the plan being served.

use std::collections::HashMap;
use std::sync::Arc;

use crate::plan::{Plan, Snapshot};

/// The labels of [`effective_weights`]' series.
pub(super) const EFFECTIVE_WEIGHT_LABELS: [&str; 3] = ["cdn", "name", "region"];

/// The family of [`effective_weights`], without its series.
pub(super) fn effective_weight_family() -> prometheus::proto::MetricFamily {
    let mut family = prometheus::proto::MetricFamily::default();
    family.set_name("steerdns_effective_weight".into());
    family.set_help(
        "Share of the region's answers going to the CDN now, in percent (0..100).".into(),
    );
    family.set_field_type(prometheus::proto::MetricType::GAUGE);
    family
}

/// `effective_weight{name, region, cdn}`: each CDN's share of a region's answers in
/// `plan`, for clients outside location-scoped drains.
pub(super) fn effective_weights(plan: &Plan) -> prometheus::proto::MetricFamily {
    let mut family = effective_weight_family();
    for steered in plan.names() {
        for r in 0..steered.regions() {
            let choice = steered.choice(r);
            let total: u64 = steered.weights(choice).map(|(_, w)| w).sum();
            for target in steered.targets() {
                let w = steered
                    .weights(choice)
                    .find(|(t, _)| t.cdn == target.cdn)
                    .map_or(0, |(_, w)| w);
                let mut g = prometheus::proto::Gauge::default();
                g.set_value(w as f64 * 100.0 / total.max(1) as f64);
                let mut m = prometheus::proto::Metric::from_label(vec![
                    label("cdn", &target.cdn),
                    label("name", steered.text()),
                    label("region", steered.region_name(r)),
                ]);
                m.set_gauge(g);
                family.mut_metric().push(m);
            }
        }
    }
    family
}

pub(super) fn label(name: &str, value: &str) -> prometheus::proto::LabelPair {
    let mut l = prometheus::proto::LabelPair::default();
    l.set_name(name.into());
    l.set_value(value.into());
    l
}

/// (name, region, CDN) of a steered answer.
pub(super) type SteeredKey = (Arc<str>, Arc<str>, Arc<str>);

/// The steered answer counts of every snapshot served.
///
/// The live counts sit in the plans (each choice counts its own answers), so a new
/// plan starts from zero. The tally holds every adopted snapshot until it is the only
/// holder: then no query can reach that plan any more (the data plane's references to
/// a replaced snapshot are real counts once `ArcSwap::store` returns), and its counts
/// are final and move into `totals`. A scrape adds the snapshots still held to the
/// totals: each answer is in exactly one of the two, so the counters never go back.
#[derive(Default)]
pub(super) struct Tally {
    totals: HashMap<SteeredKey, u64>,
    pub(super) held: Vec<Arc<Snapshot>>,
}

impl Tally {
    pub(super) fn fold_retired(&mut self) {
        let (retired, held): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|s| Arc::strong_count(s) == 1);
        self.held = held;
        for s in retired {
            add(&mut self.totals, &s.plan, false);
        }
    }

    /// Every series: the totals, and the plans still held (their zeros too, so that
    /// every (name, region, CDN) served has a series from the start).
    pub(super) fn counts(&mut self) -> HashMap<SteeredKey, u64> {
        self.fold_retired();
        let mut counts = self.totals.clone();
        for s in &self.held {
            add(&mut counts, &s.plan, true);
        }
        counts
    }
}

fn add(into: &mut HashMap<SteeredKey, u64>, plan: &Plan, zeros: bool) {
    for steered in plan.names() {
        for (region, cdn, n) in steered.answered() {
            if n > 0 || zeros {
                *into
                    .entry((steered.text().clone(), region.clone(), cdn.clone()))
                    .or_default() += n;
            }
        }
    }
}
