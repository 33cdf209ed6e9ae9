#!/usr/bin/env bash
# Zonemaster against two steerdns instances on loopback: the name servers of a set must
# give the same resolver the same answer (consistent selection), so Zonemaster reports no
# NAMESERVER09 (CASE_QUERIES_RESULTS_DIFFER) and no CONSISTENCY error. The zone is
# signed (a fresh key) and Zonemaster's DNSSEC test cases run with its DS (--ds).
#
#   sudo bash tests/zonemaster.sh                          # needs root: it binds port 53
#   STEERDNS_BIN=/path/to/steerdns sudo -E bash tests/zonemaster.sh   # another binary
#
# The bed, all on loopback (Zonemaster only speaks to port 53 and starts from root hints):
#   127.0.0.1:53, 127.0.0.2:53  steerdns ns1 and ns2: the demo policy (steering.yaml) and
#                               geo database, and a copy of zones/example.com.zone whose
#                               ns1/ns2 glue is 127.0.0.1/127.0.0.2 (the demo's is in the
#                               documentation ranges); no probes (an empty probes dir), own
#                               state dir and API port each
#   127.53.0.1:53               NSD: a fake root and `com`, delegating example.com to
#                               ns1/ns2.example.com with that glue; the hints file names it
#
# Checks:
#   1. Zonemaster (`zonemaster-cli example.com --hints ...`, Debian's zonemaster-cli):
#      fails on any NAMESERVER09 or CONSISTENCY message above INFO (a correct server gets
#      INFO only there), on any other ERROR/CRITICAL not in TOLERATED below (the messages
#      the bed itself causes), if NAMESERVER09 or CONSISTENCY01-06 did not run, or if
#      Zonemaster queried anything but loopback.
#   2. dig, independent of Zonemaster: for 200 ECS subnets with varied first octets, both
#      instances, each asked twice from the same source address, give the same CNAME; a
#      subnet whose answer differs is asked again (its hourly window may have rolled over
#      between the batches) and must then agree. Prints the share of each CNAME.
#
# Environment: STEERDNS_BIN (default: built with cargo build --release, in
# CARGO_TARGET_DIR if set), ZM_OUT (directory for the reports, default a new /tmp/steerdns-zonemaster.*,
# kept and printed: Zonemaster's output, the server and NSD logs, the dig answers).
# Needs zonemaster-cli, nsd, dnsviz, dig and python3 (.ci/run installs them). Sends traffic only
# to loopback; stops every process it started on exit and removes its scratch files.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode
script_init zonemaster
CHECK_PREFIX="zonemaster: "
DIE_PREFIX="FAIL: "

oneline() { tr -s '\n' ' ' <<<"$1" | sed 's/ $//'; }

NS1=127.0.0.1
NS2=127.0.0.2
ROOT=127.53.0.1
ZONE=example.com
STEERED=www.example.com
SUBNETS=200

# What a correct server gets above INFO on this bed, as "MODULE TAG" (levels of Debian's
# zonemaster-cli 5.0.2 / engine 4.6.2). They come from the bed (loopback addresses, IPv4
# only) or the demo zone's values, not from steerdns: NSD, Knot and BIND get
# them too (ZONEMASTER-NOTES.md). Only ERROR and CRITICAL fail the run; the others are
# listed so that the summary can say where they come from.
TOLERATED=(
    # ERROR: ns1/ns2 are 127.0.0.1/127.0.0.2, and loopback is a special-purpose network.
    "ADDRESS NAMESERVER_IP_PRIVATE_NETWORK"
    # WARNING: no reverse zone for 127.0.0.1/127.0.0.2 behind the fake root.
    "ADDRESS NAMESERVER_IP_WITHOUT_REVERSE"
    # WARNING: the SOA MNAME, ns1.example.com, is 127.0.0.1 on the bed.
    "ZONE Z01_MNAME_HAS_LOCALHOST_ADDR"
    # NOTICE: the bed is IPv4 only (--no-ipv6; the test zone drops ns1/ns2 AAAA).
    "DELEGATION NO_IPV6_NS_CHILD"
    "DELEGATION NO_IPV6_NS_DEL"
    # NOTICE: the demo zone's SOA refresh (7200) and retry (900) are below Zonemaster's advice.
    "ZONE REFRESH_MINIMUM_VALUE_LOWER"
    "ZONE RETRY_MINIMUM_VALUE_LOWER"
)

