//! Both planes: the bounded label values, so that no text from outside (a probe's
//! reason, an rcode) can grow a label set.

/// The reason classes `probe_results_total{result}` may carry besides `ok`; anything
/// else is `other`, so that a new reason text can never grow the label set.
const REASON_CLASSES: [&str; 8] = [
    "timeout", "connect", "tls", "status", "body", "slow", "http", "client",
];

/// The class of a prober reason: the part before the first `:` or space (`timeout`,
/// `connect`, `tls`, `status`, `body`, `slow`, `http`, `client`), or `other`.
pub fn reason_class(reason: &str) -> &'static str {
    let head = reason.split([':', ' ']).next().unwrap_or_default().trim();
    REASON_CLASSES
        .iter()
        .find(|&&c| c == head)
        .copied()
        .unwrap_or("other")
}

/// The mnemonic of an rcode (IANA's DNS RCODEs registry); 16 is `BADVERS` (this server
/// verifies no TSIG, so never `BADSIG`: a signed query gets `NOTAUTH` with `BADKEY` in
/// its TSIG). Unassigned codes are `UNKNOWN`, keeping the label set bounded.
pub fn rcode_name(rcode: u16) -> &'static str {
    match rcode {
        0 => "NOERROR",
        1 => "FORMERR",
        2 => "SERVFAIL",
        3 => "NXDOMAIN",
        4 => "NOTIMP",
        5 => "REFUSED",
        6 => "YXDOMAIN",
        7 => "YXRRSET",
        8 => "NXRRSET",
        9 => "NOTAUTH",
        10 => "NOTZONE",
        16 => "BADVERS",
        17 => "BADKEY",
        18 => "BADTIME",
        19 => "BADMODE",
        20 => "BADNAME",
        21 => "BADALG",
        22 => "BADTRUNC",
        23 => "BADCOOKIE",
        _ => "UNKNOWN",
    }
}
