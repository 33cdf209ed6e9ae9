#!/usr/bin/env bash
# A chaos drill for a set of nameservers, in network namespaces this script creates and
# removes (root needed): three etcd members, three nodes, two agents, two stand-in CDNs.
# For DURATION seconds (default 300) it injects one fault after another, chosen from a
# fixed seed (SEED, default 24), each healed before the next:
#
#   an etcd member frozen (SIGSTOP, then SIGCONT), or killed and restarted;
#   a node cut off from etcd (blackhole routes);
#   200 ms delay and 5 % loss on a node's links to etcd (tests/wan-relay.py: this
#   kernel has no netem; every etcd member is reached through a relay in its namespace);
#   a node's clock 2 s ahead or behind (libfaketime, its offset read from a file);
#   fastly failing for two vantage points of five;
#   a drain or an undrain posted to a random node;
#   a policy version applied through a random node (POST /v1/policy, If-Match).
#
# PROFILE=wan puts the set on three continents: sites A (m1, ns1, agent1), B (m2, ns2,
# agent2) and C (m3, ns3), 40, 90 and 125 ms apart one way (80, 180 and 250 ms round
# trips) with 10 % jitter, every etcd link (client and peer) through the relays. It adds
# a fault, a burst of 1-5 % loss on the link between two sites, and before the faults it
# measures, from outside: the time from an API call (drain, undrain, freeze, resume,
# policy version, each through each node) to every node applying it, against the bounds
# of the profile, and the bytes each node exchanges with etcd per minute at rest. A
# lever is three requests one after another (its write, its audit entry's lease, the
# entry); a policy version is checked with the node's own inputs (up to a second with the
# full geo database), then three requests (a read, the YAML kept, the record); each
# request costs at most a member's round trip to the leader (250 ms) plus the leader's
# to its nearest other member (180 ms): WAN_BOUND_MS = 3 x 430 + 500 = 1,790 ms,
# WAN_POLICY_BOUND_MS = 1,000 + 3 x 430 + 500 = 2,790 ms (500 ms for the watch, the
# answer and the polling). Each node lists its own site's member first (--etcd), as the book
# says to. WAN_SCALE multiplies every delay (WAN_SCALE=2 puts the links beyond the
# bounds: the drill must fail).
#
# From outside (the client namespace), every half second, through /v1/state and dig:
#
#   nodes that report connected agree on drains and freeze within 2 s of each change,
#   and on failover steps and the policy version within 3 s (2 s of clock skew, plus
#   one);
#   a node cut off from etcd reports fail-static within 3 s, and keeps answering;
#   a drain posted while one etcd member hangs goes through (the node moves to another
#   member);
#   no CDN is removed without a drain or a failover timeline for it, and every answer
#   names a CDN;
#   after the last fault heals, every node converges within 5 s of the heal (the time
#   is measured from it and printed) and answers 200 resolvers (ECS subnets) alike.
#
# Each fault and every violation is printed; the drill passes with none.
#
#   sudo bash tests/chaos.sh                  # DURATION=60 SEED=7 for a shorter, other run
#
# Needs root, ip, tc, etcd and etcdctl, python3, curl, dig, faketime. Without root or a
# tool it says so and exits 0, except under CI=true, where it fails.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode --keep-going
script_init chaos
CHECK_PREFIX="chaos: "
DURATION=${DURATION:-300}
SEED=${SEED:-24}
PROFILE=${PROFILE:-lan}
WAN_SCALE=${WAN_SCALE:-1}
[[ $PROFILE == lan || $PROFILE == wan ]] || die "PROFILE=$PROFILE: lan or wan"

skip() {
    if [[ ${CI:-} == true ]]; then die "$1 (required in CI)"; fi
    log "SKIPPED: $1"
    exit 0
}
[[ $(id -u) == 0 ]] || skip "needs root (network namespaces): sudo bash tests/chaos.sh"
for tool in ip etcd etcdctl python3 curl dig faketime; do
    command -v "$tool" >/dev/null || skip "needs $tool"
done
FAKETIME_LIB=$(find /usr/lib -name libfaketime.so.1 2>/dev/null | head -1)
[[ -n $FAKETIME_LIB ]] || skip "needs libfaketime.so.1 (apt-get install -y faketime)"

