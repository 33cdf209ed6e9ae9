//! Control plane: an API command (`Command`), checked once, then written to the set's
//! store (memory for a single node, etcd for a set) and applied from its view like
//! any other change, answered once applied and saved; and `explain` for a live query.

use std::net::IpAddr;

use super::Controller;
use crate::clock::now_ms;
use crate::control::decide::drains::DrainError;
use crate::control::disk::audit::PageError;
use crate::control::levers::command::{
    admit, admit_usage, may_undrain, Command, Lever, UsageRefused,
};
use crate::control::levers::explain::{self, ExplainError, Explanation};

impl Controller {
    /// An API command: checked once, then written to the set's store; it applies
    /// from the view, on one node as in a set.
    pub(super) fn on_command(&mut self, command: Command) {
        let loaded = self.loaded.clone();
        let policy = &loaded.policy;
        match command {
            Command::Drain { token, rule, reply } => {
                let mut drains = self.state.drains.clone();
                let admitted = self
                    .writable()
                    .and_then(|()| admit(&mut drains, policy, &token, rule, now_ms()));
                match admitted {
                    Ok(a) => self.set.write_drains(a.rules, a.replaced, reply),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::Undrain { token, id, reply } => {
                if let Err(e) = self.writable() {
                    let _ = reply.send(Err(e));
                    return;
                }
                let Some(rule) = self.set.written_drain(&id) else {
                    let _ = reply.send(Err(DrainError::NoSuchOverride(id)));
                    return;
                };
                match may_undrain(policy, &token, &rule) {
                    Ok(()) => self.set.write_undrain(rule, &token, reply),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::Freeze { lever, reply } => {
                match self.writable().and_then(|()| self.known_tenant(&lever)) {
                    Ok(()) => self.set.write_freeze(lever, reply),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                    }
                }
            }
            Command::Resume { lever, reply } => {
                if let Err(e) = self.writable().and_then(|()| self.known_tenant(&lever)) {
                    let _ = reply.send(Err(e));
                    return;
                }
                // A tenant not frozen: nothing to resume (its timelines would start
                // anew and skip a step interval).
                if let Some(t) = &lever.tenant {
                    if !self.state.failover.frozen_tenants.contains_key(t) {
                        let _ = reply.send(Err(DrainError::NotFrozen(t.clone())));
                        return;
                    }
                }
                let turns = self.state.failover.turns(policy, lever.tenant.as_deref());
                self.set.write_resume(lever, &turns, reply);
            }
            Command::Usage {
                records,
                strict,
                author,
                reply,
            } => {
                if let Some(why) = self.unaudited() {
                    let _ = reply.send(Err(UsageRefused::NotAudited(why)));
                    return;
                }
                match admit_usage(policy, records, strict, now_ms()) {
                    Ok((records, skipped)) => self.set.write_usage(records, skipped, author, reply),
                    Err(e) => {
                        let _ = reply.send(Err(UsageRefused::Bad(e)));
                    }
                }
            }
            Command::PolicyStatus { reply } => {
                let doc = serde_json::to_value(self.policy_status()).unwrap_or_default();
                let _ = reply.send(doc);
            }
            Command::PolicyApply {
                yaml,
                if_match,
                author,
                ticket,
                stages,
                reply,
            } => {
                let source = crate::control::cluster::policy::Source::Text(yaml);
                self.apply_policy(source, if_match, author, ticket, stages, reply);
            }
            Command::PolicyHalt {
                author,
                ticket,
                reply,
            } => self.halt_policy(author, ticket, reply),
            Command::PolicyRollback {
                version,
                author,
                ticket,
                reply,
            } => self.rollback_policy(version, author, ticket, reply),
            Command::Explain {
                name,
                ip,
                resolver,
                session,
                reply,
            } => {
                let _ = reply.send(self.explain(&name, ip, resolver, session));
            }
            Command::Audit {
                after,
                limit,
                reply,
            } => match &self.audit {
                Some(a) => a.page(after, limit, reply),
                None => {
                    let _ = reply.send(Err(PageError::NoLog));
                }
            },
        }
    }

    /// Whether a change can be made now: in a set, only while etcd answers (a node
    /// failing static refuses a change before looking at it).
    pub(super) fn writable(&self) -> Result<(), DrainError> {
        if let Some(why) = self.unaudited() {
            return Err(DrainError::NotAudited(why));
        }
        self.set.writable()
    }

    /// The audit log for `/v1/state` (`None` without a state directory).
    pub(super) fn audit_doc(&self) -> Option<crate::control::state_doc::AuditDoc> {
        self.state_file.as_ref()?;
        Some(crate::control::state_doc::AuditDoc(
            self.audit.as_ref().map(|a| a.watch()),
        ))
    }

    /// Why a change could not be audited now (`None`: it can). A node without a state
    /// directory keeps no audit log, by its configuration.
    pub(super) fn unaudited(&self) -> Option<String> {
        let why = match (&self.audit, &self.state_file) {
            (Some(a), _) => a.failing()?,
            (None, Some(_)) => "it could not be opened at start (see the log)".into(),
            (None, None) => return None,
        };
        Some(format!(
            "the audit log cannot be written, so no change is made unaudited: {why}"
        ))
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
            canary: self.canary_loaded(),
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
            Some(t) if !self.loaded.policy.has_tenant(t) => Err(DrainError::NoTenant(t.clone())),
            _ => Ok(()),
        }
    }
}
