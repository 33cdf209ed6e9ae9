//! Control plane: explain. Why a client gets the answer it gets, as one typed
//! [`Explanation`] built by one function ([`explain`]) for both callers:
//!
//! - `steerdns explain NAME --client IP` (the CLI), from the files and the failover state
//!   a local `serve` saved, prints it ([`std::fmt::Display`]);
//! - `GET /v1/explain?name=&client=` (the API), from the live state, serialises it.
//!
//! Both read the same plan the data plane answers from (`plan::Steered`: situate, then
//! pick), so what explain says is what a query gets.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use hickory_proto::rr::{LowerName, Name};
use serde::Serialize;

use crate::control::content::manifest::{self, Params};
use crate::control::decide::drains::DrainStatus;
use crate::control::decide::health::Tracker;
use crate::control::decide::planner::{removed_of, Removed};
use crate::control::decide::times;
use crate::inputs::Loaded;
use crate::place::geo::Place;
use crate::plan::{Asker, Cohort, Reason, Snapshot};

/// What explain reads besides the question: the inputs, the snapshot served, and the
/// failover state behind it.
pub(crate) struct Facts<'a> {
    pub loaded: &'a Loaded,
    pub snapshot: &'a Snapshot,
    /// Health per probed CDN.
    pub health: &'a BTreeMap<String, Tracker>,
    /// Percent of each CDN's share moved away by failover.
    pub removed: &'a Removed,
    /// Every drain (explain keeps the name's).
    pub drains: Vec<DrainStatus>,
    pub frozen: Option<String>,
    /// Where the failover state comes from (`live`, or the saved file and its age).
    pub state: String,
    /// A staged rollout's new version, loaded (`None`: no rollout).
    pub canary: Option<&'a Loaded>,
}

/// The question: a name, a client, and who asks.
pub(crate) struct Question<'q> {
    pub name: &'q str,
    pub client: IpAddr,
    /// The resolver asking with ECS `client / source`; `None`: the client asks itself,
    /// without ECS.
    pub resolver: Option<(IpAddr, u8)>,
    /// Unix seconds (the selection window).
    pub now: u64,
    /// A player's content steering session key, for the order it gets.
    pub session: Option<u64>,
}

/// Why a question is not explained.
#[derive(Debug, thiserror::Error)]
#[allow(clippy::enum_variant_names)] // "not a name", "not serving": what each says
pub enum ExplainError {
    #[error("`{0}` is not a DNS name: {1}")]
    NotAName(String, String),
    #[error("{0} is not a steered name: it is answered from the zone files")]
    NotSteered(String),
    #[error("not serving yet")]
    NotServing,
}

/// The origin AS of a client, from the ASN database.
#[derive(Debug, Serialize)]
pub struct OriginFound {
    /// `None`: the database does not know the address.
    pub asn: Option<u32>,
    /// Prefix of the ASN database network (or empty block) holding the client.
    pub network_prefix: u8,
    pub asn_database: String,
}

/// How a name is answered to a client, and why.
#[derive(Debug, Serialize)]
pub struct Explanation {
    pub name: String,
    /// The customer the name belongs to (`tenant:`).
    pub tenant: Option<String>,
    pub client: IpAddr,
    pub country: Option<String>,
    pub continent: Option<&'static str>,
    /// Prefix of the geo database network holding the client.
    pub network_prefix: u8,
    pub geo_database: String,
    /// The client's origin AS, when an ASN database is given (`--asn-db`).
    pub origin: Option<OriginFound>,
    pub region: RegionFound,
    pub ttl: u32,
    /// The ECS scope of the answer, when the query carries ECS.
    pub ecs_scope: u8,
    /// `normal`, `failover`, `drain` or `fail-open`.
    pub reason: String,
    /// The reason in words.
    pub reason_text: &'static str,
    pub cdns: Vec<CdnShare>,
    pub answer: Answer,
    /// What HLS and DASH players get on `--steering-http`.
    pub content_steering: SteeringFound,
    pub drains: Vec<DrainStatus>,
    pub failover_frozen: Option<String>,
    /// Until when (Unix seconds) the signature of the answer is valid, when the zone is
    /// signed (DO=1 queries get the CNAME's RRSIG); `None`: unsigned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signed_until_unix: Option<u64>,
    pub state: String,
    pub config_version: String,
    /// The policy version that decided the answer (the first 12 hex digits of the
    /// SHA-256 of its YAML).
    pub policy_version: String,
    /// During a staged rollout: the client's cohort and the version it gets.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<CohortFound>,
    /// The region's performance shift (`performance:`), when the server has one
    /// (live only: `steerdns explain` offline has no measurements).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub performance: Option<crate::control::modifiers::perf::RegionView>,
    /// The name's CDNs with a contract or a capacity (live only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub commit: Vec<crate::control::modifiers::commit::CdnView>,
}

