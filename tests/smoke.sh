#!/usr/bin/env bash
# Smoke test: the dig commands of the book's "Try it with dig" against the release binary.
#
#   bash tests/smoke.sh          # from anywhere; PORT=20053 bash tests/smoke.sh to pick the port
#
# Builds the release binary (or takes STEERDNS_BIN), serves the demo policy
# (steering.yaml, zones/, geo/country.mmdb) on 127.0.0.1:$PORT, and checks the answers
# with dig. Prints one line per check and "N passed, M failed"; exits non-zero if any
# check failed.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode --keep-going
script_init smoke
require dig

FASTLY=example.map.fastly.net.
CLOUDFLARE=example.cdn.cloudflare.net.
SHARE_QUERIES=400

make_tmp smoke
[[ -n ${STEERDNS_BIN:-} ]] || echo "smoke: cargo build --release"
build_release

# ---- start the server --------------------------------------------------------------

# An explicit PORT is used as given; otherwise the first of 15353..15362 that works.
if [ -n "${PORT:-}" ]; then ports=$PORT; else ports=$(seq 15353 15362); fi

# dig with the options every query here shares.
d() { dig @127.0.0.1 -p "$PORT" +time=2 +tries=1 "$@"; }
# Whether anything answers DNS on $PORT (dig prints errors as ";;" lines on stdout).
answers() { d +time=1 example.com SOA 2>/dev/null | grep -q '^;; ->>HEADER<<-'; }

started=
for PORT in $ports; do
    # Something (a leftover server?) already answers here: do not test it by mistake.
    if answers; then
        echo "smoke: 127.0.0.1:$PORT already answers DNS, skipping it" >&2
        continue
    fi
    NO_COLOR=1 "$STEERDNS_BIN" serve --listen "127.0.0.1:$PORT" --steering-http off >"$TMP/server.log" 2>&1 &
    PID=$!
    track "$PID"
    if wait_for_dns -p "$PID" "$PORT"; then
        started=1
        break
    fi
    stop "$PID"
    echo "smoke: the server did not come up on 127.0.0.1:$PORT:" >&2
    sed 's/^/    /' "$TMP/server.log" >&2
done
if [ -z "$started" ]; then
    echo "smoke: could not start steerdns" >&2
    exit 1
fi
echo "smoke: steerdns serving on 127.0.0.1:$PORT (pid $PID)"

# ---- helpers -----------------------------------------------------------------------

# q ARGS...: one query; the full dig output is kept in $OUT, and shown under a failed
# check (FAIL_CONTEXT, scripts/lib.sh).
q() {
    OUT=$(d "$@" 2>&1)
    FAIL_CONTEXT=$OUT
}
status() { sed -n 's/.*, status: \([A-Z]*\),.*/\1/p' <<<"$OUT"; }
flags() { sed -n 's/^;; flags: \([^;]*\);.*/ \1 /p' <<<"$OUT"; }
# section NAME: the records of ANSWER, AUTHORITY or ADDITIONAL.
section() { awk -v s=";; $1 SECTION:" '$0 == s { f = 1; next } f && /^$/ { exit } f' <<<"$OUT"; }
ecs() { sed -n 's/^; CLIENT-SUBNET: //p' <<<"$OUT"; }

# is_steered_cname: exactly one answer, a CNAME to one of the CDNs with TTL 30.
is_steered_cname() {
    local ans
    ans=$(section ANSWER)
    [ "$(wc -l <<<"$ans")" -eq 1 ] || return 1
    read -r _ ttl class type target <<<"$ans"
    [ "$ttl" = 30 ] && [ "$class" = IN ] && [ "$type" = CNAME ] &&
        { [ "$target" = "$FASTLY" ] || [ "$target" = "$CLOUDFLARE" ]; }
}

# share SUBNET LOW HIGH: of $SHARE_QUERIES answers for SUBNET, LOW..HIGH % are fastly.
# Answers are consistent per resolver, so each query comes from another resolver
# (source addresses 127.64.x.y), as from a population of resolvers.
share() {
    local subnet=$1 low=$2 high=$3 f=0 c=0 other=0 i
    OUT=''
    FAIL_CONTEXT=''
    for i in $(seq 0 $((SHARE_QUERIES - 1))); do
        echo "-b 127.64.$((i / 250)).$((i % 250 + 1)) www.example.com +subnet=$subnet"
    done >"$TMP/batch"
    while read -r line; do
        case $line in
        "$FASTLY") f=$((f + 1)) ;;
        "$CLOUDFLARE") c=$((c + 1)) ;;
        *) other=$((other + 1)) ;;
        esac
    done < <(d +short -f "$TMP/batch" 2>&1)
    local name="+subnet=$subnet: fastly $f, cloudflare $c of $SHARE_QUERIES (fastly $low-$high %)"
    if [ $((f + c)) -ne "$SHARE_QUERIES" ] || [ "$other" -ne 0 ]; then
        fail "$name" "$((f + c)) CDN answers and $other other lines"
    elif [ $((f * 100)) -lt $((low * SHARE_QUERIES)) ] || [ $((f * 100)) -gt $((high * SHARE_QUERIES)) ]; then
        fail "$name" "fastly share $((f * 100 / SHARE_QUERIES)) % is outside $low-$high %"
    else
        ok "$name"
    fi
}

