# shellcheck shell=bash
# Helpers shared by the shell scripts of tests/ and benches/: sourced, never run.
#
#   # shellcheck source-path=SCRIPTDIR
#   # shellcheck source=../scripts/lib.sh
#   . "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
#   strict_mode                 # or: strict_mode --keep-going (checks that count failures)
#   script_init smoke           # log prefix, cd to the repository, cleanup trap
#   make_tmp smoke              # $TMP, removed on exit (kept with KEEP=1)
#   build_release               # $STEERDNS_BIN
#   PORT=$(free_port)
#   "$STEERDNS_BIN" serve --listen "127.0.0.1:$PORT" >"$TMP/server.log" 2>&1 &
#   track $!                    # stopped on exit
#   wait_for_dns -p $! "$PORT" || die "the server does not answer"
#   ok "a check" / fail "a check" "why"; ...; summary   # "N passed, M failed"
#
# What each script still writes itself is what makes it that script: its server command
# line, its checks, its report. The functions below are the plumbing they all share:
#
#   strict_mode [--keep-going]  set -euo pipefail (--keep-going: without -e)
#   script_init NAME            $SCRIPT (the log prefix), $REPO (cd there), traps
#   log MSG / die MSG           "NAME: MSG" (LOG_STDERR=1: log to stderr); die exits 1
#   require TOOL...             die unless every TOOL is installed, naming its package
#   install_missing TOOL...     apt-get install the packages of the missing TOOLs
#   apt_install PKG...          apt-get install, with one apt-get update on failure
#   make_tmp NAME               $TMP = a new /tmp/steerdns-NAME.XXXXXX
#   track PID... / stop PID     stop PID on exit / stop PID now
#   build_release               $STEERDNS_BIN, or cargo build --release (CARGO_TARGET_DIR)
#   free_port                   an unused loopback port (TCP and UDP), below the ephemeral range
#   wait_for_dns [-p PID] [-t SECONDS] PORT [ADDR [NAME [TYPE]]]
#   start_cdn NAME DIR [ADDR [PORT]]   a python http.server stand-in CDN; $CDN_PORT[NAME]
#   internet_prefixes           prefixes over the whole Internet, for benches/queries.py
#   rss_kb PID / cpu_ticks PID / clock_ticks   readings from /proc
#   ok NAME / fail NAME [WHY] / summary        check results and "N passed, M failed"
#
# Environment read here: STEERDNS_BIN (a binary to use instead of building one),
# CARGO_TARGET_DIR (where cargo builds it), KEEP=1 (keep $TMP), LOG_STDERR=1.

# --- set-up --------------------------------------------------------------------------

# strict_mode [--keep-going]: exit on an unset variable and on a failure anywhere in a
# pipeline; also on any failed command, unless --keep-going (scripts that run checks,
# count their failures and report them all rather than stop at the first).
strict_mode() {
    if [[ ${1:-} == --keep-going ]]; then
        set -uo pipefail
    else
        set -euo pipefail
    fi
}

# script_init NAME: NAME prefixes every log line; the working directory becomes the
# repository root ($REPO); on exit (normal, `die`, Ctrl-C or SIGTERM) `cleanup` stops
# every tracked process and removes $TMP.
script_init() {
    SCRIPT=$1
    REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    cd "$REPO" || exit 1
    trap cleanup EXIT
    trap 'exit 130' INT TERM
}

# log MSG...: "NAME: MSG" on stdout, or on stderr with LOG_STDERR=1 (the benchmarks,
# whose stdout is the table they print).
log() {
    if [[ ${LOG_STDERR:-0} == 1 ]]; then
        echo "$SCRIPT: $*" >&2
    else
        echo "$SCRIPT: $*"
    fi
}

# die MSG...: "NAME: ${DIE_PREFIX}MSG" on stderr, then exit 1 (which runs `cleanup`).
die() {
    echo "$SCRIPT: ${DIE_PREFIX:-}$*" >&2
    exit 1
}

# --- tools ---------------------------------------------------------------------------

# package_of TOOL: the Debian package that installs TOOL.
package_of() {
    case $1 in
    dig) echo dnsutils ;;
    pdns_server) echo pdns-server ;;
    *) echo "$1" ;;
    esac
}

# require TOOL...: die unless every TOOL is on the PATH.
require() {
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install $(package_of "$tool"))"
    done
}

