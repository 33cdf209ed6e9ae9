#!/usr/bin/env bash
# Soak test (issue 6, item 7): dnsperf against the release binary for a set time while
# the control plane is kept busy every second:
#
#   1. steering.yaml is rewritten, alternating a valid edit (other weights, written
#      atomically) and a broken one (a YAML error, or an unknown CDN in the weights);
#   2. the mock "fastly" CDN flips between healthy and broken (its canary object answers
#      404) every FLIP_EVERY seconds, so failover steps run (probes every 0.2 s, down
#      after 2 bad rounds, up after 3 good ones, steps 0.5 s apart);
#   3. a drain is added, then removed, over the admin API (POST/DELETE /v1/drains);
#   4. (HOSTILE=1, the default) hostile traffic runs alongside for the whole time
#      (tests/hostile-traffic.py, issue 14 item 11): a TCP slowloris of 300 connections
#      from 127.66.0.1, UDP garbage from 127.67.0.1 (to a second DNS port of the server,
#      so that its drops are not counted as dnsperf's), an API connection flood of 300 from
#      127.68.0.1, the same flood spread over the addresses of one /24 (127.70.0.x), a
#      DNS-over-TCP amplification of 64 connections pipelining queries without reading
#      (127.69.0-2.x); and every second dig asks over TCP from another address.
#
#   bash tests/soak.sh                # WARMUP=10 s, then DURATION=60 s of load
#   DURATION=600 bash tests/soak.sh   # a long run
#
# Environment:
#   DURATION=60     seconds of load measured after the warm-up
#   WARMUP=10       seconds of the same load and churn before the start RSS is taken
#                   (30 with HOSTILE=1: the hostile connections raise the allocator's
#                   high-water mark for about that long, then RSS is flat)
#   QPS=20000       dnsperf -Q (moderate, so a 2-core CI machine copes)
#   QUERIES=20000   messages in the binary query file (varied ECS, 20 % non-steered)
#   FLIP_EVERY=2    seconds between flips of the mock CDN
#   MAX_RSS_GROWTH=10   percent
#   MAX_RSS_KB=60000    the server's VmRSS after the warm-up and at the end (60 MB, issue 25)
#   STEERDNS_BIN=target/release/steerdns (built with cargo build --release unless set)
#   KEEP=1          keep the scratch directory (server log, dnsperf output, policies)
#   HOSTILE=1       the hostile traffic of 4. (0: none)
#
# Reports queries sent, completed and lost, NOERROR and SERVFAIL counts (dnsperf's
# rcode summary), the server's RSS (VmRSS) after the warm-up and at the end, reloads
# applied and refused and health transitions (from /metrics), and drain API calls.
# Every second dig also asks www.example.com through 40 resolvers; each answer must be
# one of the two CNAMEs.
# Exits non-zero unless: no query lost but those the kernel dropped on a full receive
# queue, every dig answer one of the two CNAMEs (and at least 90 % answered), no
# SERVFAIL, RSS growth under MAX_RSS_GROWTH % and RSS under MAX_RSS_KB,
# and enough reloads applied, reloads refused, health transitions and drain calls
# happened (so that it cannot pass without having churned); with HOSTILE=1 also every
# drain call and every TCP dig answered (one of the two CNAMEs) while the hostile
# traffic ran, and the server's metrics show it at work (connections over the
# per-source limit closed at accept, slowloris connections closed as idle). Traffic goes to 127.0.0.1
# only; every process it starts is stopped on exit.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode
script_init soak

DURATION=${DURATION:-60}
HOSTILE=${HOSTILE:-1}
WARMUP=${WARMUP:-$((HOSTILE ? 30 : 10))}
QPS=${QPS:-20000}
QUERIES=${QUERIES:-20000}
FLIP_EVERY=${FLIP_EVERY:-2}
MAX_RSS_GROWTH=${MAX_RSS_GROWTH:-10}
MAX_RSS_KB=${MAX_RSS_KB:-60000}
TOTAL=$((WARMUP + DURATION))
# Each kind of edit is written TOTAL/2 times; a reload can merge with the next edit
# only if the server falls a second behind, so half of that is a safe floor.
MIN_EACH=$((TOTAL / 4 > 0 ? TOTAL / 4 : 1))
# The mock CDN flips TOTAL/FLIP_EVERY times; each flip should move fastly up or down.
MIN_TRANSITIONS=$((TOTAL / FLIP_EVERY / 2 > 0 ? TOTAL / FLIP_EVERY / 2 : 1))

