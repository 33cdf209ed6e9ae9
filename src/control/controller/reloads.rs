//! Control plane: a reload of the configuration, swapped in with its diff audited,
//! or refused with the last good configuration serving. The API tokens go on their
//! own: a refused reload still takes a tokens file that loads (a revoked token stops
//! working while a broken zone is repaired), and a broken tokens file keeps the last
//! good tokens.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;
use tracing::{error, info, warn};

use super::Controller;
use crate::clock::now_ms;
use crate::config::tokens::Tokens;
use crate::control::state_doc::ReloadOutcome;
use crate::control::tasks::reload::{Reloaded, Trigger};
use crate::error::Issues;
use crate::inputs::Loaded;

impl Controller {
    /// A reload refused: logged, counted, audited and shown; the last good
    /// configuration keeps serving.
    pub(super) fn refuse_reload(&mut self, trigger: Trigger, issues: &Issues) {
        self.metrics.reload(false);
        for issue in issues.errors() {
            error!(trigger = %trigger, error = %issue, "reload refused: the last good configuration keeps serving");
        }
        self.audit(
            "reload",
            serde_json::json!({
                "trigger": trigger.to_string(),
                "result": "refused",
                "serving_version": self.loaded.version,
                "errors": issues.errors().map(ToString::to_string).collect::<Vec<_>>(),
            }),
        );
        self.noted.last_reload = Some(ReloadOutcome {
            trigger: trigger.to_string(),
            result: "refused",
            errors: issues.errors().map(ToString::to_string).collect(),
            serving_version: self.loaded.version.clone(),
        });
        self.update_doc();
    }

    /// Swaps in a reloaded configuration, or keeps the last good one; returns whether
    /// the probes changed (so the prober must restart).
    pub(super) fn apply_reload(&mut self, reloaded: Reloaded) -> bool {
        let trigger = reloaded.trigger;
        match reloaded.result {
            Err(mut issues) => {
                // The tokens file's own problems, when the load stopped before it (a
                // zone that does not parse): said with the rest.
                if let Some(Err(tokens)) = &reloaded.tokens {
                    for issue in tokens.errors() {
                        let said = issue.to_string();
                        if !issues.errors().any(|i| i.to_string() == said) {
                            issues.push(issue.clone());
                        }
                    }
                }
                if let Some(tokens) = reloaded.tokens {
                    self.tokens_alone(tokens, trigger);
                }
                self.refuse_reload(trigger, &issues);
                false
            }
            Ok(loaded) => {
                for w in loaded.warnings.warnings() {
                    warn!(warning = %w, "configuration warning");
                }
                let probes_changed = loaded.probes != self.loaded.probes;
                let m = &self.metrics;
                m.reload(true);
                m.config_version(&loaded.version);
                m.policy_version(&loaded.policy.version);
                for spec in &loaded.probes.specs {
                    m.cdn_probed(&spec.cdn);
                }
                let from = self.loaded.version.clone();
                let diff = reload_diff(&self.loaded, &loaded);
                self.audit(
                    "reload",
                    serde_json::json!({
                        "trigger": trigger.to_string(),
                        "result": "applied",
                        "from_version": from,
                        "from_policy": self.loaded.policy.version,
                        "to_policy": loaded.policy.version,
                        "to_version": loaded.version,
                        "diff": diff,
                    }),
                );
                if **self.tokens.load() != loaded.tokens {
                    self.metrics.tokens_reload(true);
                    self.tokens.store(Arc::new(loaded.tokens.clone()));
                }
                self.loaded = Arc::new(loaded);
                self.set.rescope(&self.loaded);
                // Health and failover progress carry over for the CDNs and names that remain.
                self.state
                    .failover
                    .retain_known(&self.loaded.policy, &self.loaded.probes);
                info!(trigger = %trigger, from = %from, to = %self.loaded.version, probes_changed, "configuration reloaded");
                self.noted.last_reload = Some(ReloadOutcome {
                    trigger: trigger.to_string(),
                    result: "applied",
                    errors: Vec::new(),
                    serving_version: self.loaded.version.clone(),
                });
                self.state
                    .drains
                    .sync(&self.loaded.policy, Instant::now(), now_ms());
                self.perf.configure(&self.loaded.policy, now_ms());
                self.commit.configure(&self.loaded.policy, now_ms());
                self.publish();
                if let Some(live) = &self.live {
                    self.perf.locate(&live.load());
                }
                probes_changed
            }
        }
    }
}

impl Controller {
    /// The tokens file loaded on its own while the rest of a reload was refused: its
    /// tokens take over if they changed (audited); a broken file keeps the last good
    /// ones (its errors are among the reload's, logged there), counted.
    pub(super) fn tokens_alone(&mut self, tokens: Result<Tokens, Issues>, trigger: Trigger) {
        let tokens = match tokens {
            Ok(t) => t,
            Err(_) => {
                self.metrics.tokens_reload(false);
                warn!(trigger = %trigger, "the API tokens file is refused: the last good tokens stay in force");
                return;
            }
        };
        let old = self.tokens.load_full();
        if *old == tokens {
            return;
        }
        let names = |t: &Tokens| t.list.iter().map(|t| t.name.clone()).collect::<Vec<_>>();
        let (was, now) = (names(&old), names(&tokens));
        let removed: Vec<&String> = was.iter().filter(|n| !now.contains(n)).collect();
        self.metrics.tokens_reload(true);
        info!(trigger = %trigger, tokens = now.len(), removed = ?removed, "API tokens reloaded on their own (the rest of the reload was refused)");
        self.audit(
            "reload",
            serde_json::json!({
                "trigger": trigger.to_string(),
                "result": "tokens applied",
                "serving_version": self.loaded.version,
                "diff": { "tokens": now, "tokens_removed": removed },
            }),
        );
        self.tokens.store(Arc::new(tokens));
    }
}

/// What a reload changed: names added, removed and changed, probes, tokens.
fn reload_diff(old: &Loaded, new: &Loaded) -> serde_json::Value {
    let names = |l: &Loaded| -> BTreeMap<String, String> {
        l.policy
            .hosts
            .iter()
            .map(|h| (h.name.to_string(), format!("{h:?}")))
            .collect()
    };
    let (a, b) = (names(old), names(new));
    let added: Vec<&String> = b.keys().filter(|k| !a.contains_key(*k)).collect();
    let removed: Vec<&String> = a.keys().filter(|k| !b.contains_key(*k)).collect();
    let changed: Vec<&String> = b
        .iter()
        .filter(|(k, v)| a.get(*k).is_some_and(|o| o != *v))
        .map(|(k, _)| k)
        .collect();
    serde_json::json!({
        "names_added": added,
        "names_removed": removed,
        "names_changed": changed,
        "probes_changed": old.probes != new.probes,
        "tokens": new.tokens.list.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
    })
}
