//! Data plane (lookup) and input (loading): the geo database.
//!
//! `GeoDb::open` is called by the control plane only. It reads the whole file into memory
//! (an operator overwriting the file in place cannot corrupt a running server), walks
//! every network of the search tree so that a corrupt database is refused at load time
//! instead of silently answering "not found" later (both through [`super::mmdb`], as the
//! ASN database), and detects the schema.
//!
//! `GeoDb::locate` is on the query path. The walk at load also builds flat tables of
//! every network of the tree (with data, and the empty ones between them), sorted,
//! with a first-level index on the top 16 bits: a lookup is one index read and a
//! binary search over the few networks under that /16, with the place pre-decoded
//! (about a tenth of a tree walk and a record decode). Addresses in no such network
//! (the IPv4 aliases in IPv6, or IPv6 in an IPv4 database) take the tree walk, which
//! stays the reference: unit tests compare both on every shipped database.
//!
//! Each network also gets where its steps up the tree start ([`super::wider`]), so
//! that `GeoDb::widest` can tell how far an answer reaches.
//!
//! Two schemas are understood:
//! - GeoIP2 / GeoLite2 Country and City: `country.iso_code`, `continent.code`;
//! - flat: `country_code` (the NRO database shipped in `geo/`); the continent then comes
//!   from the built-in ISO 3166 table.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::asn::{AsnDb, Origin};
use super::countries::{Continent, Country};
use super::flat::{Aliases, Key, Starts};
use super::mmdb::{self, GeoError, GeoFault};
use super::wider::{self, Around, Places, Start};

/// Where an address is, as far as steering cares.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Place {
    /// ISO 3166 country, when the database knows the address.
    pub country: Option<Country>,
    /// From the database when it has one, else derived from the country.
    pub continent: Option<Continent>,
    /// Prefix length of the database network that holds the address: every address in
    /// that network gets the same `Place`, the narrowest ECS scope an answer needs.
    pub prefix_len: u8,
    /// Where the steps up the tree from that network start ([`GeoDb::widest`]).
    pub start: Start,
    /// The origin AS, for names whose policy has AS entries ([`GeoDb::origin`]).
    pub origin: Origin,
}

/// A validated, in-memory geo database: its flat tables (the file itself is not kept).
pub struct GeoDb {
    v4: Flat<u32>,
    /// IPv6 networks of up to 64 bits (nearly all), by their first 64 bits: half the
    /// memory of full addresses. Its `around` is the family's.
    v6: Flat<u64>,
    /// IPv6 networks longer than /64, whose `/64` the first table then does not cover.
    v6_long: Flat<u128>,
    /// The blocks of an IPv6 database that its walk skips: aliases of the IPv4 space
    /// (`::ffff:0:0/96`, `2002::/16`, ...), each with its prefix; an address there is
    /// located by the IPv4 address in the 32 bits past the prefix.
    aliases: Aliases,
    /// `database_type` from the metadata.
    database_type: String,
    /// Every distinct place, by index.
    index: Index,
    /// The same places packed ([`pack`], prefix 0), for the narrow tables ([`Packed`]).
    packed: Box<[u32]>,
    /// The AS-number database, for policies that match AS numbers.
    asn: Option<AsnDb>,
    /// Where it was read from, for messages.
    path: PathBuf,
    /// Number of networks seen while validating, for the startup log.
    networks: usize,
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

/// The distinct places of a database, each with its index (the indexes of
/// [`Places`]; past the first 511, [`wider::OTHER`], which no answer allows).
#[derive(Debug, Default)]
struct Index {
    places: Vec<Place>,
    by_place: HashMap<(Option<Country>, Option<Continent>), u16>,
}

impl Index {
    /// The index of a place, given one if it has none yet.
    fn of(&mut self, p: &Place) -> u16 {
        let key = (p.country, p.continent);
        if let Some(&i) = self.by_place.get(&key) {
            return i;
        }
        if self.places.len() >= usize::from(wider::OTHER) {
            return wider::OTHER;
        }
        let i = self.places.len() as u16;
        self.places.push(Place {
            country: p.country,
            continent: p.continent,
            ..Place::default()
        });
        self.by_place.insert(key, i);
        i
    }