# ---- checks ------------------------------------------------------------------------

# The first command of "Try it with dig": a GB client, via ECS.
q www.example.com +subnet=81.2.69.0/24
if [ "$(status)" = NOERROR ] && [[ $(flags) == *" aa "* ]] && [[ $(flags) != *" ra "* ]]; then
    ok "www.example.com +subnet=81.2.69.0/24: NOERROR, aa set, ra clear"
else
    fail "www.example.com +subnet=81.2.69.0/24" "want status NOERROR, flags with aa and without ra"
fi
if is_steered_cname; then
    ok "www.example.com +subnet=81.2.69.0/24: $(section ANSWER | awk '{ print $4, $5, "TTL", $2 }')"
else
    fail "www.example.com +subnet=81.2.69.0/24" "want one CNAME to $FASTLY or $CLOUDFLARE with TTL 30"
fi
if [ "$(ecs)" = 81.2.69.0/24/18 ]; then
    ok "www.example.com +subnet=81.2.69.0/24: CLIENT-SUBNET 81.2.69.0/24/18 (scope = geo network 81.2.64.0/18)"
else
    fail "www.example.com +subnet=81.2.69.0/24" "want CLIENT-SUBNET: 81.2.69.0/24/18, got '$(ecs)'"
fi

# Weighted picks: GB 90/10, US 85/15. 400 draws: sd ~1.5 % and ~1.8 %; 4-sigma bounds.
share 81.2.69.0/24 84 96
share 216.160.83.0/24 78 92

# Zone data: the apex SOA.
q example.com SOA
soa=$(section ANSWER | awk '$4 == "SOA"' | wc -l)
if [ "$(status)" = NOERROR ] && [[ $(flags) == *" aa "* ]] && [ "$soa" -eq 1 ] &&
    [ "$(section ANSWER | wc -l)" -eq 1 ]; then
    ok "example.com SOA: NOERROR, aa, one SOA answer"
else
    fail "example.com SOA" "want NOERROR, aa and exactly one SOA in the answer"
fi

# A name that does not exist: NXDOMAIN with the SOA for negative caching.
q nope.example.com
if [ "$(status)" = NXDOMAIN ] && section AUTHORITY | awk '$1 == "example.com." && $4 == "SOA"' | grep -q .; then
    ok "nope.example.com: NXDOMAIN, SOA in the authority section"
else
    fail "nope.example.com" "want NXDOMAIN with the example.com. SOA in the authority section"
fi

# Outside every zone.
q example.org
if [ "$(status)" = REFUSED ]; then
    ok "example.org: REFUSED"
else
    fail "example.org" "want REFUSED"
fi

# TCP.
q www.example.com +tcp
if [ "$(status)" = NOERROR ] && is_steered_cname && grep -q '^;; SERVER: .*(TCP)' <<<"$OUT"; then
    ok "www.example.com +tcp: CNAME over TCP"
else
    fail "www.example.com +tcp" "want one steered CNAME, received over TCP"
fi

# Malformed ECS: 81.2.77.0/22 has address bits set past the prefix (RFC 7871 §6). dig
# masks +subnet=81.2.77.0/22 to 81.2.76.0/22 itself, so send the option raw: family 1,
# source 22 (0x16), scope 0, address 81.2.77 (0x51024d).
q www.example.com +ednsopt=8:0001160051024d
if [ "$(status)" = FORMERR ]; then
    ok "www.example.com ECS 81.2.77.0/22 (host bits set): FORMERR"
else
    fail "www.example.com ECS 81.2.77.0/22 (host bits set)" "want FORMERR, got '$(status)'"
fi

# EDNS version 1 (RFC 6891 §6.1.3).
q www.example.com +edns=1 +noednsnegotiation
if [ "$(status)" = BADVERS ] && grep -q '^; EDNS: version: 0,' <<<"$OUT"; then
    ok "www.example.com +edns=1: BADVERS, answered with EDNS version 0"
else
    fail "www.example.com +edns=1 +noednsnegotiation" "want BADVERS with an EDNS version 0 OPT"
fi

if ! summary; then
    echo "server log:"
    sed 's/^/    /' "$TMP/server.log"
    exit 1
fi
