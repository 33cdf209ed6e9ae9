#!/usr/bin/env bash
# A set of many nodes against one real etcd across an ocean (issue 48, item 4): NODES
# steerdns nodes (processes, `serve --etcd`), each serving a policy of NAMES steered names
# (benches/scale_policy.py) and probing three CDNs (one stand-in, python http.server),
# all talking to one etcd member through tests/wan-relay.py with DELAY_MS one way (and a
# tenth of it as jitter), as if etcd were on another continent. It measures:
#
#   (a) a drain posted to one node's API until every node shows it `in force` in
#       /v1/state (each node polled every 20 ms): the median node and the slowest,
#       REPEATS times (each drain then removed);
#   (b) the keys in etcd per kind (the path component after the prefix) and the
#       largest value;
#   (c) the bytes between the nodes and etcd per node per minute, at rest (the relay's
#       --stats) over REST_SECONDS, and during the drains;
#   (d) etcd's CPU (utime + stime) per minute and its RSS, at rest and during the drains;
#   (e) the leases (etcdctl lease list) and, from etcd's /metrics, the keepalives, puts,
#       ranges and watch events per second at rest;
#   (f) a node restarted at rest: the seconds until its whole read is done;
#   (g) an incident: fastly's canary removed, so every node sees fastly down: the time
#       until every node has every name's first step, etcd's load, the timeline races,
#       the audit entries and leases it leaves; then a node restarted with those keys.
#
#   bash benches/set-scale.sh                      # 50 nodes, 1,000 names, 100 ms one way
#   NODES=10 NAMES=100 REST_SECONDS=20 bash benches/set-scale.sh   # a quick one
#
# Environment:
#   NODES=50          steerdns nodes (ns1 ... nsN, all of --members)
#   NAMES=1000        steered names; REGIONS=20 regions each (scale_policy.py)
#   DELAY_MS=100      one-way delay between every node and etcd (jitter: a tenth of it)
#   BATCH=10          nodes started at once (each batch waits for cluster.connected)
#   REPEATS=3         drains measured
#   REST_SECONDS=60   the window at rest
#   PROBE_INTERVAL=10 interval_seconds of the three probes (0: no probes, no observations)
#   INCIDENT=1        0: skip the CDN incident (and the restart after it)
#   WAN_RELAY         the relay (default tests/wan-relay.py)
#   STEERDNS_BIN      the binary (default: cargo build --release)
#   KEEP=1            keep the scratch directory (logs, etcd data, raw readings)
#
# Needs etcd and etcdctl (Debian etcd-server, etcd-client: etcd 3.4), python3, curl.
# Every address is on 127.0.0.1 (ports below the ephemeral range); every process started
# is stopped on exit. It is heavy (etcd and NODES nodes on one machine): on a shared
# machine, run it under the heavy-run lock (`flock /work/heavy.lock bash benches/...`).
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode
script_init set-scale
LOG_STDERR=1
NODES=${NODES:-50}
NAMES=${NAMES:-1000}
REGIONS=${REGIONS:-20}
DELAY_MS=${DELAY_MS:-100}
BATCH=${BATCH:-10}
REPEATS=${REPEATS:-3}
REST_SECONDS=${REST_SECONDS:-60}
PROBE_INTERVAL=${PROBE_INTERVAL:-10}
INCIDENT=${INCIDENT:-1}
WAN_RELAY=${WAN_RELAY:-tests/wan-relay.py}
PREFIX=/steerdns/

require etcd etcdctl python3 curl
[[ -f $WAN_RELAY ]] || die "no relay at $WAN_RELAY (tests/wan-relay.py, issue 48 item 1; WAN_RELAY=FILE)"
build_release
make_tmp set-scale

