#!/usr/bin/env bash
# Failover drill against the release binary, as an operator would run it with dig:
# two local web servers stand in for the CDNs, fastly's canary object is removed (it
# answers 404), and the answer shares sampled every 0.3 s show traffic leaving fastly in
# steps and coming back when the object is restored.
#
#   bash tests/drill.sh
#
# Sends traffic only to 127.0.0.1. Exits non-zero if traffic does not move.
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
command -v cargo >/dev/null || { [ -f "$HOME/.cargo/env" ] && . "$HOME/.cargo/env"; }
for tool in dig python3; do
    command -v $tool >/dev/null || { echo "drill: $tool is not installed" >&2; exit 1; }
done

TMP=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cargo build --release --quiet || { echo "drill: build failed" >&2; exit 1; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
FASTLY_PORT=$(free_port); CLOUDFLARE_PORT=$(free_port); DNS_PORT=$(free_port); API_PORT=$(free_port)

# The two "CDNs": each serves the canary object.
for cdn in fastly cloudflare; do
    mkdir -p "$TMP/$cdn/_health" && cp probes/_health/v1.txt "$TMP/$cdn/_health/"
done
python3 -m http.server --bind 127.0.0.1 "$FASTLY_PORT" --directory "$TMP/fastly" >/dev/null 2>&1 & PIDS+=($!)
python3 -m http.server --bind 127.0.0.1 "$CLOUDFLARE_PORT" --directory "$TMP/cloudflare" >/dev/null 2>&1 & PIDS+=($!)

# The demo policy with a fast drill timeline: steps 50 % then 100 %, one second apart;
# probes every 200 ms, down after 2 bad rounds, up after 3 good ones.
mkdir -p "$TMP/probes"
sed -e 's/step_interval_seconds: 90/step_interval_seconds: 1/' steering.yaml >"$TMP/steering.yaml"
for cdn in fastly:$FASTLY_PORT cloudflare:$CLOUDFLARE_PORT; do
    cat >"$TMP/probes/${cdn%%:*}.yaml" <<YAML
url: http://127.0.0.1:${cdn##*:}/_health/v1.txt
expect_body: healthy-v1
timeout_ms: 500
interval_seconds: 0.2
down_after: 2
up_after: 3
YAML
done

NO_COLOR=1 target/release/steerdns serve --config "$TMP/steering.yaml" --probes "$TMP/probes" \
    --listen "127.0.0.1:$DNS_PORT" --api "127.0.0.1:$API_PORT" --state-dir "$TMP/state" \
    >"$TMP/server.log" 2>&1 & PIDS+=($!)
for _ in $(seq 100); do
    dig @127.0.0.1 -p "$DNS_PORT" +time=1 +tries=1 example.com SOA 2>/dev/null | grep -q 'status: NOERROR' && break
    sleep 0.1
done

# 100 queries from a GB client (fastly 90 %, cloudflare 10 %): fastly's share in percent.
for _ in $(seq 100); do echo "www.example.com +subnet=81.2.69.0/24"; done >"$TMP/queries"
share() {
    dig @127.0.0.1 -p "$DNS_PORT" +short +time=1 +tries=1 -f "$TMP/queries" | grep -c '^example.map.fastly.net.$'
}
START=$(date +%s.%N)
sample() {
    local s; s=$(share)
    printf 'drill: t=%5.1fs  fastly %3d %%  cloudflare %3d %%  %s\n' "$(awk "BEGIN { print $(date +%s.%N) - $START }")" "$s" $((100 - s)) "$1"
    LAST=$s
}
# Samples every 0.3 s until `test $LAST $2` holds twice in a row, or $3 seconds.
watch_until() {
    local hits=0 deadline=$(( $(date +%s) + $3 ))
    while [ "$(date +%s)" -le "$deadline" ]; do
        sample "$1"
        if [ "$LAST" $2 ]; then hits=$((hits + 1)); [ $hits -ge 2 ] && return 0; else hits=0; fi
        sleep 0.3
    done
    return 1
}

status=0
watch_until "healthy" "-ge 80" 10 || { echo "drill: FAIL: fastly never reached its 90 % share"; status=1; }
echo "drill: breaking fastly (its canary object now answers 404)"
rm "$TMP/fastly/_health/v1.txt"
watch_until "fastly broken" "-eq 0" 15 || { echo "drill: FAIL: traffic did not leave fastly"; status=1; }
echo "drill: restoring fastly"
cp probes/_health/v1.txt "$TMP/fastly/_health/"
watch_until "fastly restored" "-ge 60" 15 || { echo "drill: FAIL: traffic did not come back to fastly"; status=1; }

grep -E 'health changed|failover step|unhappy' "$TMP/server.log" | sed 's/^/drill: log: /'
if [ $status -eq 0 ]; then echo "drill: 1 passed, 0 failed"; else echo "drill: 0 passed, 1 failed"; fi
exit $status