    /// Every place with an index, in index order.
    fn places(&self) -> &[Place] {
        &self.places
    }
}

// === impl GeoDb ===

impl GeoDb {
    /// Reads and validates a database file. Never used on the query path.
    pub fn open(path: &Path) -> Result<GeoDb, GeoError> {
        mmdb::read(path, |bytes| Self::from_bytes(bytes, path))
    }

    /// Validates a database held in memory.
    pub fn from_bytes(bytes: Vec<u8>, path: &Path) -> Result<GeoDb, GeoFault> {
        let reader = mmdb::open(bytes)?;
        let (mut v4, mut v6) = (Columns::default(), Columns::default());
        let mut index = Index::default();
        // The empty networks too: unknown addresses are a place of their own, and the
        // tables then describe the whole tree (but for the IPv4 aliases in IPv6).
        let walked = mmdb::each_network(&reader, |net, prefix_len, rec: Option<Record>| {
            let place = rec.as_ref().map(place_of).unwrap_or_default();
            let i = index.of(&place);
            let place = Place {
                prefix_len,
                ..place
            };
            match net {
                IpAddr::V4(a) => v4.push(u32::from(a), place, i),
                IpAddr::V6(a) => v6.push(u128::from(a), place, i),
            }
            place.country.is_some()
        })?;
        walked.require(
            "a country",
            "a GeoIP2/GeoLite2 Country or City database or a flat country_code one",
        )?;
        // The file's bytes go now: the tables below are all a lookup needs.
        drop(reader);
        let v4 = v4.sorted();
        let (around, up) = v4.widen();
        let places = index.places().len();
        let v4 = Flat::new(
            v4.starts,
            Packed::new(v4.places, &v4.index, places),
            up,
            around,
        );
        let v6 = v6.sorted();
        let prefixes = v6.places.iter().map(|&p| p as u8);
        let aliases = Aliases::skipped(walked.ipv6, v6.starts.iter().copied().zip(prefixes));
        let (around, up) = v6.widen();
        let (v6, v6_long) = v6.split(up, around, places);
        Ok(GeoDb {
            v4,
            v6,
            v6_long,
            aliases,
            database_type: walked.database_type,
            packed: index.places().iter().map(|&p| pack(p)).collect(),
            index,
            asn: None,
            path: path.to_path_buf(),
            networks: walked.networks,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This database with an ASN database attached: every lookup then also gives the
    /// client's origin AS.
    pub fn with_asn(self, asn: AsnDb) -> GeoDb {
        GeoDb {
            asn: Some(asn),
            ..self
        }
    }

    /// The ASN database attached, if any.
    pub fn asn(&self) -> Option<&AsnDb> {
        self.asn.as_ref()
    }

    /// Networks in the database (counted at load).
    pub fn networks(&self) -> usize {
        self.networks
    }

    /// Every distinct place of the database, by index (the indexes of
    /// [`GeoDb::widest`]'s `allowed`).
    pub fn places(&self) -> &[Place] {
        self.index.places()
    }

    /// The widest prefix around `ip`, located at `place`, whose every address is at one
    /// of the places `allowed` (which must hold `place`'s own). Never narrower than
    /// the network that holds `ip`.
    ///
    /// # Hot path
    /// A set test per step up the search tree; no allocation.
    pub fn widest(&self, ip: IpAddr, place: &Place, allowed: &Places) -> u8 {
        let around = match ip {
            IpAddr::V4(_) => &self.v4.around,
            IpAddr::V6(_) => &self.v6.around,
        };
        around.widest(place.prefix_len, place.start, allowed)
    }

    /// Every network of the database (start address and place, its prefix length
    /// set), as the walk at load laid them out in the flat tables: IPv4, then IPv6 up
    /// to /64, then longer IPv6; empty networks included (no country), the aliases of
    /// the IPv4 space in an IPv6 database left out (their IPv4 networks come once).
    /// Not for the query path: `steerdns diff` asks a question of every network.
    pub fn each_network(&self) -> impl Iterator<Item = (IpAddr, Place)> + '_ {
        let packed = &self.packed[..];
        let v4 = self.v4.starts.as_slice().iter().enumerate().map(|(i, &s)| {
            let ip = IpAddr::V4(std::net::Ipv4Addr::from(s));
            (ip, self.v4.places.place(i, packed))
        });
        let v6 = self.v6.starts.as_slice().iter().enumerate().map(|(i, &s)| {
            let ip = IpAddr::V6(std::net::Ipv6Addr::from(u128::from(s) << 64));
            (ip, self.v6.places.place(i, packed))
        });
        let v6_long = self.v6_long.starts.as_slice().iter().enumerate();
        let v6_long = v6_long.map(|(i, &s)| {
            let ip = IpAddr::V6(std::net::Ipv6Addr::from(s));
            (ip, self.v6_long.places.place(i, packed))
        });
        v4.chain(v6).chain(v6_long)
    }

    /// `database_type` from the metadata, e.g. `GeoIP2-Country`.
    pub fn database_type(&self) -> &str {
        &self.database_type
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
            IpAddr::V4(a) => self.v4.get(u32::from(a), &self.packed).or_else(|| {
                // An IPv6 database whose IPv4 space lies in a network wider than ::/96.
                let p = self.get6(u128::from(u32::from(a)))?;
                Some(Place {
                    prefix_len: p.prefix_len.saturating_sub(96),
                    start: Start::default(),
                    ..p
                })
            }),
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.get6(a).or_else(|| self.aliased(a))
            }
        };
        // Nothing found: an IPv6 address in an IPv4 database.
        found.unwrap_or_default()
    }

