#!/usr/bin/env bash
# Content steering throughput: wrk against steerdns's --steering-http and against nginx
# serving the same manifest as a static file, on this machine. Reports responses per
# CPU-second of each server (its own processes' user + system time, from /proc), and
# steerdns's as a fraction of nginx's (the target is at least 0.8). A benchmark, not a
# test: it asserts nothing and exits 0 when both ran.
#
#   bash benches/content-steering.sh            # 3 rounds of 10 s each, 2 wrk threads, 32 connections
#   ROUNDS=5 SECONDS_EACH=20 CONNECTIONS=64 bash benches/content-steering.sh
#
# Needs wrk and nginx (Debian wrk, nginx-light), curl, python3.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode
LOG_STDERR=1
script_init content-steering
require wrk nginx curl python3
make_tmp content-steering
build_release

ROUNDS=${ROUNDS:-3}
SECONDS_EACH=${SECONDS_EACH:-10}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-2}
# What a player sends on a reload: its session, its pathway and its throughput.
QUERY='session=00c0ffee00c0ffee&_HLS_pathway=fastly&_HLS_throughput=4800000'

SP=$(free_port)
NP=$(free_port)
DP=$(free_port)
mkdir -p "$TMP/state"
"$STEERDNS_BIN" serve --listen "127.0.0.1:$DP" --api off --udp-sockets 1 \
    --state-dir "$TMP/state" --steering-http "127.0.0.1:$SP" >"$TMP/steerdns.log" 2>&1 &
STEERDNS=$!
track "$STEERDNS"
for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$SP/steer/hls/www.example.com?$QUERY" >"$TMP/manifest.json" 2>/dev/null && break
    sleep 0.1
done
[[ -s $TMP/manifest.json ]] || die "steerdns does not answer on $SP: $(cat "$TMP/steerdns.log")"

# nginx: the same bytes and headers (Content-Type, Cache-Control, CORS), from a file,
# with one worker process (CPU is counted for the master and the worker).
mkdir -p "$TMP/static/hls"
cp "$TMP/manifest.json" "$TMP/static/hls/www.example.com"
# nginx's worker runs as another user when started as root.
chmod 755 "$TMP"
chmod -R a+rX "$TMP/static"
cat >"$TMP/nginx.conf" <<CONF
worker_processes 1;
daemon off;
pid $TMP/nginx.pid;
error_log $TMP/nginx-error.log;
events { worker_connections 1024; }
http {
    # As a production static server would be tuned; keep-alive connections are not
    # closed after 1,000 requests (steerdns does not close them either).
    access_log off;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    open_file_cache max=64 inactive=60s;
    keepalive_requests 1000000;
    server {
        listen 127.0.0.1:$NP;
        location /steer/ {
            alias $TMP/static/;
            default_type application/json;
            add_header Cache-Control "max-age=30";
            add_header Access-Control-Allow-Origin "*";
        }
    }
}
CONF
nginx -c "$TMP/nginx.conf" -p "$TMP" >"$TMP/nginx.out" 2>&1 &
NGINX=$!
track "$NGINX"
for _ in $(seq 100); do
    curl -fs "http://127.0.0.1:$NP/steer/hls/www.example.com?$QUERY" >/dev/null 2>&1 && break
    sleep 0.1
done
curl -fs "http://127.0.0.1:$NP/steer/hls/www.example.com" >/dev/null || die "nginx does not answer: $(cat "$TMP/nginx.out" "$TMP/nginx-error.log" 2>/dev/null)"

# The CPU ticks of a process and its children (nginx's worker).
ticks() {
    local total=0 pid
    for pid in "$1" $(pgrep -P "$1" || true); do
        total=$((total + $(cpu_ticks "$pid")))
    done
    echo "$total"
}

# run NAME PID PORT: one wrk round; prints "requests cpu_seconds".
run() {
    local before after requests
    before=$(ticks "$2")
    requests=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${SECONDS_EACH}s" \
        "http://127.0.0.1:$3/steer/hls/www.example.com?$QUERY" |
        awk '/requests in/ { print $1 }')
    after=$(ticks "$2")
    python3 -c "print($requests, ($after - $before) / $(clock_ticks))"
}

log "steerdns on :$SP, nginx on :$NP; $ROUNDS rounds of ${SECONDS_EACH} s, wrk -t$THREADS -c$CONNECTIONS"
printf '%-6s %-9s %10s %8s %10s %14s\n' round server responses cpu_s per_s resp/cpu_s
declare -A REQ CPU
REQ=([steerdns]=0 [nginx]=0)
CPU=([steerdns]=0 [nginx]=0)
for round in $(seq "$ROUNDS"); do
    for server in steerdns nginx; do
        if [[ $server == steerdns ]]; then
            read -r n c < <(run steerdns "$STEERDNS" "$SP")
        else
            read -r n c < <(run nginx "$NGINX" "$NP")
        fi
        REQ[$server]=$((REQ[$server] + n))
        CPU[$server]=$(python3 -c "print(${CPU[$server]} + $c)")
        printf '%-6s %-9s %10d %8.2f %10.0f %14.0f\n' "$round" "$server" "$n" "$c" \
            "$(python3 -c "print($n / $SECONDS_EACH)")" "$(python3 -c "print($n / max($c, 0.01))")"
    done
done
python3 - "${REQ[steerdns]}" "${CPU[steerdns]}" "${REQ[nginx]}" "${CPU[nginx]}" <<'PY'
import sys
sr, sc, nr, nc = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s, n = sr / max(sc, 0.01), nr / max(nc, 0.01)
print(f"total  steerdns  {sr} responses / {sc:.2f} CPU-s = {s:,.0f} per CPU-second")
print(f"total  nginx     {nr} responses / {nc:.2f} CPU-s = {n:,.0f} per CPU-second")
print(f"steerdns / nginx = {s / n:.2f} (target >= 0.8: {'met' if s / n >= 0.8 else 'missed'})")
PY