# --- prerequisites -------------------------------------------------------------------
install_missing dnsperf dig curl python3
build_release
VERSION=$(git describe --always --dirty 2>/dev/null || echo '?')

# --- scratch dir and ports (stopped and removed on exit by scripts/lib.sh) ---------
make_tmp soak
# Failures are reported as "soak: FAIL: ..." (scripts/lib.sh's `fail`).
CHECK_PREFIX="soak: "

# --- the mock CDNs: each serves the canary object; fastly's is removed to break it ----
start_cdn fastly "$TMP/fastly"
start_cdn cloudflare "$TMP/cloudflare"
DNS_PORT=$(free_port) API_PORT=$(free_port)
# A second DNS port of the same server for everything over UDP but dnsperf (the dig
# checks and the hostile garbage): the drops on DNS_PORT are then dnsperf's own.
SIDE_PORT=$(free_port)

# --- inputs: policy, zone, geo database, probes, token -------------------------------
S=$TMP/server
mkdir -p "$S/probes" "$S/state"
cp -r zones "$S/zones"
for cdn in fastly cloudflare; do
    cat >"$S/probes/$cdn.yaml" <<YAML
url: http://127.0.0.1:${CDN_PORT[$cdn]}/_health/v1.txt
expect_body: healthy-v1
timeout_ms: 500
interval_seconds: 0.2
down_after: 2
up_after: 3
YAML
done
TOKEN=soak-token-$RANDOM$RANDOM$RANDOM
(umask 077 && echo "$TOKEN" >"$S/api-token")

# Writes policy number $1 to steering.yaml: even numbers are valid (the weights move
# with the number), odd ones are broken (a YAML error, or an unknown CDN). Written to a
# temporary file and renamed, so the server never reads half a file.
policy() {
    local n=$1 gb=$((60 + $1 % 31)) us=$((50 + $1 % 41)) f="$S/steering.yaml.tmp"
    {
        echo "# soak policy $n"
        echo "hostname: www.example.com"
        echo "ttl: 30"
        echo "incident_ttl: 10"
        echo "cdns:"
        echo "  fastly:     { cname: example.map.fastly.net. }"
        echo "  cloudflare: { cname: example.cdn.cloudflare.net. }"
        echo "regions:"
        echo "  - match: [GB, IE, DE, FR, NL, ES, IT]"
        echo "    weights: { fastly: $gb, cloudflare: $((100 - gb)) }"
        echo "  - match: [US, CA, MX]"
        if ((n % 4 == 1)); then
            echo "    weights: { fastly: $us, cloudfare: $((100 - us)) }" # unknown CDN
        else
            echo "    weights: { fastly: $us, cloudflare: $((100 - us)) }"
        fi
        echo "  - match: [AU, NZ, SG, JP]"
        echo "    weights: { cloudflare: 90, fastly: 10 }"
        echo "  - match: [\"*\"]"
        if ((n % 4 == 3)); then
            echo "    weights: { fastly: 50, cloudflare: 50"                 # YAML error
        else
            echo "    weights: { fastly: 50, cloudflare: 50 }"
        fi
        echo "failover:"
        echo "  steps: [50, 100]"
        echo "  step_interval_seconds: 0.5"
    } >"$f"
    mv "$f" "$S/steering.yaml"
}
policy 0

# --- the server: its whole command line is here --------------------------------------
# dnsperf sends from 127.0.0.1, which response rate limiting exempts by default
# (--rrl-exempt), so the soak measures the server, not the limiter.
SERVER_ARGS=(serve --config "$S/steering.yaml" --zones "$S/zones" --geo "$REPO/geo/country.mmdb"
    --probes "$S/probes" --state-dir "$S/state" --listen "127.0.0.1:$DNS_PORT" --listen "127.0.0.1:$SIDE_PORT"
    --api "127.0.0.1:$API_PORT" --api-token-file "$S/api-token" --reload-poll-ms 250 --steering-http off)