# --- etcd, and the relay in front of it ---------------------------------------------
EC=$(free_port)
EP=$(free_port)
etcd --name m1 --data-dir "$TMP/etcd" \
    --listen-client-urls "http://127.0.0.1:$EC" --advertise-client-urls "http://127.0.0.1:$EC" \
    --listen-peer-urls "http://127.0.0.1:$EP" --initial-advertise-peer-urls "http://127.0.0.1:$EP" \
    --initial-cluster "m1=http://127.0.0.1:$EP" >"$TMP/etcd.log" 2>&1 &
ETCD_PID=$!
track "$ETCD_PID"
ctl() { ETCDCTL_API=3 etcdctl --endpoints="http://127.0.0.1:$EC" "$@"; }
for _ in $(seq 100); do ctl endpoint health >/dev/null 2>&1 && break; sleep 0.1; done
ctl endpoint health >/dev/null 2>&1 || die "etcd did not start: $(tail -5 "$TMP/etcd.log")"

RP=$(free_port)
python3 - "$DELAY_MS" >"$TMP/wan.json" <<'PY'
import json, sys
d = float(sys.argv[1])
print(json.dumps({"from": {"127.0.0.1": {"delay_ms": d, "jitter_ms": d / 10}}}))
PY
python3 "$WAN_RELAY" --profile "$TMP/wan.json" --stats "$TMP/relay-stats.json" \
    "tcp:127.0.0.1:$RP=127.0.0.1:$EC" >"$TMP/relay.log" 2>&1 &
RELAY_PID=$!
track "$RELAY_PID"
log "etcd $(etcd --version | head -1 | awk '{print $3}') on 127.0.0.1:$EC; the nodes reach it through the relay on :$RP ($DELAY_MS ms one way)"

# --- the policy, the stand-in CDN, the probes, the token -----------------------------
python3 benches/scale_policy.py "$TMP/policy" "$NAMES" "$REGIONS"
mkdir -p "$TMP/probes"
if ((PROBE_INTERVAL > 0)); then
    # One stand-in for the three CDNs, each under its own path (its canary removed
    # breaks that CDN alone).
    for cdn in fastly cloudflare akamai; do
        mkdir -p "$TMP/cdn/$cdn/_health" && cp probes/_health/v1.txt "$TMP/cdn/$cdn/_health/"
    done
    start_cdn cdn "$TMP/cdn"
    for cdn in fastly cloudflare akamai; do
        cat >"$TMP/probes/$cdn.yaml" <<YAML
url: http://127.0.0.1:${CDN_PORT[cdn]}/$cdn/_health/v1.txt
expect_body: healthy-v1
timeout_ms: 2000
interval_seconds: $PROBE_INTERVAL
quorum: 1
down_after: 2
up_after: 3
YAML
    done
fi
(umask 077 && echo "set-scale-$RANDOM$RANDOM" >"$TMP/api-token")
TOKEN=$(cat "$TMP/api-token")
MEMBERS=$(seq -f 'ns%g' 1 "$NODES" | paste -sd,)

# --- the nodes, in batches ------------------------------------------------------------
declare -a NODE_PID API_PORT
start_node() { # K
    local k=$1 dns
    dns=$(free_port)
    API_PORT[k]=$(free_port)
    NO_COLOR=1 "$STEERDNS_BIN" serve --config "$TMP/policy/steering.yaml" --zones "$TMP/policy/zones" \
        --geo geo/country.mmdb --probes "$TMP/probes" --state-dir "$TMP/state-ns$k" \
        --listen "127.0.0.1:$dns" --api "127.0.0.1:${API_PORT[k]}" --api-token-file "$TMP/api-token" \
        --reload-poll-ms 0 --steering-http off \
        --node "ns$k" --etcd "http://127.0.0.1:$RP" --etcd-insecure --members "$MEMBERS" \
        >>"$TMP/ns$k.log" 2>&1 &
    NODE_PID[k]=$!
    track "$!"
}
connected() { # K: whether node K's /v1/state says cluster.connected
    curl -s --max-time 5 "http://127.0.0.1:${API_PORT[$1]}/v1/state" |
        python3 -c 'import json,sys
try: print(json.load(sys.stdin)["cluster"]["connected"])
except Exception: print(False)' | grep -q True
}
T_START=$(date +%s%N)
for ((first = 1; first <= NODES; first += BATCH)); do
    last=$((first + BATCH - 1 < NODES ? first + BATCH - 1 : NODES))
    for ((k = first; k <= last; k++)); do start_node "$k"; done
    for ((k = first; k <= last; k++)); do
        for _ in $(seq 600); do
            connected "$k" && break
            kill -0 "${NODE_PID[k]}" 2>/dev/null || die "ns$k exited: $(tail -5 "$TMP/ns$k.log")"
            sleep 0.5
        done
        connected "$k" || die "ns$k not connected after 300 s: $(tail -5 "$TMP/ns$k.log")"
    done
    log "ns$first..ns$last connected ($((($(date +%s%N) - T_START) / 1000000000)) s since the first started)"