# --- prerequisites -------------------------------------------------------------------
[ "$(id -u)" -eq 0 ] || die "needs root to bind port 53: sudo bash tests/zonemaster.sh"
require zonemaster-cli nsd dnsviz dig python3
build_release

# Nothing may already listen on port 53 of our addresses (nor on all addresses).
if command -v ss >/dev/null; then
    busy=$(ss -Hlnut 'sport = :53' | awk '{ print $5 }' |
        grep -E "^(0\.0\.0\.0|\*|\[::\]|$NS1|$NS2|$ROOT):53$" || true)
    [ -z "$busy" ] || die "port 53 is already in use on: $(oneline "$busy")"
fi

# --- scratch dir, reports, cleanup ---------------------------------------------------
make_tmp zonemaster-tmp
OUT=${ZM_OUT:-$(mktemp -d /tmp/steerdns-zonemaster.XXXXXX)}
mkdir -p "$OUT"
log "reports in $OUT"

# --- the zone under test: the demo zone with loopback glue ---------------------------
mkdir -p "$TMP/zones" "$TMP/probes" "$TMP/state1" "$TMP/state2" "$TMP/nsd"
# The CDN targets moved into example.com (example.map.fastly.net.example.com.): DNSViz
# follows a CNAME to its target, which must not lead it off loopback.
sed -E 's/(cname: [^ }]+\.)( *\})/\1example.com.\2/' steering.yaml >"$TMP/steering.yaml"
grep -q 'cname: .*\.example\.com\.' "$TMP/steering.yaml" || die "steering.yaml: no 'cname: X. }' to move into example.com"
sed -E -e "s/^(ns1[[:space:]]+IN[[:space:]]+A[[:space:]]+).*/\1$NS1/" \
    -e "s/^(ns2[[:space:]]+IN[[:space:]]+A[[:space:]]+).*/\1$NS2/" \
    -e '/^ns[12][[:space:]]+IN[[:space:]]+AAAA[[:space:]]/d' \
    zones/$ZONE.zone >"$TMP/zones/$ZONE.zone"
if ! grep -Eq "^ns1[[:space:]]+IN[[:space:]]+A[[:space:]]+$NS1\$" "$TMP/zones/$ZONE.zone" ||
    ! grep -Eq "^ns2[[:space:]]+IN[[:space:]]+A[[:space:]]+$NS2\$" "$TMP/zones/$ZONE.zone"; then
    die "zones/$ZONE.zone no longer has 'ns1 IN A' and 'ns2 IN A' lines to point at loopback"
fi
cp "$TMP/zones/$ZONE.zone" "$OUT/$ZONE.zone"
# Signed, with a fresh key (ECDSA P-256): Zonemaster's DNSSEC test cases run with its DS
# (--ds, as if the parent held it).
"$STEERDNS_BIN" dnssec keygen $ZONE --keys "$TMP/keys" >/dev/null || die "dnssec keygen failed"
printf '\ndnssec:\n  keys: keys\n' >>"$TMP/steering.yaml"
DS=$("$STEERDNS_BIN" dnssec ds $ZONE --keys "$TMP/keys" | awk '$3 == "DS" { print $4 "," $5 "," $6 "," $7 }')
[ -n "$DS" ] || die "no DS for $ZONE"
log "signed; DS $DS"

# --- the fake root and com on 127.53.0.1 (NSD) ----------------------------------------
cat >"$TMP/nsd/root.zone" <<EOF
\$ORIGIN .
\$TTL 3600
.               IN SOA ns.fakeroot. hostmaster.fakeroot. 1 1800 900 604800 86400
.               IN NS  ns.fakeroot.
ns.fakeroot.    IN A   $ROOT
com.            IN NS  ns.fakeroot.
EOF
cat >"$TMP/nsd/com.zone" <<EOF
\$ORIGIN com.
\$TTL 3600
@               IN SOA ns.fakeroot. hostmaster.fakeroot. 1 1800 900 604800 86400
@               IN NS  ns.fakeroot.
example         IN NS  ns1.example.com.
example         IN NS  ns2.example.com.
ns1.example     IN A   $NS1
ns2.example     IN A   $NS2
EOF
cat >"$TMP/nsd/nsd.conf" <<EOF
server:
    ip-address: $ROOT
    port: 53
    do-ip6: no
    username: ""
    chroot: ""
    zonesdir: "$TMP/nsd"
    database: ""
    zonelistfile: "$TMP/nsd/zone.list"
    xfrdfile: "$TMP/nsd/xfrd.state"
    xfrdir: "$TMP/nsd"
    pidfile: "$TMP/nsd/nsd.pid"
    logfile: "$OUT/nsd.log"
    server-count: 1
    verbosity: 1