# glibc's default allocator settings, as operators run it (the geo database is reused
# across reloads while its file is unchanged, so reloads do not churn megabytes).
SERVER_ENV=(NO_COLOR=1)
env "${SERVER_ENV[@]}" "$STEERDNS_BIN" "${SERVER_ARGS[@]}" >"$TMP/server.log" 2>&1 &
SERVER_PID=$!
track "$SERVER_PID"
wait_for_dns -p "$SERVER_PID" "$DNS_PORT" ||
    { cat "$TMP/server.log" >&2; die "the server does not answer on 127.0.0.1:$DNS_PORT"; }

# --- the queries: varied ECS over the whole Internet, 20 % non-steered ---------------
# benches/queries.py draws a random /24 (IPv4) or /56 (IPv6) inside each listed prefix.
internet_prefixes >"$TMP/prefixes.tsv"
python3 benches/queries.py "$TMP/prefixes.tsv" "$TMP" "$QUERIES"

# What dig asks every second, alongside dnsperf: www.example.com for clients in GB, the
# US, Japan and an unknown network, each through its own resolver address (answers are
# consistent per resolver), 40 in all. Every answer must be one of the two CNAMEs.
for i in $(seq 40); do
    subnet=(81.2.69.0/24 216.160.83.0/24 2001:218::/32 10.0.0.0/8)
    echo "-b 127.64.1.$i www.example.com +subnet=${subnet[$((i % 4))]}"
done >"$TMP/cname-queries"
cnames_ok=0 cnames_bad=0 cnames_unanswered=0
check_cnames() {
    local out ok bad
    out=$(dig @127.0.0.1 -p "$SIDE_PORT" +short +time=1 +tries=2 -f "$TMP/cname-queries" 2>&1)
    # (grep -c exits 1 when it counts nothing: not an error here.)
    ok=$(grep -c -x -e 'example.map.fastly.net.' -e 'example.cdn.cloudflare.net.' <<<"$out" || true)
    bad=$( (grep -v -x -e 'example.map.fastly.net.' -e 'example.cdn.cloudflare.net.' -e ';;.*' <<<"$out" || true) | grep -c . || true)
    cnames_ok=$((cnames_ok + ok)) cnames_bad=$((cnames_bad + bad))
    cnames_unanswered=$((cnames_unanswered + 40 - ok - bad))
    if ((bad)); then
        grep -v -x -e 'example.map.fastly.net.' -e 'example.cdn.cloudflare.net.' -e ';;.*' <<<"$out" |
            sed 's/^/soak: wrong answer: /' | head -5 >&2
    fi
}

# --- helpers -------------------------------------------------------------------------
metric() { # family{labels} -> value (0 if absent), from /metrics
    curl -sS --max-time 2 "http://127.0.0.1:$API_PORT/metrics" |
        awk -v m="$1" 'index($0, m " ") == 1 {v = $2} END {print v + 0}'
}
health_transitions() {
    curl -sS --max-time 2 "http://127.0.0.1:$API_PORT/metrics" |
        awk '/^steerdns_health_transitions_total\{/ {v += $2} END {print v + 0}'
}
api() { # method path [json] -> prints the body, fails unless 2xx
    local args=(-sS --max-time 2 -f -X "$1" -H "Authorization: Bearer $TOKEN")
    [[ -n ${3:-} ]] && args+=(-H 'Content-Type: application/json' -d "$3")
    curl "${args[@]}" "http://127.0.0.1:$API_PORT$2"
}
DRAINS=(
    '{"name":"www.example.com","cdn":"cloudflare","where":["GB"],"reason":"soak"}'
    '{"name":"www.example.com","cdn":"fastly","where":["continent:EU"],"reason":"soak","immediate":true}'
    '{"name":"www.example.com","cdn":"cloudflare","reason":"soak","ttl_seconds":60}'
    '{"name":"www.example.com","cdn":"fastly","where":["US","81.2.69.0/24"],"reason":"soak"}'
)

