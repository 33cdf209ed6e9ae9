//! Arbitrary text through the policy parser and validator (`config::parse`); every
//! policy accepted is then planned with each CDN removed and drained at each of its
//! steps, and each plan must keep the planner's invariants (`planner::check`: shares sum
//! to the region's total, no empty region, ...).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok((policy, _)) = steerdns::config::parse(Path::new("steering.yaml"), text.to_string()) {
        if let Err(e) = steerdns::control::decide::planner::check_every_cut(&policy) {
            panic!("a plan breaks an invariant: {e}");
        }
    }
});
