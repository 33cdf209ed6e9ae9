#!/usr/bin/env bash
# Scale, end to end: the release binary serving the demo policy, and
# serving 1,000 steered names × 20 regions (benches/scale_policy.py), both with the
# full-Internet geo database geo/country.mmdb. Reports for each the resident memory
# (VmRSS) after start and after load, and the server CPU per answered query under the
# same fixed dnsperf rate with varied ECS (the demo: www.example.com; the scale policy:
# a random one of its 1,000 names per query).
#
#   bash benches/scale.sh
#
# Environment:
#   RUNS=3          interleaved repetitions (demo, scale, demo, scale, ...); medians
#   DURATION=10     seconds per dnsperf run
#   QPS=20000       dnsperf -Q
#   NAMES=1000 REGIONS=20
#   STEERDNS_BIN    the binary (default: built with cargo build --release, in
#                   CARGO_TARGET_DIR if set)
#   KEEP=1          keep the scratch directory
#
# Quickest: RUNS=1 DURATION=3 bash benches/scale.sh (about 15 s once built).
#
# Each server is pinned to CPU 1 and dnsperf to CPU 0. Server CPU per answered query =
# (utime + stime of the server over the run) / queries dnsperf saw answered. Traffic
# goes to 127.0.0.1 only; every process started is stopped on exit.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode
script_init scale.sh
LOG_STDERR=1
RUNS=${RUNS:-3}
DURATION=${DURATION:-10}
QPS=${QPS:-20000}
NAMES=${NAMES:-1000}
REGIONS=${REGIONS:-20}

install_missing dnsperf dig python3
build_release
make_tmp scale

# --- inputs and queries --------------------------------------------------------------
# Client subnets all over the Internet (a random /24 or /56 inside each prefix).
internet_prefixes >"$TMP/prefixes.tsv"
python3 benches/queries.py "$TMP/prefixes.tsv" "$TMP" 20000
PREFIXES=$TMP/prefixes.tsv python3 benches/scale_policy.py "$TMP/scale" "$NAMES" "$REGIONS"
mkdir -p "$TMP/demo" && cp -r steering.yaml zones "$TMP/demo/"

declare -A PORT SPID DATA
DATA[demo]=$TMP/ecs.bin
DATA[scale]=$TMP/scale/scale.bin

start() { # demo|scale
    local d=$TMP/$1
    PORT[$1]=$(free_port)
    mkdir -p "$d/state"
    taskset -c 1 "$STEERDNS_BIN" serve --config "$d/steering.yaml" --zones "$d/zones" \
        --geo "$REPO/geo/country.mmdb" --probes "$d/no-probes" --state-dir "$d/state" \
        --listen "127.0.0.1:${PORT[$1]}" --api "127.0.0.1:$(free_port)" --reload-poll-ms 0 --steering-http off \
        >"$TMP/$1.log" 2>&1 &
    SPID[$1]=$!
    track $!
    wait_for_dns -p "${SPID[$1]}" "${PORT[$1]}" && return 0
    cat "$TMP/$1.log" >&2
    die "$1 does not answer"
}

start demo
start scale
sleep 1
declare -A RSS0
for s in demo scale; do RSS0[$s]=$(rss_kb "${SPID[$s]}"); done

RESULTS=$TMP/results.tsv
: >"$RESULTS"
run_one() { # demo|scale rep
    local s=$1 out=$TMP/run-$1-$2.txt c0 c1
    c0=$(cpu_ticks "${SPID[$s]}")
    taskset -c 0 dnsperf -s 127.0.0.1 -p "${PORT[$s]}" -B -d "${DATA[$s]}" -c 4 -q 200 \
        -Q "$QPS" -l "$DURATION" >"$out" 2>&1 || die "dnsperf failed: $(cat "$out")"
    c1=$(cpu_ticks "${SPID[$s]}")
    python3 - "$out" "$c0" "$c1" "$(clock_ticks)" "$s" >>"$RESULTS" <<'PY'
import re, sys
out, c0, c1, hz, s = sys.argv[1:]
text = open(out).read()
def num(label):
    g = re.search(label + r":\s+([0-9.]+)", text)
    return float(g.group(1)) if g else float("nan")
done, lost = num("Queries completed"), num("Queries lost")
noerror = re.search(r"NOERROR (\d+)", text)
cpu = (float(c1) - float(c0)) / float(hz)
print(f"{s}\t{cpu / done * 1e6:.2f}\t{done:.0f}\t{lost:.0f}\t{noerror.group(1) if noerror else 0}")
PY
    log "$(tail -1 "$RESULTS")"
}
for r in $(seq 1 "$RUNS"); do
    run_one demo "$r"
    run_one scale "$r"
done

echo
echo "dnsperf -c 4 -q 200 -Q $QPS, ${DURATION} s per run, median of $RUNS interleaved runs;" \
    "server on CPU 1, dnsperf on CPU 0; $(git describe --always --dirty 2>/dev/null || echo '?')"
echo
echo "| policy | server CPU per answered query | lost | RSS after start | RSS after load |"
echo "| --- | ---: | ---: | ---: | ---: |"
for s in demo scale; do
    label=$([[ $s == demo ]] && echo "demo (1 name × 4 regions)" || echo "$NAMES names × $REGIONS regions")
    python3 - "$RESULTS" "$s" "$label" "${RSS0[$s]}" "$(rss_kb "${SPID[$s]}")" <<'PY'
import statistics, sys
path, s, label, rss0, rss1 = sys.argv[1:]
rows = [l.split("\t") for l in open(path) if l.startswith(s + "\t")]
us = statistics.median(float(r[1]) for r in rows)
lost = sum(int(r[3]) for r in rows)
print(f"| {label} | {us:.2f} µs | {lost} | {int(rss0) / 1024:.1f} MiB | {int(rss1) / 1024:.1f} MiB |")
PY
done
# On a shared machine the load drifts between runs: the ratio within each demo, scale
# pair (run back to back) is steadier than the ratio of the medians.
python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]) if l.strip()]
demo = [float(r[1]) for r in rows if r[0] == "demo"]
scale = [float(r[1]) for r in rows if r[0] == "scale"]
ratios = [b / a for a, b in zip(demo, scale)]
print()
print("scale / demo CPU per query, per pair: " + ", ".join(f"{r:.2f}" for r in ratios)
      + f"; median {statistics.median(ratios):.2f}")
PY
