//! Input (loading) and data plane (lookup): the AS-number database (`--asn-db`), for
//! `match: [AS13335]`.
//!
//! MaxMind's GeoLite2-ASN format (`autonomous_system_number`). Like the geo database it
//! is read whole and walked at load, so that a corrupt file is refused then and the last
//! good one keeps serving, and kept as flat tables ([`super::flat`]): a lookup is an
//! index read and a short binary search, not a walk of the tree and a decode. Only names
//! whose policy has AS entries ask (`plan`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::flat::{Aliases, Key, Starts};
use super::mmdb::{self, GeoError, GeoFault};

/// A validated, in-memory ASN database: its flat tables (the file itself is not kept).
pub struct AsnDb {
    v4: Table<u32>,
    v6: Table<u128>,
    /// The aliases of the IPv4 space in an IPv6 database (see [`super::flat`]).
    aliases: Aliases,
    path: PathBuf,
    networks: usize,
}

#[derive(Deserialize, Default)]
struct Record {
    #[serde(default)]
    autonomous_system_number: Option<u32>,
}

/// The origin AS of an address, and the prefix of the network over which that holds
/// (the database's network, or the empty block the address falls in).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    pub asn: Option<u32>,
    pub prefix_len: u8,
}

/// Every network of one family (with an AS or not), sorted, with its AS number (0 for
/// none: AS 0 is never an origin, RFC 7607) and prefix length.
struct Table<K> {
    starts: Starts<K>,
    asns: Box<[u32]>,
    prefixes: Box<[u8]>,
}

impl<K: Key> Table<K> {
    /// From the networks as the walk yields them.
    fn new(mut rows: Vec<(K, u8, u32)>) -> Table<K> {
        // A sound tree's walk yields them sorted already.
        if !rows.is_sorted_by_key(|r| r.0) {
            rows.sort_unstable_by_key(|r| r.0);
        }
        Table {
            asns: rows.iter().map(|r| r.2).collect(),
            prefixes: rows.iter().map(|r| r.1).collect(),
            starts: Starts::new(rows.into_iter().map(|r| r.0).collect()),
        }
    }

    /// # Hot path
    /// [`Starts::find`]; no allocation.
    fn get(&self, ip: K) -> Option<Origin> {
        let i = self.starts.find(ip, |i| self.prefixes[i])?;
        Some(Origin {
            asn: Some(self.asns[i]).filter(|&a| a != 0),
            prefix_len: self.prefixes[i],
        })
    }
}

impl AsnDb {
    /// Reads and validates a database file. Never used on the query path.
    pub fn open(path: &Path) -> Result<AsnDb, GeoError> {
        mmdb::read(path, |bytes| Self::from_bytes(bytes, path))
    }

    fn from_bytes(bytes: Vec<u8>, path: &Path) -> Result<AsnDb, GeoFault> {
        let reader = mmdb::open(bytes)?;
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        let walked = mmdb::each_network(&reader, |net, prefix, rec: Option<Record>| {
            let asn = rec.and_then(|r| r.autonomous_system_number).unwrap_or(0);
            match net {
                IpAddr::V4(a) => v4.push((u32::from(a), prefix, asn)),
                IpAddr::V6(a) => v6.push((u128::from(a), prefix, asn)),
            }
            asn != 0
        })?;
        walked.require(
            "an autonomous_system_number",
            "a GeoLite2-ASN or GeoIP2-ISP database",
        )?;
        drop(reader);
        let v6 = Table::new(v6);
        let prefixes = v6.prefixes.iter().copied();
        let aliases = Aliases::skipped(
            walked.ipv6,
            v6.starts.as_slice().iter().copied().zip(prefixes),
        );
        Ok(AsnDb {
            v4: Table::new(v4),
            v6,
            aliases,
            path: path.to_path_buf(),
            networks: walked.networks,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Networks in the database (counted at load).
    pub fn networks(&self) -> usize {
        self.networks
    }

    /// The origin AS of `ip`, and the network (or empty block) it holds over.
    ///
    /// # Hot path
    /// An index read and a binary search in the family's table; no allocation.
    pub fn origin(&self, ip: IpAddr) -> Origin {
        let found = match ip {
            IpAddr::V4(a) => self.v4.get(u32::from(a)).or_else(|| {
                // An IPv6 database whose IPv4 space lies in a network wider than ::/96.
                let o = self.v6.get(u128::from(u32::from(a)))?;
                Some(Origin {
                    prefix_len: o.prefix_len.saturating_sub(96),
                    ..o
                })
            }),
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6.get(a).or_else(|| {
                    // An alias of the IPv4 space: its network counted from the IPv6 root.
                    let (v4, prefix) = self.aliases.v4(a)?;
                    let o = self.v4.get(v4)?;
                    Some(Origin {
                        prefix_len: prefix + o.prefix_len,
                        ..o
                    })
                })
            }
        };
        // Nothing found: an IPv6 address in an IPv4 database.
        found.unwrap_or_default()
    }
}

impl std::fmt::Debug for AsnDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        mmdb::debug(f, "AsnDb", &self.path, self.networks)
    }
}

