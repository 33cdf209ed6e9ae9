#!/usr/bin/env python3
"""Checks that every module of src/ imports only its own layer and the layers below it.

The layers, top to bottom (ARCHITECTURE.md explains each):

    cli → app → control → inputs → dnssec → dns → metrics → plan → selection → config → zones
        → place → error, huge, secret, clock, net, slots

A module's layer is its first path segment under src/ (`src/control/api.rs` is
`control`). Every `crate::X` path outside `#[cfg(test)]` code counts, in `use` lines and
inline: `crate::app::load(...)` inside `control/` is an upward call and fails the check.
Unit tests (`#[cfg(test)] mod tests { … }`) may reach up: they build fixtures the way
`serve` does.

    python3 scripts/check-layers.py        # exit 1 and one line per violation
"""

import re
import sys
from pathlib import Path

LAYERS = [
    ["cli"],
    ["app"],
    ["control"],
    ["inputs"],
    ["dnssec"],
    ["dns"],
    ["metrics"],
    ["plan"],
    ["selection"],
    ["config"],
    ["zones"],
    ["place"],
    ["error", "huge", "secret", "clock", "net", "slots"],
]
RANK = {m: i for i, layer in enumerate(LAYERS) for m in layer}


def layer_of(path: Path, src: Path) -> str:
    rel = path.relative_to(src)
    return rel.parts[0].removesuffix(".rs")


def skip_literal(text: str, i: int) -> int:
    """Past a string, raw string, char literal or comment starting at `i` (or `i`)."""
    raw = re.match(r'r(#*)"', text[i:])
    if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
        end = text.find('"' + raw.group(1), i + len(raw.group(0)))
        return len(text) if end < 0 else end + 1 + len(raw.group(1))
    if text[i] == '"':
        j = i + 1
        while j < len(text) and text[j] != '"':
            j += 2 if text[j] == "\\" else 1
        return j + 1
    char = re.match(r"'(\\.|[^\\'])'", text[i:])
    if char:
        return i + len(char.group(0))
    if text.startswith("//", i):
        end = text.find("\n", i)
        return len(text) if end < 0 else end
    return i


def without_tests(text: str) -> str:
    """The text with every `#[cfg(test)] mod … { … }` block blanked (lines kept)."""
    out = text
    for m in re.finditer(r"^#\[cfg\(test\)\]\s*\n\s*(?:pub )?mod \w+ \{", text, re.M):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            i = skip_literal(text, i)
            if i < len(text):
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
        blank = re.sub(r"[^\n]", " ", text[m.start() : i])
        out = out[: m.start()] + blank + out[i:]
    return out


def imports(text: str):
    """(line number, module) of every crate path outside unit tests."""
    for no, line in enumerate(without_tests(text).splitlines(), 1):
        code = line.split("//", 1)[0]
        for m in re.finditer(r"crate::(\{[^}]*\}?|[a-z_]+)", code):
            target = m.group(1)
            if target.startswith("{"):
                for name in re.findall(r"(?:^|[{,])\s*([a-z_]+)", target):
                    yield no, name
            else:
                yield no, target


def main() -> int:
    src = Path(__file__).resolve().parent.parent / "src"
    bad = []
    for path in sorted(src.rglob("*.rs")):
        if path.name in ("main.rs", "lib.rs"):
            continue
        own = layer_of(path, src)
        if own not in RANK:
            bad.append(f"{path.relative_to(src.parent)}: module `{own}` has no layer: add it to LAYERS")
            continue
        for no, target in imports(path.read_text()):
            if target in ("self", "super"):
                continue
            if target not in RANK:
                bad.append(f"{path.relative_to(src.parent)}:{no}: `crate::{target}` has no layer")
            elif RANK[target] < RANK[own]:
                bad.append(
                    f"{path.relative_to(src.parent)}:{no}: `{own}` imports `{target}`, a layer above it"
                )
    for line in bad:
        print(line)
    print(f"layers: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