    /// The origin AS of `ip` (nothing without an ASN database). Only names whose
    /// policy has AS entries ask ([`crate::plan`]).
    ///
    /// # Hot path
    /// A walk of the ASN database's search tree; no allocation.
    pub fn origin(&self, ip: IpAddr) -> Origin {
        self.asn
            .as_ref()
            .map_or_else(Origin::default, |a| a.origin(ip))
    }

    /// An IPv6 address in the tables.
    ///
    /// # Hot path
    /// The table of networks up to /64, then the other.
    fn get6(&self, a: u128) -> Option<Place> {
        self.v6
            .get((a >> 64) as u64, &self.packed)
            .or_else(|| self.v6_long.get(a, &self.packed))
    }

    /// An IPv6 address in an alias of the IPv4 space: located as the IPv4 address past
    /// the alias's prefix, its network counted from the IPv6 root, with no widening
    /// (the tables describe the IPv4 space once, at `::/96`).
    fn aliased(&self, a: u128) -> Option<Place> {
        let (v4, prefix) = self.aliases.v4(a)?;
        let p = self.v4.get(v4, &self.packed)?;
        Some(Place {
            prefix_len: prefix + p.prefix_len,
            start: Start::default(),
            ..p
        })
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
        ..Place::default()
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
        ..Place::default()
    }
}

/// The places of a table's networks, packed. In 16 bits each, the place's index in
/// [`Index`] (9 bits) and the prefix length (7), when every place has an index
/// of its own (fewer than 512 places: the shipped databases have 251) and every prefix
/// is below 128 (the IPv4 table and the IPv6 one up to /64): half the memory of
/// [`pack`]'s 32 bits, 2.8 MB of the shipped database at rest. Else in 32.
enum Packed {
    Narrow(Box<[u16]>),
    Wide(Box<[u32]>),
}

impl Packed {
    /// `packed` ([`pack`]), narrowed when every network's place index (`index`, the
    /// same length) is below `places`, the number of indexed places.
    fn new(packed: Vec<u32>, index: &[u16], places: usize) -> Packed {
        let fits = |(&p, &i): (&u32, &u16)| (p as u8) < 0x80 && usize::from(i) < places;
        if places > 1 << 9 || index.len() != packed.len() || !packed.iter().zip(index).all(fits) {
            return Packed::Wide(packed.into_boxed_slice());
        }
        Packed::Narrow(
            packed
                .iter()
                .zip(index)
                .map(|(&p, &i)| i << 7 | u16::from(p as u8))
                .collect(),
        )
    }