# --- go ------------------------------------------------------------------------------
log "dnsperf -Q $QPS for $WARMUP s of warm-up + $DURATION s, $QUERIES queries (varied ECS, 20 % non-steered)"
# -q 50: at most 50 queries in flight (dnsperf's default is 100). With -q 200, runs on a
# machine busy with other builds lost a few queries per minute, every one of them
# dropped by the kernel on a full receive queue of the server's sockets (the UDP drops
# below) while the server was off the CPU: not a query steerdns saw and failed to
# answer. Fewer in flight keeps the queue short; 50 at about 0.5 ms each still carries
# 20,000 QPS.
dnsperf -s 127.0.0.1 -p "$DNS_PORT" -B -d "$TMP/mix.bin" -c 4 -q 50 -Q "$QPS" -l "$TOTAL" \
    >"$TMP/dnsperf.txt" 2>&1 &
DNSPERF_PID=$!
track "$DNSPERF_PID"

if ((HOSTILE)); then
    python3 tests/hostile-traffic.py "$DNS_PORT" "$API_PORT" "$TOTAL" "$SIDE_PORT" >"$TMP/hostile.json" 2>"$TMP/hostile.log" &
    HOSTILE_PID=$!
    track "$HOSTILE_PID"
    log "hostile traffic alongside: TCP slowloris (127.66.0.1), UDP garbage (127.67.0.1), API flood (127.68.0.1)"
fi
tcp_ok=0 tcp_bad=0
check_tcp() { # one query over TCP from a resolver of its own, as a slipped client retries
    local out
    out=$(dig @127.0.0.1 -p "$DNS_PORT" +tcp +short +time=2 +tries=2 -b "127.64.2.$((t % 200 + 1))" www.example.com +subnet=81.2.69.0/24 2>&1 | head -1)
    case $out in
    example.map.fastly.net. | example.cdn.cloudflare.net.) tcp_ok=$((tcp_ok + 1)) ;;
    *) tcp_bad=$((tcp_bad + 1)) && log "TCP dig at t=$t: $out" >&2 ;;
    esac
}

healthy=1 drain_id='' drain_ok=0 drain_failed=0 rss_start='' rss_max=0
START=$(date +%s.%N)
for ((t = 1; t <= TOTAL; t++)); do
    # 1. an edit of the policy: valid on even ticks, broken on odd ones
    policy "$t"
    # 2. the mock CDN
    if ((t % FLIP_EVERY == 0)); then
        if ((healthy)); then
            rm -f "$TMP/fastly/_health/v1.txt"
            healthy=0
        else
            cp probes/_health/v1.txt "$TMP/fastly/_health/"
            healthy=1
        fi
    fi
    # 3. a drain: added on odd ticks, removed on even ones
    if [[ -z $drain_id ]]; then
        if body=$(api POST /v1/drains "${DRAINS[$((t / 2 % ${#DRAINS[@]}))]}"); then
            drain_id=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])' <<<"$body")
            drain_ok=$((drain_ok + 1))
        else
            drain_failed=$((drain_failed + 1))
        fi
    else
        if api DELETE "/v1/drains/$drain_id" >/dev/null; then
            drain_ok=$((drain_ok + 1))
        else
            drain_failed=$((drain_failed + 1))
        fi
        drain_id=''
    fi
    # 4. what clients are answered: one of the two CNAMEs, whatever the churn
    check_cnames
    ((HOSTILE)) && check_tcp
    kill -0 "$SERVER_PID" 2>/dev/null || { tail -20 "$TMP/server.log" >&2; die "the server exited at t=$t s"; }
    # the end of this tick: one second after it started
    sleep "$(awk -v s="$START" -v t="$t" -v now="$(date +%s.%N)" 'BEGIN { d = s + t - now - 0.05; print (d > 0 ? d : 0) }')"
    # Sampled at the end of each tick, when this tick's reload (250 ms poll, then a load
    # of the policy, zones and the 8 MB geo database) is long over, so every sample is
    # taken at the same point of the churn.
    rss=$(rss_kb "$SERVER_PID")
    echo "$t $rss" >>"$TMP/rss.txt"
    ((rss > rss_max)) && rss_max=$rss
    if ((t == WARMUP)); then
        rss_start=$rss
        log "t=${t}s warm-up done: RSS $rss kB"
    elif ((t % 10 == 0)); then
        log "t=${t}s RSS $rss kB"
    fi
