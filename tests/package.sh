#!/usr/bin/env bash
# The Debian package, as an operator installs it: builds it with
# deploy/debian/build-deb.sh, installs it with dpkg -i, checks the installed inputs with
# `steerdns check` (the paths taken from the unit's ExecStart), verifies both units with
# systemd-analyze, starts each unit's command line by hand (there is no init system
# here) on ports this script picks, as an unprivileged user like the unit's
# DynamicUser, queries the server with dig and curl, reloads it with the unit's
# ExecReload, stops it, then purges the package and checks that nothing is left.
#
#   sudo bash tests/package.sh      # STEERDNS_BIN=/path/to/steerdns to package another binary
#
# Needs root (dpkg), dpkg-deb, dig, curl and systemd-analyze (Debian: systemd). Without
# root or a tool it says so and exits 0, except under CI=true, where it fails. It
# refuses to run where a steerdns package is already installed, unless this script
# installed it and was interrupted (killed before its purge): that one it purges first.
# shellcheck source-path=SCRIPTDIR
# shellcheck source=../scripts/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/../scripts/lib.sh"
strict_mode --keep-going
script_init package
CHECK_PREFIX="package: "

skip() {
    if [[ ${CI:-} == true ]]; then die "$1 (required in CI)"; fi
    log "SKIPPED: $1"
    exit 0
}
[[ $(id -u) == 0 ]] || skip "needs root (dpkg -i): sudo bash tests/package.sh"
for tool in dpkg dpkg-deb dig curl systemd-analyze setpriv; do
    command -v "$tool" >/dev/null || skip "needs $tool"
done
# Present while this script's package is installed: a run killed before its purge
# leaves it behind, and the next run knows the package is its own.
MARKER=/var/lib/steerdns-package-test.installed
installed() { dpkg-query -W -f '${Status}' steerdns 2>/dev/null | grep -q 'install ok'; }
if installed; then
    [[ -e $MARKER ]] || die "a steerdns package is installed already: not touching it"
    log "purging the package an interrupted run of this script left installed"
    dpkg --purge steerdns >/dev/null 2>&1 || die "could not purge the package a previous run left"
    rm -f "$MARKER"
fi

make_tmp package
build_release
DEB=$(STEERDNS_BIN=$STEERDNS_BIN OUT=$TMP bash deploy/debian/build-deb.sh) || die "the package did not build"
log "built $DEB ($(du -k "$DEB" | cut -f1) KiB)"
# Kept, as the screenshots are: the package CI built is the one a fresh machine installs.
ARTIFACTS=${CARGO_TARGET_DIR:-$REPO/target}/artifacts
mkdir -p "$ARTIFACTS" && cp "$DEB" "$ARTIFACTS/" && log "kept in $ARTIFACTS/$(basename "$DEB")"

# Whatever happens below, the package does not outlive the script.
PURGED=0
purge_on_exit() {
    if ((!PURGED)); then dpkg --purge steerdns >/dev/null 2>&1 && rm -f "$MARKER"; fi
    cleanup
}
trap purge_on_exit EXIT

touch "$MARKER"
if dpkg -i "$DEB" >"$TMP/dpkg-i.log" 2>&1; then
    ok "dpkg -i $(basename "$DEB")"
else
    FAIL_CONTEXT=$(cat "$TMP/dpkg-i.log") fail "dpkg -i" "exit status $?"
    summary
    exit 1
fi
dpkg -L steerdns | sort >"$TMP/files"
for f in /usr/bin/steerdns /etc/steerdns/steering.yaml /etc/steerdns/zones/example.com.zone \
    /etc/steerdns/probes/fastly.yaml /usr/share/steerdns/country.mmdb /usr/share/steerdns/NOTICE \
    /usr/share/man/man1/steerdns.1.gz /usr/share/man/man1/steerdns-serve.1.gz \
    /usr/share/bash-completion/completions/steerdns /lib/systemd/system/steerdns.service \
    /lib/systemd/system/steerdns-agent.service /usr/lib/sysctl.d/60-steerdns.conf; do
    [[ -f $f ]] || fail "installed files" "$f missing"
done
ok "installed files ($(wc -l <"$TMP/files") paths)"
if zcat /usr/share/man/man1/steerdns-serve.1.gz | grep -q 'state\\-dir'; then
    ok "man page steerdns-serve(1) lists the options"
else
    fail "man page" "steerdns-serve.1 has no --state-dir"
fi
if bash -n /usr/share/bash-completion/completions/steerdns &&
    grep -q -- '--listen' /usr/share/bash-completion/completions/steerdns; then
    ok "bash completion (parses, offers --listen)"
else
    fail "bash completion" "does not parse, or no --listen in it"