    /// The prefix length of network `i`.
    ///
    /// # Hot path
    /// A read and a mask.
    fn prefix(&self, i: usize) -> u8 {
        match self {
            Packed::Narrow(v) => (v[i] & 0x7f) as u8,
            Packed::Wide(v) => v[i] as u8,
        }
    }

    /// The place of network `i` (without its steps), given the places by index,
    /// packed with prefix 0.
    ///
    /// # Hot path
    /// A read from `table` and [`unpack`].
    fn place(&self, i: usize, table: &[u32]) -> Place {
        let packed = match self {
            Packed::Narrow(v) => {
                let place = table.get(usize::from(v[i] >> 7)).copied().unwrap_or(0);
                place | u32::from(v[i] & 0x7f)
            }
            Packed::Wide(v) => v[i],
        };
        unpack(packed)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        match self {
            Packed::Narrow(v) => v.len(),
            Packed::Wide(v) => v.len(),
        }
    }
}

/// Every network of the tree (with data or empty) of one address family, sorted by
/// start, with the packed place, and the steps up from each.
struct Flat<K> {
    starts: Starts<K>,
    places: Packed,
    /// Where the steps up start, per network.
    starts_up: Box<[Start]>,
    around: Around,
}

/// The networks of one family as the tree walk yields them, in columns (the tables'
/// own, so that loading holds no copy of them).
struct Columns<K, I = u16> {
    starts: Vec<K>,
    /// Packed places ([`pack`]).
    places: Vec<u32>,
    /// Place indexes ([`Index`]), or what else goes with each network.
    index: Vec<I>,
}

impl<K, I> Default for Columns<K, I> {
    fn default() -> Self {
        Columns {
            starts: Vec::new(),
            places: Vec::new(),
            index: Vec::new(),
        }
    }
}

impl<K: Key> Columns<K> {
    fn push(&mut self, start: K, place: Place, index: u16) {
        self.starts.push(start);
        self.places.push(pack(place));
        self.index.push(index);
    }

    /// Sorted by start (a sound tree's walk yields them so already).
    fn sorted(self) -> Columns<K> {
        if self.starts.is_sorted() {
            return self;
        }
        let mut order: Vec<usize> = (0..self.starts.len()).collect();
        order.sort_unstable_by_key(|&i| self.starts[i]);
        Columns {
            starts: order.iter().map(|&i| self.starts[i]).collect(),
            places: order.iter().map(|&i| self.places[i]).collect(),
            index: order.iter().map(|&i| self.index[i]).collect(),
        }
    }

    /// The steps up from every network ([`wider::build`]).
    fn widen(&self) -> (Around, Vec<Start>) {
        wider::build(self.starts.len(), |i| {
            (self.starts[i], self.places[i] as u8, self.index[i])
        })
    }
}

impl Columns<u128> {
    /// The IPv6 tables, given the steps up from every network: networks up to /64 by
    /// their first 64 bits, and the others (the steps in the first).
    fn split(self, up: Vec<Start>, around: Around, places: usize) -> (Flat<u64>, Flat<u128>) {
        let mut short = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut long = Columns::default();
        for (i, (&start, &place)) in self.starts.iter().zip(&self.places).enumerate() {
            if place as u8 <= 64 {
                short.0.push((start >> 64) as u64);
                short.1.push(place);
                short.2.push(up[i]);
                short.3.push(self.index[i]);
            } else {
                long.starts.push(start);
                long.places.push(place);
                long.index.push(i);
            }
        }
        let long_up = long.index.iter().map(|&i| up[i]).collect();
        drop(up);
        let short_places = Packed::new(short.1, &short.3, places);
        (
            Flat::new(short.0, short_places, short.2, around),
            Flat::new(
                long.starts,
                Packed::Wide(long.places.into_boxed_slice()),
                long_up,
                Around::default(),
            ),
        )
    }
}

impl<K: Key> Flat<K> {
    /// A table from its columns, sorted by start.
    fn new(starts: Vec<K>, places: Packed, up: Vec<Start>, around: Around) -> Flat<K> {
        Flat {
            starts: Starts::new(starts),
            places,
            starts_up: up.into_boxed_slice(),
            around,
        }
    }