#[cfg(test)]
mod tests {
    use super::super::wider::Bits;
    use super::*;

    #[test]
    fn the_test_database_gives_origins_and_their_networks() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/geo/GeoLite2-ASN-Test.mmdb");
        let db = AsnDb::open(&path).unwrap();
        let o = db.origin("1.128.0.1".parse().unwrap());
        assert_eq!(
            o,
            Origin {
                asn: Some(1221),
                prefix_len: 11
            }
        );
        let o = db.origin("1.0.0.1".parse().unwrap());
        assert_eq!(
            o,
            Origin {
                asn: Some(15169),
                prefix_len: 24
            }
        );
        assert_eq!(db.origin("127.0.0.1".parse().unwrap()).asn, None);
        // A country database is not an ASN database.
        let geo = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/geo/GeoIP2-Country-Test.mmdb");
        let e = AsnDb::open(&geo).unwrap_err();
        assert!(matches!(e.reason, GeoFault::Lacks { .. }));
        assert!(
            e.reason.to_string().contains("autonomous_system_number"),
            "{e}"
        );
    }

    /// The flat tables against the tree walk: random addresses, the edges of every
    /// network of both tables, and the aliases of the IPv4 space.
    #[test]
    fn flat_tables_agree_with_the_tree() {
        use rand::rngs::SmallRng;
        use rand::SeedableRng;

        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/geo/GeoLite2-ASN-Test.mmdb");
        let db = AsnDb::open(&path).unwrap();
        let reader = maxminddb::Reader::from_source(std::fs::read(&path).unwrap()).unwrap();
        let reference = |ip: IpAddr| {
            let (rec, prefix_len): (Record, u8) = super::super::mmdb::walk(&reader, ip);
            Origin {
                asn: rec.autonomous_system_number.filter(|&a| a != 0),
                prefix_len,
            }
        };
        let mut rng = SmallRng::seed_from_u64(5);
        let mut ips = super::super::mmdb::random_ips(&mut rng);
        for (i, &start) in db.v4.starts.as_slice().iter().enumerate() {
            let last = start.last(db.v4.prefixes[i]);
            ips.extend([start, last, last.wrapping_add(1)].map(|a| IpAddr::V4(a.into())));
        }
        let v6 = db.v6.starts.as_slice().iter().copied();
        let v6 = v6.zip(db.v6.prefixes.iter().copied());
        for (start, p) in v6.chain(db.aliases.as_slice().iter().copied()) {
            let last = start.last(p);
            let mid = start + (last - start) / 3;
            ips.extend([start, mid, last, last.wrapping_add(1)].map(|a| IpAddr::V6(a.into())));
        }
        ips.extend(
            [
                "::ffff:1.128.0.1",
                "::1.0.0.1",
                "2002:0100:0001::1",
                "2001:0:0100:0001::",
                "::",
                "0.0.0.0",
            ]
            .map(|a| a.parse::<IpAddr>().unwrap()),
        );
        let mut with_asn = 0;
        for &ip in &ips {
            let flat = db.origin(ip);
            with_asn += usize::from(flat.asn.is_some());
            assert_eq!(flat, reference(ip), "{ip}");
        }
        assert!(with_asn > 1_000, "only {with_asn} addresses with an AS");
        assert!(
            !db.aliases.as_slice().is_empty(),
            "an IPv6 database has aliases"
        );
    }
}
