//! Control plane, a set: what may count in the store under the policy in force (its
//! names, CDNs, tenants and regions, the CDNs probed) and the set's members. Every key
//! is checked against it before it counts toward any cap (`view.rs`): a writer cannot
//! fill a cap with names, CDNs or tenants the policy does not have, and the caps left
//! are sized from the policy. The session reads everything anew under a new policy.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::refused::Refused;
use crate::config::HostPolicy;
use crate::control::modifiers::commit::month::Month;
use crate::inputs::Loaded;

/// The policy and the members a view is checked against.
#[derive(Clone)]
pub(crate) struct Scope {
    pub(crate) loaded: Arc<Loaded>,
    /// Who may write observations, performance cells and audit entries (`--members`,
    /// and this node).
    pub(crate) members: BTreeSet<String>,
}

impl Scope {
    pub(crate) fn new(loaded: Arc<Loaded>, members: &[String], own: &str) -> Scope {
        let mut m: BTreeSet<String> = members.iter().cloned().collect();
        m.insert(own.to_string());
        Scope { loaded, members: m }
    }

    /// The steered name `name` of the policy.
    pub(super) fn host(&self, name: &str) -> Result<&HostPolicy, Refused> {
        self.loaded
            .policy
            .host(name)
            .ok_or_else(|| Refused::NotHost(name.to_string()))
    }

    /// The steered name `name`, which must have `cdn`.
    pub(super) fn host_cdn(&self, name: &str, cdn: &str) -> Result<&HostPolicy, Refused> {
        let host = self.host(name)?;
        if !host.has_cdn(cdn) {
            return Err(Refused::NoCdn {
                name: name.to_string(),
                cdn: cdn.to_string(),
            });
        }
        Ok(host)
    }

    /// A region (by index) of the steered name `name`.
    pub(super) fn region(&self, name: &str, region: usize) -> Result<(), Refused> {
        let host = self.host(name)?;
        if region >= host.regions.len() {
            return Err(Refused::Region {
                name: name.to_string(),
                regions: host.regions.len(),
                asked: region + 1,
            });
        }
        Ok(())
    }

    pub(super) fn tenant(&self, tenant: &str) -> Result<(), Refused> {
        if !self.loaded.policy.has_tenant(tenant) {
            return Err(Refused::NotTenant(tenant.to_string()));
        }
        Ok(())
    }

    /// A CDN of some steered name.
    pub(super) fn cdn(&self, cdn: &str) -> Result<(), Refused> {
        if !self.loaded.policy.has_cdn(cdn) {
            return Err(Refused::NotCdn(cdn.to_string()));
        }
        Ok(())
    }

    /// A CDN this policy probes (an observation of any other does not count).
    pub(super) fn probed(&self, cdn: &str) -> Result<(), Refused> {
        if self.loaded.probes.get(cdn).is_none() {
            return Err(Refused::NotProbed(cdn.to_string()));
        }
        Ok(())
    }

    pub(super) fn member(&self, who: &str, what: &'static str) -> Result<(), Refused> {
        if !self.members.contains(who) {
            return Err(Refused::NotMember {
                who: who.to_string(),
                what,
            });
        }
        Ok(())
    }

    /// A usage day that counts at `now_ms`: this month or last (UTC), or tomorrow (a
    /// record may start up to a day ahead).
    pub(super) fn usage_day(&self, start_ms: u64, day: &str, now_ms: u64) -> Result<(), Refused> {
        if start_ms < Month::last_start(now_ms) || start_ms > now_ms + 86_400_000 {
            return Err(Refused::UsageDay(day.to_string()));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The failover tests' policy (www.example.com. with CDNs `a` and `b`, of tenant
    /// `shop`), both CDNs probed, and `members` besides `ns1` (this node).
    pub(crate) fn scope(members: &[&str]) -> Scope {
        let mut loaded = crate::inputs::demo();
        let policy = crate::control::decide::failover::tests::POLICY;
        loaded.policy = crate::config::parse(std::path::Path::new("t.yaml"), policy.into())
            .unwrap()
            .0;
        loaded.policy.hosts[0].tenant = Some("shop".into());
        for cdn in ["a", "b"] {
            loaded.probes.specs.push(crate::config::probes::ProbeSpec {
                cdn: cdn.into(),
                file: format!("{cdn}.yaml").into(),
                url: "http://127.0.0.1:1/".parse().unwrap(),
                host: None,
                connect_to: None,
                expect_status: 200,
                expect_body: None,
                timeout: std::time::Duration::from_secs(1),
                max_ttfb: std::time::Duration::from_secs(1),
                interval: std::time::Duration::from_secs(1),
                quorum: 1,
                down_after: 1,
                up_after: 1,
            });
        }
        let members: Vec<String> = members.iter().map(|m| m.to_string()).collect();
        Scope::new(Arc::new(loaded), &members, "ns1")
    }
}