    /// The place of `ip`, if a network of this table holds it; `table` is the
    /// database's places by index, packed ([`GeoDb::packed`]).
    ///
    /// # Hot path
    /// [`Starts::find`] and an unpacking of the place; no allocation.
    fn get(&self, ip: K, table: &[u32]) -> Option<Place> {
        let i = self.starts.find(ip, |i| self.places.prefix(i))?;
        Some(Place {
            start: self.starts_up[i],
            ..self.places.place(i, table)
        })
    }
}

impl std::fmt::Debug for GeoDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        mmdb::debug(f, "GeoDb", &self.path, self.networks)
    }
}

#[cfg(test)]
mod tests {
    use super::super::mmdb::{random_ips, walk};
    use super::*;
    use maxminddb::Reader;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    #[test]
    fn a_place_keeps_its_index() {
        let mut index = Index::default();
        let gb = Place {
            country: Country::parse("GB"),
            prefix_len: 24,
            ..Place::default()
        };
        assert_eq!(index.of(&gb), 0);
        assert_eq!(index.of(&Place::default()), 1);
        assert_eq!(
            index.of(&Place {
                prefix_len: 8,
                ..gb
            }),
            0
        );
        assert_eq!(index.places().len(), 2);
        assert_eq!(index.places()[0].prefix_len, 0);
    }

    /// The 16-bit places unpack as the 32-bit ones do, and a table that does not fit
    /// them keeps 32 bits.
    #[test]
    fn narrow_places_unpack_as_wide_ones() {
        let mut index = Index::default();
        let places: Vec<Place> = [("GB", "EU", 24), ("US", "NA", 16), ("JP", "AS", 64)]
            .iter()
            .map(|&(c, k, prefix_len)| Place {
                country: Country::from_db(c),
                continent: Continent::from_code(k),
                prefix_len,
                ..Place::default()
            })
            .chain([Place {
                prefix_len: 8,
                ..Place::default()
            }])
            .collect();
        let ids: Vec<u16> = places.iter().map(|p| index.of(p)).collect();
        let packed: Vec<u32> = places.iter().map(|&p| pack(p)).collect();
        let table: Vec<u32> = index.places().iter().map(|&p| pack(p)).collect();
        let narrow = Packed::new(packed.clone(), &ids, table.len());
        assert!(matches!(narrow, Packed::Narrow(_)));
        let wide = Packed::Wide(packed.clone().into_boxed_slice());
        for (i, p) in places.iter().enumerate() {
            assert_eq!(narrow.place(i, &table), *p);
            assert_eq!(wide.place(i, &table), *p);
            assert_eq!(narrow.prefix(i), p.prefix_len);
        }
        // A place beyond the indexed ones, or a prefix past 127: 32 bits.
        let beyond = Packed::new(packed.clone(), &[0, 1, 2, 3], 3);
        assert!(matches!(beyond, Packed::Wide(_)));
        let mut long = packed;
        long[0] = pack(Place {
            prefix_len: 128,
            ..places[0]
        });
        assert!(matches!(
            Packed::new(long, &ids, table.len()),
            Packed::Wide(_)
        ));
    }

