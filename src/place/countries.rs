//! Input data: ISO 3166-1 alpha-2 country codes and the continent of each.
//!
//! Flat geo databases (such as the NRO one we ship) carry only a country code; the
//! policy can still match `continent:EU`, so the continent is derived here. Where the
//! database has its own continent (GeoIP2, GeoLite2), the database wins.
//!
//! The grouping follows the convention of the GeoIP2 databases (seven continents, codes
//! AF AN AS EU NA OC SA; Russia and Cyprus in Europe, Turkey and the Caucasus in Asia).

/// A continent, as written in policies after `continent:`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Continent {
    Africa,
    Antarctica,
    Asia,
    Europe,
    NorthAmerica,
    Oceania,
    SouthAmerica,
}

impl Continent {
    pub const ALL: [Continent; 7] = [
        Continent::Africa,
        Continent::Antarctica,
        Continent::Asia,
        Continent::Europe,
        Continent::NorthAmerica,
        Continent::Oceania,
        Continent::SouthAmerica,
    ];

    /// The two-letter code (`EU`).
    pub fn code(self) -> &'static str {
        match self {
            Continent::Africa => "AF",
            Continent::Antarctica => "AN",
            Continent::Asia => "AS",
            Continent::Europe => "EU",
            Continent::NorthAmerica => "NA",
            Continent::Oceania => "OC",
            Continent::SouthAmerica => "SA",
        }
    }

    /// Parses a two-letter continent code, case-insensitively.
    pub fn from_code(code: &str) -> Option<Continent> {
        Continent::ALL
            .into_iter()
            .find(|c| c.code().eq_ignore_ascii_case(code))
    }

    /// A dense index (0..7) for lookup tables.
    pub fn index(self) -> usize {
        self as usize
    }

    /// The inverse of [`Continent::index`].
    pub fn from_index(i: usize) -> Option<Continent> {
        Continent::ALL.get(i).copied()
    }
}

/// A country code packed in two uppercase ASCII bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Country([u8; 2]);

impl Country {
    /// Parses a code from a policy or database; `None` unless it is a known ISO code.
    pub fn parse(code: &str) -> Option<Country> {
        // Letters only: `index` assumes them (a code such as `*#` once underflowed it,
        // found by the `policy` fuzz target).
        let c = Country::from_db(code)?;
        c.continent().map(|_| c)
    }

    /// Like `parse`, for codes read from a geo database: any two ASCII letters are
    /// kept (a database may know codes newer than our table), without a continent.
    pub fn from_db(code: &str) -> Option<Country> {
        let b = code.as_bytes();
        if b.len() == 2 && b[0].is_ascii_alphabetic() && b[1].is_ascii_alphabetic() {
            Some(Country([
                b[0].to_ascii_uppercase(),
                b[1].to_ascii_uppercase(),
            ]))
        } else {
            None
        }
    }

    /// A dense index (0..676) for lookup tables.
    pub fn index(self) -> usize {
        (self.0[0] - b'A') as usize * 26 + (self.0[1] - b'A') as usize
    }

    /// The inverse of [`Country::index`] (any two letters; no check that it is known).
    pub fn from_index(i: usize) -> Option<Country> {
        (i < 676).then(|| Country([b'A' + (i / 26) as u8, b'A' + (i % 26) as u8]))
    }

    pub fn as_str(&self) -> &str {
        // Both bytes are ASCII letters by construction.
        std::str::from_utf8(&self.0).unwrap_or("??")
    }

    /// The continent of a known ISO 3166 code.
    pub fn continent(self) -> Option<Continent> {
        match TABLE[self.index()] {
            0 => None,
            n => Some(Continent::ALL[n as usize - 1]),
        }
    }
}

