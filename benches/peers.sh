#!/usr/bin/env bash
# Side-by-side benchmark: steerdns, gdnsd and PowerDNS (LUA records, shared mode) answering
# the same steering job (../shared/peers/README.md) on loopback, measured with dnsperf.
#
#   benches/peers.sh [--quick]
#
# Environment:
#   RUNS=3          repetitions per server and mix (median reported); --quick: 1
#   DURATION=10     seconds per throughput run; --quick: 3
#   LAT_DURATION=5  seconds of the fixed-rate latency pass (-Q $LAT_QPS); --quick: 3
#   LAT_QPS=10000
#   QUERIES=20000   messages in the binary query files
#   SERVERS="steerdns gdnsd pdns"   which servers, in interleaving order; also
#                   steerdns-tap100 and steerdns-tap1: steerdns with --dnstap to a real
#                   collector (fstrm_capture, writing to /dev/null, pinned with dnsperf)
#                   at --dnstap-sample 100 and 1, run on the ecs mix only (the dnstap
#                   column: SERVERS="steerdns steerdns-tap100 steerdns-tap1" MIXES=ecs)
#   MIXES="plain ecs mix tcp dnssec"   tcp: the ecs queries over TCP (dnsperf -m tcp:
#                   each of the 4 clients keeps one connection with up to 200 queries
#                   pipelined, as a resolver does; lost counts what a closed connection
#                   dropped); dnssec: the ecs queries with DO=1, the zone signed (steerdns:
#                   a fresh ECDSA P-256 key, answers pre-signed; PowerDNS: `pdnsutil
#                   secure-zone`, ECDSA P-256, LUA answers signed live; gdnsd signs
#                   nothing and sits it out)
#   UDP_SOCKETS=    --udp-sockets for steerdns (default: its own default)
#   STEERDNS_BIN    the binary (default: built with cargo build --release, in
#                   CARGO_TARGET_DIR if set)
#   SHARED=../shared  where peers/ is (outside this repository)
#   GEO=geo/country.mmdb  the database every server is given: steerdns reads it as it
#                   is; gdnsd and PowerDNS a GeoIP2-Country copy of it, node for node
#                   (benches/scope/scope.py geoip2), and the ECS queries are drawn from
#                   its networks with data
#   KEEP=1          keep the temp dir (logs, rendered configs, raw dnsperf outputs)
#
# Every server is pinned to CPU 1 and dnsperf to CPU 0. Runs are interleaved
# (A B C A B C ...) and the medians printed as a markdown table. Server CPU per answered
# query = (utime + stime of the server over the run) / queries completed; RSS is the
# server's VmRSS after each throughput run (median, MB).
# Needs root for apt-get only when dnsperf, or a server of SERVERS, is missing.
# Quickest: SERVERS="steerdns gdnsd" benches/peers.sh --quick (about a minute once built).
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode
script_init peers.sh
LOG_STDERR=1
QUICK=0
[[ ${1:-} == --quick ]] && QUICK=1
if ((QUICK)); then
    RUNS=${RUNS:-1} DURATION=${DURATION:-3} LAT_DURATION=${LAT_DURATION:-3}
fi
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
LAT_DURATION=${LAT_DURATION:-5}
LAT_QPS=${LAT_QPS:-10000}
QUERIES=${QUERIES:-20000}
SERVERS=${SERVERS:-steerdns gdnsd pdns}
MIXES=${MIXES:-plain ecs mix tcp dnssec}
SHARED=${SHARED:-$REPO/../shared}
GEO=${GEO:-$REPO/geo/country.mmdb}
PORT_STEERDNS=${PORT_STEERDNS:-25353}
PORT_GDNSD=${PORT_GDNSD:-25354}
PORT_PDNS=${PORT_PDNS:-25355}
PORT_TAP100=${PORT_TAP100:-25356}
PORT_TAP1=${PORT_TAP1:-25357}
HEALTH_PORT=${HEALTH_PORT:-28080}
DNSPERF_ARGS=(-c 4 -T 1 -q 200)