done
STARTUP_S=$((($(date +%s%N) - T_START) / 1000000000))
STATE_BYTES=$(curl -s "http://127.0.0.1:${API_PORT[1]}/v1/state" | wc -c)
NODE_RSS_KB=$(for ((k = 1; k <= NODES; k++)); do rss_kb "${NODE_PID[k]}"; done | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
echo "set-scale: $NODES nodes, $NAMES names x $REGIONS regions, probes every ${PROBE_INTERVAL} s (3 CDNs)," \
    "one etcd member through the relay at $DELAY_MS ms one way (jitter $((DELAY_MS / 10)) ms);" \
    "$(git describe --always --dirty 2>/dev/null || echo '?'), $(date -u +%Y-%m-%dT%H:%MZ)"
echo "startup: $NODES nodes connected in $STARTUP_S s (batches of $BATCH); node RSS median $((NODE_RSS_KB / 1024)) MiB;" \
    "/v1/state of one node $((STATE_BYTES / 1024)) KiB"
policy=$(ctl get "${PREFIX}policy" --print-value-only | wc -c)
echo "the set's policy record: $policy bytes (the policy file: $(wc -c <"$TMP/policy/steering.yaml") bytes)"
first=$(grep -h -m1 "first version" "$TMP/ns1.log" || true)
[[ -z $first ]] || echo "ns1: ${first#*INFO }"
# Let the start settle (every node's first probe rounds, audit heads).
sleep $((PROBE_INTERVAL > 0 ? 2 * PROBE_INTERVAL : 10))

# --- readings ----------------------------------------------------------------------------
# relay_bytes: the bytes relayed so far between the nodes and etcd, "UP DOWN".
relay_bytes() {
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
print(sum(v["up"] for v in d.values()), sum(v["down"] for v in d.values()))' "$TMP/relay-stats.json"
}
metrics() { curl -s "http://127.0.0.1:$EC/metrics" >"$1"; }
revision() { ctl endpoint status -w json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["Status"]["header"]["revision"])'; }
HZ=$(clock_ticks)

# --- (c), (d), (e) at rest ---------------------------------------------------------------
log "at rest for $REST_SECONDS s"
metrics "$TMP/metrics-rest-0.txt"
read -r up0 down0 < <(relay_bytes)
c0=$(cpu_ticks "$ETCD_PID")
r0=$(cpu_ticks "$RELAY_PID")
nodes_cpu() { for ((k = 1; k <= NODES; k++)); do cpu_ticks "${NODE_PID[k]}"; done | awk '{ s += $1 } END { print s }'; }
n0=$(nodes_cpu)
rev0=$(revision)
t0=$(date +%s%N)
sleep "$REST_SECONDS"
t1=$(date +%s%N)
rev1=$(revision)
c1=$(cpu_ticks "$ETCD_PID")
r1=$(cpu_ticks "$RELAY_PID")
n1=$(nodes_cpu)
read -r up1 down1 < <(relay_bytes)
metrics "$TMP/metrics-rest-1.txt"
ETCD_RSS_REST=$(rss_kb "$ETCD_PID")
LEASES=$(ctl lease list | sed -n 's/^found \([0-9]*\) leases.*/\1/p')
REST="$TMP/rest.txt"
python3 - "$NODES" "$t0" "$t1" "$c0" "$c1" "$HZ" "$up0" "$up1" "$down0" "$down1" "$rev0" "$rev1" \
    "$r0" "$r1" "$n0" "$n1" "$TMP/metrics-rest-0.txt" "$TMP/metrics-rest-1.txt" >"$REST" <<'PY'
import re, sys
n, t0, t1, c0, c1, hz, up0, up1, d0, d1, rev0, rev1, r0, r1, n0, n1 = map(float, sys.argv[1:17])
m0, m1 = sys.argv[17:19]
secs = (t1 - t0) / 1e9
per_min = 60 / secs
def read(path):
    out = {}
    for line in open(path):
        if line.startswith("#"):
            continue
        g = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)", line)
        if g:
            out[g.group(1) + (g.group(2) or "")] = float(g.group(3))
    return out
