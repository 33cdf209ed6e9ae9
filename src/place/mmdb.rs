//! Input (loading): a MaxMind DB file, the form of both the geo and the ASN database.
//! One reader, one walk and one error type for both, so that a broken file is refused
//! with the same words whichever flag named it.
//!
//! A file is read whole ([`read`]: an operator overwriting it in place cannot corrupt a
//! running server), its search tree bounded before anything is decoded ([`open`],
//! [`super::tree::check`]), then walked whole ([`each_network`]): a broken tree opens
//! fine and then answers "not found" for everyone, which would silently send all clients
//! to the default, so a corrupt database is refused at load and the last good one keeps
//! serving. The caller keeps what the walk gave it (flat tables, [`super::flat`]) and
//! drops the file's bytes.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use maxminddb::{Reader, WithinOptions};
use serde::Deserialize;

use super::tree::TreeError;

/// A geo or ASN database refused, with the file it came from.
#[derive(Debug, thiserror::Error)]
#[error("{}: {reason}", path.display())]
pub struct GeoError {
    pub path: PathBuf,
    pub reason: GeoFault,
}

/// What is wrong with a geo or ASN database file.
#[derive(Debug, thiserror::Error)]
pub enum GeoFault {
    /// The file cannot be read.
    #[error("cannot read: {0}")]
    Unreadable(#[from] std::io::Error),
    /// Its metadata is not MaxMind DB metadata.
    #[error("not a MaxMind DB: {0}")]
    NotMaxMind(maxminddb::MaxMindDbError),
    /// Its search tree is refused before the walk.
    #[error(transparent)]
    Tree(#[from] TreeError),
    /// The walk cannot start.
    #[error("cannot walk the search tree: {0}")]
    Walk(maxminddb::MaxMindDbError),
    /// A node of the search tree is broken.
    #[error("corrupt search tree: {0}")]
    CorruptTree(maxminddb::MaxMindDbError),
    /// A record does not decode.
    #[error("corrupt data section: {0}")]
    CorruptData(maxminddb::MaxMindDbError),
    /// No network carries the field the database is read for (the wrong kind of
    /// database).
    #[error("no network carries {what} (database type {database_type:?}): {needed} is needed")]
    Lacks {
        what: &'static str,
        database_type: String,
        needed: &'static str,
    },
}

/// Reads the file at `path` whole and builds a database from its bytes; a failure of
/// either names the file.
pub(super) fn read<T>(
    path: &Path,
    build: impl FnOnce(Vec<u8>) -> Result<T, GeoFault>,
) -> Result<T, GeoError> {
    let err = |reason: GeoFault| GeoError {
        path: path.to_path_buf(),
        reason,
    };
    let bytes = std::fs::read(path).map_err(|e| err(e.into()))?;
    build(bytes).map_err(err)
}

/// How a database shows in `{:?}` (`kind`: `GeoDb`, `AsnDb`): its file and how many
/// networks it holds, not its tables.
pub(super) fn debug(
    f: &mut std::fmt::Formatter<'_>,
    kind: &str,
    path: &Path,
    networks: usize,
) -> std::fmt::Result {
    f.debug_struct(kind)
        .field("path", &path)
        .field("networks", &networks)
        .finish()
}

/// Opens a database held in memory once its tree passes [`super::tree::check`].
pub(super) fn open(bytes: Vec<u8>) -> Result<Reader<Vec<u8>>, GeoFault> {
    let (node_count, record_size, ip_version) = {
        let probe = Reader::from_source(&bytes[..]).map_err(GeoFault::NotMaxMind)?;
        let m = probe.metadata();
        (m.node_count as usize, m.record_size, m.ip_version)
    };
    super::tree::check(&bytes, node_count, record_size, ip_version)?;
    Reader::from_source(bytes).map_err(GeoFault::NotMaxMind)
}

/// What a whole walk found ([`each_network`]).
#[derive(Debug)]
pub(super) struct Walked {
    /// Networks with data, for the startup log.
    pub networks: usize,
    /// Networks that carry what the database is read for (a country, an AS).
    pub carrying: usize,
    /// `database_type` from the metadata.
    pub database_type: String,
    /// An IPv6 tree (whose walk skips the aliases of the IPv4 space, [`super::flat`]).
    pub ipv6: bool,
}

impl Walked {
    /// An error unless some network carries `what` (the field the database is read
    /// for); `needed` names the databases that have it.
    pub(super) fn require(&self, what: &'static str, needed: &'static str) -> Result<(), GeoFault> {
        if self.carrying > 0 {
            return Ok(());
        }
        Err(GeoFault::Lacks {
            what,
            database_type: self.database_type.clone(),
            needed,
        })
    }
}

/// Walks the whole search tree of a database opened by [`open`], calling `f` with each
/// network (start, prefix length) and its record, empty networks included (`None`);
/// `f` says whether the network carries what the database is read for.
pub(super) fn each_network<'de, T: Deserialize<'de>>(
    reader: &'de Reader<Vec<u8>>,
    mut f: impl FnMut(IpAddr, u8, Option<T>) -> bool,
) -> Result<Walked, GeoFault> {
    let meta = reader.metadata();
    let mut walked = Walked {
        networks: 0,
        carrying: 0,
        database_type: meta.database_type.clone(),
        ipv6: meta.ip_version == 6,
    };
    let iter = reader
        .networks(WithinOptions::default().include_networks_without_data())
        .map_err(GeoFault::Walk)?;
    for item in iter {
        let item = item.map_err(GeoFault::CorruptTree)?;
        let net = item.network().map_err(GeoFault::CorruptTree)?;
        let rec: Option<T> = item.decode().map_err(GeoFault::CorruptData)?;
        walked.networks += usize::from(item.has_data());
        walked.carrying += usize::from(f(net.network(), net.prefix(), rec));
    }
    Ok(walked)
}

/// A walk of a database's search tree for `ip`: its record (the default when there is
/// none or it does not decode) and the prefix of the network, or empty block, holding
/// it. The reference the flat tables are tested against.
#[cfg(test)]
pub(super) fn walk<'de, T: Deserialize<'de> + Default>(
    reader: &'de Reader<Vec<u8>>,
    ip: IpAddr,
) -> (T, u8) {
    let Ok(found) = reader.lookup(ip) else {
        return (T::default(), 0);
    };
    let prefix_len = found.network().map(|n| n.prefix()).unwrap_or(0);
    (
        found.decode().ok().flatten().unwrap_or_default(),
        prefix_len,
    )
}

/// The random addresses the flat tables are tested on against [`walk`]: 20,000 IPv4,
/// then 20,000 IPv6, mostly global unicast (where the data is).
#[cfg(test)]
pub(super) fn random_ips(rng: &mut rand::rngs::SmallRng) -> Vec<IpAddr> {
    use rand::RngExt;
    use std::net::{Ipv4Addr, Ipv6Addr};

    let mut ips: Vec<IpAddr> = (0..20_000)
        .map(|_| IpAddr::V4(Ipv4Addr::from(rng.random::<u32>())))
        .collect();
    ips.extend((0..20_000).map(|_| {
        let a = rng.random::<u128>() >> 3 | 0x2000 << 112;
        IpAddr::V6(Ipv6Addr::from(a))
    }));
    ips
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_file_and_why() {
        let missing = Path::new("/nonexistent/steerdns.mmdb");
        let e = read(missing, |_| Ok(())).unwrap_err();
        assert_eq!(e.path, missing);
        assert!(matches!(e.reason, GeoFault::Unreadable(_)));
        assert!(e.reason.to_string().starts_with("cannot read: "), "{e}");
        let e = read(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("Cargo.toml")
                .as_path(),
            |b| open(b).map(drop),
        )
        .unwrap_err();
        assert!(matches!(e.reason, GeoFault::NotMaxMind(_)));
        assert!(
            e.reason.to_string().starts_with("not a MaxMind DB: "),
            "{e}"
        );
        assert!(
            e.to_string().contains("Cargo.toml: not a MaxMind DB"),
            "{e}"
        );
    }
}
