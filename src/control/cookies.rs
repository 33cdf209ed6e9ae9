//! Control plane: the DNS cookie secrets (`dns::cookie`): made, kept, rotated, shared.
//!
//! - A single node makes a random secret at its first start and keeps it in
//!   `STATE_DIR/cookie-secret` (owner-only, JSON [`SharedSecrets`]), so that a restart
//!   keeps the cookies it handed out valid.
//! - A set (`serve --etcd`) shares one record at `{prefix}cookie`: the first node to
//!   find none creates it (create-if-absent, with the secrets it kept); whichever node
//!   first finds it older than the rotation period rotates it (compare-and-swap on its
//!   revision, as timelines are written): a new current secret, the old current one
//!   kept as the previous, which is still accepted. Every node reads the record every
//!   [`SET_POLL`] and keeps a copy in its state directory; a node that cannot reach
//!   etcd keeps using the secrets it had (fail static).
//! - The rotation period (`--cookie-rotation-seconds`, default a day) is at least an
//!   hour: a cookie lives an hour (RFC 9018 §4.3), so one made just before a rotation
//!   is still accepted, under the previous secret, for its whole life.
//!
//! The data plane reads the secrets from a [`Jar`] (lock-free); this task replaces them.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::control::cluster::Etcd;
use crate::dns::cookie::{Jar, Secrets};

/// How often a single node checks whether its secret is due for rotation.
pub(crate) const LOCAL_POLL: Duration = Duration::from_secs(60);
/// How often a node of a set reads the set's record.
pub(crate) const SET_POLL: Duration = Duration::from_secs(2);
/// The rotation period unless `--cookie-rotation-seconds` says otherwise.
pub(crate) const DEFAULT_ROTATION: Duration = Duration::from_secs(86_400);
/// The shortest rotation period: a cookie's lifetime.
pub(crate) const MIN_ROTATION: Duration = Duration::from_secs(3600);
/// The file in the state directory.
pub(crate) const FILE: &str = "cookie-secret";

/// The secrets as kept on disk and in etcd: hex, and when `current` was made.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SharedSecrets {
    /// 16 bytes, hex.
    pub current: String,
    /// The secret before the last rotation, still accepted; 16 bytes, hex.
    #[serde(default)]
    pub previous: Option<String>,
    /// When `current` was made, Unix seconds.
    pub made: u64,
}

impl SharedSecrets {
    /// A new random secret made `now`.
    pub(crate) fn new(now: u64) -> SharedSecrets {
        SharedSecrets {
            current: crate::config::tokens::hex(&rand::random::<[u8; 16]>()),
            previous: None,
            made: now,
        }
    }

    /// The secrets for the data plane, or why the record is refused.
    pub(crate) fn secrets(&self) -> Result<Secrets, String> {
        Ok(Secrets {
            current: unhex(&self.current)?,
            previous: self.previous.as_deref().map(unhex).transpose()?,
        })
    }

    /// Whether `current` is older than `period` at `now`.
    pub(crate) fn due(&self, now: u64, period: Duration) -> bool {
        now.saturating_sub(self.made) >= period.as_secs()
    }

    /// A new current secret made `now`, the current one kept as the previous.
    pub(crate) fn rotated(&self, now: u64) -> SharedSecrets {
        SharedSecrets {
            current: crate::config::tokens::hex(&rand::random::<[u8; 16]>()),
            previous: Some(self.current.clone()),
            made: now,
        }
    }

    fn parse(bytes: &[u8]) -> Result<SharedSecrets, String> {
        // A secret file: serde's message without what it quotes of it.
        let s: SharedSecrets =
            serde_json::from_slice(bytes).map_err(|e| crate::secret::unquoted(&e.to_string()))?;
        s.secrets()?;
        Ok(s)
    }
}

/// A secret from its hex form. The error never quotes the text: it is a secret.
fn unhex(s: &str) -> Result<[u8; 16], String> {
    crate::config::tokens::unhex::<16>(s).ok_or_else(|| {
        format!(
            "a cookie secret is 32 hex digits, not {} bytes of text",
            s.len()
        )
    })
}

/// The secrets kept in `dir`, or new ones saved there (owner-only) when there are none.
/// A file that cannot be read or parsed is an error: the operator decides (a new secret
/// would silently invalidate every cookie handed out).
pub(crate) fn load_or_create(dir: &Path, now: u64) -> io::Result<SharedSecrets> {
    let path = dir.join(FILE);
    if path.exists() {
        let bytes = crate::secret::read_secret_file(&path).map_err(io::Error::other)?;
        return SharedSecrets::parse(&bytes)
            .map_err(|e| io::Error::other(format!("{}: {e}", path.display())));
    }
    let made = SharedSecrets::new(now);
    save(dir, &made)?;
    info!(file = %path.display(), "made a new DNS cookie secret");
    Ok(made)
}

/// Writes the secrets to `dir` (owner-only, replaced whole by a rename).
pub(crate) fn save(dir: &Path, s: &SharedSecrets) -> io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!("{FILE}.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut f = options.open(&tmp)?;
    let body = serde_json::to_vec(s).map_err(io::Error::other)?;
    io::Write::write_all(&mut f, &body)?;
    f.sync_all()?;
    std::fs::rename(&tmp, dir.join(FILE))
}

