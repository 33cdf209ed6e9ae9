#!/usr/bin/env python3
"""Checks that every module of src/ imports only its own layer and the layers below it.

The layers, top to bottom (ARCHITECTURE.md explains each):

    cli → app → control → inputs → dnssec → dns → metrics → plan → selection → config → zones
        → place → error, huge, secret, clock, net, slots

A module's layer is its first path segment under src/ (`src/control/surfaces/api.rs` is
`control`). Every `crate::X` path counts, in `use` lines and inline, unit tests
(`#[cfg(test)]`) included: `crate::app::load(...)` inside `control/` is an upward call
and fails the check, and so does a test of `metrics` that builds its fixture through
`inputs`.

Inside each folder, the modules (files and subfolders) import one another without a
circle: `a → b → a` (directly or through others of the folder) fails the check, so
that every folder reads from its top modules down. Paths count as above, `crate::…`
and `super::…` alike.

The room of pure decisions (`src/control/decide/`) does no I/O: no task or thread
spawned, no socket, file or HTTP call, no reading of the wall clock, outside its unit
tests (`IMPURE`).

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


def code_of(text: str) -> str:
    """The text with strings, chars and comments blanked (lines kept)."""
    out, i = [], 0
    while i < len(text):
        j = skip_literal(text, i)
        if j == i:
            out.append(text[i])
            i += 1
        else:
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
    return "".join(out)


def module_path(path: Path, src: Path) -> list:
    """`src/control/cluster/view.rs` → ["control", "cluster", "view"]; mod.rs is its folder."""
    parts = list(path.relative_to(src).parts)
    parts[-1] = parts[-1].removesuffix(".rs")
    if parts[-1] == "mod":
        parts.pop()
    return parts


def paths(text: str, own: list):
    """Every module path the code names (`crate::a::b…`, `super::…`), absolute, as lists."""
    code = code_of(text)
    for m in re.finditer(r"\b(crate::|(?:super::)+)((?:[a-z_][a-z0-9_]*::)*)(\{[^}]*\}?|[a-z_][a-z0-9_]*)?", code):
        head, middle, tail = m.group(1), m.group(2), m.group(3) or ""
        if head == "crate::":
            base = []
        else:
            ups = head.count("super::")
            if ups > len(own):
                continue
            base = own[: len(own) - ups]
        segs = [x for x in middle.split("::") if x]
        names = re.findall(r"(?:^|[{,])\s*([a-z_][a-z0-9_]*)", tail) if tail.startswith("{") else [tail]
        for n in names or [""]:
            full = base + segs + ([n] if n and n not in ("self",) else [])
            if "super" in full:
                continue
            yield full


def circles(src: Path) -> list:
    """Module circles inside each folder, as lines."""
    edges = {}
    for path in sorted(src.rglob("*.rs")):
        own = module_path(path, src)
        for full in paths(path.read_text(), own):
            # The first folder where the two paths part: an edge between siblings there.
            k = 0
            while k < min(len(own), len(full)) and own[k] == full[k]:
                k += 1
            if k < len(own) and k < len(full):
                folder = tuple(own[:k])
                edges.setdefault(folder, {}).setdefault(own[k], set()).add(full[k])
    out = []
    for folder, graph in sorted(edges.items()):
        for scc in strongly_connected(graph):
            if len(scc) > 1:
                where = "src/" + "/".join(folder) if folder else "src"
                out.append(f"{where}/: module circle: {' ⇄ '.join(sorted(scc))}")
    return out


def strongly_connected(graph: dict) -> list:
    """Tarjan's strongly connected components of `graph` (node → set of nodes)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            comps.append(comp)

    for v in sorted(set(graph) | {w for ws in graph.values() for w in ws}):
        if v not in index:
            visit(v)
    return comps


def imports(text: str):
    """(line number, module) of every crate path, unit tests included."""
    for no, line in enumerate(text.splitlines(), 1):
        code = line.split("//", 1)[0]
        for m in re.finditer(r"crate::(\{[^}]*\}?|[a-z_]+)", code):
            target = m.group(1)
            if target.startswith("{"):
                for name in re.findall(r"(?:^|[{,])\s*([a-z_]+)", target):
                    yield no, name
            else:
                yield no, target


# The room of pure decisions: no task, no thread, no socket, no file, no HTTP, no wall
# clock (outside its unit tests). What it decides is a function of what it is given.
PURE = "control/decide"
IMPURE = [
    "tokio::spawn",
    "thread::spawn",
    "std::fs",
    "tokio::fs",
    "tokio::net",
    "std::net::TcpStream",
    "std::net::UdpSocket",
    "reqwest",
    "clock::now",
    "SystemTime",
]


def impure(src: Path) -> list:
    """What the pure room must not do, found in its code (unit tests aside)."""
    out = []
    for path in sorted((src / PURE).rglob("*.rs")):
        text = path.read_text()
        cut = text.find("#[cfg(test)]")
        code = code_of(text[: cut if cut >= 0 else len(text)])
        for no, line in enumerate(code.splitlines(), 1):
            for word in IMPURE:
                if word in line:
                    out.append(f"{path.relative_to(src.parent)}:{no}: `{word}` in the pure room ({PURE}/)")
    return out


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
    bad += circles(src)
    bad += impure(src)
    for line in bad:
        print(line)
    print(f"layers: {len(bad)} violation(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
