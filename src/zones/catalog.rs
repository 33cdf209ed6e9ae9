//! Input: the zones served (`Zones`, `Zone`: the catalog of records), read from
//! `zones/` and checked (`check_text`).
//! (The main room of its folder; the folder's door, `mod.rs`, says what else lives there.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use hickory_proto::rr::{LowerName, Name, RecordSet, RecordType, RrKey};
use hickory_proto::serialize::txt::Parser;
use hickory_server::dnssec::NxProofKind;
use hickory_server::net::runtime::TokioRuntimeProvider;
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};

use crate::error::{ConfigIssue, Issues};

/// All served zones: the hickory `Catalog` that answers for them, and what our checks
/// need to know about their names.
pub struct Zones {
    pub(super) zones: Vec<Zone>,
    pub(super) catalog: Arc<Catalog>,
}

/// What one zone holds, by name and type (the records themselves live in the Catalog).
pub struct Zone {
    pub(super) origin: Name,
    pub(super) file: PathBuf,
    pub(super) names: BTreeSet<(LowerName, RecordType)>,
    /// The records as loaded, for signing (`crate::dnssec`).
    pub(super) records: BTreeMap<RrKey, RecordSet>,
    /// The zone unsigned, as the Catalog serves it.
    pub(super) handler: Arc<InMemoryZoneHandler<TokioRuntimeProvider>>,
}

impl Zones {
    /// Loads every zone file in `dir` (hidden files and `README*`/`*.md` are skipped).
    /// A file's origin is its `$ORIGIN` or SOA owner, else its name without `.zone`.
    pub fn load(dir: &Path) -> Result<(Zones, Issues), Issues> {
        let mut issues = Issues::default();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                return Err(Issues(vec![ConfigIssue::error(
                    dir,
                    None,
                    "",
                    format!("cannot read the zone directory: {e}"),
                )]))
            }
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_file() && is_zone_file(p))
            .collect();
        files.sort();

        let mut zones: Vec<Zone> = Vec::new();
        let mut catalog = Catalog::new();
        for file in files {
            match load_file(&file) {
                Ok((zone, handler, warnings)) => {
                    issues.extend(warnings);
                    if let Some(other) = zones.iter().find(|z| z.origin == zone.origin) {
                        issues.push(ConfigIssue::error(
                            &file,
                            None,
                            "",
                            format!(
                                "zone {} is already loaded from {}",
                                zone.origin,
                                other.file.display()
                            ),
                        ));
                        continue;
                    }
                    catalog.upsert(LowerName::new(&zone.origin), vec![handler]);
                    zones.push(zone);
                }
                Err(e) => issues.extend(e),
            }
        }
        if zones.is_empty() && !issues.has_errors() {
            issues.push(ConfigIssue::error(
                dir,
                None,
                "",
                "no zone file: steerdns needs the zone that holds the steered names (SOA, NS)",
            ));
        }
        if issues.has_errors() {
            return Err(issues);
        }
        Ok((
            Zones {
                zones,
                catalog: Arc::new(catalog),
            },
            issues,
        ))
    }

    /// The Catalog that answers non-steered names.
    pub fn catalog(&self) -> &Arc<Catalog> {
        &self.catalog
    }

    /// A Catalog of the same zones, each served by `replace`'s handler when it gives
    /// one (a signed copy), else as loaded.
    pub fn catalog_with(
        &self,
        mut replace: impl FnMut(&Zone) -> Option<Arc<dyn ZoneHandler>>,
    ) -> Catalog {
        let mut catalog = Catalog::new();
        for z in &self.zones {
            let handler = replace(z).unwrap_or_else(|| z.handler.clone());
            catalog.upsert(LowerName::new(&z.origin), vec![handler]);
        }
        catalog
    }

    pub fn zones(&self) -> &[Zone] {
        &self.zones
    }

    pub fn origins(&self) -> impl Iterator<Item = &Name> {
        self.zones.iter().map(|z| &z.origin)
    }

    /// The most specific zone that contains `name`.
    pub fn zone_of(&self, name: &Name) -> Option<&Zone> {
        self.zones
            .iter()
            .filter(|z| z.origin.zone_of(name))
            .max_by_key(|z| z.origin.num_labels())
    }
}

impl Zone {
    pub fn origin(&self) -> &Name {
        &self.origin
    }

    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The records as loaded.
    pub fn records(&self) -> &BTreeMap<RrKey, RecordSet> {
        &self.records
    }