/// Where the secrets live besides the jar.
pub(crate) struct Keeper {
    pub jar: Arc<Jar>,
    /// The state directory (`None`: nothing kept, a random secret per start).
    pub dir: Option<PathBuf>,
    /// A set's etcd and the record's key.
    pub set: Option<(Etcd, String)>,
    pub rotation: Duration,
}

impl Keeper {
    /// Loads the kept secrets into the jar (an error: a state file that cannot be
    /// read), then keeps them: rotated on a single node, followed and rotated in a set.
    pub(crate) fn start(self, stop: CancellationToken) -> io::Result<()> {
        let now = crate::clock::now_secs();
        let kept = match &self.dir {
            Some(dir) => load_or_create(dir, now)?,
            None => SharedSecrets::new(now),
        };
        self.publish(&kept);
        tokio::spawn(async move {
            let mut kept = kept;
            let poll = if self.set.is_some() {
                SET_POLL
            } else {
                LOCAL_POLL
            };
            loop {
                if let Some(next) = self.step(&kept).await {
                    self.publish(&next);
                    if let Some(dir) = &self.dir {
                        if let Err(e) = save(dir, &next) {
                            warn!(error = %e, "cannot keep the DNS cookie secret in the state directory");
                        }
                    }
                    kept = next;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(poll) => {}
                }
            }
        });
        Ok(())
    }

    fn publish(&self, s: &SharedSecrets) {
        if let Ok(secrets) = s.secrets() {
            self.jar.store(Arc::new(secrets));
        }
    }

    /// One round: the secrets to use from now on, if they change.
    async fn step(&self, kept: &SharedSecrets) -> Option<SharedSecrets> {
        let now = crate::clock::now_secs();
        let Some((etcd, key)) = &self.set else {
            if !kept.due(now, self.rotation) {
                return None;
            }
            info!("rotated the DNS cookie secret (the previous one is still accepted)");
            return Some(kept.rotated(now));
        };
        // Fail static: on any error, the secrets kept.
        let kv = match etcd.get(key).await {
            Ok(kv) => kv,
            Err(e) => {
                warn!(error = %e, "cannot read the set's DNS cookie secret; keeping the last one");
                return None;
            }
        };
        let Some(kv) = kv else {
            let body = serde_json::to_vec(kept).ok()?;
            return match etcd.create(key, &body).await {
                // Ours is the set's; the next round reads whichever won.
                Ok(_) => None,
                Err(e) => {
                    warn!(error = %e, "cannot write the set's DNS cookie secret");
                    None
                }
            };
        };
        let shared = match SharedSecrets::parse(&kv.value) {
            Ok(s) => s,
            Err(e) => {
                warn!(key = %key, error = %e, "the set's DNS cookie secret is refused; keeping the last one");
                return None;
            }
        };
        if shared.due(now, self.rotation) {
            let next = shared.rotated(now);
            let body = serde_json::to_vec(&next).ok()?;
            match etcd.replace(key, kv.mod_revision, &body).await {
                Ok(true) => {
                    info!(
                        "rotated the set's DNS cookie secret (the previous one is still accepted)"
                    );
                    return Some(next);
                }
                // Another node rotated first: read it next round.
                Ok(false) => return (shared != *kept).then_some(shared),
                Err(e) => warn!(error = %e, "cannot rotate the set's DNS cookie secret"),
            }
        }
        (shared != *kept).then_some(shared)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("steerdns-cookies-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_secret_is_made_once_and_kept_owner_only() {
        let dir = scratch("keep");
        let made = load_or_create(&dir, 1000).unwrap();
        assert_eq!(made.made, 1000);
        assert!(made.previous.is_none());
        let again = load_or_create(&dir, 2000).unwrap();
        assert_eq!(again, made, "a restart keeps the secret");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join(FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        // A garbled file is an error, not a new secret.
        std::fs::write(dir.join(FILE), b"{\"current\":\"zz\",\"made\":1}").unwrap();
        assert!(load_or_create(&dir, 3000).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rotation_keeps_the_old_secret_as_the_previous() {
        let s = SharedSecrets::new(1000);
        let day = Duration::from_secs(86_400);
        assert!(!s.due(1000 + 86_399, day));
        assert!(s.due(1000 + 86_400, day));
        let r = s.rotated(90_000);
        assert_eq!(r.previous.as_deref(), Some(s.current.as_str()));
        assert_ne!(r.current, s.current);
        let secrets = r.secrets().unwrap();
        assert_eq!(secrets.previous, Some(s.secrets().unwrap().current));
        // Hex round trip, and refusals.
        let secret = crate::config::tokens::hex(&[0xab; 16]);
        assert_eq!(unhex(&secret).unwrap(), [0xab; 16]);
        assert!(unhex("abc").is_err());
        // A secret one digit short is refused without being quoted (logs are not secret).
        let e = unhex(&secret[1..]).unwrap_err();
        assert!(!e.contains(&secret[1..9]), "{e}");
        assert!(SharedSecrets::parse(b"{\"current\":\"00\",\"made\":1}").is_err());
        assert!(SharedSecrets::parse(
            b"{\"current\":\"000102030405060708090a0b0c0d0e0f\",\"made\":1,\"x\":1}"
        )
        .is_err());
    }
}
