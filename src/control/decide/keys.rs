//! Control plane: the typed keys of the control state's maps, instead of `(String,
//! String)` tuples whose halves could be mixed up: a CDN of a steered name
//! ([`NameCdn`]), a region of a steered name ([`NameRegion`]), a day of a CDN's usage
//! ([`CdnDay`]).
//!
//! Each is serialized as the two-element array the tuple it replaces was (`["name",
//! "cdn"]`), so every document and record written before reads the same.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! pair_key {
    ($(#[$doc:meta])* $ty:ident { $a:ident, $b:ident }) => {
        $(#[$doc])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $ty {
            pub $a: String,
            pub $b: String,
        }

        impl $ty {
            pub fn new(
                $a: impl Into<String>,
                $b: impl Into<String>,
            ) -> Self {
                $ty {
                    $a: $a.into(),
                    $b: $b.into(),
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}/{}", self.$a, self.$b)
            }
        }

        /// As the tuple it replaces: a two-element array.
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                (&self.$a, &self.$b).serialize(s)
            }
        }

        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let ($a, $b) = <(String, String)>::deserialize(d)?;
                Ok($ty { $a, $b })
            }
        }
    };
}

pair_key!(
    /// A CDN of a steered name (absolute): a failover stepper's, a timeline's, a drain
    /// gauge's key.
    NameCdn { name, cdn }
);

pair_key!(
    /// A region of a steered name (absolute): a region failing open.
    NameRegion { name, region }
);

pair_key!(
    /// A day (`YYYY-MM-DD`, UTC) of a CDN's usage.
    CdnDay { cdn, day }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_serializes_as_the_tuple_it_replaces() {
        let k = NameCdn::new("www.example.com.", "fastly");
        let tuple = ("www.example.com.".to_string(), "fastly".to_string());
        assert_eq!(
            serde_json::to_string(&k).unwrap(),
            serde_json::to_string(&tuple).unwrap()
        );
        let back: NameCdn = serde_json::from_str(r#"["www.example.com.","fastly"]"#).unwrap();
        assert_eq!(back, k);
        // Ordered as the tuple was: by name, then CDN.
        assert!(NameCdn::new("a", "z") < NameCdn::new("b", "a"));
    }
}