/// Which version of a staged rollout answers the client.
#[derive(Debug, Serialize)]
pub struct CohortFound {
    /// `canary` (the new version) or `control` (the version in force).
    pub cohort: &'static str,
    /// The version that answers the client.
    pub version: String,
    /// The version rolling out.
    pub new_version: String,
    /// The percent of client networks the new version answers now.
    pub share_percent: f64,
}

#[derive(Debug, Serialize)]
pub struct RegionFound {
    pub index: usize,
    pub name: String,
    /// `first region matching `GB``, or `default`.
    pub why: String,
}

#[derive(Debug, Serialize)]
pub struct CdnShare {
    pub cdn: String,
    pub cname: String,
    /// The configured weight in the client's region.
    pub weight: u32,
    pub health: String,
    /// Percent of its share moved away by failover.
    pub failover_removed_percent: u8,
    /// Its effective share of the region's answers, in percent.
    pub share_percent: f64,
}

/// The CDN the question gets.
#[derive(Debug, Serialize)]
pub struct Answer {
    /// `consistent` or `random`.
    pub selection: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cdn: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cname: Option<String>,
    /// Who asks (the client itself without ECS).
    pub resolver: IpAddr,
    /// The ECS source prefix of the question; `None`: no ECS.
    pub ecs_source: Option<u8>,
    /// Until when (Unix seconds) the answer holds: then it is drawn again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until_unix: Option<u64>,
}

/// What content steering tells a player of this client.
#[derive(Debug, Serialize)]
pub struct SteeringFound {
    /// The manifests' `TTL`.
    pub ttl: u32,
    /// The pathways serving here, each with the percent of sessions that get it first.
    pub first: Vec<PathwayShare>,
    /// Pathways listed after them (no weight here now: down or drained).
    pub last: Vec<String>,
    /// The session asked about (16 hex digits), and its order.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub order: Option<Vec<String>>,
}

#[derive(Debug, Serialize)]
pub struct PathwayShare {
    pub cdn: String,
    pub pathway: String,
    pub first_percent: f64,
}

