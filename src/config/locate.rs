//! Input: finds the line of a field in a YAML document, so that semantic errors found
//! after parsing (an unknown CDN in a region, a default region missing) can name their
//! line like syntax errors do; [`Ctx`] gathers the issues validation finds, each at
//! its field's line.
//!
//! serde_yaml keeps no positions in its values, but it does attach the position of the
//! event being read to any error raised while deserializing. So we deserialize the
//! document once more with a visitor that walks down the wanted path, skipping
//! everything else, and raises an error on arrival: its location is the field's.

use std::fmt;
use std::path::Path;

use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use crate::error::{ConfigIssue, Issues};

/// One step of a field path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seg {
    Key(String),
    /// The second occurrence of a key (where a duplicate is reported).
    Repeat(String),
    Index(usize),
}

/// Renders `regions[1].weights.akamai`.
pub fn render(path: &[Seg]) -> String {
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) | Seg::Repeat(k) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(k);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// The 1-based line of the value at `path`, or of the deepest ancestor found.
pub fn line_of(src: &str, path: &[Seg]) -> Option<usize> {
    // Try the full path, then shorter ones: a missing key is reported at its parent.
    (0..=path.len()).rev().find_map(|n| {
        let de = serde_yaml::Deserializer::from_str(src);
        let line = match (Seek { path: &path[..n] }).deserialize(de) {
            Err(e) if e.to_string().contains(MARK) => e.location()?.line(),
            _ => return None,
        };
        // That is the line where the value starts; a block value starts below its key,
        // and the operator looks for the key.
        match path[..n].last() {
            Some(Seg::Key(k) | Seg::Repeat(k)) => Some(key_line(src, k, line).unwrap_or(line)),
            _ => Some(line),
        }
    })
}

/// The last line at or before `line` on which `key:` is written.
fn key_line(src: &str, key: &str, line: usize) -> Option<usize> {
    let forms = [
        format!("{key}:"),
        format!("\"{key}\":"),
        format!("'{key}':"),
    ];
    let lines: Vec<&str> = src.lines().take(line).collect();
    (0..lines.len())
        .rev()
        .find(|&i| forms.iter().any(|f| lines[i].contains(f.as_str())))
        .map(|i| i + 1)
}

const MARK: &str = "\u{1}found\u{1}";

struct Seek<'p> {
    path: &'p [Seg],
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        if self.path.is_empty() {
            d.deserialize_any(Arrived)
        } else {
            d.deserialize_any(self)
        }
    }
}

impl<'de> Visitor<'de> for Seek<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map or a sequence")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (want, mut skip) = match &self.path[0] {
            Seg::Key(k) => (k, 0),
            Seg::Repeat(k) => (k, 1),
            Seg::Index(_) => return Ok(()),
        };
        loop {
            let probe = KeyProbe { want };
            match map.next_key_seed(probe)? {
                None => return Ok(()),
                Some(true) if skip == 0 => {
                    return map.next_value_seed(Seek {
                        path: &self.path[1..],
                    })
                }
                Some(true) => skip -= 1,
                Some(false) => {}
            }
            map.next_value::<IgnoredAny>()?;
        }
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Seg::Index(want) = self.path[0] else {
            return Ok(());
        };
        for _ in 0..want {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Ok(());
            }
        }
        seq.next_element_seed(Seek {
            path: &self.path[1..],
        })
        .map(|_| ())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

/// Reads a map key; says whether it is the wanted one.
struct KeyProbe<'k> {
    want: &'k str,
}

impl<'de> DeserializeSeed<'de> for KeyProbe<'_> {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        let key = serde_yaml::Value::deserialize(d)?;
        let text = match &key {
            serde_yaml::Value::String(s) => s.clone(),
            serde_yaml::Value::Number(n) => n.to_string(),
            serde_yaml::Value::Bool(b) => b.to_string(),
            _ => return Ok(false),
        };
        Ok(text == self.want)
    }
}

/// Raises the marker error at the position of the value being read.
struct Arrived;

impl<'de> Visitor<'de> for Arrived {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("anything")
    }
    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(MARK))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(MARK))
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(MARK))
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(MARK))
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(MARK))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(MARK))
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(MARK))
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(MARK))
    }
}

/// What validating one file found so far, each issue located at its field's line.
pub(super) struct Ctx<'a> {
    pub(super) file: &'a Path,
    pub(super) source: &'a str,
    pub(super) issues: Issues,
}

impl Ctx<'_> {
    /// The errors found so far.
    pub(super) fn errors(&self) -> usize {
        self.issues.errors().count()
    }
    pub(super) fn error(&mut self, path: &[Seg], msg: impl Into<String>) {
        let line = line_of(self.source, path);
        self.issues
            .push(ConfigIssue::error(self.file, line, render(path), msg));
    }
    pub(super) fn warn(&mut self, path: &[Seg], msg: impl Into<String>) {
        let line = line_of(self.source, path);
        self.issues
            .push(ConfigIssue::warning(self.file, line, render(path), msg));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str = "\
hostname: www.example.com
ttl: 30
cdns:
  fastly:     { cname: example.map.fastly.net. }
  cloudflare: { cname: example.cdn.cloudflare.net. }
regions:
  - match: [GB, IE]
    weights: { fastly: 90, cloudflare: 10 }
  - match: [\"*\"]
    weights:
      fastly: 50
      akamai: 50
";

    fn key(k: &str) -> Seg {
        Seg::Key(k.into())
    }

    #[test]
    fn finds_values_in_block_and_flow_style() {
        assert_eq!(line_of(DOC, &[key("ttl")]), Some(2));
        assert_eq!(line_of(DOC, &[key("cdns"), key("cloudflare")]), Some(5));
        let p = [key("regions"), Seg::Index(1), key("weights"), key("akamai")];
        assert_eq!(line_of(DOC, &p), Some(12));
        let p = [key("regions"), Seg::Index(0), key("match"), Seg::Index(1)];
        assert_eq!(line_of(DOC, &p), Some(7));
        assert_eq!(render(&p), "regions[0].match[1]");
    }

    #[test]
    fn missing_fields_fall_back_to_the_parent() {
        let p = [key("regions"), Seg::Index(1), key("name")];
        assert_eq!(line_of(DOC, &p), Some(9));
        assert_eq!(line_of(DOC, &[key("failover")]), Some(1));
    }
}