# --- prerequisites -------------------------------------------------------------------
install_missing dnsperf dig python3
case " $SERVERS " in *" gdnsd "*) install_missing gdnsd ;; esac
case " $SERVERS " in *" steerdns-tap"*) command -v fstrm_capture >/dev/null || apt_install fstrm-bin ;; esac
case " $SERVERS " in
*" pdns "*)
    missing=()
    command -v pdns_server >/dev/null || missing+=(pdns-server)
    [[ -e /usr/lib/x86_64-linux-gnu/pdns/libbindbackend.so || -n $(find /usr/lib -name 'libbindbackend.so' 2>/dev/null) ]] || missing+=(pdns-backend-bind)
    [[ -n $(find /usr/lib -name 'libgeoipbackend.so' 2>/dev/null) ]] || missing+=(pdns-backend-geoip)
    ((${#missing[@]} == 0)) || apt_install "${missing[@]}"
    ;;
esac
[[ -r $GEO ]] || die "no $GEO"
build_release
make_tmp peers
# The peers read GeoIP2-Country: the same database in that shape, and its networks with
# data for the query files.
GEODB=$TMP/GeoIP2-Country.mmdb
PREFIXES=$TMP/prefixes.tsv
log "writing a GeoIP2-Country copy of $GEO for the peers"
python3 "$REPO/benches/scope/scope.py" geoip2 --db "$GEO" --out "$GEODB" --prefixes "$PREFIXES"

render() { # template output threads lua_mode
    sed -e "s|@PORT@|$5|g" -e "s|@RUN@|$3|g" -e "s|@GEODB@|$GEODB|g" \
        -e "s|@HEALTH_PORT@|$HEALTH_PORT|g" -e "s|@THREADS@|1|g" -e "s|@LUA_MODE@|$4|g" \
        "$1" >"$2"
}

# --- the health endpoint both peers check --------------------------------------------
mkdir -p "$TMP/www/health"
for c in example.map.fastly.net example.cdn.cloudflare.net; do
    echo healthy-v3 >"$TMP/www/health/$c"
done
# 127.0.0.2 is PowerDNS's always-healthy sentinel (see the zone template). Pinned to
# dnsperf's CPU, away from the servers'.
for a in 127.0.0.1 127.0.0.2; do
    CDN_CPU=0 start_cdn health "$TMP/www" "$a" "$HEALTH_PORT"
done

# --- steerdns ------------------------------------------------------------------------
S=$TMP/steerdns
mkdir -p "$S/zones" "$S/probes" "$S/state"
cat >"$S/steering.yaml" <<'YAML'
# The peers' policy (../shared/peers/README.md).
hostname: www.example.com
ttl: 30
cdns:
  fastly:     { cname: example.map.fastly.net. }
  cloudflare: { cname: example.cdn.cloudflare.net. }
regions:
  - match: [GB, IE, DE, FR, NL, ES, IT]
    weights: { fastly: 90, cloudflare: 10 }
  - match: [US, CA, MX]
    weights: { fastly: 85, cloudflare: 15 }
  - match: [AU, NZ, SG, JP]
    weights: { cloudflare: 90, fastly: 10 }
  - match: ["*"]
    weights: { fastly: 50, cloudflare: 50 }
YAML
# The peers' zone without the steered name.
grep -v -E '^(www|[[:space:]]+")' "$SHARED/peers/pdns/example.com.zone" >"$S/zones/example.com.zone"
# Signed for the dnssec mix (answers to DO=0 queries are the same bytes as unsigned).
if [[ " $MIXES " == *" dnssec "* ]]; then
    "$STEERDNS_BIN" dnssec keygen example.com --keys "$S/keys" >/dev/null
    printf 'dnssec:\n  keys: keys\n' >>"$S/steering.yaml"
fi
STEERDNS_ARGS=(serve --config "$S/steering.yaml" --zones "$S/zones" --geo "$GEO"
    --probes "$S/probes" --state-dir "$S/state" --api off --reload-poll-ms 0 --steering-http off
    --listen "127.0.0.1:$PORT_STEERDNS")
[[ -n ${UDP_SOCKETS:-} ]] && STEERDNS_ARGS+=(--udp-sockets "$UDP_SOCKETS")

# --- gdnsd ---------------------------------------------------------------------------
G=$TMP/gdnsd
mkdir -p "$G/zones" "$G/run" "$G/state"
render "$SHARED/peers/gdnsd/config" "$G/config" "$G" x "$PORT_GDNSD"
render "$SHARED/peers/gdnsd/zones/example.com" "$G/zones/example.com" "$G" x "$PORT_GDNSD"

# --- PowerDNS ------------------------------------------------------------------------
P=$TMP/pdns
mkdir -p "$P"
for f in pdns.conf named.conf example.com.zone; do
    render "$SHARED/peers/pdns/$f" "$P/$f" "$P" shared "$PORT_PDNS"
done
# Signed for the dnssec mix: the bind backend's DNSSEC database, the zone secured
# (PowerDNS signs every answer, its LUA records' included, as it sends it).
if [[ " $MIXES " == *" dnssec "* && " $SERVERS " == *" pdns "* ]]; then
    echo "bind-dnssec-db=$P/dnssec.db" >>"$P/pdns.conf"
    pdnsutil --config-dir="$P" create-bind-db "$P/dnssec.db" >"$TMP/pdnsutil.log" 2>&1 ||
        die "pdnsutil create-bind-db failed: $(cat "$TMP/pdnsutil.log")"
    pdnsutil --config-dir="$P" secure-zone example.com >>"$TMP/pdnsutil.log" 2>&1 ||
        die "pdnsutil secure-zone failed: $(cat "$TMP/pdnsutil.log")"
fi

declare -A PORT=([steerdns]=$PORT_STEERDNS [gdnsd]=$PORT_GDNSD [pdns]=$PORT_PDNS
    [steerdns-tap100]=$PORT_TAP100 [steerdns-tap1]=$PORT_TAP1)
declare -A SPID

start() {
    case $1 in
    steerdns) taskset -c 1 "$STEERDNS_BIN" "${STEERDNS_ARGS[@]}" >"$TMP/steerdns.log" 2>&1 & ;;
    steerdns-tap*)
        # The collector first, on dnsperf's CPU; the frames are read and thrown away.
        taskset -c 0 fstrm_capture -t protobuf:dnstap.Dnstap -u "$TMP/$1.sock" -w /dev/null \
            >"$TMP/$1-fstrm.log" 2>&1 &
        track $!
        local waited=0
        while [[ ! -S $TMP/$1.sock ]] && ((waited++ < 100)); do sleep 0.05; done
        mkdir -p "$S/state-$1"
        # steerdns's arguments with this one's port and state directory.
        local args=() a
        for a in "${STEERDNS_ARGS[@]}"; do
            case $a in
            "127.0.0.1:$PORT_STEERDNS") args+=("127.0.0.1:${PORT[$1]}") ;;
            "$S/state") args+=("$S/state-$1") ;;
            *) args+=("$a") ;;
            esac
        done
        taskset -c 1 "$STEERDNS_BIN" "${args[@]}" \
            --dnstap "unix:$TMP/$1.sock" --dnstap-sample "${1#steerdns-tap}" >"$TMP/$1.log" 2>&1 &
        ;;
    gdnsd) taskset -c 1 gdnsd -c "$G" -f start >"$TMP/gdnsd.log" 2>&1 & ;;
    pdns) taskset -c 1 pdns_server --config-dir="$P" >"$TMP/pdns.log" 2>&1 & ;;
    esac
    SPID[$1]=$!
    track $!
}

