#!/usr/bin/env bash
# Builds the Debian package of steerdns from this repository with dpkg-deb (no
# debhelper or cargo-deb needed: a plain `dpkg-deb --build` of a tree laid out here).
#
#   bash deploy/debian/build-deb.sh        # -> $CARGO_TARGET_DIR/debian/steerdns_<version>-1_<arch>.deb
#
# STEERDNS_BIN=path packages that binary instead of `cargo build --release`'s; OUT=dir
# puts the package elsewhere. The package holds:
#
#   /usr/bin/steerdns                              the binary (debug info stripped)
#   /lib/systemd/system/steerdns.service           serve on port 53 (deploy/systemd/)
#   /lib/systemd/system/steerdns-agent.service     a probe-only vantage point
#   /usr/lib/sysctl.d/60-steerdns.conf             net.core.rmem_max for 4 MiB UDP buffers
#   /etc/steerdns/steering.yaml, zones/, probes/   the demo policy, zone and probes (conffiles)
#   /usr/share/steerdns/country.mmdb, NOTICE       the default geo database and its licence
#   /usr/share/steerdns/grafana/, prometheus/      the dashboard and the alert rules
#   /usr/share/man/man1/steerdns*.1.gz             generated from the command line (clap_mangen)
#   bash, zsh and fish completions                 generated from the command line (clap_complete)
#   /usr/share/doc/steerdns/                       README, copyright, the probes' canary object
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."

target=${CARGO_TARGET_DIR:-target}
out=${OUT:-$target/debian}
if [ -z "${STEERDNS_BIN:-}" ]; then
    cargo build --release --bin steerdns
    STEERDNS_BIN=$target/release/steerdns
fi
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)-1
arch=$(dpkg --print-architecture)

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
chmod 0755 "$root"

put() { # put MODE SOURCE DEST: install a file at DEST inside the package
    install -D -m "$1" "$2" "$root/$3"
}

put 0755 "$STEERDNS_BIN" usr/bin/steerdns
if command -v strip >/dev/null; then
    strip --strip-debug "$root/usr/bin/steerdns"
fi
put 0644 deploy/systemd/steerdns.service lib/systemd/system/steerdns.service
put 0644 deploy/systemd/steerdns-agent.service lib/systemd/system/steerdns-agent.service
put 0644 deploy/debian/60-steerdns.conf usr/lib/sysctl.d/60-steerdns.conf

put 0644 steering.yaml etc/steerdns/steering.yaml
for f in zones/*.zone; do put 0644 "$f" "etc/steerdns/$f"; done
for f in probes/*.yaml; do put 0644 "$f" "etc/steerdns/$f"; done

put 0644 geo/country.mmdb usr/share/steerdns/country.mmdb
put 0644 geo/NOTICE usr/share/steerdns/NOTICE
put 0644 deploy/grafana/steerdns.json usr/share/steerdns/grafana/steerdns.json
put 0644 deploy/prometheus/steerdns-alerts.yml usr/share/steerdns/prometheus/steerdns-alerts.yml
put 0644 deploy/prometheus/README.md usr/share/steerdns/prometheus/README.md

doc=usr/share/doc/steerdns
put 0644 deploy/debian/copyright "$doc/copyright"
put 0644 README.md "$doc/README.md"
put 0644 probes/README.md "$doc/probes.md"
put 0644 probes/_health/v1.txt "$doc/examples/_health/v1.txt"

mkdir -p "$root/usr/share/man/man1"
"$STEERDNS_BIN" man "$root/usr/share/man/man1"
gzip -9n "$root"/usr/share/man/man1/*.1
"$STEERDNS_BIN" completions bash | install -D -m 0644 /dev/stdin "$root/usr/share/bash-completion/completions/steerdns"
"$STEERDNS_BIN" completions zsh | install -D -m 0644 /dev/stdin "$root/usr/share/zsh/vendor-completions/_steerdns"
"$STEERDNS_BIN" completions fish | install -D -m 0644 /dev/stdin "$root/usr/share/fish/vendor_completions.d/steerdns.fish"

# The C library the binary needs at least (the newest GLIBC_ symbol version it uses).
glibc=2.34
if command -v objdump >/dev/null; then
    glibc=$(objdump -T "$root/usr/bin/steerdns" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)
fi
size=$(du -sk --exclude=DEBIAN "$root" | cut -f1)

mkdir -p "$root/DEBIAN"
cat >"$root/DEBIAN/control" <<CONTROL
Package: steerdns
Version: $version
Architecture: $arch
Maintainer: steerdns maintainers <steerdns@example.com>
Installed-Size: $size
Depends: libc6 (>= $glibc), libgcc-s1
Recommends: ca-certificates
Suggests: prometheus, dnsutils
Section: net
Priority: optional
Homepage: https://github.com/steerdns/steerdns
Description: authoritative DNS server that steers a hostname across CDNs
 steerdns answers for a steered name with a weighted CNAME to one of several
 CDNs, chosen by the client's region (EDNS Client Subnet or the resolver's
 address). It probes each CDN, moves traffic away from a failing one in timed
 steps and back when it recovers, and lets operators drain a CDN by editing
 the policy or through its API.
 .
 The package ships the demo policy in /etc/steerdns, a systemd unit (not
 enabled), a country database, a Grafana dashboard and Prometheus alert rules.
CONTROL
find "$root/etc" -type f | sed "s#^$root##" | sort >"$root/DEBIAN/conffiles"
for script in postinst prerm postrm; do
    install -m 0755 "deploy/debian/$script" "$root/DEBIAN/$script"
done
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) >"$root/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/steerdns_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