remote-control:
    control-enable: no
zone:
    name: "."
    zonefile: "root.zone"
zone:
    name: "com"
    zonefile: "com.zone"
EOF
cat >"$TMP/hints" <<EOF
.               3600000 NS ns.fakeroot.
ns.fakeroot.    3600000 A  $ROOT
EOF

nsd-checkconf "$TMP/nsd/nsd.conf" || die "nsd.conf rejected"
nsd -d -c "$TMP/nsd/nsd.conf" >>"$OUT/nsd.log" 2>&1 &
track $!

# --- two steerdns instances -----------------------------------------------------------
n=0
for addr in $NS1 $NS2; do
    n=$((n + 1))
    NO_COLOR=1 "$STEERDNS_BIN" serve --config "$TMP/steering.yaml" --zones "$TMP/zones" \
        --geo "$REPO/geo/country.mmdb" --probes "$TMP/probes" --listen "$addr:53" \
        --api "127.0.0.1:$(free_port)" --state-dir "$TMP/state$n" --vantage "ns$n" --steering-http off \
        >"$OUT/steerdns-ns$n.log" 2>&1 &
    track $!
done

wait_for_dns 53 $NS1 $ZONE SOA || die "steerdns did not come up on $NS1:53 (see $OUT/steerdns-ns1.log)"
wait_for_dns 53 $NS2 $ZONE SOA || die "steerdns did not come up on $NS2:53 (see $OUT/steerdns-ns2.log)"
wait_for_dns 53 $ROOT com SOA || die "NSD did not come up on $ROOT:53 (see $OUT/nsd.log)"
log "steerdns on $NS1:53 and $NS2:53, fake root and com (NSD) on $ROOT:53"

# The bed itself: the parent delegates to the NS set the zone names, with the same glue.
ns_set() { dig @"$1" +norecurse +noall "$2" "$ZONE" NS | awk '$4 == "NS" { print $5 }' | sort | tr '\n' ' '; }
parent=$(ns_set $ROOT +authority)
for addr in $NS1 $NS2; do
    child=$(ns_set "$addr" +answer)
    [ "$child" = "$parent" ] || die "NS at the parent ($parent) and at $addr ($child) differ"
done
log "delegation: $parent"

# --- 1. Zonemaster --------------------------------------------------------------------
# Output lines (--raw --show-module --show-testcase, every level down to DEBUG):
#   "   0.06 INFO      NAMESERVER   NAMESERVER09   CASE_QUERIES_RESULTS_OK   domain=..."
ZM=$OUT/zonemaster.txt
log "running zonemaster-cli $ZONE --hints (fake root) --no-ipv6: $(zonemaster-cli --version 2>&1 | head -2 | tr -s '\n\t ' ' ')"
start=$(date +%s)
zonemaster-cli "$ZONE" --hints "$TMP/hints" --ds "$DS" --no-ipv6 --raw --show-module --show-testcase \
    --level DEBUG --no-progress >"$ZM" 2>"$OUT/zonemaster.stderr" ||
    die "zonemaster-cli exited with status $? (see $OUT/zonemaster.stderr)"
log "zonemaster-cli took $(($(date +%s) - start)) s; full output (DEBUG and up): $ZM"

# msgs MIN: the message lines at level MIN or above, as "LEVEL MODULE TESTCASE TAG ARGS".
msgs() {
    awk -v min="$1" '
        BEGIN { n = split("DEBUG INFO NOTICE WARNING ERROR CRITICAL", l, " ")
                for (i = 1; i <= n; i++) rank[l[i]] = i }
        $1 ~ /^[0-9]+\.[0-9]+$/ && ($2 in rank) && rank[$2] >= rank[min] { $1 = ""; sub(/^ /, ""); print }
    ' "$ZM"
}
tolerated() { local t; for t in "${TOLERATED[@]}"; do [ "$t" = "$1 $2" ] && return 0; done; return 1; }

echo "zonemaster: messages per level: $(msgs DEBUG | awk '{ n[$1]++ } END {
    split("CRITICAL ERROR WARNING NOTICE INFO DEBUG", l, " ")
    for (i = 1; i <= 6; i++) printf "%s%s %d", (i > 1 ? ", " : ""), l[i], n[l[i]] }')"