/// Explains `q` over `facts`.
pub(crate) fn explain(facts: &Facts, q: &Question) -> Result<Explanation, ExplainError> {
    let mut name = Name::from_ascii(q.name)
        .map_err(|e| ExplainError::NotAName(q.name.to_string(), e.to_string()))?;
    name.set_fqdn(true);
    let lower = LowerName::new(&name);
    // The query the answer is for: the resolver sends the client's network (host bits
    // cleared, as on the wire), or the client asks itself without ECS.
    let asker = match q.resolver {
        Some((r, source)) => {
            let net = crate::net::cut(q.client, source);
            Asker::new(r, Some((net, source)))
        }
        None => Asker::new(q.client, None),
    };
    // During a staged rollout, the version of the asker's cohort.
    let route = facts.snapshot.route(&asker);
    let loaded = match (route.cohort, facts.canary) {
        (Cohort::Canary, Some(canary)) => canary,
        _ => facts.loaded,
    };
    let rollout = facts.snapshot.canary.as_ref().map(|c| CohortFound {
        cohort: route.cohort.as_str(),
        version: match route.cohort {
            Cohort::Canary => c.version.to_string(),
            _ => c.from.to_string(),
        },
        new_version: c.version.to_string(),
        share_percent: f64::from(c.share) * 100.0 / f64::from(crate::selection::COHORT_PARTS),
    });
    let (Some(steered), Some(host)) = (
        route.plan.get(&lower),
        loaded
            .policy
            .hosts
            .iter()
            .find(|h| LowerName::new(&h.name) == lower),
    ) else {
        return Err(ExplainError::NotSteered(lower.to_string()));
    };
    let geo = &facts.snapshot.geo;
    // Where the client lands, with the ECS scope a tailored answer would echo.
    let at = steered.situate(geo, q.client, true);
    let (d, choice) = (at.decision, at.choice);
    // Explain shows the origin AS whenever an ASN database is attached (the situation
    // holds it only for a name whose answer depends on it).
    let place = Place {
        origin: geo.origin(q.client),
        ..at.place
    };
    let region = &host.regions[d.region];
    let why = region
        .matches
        .iter()
        .find(|m| m.covers(q.client, &place))
        .map_or_else(
            || "default".into(),
            |m| format!("first region matching `{m}`"),
        );
    let total: u64 = steered.weights(choice).map(|(_, w)| w).sum();
    let cdns = host
        .cdns
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let share = steered
                .weights(choice)
                .find(|(t, _)| *t.cdn == c.name)
                .map_or(0, |(_, w)| w);
            let health = match facts.health.get(&c.name) {
                Some(t) => t.state.to_string(),
                None if facts.loaded.probes.get(&c.name).is_some() => "up".to_string(),
                None => "up (not probed)".to_string(),
            };
            CdnShare {
                cdn: c.name.clone(),
                cname: c.cname.to_string(),
                weight: region.weights[i],
                health,
                failover_removed_percent: removed_of(facts.removed, host, &c.name),
                share_percent: share as f64 * 100.0 / total.max(1) as f64,
            }
        })
        .collect();
    let answer = match steered.consistent_answer(&facts.snapshot.geo, &asker, q.now) {
        Some((target, until)) => Answer {
            selection: "consistent",
            cdn: Some(target.cdn.to_string()),
            cname: Some(target.cname.to_string()),
            resolver: q.resolver.map_or(q.client, |(r, _)| r),
            ecs_source: q.resolver.map(|(_, s)| s),
            until_unix: Some(until),
        },
        None => Answer {
            selection: "random",
            cdn: None,
            cname: None,
            resolver: q.resolver.map_or(q.client, |(r, _)| r),
            ecs_source: q.resolver.map(|(_, s)| s),
            until_unix: None,
        },
    };
    let shares = manifest::first_shares(steered, choice);
    let content_steering = SteeringFound {
        ttl: steered.content().ttl.unwrap_or_else(|| steered.ttl()),
        first: shares
            .iter()
            .map(|&(t, p)| PathwayShare {
                cdn: steered.target(t).cdn.to_string(),
                pathway: manifest::pathway(steered, t).to_string(),
                first_percent: p,
            })
            .collect(),
        last: (0..steered.targets().len())
            .filter(|t| !shares.iter().any(|(s, _)| s == t))
            .map(|t| manifest::pathway(steered, t).to_string())
            .collect(),
        session: q.session.map(|s| format!("{s:016x}")),
        order: q.session.map(|s| {
            let o = manifest::order(steered, &at, s, &Params::default());
            o.targets
                .iter()
                .map(|&t| manifest::pathway(steered, t).to_string())
                .collect()
        }),
    };
    let host_name = host.name.to_string();
    Ok(Explanation {
        name: host_name.clone(),
        tenant: host.tenant.clone(),
        client: q.client,
        country: place.country.map(|c| c.to_string()),
        continent: place.continent.map(|c| c.code()),
        network_prefix: place.prefix_len,
        geo_database: facts.snapshot.geo.path().display().to_string(),
        origin: facts.snapshot.geo.asn().map(|db| OriginFound {
            asn: place.origin.asn,
            network_prefix: place.origin.prefix_len,
            asn_database: db.path().display().to_string(),
        }),
        region: RegionFound {
            index: d.region,
            name: region.name.clone(),
            why,
        },
        ttl: steered.ttl(),
        ecs_scope: match q.resolver {
            Some(_) => route.scope(d.scope),
            None => d.scope,
        },
        reason: choice.reason.to_string(),
        reason_text: reason_text(choice.reason),
        cdns,
        answer,
        content_steering,
        drains: facts
            .drains
            .iter()
            .filter(|r| r.name == host_name)
            .cloned()
            .collect(),
        failover_frozen: facts.frozen.clone(),
        signed_until_unix: facts
            .snapshot
            .signed_until
            .filter(|_| !steered.rrsigs(0).is_empty()),
        state: facts.state.clone(),
        config_version: loaded.version.clone(),
        policy_version: loaded.policy.version.clone(),
        rollout,
        performance: None,
        commit: Vec::new(),
    })
}

fn reason_text(reason: Reason) -> &'static str {
    match reason {
        Reason::Normal => "",
        Reason::Failover => "a CDN is off its configured weight",
        Reason::Drain => "a CDN is drained here by an operator",
        Reason::FailOpen => "a removed share has no other CDN of the region to go to, so it stays",
    }
}

// === impl Display for Explanation ===

