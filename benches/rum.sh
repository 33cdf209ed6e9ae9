#!/usr/bin/env bash
# Beacon throughput: wrk posting performance beacons (`POST /rum/{name}`, 64 samples
# each, from random /24s of 100.64.0.0/10 through a trusted proxy) to steerdns pinned
# on one CPU core. Reports beacons and samples per second and per CPU-second of the
# server (its user + system time, from /proc); the target is at least 50,000 samples
# per second on one core. A benchmark, not a test: it asserts nothing.
#
#   bash benches/rum.sh                       # 3 rounds of 10 s, 1 wrk thread, 16 connections
#   ROUNDS=1 SECONDS_EACH=5 bash benches/rum.sh
#
# Needs wrk, taskset, curl, python3.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode
LOG_STDERR=1
script_init rum
require wrk taskset curl python3
make_tmp rum
build_release

ROUNDS=${ROUNDS:-3}
SECONDS_EACH=${SECONDS_EACH:-10}
CONNECTIONS=${CONNECTIONS:-16}
SAMPLES=64
CORE=${CORE:-0}

cat >"$TMP/steering.yaml" <<'YAML'
hostname: www.example.com
ttl: 30
cdns:
  fastly: { cname: example.map.fastly.net. }
  cloudflare: { cname: example.cdn.cloudflare.net. }
regions:
  - name: gb
    match: [GB, 100.64.0.0/10]
    weights: { fastly: 90, cloudflare: 10 }
    performance: { metric: ttfb_p75, shift_period_seconds: 1, window_seconds: 10 }
  - match: ["*"]
    weights: { fastly: 50, cloudflare: 50 }
YAML
mkdir -p "$TMP/probes" "$TMP/state"
cat >"$TMP/beacon.lua" <<LUA
local s = '{"cdn":"fastly","ttfb_ms":80,"throughput_bps":5000000,"ok":true},'
wrk.method = "POST"
wrk.body = '{"samples":[' .. string.rep(s, $SAMPLES - 1) .. '{"cdn":"cloudflare","ttfb_ms":78,"ok":true}]}'
wrk.headers["Content-Type"] = "application/json"
request = function()
  local xff = string.format("100.%d.%d.7", 64 + math.random(0, 63), math.random(0, 255))
  return wrk.format(nil, nil, { ["X-Forwarded-For"] = xff })
end
LUA

SP=$(free_port)
AP=$(free_port)
DP=$(free_port)
taskset -c "$CORE" "$STEERDNS_BIN" serve --config "$TMP/steering.yaml" --zones "$REPO/zones" \
    --probes "$TMP/probes" --geo "$REPO/geo/country.mmdb" --listen "127.0.0.1:$DP" --api "127.0.0.1:$AP" --udp-sockets 1 \
    --state-dir "$TMP/state" --steering-http "127.0.0.1:$SP" --trusted-proxies 127.0.0.1/32 \
    >"$TMP/steerdns.log" 2>&1 &
STEERDNS=$!
track "$STEERDNS"
for _ in $(seq 100); do
    curl -fs -o /dev/null "http://127.0.0.1:$AP/healthz" 2>/dev/null && break
    sleep 0.1
done
code=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H 'X-Forwarded-For: 100.64.0.7' \
    --data '{"samples":[{"cdn":"fastly","ttfb_ms":80}]}' "http://127.0.0.1:$SP/rum/www.example.com")
[[ $code == 204 ]] || die "a beacon got $code: $(cat "$TMP/steerdns.log")"

# samples RESULT: steerdns_rum_samples_total{result=RESULT} now.
samples() {
    curl -fs "http://127.0.0.1:$AP/metrics" |
        awk -v r="steerdns_rum_samples_total{result=\"$1\"}" '$1 == r { print $2 }' | tail -1
}

log "steerdns on core $CORE, :$SP; $ROUNDS rounds of ${SECONDS_EACH} s, wrk -t1 -c$CONNECTIONS, $SAMPLES samples a beacon"
printf '%-6s %9s %11s %8s %12s %14s\n' round beacons samples cpu_s samples/s samples/cpu_s
for round in $(seq "$ROUNDS"); do
    before=$(cpu_ticks "$STEERDNS")
    a0=$(samples accepted)
    r0=$(samples refused_share)
    out=$(wrk -t1 -c"$CONNECTIONS" -d"${SECONDS_EACH}s" -s "$TMP/beacon.lua" \
        "http://127.0.0.1:$SP/rum/www.example.com")
    after=$(cpu_ticks "$STEERDNS")
    a1=$(samples accepted)
    r1=$(samples refused_share)
    n=$(awk '/requests in/ { print $1 }' <<<"$out")
    bad=$(awk '/Non-2xx/ { print $NF }' <<<"$out")
    [[ -z $bad ]] || log "round $round: $bad answers were not 204"
    python3 - "$round" "$n" "${a0:-0}" "${a1:-0}" "${r0:-0}" "${r1:-0}" "$before" "$after" "$(clock_ticks)" "$SECONDS_EACH" <<'PY'
import sys
rnd, n = sys.argv[1], int(sys.argv[2])
a0, a1, r0, r1 = (float(x) for x in sys.argv[3:7])
cpu = (int(sys.argv[8]) - int(sys.argv[7])) / int(sys.argv[9])
secs = float(sys.argv[10])
samples = (a1 - a0) + (r1 - r0)
print(f"{rnd:<6} {n:>9} {samples:>11.0f} {cpu:>8.2f} {samples / secs:>12,.0f} {samples / max(cpu, 0.01):>14,.0f}")
PY
done
