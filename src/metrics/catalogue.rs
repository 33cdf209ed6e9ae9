//! Both planes: the catalogue of every metric family this process can serve, with its
//! type, labels and help, whether or not it has a series yet (the registry lists only
//! the families that have one). `steerdns reference metrics` prints it as the book's
//! metrics reference, which CI regenerates and compares with the committed page.

use prometheus::proto::{MetricFamily, MetricType};

use super::steered::{effective_weight_family, EFFECTIVE_WEIGHT_LABELS};
use super::{signature_expiry_family, Metrics, PREFIX};

/// One metric family as `/metrics` serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Family {
    /// The full name (`steerdns_…`, or `process_…` for the standard process metrics).
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// The label names, in the order the family defines them.
    pub labels: Vec<String>,
    /// The `# HELP` text.
    pub help: String,
}

impl Metrics {
    /// Every family, sorted by name: the registered ones, the two built at scrape time
    /// (`effective_weight`, `dnssec_signature_expiry_seconds`) and the process ones.
    pub fn catalogue(&self) -> Vec<Family> {
        let mut all = Vec::new();
        for collector in &self.inner.catalogue {
            let labels = collector
                .desc()
                .first()
                .map(|d| d.variable_labels.clone())
                .unwrap_or_default();
            // The registry adds the prefix as it gathers; a collector's own family
            // has none.
            for mut family in collector.collect() {
                family.set_name(format!("{PREFIX}_{}", family.name()));
                all.push(Family::from_proto(&family, labels.clone()));
            }
        }
        let scraped = [
            (effective_weight_family(), &EFFECTIVE_WEIGHT_LABELS[..]),
            (signature_expiry_family(), &[][..]),
        ];
        for (family, labels) in scraped {
            let labels = labels.iter().map(|l| l.to_string()).collect();
            all.push(Family::from_proto(&family, labels));
        }
        for family in self.inner.process.gather() {
            all.push(Family::from_proto(&family, Vec::new()));
        }
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }
}

impl Family {
    fn from_proto(family: &MetricFamily, labels: Vec<String>) -> Family {
        Family {
            name: family.name().to_string(),
            kind: match family.get_field_type() {
                MetricType::COUNTER => "counter",
                MetricType::GAUGE => "gauge",
                MetricType::HISTOGRAM => "histogram",
                MetricType::SUMMARY => "summary",
                MetricType::UNTYPED => "untyped",
            },
            labels,
            help: family.help().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_listed_with_its_labels_even_without_a_series() {
        let families = Metrics::new().catalogue();
        let find = |n: &str| families.iter().find(|f| f.name == n).cloned();
        // A vector with no child yet: the registry's gather would leave it out.
        let drains = find("steerdns_drains_active").expect("drains_active listed");
        assert_eq!(drains.kind, "gauge");
        assert_eq!(drains.labels, ["name", "cdn"]);
        let weight = find("steerdns_effective_weight").expect("scrape-time family listed");
        assert_eq!(weight.labels, ["cdn", "name", "region"]);
        assert!(find("steerdns_dnssec_signature_expiry_seconds").is_some());
        assert_eq!(
            find("steerdns_query_duration_seconds").map(|f| f.kind),
            Some("histogram")
        );
        assert!(families.windows(2).all(|w| w[0].name < w[1].name));
    }
}
