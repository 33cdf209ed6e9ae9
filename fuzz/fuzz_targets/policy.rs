//! Arbitrary text through the policy parser and validator (`config::parse`).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = steerdns::config::parse(Path::new("steering.yaml"), text.to_string());
});