done
rss_end=$rss
# The memory depends on the threads (a UDP thread per core and address, a worker per
# core): both go in the report, so that a figure from another machine can be compared.
threads=$(awk '/^Threads:/ {print $2}' "/proc/$SERVER_PID/status")
# Datagrams the kernel dropped on a full receive queue (the drops column of
# /proc/net/udp, read while dnsperf still runs): on the server's sockets (local port
# DNS_PORT), and on dnsperf's (remote port DNS_PORT). Only dnsperf sends to DNS_PORT
# over UDP, so these are dnsperf's queries and answers: they say where lost queries
# went. The side port's (the garbage and the digs) are counted apart and excuse
# nothing.
udp_drops() { # local|remote [port]
    awk -v port="$(printf '%04X' "${2:-$DNS_PORT}")" -v col="$([[ $1 == local ]] && echo 2 || echo 3)" \
        'NR > 1 { split($col, a, ":"); if (a[2] == port) d += $NF } END { print d + 0 }' /proc/net/udp
}
drops_server=$(udp_drops local) drops_client=$(udp_drops remote)
applied=$(metric 'steerdns_config_reloads_total{result="applied"}')
refused=$(metric 'steerdns_config_reloads_total{result="refused"}')
transitions=$(health_transitions)
wait "$DNSPERF_PID" || die "dnsperf failed: $(cat "$TMP/dnsperf.txt")"
# The server's sockets are still open: read their drops again, now that every query has
# arrived (dnsperf's are gone with it, so theirs are the count read above).
drops_server=$(udp_drops local) drops_side=$(udp_drops local "$SIDE_PORT")
[[ -z ${rss_start:-} ]] && rss_start=$rss_end
over_source=$(metric 'steerdns_tcp_closed_total{reason="over-source-limit"}')
idle_closed=$(metric 'steerdns_tcp_closed_total{reason="idle"}')
hostile='{}'
if ((HOSTILE)); then
    wait "$HOSTILE_PID" || die "the hostile traffic failed: $(cat "$TMP/hostile.log")"
    hostile=$(cat "$TMP/hostile.json")
fi
hostile_stat() { python3 -c 'import json,sys; print(json.loads(sys.argv[1]).get(sys.argv[2], 0))' "$hostile" "$1"; }

# --- report --------------------------------------------------------------------------
num() { # dnsperf label -> its number
    awk -v l="$1" 'index($0, l ":") {sub(/^[^:]*:[ \t]*/, ""); print $1 + 0; exit}' "$TMP/dnsperf.txt"
}
rcode() { # name -> count in dnsperf's "Response codes:" line (0 if absent)
    awk -v r="$1" '/Response codes:/ { for (i = 1; i < NF; i++) if ($i == r) v = $(i + 1) } END { print v + 0 }' "$TMP/dnsperf.txt"
}
sent=$(num "Queries sent") completed=$(num "Queries completed") lost=$(num "Queries lost")
noerror=$(rcode NOERROR) nxdomain=$(rcode NXDOMAIN) servfail=$(rcode SERVFAIL)
qps=$(num "Queries per second")
growth=$(awk -v a="$rss_start" -v b="$rss_end" 'BEGIN { printf "%.1f", (b - a) * 100 / a }')

echo
log "$(date -u +%Y-%m-%dT%H:%MZ), $TOTAL s of dnsperf -Q $QPS ($WARMUP s warm-up), $VERSION"
printf '  %-28s %s\n' \
    "queries sent" "${sent:-0}" \
    "queries completed" "${completed:-0}" \
    "queries lost" "${lost:-?}" \
    "queries per second" "${qps:-?}" \
    "NOERROR" "${noerror:-0}" \
    "NXDOMAIN" "${nxdomain:-0}" \
    "SERVFAIL" "${servfail:-0}" \
    "RSS after warm-up" "$rss_start kB" \
    "RSS at the end" "$rss_end kB (lowest $(sort -k2n "$TMP/rss.txt" | head -1 | cut -d' ' -f2) kB, highest $rss_max kB, sampled every second)" \
    "RSS growth" "$growth %" \
    "cores / server threads" "$(nproc) / $threads" \
    "reloads applied" "$applied" \
    "reloads refused" "$refused" \
    "health transitions" "$transitions" \
    "drain API calls ok / failed" "$drain_ok / $drain_failed" \
    "UDP drops server / dnsperf" "$drops_server / $drops_client (kernel, full receive queue, dnsperf's port)" \
    "UDP drops on the side port" "$drops_side (the garbage and the digs: excuses no lost query)" \
    "dig answers ok / wrong / none" "$cnames_ok / $cnames_bad / $cnames_unanswered (one of the two CNAMEs)"