q() { # server name type [dig options]
    dig +tries=1 +time=2 @127.0.0.1 -p "${PORT[$1]}" "$2" "$3" "${@:4}"
}

wait_up() {
    wait_for_dns -p "${SPID[$1]}" -t 20 "${PORT[$1]}" && return 0
    cat "$TMP/$1.log" >&2
    kill -0 "${SPID[$1]}" 2>/dev/null || die "$1 exited"
    die "$1 does not answer on port ${PORT[$1]}"
}

# Counts fastly answers out of N queries from a client subnet, each from another
# resolver (127.64.0.x): steerdns answers one resolver consistently, so N queries from
# one source would measure one draw, not the shares.
fastly_share() { # server subnet n
    local i n=$3 f=0 ans
    for i in $(seq 1 "$n"); do
        ans=$(q "$1" www.example.com A +subnet="$2" +short +norec -b "127.64.$((i / 250)).$((i % 250 + 1))" | head -1)
        case $ans in
        example.map.fastly.net.) f=$((f + 1)) ;;
        example.cdn.cloudflare.net.) ;;
        *) die "$1: www.example.com from $2 answered '$ans'" ;;
        esac
    done
    echo "$f"
}

# Picks subnets for the check from the bench DB's prefix list, one per region.
pick_subnet() { # country
    local p
    p=$(awk -v c="$1" -F'\t' '$2 == c && $1 !~ /:/ {print $1; exit}' "$PREFIXES")
    python3 - "$p" <<'PY'
import ipaddress, sys
n = ipaddress.ip_network(sys.argv[1])
print(f"{n.network_address}/{max(24, n.prefixlen)}")
PY
}
pick_subnet6() {
    local p
    p=$(awk -v c="$1" -F'\t' '$2 == c && $1 ~ /:/ {print $1; exit}' "$PREFIXES")
    python3 - "$p" <<'PY'
import ipaddress, sys
n = ipaddress.ip_network(sys.argv[1])
print(f"{n.network_address}/{max(56, n.prefixlen)}")
PY
}