a, b = read(m0), read(m1)
def rate(name):
    # etcd 3.4 has most mvcc counters under both names (etcd_debugging_mvcc_* too).
    for n in (name, name.replace("etcd_debugging_mvcc_", "etcd_mvcc_")):
        keys = [k for k in b if k == n or k.startswith(n + "{")]
        if keys:
            return sum(b[k] - a.get(k, 0) for k in keys) / secs
    return float("nan")
def gauge(name):
    return sum(v for k, v in b.items() if k == name or k.startswith(name + "{"))
print(f"window at rest: {secs:.0f} s")
print(f"bytes nodes<->etcd per node per minute: {((up1 - up0) + (d1 - d0)) / n * per_min / 1024:.1f} KiB "
      f"(to etcd {(up1 - up0) / n * per_min / 1024:.1f} KiB, from etcd {(d1 - d0) / n * per_min / 1024:.1f} KiB)")
print(f"etcd CPU per minute at rest: {(c1 - c0) / hz * per_min:.2f} s")
print(f"relay CPU per minute at rest: {(r1 - r0) / hz * per_min:.2f} s; a node's CPU per minute at rest (mean): {(n1 - n0) / hz * per_min / n:.2f} s")
print(f"writes (revisions) per second at rest: {(rev1 - rev0) / secs:.2f}")
print(f"etcd puts/s {rate('etcd_debugging_mvcc_put_total'):.2f}, txns/s {rate('etcd_debugging_mvcc_txn_total'):.2f}, "
      f"ranges/s {rate('etcd_debugging_mvcc_range_total'):.2f}, "
      f"watch events sent/s {rate('etcd_debugging_mvcc_events_total'):.1f}")
print(f"leases: granted/s {rate('etcd_debugging_lease_granted_total'):.2f}, "
      f"renewed (keepalives)/s {rate('etcd_debugging_lease_renewed_total'):.2f}, "
      f"revoked/s {rate('etcd_debugging_lease_revoked_total'):.2f}")
print(f"watchers {gauge('etcd_debugging_mvcc_watcher_total'):.0f}, watch streams {gauge('etcd_debugging_mvcc_watch_stream_total'):.0f}, "
      f"keys {gauge('etcd_debugging_mvcc_keys_total'):.0f}, db {gauge('etcd_mvcc_db_total_size_in_bytes') / 1048576:.1f} MiB "
      f"(in use {gauge('etcd_mvcc_db_total_size_in_use_in_bytes') / 1048576:.1f} MiB)")
PY
echo
cat "$REST"
echo "etcd RSS at rest: $((ETCD_RSS_REST / 1024)) MiB; leases (etcdctl lease list): $LEASES"