    /// A zone handler serving `records` (a signed copy of this zone), with NSEC denials.
    pub fn handler_of(&self, records: BTreeMap<RrKey, Arc<RecordSet>>) -> Arc<dyn ZoneHandler> {
        let mut h = InMemoryZoneHandler::<TokioRuntimeProvider>::empty(
            self.origin.clone(),
            ZoneType::Primary,
            AxfrPolicy::Deny,
            Some(NxProofKind::Nsec),
        );
        *h.records_get_mut() = records;
        Arc::new(h)
    }

    /// Record types present at `name`.
    pub fn types_at(&self, name: &Name) -> Vec<String> {
        let lower = LowerName::new(name);
        self.names
            .iter()
            .filter(|(n, _)| *n == lower)
            .map(|(_, t)| t.to_string())
            .collect()
    }

    /// A zone cut (NS below the apex) at or above `name`, if any.
    pub fn delegation_above(&self, name: &Name) -> Option<Name> {
        let mut n = name.clone();
        while n.num_labels() > self.origin.num_labels() {
            if self.names.contains(&(LowerName::new(&n), RecordType::NS)) {
                return Some(n);
            }
            n = n.base_name();
        }
        None
    }
}

pub(super) fn is_zone_file(p: &Path) -> bool {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    !(name.starts_with('.')
        || name.starts_with("README")
        || name.ends_with(".md")
        || name.ends_with('~'))
}

pub(super) type Loaded = (Zone, Arc<dyn ZoneHandler>, Issues);

pub(super) fn load_file(file: &Path) -> Result<Loaded, Issues> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        Issues(vec![ConfigIssue::error(
            file,
            None,
            "",
            format!("cannot read: {e}"),
        )])
    })?;
    load_text(file, &text)
}

/// Parses and checks zone text as if read from `file` (which names the default origin
/// and appears in messages), without reading the disk; for the fuzzer. On success, the
/// warnings. (An absolute `$INCLUDE` in the text is still read by hickory's parser.)
pub fn check_text(file: &Path, text: &str) -> Result<Issues, Issues> {
    load_text(file, text).map(|(_, _, warnings)| warnings)
}

pub(super) fn load_text(file: &Path, text: &str) -> Result<Loaded, Issues> {
    let err = |line: Option<usize>, field: &str, msg: String| {
        Issues(vec![ConfigIssue::error(file, line, field, msg)])
    };

    let stem = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let stem = stem.strip_suffix(".zone").unwrap_or(stem);
    let default_origin = Name::from_str(stem).ok().map(|mut n| {
        n.set_fqdn(true);
        n
    });

    let parse = |t: &str| Parser::new(t, Some(file.to_path_buf()), default_origin.clone()).parse();
    let (origin, records) = match parse(text) {
        Ok(v) => v,
        Err(e) => {
            let line = failing_line(text, &parse);
            return Err(err(line, "", format!("zone file syntax: {e}")));
        }
    };
    let origin = origin.to_lowercase();
    let mut issues = Issues::default();
    let mut error =
        |field: String, msg: String| issues.push(ConfigIssue::error(file, None, field, msg));

    let has = |n: &Name, t: RecordType| records.contains_key(&RrKey::new(LowerName::new(n), t));
    if !has(&origin, RecordType::SOA) {
        error(origin.to_string(), "no SOA record at the zone apex".into());
    }
    if !has(&origin, RecordType::NS) {
        error(
            origin.to_string(),
            "no NS records at the zone apex: resolvers need them to find this server".into(),
        );
    }
    let mut names = BTreeSet::new();
    let mut per_name: BTreeMap<LowerName, Vec<RecordType>> = BTreeMap::new();
    for (key, rrset) in &records {
        let owner = Name::from(key.name.clone());
        if !origin.zone_of(&owner) {
            error(
                owner.to_string(),
                format!("{} is outside the zone {origin}", rrset.record_type()),
            );
        }
        names.insert((key.name.clone(), key.record_type));
        per_name
            .entry(key.name.clone())
            .or_default()
            .push(key.record_type);
    }
    for (name, types) in &per_name {
        if types.contains(&RecordType::CNAME) && types.len() > 1 {
            error(
                name.to_string(),
                "a CNAME must be alone at its name (RFC 1034 §3.6.2)".into(),
            );
        }
    }
    let glue_missing: Vec<String> = ns_targets(&records, &origin)
        .into_iter()
        .filter(|t| origin.zone_of(t) && !has(t, RecordType::A) && !has(t, RecordType::AAAA))
        .map(|t| t.to_string())
        .collect();
    for target in glue_missing {
        issues.push(ConfigIssue::warning(
            file,
            None,
            target.clone(),
            "NS target inside the zone has no A/AAAA record (glue)",
        ));
    }
    if issues.has_errors() {
        return Err(issues);
    }

    let handler = Arc::new(
        InMemoryZoneHandler::<TokioRuntimeProvider>::new(
            origin.clone(),
            records.clone(),
            ZoneType::Primary,
            AxfrPolicy::Deny,
            None,
        )
        .map_err(|e| err(None, "", e))?,
    );
    let zone = Zone {
        origin,
        file: file.to_path_buf(),
        names,
        records,
        handler: handler.clone(),
    };
    Ok((zone, handler, issues))
}