check_all() {
    local gb us au kr de6 s
    gb=$(pick_subnet GB) us=$(pick_subnet US) au=$(pick_subnet AU) kr=$(pick_subnet KR)
    de6=$(pick_subnet6 DE)
    [[ $de6 == */* && $de6 != None* ]] || de6=$(pick_subnet6 GB)
    for s in $SERVERS; do
        check_one "$s" "$gb 90" "$de6 90" "$us 85" "$au 10" "$kr 50"
    done
}

check_one() { # server "subnet want"...
    local s=$1 n=40 f c net want lo hi
    shift
    for c in "$@"; do
        read -r net want <<<"$c"
        f=$(fastly_share "$s" "$net" "$n")
        lo=$(((want - 25) * n / 100)) hi=$(((want + 25) * n / 100))
        ((lo < 0)) && lo=0
        if ((f < lo || f > hi)); then
            die "$s: $net gave fastly $f/$n, policy says about $want %"
        fi
        printf '%s' "$net fastly $f/$n; " >&2
    done
    local soa nx
    soa=$(q "$s" example.com SOA +short)
    [[ $soa == ns1.example.com.* ]] || die "$s: example.com SOA answered '$soa'"
    nx=$(q "$s" nx1.example.com A +norec | grep -o 'status: [A-Z]*')
    [[ $nx == "status: NXDOMAIN" ]] || die "$s: nx1.example.com gave $nx"
    if [[ " $MIXES " == *" dnssec "* && $s != gdnsd ]]; then
        q "$s" www.example.com A +dnssec +norec +subnet="$(pick_subnet GB)" | grep -q 'RRSIG.*CNAME' ||
            die "$s: no RRSIG on the steered CNAME with DO=1"
    fi
    echo "=> $s answers the policy" >&2
}

# --- query files ---------------------------------------------------------------------
python3 "$REPO/benches/queries.py" "$PREFIXES" "$TMP" "$QUERIES"

datafile() { # mix -> dnsperf args
    case $1 in
    plain) echo "-d $TMP/plain.txt" ;;
    ecs) echo "-B -d $TMP/ecs.bin" ;;
    mix) echo "-B -d $TMP/mix.bin" ;;
    tcp) echo "-B -d $TMP/ecs.bin -m tcp" ;;
    dnssec) echo "-B -d $TMP/ecs-do.bin" ;;
    esac
}

RESULTS=$TMP/results.tsv
: >"$RESULTS"

run_one() { # server mix rep
    local s=$1 m=$2 r=$3 pid=${SPID[$1]} out=$TMP/run-$1-$2-$3.txt
    local t0 t1 c0 c1
    kill -0 "$pid" 2>/dev/null || die "$s died (see $TMP/$s.log)"
    c0=$(cpu_ticks "$pid") t0=$(date +%s.%N)
    # shellcheck disable=SC2046
    taskset -c 0 dnsperf -s 127.0.0.1 -p "${PORT[$s]}" $(datafile "$m") "${DNSPERF_ARGS[@]}" \
        -l "$DURATION" >"$out" 2>&1 || true
    c1=$(cpu_ticks "$pid") t1=$(date +%s.%N)
    local rss
    rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status")
    local lat=$TMP/lat-$1-$2-$3.txt
    # shellcheck disable=SC2046
    taskset -c 0 dnsperf -s 127.0.0.1 -p "${PORT[$s]}" $(datafile "$m") "${DNSPERF_ARGS[@]}" \
        -Q "$LAT_QPS" -l "$LAT_DURATION" -v >"$lat" 2>&1 || true
    python3 - "$out" "$lat" "$c0" "$c1" "$t0" "$t1" "$(clock_ticks)" "$s" "$m" "$r" "$rss" >>"$RESULTS" <<'PY'
import re, sys
out, lat, c0, c1, t0, t1, hz, s, m, r, rss = sys.argv[1:]
text = open(out).read()
def num(label):
    g = re.search(label + r":\s+([0-9.]+)", text)
    return float(g.group(1)) if g else float("nan")
completed = num("Queries completed")
lost = num("Queries lost")
qps = num("Queries per second")
cpu = (float(c1) - float(c0)) / float(hz)
# dnsperf waits up to its timeout for lost queries after the time limit: the server is
# idle then, so busy = CPU over the run / dnsperf's run time (not the wall clock).
wall = num("Run time \\(s\\)")
if wall != wall:
    wall = float(t1) - float(t0)
lats = []
for line in open(lat, errors="replace"):
    # dnsperf -v: "> NOERROR www.example.com A 0.000123"
    if line.startswith(">"):
        try:
            lats.append(float(line.split()[-1]))
        except ValueError:
            pass
lats.sort()
def pct(p):
    return lats[min(len(lats) - 1, int(p * len(lats)))] * 1e6 if lats else float("nan")
us = cpu / completed * 1e6 if completed else float("nan")
print(f"{s}\t{m}\t{r}\t{qps:.0f}\t{cpu / wall:.3f}\t{us:.2f}\t{lost:.0f}\t{pct(0.5):.0f}\t{pct(0.99):.0f}\t{int(rss) / 1000:.1f}")
PY
    log "$(tail -1 "$RESULTS")"
}

# --- go ------------------------------------------------------------------------------
for s in $SERVERS; do start "$s"; done
for s in $SERVERS; do wait_up "$s"; done
sleep 2 # let the peers' health checks settle
check_all

for m in $MIXES; do
    for r in $(seq 1 "$RUNS"); do
        for s in $SERVERS; do
            [[ $m == dnssec && $s == gdnsd ]] && continue
            [[ $s == steerdns-tap* && $m != ecs ]] && continue
            run_one "$s" "$m" "$r"
        done
    done
done

# --- report --------------------------------------------------------------------------
version() {
    case $1 in
    # The binary's own commit (`--version`), not the checkout's: STEERDNS_BIN may be
    # another build (a before/after comparison).
    steerdns) echo "steerdns $("$STEERDNS_BIN" --version 2>/dev/null | sed -n 's/.*(\(.*\))/\1/p' | cut -c1-7)${UDP_SOCKETS:+, --udp-sockets $UDP_SOCKETS}" ;;
    steerdns-tap*) echo "$(version steerdns), --dnstap-sample ${1#steerdns-tap} to fstrm_capture" ;;
    gdnsd) echo "gdnsd $(gdnsd -h 2>&1 | grep -o 'gdnsd version [0-9.]*' | head -1 | cut -d' ' -f3)" ;;
    pdns) echo "PowerDNS $(pdns_server --version 2>&1 | grep -o 'Server [0-9.]*' | head -1 | cut -d' ' -f2), LUA shared" ;;
    esac
}
echo
echo "dnsperf ${DNSPERF_ARGS[*]}, ${DURATION} s per run, median of $RUNS interleaved runs;" \
    "server on CPU 1, dnsperf on CPU 0; latency: -Q $LAT_QPS for ${LAT_DURATION} s; $QUERIES queries per binary file"
echo
echo "| server | mix | QPS | server CPU busy | server CPU per answered query | lost | p50 at ${LAT_QPS} QPS | p99 at ${LAT_QPS} QPS | RSS |"
echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
python3 - "$RESULTS" "$SERVERS" "$MIXES" <<'PY' | while IFS=$'\t' read -r s rest; do echo "| $(version "$s") $rest"; done
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
for m in sys.argv[3].split():
    for s in sys.argv[2].split():
        rs = [r for r in rows if r[0] == s and r[1] == m]
        if not rs:
            continue
        med = lambda i: statistics.median(float(r[i]) for r in rs)
        print(f"{s}\t| {m} | {med(3):,.0f} | {med(4) * 100:.0f} % | {med(5):.2f} µs | {med(6):,.0f} | {med(7):.0f} µs | {med(8):.0f} µs | {med(9):.1f} MB |")
PY
