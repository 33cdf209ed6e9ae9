//! Control plane, the state directory: the recorded traffic, `steerdns-traffic.json`.
//! The performance steering's beacon samples of every (name, region) in their window,
//! counted by source network (/24, /48), every CDN's together: how a region's clients
//! are spread over its networks, for `steerdns diff` to weigh the networks whose answer
//! changes by traffic as well as by address space.
//!
//! `serve` rewrites the file (atomically: temporary file, fsync, rename, fsync of the
//! directory) each bucket width in which samples were accepted ([`spawn`]); nothing
//! reads it back at start: the samples themselves are not restored (a region taken
//! back from the state file waits a window for new ones). Only regions with a
//! `performance:` block take samples, so only they have recorded traffic. Usage
//! records (`POST /v1/usage`) are per CDN and interval, not per network, and are not
//! here.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::control::modifiers::perf::{network_prefix, RegionTraffic, Samples};

use super::persist::TRAFFIC_FILE as FILE;

/// The recorded traffic, as saved.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedTraffic {
    /// Wall-clock time of the save, milliseconds since the Unix epoch.
    pub saved_unix_ms: u64,
    pub regions: Vec<SavedRegion>,
}

/// One (name, region) with samples in its window.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SavedRegion {
    /// The steered name (`www.example.com.`).
    pub name: String,
    /// The region's `name:`.
    pub region: String,
    pub window_seconds: f64,
    /// Source network (`2.16.0.0/24`, `2a00:1450:4009::/48`) → samples in the window.
    pub networks: BTreeMap<String, u64>,
}

impl SavedTraffic {
    /// The traffic of `regions` saved at `now_ms`.
    pub fn of(regions: &[RegionTraffic], now_ms: u64) -> SavedTraffic {
        let region = |r: &RegionTraffic| SavedRegion {
            name: r.name.clone(),
            region: r.region.clone(),
            window_seconds: r.window_ms as f64 / 1000.0,
            networks: r
                .nets
                .iter()
                .map(|(net, n)| {
                    let (ip, prefix) = network_prefix(*net);
                    (format!("{ip}/{prefix}"), *n)
                })
                .collect(),
        };
        SavedTraffic {
            saved_unix_ms: now_ms,
            regions: regions.iter().map(region).collect(),
        }
    }

    /// Samples in all.
    pub fn samples(&self) -> u64 {
        self.regions.iter().flat_map(|r| r.networks.values()).sum()
    }
}

pub fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

/// Writes `traffic` into `dir` atomically; on an error the previous file is untouched
/// and the temporary file removed.
pub fn save(dir: &Path, traffic: &SavedTraffic) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let bytes = serde_json::to_vec_pretty(traffic).map_err(std::io::Error::other)?;
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let n = WRITES.fetch_add(1, Ordering::Relaxed);
    let tmp = dir.join(format!("{FILE}.{}.{n}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)?;
        f.write_all(&bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path(dir))
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written?;
    super::persist::sync_dir(dir)
}

/// Reads the recorded traffic in `dir`; `Ok(None)` when there is none.
pub fn load(dir: &Path) -> Result<Option<SavedTraffic>, String> {
    let file = path(dir);
    let text = match std::fs::read(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", file.display())),
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", file.display()))
}

/// Rewrites the file in `dir` each bucket width in which `samples` took some, on a
/// blocking thread (a slow disk holds up nothing else), until `stop`.
pub(crate) fn spawn(dir: PathBuf, samples: Arc<Samples>, stop: CancellationToken) {
    tokio::spawn(async move {
        let mut written = 0;
        let mut failing = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(samples.share_every()) => {}
            }
            let now_ms = crate::clock::now_ms();
            let (accepted, regions) = samples.traffic(now_ms);
            if accepted == written {
                continue;
            }
            let traffic = SavedTraffic::of(&regions, now_ms);
            let dir = dir.clone();
            let saved = tokio::task::spawn_blocking(move || save(&dir, &traffic)).await;
            match saved {
                Ok(Ok(())) => {
                    written = accepted;
                    if failing {
                        tracing::info!("the recorded traffic is saved again");
                        failing = false;
                    }
                }
                Ok(Err(e)) if !failing => {
                    tracing::warn!(error = %e, "cannot save the recorded traffic");
                    failing = true;
                }
                _ => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saved_and_read_back_with_networks_as_prefixes() {
        let dir = std::env::temp_dir().join(format!("steerdns-traffic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(load(&dir), Ok(None));
        let region = RegionTraffic {
            name: "www.example.com.".into(),
            region: "gb".into(),
            window_ms: 600_000,
            nets: BTreeMap::from([(
                u64::from(u32::from(std::net::Ipv4Addr::new(2, 16, 0, 0))),
                7,
            )]),
        };
        let saved = SavedTraffic::of(&[region], 1_000);
        save(&dir, &saved).unwrap();
        let back = load(&dir).unwrap().unwrap();
        assert_eq!(back, saved);
        assert_eq!(back.regions[0].networks["2.16.0.0/24"], 7);
        assert_eq!(back.samples(), 7);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
