//! Control plane: an API command (`Command`), checked once, then applied here and
//! saved (a single node) or written to etcd and applied from the watch (a set); and
//! `explain` for a live query.

use std::net::IpAddr;

use tokio::time::Instant;
use tracing::{info, warn};

use super::rounds::log_steps;
use super::Controller;
use crate::clock::now_ms;
use crate::control::cluster::node::ClusterLink;
use crate::control::command::{
    admit, admit_usage, audit_rule, may_undrain, undrain_fields, Command, Lever, UsageRefused,
    UsageTaken,
};
use crate::control::commit::ledger::Taken;
use crate::control::drains::DrainError;
use crate::control::explain::{self, ExplainError, Explanation};

impl Controller {
    /// An API command: checked once, then applied here and saved (a single node), or
    /// written to etcd and applied from the watch like any other node's (a set).
    pub(super) fn on_command(&mut self, command: Command) {
        let now = Instant::now();
        let loaded = self.loaded.clone();
        let policy = &loaded.policy;
        match command {
            Command::Drain(token, rule, reply) => {
                let mut drains = self.state.drains.clone();
                let admitted = self
                    .writable()
                    .and_then(|()| admit(&mut drains, policy, &token, rule, now_ms()));
                let rules = match admitted {
                    Ok(rules) => rules,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return;
                    }
                };
                if let Some(c) = self.cluster.as_mut() {
                    return c.write_drains(rules, reply);
                }
                self.state.drains = drains;
                for r in &rules {
                    info!(id = %r.id, name = %r.name, cdn = %r.cdn, reason = %r.reason, author = ?r.author, "drain override added over the API");
                    self.audit("drain", audit_rule(r));
                }
                self.state.drains.sync(policy, now, now_ms());
                self.publish();
                self.reply(reply, Ok(rules));
            }
            Command::Undrain(token, id, reply) => {
                let found = match &self.cluster {
                    Some(c) => c.written_drain(&id),
                    None => self
                        .state
                        .drains
                        .overrides
                        .iter()
                        .find(|o| o.id == id)
                        .cloned(),
                };
                let Some(rule) = found else {
                    let _ = reply.send(Err(DrainError::NoSuchOverride(id)));
                    return;
                };
                if let Err(e) = may_undrain(policy, &token, &rule) {
                    let _ = reply.send(Err(e));
                    return;
                }
                if let Some(c) = self.cluster.as_mut() {
                    return c.write_undrain(rule, &token, reply);
                }
                self.state.drains.remove(&id);
                info!(id = %rule.id, name = %rule.name, cdn = %rule.cdn, author = %token.name, "drain override removed over the API");
                self.audit("undrain", undrain_fields(&rule, &token));
                self.state.drains.sync(policy, now, now_ms());
                self.publish();
                self.reply(reply, Ok(rule));
            }
            Command::Freeze(lever, reply) => {
                if let Err(e) = self.writable().and_then(|()| self.known_tenant(&lever)) {
                    let _ = reply.send(Err(e));
                    return;
                }
                if let Some(c) = self.cluster.as_mut() {
                    return c.write_freeze(lever, reply);
                }
                warn!(reason = %lever.reason, author = %lever.author, tenant = ?lever.tenant, "automatic failover frozen: health is tracked, no step is taken");
                self.audit("freeze", lever.fields());
                match lever.tenant {
                    Some(t) => self.state.failover.freeze_tenant(&t, lever.reason),
                    None => self.state.failover.freeze(lever.reason),
                }
                self.persist();
                self.reply(reply, Ok(()));
            }
            Command::Resume(lever, reply) => {
                if let Err(e) = self.writable().and_then(|()| self.known_tenant(&lever)) {
                    let _ = reply.send(Err(e));
                    return;
                }
                if let Some(c) = self.cluster.as_mut() {
                    let turns = self.state.failover.turns(policy, lever.tenant.as_deref());
                    return c.write_resume(lever, &turns, reply);
                }
                info!(reason = %lever.reason, author = %lever.author, tenant = ?lever.tenant, "automatic failover resumed");
                self.audit("resume", lever.fields());
                let taken = match &lever.tenant {
                    Some(t) => self.state.failover.resume_tenant(policy, t, now),
                    None => self.state.failover.resume(policy, now),
                };
                log_steps(&taken);
                self.publish();
                self.reply(reply, Ok(()));
            }
            Command::Usage(records, strict, reply) => {
                let (records, skipped) = match admit_usage(policy, records, strict, now_ms()) {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = reply.send(Err(UsageRefused::Bad(e)));
                        return;
                    }
                };
                if let Some(c) = self.cluster.as_mut() {
                    return c.write_usage(records, skipped, reply);
                }
                let mut taken = UsageTaken {
                    skipped,
                    ..UsageTaken::default()
                };
                for (cdn, start, r) in records {
                    match self.commit.record(policy, &cdn, start, r) {
                        Ok(Taken::Added) => taken.added += 1,
                        Ok(Taken::Replaced) => taken.replaced += 1,
                        Ok(Taken::Same) => taken.unchanged += 1,
                        Err(_) => taken.skipped += 1,
                    }
                }
                self.commit.export(&self.metrics, now_ms());
                self.persist();
                self.reply(reply, Ok(taken));
            }
            Command::Explain(name, ip, resolver, session, reply) => {
                let _ = reply.send(self.explain(&name, ip, resolver, session));
            }
            Command::Audit(after, limit, reply) => match &self.audit {
                Some(a) => a.page(after, limit, reply),
                None => {
                    let _ = reply.send(Err(
                        "no audit log: this server keeps no state directory".into()
                    ));
                }
            },
        }
    }

    /// Whether a change can be made now: in a set, only while etcd answers (a node
    /// failing static refuses a change before looking at it).
    pub(super) fn writable(&self) -> Result<(), DrainError> {
        self.cluster.as_ref().map_or(Ok(()), ClusterLink::writable)
    }

    /// Explains, for a live query, how `name` is answered to a client at `ip` and why.
    pub(super) fn explain(
        &self,
        name: &str,
        ip: IpAddr,
        resolver: Option<(IpAddr, u8)>,
        session: Option<u64>,
    ) -> Result<Explanation, ExplainError> {
        let live = self
            .live
            .as_ref()
            .ok_or(ExplainError::NotServing)?
            .load_full();
        let facts = explain::Facts {
            loaded: &self.loaded,
            snapshot: &live,
            health: &self.state.failover.health,
            removed: &self.removed(),
            drains: self.state.drains.report(&self.loaded.policy, now_ms()),
            frozen: self.state.frozen_for(&self.loaded, name),
            state: "live".into(),
        };
        let question = explain::Question {
            name,
            client: ip,
            resolver,
            now: crate::clock::now_secs(),
            session,
        };
        let mut e = explain::explain(&facts, &question)?;
        e.performance = self.perf.region_view(&e.name, e.region.index);
        e.commit = self.commit.name_view(&e.name, now_ms());
        Ok(e)
    }

    /// Refuses a freeze or resume of a tenant the policy does not have.
    pub(super) fn known_tenant(&self, lever: &Lever) -> Result<(), DrainError> {
        match &lever.tenant {
            Some(t)
                if !self
                    .loaded
                    .policy
                    .hosts
                    .iter()
                    .any(|h| h.tenant.as_ref() == Some(t)) =>
            {
                Err(DrainError::NoTenant(t.clone()))
            }
            _ => Ok(()),
        }
    }
}
