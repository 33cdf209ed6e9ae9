//! Data plane (lookup) and input (loading): the geo database.
//!
//! `GeoDb::open` is called by the control plane only. It reads the whole file into memory
//! (an operator overwriting the file in place cannot corrupt a running server), walks
//! every network of the search tree so that a corrupt database is refused at load time
//! instead of silently answering "not found" later, and detects the schema.
//!
//! `GeoDb::locate` is on the query path: one tree walk and a borrowed decode, no
//! allocation.
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
        let iter = reader
            .networks(WithinOptions::default())
            .map_err(|e| format!("cannot walk the search tree: {e}"))?;
        for item in iter {
            let item = item.map_err(|e| format!("corrupt search tree: {e}"))?;
            networks += 1;
            let rec: Option<Record> = item
                .decode()
                .map_err(|e| format!("corrupt data section: {e}"))?;
            if rec.is_some_and(|r| r.country.iso_code.or(r.country_code).is_some()) {
                with_country += 1;
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
        let Ok(found) = self.reader.lookup(ip) else {
            return Place::default();
        };
        let prefix_len = found.network().map(|n| n.prefix()).unwrap_or(0);
        let rec: Record = found.decode().ok().flatten().unwrap_or_default();
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
            prefix_len,
        }
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
