//! Control plane: what the clock brings due besides failover steps: the performance
//! shifts, the commit biases, and the DNSSEC signatures.

use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, info};

use super::Controller;
use crate::clock::now_ms;
use crate::control::modifiers::chain::Chain;

impl Controller {
    /// When the DNSSEC signatures are to be replaced, if the zones are signed.
    pub(super) fn resign_due(&self) -> Option<Instant> {
        let at_ms = self.loaded.dnssec.as_ref()?.due().saturating_mul(1000);
        // In ms: counted in whole seconds, a key's time could be acted on up to a second
        // late (now 12.9 s, due at 13 s: a wait of 1 s).
        let wait = at_ms.saturating_sub(now_ms());
        Some(Instant::now() + Duration::from_millis(wait))
    }

    /// Signs again when the signature window has moved on; a failure is logged and the
    /// last signatures keep serving. Whether there are new ones to publish.
    pub(super) fn resign(&mut self) -> bool {
        let Some(d) = &self.loaded.dnssec else {
            return false;
        };
        let now = crate::clock::now_secs();
        match d.refresh(&self.loaded.policy, &self.loaded.zones, now) {
            Ok(changed) => {
                if changed {
                    let signed = d.signed();
                    let keys: Vec<String> = signed
                        .zones
                        .iter()
                        .map(|(z, published, active)| {
                            format!("{z} published {published:?} signing {active:?}")
                        })
                        .collect();
                    let until = signed.window.expiration;
                    info!(until = %crate::control::decide::times::rfc3339(until * 1000), keys = %keys.join("; "), "DNSSEC: signed again");
                }
                changed
            }
            Err(e) => {
                error!(error = %e, "DNSSEC: signing failed; the last signatures keep serving");
                false
            }
        }
    }

    /// Evaluates the performance shifts due now: proposed to the set, and put in
    /// force from its view (`follow_perf`). Nothing changes here at once.
    pub(super) fn evaluate_perf(&mut self) -> bool {
        self.set.propose_perf(&mut self.perf, now_ms());
        self.perf.export(&self.metrics);
        false
    }

    /// Evaluates the commit biases due now, against the policy after performance
    /// steering. True when a bias changed.
    pub(super) fn evaluate_commit(&mut self) -> bool {
        let now = now_ms();
        if self.commit.next_due_ms().is_none_or(|d| d > now) {
            return false;
        }
        let chain = Chain::new(&self.perf);
        let base = chain.shifted(&self.loaded.policy);
        let outside = |n: &str, r: usize, c: usize| chain.outside(n, r, c);
        // The biases are the set's: proposed here, put in force from its view.
        self.set
            .propose_commit(&mut self.commit, &base, &outside, now);
        self.commit.export(&self.metrics, now);
        false
    }
}