fi
if grep -qx '/etc/steerdns/steering.yaml' /var/lib/dpkg/info/steerdns.conffiles; then
    ok "the files in /etc/steerdns are conffiles"
else
    fail "conffiles" "$(cat /var/lib/dpkg/info/steerdns.conffiles)"
fi

# systemd-analyze verify: unit syntax, the binary, the man pages of Documentation=.
man_check=()
command -v man >/dev/null || man_check=(--man=no)
if systemd-analyze verify "${man_check[@]}" /lib/systemd/system/steerdns.service \
    /lib/systemd/system/steerdns-agent.service >"$TMP/verify.log" 2>&1; then
    ok "systemd-analyze verify ${man_check[*]} (both units)"
else
    FAIL_CONTEXT=$(cat "$TMP/verify.log") fail "systemd-analyze verify"
fi

# unit_line UNIT KEY: the value of KEY= in UNIT, continuation lines joined.
unit_line() {
    sed -e ':a' -e '/\\$/N; s/\\\n//; ta' "/lib/systemd/system/$1" | sed -n "s/^$2=//p" | tr -s ' '
}
EXEC=$(unit_line steerdns.service ExecStart)
RELOAD=$(unit_line steerdns.service ExecReload)
AGENT=$(unit_line steerdns-agent.service ExecStart)

# Bounded memory (a restart, not the host's OOM killer) and a /proc of processes only.
for unit in steerdns.service steerdns-agent.service; do
    high=$(unit_line "$unit" MemoryHigh) max=$(unit_line "$unit" MemoryMax)
    if [[ $high =~ ^[0-9]+M$ && $max =~ ^[0-9]+M$ ]] && ((${high%M} < ${max%M})) &&
        [[ $(unit_line "$unit" ProcSubset) == pid ]]; then
        ok "$unit: MemoryHigh=$high MemoryMax=$max ProcSubset=pid"
    else
        fail "$unit memory bounds" "MemoryHigh=$high MemoryMax=$max ProcSubset=$(unit_line "$unit" ProcSubset)"
    fi
done
log "ExecStart: $EXEC"