pub(super) fn ns_targets(records: &BTreeMap<RrKey, RecordSet>, origin: &Name) -> Vec<Name> {
    records
        .get(&RrKey::new(LowerName::new(origin), RecordType::NS))
        .map(|set| {
            set.records_without_rrsigs()
                .filter_map(|r| match &r.data {
                    hickory_proto::rr::RData::NS(ns) => Some(ns.0.to_lowercase()),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// hickory's parser reports no position, so find the first line at which a prefix of the
/// file stops parsing: a binary search over the line ends that are outside parentheses
/// (a prefix cut inside a multi-line SOA would fail for the wrong reason).
pub(super) fn failing_line<T, E>(
    text: &str,
    parse: &dyn Fn(&str) -> Result<T, E>,
) -> Option<usize> {
    let mut cuts = Vec::new(); // (byte offset after the line, 1-based line number)
    let (mut depth, mut in_quote, mut offset) = (0i32, false, 0usize);
    for (i, line) in text.split_inclusive('\n').enumerate() {
        let mut escaped = false;
        for c in line.chars() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_quote = !in_quote,
                ';' if !in_quote => break,
                '(' if !in_quote => depth += 1,
                ')' if !in_quote => depth -= 1,
                _ => {}
            }
        }
        offset += line.len();
        if depth <= 0 && !in_quote {
            cuts.push((offset, i + 1));
        }
    }
    // Smallest cut whose prefix fails.
    let idx = cuts.partition_point(|&(end, _)| parse(&text[..end]).is_ok());
    cuts.get(idx)
        .map(|&(_, line)| line)
        .or_else(|| Some(text.lines().count()))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("steerdns-zones-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    const GOOD: &str = "$ORIGIN example.com.\n$TTL 300\n@ IN SOA ns1 hostmaster (1 7200 900 1209600 300)\n  IN NS ns1\nns1 IN A 192.0.2.53\nwww2 IN A 192.0.2.1\n";

    #[test]
    fn loads_and_indexes() {
        let d = tmpdir("good");
        write(&d, "example.com.zone", GOOD);
        let (zones, warnings) = Zones::load(&d).unwrap();
        assert_eq!(warnings.0.len(), 0);
        let www = Name::from_str("www.example.com.").unwrap();
        let zone = zones.zone_of(&www).unwrap();
        assert_eq!(zone.origin().to_string(), "example.com.");
        assert_eq!(
            zone.types_at(&Name::from_str("www2.example.com.").unwrap()),
            vec!["A"]
        );
        assert!(zones
            .zone_of(&Name::from_str("example.org.").unwrap())
            .is_none());
    }

    #[test]
    fn parse_errors_name_the_line() {
        let d = tmpdir("bad");
        write(
            &d,
            "example.com.zone",
            &format!("{GOOD}ok IN A 192.0.2.2\nbad IN AAAA not-an-address\nlast IN A 192.0.2.3\n"),
        );
        let e = Zones::load(&d).err().unwrap();
        let issue = e.errors().next().unwrap();
        assert_eq!(issue.line, Some(8), "{issue}");
    }

    #[test]
    fn text_is_checked_without_the_disk() {
        let file = Path::new("example.com.zone");
        assert!(check_text(file, GOOD).is_ok());
        let e = check_text(
            file,
            "$ORIGIN example.com.\n@ 300 IN SOA ns1 hm 1 2 3 4 5\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("no NS records"), "{e}");
    }

    #[test]
    fn apex_ns_and_cname_exclusivity_are_checked() {
        let d = tmpdir("checks");
        write(&d, "example.com", "$ORIGIN example.com.\n@ 300 IN SOA ns1 hm 1 2 3 4 5\nx 300 IN CNAME y\nx 300 IN TXT \"t\"\n");
        let e = Zones::load(&d).err().unwrap().to_string();
        assert!(e.contains("no NS records"), "{e}");
        assert!(e.contains("CNAME must be alone"), "{e}");
    }
}