impl fmt::Display for Explanation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let place = match (&self.country, self.continent) {
            (Some(c), Some(k)) => format!("country {c}, continent {k}"),
            (Some(c), None) => format!("country {c}, continent unknown"),
            (None, Some(k)) => format!("continent {k}, country unknown"),
            _ => "not in the geo database".into(),
        };
        writeln!(f, "name:    {}", self.name)?;
        if let Some(t) = &self.tenant {
            writeln!(f, "tenant:  {t}")?;
        }
        writeln!(
            f,
            "client:  {}: {place} (network /{} in {})",
            self.client, self.network_prefix, self.geo_database
        )?;
        if let Some(o) = &self.origin {
            let asn = o
                .asn
                .map_or_else(|| "no AS known".into(), |a| format!("AS{a}"));
            writeln!(
                f,
                "origin:  {asn} (network /{} in {})",
                o.network_prefix, o.asn_database
            )?;
        }
        writeln!(
            f,
            "region:  regions[{}] {:?} ({})",
            self.region.index, self.region.name, self.region.why
        )?;
        writeln!(
            f,
            "answer:  CNAME, TTL {}, ECS scope /{} (when the query carries ECS)",
            self.ttl, self.ecs_scope
        )?;
        writeln!(f, "state:   {}", self.state)?;
        if let Some(why) = &self.failover_frozen {
            writeln!(f, "frozen:  automatic failover is frozen ({why})")?;
        }
        match self.reason_text {
            "" => writeln!(f, "reason:  {}", self.reason)?,
            text => writeln!(f, "reason:  {}: {text}", self.reason)?,
        }
        for c in &self.cdns {
            writeln!(
                f,
                "  {:<12} {:<30} weight {:>4}  health {:<4}  removed {:>3} %  share {:>5.1} %",
                c.cdn, c.cname, c.weight, c.health, c.failover_removed_percent, c.share_percent
            )?;
        }
        let asked = match self.answer.ecs_source {
            Some(source) => match ipnet::IpNet::new(self.client, source) {
                Ok(net) => format!("asked by {} with ECS {}", self.answer.resolver, net.trunc()),
                Err(_) => format!(
                    "asked by {} with ECS {}/{source}",
                    self.answer.resolver, self.client
                ),
            },
            None => format!("asked by {} itself, without ECS", self.client),
        };
        match (&self.answer.cdn, &self.answer.cname, self.answer.until_unix) {
            (Some(cdn), Some(cname), Some(until)) => writeln!(
                f,
                "pick:    {cdn} ({cname}) {asked}, until {} (consistent selection: then drawn again)",
                times::rfc3339(until.saturating_mul(1000))
            )?,
            _ => writeln!(
                f,
                "pick:    a random draw per query by the shares above (selection: random)"
            )?,
        }
        match self.signed_until_unix {
            Some(until) => writeln!(
                f,
                "dnssec:  signed (DO=1 answers carry the CNAME's RRSIG), valid until {}",
                times::rfc3339(until.saturating_mul(1000))
            )?,
            None => writeln!(f, "dnssec:  unsigned")?,
        }
        let s = &self.content_steering;
        let first: Vec<String> = s
            .first
            .iter()
            .map(|p| format!("{} {:.1} %", p.pathway, p.first_percent))
            .collect();
        let last = if s.last.is_empty() {
            String::new()
        } else {
            format!(", then {} (no weight here now)", s.last.join(", "))
        };
        writeln!(
            f,
            "players: pathway first for sessions: {}{last}; TTL {}",
            first.join(", "),
            s.ttl
        )?;
        if let (Some(session), Some(order)) = (&s.session, &s.order) {
            writeln!(f, "session: {session}: {}", order.join(", "))?;
        }
        for d in &self.drains {
            let until = d.until_unix_ms.map_or("no expiry".to_string(), |u| {
                format!("until {}", times::rfc3339(u))
            });
            let scope = if d.scope.is_empty() {
                "everywhere".to_string()
            } else {
                d.scope.join(",")
            };
            writeln!(
                f,
                "drain:   {} {} [{scope}] {}: {} % removed ({}, {until})",
                d.id, d.cdn, d.status, d.removed_percent, d.reason
            )?;
        }
        if let Some(p) = &self.performance {
            crate::control::modifiers::perf::page::explain(f, p)?;
        }
        for c in &self.commit {
            crate::control::modifiers::commit::explain_line(f, c)?;
        }
        writeln!(f, "policy:  version {}", self.policy_version)?;
        writeln!(f, "config:  version {}", self.config_version)
    }
}