# `steerdns check` on the inputs the unit serves.
read -r -a words <<<"$EXEC"
check_args=()
for ((i = 0; i < ${#words[@]}; i++)); do
    case ${words[i]} in
    --config | --zones | --probes | --geo | --asn-db) check_args+=("${words[i]}" "${words[i + 1]}") ;;
    esac
done
if ((${#check_args[@]} == 8)) && steerdns check "${check_args[@]}" >"$TMP/check.log" 2>&1; then
    ok "steerdns check ${check_args[*]}: $(grep '^ok' "$TMP/check.log")"
else
    FAIL_CONTEXT=$(cat "$TMP/check.log") fail "steerdns check" "${check_args[*]}"
fi

# The unit's command line on ports of ours: every address it names must be replaced.
DNS_PORT=$(free_port)
API_PORT=$(free_port)
STEER_PORT=$(free_port)
CMD=${EXEC//0.0.0.0:53/127.0.0.1:$DNS_PORT}
CMD=${CMD//\[::\]:53/[::1]:$DNS_PORT}
CMD=${CMD//127.0.0.1:9153/127.0.0.1:$API_PORT}
CMD=${CMD//127.0.0.1:8053/127.0.0.1:$STEER_PORT}
if [[ $CMD == "$EXEC" ]] || grep -qE ':53( |$)|:9153( |$)|:8053( |$)' <<<"$CMD"; then
    fail "the unit's addresses" "not all replaced in: $CMD"
fi
# As systemd would: an unprivileged user, and a state directory it owns.
install -d -o nobody -g nogroup -m 0700 /var/lib/steerdns
read -r -a argv <<<"$CMD"
setpriv --reuid=nobody --regid=nogroup --clear-groups --no-new-privs -- "${argv[@]}" \
    >"$TMP/serve.log" 2>&1 &
SERVER=$!
track $SERVER
if wait_for_dns -p $SERVER "$DNS_PORT"; then
    ok "the unit's command line serves (as nobody, on 127.0.0.1:$DNS_PORT and [::1]:$DNS_PORT)"
else
    FAIL_CONTEXT=$(cat "$TMP/serve.log") fail "the unit's command line" "no answer"
fi
for server in 127.0.0.1 ::1; do
    answer=$(dig @"$server" -p "$DNS_PORT" +short +time=1 +tries=2 www.example.com A +subnet=81.2.69.0/24)
    case $answer in
    example.map.fastly.net. | example.cdn.cloudflare.net.) ok "dig @$server www.example.com: $answer" ;;
    *) fail "dig @$server www.example.com" "got: $answer" ;;
    esac
done
soa=$(dig @127.0.0.1 -p "$DNS_PORT" +short +tcp example.com SOA)
# MNAME RNAME SERIAL REFRESH RETRY EXPIRE MINIMUM (dig +short prints errors on stdout too).
if [[ $soa =~ ^[a-z0-9.-]+\ [a-z0-9.-]+(\ [0-9]+){5}$ ]]; then
    ok "dig +tcp example.com SOA: $soa"
else
    fail "dig +tcp example.com SOA" "got: $soa"
fi
metrics=$(curl -fsS "http://127.0.0.1:$API_PORT/metrics")
if grep -q '^steerdns_build_info{commit="[^"]*",version="[^"]*"} 1$' <<<"$metrics" &&
    grep -q '^process_resident_memory_bytes ' <<<"$metrics"; then
    ok "/metrics: $(grep '^steerdns_build_info' <<<"$metrics")"
else
    fail "/metrics" "no build_info or process metrics"
fi
if curl -fsS -o "$TMP/status.html" -w '%{content_type}' "http://127.0.0.1:$API_PORT/" | grep -q '^text/html' &&
    grep -q 'www.example.com.' "$TMP/status.html"; then
    ok "the status page"
else
    fail "the status page" "GET / is not the HTML page"
fi
manifest=$(curl -fsS "http://127.0.0.1:$STEER_PORT/steer/hls/www.example.com")
if grep -q '"PATHWAY-PRIORITY":\["\(fastly\|cloudflare\)"' <<<"$manifest"; then
    ok "content steering: $manifest"
else
    fail "content steering" "got: $manifest"
fi
# The unit's ExecReload, with $MAINPID.
reload=${RELOAD//\$MAINPID/$SERVER}
# Applied reloads only: a refused one names SIGHUP too.
reloads() { grep -c 'configuration reloaded.*trigger=SIGHUP' "$TMP/serve.log" || true; }
before=$(reloads)
if [[ $reload == *"-HUP $SERVER" ]] && $reload; then
    for _ in $(seq 50); do
        (($(reloads) > before)) && break
        sleep 0.1
    done
    if (($(reloads) > before)) && kill -0 $SERVER 2>/dev/null; then
        ok "ExecReload ($RELOAD): reloaded, still serving"
    else
        FAIL_CONTEXT=$(tail -5 "$TMP/serve.log") fail "ExecReload" "no reload logged"
    fi
else
    fail "ExecReload" "$RELOAD"
fi
kill -TERM $SERVER
wait $SERVER
status=$?
PIDS=()
if ((status == 0)); then ok "SIGTERM: stopped, exit status 0"; else fail "SIGTERM" "exit status $status"; fi

# The agent unit's command line.
AGENT_PORT=$(free_port)
ACMD=${AGENT//127.0.0.1:9154/127.0.0.1:$AGENT_PORT}
[[ $ACMD != "$AGENT" ]] || fail "the agent unit's address" "not replaced in: $AGENT"
read -r -a argv <<<"$ACMD"
setpriv --reuid=nobody --regid=nogroup --clear-groups --no-new-privs -- "${argv[@]}" \
    >"$TMP/agent.log" 2>&1 &
AGENT_PID=$!
track $AGENT_PID
observed=
for _ in $(seq 100); do
    observed=$(curl -fsS "http://127.0.0.1:$AGENT_PORT/v1/observations" 2>/dev/null) && break
    sleep 0.1
done
if grep -q '"vantage"' <<<"$observed"; then
    ok "the agent unit's command line serves /v1/observations"
else
    FAIL_CONTEXT=$(cat "$TMP/agent.log") fail "the agent unit's command line" "no observations"
fi
stop $AGENT_PID

# Purge: nothing of the package, its configuration or its state stays.
if dpkg --purge steerdns >"$TMP/purge.log" 2>&1; then
    PURGED=1
    rm -f "$MARKER"
    ok "dpkg --purge steerdns"
else
    FAIL_CONTEXT=$(cat "$TMP/purge.log") fail "dpkg --purge"
fi
left=()
while read -r path; do
    # Directories shared with other packages (/usr, /etc, /lib -> usr/lib, ...) stay.
    if [[ -d $path ]]; then
        [[ $path != *steerdns* ]] || left+=("$path")
    elif [[ -e $path || -L $path ]]; then
        left+=("$path")
    fi
done <"$TMP/files"
for path in /etc/steerdns /var/lib/steerdns /var/lib/private/steerdns /usr/share/steerdns /usr/share/doc/steerdns; do
    [[ -e $path ]] && left+=("$path")
done
if ((${#left[@]} == 0)) && ! dpkg-query -W steerdns >/dev/null 2>&1; then
    ok "nothing left behind ($(wc -l <"$TMP/files") paths checked, state and configuration gone)"
else
    fail "left behind" "${left[*]} $(dpkg-query -W steerdns 2>&1)"
fi
summary
