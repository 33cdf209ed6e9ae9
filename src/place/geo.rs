//! Data plane (lookup) and input (loading): the geo database.
//!
//! `GeoDb::open` is called by the control plane only. It reads the whole file into memory
//! (an operator overwriting the file in place cannot corrupt a running server), walks
//! every network of the search tree so that a corrupt database is refused at load time
//! instead of silently answering "not found" later, and detects the schema.
//!
//! `GeoDb::locate` is on the query path. The walk at load also builds flat tables of
//! every network with data, sorted, with a first-level index on the top 16 bits: a
//! lookup is one index read and a binary search over the few networks under that /16,
//! with the place pre-decoded (about a tenth of a tree walk and a record decode).
//! Addresses in no such network (unknown to the database, IPv4-mapped IPv6 aliases) take
//! the tree walk, which also gives the size of the empty block they fall in, and stays
//! the reference: unit tests compare both on every shipped database.
//!
//! Two schemas are understood:
//! - GeoIP2 / GeoLite2 Country and City: `country.iso_code`, `continent.code`;
//! - flat: `country_code` (the NRO database shipped in `geo/`); the continent then comes
//!   from the built-in ISO 3166 table.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use maxminddb::{Reader, WithinOptions};
use serde::Deserialize;

use super::countries::{Continent, Country};

/// Where an address is, as far as steering cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// ISO 3166 country, when the database knows the address.
    pub country: Option<Country>,
    /// From the database when it has one, else derived from the country.
    pub continent: Option<Continent>,
    /// Prefix length of the database network that holds the address: every address in
    /// that network gets the same `Place`, which makes it the natural ECS scope.
    pub prefix_len: u8,
}

/// A validated, in-memory geo database.
pub struct GeoDb {
    reader: Reader<Vec<u8>>,
    v4: Flat<u32>,
    v6: Flat<u128>,
    /// Where it was read from, for messages.
    path: PathBuf,
    /// Number of networks seen while validating, for the startup log.
    networks: usize,
}

#[derive(Debug, thiserror::Error)]
#[error("{path}: {reason}")]
pub struct GeoError {
    pub path: PathBuf,
    pub reason: String,
}

/// Both schemas in one borrowed record: decoding never allocates.
#[derive(Deserialize, Default)]
struct Record<'a> {
    #[serde(borrow, default)]
    country: IsoCode<'a>,
    #[serde(borrow, default)]
    continent: ContinentCode<'a>,
    #[serde(default)]
    country_code: Option<&'a str>,
}

#[derive(Deserialize, Default)]
struct IsoCode<'a> {
    #[serde(default)]
    iso_code: Option<&'a str>,
}

#[derive(Deserialize, Default)]
struct ContinentCode<'a> {
    #[serde(default)]
    code: Option<&'a str>,
}

// === impl GeoDb ===