# apt_install PKG...: install Debian packages (needs root); runs apt-get update once if
# the first attempt fails (a fresh machine with no package lists).
apt_install() {
    log "installing $*"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q "$@" </dev/null >&2 ||
        { apt-get update -q </dev/null >&2 && apt-get install -y -q "$@" </dev/null >&2; }
}

# install_missing TOOL...: install the packages of the TOOLs that are not on the PATH.
install_missing() {
    local tool missing=()
    for tool in "$@"; do
        command -v "$tool" >/dev/null || missing+=("$(package_of "$tool")")
    done
    ((${#missing[@]} == 0)) || apt_install "${missing[@]}"
}

# --- scratch directory and processes -------------------------------------------------

TMP=
PIDS=()

# make_tmp NAME: $TMP = a new directory /tmp/steerdns-NAME.XXXXXX, removed on exit
# unless KEEP=1.
make_tmp() {
    TMP=$(mktemp -d "/tmp/steerdns-$1.XXXXXX")
}

# track PID...: stop these processes on exit.
track() {
    PIDS+=("$@")
}

# stop PID: stop a tracked process now (and wait for it), and forget it.
stop() {
    local pid kept=()
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
    for pid in "${PIDS[@]}"; do
        [[ $pid == "$1" ]] || kept+=("$pid")
    done
    PIDS=("${kept[@]}")
}

# cleanup: the EXIT trap. Sends SIGTERM to every tracked process, then waits for each
# (so that no server outlives the script, and ports are free when it returns), and
# removes $TMP unless KEEP=1.
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    PIDS=()
    if [[ -n $TMP ]]; then
        if [[ ${KEEP:-0} == 1 ]]; then log "kept $TMP" >&2; else rm -rf "$TMP"; fi
    fi
}

# --- the server under test -----------------------------------------------------------

# build_release: sets STEERDNS_BIN. Given STEERDNS_BIN, uses it as it is (it must be
# executable); otherwise runs `cargo build --release --quiet` (which honours
# CARGO_TARGET_DIR and the cargo configuration) and points STEERDNS_BIN at the binary in
# cargo's target directory.
build_release() {
    if [[ -n ${STEERDNS_BIN:-} ]]; then
        [[ -x $STEERDNS_BIN ]] || die "STEERDNS_BIN=$STEERDNS_BIN is not an executable"
        return 0
    fi
    if ! command -v cargo >/dev/null && [[ -f $HOME/.cargo/env ]]; then
        # shellcheck disable=SC1091
        . "$HOME/.cargo/env"
    fi
    cargo build --release --quiet || die "build failed"
    local dir
    dir=$(cargo metadata --format-version 1 --no-deps 2>/dev/null |
        sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
    dir=${dir:-${CARGO_TARGET_DIR:-target}}
    [[ $dir == /* ]] || dir=$REPO/$dir
    STEERDNS_BIN=$dir/release/steerdns
    [[ -x $STEERDNS_BIN ]] || die "cargo built no $STEERDNS_BIN"
}

# free_port: prints a port on 127.0.0.1 that binds for both TCP and UDP, below the
# kernel's ephemeral range (an outgoing connection or a resolver's query cannot take it
# between this and the server's bind, as happened once to the soak test in CI: "Address
# already in use"), and not handed out before by this script ($TMP/.ports, once TMP is set).
free_port() {
    python3 - "${TMP:+$TMP/.ports}" <<'PY'
import random, socket, sys
taken_file = sys.argv[1]
taken = set()
if taken_file:
    try:
        taken = set(open(taken_file).read().split())
    except OSError:
        pass
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(1000):
    port = random.randrange(10000, max(low, 10001))
    if str(port) in taken:
        continue
    try:
        for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            with socket.socket(socket.AF_INET, kind) as s:
                s.bind(("127.0.0.1", port))
    except OSError:
        continue
    if taken_file:
        with open(taken_file, "a") as f:
            f.write(f"{port}\n")
    print(port)
    break
else:
    sys.exit("free_port: no free port below the ephemeral range")
PY
}

# wait_for_dns [-p PID] [-t SECONDS] PORT [ADDR [NAME [TYPE]]]: waits until ADDR:PORT
# (default 127.0.0.1) answers NAME TYPE (default example.com SOA) with NOERROR, polling
# every 0.1 s for up to SECONDS (default 10). Returns 1 on timeout, or as soon as PID
# (the server being waited for) has exited.
wait_for_dns() {
    local pid='' seconds=10 opt OPTIND=1
    while getopts p:t: opt; do
        case $opt in
        p) pid=$OPTARG ;;
        t) seconds=$OPTARG ;;
        *) return 2 ;;
        esac
    done
    shift $((OPTIND - 1))
    local port=$1 addr=${2:-127.0.0.1} name=${3:-example.com} type=${4:-SOA} _
    for _ in $(seq $((seconds * 10))); do
        dig @"$addr" -p "$port" +time=1 +tries=1 "$name" "$type" 2>/dev/null | grep -q 'status: NOERROR' &&
            return 0
        [[ -z $pid ]] || kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# --- stand-in CDNs -------------------------------------------------------------------

# The stand-ins' ports, by name (read by the scripts).
# shellcheck disable=SC2034
declare -A CDN_PORT=()

# start_cdn NAME DIR [ADDR [PORT]]: serves DIR over HTTP with python's http.server on
# ADDR (default 127.0.0.1) and PORT (default a free one), as the CDN NAME; sets
# CDN_PORT[NAME]. If DIR does not exist, it is created with the demo's canary object
# (probes/_health/v1.txt as DIR/_health/v1.txt): remove that file to break the CDN, copy
# it back to heal it. With CDN_CPU set, the server is pinned to that CPU. Its log is
# $TMP/cdn-NAME-ADDR.log.
start_cdn() {
    local name=$1 dir=$2 addr=${3:-127.0.0.1} port=${4:-} pin=()
    [[ -n $port ]] || port=$(free_port)
    if [[ ! -d $dir ]]; then
        mkdir -p "$dir/_health" && cp "$REPO/probes/_health/v1.txt" "$dir/_health/"
    fi
    [[ -z ${CDN_CPU:-} ]] || pin=(taskset -c "$CDN_CPU")
    "${pin[@]}" python3 -m http.server --bind "$addr" "$port" --directory "$dir" \
        >"$TMP/cdn-$name-$addr.log" 2>&1 &
    track $!
    # shellcheck disable=SC2034
    CDN_PORT[$name]=$port
}

# --- load ----------------------------------------------------------------------------

# internet_prefixes: prints a prefix list (benches/queries.py's PREFIXES.tsv format,
# country `--`) covering the whole Internet: every routable IPv4 /8 but 10 and 127, and
# the main IPv6 blocks. queries.py draws a random /24 or /56 inside each, so the queries
# reach every region of a policy.
internet_prefixes() {
    python3 - <<'PY'
for a in range(1, 224):
    if a not in (10, 127):
        print(f"{a}.0.0.0/8\t--")
for p in ("2001::/16", "2400::/12", "2600::/12", "2800::/12", "2a00::/12", "2c00::/12"):
    print(f"{p}\t--")
PY
}

# rss_kb PID: the resident memory of PID (VmRSS), in kB.
rss_kb() {
    awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"
}

# cpu_ticks PID: the CPU time PID has used, user + system, all threads, in clock ticks
# (see clock_ticks).
cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# clock_ticks: clock ticks per second (the unit of cpu_ticks).
clock_ticks() {
    getconf CLK_TCK
}

# --- checks --------------------------------------------------------------------------

PASSED=0
FAILED=0

# ok NAME: a check passed: "ok   NAME".
ok() {
    PASSED=$((PASSED + 1))
    echo "${CHECK_PREFIX:-}ok   $1"
}

# fail NAME WHY: a check failed: "FAIL NAME: WHY"; fail MSG: "FAIL: MSG". Then the lines
# of $FAIL_CONTEXT, if any, indented (the output the check looked at).
fail() {
    FAILED=$((FAILED + 1))
    if (($# > 1)); then
        echo "${CHECK_PREFIX:-}FAIL $1: $2"
    else
        echo "${CHECK_PREFIX:-}FAIL: $1"
    fi
    if [[ -n ${FAIL_CONTEXT:-} ]]; then
        sed -e '/^$/d' -e 's/^/       | /' <<<"$FAIL_CONTEXT"
    fi
}

# summary: prints "N passed, M failed"; returns 1 if any check failed.
summary() {
    echo "${CHECK_PREFIX:-}$PASSED passed, $FAILED failed"
    ((FAILED == 0))
}
