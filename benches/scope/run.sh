#!/usr/bin/env bash
# ECS scope efficiency (issue 16): the scopes steerdns and gdnsd echo, against the widest
# correct scope of every sampled network, on one policy and one geo database.
#
#   benches/scope/run.sh [--db FILE] [--policy FILE] [--sample N] [--seed N]
#                        [--source BITS] [--servers "steerdns gdnsd"] [--steerdns LABEL=BINARY]...
#
#   --db FILE          the geo database (default geo/country.mmdb; flat NRO or GeoIP2)
#   --policy FILE      the steering policy (default steering.yaml; country, continent and
#                      "*" entries only)
#   --sample N         IPv4 networks with data to ask about (default 5000)
#   --seed N           the sample's seed (default 16)
#   --source BITS      one ECS source prefix for every query (the issue measured with 24);
#                      default: /24, or the network's own prefix when it is longer
#   --servers LIST     which servers (default "steerdns gdnsd")
#   --steerdns L=BIN   measure this steerdns binary too, labelled L (repeatable), e.g. the
#                      build of an older commit: --steerdns "steerdns 3d1f0a2=/tmp/old/steerdns"
#
# Environment: STEERDNS_BIN (the steerdns of "steerdns"; default: cargo build --release,
# in CARGO_TARGET_DIR if set), SHARED=../shared (peers/gdnsd/ is there), KEEP=1 (keep the
# temp dir: logs, rendered configs, the GeoIP2 copy).
#
# gdnsd reads a GeoIP2-Country copy of the database written by scope.py (same search tree,
# every network with its country and continent) and the peers' config
# (../shared/peers/gdnsd/), which is the demo policy: with another --policy, gdnsd is
# skipped. Its health checks ask a local HTTP server (started here, on loopback).
# Everything started is stopped on exit. Needs python3 with yaml (python3-yaml), dig
# (dnsutils), gdnsd and curl for gdnsd; installs nothing, says what is missing.
# The markdown table goes to stdout, the log to stderr. Exit status 2: some answer was
# wider than correct, or unanswered; 1: could not measure.
CALLER_PWD=$PWD # --db and --policy are relative to where the script is run from
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
strict_mode
script_init scope
LOG_STDERR=1

DB=geo/country.mmdb
POLICY=steering.yaml
SAMPLE=5000
SEED=16
SOURCE=()
SERVERS="steerdns gdnsd"
EXTRA=()
usage() { sed -n '2,/^# shellcheck/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//' >&2; exit "${1:-0}"; }
while (($#)); do
    case $1 in
    --db) DB=$2 && shift 2 ;;
    --policy) POLICY=$2 && shift 2 ;;
    --sample) SAMPLE=$2 && shift 2 ;;
    --seed) SEED=$2 && shift 2 ;;
    --source) SOURCE=(--source "$2") && shift 2 ;;
    --servers) SERVERS=$2 && shift 2 ;;
    --steerdns) EXTRA+=("$2") && shift 2 ;;
    -h | --help) usage 0 ;;
    *) echo "scope: unknown argument $1" >&2 && usage 1 ;;
    esac
done
SHARED=${SHARED:-$REPO/../shared}
# Defaults are the repository's files; given paths are the caller's.
[[ $DB == geo/country.mmdb ]] || DB=$(cd "$CALLER_PWD" && realpath -m "$DB")
[[ $POLICY == steering.yaml ]] || POLICY=$(cd "$CALLER_PWD" && realpath -m "$POLICY")
DB=$(realpath -m "$DB")
POLICY=$(realpath -m "$POLICY")
[[ -r $DB ]] || die "no database $DB"
[[ -r $POLICY ]] || die "no policy $POLICY"

# --- prerequisites: say what is missing, install nothing -----------------------------
need=(python3 dig)
case " $SERVERS " in *" gdnsd "*) need+=(gdnsd curl) ;; esac
require "${need[@]}"
python3 -c 'import yaml' 2>/dev/null ||
    die "python3 cannot import yaml: apt-get install python3-yaml (or pip install pyyaml)"