impl GeoDb {
    /// Reads and validates a database file. Never used on the query path.
    pub fn open(path: &Path) -> Result<GeoDb, GeoError> {
        let err = |reason: String| GeoError {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
        Self::from_bytes(bytes, path).map_err(err)
    }

    /// Validates a database held in memory.
    pub fn from_bytes(bytes: Vec<u8>, path: &Path) -> Result<GeoDb, String> {
        let reader = Reader::from_source(bytes).map_err(|e| format!("not a MaxMind DB: {e}"))?;
        // Walk the whole search tree: a broken tree opens fine and then answers "not
        // found" for everyone, which would silently send all clients to the default.
        let mut networks = 0usize;
        let mut with_country = 0usize;
        let (mut v4, mut v6) = (Flat::builder(), Flat::builder());
        let iter = reader
            .networks(WithinOptions::default())
            .map_err(|e| format!("cannot walk the search tree: {e}"))?;
        for item in iter {
            let item = item.map_err(|e| format!("corrupt search tree: {e}"))?;
            let net = item
                .network()
                .map_err(|e| format!("corrupt search tree: {e}"))?;
            let rec: Option<Record> = item
                .decode()
                .map_err(|e| format!("corrupt data section: {e}"))?;
            networks += 1;
            let place = rec.as_ref().map(place_of).unwrap_or_default();
            if place.country.is_some() {
                with_country += 1;
            }
            let packed = pack(Place {
                prefix_len: net.prefix(),
                ..place
            });
            match net.network() {
                IpAddr::V4(a) => v4.push(u32::from(a), packed),
                IpAddr::V6(a) => v6.push(u128::from(a), packed),
            }
        }
        if with_country == 0 {
            return Err(format!(
                "no network carries a country (database type {:?}): \
                 a GeoIP2/GeoLite2 Country or City database or a flat country_code one is needed",
                reader.metadata().database_type
            ));
        }
        Ok(GeoDb {
            reader,
            v4: v4.build(),
            v6: v6.build(),
            path: path.to_path_buf(),
            networks,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Networks in the database (counted at load).
    pub fn networks(&self) -> usize {
        self.networks
    }

    /// `database_type` from the metadata, e.g. `GeoIP2-Country`.
    pub fn database_type(&self) -> &str {
        &self.reader.metadata().database_type
    }

    /// Locates an address.
    ///
    /// # Hot path
    /// No allocation, no lock, no I/O. An address the database does not know (or an IPv6
    /// address in an IPv4-only database) has no country; its prefix is still that of the
    /// tree node where the search ended, so the answer for it can be cached for the
    /// whole empty block.
    pub fn locate(&self, ip: IpAddr) -> Place {
        let found = match ip {
            IpAddr::V4(a) => self.v4.get(u32::from(a)),
            IpAddr::V6(a) => self.v6.get(u128::from(a)),
        };
        found.unwrap_or_else(|| self.walk(ip))
    }

    /// The reference lookup: a walk of the search tree and a decode of the record.
    fn walk(&self, ip: IpAddr) -> Place {
        let Ok(found) = self.reader.lookup(ip) else {
            return Place::default();
        };
        let prefix_len = found.network().map(|n| n.prefix()).unwrap_or(0);
        let rec: Record = found.decode().ok().flatten().unwrap_or_default();
        Place {
            prefix_len,
            ..place_of(&rec)
        }
    }
}

fn place_of(rec: &Record) -> Place {
    let country = rec
        .country
        .iso_code
        .or(rec.country_code)
        .and_then(Country::from_db);
    let continent = rec
        .continent
        .code
        .and_then(Continent::from_code)
        .or_else(|| country.and_then(Country::continent));
    Place {
        country,
        continent,
        prefix_len: 0,
    }
}

/// A `Place` in 32 bits: country index + 1 (0: none) in 16, continent index + 1 in 8,
/// prefix length in 8.
fn pack(p: Place) -> u32 {
    let country = p.country.map_or(0, |c| c.index() as u32 + 1);
    let continent = p.continent.map_or(0, |c| c.index() as u32 + 1);
    country << 16 | continent << 8 | u32::from(p.prefix_len)
}

fn unpack(v: u32) -> Place {
    let country = (v >> 16) as usize;
    let continent = ((v >> 8) & 0xff) as usize;
    Place {
        country: country.checked_sub(1).and_then(Country::from_index),
        continent: continent.checked_sub(1).and_then(Continent::from_index),
        prefix_len: v as u8,
    }
}

/// Every network with data of one address family, sorted by start, with the packed place.
struct Flat<K> {
    starts: Box<[K]>,
    places: Box<[u32]>,
    /// `index[h]`: the first entry whose start's top 16 bits are `h` or more
    /// (65,537 entries; the last is `starts.len()`).
    index: Box<[u32]>,
}

/// An address as an unsigned integer.
trait Key: Copy + Ord {
    fn top16(self) -> usize;
    /// Whether `self` lies in the network starting at `start` with `prefix` bits.
    fn within(self, start: Self, prefix: u8) -> bool;
}

impl Key for u32 {
    fn top16(self) -> usize {
        (self >> 16) as usize
    }
    fn within(self, start: u32, prefix: u8) -> bool {
        let host = u32::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
        self >= start && self - start <= host
    }
}

impl Key for u128 {
    fn top16(self) -> usize {
        (self >> 112) as usize
    }
    fn within(self, start: u128, prefix: u8) -> bool {
        let host = u128::MAX.checked_shr(u32::from(prefix)).unwrap_or(0);
        self >= start && self - start <= host
    }
}

/// Collects a [`Flat`] table (the tree walk yields networks in address order).
struct FlatBuilder<K> {
    starts: Vec<K>,
    places: Vec<u32>,
}

impl<K: Key> FlatBuilder<K> {
    fn push(&mut self, start: K, place: u32) {
        self.starts.push(start);
        self.places.push(place);
    }

    fn build(mut self) -> Flat<K> {
        if !self.starts.is_sorted() {
            let mut entries: Vec<(K, u32)> = self.starts.into_iter().zip(self.places).collect();
            entries.sort_unstable_by_key(|e| e.0);
            (self.starts, self.places) = entries.into_iter().unzip();
        }
        Flat::new(
            self.starts.into_boxed_slice(),
            self.places.into_boxed_slice(),
        )
    }
}

impl<K: Key> Flat<K> {
    fn builder() -> FlatBuilder<K> {
        FlatBuilder {
            starts: Vec::new(),
            places: Vec::new(),
        }
    }

    fn new(starts: Box<[K]>, places: Box<[u32]>) -> Flat<K> {
        let index = (0..=1usize << 16)
            .map(|h| starts.partition_point(|s| s.top16() < h) as u32)
            .collect();
        Flat {
            starts,
            places,
            index,
        }
    }

    /// The place of `ip`, if a network of this table holds it.
    ///
    /// # Hot path
    /// One index read and a binary search among the networks starting under the same
    /// /16 (plus the one before, which may extend into it).
    fn get(&self, ip: K) -> Option<Place> {
        let h = ip.top16();
        let lo = (self.index[h] as usize).saturating_sub(1);
        let hi = self.index[h + 1] as usize;
        let slice = self.starts.get(lo..hi)?;
        let i = lo + slice.partition_point(|s| *s <= ip).checked_sub(1)?;
        let place = self.places[i];
        ip.within(self.starts[i], place as u8)
            .then(|| unpack(place))
    }
}

impl std::fmt::Debug for GeoDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeoDb")
            .field("path", &self.path)
            .field("networks", &self.networks)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{RngExt, SeedableRng};
    use std::net::{Ipv4Addr, Ipv6Addr};

    /// The flat tables against the tree walk, on random addresses and on the edges of
    /// every network, for each database the project ships or tests with.
    #[test]
    fn flat_tables_agree_with_the_tree() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut rng = SmallRng::seed_from_u64(3);
        for db in [
            "geo/country.mmdb",
            "tests/fixtures/geo/GeoIP2-Country-Test.mmdb",
            "tests/fixtures/geo/GeoIP2-City-Test.mmdb",
            "tests/fixtures/geo/GeoLite2-Country-Test.mmdb",
            "../shared/geo/GeoIP2-Country-bench.mmdb",
        ] {
            let path = root.join(db);
            if !path.exists() {
                assert!(db.starts_with("../"), "{db} missing");
                continue;
            }
            let geo = GeoDb::open(&path).unwrap();
            let mut ips: Vec<IpAddr> = (0..20_000)
                .map(|_| IpAddr::V4(Ipv4Addr::from(rng.random::<u32>())))
                .collect();
            ips.extend((0..20_000).map(|_| {
                // Mostly global unicast, where the data is.
                let a = rng.random::<u128>() >> 3 | 0x2000 << 112;
                IpAddr::V6(Ipv6Addr::from(a))
            }));
            for (i, start) in geo.v4.starts.iter().enumerate() {
                let p = geo.v4.places[i] as u8;
                let last = start | u32::MAX.checked_shr(u32::from(p)).unwrap_or(0);
                ips.extend([*start, last, last.wrapping_add(1)].map(|a| IpAddr::V4(a.into())));
            }
            for (i, start) in geo.v6.starts.iter().enumerate().step_by(7) {
                let p = geo.v6.places[i] as u8;
                let last = start | u128::MAX.checked_shr(u32::from(p)).unwrap_or(0);
                ips.extend([*start, last, last.wrapping_add(1)].map(|a| IpAddr::V6(a.into())));
            }
            ips.extend(
                [
                    "127.0.0.1",
                    "::1",
                    "::ffff:81.2.69.160",
                    "::81.2.69.160",
                    "0.0.0.0",
                    "::",
                ]
                .map(|a| a.parse::<IpAddr>().unwrap()),
            );
            for &ip in &ips {
                assert_eq!(geo.locate(ip), geo.walk(ip), "{db}: {ip}");
            }
            // Every network's first address is answered by the tables, not the walk.
            assert!(!geo.v4.starts.is_empty(), "{db}: no IPv4 table");
            assert!(geo.v4.starts.iter().all(|&a| geo.v4.get(a).is_some()));
            assert!(geo.v6.starts.iter().all(|&a| geo.v6.get(a).is_some()));
        }
    }
}