echo "zonemaster: NOTICE and above:"
msgs NOTICE | while read -r level module testcase tag _; do
    if tolerated "$module" "$tag"; then
        note="from the bed"
    elif [ "$level" = ERROR ] || [ "$level" = CRITICAL ]; then
        note="UNEXPECTED"
    else
        note="unexpected, not failing below ERROR"
    fi
    printf '  %-8s %-12s %-14s %s (%s)\n' "$level" "$module" "$testcase" "$tag" "$note"
done | sort | uniq -c

# NAMESERVER09 asks each server twice for www.example.com in different letter case: the
# two answers (the steered CNAME) must be the same. Any message above INFO is a failure.
bad=$(msgs NOTICE | awk '$3 == "NAMESERVER09"')
[ -z "$bad" ] || fail "NAMESERVER09 (case queries, the steered name asked twice):"$'\n'"$bad"
[ -n "$bad" ] || msgs INFO | awk '$3 == "NAMESERVER09" && $4 == "CASE_QUERIES_RESULTS_OK"' | grep -q . ||
    fail "NAMESERVER09 did not report CASE_QUERIES_RESULTS_OK"
# CONSISTENCY01-06 compare the servers' SOA and NS with each other: a correct server gets
# INFO only here (MULTIPLE_NS_SET, MULTIPLE_SOA_* are NOTICE, the rest WARNING/ERROR).
bad=$(msgs NOTICE | awk '$2 == "CONSISTENCY"')
[ -z "$bad" ] || fail "CONSISTENCY (the servers differ):"$'\n'"$bad"
for tc in CONSISTENCY01 CONSISTENCY02 CONSISTENCY03 CONSISTENCY04 CONSISTENCY05 CONSISTENCY06 NAMESERVER09; do
    msgs DEBUG | awk -v tc="$tc" '$3 == tc && $4 == "TEST_CASE_END"' | grep -q . ||
        fail "Zonemaster did not run $tc"
done
# DNSSEC: the zone is signed and --ds gives its DS; every DNSSEC test case ran, none
# says more than INFO, and the CDS/CDNSKEY the zone publishes were seen.
bad=$(msgs NOTICE | awk '$2 == "DNSSEC"')
[ -z "$bad" ] || fail "DNSSEC (the signed zone, with --ds):"$'\n'"$bad"
for tc in DNSSEC01 DNSSEC02 DNSSEC03 DNSSEC04 DNSSEC05 DNSSEC06 DNSSEC07 DNSSEC08 DNSSEC09 DNSSEC10 DNSSEC11 DNSSEC13 DNSSEC14 DNSSEC15 DNSSEC16 DNSSEC17 DNSSEC18; do
    msgs DEBUG | awk -v tc="$tc" '$3 == tc && $4 == "TEST_CASE_END"' | grep -q . ||
        fail "Zonemaster did not run $tc"
done
for tag in ALGORITHM_OK DNSKEY_AND_DS DS15_HAS_CDS_AND_CDNSKEY RRSIG_EXPIRATION; do
    msgs DEBUG | awk -v t="$tag" '$2 == "DNSSEC" && $4 == t' | grep -q . ||
        fail "Zonemaster's DNSSEC test cases did not report $tag (was the zone signed?)"
done
# Any other ERROR or CRITICAL that the bed does not explain.
bad=$(msgs ERROR | while read -r level module testcase tag args; do
    [ "$module" = CONSISTENCY ] || [ "$testcase" = NAMESERVER09 ] || tolerated "$module" "$tag" ||
        echo "$level $module $testcase $tag $args"
done)
[ -z "$bad" ] || fail "unexpected ERROR/CRITICAL from Zonemaster (not in TOLERATED):"$'\n'"$bad"
# Every query Zonemaster sent went to loopback (it logs each one at DEBUG), and it sent
# some: no EXTERNAL_QUERY line at all (another log format, DEBUG lost) proves nothing.
sent=$(msgs DEBUG | awk '$4 == "EXTERNAL_QUERY"' | grep -oE 'ip=[^;]*' || true)
[ -n "$sent" ] || fail "no EXTERNAL_QUERY line in Zonemaster's DEBUG output: cannot tell where it sent queries"
bad=$(grep -v '^ip=127\.' <<<"$sent" | sort -u || true)
[ -z "$bad" ] || fail "Zonemaster queried non-loopback addresses: $(oneline "$bad")"