# --- (a) drains ----------------------------------------------------------------------------
log "drains: $REPEATS, each posted to one node, polled on all $NODES every 20 ms"
read -r sup0 sdown0 < <(relay_bytes)
s0=$(cpu_ticks "$ETCD_PID")
st0=$(date +%s%N)
ports=$(for ((k = 1; k <= NODES; k++)); do echo "${API_PORT[k]}"; done | paste -sd,)
python3 - "$ports" "$TOKEN" "$REPEATS" "$ETCD_PID" "$TMP/drains.tsv" >"$TMP/drains.txt" <<'PY'
import concurrent.futures, http.client, json, statistics, sys, threading, time
ports, token, repeats, etcd_pid, out = sys.argv[1].split(","), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
rss_max = [0]
sampling = threading.Event()
def sample_rss():
    while not sampling.is_set():
        for line in open(f"/proc/{etcd_pid}/status"):
            if line.startswith("VmRSS:"):
                rss_max[0] = max(rss_max[0], int(line.split()[1]))
        time.sleep(0.1)
threading.Thread(target=sample_rss, daemon=True).start()
def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
    headers = {"Authorization": f"Bearer {token}", "content-type": "application/json"}
    c.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data
def wait_in_force(port, reason, t0, deadline):
    # Polling starts before the POST: the drain is known by its reason (unique).
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
    while time.monotonic() < deadline:
        c.request("GET", "/v1/state")
        data = c.getresponse().read()
        # Parsed only once the reason is in it (50 pollers share one GIL).
        if reason.encode() in data and any(d.get("reason") == reason and d.get("status") == "in force" for d in json.loads(data).get("drains", [])):
            return time.monotonic() - t0
        time.sleep(0.02)
    return float("inf")
rows = []
with open(out, "w") as f:
    for i in range(repeats):
        k = i % len(ports)
        name = f"h{(7 + 13 * i) % 1000:04d}.example.com"
        reason = f"set-scale drain {i + 1} {time.time():.0f}"
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(len(ports)) as pool:
            waits = [pool.submit(wait_in_force, p, reason, t0, t0 + 30) for p in ports]
            status, data = call(ports[k], "POST", "/v1/drains",
                                {"name": name, "cdn": "fastly", "reason": reason, "immediate": True})
            posted = time.monotonic() - t0
            if status != 201:
                sys.exit(f"POST /v1/drains to ns{k + 1}: {status} {data[:300]!r}")
            drain_id = json.loads(data)["id"]
            took = [w.result() for w in waits]
        took_ms = sorted(t * 1000 for t in took)
        med, slow = statistics.median(took_ms), took_ms[-1]
        others = sorted(t * 1000 for j, t in enumerate(took) if j != k)
        print(f"drain {i + 1}: {name} fastly posted to ns{k + 1} (201 after {posted * 1000:.0f} ms); in force on "
              f"every node: median {med:.0f} ms, slowest {slow:.0f} ms, "
              f"the writer itself {took[k] * 1000:.0f} ms, fastest other {others[0]:.0f} ms")
        f.write(f"{i + 1}\t{posted * 1000:.0f}\t{med:.0f}\t{slow:.0f}\n")
        rows.append((med, slow))
        status, data = call(ports[k], "DELETE", f"/v1/drains/{drain_id}")
        time.sleep(5)
sampling.set()
print(f"etcd RSS at most {rss_max[0] / 1024:.1f} MiB during the drains")
PY
st1=$(date +%s%N)
s1=$(cpu_ticks "$ETCD_PID")
read -r sup1 sdown1 < <(relay_bytes)
python3 - "$NODES" "$st0" "$st1" "$s0" "$s1" "$HZ" "$sup0" "$sup1" "$sdown0" "$sdown1" >>"$TMP/drains.txt" <<'PY'
import sys
n, t0, t1, c0, c1, hz, u0, u1, d0, d1 = map(float, sys.argv[1:])
secs = (t1 - t0) / 1e9
print(f"during the drains ({secs:.0f} s, polling included): etcd CPU {(c1 - c0) / hz * 60 / secs:.2f} s per minute; "
      f"bytes nodes<->etcd per node per minute {((u1 - u0) + (d1 - d0)) / n * 60 / secs / 1024:.1f} KiB")
PY
echo
cat "$TMP/drains.txt"

