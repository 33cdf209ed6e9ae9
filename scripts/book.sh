#!/usr/bin/env bash
# The book (docs/book): mdBook, pinned, installed from crates.io into target/tools when
# missing (the first run compiles it, about 3 minutes on 2 cores; later runs reuse it),
# then built, then every relative link and #anchor of the output checked
# (scripts/check-book-links.py). Fails on a missing page, a broken include, a warning of
# mdBook's (unbalanced HTML) or a broken link. The HTML lands in docs/book/book/ (ignored by git).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

MDBOOK_VERSION=0.5.4
mdbook=target/tools/bin/mdbook
if ! [ -x "$mdbook" ] || ! "$mdbook" --version | grep -qF "$MDBOOK_VERSION"; then
    echo "== cargo install mdbook $MDBOOK_VERSION (into target/tools)"
    cargo install mdbook --version "$MDBOOK_VERSION" --locked --no-default-features \
        --features search --root target/tools --target-dir target/tools-build
fi
# `--install-only`: .ci/run installs mdBook at its start, beside the package installs.
if [ "${1:-}" = --install-only ]; then
    exit 0
fi
rm -rf docs/book/book
# mdBook's warnings (unbalanced HTML, a missing file) fail the build too.
log=$("$mdbook" build docs/book 2>&1) || { echo "$log"; exit 1; }
echo "$log"
if grep -qE ' (WARN|ERROR) ' <<<"$log"; then
    echo "scripts/book.sh: mdbook warned (above): fix the page" >&2
    exit 1
fi
python3 scripts/check-book-links.py docs/book/book
