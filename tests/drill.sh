#!/usr/bin/env bash
# Failover drill against the release binary, as an operator would run it with dig:
# two local web servers stand in for the CDNs, fastly's canary object is removed (it
# answers 404), and the answer shares sampled every 0.3 s show traffic leaving fastly in
# steps (90 % -> 45 % -> 0 %) and coming back the same way (45 %, then 90 %) when the
# object is restored. Answers are consistent per resolver, so each sample asks from 200
# resolvers (source addresses 127.64.0.1-200), as a real population of resolvers would.
#
#   bash tests/drill.sh          # STEERDNS_BIN=/path/to/steerdns to drill another binary
#
# Sends traffic only to 127.0.0.1. Exits non-zero if traffic does not move.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode --keep-going
script_init drill
CHECK_PREFIX="drill: "
require dig python3

make_tmp drill
build_release

# The two "CDNs": each serves the canary object.
start_cdn fastly "$TMP/fastly"
start_cdn cloudflare "$TMP/cloudflare"
DNS_PORT=$(free_port)
API_PORT=$(free_port)

# The demo policy with a fast drill timeline: steps 50 % then 100 %, three seconds apart
# (long enough to see the plateau); probes every 200 ms, down after 2 bad rounds, up
# after 3 good ones.
mkdir -p "$TMP/probes"
sed -e 's/step_interval_seconds: 90/step_interval_seconds: 3/' steering.yaml >"$TMP/steering.yaml"
for cdn in fastly cloudflare; do
    cat >"$TMP/probes/$cdn.yaml" <<YAML
url: http://127.0.0.1:${CDN_PORT[$cdn]}/_health/v1.txt
expect_body: healthy-v1
timeout_ms: 500
interval_seconds: 0.2
down_after: 2
up_after: 3
YAML
done

NO_COLOR=1 "$STEERDNS_BIN" serve --config "$TMP/steering.yaml" --probes "$TMP/probes" \
    --listen "127.0.0.1:$DNS_PORT" --api "127.0.0.1:$API_PORT" --state-dir "$TMP/state" \
    --steering-http off \
    >"$TMP/server.log" 2>&1 &
track $!
if ! wait_for_dns -p $! "$DNS_PORT"; then
    echo "drill: FAIL: the server does not answer; its log:" >&2
    cat "$TMP/server.log" >&2
    echo "drill: 0 passed, 1 failed"
    exit 1
fi

# 200 queries for a GB client (fastly 90 %, cloudflare 10 %), each from another resolver:
# sets SHARE to fastly's share in percent. Every answer must be one of the two CNAMEs.
for i in $(seq 200); do echo "-b 127.64.0.$i www.example.com +subnet=81.2.69.0/24"; done >"$TMP/queries"
share() {
    dig @127.0.0.1 -p "$DNS_PORT" +short +time=1 +tries=1 -f "$TMP/queries" >"$TMP/answers"
    local f c
    f=$(grep -c '^example.map.fastly.net.$' "$TMP/answers")
    c=$(grep -c '^example.cdn.cloudflare.net.$' "$TMP/answers")
    if [ $((f + c)) -ne 200 ]; then
        fail "$((200 - f - c)) of 200 answers are neither CDN's CNAME:"
        grep -v -e '^example.map.fastly.net.$' -e '^example.cdn.cloudflare.net.$' "$TMP/answers" | sort | uniq -c
    fi
    SHARE=$((f / 2))
}
START=$(date +%s.%N)
sample() {
    share
    printf 'drill: t=%5.1fs  fastly %3d %%  cloudflare %3d %%  %s\n' "$(awk "BEGIN { print $(date +%s.%N) - $START }")" "$SHARE" $((100 - SHARE)) "$1"
    # The first step's plateau: 45 % (sd 3.5 points over 200 resolvers).
    if [ "$SHARE" -ge 35 ] && [ "$SHARE" -le 55 ]; then PLATEAU="$PLATEAU $1"; fi
}
PLATEAU=
# watch_until LABEL CONDITION SECONDS: samples every 0.3 s until CONDITION (arithmetic,
# on SHARE) holds twice in a row, or SECONDS have passed.
watch_until() {
    local hits=0 deadline=$(($(date +%s) + $3))
    while [ "$(date +%s)" -le "$deadline" ]; do
        sample "$1"
        if (($2)); then
            hits=$((hits + 1))
            [ $hits -ge 2 ] && return 0
        else
            hits=0
        fi
        sleep 0.3
    done
    return 1
}

watch_until "healthy" "SHARE >= 80" 10 || fail "fastly never reached its 90 % share"
echo "drill: breaking fastly (its canary object now answers 404)"
rm "$TMP/fastly/_health/v1.txt"
watch_until "fastly broken" "SHARE == 0" 15 || fail "traffic did not leave fastly"
case "$PLATEAU" in *"fastly broken"*) ;; *) fail "no sample at the first step's 45 % while failing" ;; esac
echo "drill: restoring fastly"
cp probes/_health/v1.txt "$TMP/fastly/_health/"
watch_until "fastly restored" "SHARE >= 80" 20 || fail "traffic did not come back to fastly"
case "$PLATEAU" in *"fastly restored"*) ;; *) fail "no sample at the first step's 45 % while recovering" ;; esac

grep -E 'health changed|failover step|unhappy' "$TMP/server.log" | sed 's/^/drill: log: /'
# The drill is one check, whatever the number of reasons it failed for.
if ((FAILED)); then PASSED=0 FAILED=1; else PASSED=1; fi
summary