if ((HOSTILE)); then
    printf '  %-28s %s\n' \
        "hostile traffic" "$hostile" \
        "TCP digs ok / failed" "$tcp_ok / $tcp_bad (from 127.64.2.x, during the hostile traffic)" \
        "TCP closed at accept" "$over_source (over the per-source limit)" \
        "TCP closed idle" "$idle_closed"
fi
grep -E 'Response codes' "$TMP/dnsperf.txt" | sed 's/^ */  dnsperf: /'

# A query the kernel dropped on a full receive queue (the server off the CPU on a busy
# machine, as the book documents) never reached steerdns; any other loss is a failure.
# Only drops on dnsperf's own port count (the garbage goes to the side port).
if [[ ${lost:-x} != 0 ]]; then
    if [[ ${lost:-x} =~ ^[0-9]+$ ]] && ((lost <= drops_server + drops_client)); then
        log "$lost queries lost, all accounted for by the kernel's receive-queue drops ($drops_server + $drops_client)"
    else
        fail "$lost queries lost, $((drops_server + drops_client)) of them dropped by the kernel"
    fi
fi
((cnames_bad == 0)) || fail "$cnames_bad dig answers were not one of the two CNAMEs"
((cnames_ok >= TOTAL * 40 * 9 / 10)) || fail "only $cnames_ok of $((TOTAL * 40)) dig queries answered with a CNAME"
((${servfail:-0} == 0)) || fail "$servfail SERVFAIL"
((${completed:-0} > 0)) || fail "no query completed"
awk -v g="$growth" -v m="$MAX_RSS_GROWTH" 'BEGIN { exit !(g < m) }' || fail "RSS grew $growth % (limit $MAX_RSS_GROWTH %)"
((rss_start <= MAX_RSS_KB && rss_end <= MAX_RSS_KB)) ||
    fail "RSS $rss_start kB after the warm-up, $rss_end kB at the end (limit $MAX_RSS_KB kB)"
((applied >= MIN_EACH)) || fail "only $applied reloads applied (want $MIN_EACH)"
((refused >= MIN_EACH)) || fail "only $refused reloads refused (want $MIN_EACH)"
((transitions >= MIN_TRANSITIONS)) || fail "only $transitions health transitions (want $MIN_TRANSITIONS): the mock CDN flips did not fail over"
((drain_failed == 0 && drain_ok >= MIN_EACH)) || fail "drain API calls: $drain_ok ok, $drain_failed failed"
if ((HOSTILE)); then
    ((tcp_bad == 0 && tcp_ok == TOTAL)) || fail "TCP digs from another address: $tcp_ok ok, $tcp_bad failed"
    ((over_source > 0)) || fail "no TCP connection closed over the per-source limit: was the slowloris running?"
    ((idle_closed > 0)) || fail "no TCP connection closed as idle: was the slowloris running?"
    (($(hostile_stat api_opened) > 0 && $(hostile_stat udp_garbage_sent) > 0)) ||
        fail "the API flood or the UDP garbage did not run: $hostile"
    (($(hostile_stat api_spread_closed_by_server) > 0)) ||
        fail "the API flood spread over one /24 was never cut at 32: $hostile"
    (($(hostile_stat amplify_rounds) > 0 && $(hostile_stat amplify_incomplete) == 0)) ||
        fail "the TCP amplification lost answers or did not run: $hostile"
fi
if ((FAILED)); then
    tail -5 "$TMP/server.log" | sed 's/^/soak: server log: /'
    exit 1
fi
log "passed"
