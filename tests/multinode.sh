#!/usr/bin/env bash
# A set of nameservers sharing one view through etcd, drilled in network namespaces
# that this script creates and removes (root needed):
#
#   sd-etcd  10.213.0.11-13  three etcd members (authentication on)
#   sd-n1..3 10.213.0.21-23  three steerdns nodes (serve --etcd), DNS on :5353, API on :9153
#   sd-g1..2 10.213.0.31-32  two probe agents (agent --etcd)
#   sd-cdn   10.213.0.41-42  two stand-in CDNs (python http.server), fastly and cloudflare
#   sd-cli   10.213.0.51     where dig and curl run (and .101-.120: 20 resolvers)
#
# all on one bridge (in namespace sd-hub); traffic stays between these addresses. A node
# is cut off from the CDNs or from etcd by blackhole routes in its own namespace. The
# drill prints what an operator would see and checks it:
#
#   a drain posted to ns1 changes the answers of ns2 and ns3 within 1 s;
#   a forged observation written without credentials is refused by etcd;
#   ns3 cut off from the CDNs demotes nothing;
#   fastly broken for every vantage point: every node takes each step within 1 s;
#   ns2 cut off from etcd fails static (keeps answering, no demotion), then catches up;
#   one etcd member killed changes nothing; two make every node fail static; back.
#
#   sudo bash tests/multinode.sh      # STEERDNS_BIN=/path/to/steerdns to drill another binary
#
# Needs root, ip, etcd and etcdctl (Debian etcd-server, etcd-client), python3, curl, dig.
# Without root or etcd it says so and exits 0, except under CI=true, where it fails.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode --keep-going
script_init multinode
CHECK_PREFIX="multinode: "

skip() {
    if [[ ${CI:-} == true ]]; then die "$1 (required in CI)"; fi
    log "SKIPPED: $1"
    exit 0
}
[[ $(id -u) == 0 ]] || skip "needs root (network namespaces): sudo bash tests/multinode.sh"
for tool in ip etcd etcdctl python3 curl dig; do
    command -v "$tool" >/dev/null || skip "needs $tool (etcd: apt-get install -y etcd-server etcd-client)"
done

make_tmp multinode
build_release

