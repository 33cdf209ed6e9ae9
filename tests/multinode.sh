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
#   a policy version posted to ns1 (If-Match) moves all three at one instant; a stale
#   If-Match is 412, a broken policy 400 with its line; a rollback moves them back;
#   a staged rollout (stages=10,100) gives the same 5-15 % of 400 client networks the
#   new answer on every node, then all; a halt returns them; a version ns3 cannot
#   place (a country its geo database lacks) halts a rollout by itself;
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

# Namespace names unique to this run (two drills at once on one host keep apart).
R=${NS_TAG:-$$}
NS=(sd${R}-hub sd${R}-etcd sd${R}-n1 sd${R}-n2 sd${R}-n3 sd${R}-g1 sd${R}-g2 sd${R}-cdn sd${R}-cli)
netns_cleanup() {
    cleanup
    local ns
    for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap netns_cleanup EXIT

# --- the topology ------------------------------------------------------------------
for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
ip netns add sd${R}-hub
ip -n sd${R}-hub link add br0 type bridge
ip -n sd${R}-hub link set br0 up
# join NS ADDR...: NS on the bridge, with these addresses (the first is its own).
join() {
    local ns=$1 i=${#JOINED[@]} addr
    shift
    ip netns add "$ns"
    ip -n sd${R}-hub link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n sd${R}-hub link set "v$i" master br0 up
    for addr in "$@"; do ip -n "$ns" addr add "$addr/24" dev eth0; done
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    JOINED+=("$ns")
}
JOINED=()
join sd${R}-etcd 10.213.0.11 10.213.0.12 10.213.0.13
join sd${R}-n1 10.213.0.21
join sd${R}-n2 10.213.0.22
join sd${R}-n3 10.213.0.23
join sd${R}-g1 10.213.0.31
join sd${R}-g2 10.213.0.32
join sd${R}-cdn 10.213.0.41 10.213.0.42
join sd${R}-cli 10.213.0.51 $(seq -f '10.213.0.1%02g' 1 20)
log "namespaces: ${NS[*]} on one bridge, 10.213.0.0/24"

# --- etcd: three members, authentication on -----------------------------------------
CLUSTER=m1=http://10.213.0.11:2380,m2=http://10.213.0.12:2380,m3=http://10.213.0.13:2380
ENDPOINTS=http://10.213.0.11:2379,http://10.213.0.12:2379,http://10.213.0.13:2379
declare -A ETCD_PID=()
start_member() {
    local i=$1 ip=10.213.0.1$1
    ip netns exec sd${R}-etcd etcd --name "m$i" --data-dir "$TMP/etcd-m$i" \
        --listen-client-urls "http://$ip:2379" --advertise-client-urls "http://$ip:2379" \
        --listen-peer-urls "http://$ip:2380" --initial-advertise-peer-urls "http://$ip:2380" \
        --initial-cluster "$CLUSTER" --heartbeat-interval 100 --election-timeout 1000 \
        >>"$TMP/etcd-m$i.log" 2>&1 &
    track $!
    ETCD_PID[$i]=$!
}
ctl() { ip netns exec sd${R}-etcd env ETCDCTL_API=3 etcdctl --endpoints="$ENDPOINTS" "$@"; }
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
ip netns exec sd${R}-cdn python3 -m http.server --bind 10.213.0.41 8080 --directory "$TMP/fastly" >"$TMP/cdn-fastly.log" 2>&1 &
track $!
ip netns exec sd${R}-cdn python3 -m http.server --bind 10.213.0.42 8080 --directory "$TMP/cloudflare" >"$TMP/cdn-cloudflare.log" 2>&1 &
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
# Each node reads its own copy of the geo database (ns3's is swapped for a smaller one
# below).
for n in 1 2 3; do
    cp geo/country.mmdb "$TMP/geo-ns$n.mmdb"
    NO_COLOR=1 ip netns exec "sd${R}-n$n" "$STEERDNS_BIN" serve --config "$TMP/steering.yaml" \
        --zones zones --probes "$TMP/probes" --state-dir "$TMP/state-ns$n" --geo "$TMP/geo-ns$n.mmdb" \
        --listen "10.213.0.2$n:5353" --api "10.213.0.2$n:9153" --api-token-file "$TMP/api-token" \
        --rrl-exempt 10.213.0.0/24 --steering-http off \
        --node "ns$n" "${ETCD_ARGS[@]}" >"$TMP/ns$n.log" 2>&1 &
    track $!
done
for g in 1 2; do
    NO_COLOR=1 ip netns exec "sd${R}-g$g" "$STEERDNS_BIN" agent --probes "$TMP/probes" \
        --api "10.213.0.3$g:9153" --node "agent$g" "${ETCD_ARGS[@]}" >"$TMP/agent$g.log" 2>&1 &
    track $!
done

# --- helpers --------------------------------------------------------------------------
cli() { ip netns exec sd${R}-cli "$@"; }
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
ip -n sd${R}-n3 route add blackhole 10.213.0.41/32
ip -n sd${R}-n3 route add blackhole 10.213.0.42/32
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
ip -n sd${R}-n3 route del blackhole 10.213.0.41/32
ip -n sd${R}-n3 route del blackhole 10.213.0.42/32

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
for ip in 10.213.0.11 10.213.0.12 10.213.0.13; do ip -n sd${R}-n2 route add blackhole "$ip/32"; done
log "ns2 cut off from etcd"
if until_true 15 2 "s['cluster']['fail_static']"; then ok "ns2 fails static: $(field 2 "s['cluster']['error']")"; else fail "ns2 fails static"; fi
mv "$TMP/fastly/_health/v1.txt" "$TMP/fastly-canary"
for n in 1 3; do until_true 20 "$n" "removed('fastly') >= 50" || fail "ns$n demotes fastly"; done
until_true 10 2 "s['health']['fastly']['state'] == 'down'" || fail "ns2 sees fastly down itself"
check "ns2 does not demote on its own (fastly removed: $(field 2 "removed('fastly')") %)" [ "$(field 2 "removed('fastly')")" == 0 ]
check "ns2 keeps answering: $(answers 2)" [ "$(answers 2)" == "cloudflare fastly" ]
for ip in 10.213.0.11 10.213.0.12 10.213.0.13; do ip -n sd${R}-n2 route del blackhole "$ip/32"; done
if until_true 15 2 "s['cluster']['connected'] and removed('fastly') == $(field 1 "removed('fastly')")"; then
    ok "ns2 back: it follows the set (fastly $(field 2 "removed('fastly')") %)"
else
    fail "ns2 back, following the set"
fi
mv "$TMP/fastly-canary" "$TMP/fastly/_health/v1.txt"
for n in 1 2 3; do until_true 30 "$n" "removed('fastly') == 0" || fail "ns$n: fastly back"; done

# --- policy versions -------------------------------------------------------------------
# post_policy N QUERY IF-MATCH FILE: POST FILE to node N's /v1/policy?QUERY; prints
# "CODE BODY".
post_policy() {
    cli curl -s --max-time 5 -o "$TMP/post.out" -w '%{http_code}' -X POST \
        -H "Authorization: Bearer $(cat "$TMP/api-token")" -H "If-Match: \"$3\"" \
        --data-binary "@$4" "http://10.213.0.2$1:9153/v1/policy${2:+?$2}"
    echo " $(tr -d '\n' <"$TMP/post.out" | head -c 300)"
}
version_of() { sha256sum <"$1" | cut -c1-12; }
policy_field() { # policy_field N PYTHON-EXPR: EXPR on node N's /v1/policy (as `p`)
    cli curl -s --max-time 2 "http://10.213.0.2$1:9153/v1/policy" |
        python3 -c "import json,sys
try: p = json.load(sys.stdin)
except Exception: p = {}
try: print($2)
except Exception as e: print('?', e)"
}
# 400 client networks (ECS /24s), asked through one resolver.
for i in $(seq 0 399); do echo "-b 10.213.0.101 www.example.com +subnet=10.$((i / 200)).$((i % 200)).0/24"; done >"$TMP/networks"
# canary N: the indices of the 400 networks node N answers with the canary's CNAME,
# on one line ("lost" when fewer than 400 answers came back).
canary() {
    cli dig @"10.213.0.2$1" -p 5353 +short +time=1 +tries=1 -f "$TMP/networks" |
        python3 -c "import sys
lines = [l.strip() for l in sys.stdin if l.strip()]
nets = [str(i) for i, l in enumerate(lines) if l == 'example.canary.fastly.net.']
print(' '.join(nets) if len(lines) == 400 else 'lost')"
}
count() { wc -w <<<"$1" | tr -d ' '; }
# until_policy SECONDS N EXPR: polls until `policy_field N EXPR` prints True.
until_policy() {
    local end=$(($(date +%s%N) + $1 * 1000000000))
    while (($(date +%s%N) < end)); do
        [[ $(policy_field "$2" "$3") == True ]] && return 0
        sleep 0.05
    done
    return 1
}

V0=$(version_of "$TMP/steering.yaml")
check "every node serves the file's version $V0 as the set's" \
    [ "$(for n in 1 2 3; do policy_field "$n" "p['version']"; done | sort -u)" == "$V0" ]
sed -e 's/weights: { fastly: 50, cloudflare: 50 }/weights: { cloudflare: 100 }/' "$TMP/steering.yaml" >"$TMP/p1.yaml"
V1=$(version_of "$TMP/p1.yaml")
log "POST /v1/policy to ns1: cloudflare only ($V1, If-Match $V0)"
posted=$(post_policy 1 "" "$V0" "$TMP/p1.yaml")
check "accepted: $posted" grep -q '^202 ' <<<"$posted"
# Every node polled in turn (each poll 20 resolvers): when it first answers only
# cloudflare. The writer's window is 500 ms + the measured skew.
declare -A moved=()
t0=$(now_ms)
while ((${#moved[@]} < 3)) && (($(now_ms) - t0 < 10000)); do
    for n in 1 2 3; do
        [[ -z ${moved[$n]:-} && $(answers "$n") == cloudflare ]] && moved[$n]=$(now_ms)
    done
done
if ((${#moved[@]} == 3)); then
    first=$(printf '%s\n' "${moved[@]}" | sort -n | head -1) last=$(printf '%s\n' "${moved[@]}" | sort -n | tail -1)
    check "all three answer the new version $((last - t0)) ms after the post, $((last - first)) ms apart (window 500 ms)" [ $((last - first)) -lt 500 ]
else
    fail "all three answer the new version (moved: ${!moved[*]})"
fi
stale=$(post_policy 2 "" "$V0" tests/fixtures/set-steering.yaml)
check "a stale If-Match is refused: ${stale:0:120}" grep -q '^412 ' <<<"$stale"
printf 'hostname: www.example.com\nttl: 30\ncdns:\n  fastly: { cname: example.map.fastly.net. }\nregions:\n  - match: ["*"]\n    weights: { fastyl: 100 }\n' >"$TMP/broken.yaml"
broken=$(post_policy 2 "" "$V1" "$TMP/broken.yaml")
check "a broken policy is refused with its line and field: ${broken:0:160}" grep -q '^400 .*:7: regions\[0\]\.weights\.fastyl' <<<"$broken"
for n in 1 2 3; do check "ns$n still on $V1: $(answers "$n")" [ "$(answers "$n")" == cloudflare ]; done
rolled=$(api 3 POST /v1/policy/rollback '{"ticket":"DRILL-1"}')
log "rollback through ns3: $rolled"
for n in 1 2 3; do
    t0=$(now_ms)
    while [[ $(answers "$n") != "cloudflare fastly" ]] && (($(now_ms) - t0 < 5000)); do :; done
    check "ns$n answers both CDNs again after the rollback" [ "$(answers "$n")" == "cloudflare fastly" ]
done

# A staged rollout: the canary's CNAME for 10 % of the networks, then all.
sed -e 's/example.map.fastly.net./example.canary.fastly.net./' \
    -e 's/weights: { fastly: 50, cloudflare: 50 }/weights: { fastly: 100 }/' "$TMP/steering.yaml" >"$TMP/p2.yaml"
V2=$(version_of "$TMP/p2.yaml")
in_force=$(policy_field 1 "p['version']")
staged=$(post_policy 2 "stages=10,100&stage_seconds=6" "$in_force" "$TMP/p2.yaml")
check "a staged rollout of $V2 accepted through ns2: ${staged:0:100}" grep -q '^202 ' <<<"$staged"
for n in 1 2 3; do until_policy 5 "$n" "p['rollout']['loaded']" || fail "ns$n loads the rollout's version"; done
start=$(policy_field 1 "p['rollout']['start_unix_ms']")
end=$((start + 6000))
while (($(now_ms) < start + 300)); do sleep 0.05; done
polls=0 first_set="" differ=0
while (($(now_ms) + 1500 < end)); do
    for n in 1 2 3; do
        got=$(canary "$n")
        (($(now_ms) + 300 < end)) || continue
        [[ -z $first_set ]] && first_set=$got
        [[ $got == "$first_set" ]] || differ=$((differ + 1))
        polls=$((polls + 1))
    done
done
share=$(count "$first_set")
check "the first stage: $share of 400 networks on the canary (5-15 %)" [ "$share" -ge 20 ] && [ "$share" -le 60 ]
check "the same $share networks at each of $polls polls over the 3 nodes ($differ differed)" [ "$polls" -ge 3 ] && [ "$differ" == 0 ]
while (($(now_ms) < end + 300)); do sleep 0.05; done
for n in 1 2 3; do
    t0=$(now_ms)
    while [[ $(count "$(canary "$n")") != 400 ]] && (($(now_ms) - t0 < 3000)); do sleep 0.05; done
    check "ns$n: every network on the canary after the stage" [ "$(count "$(canary "$n")")" == 400 ]
done
if until_policy 5 3 "p['version'] == '$V2' and p['rollout'] is None"; then ok "the rollout done: $V2 in force"; else fail "the rollout done: $V2 in force"; fi

# A rollout halted by hand: half the networks back on the file's answers, then none.
staged=$(post_policy 1 "stages=50,100&stage_seconds=60" "$V2" "$TMP/steering.yaml")
check "a second staged rollout accepted: ${staged:0:60}" grep -q '^202 ' <<<"$staged"
t0=$(now_ms)
while (($(count "$(canary 3)") == 400)) && (($(now_ms) - t0 < 5000)); do sleep 0.05; done
half=$(count "$(canary 3)")
check "at 50 %: $half of 400 networks left on the canary on ns3" [ "$half" -ge 150 ] && [ "$half" -le 250 ]
halted=$(api 2 POST /v1/policy/halt '{"ticket":"DRILL-2"}')
log "halt through ns2: $halted"
for n in 1 2 3; do
    t0=$(now_ms)
    while [[ $(count "$(canary "$n")") != 400 ]] && (($(now_ms) - t0 < 3000)); do sleep 0.05; done
    check "ns$n: every network back on $V2 after the halt" [ "$(count "$(canary "$n")")" == 400 ]
done

# ns3's geo database swapped for one without Brazil: a version naming BR is one ns3
# cannot place clients by, so it refuses it and halts the rollout by itself.
was=$(field 3 "s['config_version']")
cp tests/fixtures/geo/GeoIP2-Country-Test.mmdb "$TMP/geo-ns3.mmdb"
until_true 5 3 "s['config_version'] != '$was' and s['last_reload']['result'] == 'applied'" ||
    fail "ns3 loads its new geo database"
sed -e 's/^regions:$/regions:\n  - match: [BR]\n    weights: { fastly: 100 }/' "$TMP/p2.yaml" >"$TMP/p3.yaml"
V3=$(version_of "$TMP/p3.yaml")
staged=$(post_policy 1 "stages=50,100&stage_seconds=60" "$V2" "$TMP/p3.yaml")
check "a rollout of a version naming BR accepted by ns1: ${staged:0:60}" grep -q '^202 ' <<<"$staged"
t0=$(now_ms)
for n in 1 2 3; do
    until_policy 10 "$n" "p['history'][0]['how'] == 'halt' and p['history'][1]['version'] == '$V3'" ||
        fail "ns$n sees the rollout of $V3 halted"
done
check "ns3 halted it $(($(now_ms) - t0)) ms after the post: $(policy_field 1 "p['history'][0]['node'] + ': ' + p['history'][0]['why'][:120]")" \
    [ "$(policy_field 1 "p['history'][0]['node'] == 'ns3' and '\`BR\`' in p['history'][0]['why'] and p['version'] == '$V2'")" == True ]
for n in 1 2 3; do check "ns$n: every network on $V2 after the halt" [ "$(count "$(canary "$n")")" == 400 ]; done
cp geo/country.mmdb "$TMP/geo-ns3.mmdb"
# Three rollouts: each node started each once (a node's estimate of the store's clock
# moves with every skew measurement; a rollout it saw end must stay ended).
for n in 1 2 3; do
    started=$(grep -c 'a staged rollout; loading its version' "$TMP/ns$n.log" || true)
    check "ns$n started each of the 3 rollouts once ($started)" [ "$started" == 3 ]
done
# Back to the file's version for the rest of the drill.
api 1 POST /v1/policy/rollback "{\"version\":\"$V0\"}" >/dev/null
for n in 1 2 3; do
    t0=$(now_ms)
    while [[ $(answers "$n") != "cloudflare fastly" ]] && (($(now_ms) - t0 < 5000)); do :; done
    check "ns$n back on $V0" [ "$(answers "$n")" == "cloudflare fastly" ]
done

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