# --- DNSViz: probe both servers, then grok with the zone's key as trust anchor ----------
# `probe -A -a ZONE` asks the two servers for the zone, the steered name (as a client of
# a GB subnet) and a missing name; `grok` with the zone's keys as trust anchor must find
# no error or warning, the DNSKEY set and the steered CNAME SECURE, every RRSIG VALID.
# The zone's DNSKEY set as the trust anchor of grok (the DS needs -N with -D, which
# makes DNSViz start a server of its own); checked against the DS first.
dig @$NS1 +norecurse +noall +answer $ZONE DNSKEY >"$TMP/trusted"
tag=$(awk '$3 == "DS" { print $4 }' <<<"$("$STEERDNS_BIN" dnssec ds $ZONE --keys "$TMP/keys")")
grep -q "DNSKEY" "$TMP/trusted" || die "no DNSKEY from $NS1"
dig @$NS1 +norecurse +multi $ZONE DNSKEY | grep -q "key id = $tag" ||
    die "the DNSKEY set of $NS1 lacks the key of the DS ($tag)"
start=$(date +%s)
timeout 300 dnsviz probe -A -a $ZONE -x "com:$ROOT" -x "$ZONE:$NS1,$NS2" \
    -e 81.2.69.0/24 -o "$OUT/dnsviz-probe.json" $ZONE $STEERED nx-dnsviz.$ZONE \
    2>"$OUT/dnsviz-probe.stderr" || die "dnsviz probe failed (see $OUT/dnsviz-probe.stderr)"
# Debian 12's dnsviz asks for pygraphviz.release, which its pygraphviz 1.7 lacks
# (`grok -t` then says "pygraphviz is required"): a sitecustomize gives it one.
mkdir -p "$TMP/pyshim"
cat >"$TMP/pyshim/sitecustomize.py" <<'PY'
try:
    import types, pygraphviz
    if not hasattr(pygraphviz, "release"):
        pygraphviz.release = types.SimpleNamespace(version=pygraphviz.__version__)
except ImportError:
    pass
PY
PYTHONPATH="$TMP/pyshim" dnsviz grok -P -t "$TMP/trusted" -l info -r "$OUT/dnsviz-probe.json" \
    -o "$OUT/dnsviz-grok.json" 2>"$OUT/dnsviz-grok.stderr" || die "dnsviz grok failed (see $OUT/dnsviz-grok.stderr)"
log "dnsviz probe and grok took $(($(date +%s) - start)) s: $OUT/dnsviz-grok.json"
off=$(grep -oE '"[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+"' "$OUT/dnsviz-probe.json" | tr -d '"' | grep -v '^127\.' | sort -u || true)
[ -z "$off" ] || fail "DNSViz queried non-loopback addresses: $(oneline "$off")"
python3 - "$OUT/dnsviz-grok.json" <<'PY' || fail "DNSViz reports errors or warnings (above; full report $OUT/dnsviz-grok.json)"
import json, sys
doc = json.load(open(sys.argv[1]))
found = []
def walk(node, path):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("errors", "warnings") and v:
                for item in v:
                    found.append(f"{'/'.join(path)}: {k[:-1]}: {item.get('code', item)} {item.get('description', '')}")
            else:
                walk(v, path + [k])
    elif isinstance(node, list):
        for i, v in enumerate(node):
            walk(v, path + [str(i)])
