//! Arbitrary text through the probe file parser (`probes::parse_file`): the first byte
//! chooses a CDN probe file or `vantages.yaml`.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    let file = if which & 1 == 0 {
        "probes/fastly.yaml"
    } else {
        "probes/vantages.yaml"
    };
    let _ = steerdns::config::probes::parse_file(Path::new(file), text);
});