NS=(sd-hub sd-etcd sd-n1 sd-n2 sd-n3 sd-g1 sd-g2 sd-cdn sd-cli)
netns_cleanup() {
    cleanup
    local ns
    for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap netns_cleanup EXIT

# --- the topology ------------------------------------------------------------------
for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
ip netns add sd-hub
ip -n sd-hub link add br0 type bridge
ip -n sd-hub link set br0 up
# join NS ADDR...: NS on the bridge, with these addresses (the first is its own).
join() {
    local ns=$1 i=${#JOINED[@]} addr
    shift
    ip netns add "$ns"
    ip -n sd-hub link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n sd-hub link set "v$i" master br0 up
    for addr in "$@"; do ip -n "$ns" addr add "$addr/24" dev eth0; done
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    JOINED+=("$ns")
}
JOINED=()
join sd-etcd 10.213.0.11 10.213.0.12 10.213.0.13
join sd-n1 10.213.0.21
join sd-n2 10.213.0.22
join sd-n3 10.213.0.23
join sd-g1 10.213.0.31
join sd-g2 10.213.0.32
join sd-cdn 10.213.0.41 10.213.0.42
join sd-cli 10.213.0.51 $(seq -f '10.213.0.1%02g' 1 20)
log "namespaces: ${NS[*]} on one bridge, 10.213.0.0/24"

# --- etcd: three members, authentication on -----------------------------------------
CLUSTER=m1=http://10.213.0.11:2380,m2=http://10.213.0.12:2380,m3=http://10.213.0.13:2380
ENDPOINTS=http://10.213.0.11:2379,http://10.213.0.12:2379,http://10.213.0.13:2379
declare -A ETCD_PID=()
start_member() {
    local i=$1 ip=10.213.0.1$1
    ip netns exec sd-etcd etcd --name "m$i" --data-dir "$TMP/etcd-m$i" \
        --listen-client-urls "http://$ip:2379" --advertise-client-urls "http://$ip:2379" \
        --listen-peer-urls "http://$ip:2380" --initial-advertise-peer-urls "http://$ip:2380" \
        --initial-cluster "$CLUSTER" --heartbeat-interval 100 --election-timeout 1000 \
        >>"$TMP/etcd-m$i.log" 2>&1 &
    track $!
    ETCD_PID[$i]=$!
}
ctl() { ip netns exec sd-etcd env ETCDCTL_API=3 etcdctl --endpoints="$ENDPOINTS" "$@"; }
for i in 1 2 3; do start_member "$i"; done
for _ in $(seq 100); do ctl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
ctl endpoint health >/dev/null 2>&1 || die "etcd did not start; see $TMP/etcd-m*.log (KEEP=1)"
ROOTPW=root-$RANDOM$RANDOM NODEPW=node-$RANDOM$RANDOM
{
    ctl user add "root:$ROOTPW" --interactive=false
    ctl user grant-role root root
    ctl role add steerdns
    ctl role grant-permission steerdns --prefix=true readwrite /steerdns/
    ctl user add "steerdns:$NODEPW" --interactive=false
    ctl user grant-role steerdns steerdns
    ctl auth enable
} >"$TMP/etcdctl.log" 2>&1 || die "etcd auth setup failed: $(cat "$TMP/etcdctl.log")"
(umask 077 && echo "$NODEPW" >"$TMP/etcd-password")
log "etcd: 3 members, user steerdns limited to /steerdns/"

# --- CDNs, policy, probes -----------------------------------------------------------
for cdn in fastly cloudflare; do mkdir -p "$TMP/$cdn/_health" && cp probes/_health/v1.txt "$TMP/$cdn/_health/"; done
ip netns exec sd-cdn python3 -m http.server --bind 10.213.0.41 8080 --directory "$TMP/fastly" >"$TMP/cdn-fastly.log" 2>&1 &
track $!
ip netns exec sd-cdn python3 -m http.server --bind 10.213.0.42 8080 --directory "$TMP/cloudflare" >"$TMP/cdn-cloudflare.log" 2>&1 &
track $!
cp tests/fixtures/set-steering.yaml "$TMP/steering.yaml"
mkdir -p "$TMP/probes"
for cdn in fastly cloudflare; do
    ip=10.213.0.41
    [[ $cdn == cloudflare ]] && ip=10.213.0.42
    cat >"$TMP/probes/$cdn.yaml" <<YAML
url: http://$ip:8080/_health/v1.txt
expect_body: healthy-v1
timeout_ms: 500
interval_seconds: 0.2
quorum: 1
down_after: 2
up_after: 3
YAML
done
(umask 077 && echo "drill-token-$RANDOM$RANDOM" >"$TMP/api-token")
# Plain http between namespaces: --etcd-insecure accepts the password in clear here.
ETCD_ARGS=(--etcd "$ENDPOINTS" --etcd-user steerdns --etcd-password-file "$TMP/etcd-password"
    --etcd-insecure --members ns1,ns2,ns3,agent1,agent2)
for n in 1 2 3; do
    NO_COLOR=1 ip netns exec "sd-n$n" "$STEERDNS_BIN" serve --config "$TMP/steering.yaml" \
        --zones zones --probes "$TMP/probes" --state-dir "$TMP/state-ns$n" \
        --listen "10.213.0.2$n:5353" --api "10.213.0.2$n:9153" --api-token-file "$TMP/api-token" \
        --rrl-exempt 10.213.0.0/24 --steering-http off \
        --node "ns$n" "${ETCD_ARGS[@]}" >"$TMP/ns$n.log" 2>&1 &
    track $!
done
for g in 1 2; do
    NO_COLOR=1 ip netns exec "sd-g$g" "$STEERDNS_BIN" agent --probes "$TMP/probes" \
        --api "10.213.0.3$g:9153" --node "agent$g" "${ETCD_ARGS[@]}" >"$TMP/agent$g.log" 2>&1 &
    track $!
done

# --- helpers --------------------------------------------------------------------------
cli() { ip netns exec sd-cli "$@"; }
state() { cli curl -s --max-time 2 "http://10.213.0.2$1:9153/v1/state"; }
# field N PYTHON-EXPR: evaluates EXPR on node N's /v1/state (as `s`); prints the result.
field() {
    state "$1" | python3 -c "import json,sys
try: s = json.load(sys.stdin)
except Exception: s = {}
def removed(cdn):
    return max([f['removed_percent'] for f in s.get('failover', []) if f['cdn'] == cdn] or [0])
def since(cdn):
    return max([f['since_unix_ms'] or 0 for f in s.get('failover', []) if f['cdn'] == cdn] or [0])
try: print($2)
except Exception as e: print('?', e)"
}
# until_true SECONDS N EXPR: polls until `field N EXPR` prints True.
until_true() {
    local end=$(($(date +%s%N) + $1 * 1000000000))
    while (($(date +%s%N) < end)); do
        [[ $(field "$2" "$3") == True ]] && return 0
        sleep 0.05
    done
    return 1
}
for i in $(seq -f '%02g' 1 20); do echo "-b 10.213.0.1$i www.example.com"; done >"$TMP/queries"
# answers N: the CDNs node N answers to 20 resolvers, e.g. "cloudflare fastly"; with
# "lost" among them when fewer than 20 answers were one of the CNAMEs (a timeout).
answers() {
    local got
    got=$(cli dig @"10.213.0.2$1" -p 5353 +short +time=1 +tries=1 -f "$TMP/queries" |
        sed -n 's/^example\.map\.fastly\.net\.$/fastly/p; s/^example\.cdn\.cloudflare\.net\.$/cloudflare/p' || true)
    (($(grep -c . <<<"$got" || true) == 20)) || got+=$'\nlost'
    grep . <<<"$got" | sort -u | tr '\n' ' ' | sed 's/ $//'
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
api() { # api N METHOD PATH [JSON]
    cli curl -s --max-time 5 -X "$2" -H "Authorization: Bearer $(cat "$TMP/api-token")" \
        -H 'content-type: application/json' ${4:+--data "$4"} "http://10.213.0.2$1:9153$3"
}
check() { # check NAME COMMAND...: ok/fail by the command's status
    local name=$1
    shift
    if "$@"; then ok "$name"; else fail "$name"; fi
}

for n in 1 2 3; do
    until_true 20 "$n" "s['cluster']['connected'] and len(s['cluster']['vantages']) >= 5" ||
        { fail "ns$n joined the set"; tail -5 "$TMP/ns$n.log"; summary; exit 1; }
done
ok "3 nodes and 2 agents joined the set: $(field 1 "' '.join(s['cluster']['vantages'])")"
for n in 1 2 3; do
    check "ns$n answers both CDNs: $(answers "$n")" [ "$(answers "$n")" == "cloudflare fastly" ]
done

# --- a drain posted to one node -------------------------------------------------------
log "POST /v1/drains to ns1: fastly, immediate"
t0=$(now_ms)
id=$(api 1 POST /v1/drains '{"name":"www.example.com","cdn":"fastly","reason":"drill: drain fastly","immediate":true}' |
    python3 -c 'import json,sys; print(json.load(sys.stdin).get("id",""))')
for n in 2 3; do
    while [[ $(answers "$n") != cloudflare ]] && (($(now_ms) - t0 < 10000)); do :; done
    took=$(($(now_ms) - t0))
    check "ns$n answers only cloudflare ${took} ms after the drain was posted to ns1" [ "$took" -lt 1000 ]
done
check "ns3 says who wrote it: $(field 3 "s['drains'][0].get('written_by')")" [ "$(field 3 "s['drains'][0].get('written_by')")" == ns1 ]
api 3 DELETE "/v1/drains/$id" >/dev/null
if until_true 5 1 "removed('fastly') == 0 and not s['drains']"; then ok "the drain removed on ns3 ends on ns1"; else fail "the drain removed on ns3 ends on ns1"; fi

# --- a forged observation -------------------------------------------------------------
forged=$(cli curl -s --max-time 2 http://10.213.0.11:2379/v3/kv/put --data \
    "{\"key\":\"$(echo -n /steerdns/obs/forger/fastly | base64 -w0)\",\"value\":\"$(echo -n '{"round":9,"ok":false,"reason":"forged","settled":true}' | base64 -w0)\"}")
log "anonymous put of /steerdns/obs/forger/fastly: $forged"
check "a forged observation without credentials is refused by etcd" grep -q "user name is empty" <<<"$forged"

# --- ns3 cut off from the CDNs --------------------------------------------------------
ip -n sd-n3 route add blackhole 10.213.0.41/32
ip -n sd-n3 route add blackhole 10.213.0.42/32
log "ns3 cut off from both CDNs"
until_true 10 3 "s['vantage_unhappy'] is not None" || fail "ns3 sees itself unhappy"
log "ns3: $(field 3 "s['vantage_unhappy']")"
r0=$(field 1 "s['health']['fastly']['verdicts']['up'] + s['health']['fastly']['verdicts']['down']")
until_true 20 1 "s['health']['fastly']['verdicts']['up'] + s['health']['fastly']['verdicts']['down'] >= $r0 + 15" ||
    fail "15 more rounds on ns1 while ns3 is cut off"
for n in 1 2 3; do
    check "ns$n: nothing demoted by ns3's view (fastly $(field "$n" "removed('fastly')") %, cloudflare $(field "$n" "removed('cloudflare')") %)" \
        [ "$(field "$n" "removed('fastly') + removed('cloudflare')")" == 0 ]
done
ip -n sd-n3 route del blackhole 10.213.0.41/32
ip -n sd-n3 route del blackhole 10.213.0.42/32

# --- fastly broken for every vantage point --------------------------------------------
log "fastly's canary removed"
mv "$TMP/fastly/_health/v1.txt" "$TMP/fastly-canary"
for pct in 50 100; do
    for n in 1 2 3; do until_true 20 "$n" "removed('fastly') == $pct" || fail "ns$n reached $pct %"; done
    s1=$(field 1 "since('fastly')") s2=$(field 2 "since('fastly')") s3=$(field 3 "since('fastly')")
    spread=$(python3 -c "print(max($s1,$s2,$s3) - min($s1,$s2,$s3))")
    check "every node took the $pct % step within ${spread} ms of the others" [ "$spread" -lt 1000 ]
done
log "timeline written by $(field 1 "s['cluster']['timelines'][0]['written_by']"): $(field 1 "s['cluster']['timelines'][0]['reason']")"
mv "$TMP/fastly-canary" "$TMP/fastly/_health/v1.txt"
for n in 1 2 3; do until_true 30 "$n" "removed('fastly') == 0" || fail "ns$n: fastly back"; done
ok "fastly restored: every node back to 50/50"

# --- ns2 cut off from etcd ------------------------------------------------------------
for ip in 10.213.0.11 10.213.0.12 10.213.0.13; do ip -n sd-n2 route add blackhole "$ip/32"; done
log "ns2 cut off from etcd"
if until_true 15 2 "s['cluster']['fail_static']"; then ok "ns2 fails static: $(field 2 "s['cluster']['error']")"; else fail "ns2 fails static"; fi
mv "$TMP/fastly/_health/v1.txt" "$TMP/fastly-canary"
for n in 1 3; do until_true 20 "$n" "removed('fastly') >= 50" || fail "ns$n demotes fastly"; done
until_true 10 2 "s['health']['fastly']['state'] == 'down'" || fail "ns2 sees fastly down itself"
check "ns2 does not demote on its own (fastly removed: $(field 2 "removed('fastly')") %)" [ "$(field 2 "removed('fastly')")" == 0 ]
check "ns2 keeps answering: $(answers 2)" [ "$(answers 2)" == "cloudflare fastly" ]
for ip in 10.213.0.11 10.213.0.12 10.213.0.13; do ip -n sd-n2 route del blackhole "$ip/32"; done
if until_true 15 2 "s['cluster']['connected'] and removed('fastly') == $(field 1 "removed('fastly')")"; then
    ok "ns2 back: it follows the set (fastly $(field 2 "removed('fastly')") %)"
else
    fail "ns2 back, following the set"
fi
mv "$TMP/fastly-canary" "$TMP/fastly/_health/v1.txt"
for n in 1 2 3; do until_true 30 "$n" "removed('fastly') == 0" || fail "ns$n: fastly back"; done

# --- etcd members lost ----------------------------------------------------------------
stop "${ETCD_PID[1]}"
log "etcd member m1 killed"
# If m1 led etcd, the other two elect a leader first (about a second): 503 meanwhile.
id="" t0=$(now_ms)
while [[ -z $id ]] && (($(now_ms) - t0 < 10000)); do
    id=$(api 2 POST /v1/drains '{"name":"www.example.com","cdn":"cloudflare","reason":"drill: one member down","immediate":true}' |
        python3 -c 'import json,sys; print(json.load(sys.stdin).get("id",""))')
    [[ -n $id ]] || sleep 0.1
done
check "a drain still goes through with one member down (after $(($(now_ms) - t0)) ms)" [ -n "$id" ]
t0=$(now_ms)
for n in 1 3; do
    while [[ $(answers "$n") != fastly ]] && (($(now_ms) - t0 < 10000)); do :; done
    check "ns$n answers only fastly $(($(now_ms) - t0)) ms after the drain" [ "$(answers "$n")" == fastly ]
done
for n in 1 2 3; do check "ns$n still connected" [ "$(field "$n" "s['cluster']['connected']")" == True ]; done
stop "${ETCD_PID[2]}"
log "etcd member m2 killed: no quorum"
for n in 1 2 3; do
    if until_true 15 "$n" "s['cluster']['fail_static']"; then ok "ns$n fails static"; else fail "ns$n fails static"; fi
    # The last shared state: the drain of cloudflare still in force.
    check "ns$n keeps answering the last shared state: $(answers "$n")" [ "$(answers "$n")" == fastly ]
done
start_member 1
start_member 2
for n in 1 2 3; do
    if until_true 30 "$n" "s['cluster']['connected']"; then ok "ns$n rejoined"; else fail "ns$n rejoined"; fi
done
api 1 DELETE "/v1/drains/$id" >/dev/null

summary