SCOPE_PY=$REPO/benches/scope/scope.py
# The policy first (before any build): refused entries end here; 1 = not the demo's.
demo=0
python3 "$SCOPE_PY" is-demo --policy "$POLICY" || demo=$?
((demo <= 1)) || die "cannot measure with $POLICY"
if [[ " $SERVERS " == *" gdnsd "* ]] && ((demo == 1)); then
    log "gdnsd skipped: its config ($SHARED/peers/gdnsd) is the demo policy, not $POLICY"
    SERVERS=${SERVERS//gdnsd/}
fi
[[ " $SERVERS " != *" gdnsd "* || -r $SHARED/peers/gdnsd/config ]] ||
    die "no $SHARED/peers/gdnsd/config (set SHARED)"
make_tmp scope

declare -A LABEL_BIN=()
LABELS=()
if [[ " $SERVERS " == *" steerdns "* ]]; then
    build_release
    LABELS+=("steerdns $(git -C "$REPO" describe --always --dirty 2>/dev/null)")
    LABEL_BIN[${LABELS[-1]}]=$STEERDNS_BIN
fi
for e in "${EXTRA[@]}"; do
    [[ -x ${e#*=} ]] || die "--steerdns $e: not an executable"
    LABELS+=("${e%%=*}")
    LABEL_BIN[${LABELS[-1]}]=${e#*=}
done

SERVER_ARGS=()
PIDS_UP=()
up() { # label port pid log
    if ! wait_for_dns -p "$3" -t 30 "$2"; then
        cat "$4" >&2
        die "$1 does not answer on 127.0.0.1:$2"
    fi
    SERVER_ARGS+=(--server "$1=$2")
    PIDS_UP+=("$3")
}

# --- steerdns (each binary on its own port) -------------------------------------------
i=0
for label in "${LABELS[@]}"; do
    i=$((i + 1))
    S=$TMP/steerdns-$i
    mkdir -p "$S/probes" "$S/state"
    port=$(free_port)
    # No probes (no traffic off the machine), no API, the repository's zones.
    "${LABEL_BIN[$label]}" serve --config "$POLICY" --zones "$REPO/zones" --geo "$DB" \
        --probes "$S/probes" --state-dir "$S/state" --api off --reload-poll-ms 0 \
        --listen "127.0.0.1:$port" >"$S.log" 2>&1 &
    track $!
    up "$label" "$port" $! "$S.log"
    log "$label: ${LABEL_BIN[$label]} on 127.0.0.1:$port"
done

# --- gdnsd ---------------------------------------------------------------------------
if [[ " $SERVERS " == *" gdnsd "* ]]; then
    G=$TMP/gdnsd
    mkdir -p "$G/zones" "$G/run" "$G/state"
    python3 "$SCOPE_PY" geoip2 --db "$DB" --out "$TMP/geoip2.mmdb" || die "cannot write the GeoIP2 copy"
    port=$(free_port)
    health=$(free_port)
    mkdir -p "$TMP/www/health"
    for c in example.map.fastly.net example.cdn.cloudflare.net; do
        echo healthy-v3 >"$TMP/www/health/$c"
    done
    start_cdn health "$TMP/www" 127.0.0.1 "$health"
    render() { # template output
        sed -e "s|@PORT@|$port|g" -e "s|@RUN@|$G|g" -e "s|@GEODB@|$TMP/geoip2.mmdb|g" \
            -e "s|@HEALTH_PORT@|$health|g" -e "s|@THREADS@|1|g" -e "s|@LUA_MODE@|x|g" "$1" >"$2"
    }
    render "$SHARED/peers/gdnsd/config" "$G/config"
    render "$SHARED/peers/gdnsd/zones/example.com" "$G/zones/example.com"
    gdnsd -c "$G" -f start >"$TMP/gdnsd.log" 2>&1 &
    track $!
    up "gdnsd $(gdnsd -h 2>&1 | grep -o 'gdnsd version [0-9.]*' | head -1 | cut -d' ' -f3)" \
        "$port" $! "$TMP/gdnsd.log"
    log "gdnsd on 127.0.0.1:$port (health checks on 127.0.0.1:$health)"
fi

((${#SERVER_ARGS[@]})) || die "no server to measure"
rc=0
python3 "$SCOPE_PY" measure --db "$DB" --policy "$POLICY" --sample "$SAMPLE" --seed "$SEED" \
    "${SOURCE[@]}" "${SERVER_ARGS[@]}" || rc=$?
for pid in "${PIDS_UP[@]}"; do
    kill -0 "$pid" 2>/dev/null || log "a server (pid $pid) died during the run; see KEEP=1 logs"
done
exit "$rc"