# --- (b) keys and values ------------------------------------------------------------------
ctl get "$PREFIX" --prefix -w json >"$TMP/all.json"
KEYS="$TMP/keys.txt"
python3 - "$TMP/all.json" "$PREFIX" >"$KEYS" <<'PY'
import base64, collections, json, sys
doc = json.load(open(sys.argv[1]))
prefix = sys.argv[2]
kinds = collections.Counter()
largest = collections.defaultdict(lambda: (0, ""))
for kv in doc.get("kvs", []):
    key = base64.b64decode(kv["key"]).decode()
    size = len(base64.b64decode(kv.get("value", "")))
    kind = key[len(prefix):].split("/")[0]
    kinds[kind] += 1
    if size > largest[kind][0]:
        largest[kind] = (size, key)
print(f"keys under {prefix}: {sum(kinds.values())}")
print("| kind | keys | largest value |")
print("| --- | ---: | ---: |")
for kind, count in sorted(kinds.items()):
    print(f"| `{kind}` | {count} | {largest[kind][0]:,} B |")
top = max(largest.values())
print(f"largest value: {top[0]:,} bytes ({top[1]})")
PY

echo
cat "$KEYS"

# --- (f) a restart: the whole read -----------------------------------------------------------
# restart_node K: stops node K, starts it again (same state directory) and sets
# RESTART_S to the seconds until it says cluster.connected (its whole read of the store
# done). Not in a subshell: the new process is tracked.
restart_node() {
    stop "${NODE_PID[$1]}"
    local t0
    t0=$(date +%s%N)
    start_node "$1"
    until connected "$1"; do
        kill -0 "${NODE_PID[$1]}" 2>/dev/null || die "ns$1 exited: $(tail -5 "$TMP/ns$1.log")"
        (($(date +%s%N) - t0 < 600000000000)) || die "ns$1 not connected after 600 s"
        sleep 0.2
    done
    RESTART_S=$(python3 -c "import sys; print(f'{(int(sys.argv[2]) - int(sys.argv[1])) / 1e9:.1f}')" "$t0" "$(date +%s%N)")
}
timelines() { ctl get "${PREFIX}timeline/" --prefix --keys-only | grep -c . || true; }
echo
n_timelines=$(timelines)
restart_node 2
echo "ns2 restarted at rest ($n_timelines timeline keys): connected after $RESTART_S s"

# --- (g) an incident: fastly broken for every node -------------------------------------------
if ((PROBE_INTERVAL > 0)) && [[ $INCIDENT == 1 ]]; then
    log "incident: fastly's canary removed; every node sees fastly down after 2 rounds"
    metrics "$TMP/metrics-inc-0.txt"
    read -r iu0 id0 < <(relay_bytes)
    i0=$(cpu_ticks "$ETCD_PID")
    it0=$(date +%s%N)
    mv "$TMP/cdn/fastly/_health/v1.txt" "$TMP/fastly-canary"
    ports=$(for ((k = 1; k <= NODES; k++)); do echo "${API_PORT[k]}"; done | paste -sd,)
    python3 - "$ports" "$NAMES" "$ETCD_PID" "$RP" >"$TMP/incident.txt" <<'PY'
import concurrent.futures, http.client, json, statistics, sys, threading, time
ports, names, etcd_pid, rp = sys.argv[1].split(","), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
peak = {"rss": 0, "conns": 0}
done = threading.Event()
def sample():
    while not done.is_set():
        for line in open(f"/proc/{etcd_pid}/status"):
            if line.startswith("VmRSS:"):
                peak["rss"] = max(peak["rss"], int(line.split()[1]))
        conns = 0
        for line in open("/proc/net/tcp").readlines()[1:]:
            f = line.split()
            if int(f[1].split(":")[1], 16) == rp and f[3] == "01":
                conns += 1
        peak["conns"] = max(peak["conns"], conns)
        time.sleep(0.2)
