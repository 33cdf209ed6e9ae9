//! Input (loading) and data plane (lookup): the AS-number database (`--asn-db`), for
//! `match: [AS13335]`.
//!
//! MaxMind's GeoLite2-ASN format (`autonomous_system_number`). Like the geo database it
//! is read whole into memory and walked at load, so that a corrupt file is refused then
//! and the last good one keeps serving. A lookup is a walk of the search tree; only
//! names whose policy has AS entries pay it (`plan`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use maxminddb::{Reader, WithinOptions};
use serde::Deserialize;

use super::geo::GeoError;

/// A validated, in-memory ASN database.
pub struct AsnDb {
    reader: Reader<Vec<u8>>,
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

impl AsnDb {
    /// Reads and validates a database file. Never used on the query path.
    pub fn open(path: &Path) -> Result<AsnDb, GeoError> {
        let err = |reason: String| GeoError {
            path: path.to_path_buf(),
            reason,
        };
        let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read: {e}")))?;
        let reader = super::tree::open(bytes).map_err(err)?;
        let mut networks = 0usize;
        let mut with_asn = 0usize;
        let iter = reader
            .networks(WithinOptions::default())
            .map_err(|e| err(format!("cannot walk the search tree: {e}")))?;
        for item in iter {
            let item = item.map_err(|e| err(format!("corrupt search tree: {e}")))?;
            let rec: Option<Record> = item
                .decode()
                .map_err(|e| err(format!("corrupt data section: {e}")))?;
            networks += 1;
            with_asn += usize::from(rec.is_some_and(|r| r.autonomous_system_number.is_some()));
        }
        if with_asn == 0 {
            return Err(err(format!(
                "no network carries an autonomous_system_number (database type {:?}): \
                 a GeoLite2-ASN or GeoIP2-ISP database is needed",
                reader.metadata().database_type
            )));
        }
        Ok(AsnDb {
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

    /// The origin AS of `ip`.
    ///
    /// # Hot path
    /// A walk of the search tree and a decode of one number; no allocation.
    pub fn origin(&self, ip: IpAddr) -> Origin {
        let (rec, prefix_len): (Record, u8) = super::geo::walk(&self.reader, ip);
        Origin {
            asn: rec.autonomous_system_number,
            prefix_len,
        }
    }
}

impl std::fmt::Debug for AsnDb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsnDb")
            .field("path", &self.path)
            .field("networks", &self.networks)
            .finish()
    }
}

#[cfg(test)]
mod tests {
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
        assert!(e.reason.contains("autonomous_system_number"), "{e}");
    }
}