impl std::fmt::Display for Country {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Countries by continent, in the order of `Continent::ALL`; 249 codes in all.
const BY_CONTINENT: [&str; 7] = [
    // Africa
    "AO BF BI BJ BW CD CF CG CI CM CV DJ DZ EG EH ER ET GA GH GM GN GQ GW KE KM LR LS LY MA \
     MG ML MR MU MW MZ NA NE NG RE RW SC SD SH SL SN SO SS ST SZ TD TG TN TZ UG YT ZA ZM ZW",
    // Antarctica
    "AQ BV GS HM TF",
    // Asia
    "AE AF AM AZ BD BH BN BT CC CN CX GE HK ID IL IN IO IQ IR JO JP KG KH KP KR KW KZ LA LB \
     LK MM MN MO MV MY NP OM PH PK PS QA SA SG SY TH TJ TL TM TR TW UZ VN YE",
    // Europe (XK, Kosovo, is user-assigned but used by every geo database)
    "AD AL AT AX BA BE BG BY CH CY CZ DE DK EE ES FI FO FR GB GG GI GR HR HU IE IM IS IT JE \
     LI LT LU LV MC MD ME MK MT NL NO PL PT RO RS RU SE SI SJ SK SM UA VA XK",
    // North America
    "AG AI AW BB BL BM BQ BS BZ CA CR CU CW DM DO GD GL GP GT HN HT JM KN KY LC MF MQ MS MX \
     NI PA PM PR SV SX TC TT US VC VG VI",
    // Oceania
    "AS AU CK FJ FM GU KI MH MP NC NF NR NU NZ PF PG PN PW SB TK TO TV UM VU WF WS",
    // South America
    "AR BO BR CL CO EC FK GF GY PE PY SR UY VE",
];

/// country index -> 1 + continent index (0 = not an ISO code), built at compile time.
static TABLE: [u8; 676] = build_table();

const fn build_table() -> [u8; 676] {
    let mut table = [0u8; 676];
    let mut c = 0;
    while c < BY_CONTINENT.len() {
        let s = BY_CONTINENT[c].as_bytes();
        let mut i = 0;
        while i + 1 < s.len() {
            if s[i].is_ascii_uppercase() && s[i + 1].is_ascii_uppercase() {
                let idx = (s[i] - b'A') as usize * 26 + (s[i + 1] - b'A') as usize;
                table[idx] = c as u8 + 1;
                i += 2;
            } else {
                i += 1;
            }
        }
        c += 1;
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_has_every_iso_code_once() {
        let total: usize = BY_CONTINENT
            .iter()
            .map(|s| s.split_whitespace().count())
            .sum();
        assert_eq!(total, 249 + 1, "249 ISO codes plus XK");
        let known = TABLE.iter().filter(|&&v| v != 0).count();
        assert_eq!(known, total, "a code is listed under two continents");
    }

    #[test]
    fn lookups() {
        assert_eq!(
            Country::parse("gb").unwrap().continent(),
            Some(Continent::Europe)
        );
        assert_eq!(
            Country::parse("NA").unwrap().continent(),
            Some(Continent::Africa)
        );
        assert_eq!(
            Country::parse("AS").unwrap().continent(),
            Some(Continent::Oceania)
        );
        assert_eq!(
            Country::parse("JP").unwrap().continent(),
            Some(Continent::Asia)
        );
        assert_eq!(
            Country::parse("BR").unwrap().continent(),
            Some(Continent::SouthAmerica)
        );
        assert_eq!(Country::parse("UK"), None);
        // Two bytes that are not letters: no panic, no country.
        for code in ["*#", "1A", "A1", "[]", "{}", "aé", "\0\0", "~~"] {
            assert_eq!(Country::parse(code), None, "{code:?}");
        }
        assert_eq!(Country::parse("G"), None);
        assert_eq!(Country::parse("ÄB"), None);
        assert_eq!(Country::from_db("EU").unwrap().continent(), None);
        assert_eq!(Continent::from_code("eu"), Some(Continent::Europe));
        assert_eq!(Continent::from_code("XX"), None);
    }
}
