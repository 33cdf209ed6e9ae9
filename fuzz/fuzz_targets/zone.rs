//! Arbitrary text as a zone file, through the loader's parse and checks
//! (`zones::check_text`, what `Zones::load` does per file, without the disk).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `$INCLUDE` reads a file: that is the operator's to write, not ours to fuzz (an
    // include of /dev/zero never ends).
    if text.to_ascii_uppercase().contains("$INCLUDE") {
        return;
    }
    let _ = steerdns::zones::check_text(Path::new("example.com.zone"), text);
});