threading.Thread(target=sample, daemon=True).start()
t0 = time.monotonic()
def demoted(port):
    c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
    while time.monotonic() < t0 + 300:
        try:
            c.request("GET", "/v1/state")
            doc = json.loads(c.getresponse().read())
        except (OSError, http.client.HTTPException, ValueError):
            c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
            continue
        n = sum(1 for f in doc.get("failover", []) if f.get("cdn") == "fastly" and f.get("removed_percent", 0) > 0)
        if n >= names:
            return time.monotonic() - t0
        time.sleep(1)
    return float("inf")
with concurrent.futures.ThreadPoolExecutor(len(ports)) as pool:
    took = sorted(pool.map(demoted, ports))
done.set()
print(f"fastly's canary removed: every name's first step on every node after: median node {statistics.median(took):.1f} s, "
      f"slowest {took[-1]:.1f} s (polled every 1 s; seeing it down takes 2 probe rounds)")
print(f"peak TCP connections to the relay (nodes to etcd) {peak['conns']}; etcd RSS at most {peak['rss'] / 1024:.1f} MiB")
PY
    it1=$(date +%s%N)
    i1=$(cpu_ticks "$ETCD_PID")
    read -r iu1 id1 < <(relay_bytes)
    metrics "$TMP/metrics-inc-1.txt"
    mv "$TMP/fastly-canary" "$TMP/cdn/fastly/_health/v1.txt"
    python3 - "$NODES" "$it0" "$it1" "$i0" "$i1" "$HZ" "$iu0" "$iu1" "$id0" "$id1" \
        "$TMP/metrics-inc-0.txt" "$TMP/metrics-inc-1.txt" >>"$TMP/incident.txt" <<'PY'
import collections, re, sys
n, t0, t1, c0, c1, hz, u0, u1, d0, d1 = map(float, sys.argv[1:11])
secs = (t1 - t0) / 1e9
def read(path):
    out = {}
    for line in open(path):
        g = re.match(r"([a-zA-Z_:]+)(\{[^}]*\})?\s+(\S+)", line)
        if g and not line.startswith("#"):
            out[g.group(1) + (g.group(2) or "")] = float(g.group(3))
    return out
a, b = read(sys.argv[11]), read(sys.argv[12])
grpc = collections.Counter()
for k, v in b.items():
    g = re.match(r'grpc_server_handled_total\{.*grpc_method="([^"]+)"', k)
    if g:
        grpc[g.group(1)] += v - a.get(k, 0)
events = sum(v - a.get(k, 0) for k, v in b.items() if k.startswith("etcd_debugging_mvcc_events_total"))
print(f"over those {secs:.0f} s: etcd CPU {(c1 - c0) / hz:.1f} s; bytes nodes<->etcd {((u1 - u0) + (d1 - d0)) / n / 1024:.0f} KiB per node; "
      f"watch events sent {events:,.0f}; gRPC calls: " + ", ".join(f"{m} {int(c):,}" for m, c in grpc.most_common() if c))
PY
    won=$(cat "$TMP"/ns*.log | grep -c "failover timeline written for the set" || true)
    lost=$(cat "$TMP"/ns*.log | grep -c "another node wrote the failover timeline first" || true)
    failed=$(cat "$TMP"/ns*.log | grep -c "cannot write the failover timeline" || true)
    echo "timeline writes: $won created, $lost lost the race (compare failed), $failed failed" >>"$TMP/incident.txt"
    audits=$(ctl get "${PREFIX}audit/" --prefix --keys-only | grep -c . || true)
    unwritten=$(cat "$TMP"/ns*.log | grep -c "cannot write an audit entry" || true)
    echo "then: $audits audit entries in etcd (each under its own lease), $(ctl lease list | sed -n 's/^found \([0-9]*\) leases.*/\1/p') leases; $unwritten audit entries not written (logged)" >>"$TMP/incident.txt"
    echo
    cat "$TMP/incident.txt"
    echo
    n_timelines=$(timelines)
    restart_node 3
    echo "ns3 restarted with $n_timelines timeline keys in etcd: connected after $RESTART_S s"
fi
