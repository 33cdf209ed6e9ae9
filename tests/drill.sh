#!/usr/bin/env bash
# Failover drill against the release binary, as an operator would run it with dig:
# two local web servers stand in for the CDNs, fastly's canary object is removed (it
# answers 404), and the answer shares sampled every 0.3 s show traffic leaving fastly in
# steps (90 % -> 45 % -> 0 %) and coming back the same way (45 %, then 90 %) when the
# object is restored. Answers are consistent per resolver, so each sample asks from 200
# resolvers (source addresses 127.64.0.1-200), as a real population of resolvers would.
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

# The demo policy with a fast drill timeline: steps 50 % then 100 %, three seconds apart
# (long enough to see the plateau); probes every 200 ms, down after 2 bad rounds, up
# after 3 good ones.
mkdir -p "$TMP/probes"
sed -e 's/step_interval_seconds: 90/step_interval_seconds: 3/' steering.yaml >"$TMP/steering.yaml"
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
up=0
for _ in $(seq 100); do
    dig @127.0.0.1 -p "$DNS_PORT" +time=1 +tries=1 example.com SOA 2>/dev/null | grep -q 'status: NOERROR' && { up=1; break; }
    sleep 0.1
done
if [ $up -eq 0 ]; then
    echo "drill: FAIL: the server does not answer; its log:" >&2
    cat "$TMP/server.log" >&2
    echo "drill: 0 passed, 1 failed"
    exit 1
fi

# 200 queries for a GB client (fastly 90 %, cloudflare 10 %), each from another resolver:
# fastly's share in percent. Every answer must be one of the two CNAMEs.
for i in $(seq 200); do echo "-b 127.64.0.$i www.example.com +subnet=81.2.69.0/24"; done >"$TMP/queries"
share() {
    dig @127.0.0.1 -p "$DNS_PORT" +short +time=1 +tries=1 -f "$TMP/queries" >"$TMP/answers"
    local f c
    f=$(grep -c '^example.map.fastly.net.$' "$TMP/answers")
    c=$(grep -c '^example.cdn.cloudflare.net.$' "$TMP/answers")
    if [ $((f + c)) -ne 200 ]; then
        echo "drill: FAIL: $((200 - f - c)) of 200 answers are neither CDN's CNAME:" >&2
        grep -v -e '^example.map.fastly.net.$' -e '^example.cdn.cloudflare.net.$' "$TMP/answers" | sort | uniq -c >&2
        BAD=1
    fi
    echo $((f / 2))
}
BAD=0
START=$(date +%s.%N)
sample() {
    local s; s=$(share)
    printf 'drill: t=%5.1fs  fastly %3d %%  cloudflare %3d %%  %s\n' "$(awk "BEGIN { print $(date +%s.%N) - $START }")" "$s" $((100 - s)) "$1"
    LAST=$s
    # The first step's plateau: 45 % (sd 3.5 points over 200 resolvers).
    if [ "$s" -ge 35 ] && [ "$s" -le 55 ]; then PLATEAU="$PLATEAU $1"; fi
}
PLATEAU=
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
case "$PLATEAU" in *"fastly broken"*) ;; *) echo "drill: FAIL: no sample at the first step's 45 % while failing"; status=1 ;; esac
echo "drill: restoring fastly"
cp probes/_health/v1.txt "$TMP/fastly/_health/"
watch_until "fastly restored" "-ge 80" 20 || { echo "drill: FAIL: traffic did not come back to fastly"; status=1; }
case "$PLATEAU" in *"fastly restored"*) ;; *) echo "drill: FAIL: no sample at the first step's 45 % while recovering"; status=1 ;; esac
[ "$BAD" -eq 0 ] || status=1

grep -E 'health changed|failover step|unhappy' "$TMP/server.log" | sed 's/^/drill: log: /'
if [ $status -eq 0 ]; then echo "drill: 1 passed, 0 failed"; else echo "drill: 0 passed, 1 failed"; fi
exit $status