walk(doc, [])
# Every RRSIG DNSViz checked, by status; the DNSKEY set and the steered CNAME must be
# SECURE (with the zone's keys as trust anchor; the delegation from the unsigned fake
# com stays INSECURE).
sigs = {}
def walk_sigs(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "rrsig":
                for r in v:
                    sigs[r.get("status")] = sigs.get(r.get("status"), 0) + 1
            walk_sigs(v)
    elif isinstance(node, list):
        for v in node:
            walk_sigs(v)
walk_sigs(doc)
keys = [k.get("status") for k in doc.get("example.com.", {}).get("dnskey", [])]
cname = [a.get("status") for q in doc.get("www.example.com.", {}).get("queries", {}).values()
         for a in q.get("answer", [])]
print(f"zonemaster: dnsviz: DNSKEY {keys}, steered CNAME {cname}, signatures {sigs}")
for f in found:
    print("  dnsviz:", f)
good = keys and all(k == "SECURE" for k in keys) and cname and all(c == "SECURE" for c in cname)
sys.exit(1 if found or not good or set(sigs) != {"VALID"} else 0)
PY

# --- 2. dig: the same answer from both servers, and twice from each -------------------
# 200 /24 client subnets with varied first octets (1-223, not 10 or 127), a fixed list.
awk -v n=$SUBNETS 'BEGIN {
    for (i = 0; i < n; i++) {
        a = 1 + (i * 47) % 222; if (a == 10 || a == 127) a++
        printf "%d.%d.%d.0/24\n", a, (i * 73 + 11) % 256, (i * 151 + 29) % 256
    }
}' >"$OUT/subnets"
sed "s|^|$STEERED A +subnet=|" "$OUT/subnets" >"$TMP/batch"
CNAMES=$(awk '$1 ~ /^[a-z0-9_-]+:$/ && $2 == "{" && $3 == "cname:" { print $4 }' "$TMP/steering.yaml" | sort -u)
[ -n "$CNAMES" ] || die "no 'cname:' targets found in steering.yaml"
# ask SERVER [DIG ARGS]: the CNAME(s) of the answers, one line per query, from 127.0.0.1.
ask() { local s=$1; shift; dig @"$s" -b 127.0.0.1 +short +time=2 +tries=2 "$@" 2>&1; }
for round in 1 2; do
    for addr in $NS1 $NS2; do
        f=$OUT/answers-$addr-$round
        ask "$addr" -f "$TMP/batch" >"$f"
        if [ "$(wc -l <"$f")" -ne "$SUBNETS" ] || grep -vqxF "$CNAMES" "$f"; then
            die "$addr did not answer every query with one of the CNAMEs ($(oneline "$CNAMES")); see $f"
        fi
    done
done
paste -d ' ' "$OUT/subnets" "$OUT/answers-$NS1-1" "$OUT/answers-$NS2-1" \
    "$OUT/answers-$NS1-2" "$OUT/answers-$NS2-2" >"$OUT/answers"
# A subnet's hourly window may roll over between the batches (each window is staggered):
# a subnet whose four answers differ is asked again; if all four then agree, it rolled
# over (about one subnet in 1,000 per second of batches). More than 3 is a failure.
rolled=()
differ=()
while read -r subnet a b c d; do
    [ "$a" = "$b" ] && [ "$a" = "$c" ] && [ "$a" = "$d" ] && continue
    again=$(for addr in $NS1 $NS2 $NS1 $NS2; do ask "$addr" "$STEERED" A "+subnet=$subnet"; done | sort -u)
    if [ "$(wc -l <<<"$again")" -eq 1 ] && grep -qxF "$CNAMES" <<<"$again"; then
        rolled+=("$subnet: ns1 $a, ns2 $b, ns1 $c, ns2 $d; then $again four times")
    else
        differ+=("$subnet: ns1 $a, ns2 $b, ns1 $c, ns2 $d; asked again: $(oneline "$again")")
    fi
done <"$OUT/answers"
if ((${#differ[@]})) || ((${#rolled[@]} > 3)); then
    fail "dig: $((${#differ[@]} + ${#rolled[@]})) of $SUBNETS subnets got different CNAMEs from ns1 and ns2 or from one server twice (${#differ[@]} still differ when asked again; at most 3 may roll over, ${#rolled[@]} did), e.g.:"$'\n'"$(printf '  %s\n' "${differ[@]:0:5}" "${rolled[@]:0:5}" | grep -v '^  $')"
else
    log "dig: $SUBNETS ECS subnets, ns1 and ns2 each asked twice: the same CNAME every time (${#rolled[@]} rolled over in between)"
    ((${#rolled[@]} == 0)) || printf '  rolled over: %s\n' "${rolled[@]}"
fi
shares=$(awk '{ print $2 }' "$OUT/answers" | sort | uniq -c |
    awk -v n=$SUBNETS '{ printf "  %-32s %3d subnets  %5.1f %%\n", $2, $1, 100 * $1 / n }')
echo "zonemaster: dig: share of each CNAME over the $SUBNETS subnets (ns1, first round):"
echo "$shares"
# A server answering one CDN for everyone would pass the checks above trivially.
[ "$(wc -l <<<"$shares")" -ge 2 ] || fail "dig: only one CNAME over $SUBNETS subnets of varied regions"

if ((FAILED)); then
    echo "zonemaster: $FAILED check(s) failed; reports in $OUT"
    exit 1
fi
echo "zonemaster: passed (no NAMESERVER09, CONSISTENCY or DNSSEC message above INFO, only tolerated ERRORs; DNSViz clean; dig consistent); reports in $OUT"
