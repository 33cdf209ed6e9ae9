//! Control plane, pure: what a policy edit changes, as data: the comparison of two
//! policies (serialisable, printed by `render`), and the recorded traffic it may be
//! weighed by.

use std::collections::HashMap;
use std::net::IpAddr;

use serde::Serialize;

/// What a policy edit changes, name by name and region by region.
#[derive(Clone, Debug, Serialize)]
pub struct PolicyDiff {
    pub old: Side,
    pub new: Side,
    /// The instant both plans were asked at (Unix seconds): the selection window.
    pub at: u64,
    /// The resolver the questions came through (its address is part of the key).
    pub resolver: IpAddr,
    /// Steered names only NEW has, and only OLD has.
    pub names_added: Vec<String>,
    pub names_removed: Vec<String>,
    /// Every name both have, in NEW's order.
    pub names: Vec<NameDiff>,
    /// Whether some answer differs: a CNAME for some network, a TTL, a name added or
    /// removed, a change of selection.
    pub changes_answers: bool,
    /// Where the traffic the networks are also weighed by came from, or why none.
    pub traffic: TrafficFrom,
}

/// The recorded traffic of the steered names: samples by source network (an input).
#[derive(Clone, Debug, Default)]
pub struct Traffic {
    pub from: TrafficFrom,
    /// Steered name (`www.example.com.`) → the first address of a source network →
    /// its samples.
    pub names: HashMap<String, Vec<(IpAddr, u64)>>,
}

/// Where recorded traffic came from.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TrafficFrom {
    /// The file read; `None`: no recorded traffic, the networks are weighed by address
    /// space alone.
    pub file: Option<String>,
    /// When `serve` saved it (Unix ms).
    pub saved_unix_ms: Option<u64>,
    /// Samples in the file.
    pub samples: u64,
    /// What the samples are, or why there are none.
    pub note: String,
}

/// One of the two policies.
#[derive(Clone, Debug, Serialize)]
pub struct Side {
    pub file: String,
    /// The policy version (a hash of the file's bytes).
    pub version: String,
}

/// One steered name both policies have.
#[derive(Clone, Debug, Serialize)]
pub struct NameDiff {
    pub name: String,
    pub cdns_added: Vec<String>,
    pub cdns_removed: Vec<String>,
    /// Settings that differ (TTLs, selection, failover, CNAMEs, drains).
    pub settings: Vec<Setting>,
    /// Every region of either policy: OLD's order, then those only NEW has.
    pub regions: Vec<RegionDiff>,
    /// Over every network placed by the database.
    pub ipv4: Moved,
    pub ipv6: Moved,
    /// Recorded traffic (samples) in those networks, and of it where the answer
    /// changes; `traffic_changed_percent` is `None` without any.
    pub traffic_samples: u64,
    pub traffic_changed_samples: u64,
    pub traffic_changed_percent: Option<f64>,
    pub changes_answers: bool,
}

/// A setting of a name that differs.
#[derive(Clone, Debug, Serialize)]
pub struct Setting {
    /// The field, as in the policy (`ttl`, `failover.steps`, `cdns.fastly.cname`).
    pub field: String,
    pub before: String,
    pub after: String,
    /// Whether the answers themselves change with it (a TTL, the selection); the
    /// others change what happens later (failover) or show in the shares (drains).
    pub changes_answers: bool,
}

/// One region of a name.
#[derive(Clone, Debug, Serialize)]
pub struct RegionDiff {
    /// The region's name (`name:`, else its match list).
    pub region: String,
    pub presence: Presence,
    /// Each CDN's share of the region's clients (outside location-scoped drains), in
    /// percent, before and after; `None` where the region (or the CDN) is absent.
    pub shares: Vec<Share>,
    pub ipv4: Moved,
    pub ipv6: Moved,
    /// The recorded traffic (samples) of the region's networks, and of it where the
    /// answer changes: the share of its traffic whose answer changes, `None` when it
    /// has none recorded.
    pub traffic_samples: u64,
    pub traffic_changed_samples: u64,
    pub traffic_changed_percent: Option<f64>,
    /// A few networks of the region whose answer changes and a few whose answer stays
    /// (up to three of each, in address order), as a resolver asks about them: to
    /// check with dig. None for `selection: random`.
    pub examples: Vec<Example>,
}

/// One network and the CDN it gets before and after.
#[derive(Clone, Debug, Serialize)]
pub struct Example {
    /// The ECS subnet asked with (`2.16.0.0/24`).
    pub network: String,
    pub before: String,
    pub after: String,
    /// Whether the answer (the CNAME) changes.
    pub changed: bool,
}

/// Whether a region is in both policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Presence {
    Both,
    Added,
    Removed,
}

/// A CDN's share of a region before and after, in percent.
#[derive(Clone, Debug, Serialize)]
pub struct Share {
    pub cdn: String,
    pub before: Option<f64>,
    pub after: Option<f64>,
}

/// The networks of one address family, and those whose answer changes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Moved {
    pub networks: u64,
    pub changed_networks: u64,
    /// The share of these networks' address space whose answer changes, in percent.
    pub changed_percent: f64,
    #[serde(skip)]
    space: f64,
    #[serde(skip)]
    changed_space: f64,
}

impl Moved {
    pub(super) fn add(&mut self, size: f64, changed: bool) {
        self.networks += 1;
        self.space += size;
        if changed {
            self.changed_networks += 1;
            self.changed_space += size;
        }
    }

    pub(super) fn finish(&mut self) {
        self.changed_percent = if self.space > 0.0 {
            100.0 * self.changed_space / self.space
        } else {
            0.0
        };
    }
}

/// Samples, and those whose answer changes.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Weighed {
    samples: u64,
    changed: u64,
}

impl Weighed {
    pub(super) fn add(&mut self, samples: u64, changed: bool) {
        self.samples += samples;
        if changed {
            self.changed += samples;
        }
    }

    /// (samples, changed, percent changed).
    pub(super) fn figures(self) -> (u64, u64, Option<f64>) {
        let pct = (self.samples > 0).then(|| 100.0 * self.changed as f64 / self.samples as f64);
        (self.samples, self.changed, pct)
    }
}