    /// `each_network` lists the IPv4 space once, whole and without overlap, and each
    /// network where `locate` finds it.
    #[test]
    fn each_network_covers_the_ipv4_space_once_and_locates_as_a_query_does() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for db in [
            "geo/country.mmdb",
            "tests/fixtures/geo/GeoIP2-Country-Test.mmdb",
        ] {
            let geo = GeoDb::open(&root.join(db)).unwrap();
            let (mut v4, mut next, mut v6) = (0u64, 0u64, 0usize);
            for (ip, place) in geo.each_network() {
                let located = Place {
                    start: Start::default(),
                    ..geo.locate(ip)
                };
                assert_eq!(located, place, "{db}: {ip}");
                match ip {
                    IpAddr::V4(a) => {
                        assert_eq!(u64::from(u32::from(a)), next, "{db}: {ip} gap or overlap");
                        next += 1 << (32 - place.prefix_len);
                        v4 += 1;
                    }
                    IpAddr::V6(_) => v6 += 1,
                }
            }
            assert_eq!(next, 1 << 32, "{db}");
            assert!(v4 > 0 && v6 > 0, "{db}: {v4} {v6}");
        }
    }

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
            let reader = Reader::from_source(std::fs::read(&path).unwrap()).unwrap();
            let reference = |ip: IpAddr| {
                let (rec, prefix_len): (Record, u8) = walk(&reader, ip);
                Place {
                    prefix_len,
                    ..place_of(&rec)
                }
            };
            let mut ips = random_ips(&mut rng);
            for (i, start) in geo.v4.starts.as_slice().iter().enumerate() {
                let p = geo.v4.places.prefix(i);
                let last = start | u32::MAX.checked_shr(u32::from(p)).unwrap_or(0);
                ips.extend([*start, last, last.wrapping_add(1)].map(|a| IpAddr::V4(a.into())));
            }
            // Both IPv6 tables, and the aliases of the IPv4 space the walk skipped.
            let short = geo
                .v6
                .starts
                .as_slice()
                .iter()
                .map(|&s| u128::from(s) << 64);
            let long = geo.v6_long.starts.as_slice().iter().copied();
            let places = (0..geo.v6.places.len())
                .map(|i| geo.v6.places.prefix(i))
                .chain((0..geo.v6_long.places.len()).map(|i| geo.v6_long.places.prefix(i)));
            let aliases = geo
                .aliases
                .as_slice()
                .iter()
                .map(|&(s, p)| (s, u32::from(p)));
            let v6 = short.chain(long).zip(places.map(u32::from));
            for (start, p) in v6.step_by(7).chain(aliases) {
                let last = start | u128::MAX.checked_shr(p).unwrap_or(0);
                let mid = start + (last - start) / 3;
                ips.extend([start, mid, last, last.wrapping_add(1)].map(|a| IpAddr::V6(a.into())));
            }
            ips.extend(
                [
                    "127.0.0.1",
                    "::1",
                    "::ffff:81.2.69.160",
                    "::81.2.69.160",
                    "2002:5102:45a0::1",
                    "2001:0:5102:45a0::",
                    "0.0.0.0",
                    "::",
                ]
                .map(|a| a.parse::<IpAddr>().unwrap()),
            );
            for &ip in &ips {
                let flat = Place {
                    start: Start::default(),
                    ..geo.locate(ip)
                };
                assert_eq!(flat, reference(ip), "{db}: {ip}");
            }
            // Every network's first address is answered by the tables, not the walk.
            assert!(!geo.v4.starts.as_slice().is_empty(), "{db}: no IPv4 table");
            let v4 = geo.v4.starts.as_slice();
            let table = &geo.packed;
            assert!(v4.iter().all(|&a| geo.v4.get(a, table).is_some()));
            assert!(geo
                .v6
                .starts
                .as_slice()
                .iter()
                .all(|&a| geo.v6.get(a, table).is_some()));
            let long = geo.v6_long.starts.as_slice();
            assert!(long.iter().all(|&a| geo.v6_long.get(a, table).is_some()));
            // The shipped databases have few places: their tables are the narrow ones.
            assert!(matches!(geo.v4.places, Packed::Narrow(_)), "{db}");
            assert!(matches!(geo.v6.places, Packed::Narrow(_)), "{db}");
        }
    }
}
