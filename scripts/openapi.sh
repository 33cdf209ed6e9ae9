#!/usr/bin/env bash
# The OpenAPI documents against the servers they describe.
#
#   bash scripts/openapi.sh      # from anywhere; STEERDNS_BIN=... to test another build
#
# 1. openapi-spec-validator: docs/openapi/admin.yaml and steering.yaml are valid
#    OpenAPI 3.1.
# 2. schemathesis run: a demo server (steering.yaml, zones/, geo/, probes/ of the
#    repository, copied into a scratch directory with its own state directory, on free
#    loopback ports, with --api-token-file) gets requests generated from each document,
#    every operation, positive and negative data, then stateful sequences; the checks
#    below must all pass. Mutations land on the throwaway server only.
#
# Checks: all of schemathesis's but
#   - positive_data_acceptance: a schema-valid request the policy refuses (a CDN, name,
#     tenant or region the demo policy does not have; a usage window more than a day
#     ahead; an ECS source over 32 for an IPv4 client) is a correct 400; the document
#     cannot say what the policy holds;
#   - ensure_resource_availability and use_after_free: a drain with the same name, CDN
#     and `where` as one in force replaces it under a new id (documented), so with
#     several workers a drain made in one sequence is ended or replaced by another;
#   - object_level_authorization: one token here (scoped tokens are tests/levers.rs's).
# negative_data_rejection takes 408 and 413 as rejections (a generated body over the
# API's 64 KiB or the beacons' 16 KiB gets 413: scripts/schemathesis.toml).
#
# Installs the pinned openapi-spec-validator and schemathesis with pip when missing.
# Prints how many requests schemathesis made; exits non-zero on any failure.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
strict_mode
script_init openapi

SPEC_VALIDATOR=0.9.0
SCHEMATHESIS=4.32.5
# Test cases per operation and phase; the run's time bound.
EXAMPLES=${EXAMPLES:-25}
MAX_TIME=${MAX_TIME:-35}
SEED=${SEED:-47}

have_pip_version() { # PACKAGE VERSION
    [[ $(python3 -m pip show "$1" 2>/dev/null | sed -n 's/^Version: //p') == "$2" ]]
}
for pkg in "openapi-spec-validator==$SPEC_VALIDATOR" "schemathesis==$SCHEMATHESIS"; do
    if ! have_pip_version "${pkg%%==*}" "${pkg##*==}"; then
        log "pip install $pkg"
        python3 -m pip install --quiet "$pkg" >&2 ||
            python3 -m pip install --quiet --break-system-packages "$pkg" >&2 ||
            die "cannot install $pkg"
    fi
done

# ---- 1. the documents are valid ----------------------------------------------------

log "openapi-spec-validator docs/openapi/*.yaml"
python3 -m openapi_spec_validator docs/openapi/admin.yaml docs/openapi/steering.yaml

# ---- 2. schemathesis against a demo server -----------------------------------------

make_tmp openapi
build_release
mkdir -p "$TMP/demo"
cp -r steering.yaml zones geo probes "$TMP/demo/"
TOKEN=openapi-$(python3 -c 'import secrets; print(secrets.token_hex(16))')
printf '%s' "$TOKEN" >"$TMP/demo/token"
chmod 600 "$TMP/demo/token"
DNS=$(free_port)
API=$(free_port)
STEER=$(free_port)
(cd "$TMP/demo" && NO_COLOR=1 exec "$STEERDNS_BIN" serve \
    --listen "127.0.0.1:$DNS" --api "127.0.0.1:$API" --steering-http "127.0.0.1:$STEER" \
    --api-token-file token --state-dir state >server.log 2>&1) &
PID=$!
track "$PID"
wait_for_dns -p "$PID" "$DNS" || { sed 's/^/    /' "$TMP/demo/server.log" >&2; die "the demo server does not answer"; }
# The API answers once the controller has published its first state document.
for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$API/v1/state" 2>/dev/null | grep -q config_version && break
    sleep 0.1
done
log "demo server pid $PID: api 127.0.0.1:$API, steering 127.0.0.1:$STEER"

# requests_in REPORT: the HTTP requests an NDJSON report of schemathesis records (the
# interactions of every scenario, the checks' own requests included).
requests_in() {
    python3 - "$1" <<'PY'
import json, sys
n = 0
try:
    for line in open(sys.argv[1]):
        event = json.loads(line)
        finished = event.get("ScenarioFinished")
        if finished:
            n += len((finished.get("recorder") or {}).get("interactions") or {})
except OSError:
    pass
print(n)
PY
}

EXCLUDED=positive_data_acceptance,ensure_resource_availability,use_after_free,object_level_authorization
total=0
failed=0
started=$(date +%s)
run() { # NAME DOCUMENT URL [ARG...]
    local name=$1 doc=$2 url=$3
    shift 3
    log "schemathesis run $doc against $url"
    # The base URL is 127.0.0.1:PORT, the address the API listens on: its Host is one
    # the API takes for reads (any other name would get 421).
    # From $TMP: schemathesis keeps a cache of what it found in .schemathesis/ of its
    # working directory, which is not the repository's to hold.
    set +e
    (cd "$TMP" && st --config-file "$REPO/scripts/schemathesis.toml" run "$REPO/$doc" --url "$url" \
        --checks all --exclude-checks "$EXCLUDED" \
        --max-examples "$EXAMPLES" --max-time "$MAX_TIME" --seed "$SEED" \
        --generation-database none --no-color --output-truncate true \
        --report ndjson --report-ndjson-path "$TMP/$name.ndjson" \
        "$@" >"$TMP/$name.out" 2>&1)
    local rc=$?
    set -e
    local n
    n=$(requests_in "$TMP/$name.ndjson")
    total=$((total + n))
    if ((rc != 0)); then
        failed=1
        sed 's/^/    /' "$TMP/$name.out"
        log "$doc: FAILED ($n requests)"
    else
        grep -E '^(Test cases|  [0-9]+ generated)|passed|generated' "$TMP/$name.out" | sed 's/^/    /' | tail -3
        log "$doc: passed ($n requests)"
    fi
}
run admin docs/openapi/admin.yaml "http://127.0.0.1:$API" --header "Authorization: Bearer $TOKEN"
run steering docs/openapi/steering.yaml "http://127.0.0.1:$STEER"
elapsed=$(($(date +%s) - started))

if ! kill -0 "$PID" 2>/dev/null; then
    sed 's/^/    /' "$TMP/demo/server.log" >&2
    die "the demo server died during the run"
fi
log "schemathesis made $total requests in ${elapsed}s"
((failed == 0)) || die "schemathesis found failures (above)"
log "passed"