make_tmp chaos
build_release

# Namespace names unique to this run (two drills at once on one host keep apart).
R=${NS_TAG:-$$}
NS=(sc${R}-hub sc${R}-e1 sc${R}-e2 sc${R}-e3 sc${R}-n1 sc${R}-n2 sc${R}-n3 sc${R}-g1 sc${R}-g2 sc${R}-cdn sc${R}-cli)
netns_cleanup() {
    cleanup
    local ns
    for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
}
trap netns_cleanup EXIT

# --- the topology: one bridge, 10.214.0.0/24 -------------------------------------------
for ns in "${NS[@]}"; do ip netns del "$ns" 2>/dev/null || true; done
ip netns add sc${R}-hub
ip -n sc${R}-hub link add br0 type bridge
ip -n sc${R}-hub link set br0 up
declare -A VETH=()
attach() { # attach NS ADDR...: NS on the bridge, through hub-side veth $VETH[NS]
    local ns=$1 i=${#VETH[@]} addr
    shift
    ip netns add "$ns"
    ip -n sc${R}-hub link add "v$i" type veth peer name eth0 netns "$ns"
    ip -n sc${R}-hub link set "v$i" master br0 up
    for addr in "$@"; do ip -n "$ns" addr add "$addr/24" dev eth0; done
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    VETH[$ns]=v$i
}
for i in 1 2 3; do attach "sc${R}-e$i" "10.214.0.1$i"; done
for n in 1 2 3; do attach "sc${R}-n$n" "10.214.0.2$n"; done
for g in 1 2; do attach "sc${R}-g$g" "10.214.0.3$g"; done
attach sc${R}-cdn 10.214.0.41 10.214.0.42
attach sc${R}-cli 10.214.0.51
# --- the links: a relay in front of each etcd member ----------------------------------
# Each member listens on its namespace's loopback; a relay on its address (client port
# 2379, peer port 2380) delays what comes from each address by the profile
# ($TMP/links.json, rewritten by the faults; the relays read it again when it changes).
declare -A LINK_FAULT=() # client address -> its own rule, while a fault lasts
SITE_FAULT=""            # '"A": {"loss": 0.03}' while a site's links lose
if [[ $PROFILE == wan ]]; then
    # Sites: A = m1, ns1, agent1; B = m2, ns2, agent2; C = m3, ns3. One way, ms.
    SITES='"10.214.0.11": "A", "10.214.0.21": "A", "10.214.0.31": "A", "10.214.0.12": "B", "10.214.0.22": "B", "10.214.0.32": "B", "10.214.0.13": "C", "10.214.0.23": "C"'
    wan() { echo "\"delay_ms\": $(($1 * WAN_SCALE)), \"jitter_ms\": $(($1 * WAN_SCALE / 10))"; }
    LINKS="\"A-B\": {$(wan 40)}, \"A-C\": {$(wan 90)}, \"B-C\": {$(wan 125)}, \"A-A\": {$(wan 1)}, \"B-B\": {$(wan 1)}, \"C-C\": {$(wan 1)}"
    MAX_RTT_MS=$((250 * WAN_SCALE))
    WAN_BOUND_MS=${WAN_BOUND_MS:-$((3 * (250 + 180) + 500))}
    WAN_POLICY_BOUND_MS=${WAN_POLICY_BOUND_MS:-$((1000 + 3 * (250 + 180) + 500))}
    # etcd across an ocean: a heartbeat about the longest round trip, an election
    # timeout ten times that (the book, user/set/scale.md).
    ETCD_TIMING=(--heartbeat-interval 250 --election-timeout 2500)
else
    SITES="" LINKS="" MAX_RTT_MS=0
    ETCD_TIMING=(--heartbeat-interval 100 --election-timeout 1000)
fi
write_links() { # the profile, with the faults in LINK_FAULT
    local from="" a
    for a in "${!LINK_FAULT[@]}"; do from+="${from:+, }\"$a\": {${LINK_FAULT[$a]}}"; done
    echo "{\"sites\": {$SITES}, \"links\": {$LINKS}, \"from\": {$from}, \"site_faults\": {$SITE_FAULT}}" >"$TMP/links.json.tmp"
    mv "$TMP/links.json.tmp" "$TMP/links.json"
}
write_links
SITE=([1]=A [2]=B [3]=C)
for i in 1 2 3; do
    ip=10.214.0.1$i
    ip netns exec "sc${R}-e$i" python3 tests/wan-relay.py --profile "$TMP/links.json" --site "${SITE[$i]}" \
        --stats "$TMP/bytes-m$i.json" "tcp:$ip:2379=127.0.0.1:2379" "tcp:$ip:2380=127.0.0.1:2380" \
        >"$TMP/relay-m$i.log" 2>&1 &
    track $!
done

# --- etcd ------------------------------------------------------------------------------
CLUSTER=m1=http://10.214.0.11:2380,m2=http://10.214.0.12:2380,m3=http://10.214.0.13:2380
ENDPOINTS=http://10.214.0.11:2379,http://10.214.0.12:2379,http://10.214.0.13:2379
declare -A MEMBER=()
member_up() {
    local i=$1 ip=10.214.0.1$1
    ip netns exec "sc${R}-e$i" etcd --name "m$i" --data-dir "$TMP/etcd-m$i" \
        --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls "http://$ip:2379" \
        --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls "http://$ip:2380" \
        --initial-cluster "$CLUSTER" "${ETCD_TIMING[@]}" \
        >>"$TMP/etcd-m$i.log" 2>&1 &
    track $!
    MEMBER[$i]=$!
}
for i in 1 2 3; do member_up "$i"; done
healthy() { ip netns exec sc${R}-cli env ETCDCTL_API=3 etcdctl --endpoints="$ENDPOINTS" endpoint health >/dev/null 2>&1; }
for _ in $(seq 100); do healthy && break; sleep 0.1; done
healthy || die "etcd did not start; see $TMP/etcd-m*.log (KEEP=1)"

# --- CDNs, policy, probes, nodes, agents ---------------------------------------------
for cdn in fastly cloudflare; do mkdir -p "$TMP/$cdn/_health" && cp probes/_health/v1.txt "$TMP/$cdn/_health/"; done
ip netns exec sc${R}-cdn python3 -m http.server --bind 10.214.0.41 8080 --directory "$TMP/fastly" >/dev/null 2>&1 &
track $!
ip netns exec sc${R}-cdn python3 -m http.server --bind 10.214.0.42 8080 --directory "$TMP/cloudflare" >/dev/null 2>&1 &
track $!
cp tests/fixtures/set-steering.yaml "$TMP/steering.yaml"
cp tests/fixtures/set-steering.yaml "$TMP/policy-a.yaml"
sed -e 's/^ttl: 30$/ttl: 31/' tests/fixtures/set-steering.yaml >"$TMP/policy-b.yaml"
mkdir -p "$TMP/probes"
for cdn in fastly cloudflare; do
    ip=10.214.0.41
    [[ $cdn == cloudflare ]] && ip=10.214.0.42
    printf 'url: http://%s:8080/_health/v1.txt\nexpect_body: healthy-v1\ntimeout_ms: 500\ninterval_seconds: 0.3\nquorum: 2\ndown_after: 2\nup_after: 3\n' "$ip" >"$TMP/probes/$cdn.yaml"
done
(umask 077 && echo "chaos-token-$RANDOM$RANDOM" >"$TMP/api-token")
SET_ARGS=(--etcd-insecure --members ns1,ns2,ns3,agent1,agent2)
nearest_first() { # the endpoints, site N's member first (a node uses the first that answers)
    local order=("$1" 1 2 3) m seen="" out=""
    for m in "${order[@]}"; do
        [[ $seen == *"$m"* ]] && continue
        seen+=$m
        out+="${out:+,}http://10.214.0.1$m:2379"
    done
    echo "$out"
}
for n in 1 2 3; do
    echo "+0" >"$TMP/clock-ns$n"
    # Each node's wall clock follows the offset in its file (a fault changes it).
    NO_COLOR=1 ip netns exec "sc${R}-n$n" env LD_PRELOAD="$FAKETIME_LIB" FAKETIME_DONT_FAKE_MONOTONIC=1 \
        FAKETIME_TIMESTAMP_FILE="$TMP/clock-ns$n" FAKETIME_CACHE_DURATION=1 \
        "$STEERDNS_BIN" serve --config "$TMP/steering.yaml" \
        --zones zones --probes "$TMP/probes" --state-dir "$TMP/state-ns$n" \
        --listen "10.214.0.2$n:5353" --api "10.214.0.2$n:9153" --api-token-file "$TMP/api-token" \
        --rrl-exempt 10.214.0.0/16 --steering-http off --node "ns$n" --etcd "$(nearest_first "$n")" "${SET_ARGS[@]}" >"$TMP/ns$n.log" 2>&1 &
    track $!
done
for g in 1 2; do
    NO_COLOR=1 ip netns exec "sc${R}-g$g" "$STEERDNS_BIN" agent --probes "$TMP/probes" \
        --api "10.214.0.3$g:9153" --node "agent$g" --etcd "$(nearest_first "$g")" "${SET_ARGS[@]}" >"$TMP/agent$g.log" 2>&1 &
    track $!
done

# --- the checker, in the client namespace -------------------------------------------
# $TMP/faults: one line per fault event, "UNIX_MS start|end KIND TARGET", read by it.
: >"$TMP/faults"
cat >"$TMP/checker.py" <<'PY'
import json, subprocess, sys, time, urllib.request

TMP, DEADLINE, SLACK = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
NODES = [1, 2, 3]
violations = 0

def now():
    return time.time()

def violation(msg):
    global violations
    violations += 1
    print(f"chaos: VIOLATION {msg}", flush=True)

def state(n):
    try:
        with urllib.request.urlopen(f"http://10.214.0.2{n}:9153/v1/state", timeout=1) as r:
            return json.load(r)
    except Exception:
        return None

def view(s):
    drains = sorted(d["id"] for d in s.get("drains", []) if d["status"] == "in force")
    steps = sorted((f["cdn"], f["removed_percent"]) for f in s.get("failover", []))
    return (tuple(drains), s.get("failover_frozen") is not None), tuple(steps), s.get("policy_version")

def answers(n, subnets):
    args = ["dig", f"@10.214.0.2{n}", "-p", "5353", "+short", "+time=1", "+tries=2"]
    out = []
    for sub in subnets:
        out += [f"+subnet={sub}", "www.example.com"]
    r = subprocess.run(args[:4] + args[4:] + out, capture_output=True, text=True)
    return [l for l in r.stdout.split() if l.endswith(".net.")]

def faults():
    active = {}
    with open(f"{TMP}/faults") as f:
        for line in f:
            at, what, kind, target = line.split()
            if what == "start":
                active[(kind, target)] = int(at) / 1000
            else:
                active.pop((kind, target), None)
    return active

def healed():
    """When the drill said the last fault healed ("end all"), or None."""
    with open(f"{TMP}/faults") as f:
        for line in f:
            at, what, kind, _ = line.split()
            if what == "end" and kind == "all":
                return int(at) / 1000
    return None

since = {}      # (what, pair of nodes) -> when the disagreement was first seen
reported = set()
cut_seen = {}
while now() < DEADLINE and healed() is None:
    states = {n: state(n) for n in NODES}
    active = faults()
    connected = {n: s for n, s in states.items() if s and s["cluster"]["connected"]}
    views = {n: view(s) for n, s in connected.items()}
    for a in connected:
        for b in connected:
            if a >= b:
                continue
            for i, (what, limit) in enumerate([("drains/freeze", 2.0 + SLACK), ("steps", 3.0 + SLACK), ("policy version", 3.0 + SLACK)]):
                key = (what, a, b)
                if views[a][i] != views[b][i]:
                    first = since.setdefault(key, now())
                    if now() - first > limit and key not in reported:
                        reported.add(key)
                        violation(f"ns{a} and ns{b} disagree on {what} for over {limit} s: {views[a][i]} / {views[b][i]}")
                else:
                    since.pop(key, None)
                    reported.discard(key)
    for (kind, target), at in active.items():
        if kind == "cut-etcd":
            n = int(target[-1])
            s = states[n]
            if (kind, target, at) in cut_seen or not s:
                continue
            if s["cluster"]["fail_static"]:
                cut_seen[(kind, target, at)] = True
                print(f"chaos: {target} fail-static {now() - at:.1f} s after the cut (within a poll of 0.5 s)", flush=True)
            elif now() - at > 3.0 + SLACK:
                cut_seen[(kind, target, at)] = True
                violation(f"{target} cut off from etcd for {now() - at:.1f} s is not fail-static (connected: {s['cluster']['connected']})")
    for n, s in states.items():
        if not s:
            continue
        cut = {c["cdn"] for c in s.get("drains", [])} | {t["cdn"] for t in s["cluster"].get("timelines", [])}
        for f in s.get("failover", []):
            if f["removed_percent"] > 0 and f["cdn"] not in cut:
                violation(f"ns{n} removes {f['removed_percent']} % of {f['cdn']} without a drain or timeline")
    for n in NODES:
        if not answers(n, ["192.0.2.0/24"]):
            violation(f"ns{n} answered no CDN")
    time.sleep(0.5)

# The last fault has healed: every node converges within 5 s of the heal, and answers
# alike.
subnets = [f"198.18.{i}.0/24" for i in range(200)]
heal = healed() or now()
end = heal + 5
while True:
    states = {n: state(n) for n in NODES}
    ok = all(s and s["cluster"]["connected"] for s in states.values())
    ok = ok and len({view(s) for s in states.values()}) == 1
    if ok:
        got = {n: answers(n, subnets) for n in NODES}
        ok = got[1] == got[2] == got[3] and len(got[1]) == 200
    if ok or now() > end:
        break
    time.sleep(0.2)
if ok:
    print(f"chaos: ok   every node converged {now() - heal:.1f} s after the last fault healed; 200 resolvers answered alike", flush=True)
else:
    violation(f"no convergence within 5 s of the last heal: {[view(s) if s else None for s in states.values()]}")
print(f"chaos: {violations} violation(s)", flush=True)
sys.exit(1 if violations else 0)
PY

cli() { ip netns exec sc${R}-cli "$@"; }
field() { # field N PYTHON-EXPR on node N's /v1/state (as `s`)
    cli curl -s --max-time 2 "http://10.214.0.2$1:9153/v1/state" | python3 -c "import json,sys
try: s = json.load(sys.stdin)
except Exception: s = {}
try: print($2)
except Exception as e: print('?', e)"
}
for n in 1 2 3; do
    for _ in $(seq 200); do
        [[ $(field "$n" "s['cluster']['connected'] and len(s['cluster']['vantages']) >= 5") == True ]] && break
        sleep 0.1
    done
    [[ $(field "$n" "s['cluster']['connected']") == True ]] || die "ns$n did not join the set; see $TMP/ns$n.log (KEEP=1)"
done
log "3 nodes and 2 agents joined; faults for $DURATION s from seed $SEED"

api() { # api N METHOD PATH [JSON]
    cli curl -s --max-time 5 -X "$2" -H "Authorization: Bearer $(cat "$TMP/api-token")" \
        -H 'content-type: application/json' ${4:+--data "$4"} "http://10.214.0.2$1:9153$3"
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }
mark() { echo "$(now_ms) $1 $2 $3" >>"$TMP/faults"; }
hold() { sleep "$1"; }

# --- PROFILE=wan: each lever's time to every node, and the bytes at rest -------------
if [[ $PROFILE == wan ]]; then
    cat >"$TMP/measure.py" <<'PY'
import json, sys, time, urllib.request

TMP, BOUND_MS, POLICY_BOUND_MS = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
TOKEN = open(f"{TMP}/api-token").read().strip()
NODES = [1, 2, 3]
failed = 0

def call(n, method, path, body=None, headers=None):
    req = urllib.request.Request(f"http://10.214.0.2{n}:9153{path}", method=method, data=body,
                                 headers={"Authorization": f"Bearer {TOKEN}", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, {}

def state(n):
    try:
        with urllib.request.urlopen(f"http://10.214.0.2{n}:9153/v1/state", timeout=1) as r:
            return json.load(r)
    except Exception:
        return {}

def everywhere(what, through, t0, done, bound=None):
    """Polls every node each 20 ms until `done(state)`; prints and checks the slowest."""
    global failed
    bound = bound or BOUND_MS
    took = {}
    while len(took) < 3 and time.monotonic() - t0 < 10:
        for n in NODES:
            if n not in took and done(state(n)):
                took[n] = (time.monotonic() - t0) * 1000
        time.sleep(0.02)
    slowest = max(took.values()) if len(took) == 3 else None
    per = ", ".join(f"ns{n} {took[n]:.0f}" if n in took else f"ns{n} never" for n in NODES)
    if slowest is None or slowest > bound:
        failed += 1
        print(f"chaos: VIOLATION wan: {what} through ns{through}: not on every node within {bound} ms ({per} ms)", flush=True)
    else:
        print(f"chaos: wan: {what} through ns{through}: on every node in {slowest:.0f} ms ({per} ms)", flush=True)
    return slowest

def in_force(s):
    return [d["id"] for d in s.get("drains", []) if d["status"] == "in force"]

def node_bytes():
    total = {n: 0 for n in NODES}
    for m in NODES:
        try:
            doc = json.load(open(f"{TMP}/bytes-m{m}.json"))
        except (OSError, ValueError):
            continue
        for n in NODES:
            c = doc.get(f"10.214.0.2{n}", {})
            total[n] += c.get("up", 0) + c.get("down", 0)
    return total

# At rest: 30 s of each node's traffic to and from etcd, through the relays.
before, t = node_bytes(), time.monotonic()
time.sleep(30)
after, took = node_bytes(), time.monotonic() - t
rest = {n: (after[n] - before[n]) * 60 / took / 1024 for n in NODES}
print("chaos: wan: etcd traffic at rest per node: " + ", ".join(f"ns{n} {rest[n]:.0f} KiB/min" for n in NODES), flush=True)

policies = [open(f"{TMP}/policy-b.yaml", "rb").read(), open(f"{TMP}/policy-a.yaml", "rb").read()]
for through in NODES:
    t0 = time.monotonic()
    code, d = call(through, "POST", "/v1/drains", json.dumps({"name": "www.example.com", "cdn": "cloudflare", "reason": "wan: measured", "immediate": True}).encode(), {"content-type": "application/json"})
    if code != 201:
        failed += 1
        print(f"chaos: VIOLATION wan: drain through ns{through}: {code}", flush=True)
        continue
    everywhere("drain", through, t0, lambda s: d["id"] in in_force(s))
    t0 = time.monotonic()
    call(through, "DELETE", f"/v1/drains/{d['id']}")
    everywhere("undrain", through, t0, lambda s: s and d["id"] not in in_force(s))
    t0 = time.monotonic()
    call(through, "POST", "/v1/failover/freeze", b'{"reason":"wan: measured"}', {"content-type": "application/json"})
    everywhere("freeze", through, t0, lambda s: s.get("failover_frozen") is not None)
    t0 = time.monotonic()
    call(through, "POST", "/v1/failover/resume", b'{"reason":"wan: measured"}', {"content-type": "application/json"})
    everywhere("resume", through, t0, lambda s: s and s.get("failover_frozen") is None)
    _, p = call(through, "GET", "/v1/policy")
    body = policies[0] if p.get("version") != __import__("hashlib").sha256(policies[0]).hexdigest()[:12] else policies[1]
    version = __import__("hashlib").sha256(body).hexdigest()[:12]
    t0 = time.monotonic()
    code, _ = call(through, "POST", "/v1/policy", body, {"If-Match": f'"{p.get("version")}"'})
    if code != 202:
        failed += 1
        print(f"chaos: VIOLATION wan: policy through ns{through}: {code}", flush=True)
        continue
    everywhere("policy version", through, t0, lambda s: s.get("policy_version") == version, POLICY_BOUND_MS)
sys.exit(1 if failed else 0)
PY
    log "wan: measuring each lever's time to every node (bounds: $WAN_BOUND_MS ms, a policy version $WAN_POLICY_BOUND_MS ms) and the traffic at rest"
    cli python3 "$TMP/measure.py" "$TMP" "$WAN_BOUND_MS" "$WAN_POLICY_BOUND_MS" || MEASURE_FAILED=1
fi
MEASURE_FAILED=${MEASURE_FAILED:-0}

node_bytes() { # each node's bytes to and from etcd so far, through the relays: "B1 B2 B3"
    python3 - "$TMP" <<'PY'
import json, sys
total = [0, 0, 0]
for m in (1, 2, 3):
    try:
        doc = json.load(open(f"{sys.argv[1]}/bytes-m{m}.json"))
    except (OSError, ValueError):
        continue
    for n in (1, 2, 3):
        c = doc.get(f"10.214.0.2{n}", {})
        total[n - 1] += c.get("up", 0) + c.get("down", 0)
print(*total)
PY
}
start=$(date +%s)
deadline=$((start + DURATION))
read -r -a bytes_start <<<"$(node_bytes)"
# The checker checks until the drill marks the last fault healed ("end all"), then
# checks convergence from that instant.
cli python3 "$TMP/checker.py" "$TMP" "$((deadline + 30))" "$(python3 -c "print($MAX_RTT_MS * 2 / 1000)")" &
checker=$!
RANDOM=$SEED
KINDS=8
[[ $PROFILE == wan ]] && KINDS=9
faults=0
applied=0
DRAIN_LOST=0
while (($(date +%s) + 10 < deadline)); do
    faults=$((faults + 1))
    n=$((RANDOM % 3 + 1))
    case $((RANDOM % KINDS)) in
        0)
            # A drain posted meanwhile must reach the nodes that watched that member.
            d=$((RANDOM % 3 + 1))
            log "fault $faults: etcd member m$n frozen (SIGSTOP) for 4 s, a drain of cloudflare posted to ns$d meanwhile"
            mark start freeze-member "m$n"
            kill -STOP "${MEMBER[$n]}"
            t0=$(now_ms) r=""
            for _ in 1 2 3 4 5 6 7 8 9 10; do
                r=$(api "$d" POST /v1/drains '{"name":"www.example.com","cdn":"cloudflare","reason":"chaos: while a member hangs","immediate":true}')
                [[ $r == *'"id"'* ]] && break
                sleep 0.3
            done
            # One member of three hung: the other two hold the quorum, and the node moves
            # to one of them; a drain that never went through is a violation.
            if [[ $r == *'"id"'* ]]; then
                log "fault $faults: the drain went through ns$d $(($(now_ms) - t0)) ms after the first try"
            else
                echo "chaos: VIOLATION no drain went through ns$d in 10 tries over $(($(now_ms) - t0)) ms while m$n hung: ${r:0:100}"
                DRAIN_LOST=$((DRAIN_LOST + 1))
            fi
            hold 4
            kill -CONT "${MEMBER[$n]}"
            mark end freeze-member "m$n"
            ;;
        1)
            log "fault $faults: etcd member m$n killed, restarted after 4 s"
            mark start kill-member "m$n"
            kill -KILL "${MEMBER[$n]}"
            wait "${MEMBER[$n]}" 2>/dev/null
            hold 4
            member_up "$n"
            mark end kill-member "m$n"
            ;;
        2)
            log "fault $faults: ns$n cut off from etcd for 5 s"
            mark start cut-etcd "ns$n"
            for m in 1 2 3; do ip -n "sc${R}-n$n" route add blackhole "10.214.0.1$m/32"; done
            hold 5
            for m in 1 2 3; do ip -n "sc${R}-n$n" route del blackhole "10.214.0.1$m/32"; done
            mark end cut-etcd "ns$n"
            ;;
        3)
            log "fault $faults: 200 ms delay and 5 % loss on ns$n's links to etcd for 5 s (the relays)"
            mark start delay-loss "ns$n"
            LINK_FAULT[10.214.0.2$n]='"delay_ms": 200, "loss": 0.05'
            write_links
            hold 5
            unset "LINK_FAULT[10.214.0.2$n]"
            write_links
            mark end delay-loss "ns$n"
            ;;
        8)
            # PROFILE=wan only: a burst of loss on every link from or to one site.
            pct=$((RANDOM % 5 + 1))
            log "fault $faults: ${pct} % loss on every link of site ${SITE[$n]} for 6 s (the relays)"
            mark start loss-burst "site-${SITE[$n]}"
            SITE_FAULT="\"${SITE[$n]}\": {\"loss\": 0.0$pct}"
            write_links
            hold 6
            SITE_FAULT=""
            write_links
            mark end loss-burst "site-${SITE[$n]}"
            ;;
        4)
            offset=$(((RANDOM % 2) * 4 - 2))
            log "fault $faults: ns$n's clock ${offset} s off for 10 s"
            mark start clock "ns$n"
            printf '%+ds\n' "$offset" >"$TMP/clock-ns$n"
            hold 10
            echo "+0" >"$TMP/clock-ns$n"
            mark end clock "ns$n"
            ;;
        5)
            log "fault $faults: fastly failing for ns$n and agent1 for 8 s"
            mark start cdn-fails "ns$n"
            ip -n "sc${R}-n$n" route add blackhole 10.214.0.41/32
            ip -n sc${R}-g1 route add blackhole 10.214.0.41/32
            hold 8
            ip -n "sc${R}-n$n" route del blackhole 10.214.0.41/32
            ip -n sc${R}-g1 route del blackhole 10.214.0.41/32
            mark end cdn-fails "ns$n"
            ;;
        6)
            id=$(cli curl -s --max-time 2 "http://10.214.0.2$n:9153/v1/state" |
                python3 -c 'import json,sys; d=[x["id"] for x in json.load(sys.stdin).get("drains",[]) if x["status"]=="in force"]; print(d[0] if d else "")' || true)
            if [[ -n $id ]]; then
                log "fault $faults: DELETE drain $id through ns$n: $(api "$n" DELETE "/v1/drains/$id" | head -c 80)"
            else
                cdn=fastly
                ((RANDOM % 2)) && cdn=cloudflare
                log "fault $faults: drain $cdn through ns$n: $(api "$n" POST /v1/drains "{\"name\":\"www.example.com\",\"cdn\":\"$cdn\",\"reason\":\"chaos\",\"immediate\":true}" | head -c 80)"
            fi
            hold 3
            ;;
        7)
            # The TTL goes 30 → 31 → 30: each apply a new version for the whole set.
            in_force=$(cli curl -s --max-time 2 "http://10.214.0.2$n:9153/v1/policy" |
                python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])' || true)
            next=$TMP/policy-a.yaml
            [[ $in_force == "$(sha256sum <"$TMP/policy-b.yaml" | cut -c1-12)" ]] || next=$TMP/policy-b.yaml
            [[ $in_force == "$(sha256sum <"$TMP/policy-a.yaml" | cut -c1-12)" ]] && next=$TMP/policy-b.yaml
            log "fault $faults: policy $(basename "$next") applied through ns$n over $in_force: $(cli curl -s --max-time 5 -X POST -H "Authorization: Bearer $(cat "$TMP/api-token")" -H "If-Match: \"$in_force\"" --data-binary "@$next" "http://10.214.0.2$n:9153/v1/policy" | tr -d '\n ' | head -c 100)"
            applied=$((applied + 1))
            hold 3
            ;;
    esac
    hold 2
done
mark end all -
log "last fault healed; $faults faults injected, $applied of them policy applies"
sleep 1 # the relays write their counts each second
read -r -a bytes_end <<<"$(node_bytes)"
minutes=$(python3 -c "print(max(1, $(date +%s) - $start) / 60)")
log "etcd traffic per node during the faults: $(for n in 0 1 2; do python3 -c "print(f'ns$((n + 1)) {(${bytes_end[$n]:-0} - ${bytes_start[$n]:-0}) / 1024 / $minutes:.0f} KiB/min', end='; ')"; done)"
if wait "$checker" && ((DRAIN_LOST == 0 && MEASURE_FAILED == 0)); then ok "no invariant violated under $faults faults"; else fail "invariants violated (see above)"; fi
summary
