#!/usr/bin/env bash
# Runs the Rust test suite twice at once, RUNS times in a row (default 10): the flake
# hunt of docs/book/src/dev/testing.md ("Two suites at once"). The test binaries are built once
# (`cargo test --release --no-run`) and each lane runs every one of them in turn from the
# package root, as `cargo test --release` does, with CI=true (skips are failures).
#
#   bash scripts/twice-at-once.sh [RUNS]     # OUT=dir for the logs (default: a new /tmp dir)
#
# With DRILLS=1 (as root) each run of a lane also runs the shell drills after the
# binaries: tests/multinode.sh and tests/chaos.sh (DURATION=${CHAOS_SECONDS:-60}), whose
# namespaces are named per run, so the two lanes' drills run side by side.
#
# Prints one line per run and lane ("lane A run 3: 388 passed, 0 binaries failed, 472 s")
# and keeps the whole output of every failing binary or drill in $OUT. Exits 1 if any run
# failed.
# Do not run it beside builds: it is the two suites alone that the issue promises.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
RUNS=${1:-10}
OUT=${OUT:-$(mktemp -d /tmp/steerdns-twice.XXXXXX)}
mkdir -p "$OUT"
bins=$OUT/binaries
cargo test --release --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        print(m["executable"])' >"$bins"
[ -s "$bins" ] || { echo "twice-at-once: no test binaries built" >&2; exit 2; }
echo "twice-at-once: $(wc -l <"$bins") test binaries, $RUNS runs in two lanes; logs in $OUT"

lane() { # lane NAME: RUNS runs of every binary, one line per run
    local name=$1 r bin out rc passed failed start
    for ((r = 1; r <= RUNS; r++)); do
        start=$(date +%s) passed=0 failed=0
        while read -r bin; do
            rc=0
            out=$(CI=true "$bin" 2>&1) || rc=$?
            passed=$((passed + $(grep -oE 'test result: [a-zA-Z]+\. [0-9]+ passed' <<<"$out" | awk '{ s += $4 } END { print s + 0 }')))
            if ((rc != 0)); then
                failed=$((failed + 1))
                echo "$out" >"$OUT/fail-$name-$r-$(basename "$bin").log"
            fi
        done <"$bins"
        if [[ ${DRILLS:-0} == 1 ]]; then
            for drill in multinode chaos; do
                rc=0
                out=$(CI=true DURATION=${CHAOS_SECONDS:-60} bash "tests/$drill.sh" 2>&1) || rc=$?
                passed=$((passed + $(grep -oE '[0-9]+ passed, [0-9]+ failed' <<<"$out" | tail -1 | awk '{ print $1 + 0 }')))
                if ((rc != 0)); then
                    failed=$((failed + 1))
                    echo "$out" >"$OUT/fail-$name-$r-$drill.log"
                fi
            done
        fi
        echo "lane $name run $r: $passed passed, $failed binaries failed, $(($(date +%s) - start)) s" | tee -a "$OUT/runs.log"
    done
}
lane A &
a=$!
lane B &
b=$!
trap 'kill $a $b 2>/dev/null' EXIT
wait $a $b
trap - EXIT
if grep -q ', [1-9][0-9]* binaries failed' "$OUT/runs.log"; then
    echo "twice-at-once: failures; see $OUT/fail-*.log"
    exit 1
fi
echo "twice-at-once: $((RUNS * 2)) runs, none failed"
