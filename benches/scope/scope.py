#!/usr/bin/env python3
"""ECS scope efficiency: the scopes a server echoes against the widest correct ones.

    scope.py measure --db DB --policy YAML --server NAME=PORT [--server ...]
                     [--sample 5000] [--seed 16] [--name www.example.com]
    scope.py geoip2 --db DB --out FILE [--prefixes TSV]   # a GeoIP2-Country-shaped copy, for gdnsd

`measure` walks the IPv4 search tree of DB (every network, with data or empty), labels
each with the answer the policy gives it, merges runs of equal labels, and so knows for
every address the widest correct scope: the shortest prefix whose aligned block around
the address lies inside one run. It then asks every server, over UDP on 127.0.0.1, about
a seeded sample of IPv4 networks with data, one ECS query each, and prints the markdown
table (logs go to stderr).

The query: the network's first address, source prefix /24 (what resolvers send, and
what the issue measured), or the network's own prefix when it is longer than /24. A /24
around a longer network would be located at the /24's first address, which may lie in
another network (another country); with its own prefix every query block lies inside
the sampled network, so the whole source block has one answer and the optimum is that
of the sampled network.

Labels: the policy's regions, first match wins, by country code, `continent:XX`
(the GeoIP2 grouping steerdns uses, see continents.py) and `"*"`. Addresses without data
(and countries no region names) get the default region. Two regions with the same
weights give the same answer distribution and share a label. CIDR entries and
location-scoped drains are refused (this benchmark does not model them).
"""

import argparse
import bisect
import ipaddress
import os
import random
import socket
import struct
import sys
from fractions import Fraction

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mmdb  # noqa: E402
from continents import CONTINENT_OF  # noqa: E402


def log(msg):
    print(f"scope: {msg}", file=sys.stderr, flush=True)


def die(msg):
    log(msg)
    sys.exit(3)


# --- the policy ------------------------------------------------------------------------

def load_policy(path, name):
    try:
        import yaml
    except ImportError:
        die("python3 cannot import yaml: apt-get install python3-yaml (or pip install pyyaml)")
    with open(path) as f:
        doc = yaml.safe_load(f)
    if "hostnames" in doc:
        names = doc["hostnames"]
        if name is None:
            name = next(iter(names))
        key = next((n for n in names if n.rstrip(".").lower() == name.rstrip(".").lower()), None)
        if key is None:
            die(f"{path}: no name {name} in hostnames:")
        body = names[key]
        name = key
    else:
        body = doc
        name = name or doc.get("hostname")
        if name and doc.get("hostname") and name.rstrip(".").lower() != doc["hostname"].rstrip(".").lower():
            die(f"{path}: steers {doc['hostname']}, not {name}")
    for d in body.get("drain") or []:
        if d.get("where"):
            die(f"{path}: location-scoped drains are not modelled by this benchmark")
    regions = []
    default = None
    for i, region in enumerate(body["regions"]):
        weights = {c: w for c, w in (region.get("weights") or {}).items() if w}
        total = sum(weights.values())
        label = tuple(sorted((c, Fraction(w, total)) for c, w in weights.items()))
        countries, continents = set(), set()
        for entry in region["match"]:
            entry = str(entry)
            if entry == "*":
                if default is None:
                    default = label
                continue
            if "/" in entry or ":" in entry and not entry.lower().startswith("continent:"):
                die(f"{path}: region {i + 1}: CIDR entry {entry} is not supported by this "
                    "benchmark (it models regions by country and continent only)")
            if entry.lower().startswith("continent:"):
                continents.add(entry.split(":", 1)[1].upper())
            elif len(entry) == 2 and entry.isalpha():
                countries.add(entry.upper())
            else:
                die(f"{path}: region {i + 1}: entry {entry!r} is not supported by this benchmark")
        regions.append((countries, continents, label))
    if default is None:
        die(f"{path}: no default region (\"*\")")
    return name.rstrip("."), regions, default


def label_of(value, regions, default, cache):
    """The answer distribution for a database record (None: no data)."""
    country = country_of(value)
    # A GeoIP2 record's own continent wins over the table, as in steerdns.
    cont = ((value or {}).get("continent") or {}).get("code") or CONTINENT_OF.get(country)
    key = (country, cont)
    if key in cache:
        return cache[key]
    label = default
    if country is not None:
        for countries, continents, lab in regions:
            if country in countries or (cont is not None and cont in continents):
                label = lab
                break
    cache[key] = label
    return label


def country_of(value):
    """The country code of a database record: flat NRO or GeoIP2 schema."""
    if value is None:
        return None
    if "country_code" in value:
        return str(value["country_code"]).upper()
    c = value.get("country") or {}
    if "iso_code" in c:
        return str(c["iso_code"]).upper()
    return None


# --- the widest correct scope ----------------------------------------------------------

class Truth:
    """IPv4 runs of equal labels and the widest correct scope of any address."""

    def __init__(self, reader, regions, default):
        leaves = reader.leaves(reader.ipv4_start(), 32)
        cache = {}
        self.networks = []  # (first, prefix, country) of networks with data
        starts, labels = [], []
        for first, plen, rec in leaves:
            value = reader.value(rec)
            country = country_of(value)
            lab = label_of(value, regions, default, cache)
            if rec != reader.node_count:
                self.networks.append((first, plen, country))
            if not labels or labels[-1] != lab:
                starts.append(first)
                labels.append(lab)
        self.starts = starts
        self.ends = [s - 1 for s in starts[1:]] + [(1 << 32) - 1]
        self.labels = labels
        self.leaf_count = len(leaves)

    def run(self, addr):
        i = bisect.bisect_right(self.starts, addr) - 1
        return self.starts[i], self.ends[i], self.labels[i]

    def widest(self, addr):
        lo, hi, _ = self.run(addr)
        for p in range(33):
            size = 1 << (32 - p)
            block = addr & ~(size - 1) & 0xFFFFFFFF
            if block >= lo and block + size - 1 <= hi:
                return p
        raise AssertionError("a /32 is always inside its run")

    def blocks(self):
        """The number of maximal aligned blocks of one label (the widest scopes)."""
        n = 0
        for lo, hi in zip(self.starts, self.ends):
            a = lo
            while a <= hi:
                size = a & -a if a else 1 << 32
                while a + size - 1 > hi:
                    size >>= 1
                a += size
                n += 1
        return n


# --- DNS over UDP, by hand -------------------------------------------------------------

def query_bytes(qid, name, addr, source):
    header = struct.pack(">HHHHHH", qid, 0, 1, 0, 0, 1)  # no RD: we are not a resolver
    qname = b"".join(bytes([len(p)]) + p.encode("ascii") for p in name.split(".") if p) + b"\0"
    question = qname + struct.pack(">HH", 1, 1)  # A, IN
    octets = (source + 7) // 8
    ecs = struct.pack(">HBB", 1, source, 0) + addr.to_bytes(4, "big")[:octets]
    option = struct.pack(">HH", 8, len(ecs)) + ecs  # option 8: edns-client-subnet
    opt = b"\0" + struct.pack(">HHIH", 41, 1232, 0, len(option)) + option
    return header + question + opt


def skip_name(msg, off):
    while True:
        n = msg[off]
        if n == 0:
            return off + 1
        if n & 0xC0 == 0xC0:
            return off + 2
        off += 1 + n


def read_name(msg, off):
    labels = []
    for _ in range(128):
        n = msg[off]
        if n == 0:
            break
        if n & 0xC0 == 0xC0:
            off = ((n & 0x3F) << 8) | msg[off + 1]
            continue
        labels.append(msg[off + 1:off + 1 + n].decode("ascii", "replace"))
        off += 1 + n
    return ".".join(labels) + "."


def parse_answer(msg):
    """(rcode, CNAME target or None, ECS (family, source, scope) or None)."""
    qid, flags, qd, an, ns, ar = struct.unpack(">HHHHHH", msg[:12])
    off = 12
    for _ in range(qd):
        off = skip_name(msg, off) + 4
    cname, ecs, rcode = None, None, flags & 0xF
    for i in range(an + ns + ar):
        off = skip_name(msg, off)
        rtype, _cls, ttl, rdlen = struct.unpack(">HHIH", msg[off:off + 10])
        off += 10
        rdata = off
        off += rdlen
        if i < an and rtype == 5 and cname is None:
            cname = read_name(msg, rdata)
        if rtype == 41:
            rcode |= (ttl >> 24) << 4
            o = rdata
            while o + 4 <= off:
                code, olen = struct.unpack(">HH", msg[o:o + 4])
                if code == 8 and olen >= 4:
                    ecs = struct.unpack(">HBB", msg[o + 4:o + 8])
                o += 4 + olen
    return rcode, cname, ecs


def ask(sock, port, name, addr, source, qid):
    msg = query_bytes(qid, name, addr, source)
    for _ in range(3):
        sock.sendto(msg, ("127.0.0.1", port))
        try:
            while True:
                data, _ = sock.recvfrom(4096)
                if len(data) >= 12 and struct.unpack(">H", data[:2])[0] == qid:
                    return parse_answer(data)
        except socket.timeout:
            continue
    return None


# --- measure ---------------------------------------------------------------------------

def fmt_addrs(x):
    return f"{x:,.0f}"


def describe_block(truth, addr, plen):
    """The labels inside a block, for the examples of answers wider than correct."""
    size = 1 << (32 - plen)
    lo = addr & ~(size - 1) & 0xFFFFFFFF
    hi = lo + size - 1
    i = bisect.bisect_right(truth.starts, lo) - 1
    seen = []
    while i < len(truth.starts) and truth.starts[i] <= hi and len(seen) < 4:
        s = max(truth.starts[i], lo)
        seen.append(f"{ipaddress.IPv4Address(s)}.. {region_name(truth.labels[i])}")
        i += 1
    return "; ".join(seen)


def region_name(label):
    return "/".join(f"{c} {float(w) * 100:.0f}" for c, w in label)


def measure(args):
    try:
        reader = mmdb.Reader(args.db)
    except (OSError, mmdb.FormatError) as e:
        die(f"cannot read {args.db}: {e}")
    name, regions, default = load_policy(args.policy, args.name)
    truth = Truth(reader, regions, default)
    log(f"{args.db}: IPv4 {truth.leaf_count:,} networks ({len(truth.networks):,} with data), "
        f"{len(truth.starts):,} runs of one answer, {truth.blocks():,} maximal blocks "
        f"(widest correct scopes) under {args.policy} for {name}")
    rng = random.Random(args.seed)
    sample = rng.sample(truth.networks, min(args.sample, len(truth.networks)))
    longer = sum(1 for _, p, _ in sample if p > 24)
    if args.source is None:
        how = f"source /24, or the network's prefix when longer: {longer} of them"
    else:
        how = (f"source /{args.source} for all (at the block's first address, located there; "
               f"{sum(1 for _, p, _ in sample if p > args.source)} networks are longer)")
    log(f"sample: {len(sample):,} IPv4 networks with data (seed {args.seed}); ECS {how}")
    queries = []
    for first, plen, country in sample:
        if args.source is None:
            source, addr = max(24, plen), first
        else:
            source = args.source
            addr = first & ~((1 << (32 - source)) - 1) & 0xFFFFFFFF
        queries.append((addr, source, country, truth.widest(addr)))

    rows = []
    opt_mean = sum(q[3] for q in queries) / len(queries)
    opt_addrs = sum(1 << (32 - q[3]) for q in queries) / len(queries)
    rows.append(("widest correct (the optimum)", f"/{opt_mean:.1f}", "–", "–",
                 f"100 % ({fmt_addrs(opt_addrs)})", 0))
    ok = True
    for spec in args.server:
        label, port = spec.rsplit("=", 1)
        port = int(port)
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.settimeout(args.timeout)
        scopes, narrower, wider, failed, examples = [], 0, 0, 0, []
        covered = opt_covered = 0
        for n, (addr, source, country, opt) in enumerate(queries):
            got = ask(sock, port, name, addr, source, (n * 7919 + 1) & 0xFFFF)
            if got is None or got[0] != 0 or got[1] is None or got[2] is None or got[2][0] != 1:
                failed += 1
                if failed <= 3:
                    log(f"{label}: {ipaddress.IPv4Address(addr)}/{source}: bad answer {got}")
                continue
            scope = got[2][2]
            scopes.append(scope)
            covered += 1 << (32 - scope)
            opt_covered += 1 << (32 - opt)
            if scope > opt:
                narrower += 1
            elif scope < opt:
                wider += 1
                if len(examples) < args.examples:
                    examples.append(
                        f"  {ipaddress.IPv4Address(addr)}/{source} ({country}): scope /{scope}, "
                        f"widest correct /{opt}; the /{scope} holds: "
                        f"{describe_block(truth, addr, scope)}")
        sock.close()
        answered = len(scopes)
        if answered == 0:
            die(f"{label}: no usable answer from 127.0.0.1:{port}")
        if failed:
            ok = False
            log(f"{label}: {failed} of {len(queries)} queries got no usable answer")
        if wider:
            ok = False
            log(f"{label}: {wider} answers WIDER than correct (a correctness bug), e.g.:")
            for e in examples:
                print(e, file=sys.stderr)
        # Coverage against the optima of the queries answered (all, unless some failed).
        mean_addrs = covered / answered
        pct = covered / opt_covered * 100
        rows.append((label, f"/{sum(scopes) / answered:.1f}",
                     f"{narrower / answered * 100:.1f} %", f"{wider / answered * 100:.1f} %",
                     f"{pct:.1f} % ({fmt_addrs(mean_addrs)})", failed))
        log(f"{label}: {answered} answers, mean scope /{sum(scopes) / answered:.2f}, "
            f"narrower {narrower}, wider {wider}, {fmt_addrs(mean_addrs)} addresses per answer")

    print(f"{len(queries):,} IPv4 networks with data of `{os.path.basename(args.db)}` (seed {args.seed}), "
          f"one ECS query each ({how}); "
          f"policy `{os.path.basename(args.policy)}`, name {name}")
    print()
    print("| server | mean scope | narrower than optimum | wider than correct | addresses per answer vs optimum |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for r in rows:
        extra = f" ({r[5]} unanswered)" if r[5] else ""
        print(f"| {r[0]}{extra} | {r[1]} | {r[2]} | {r[3]} | {r[4]} |")
    return 0 if ok else 2


# --- a GeoIP2-Country copy -------------------------------------------------------------

def geoip2(args):
    try:
        reader = mmdb.Reader(args.db)
    except (OSError, mmdb.FormatError) as e:
        die(f"cannot read {args.db}: {e}")
    v4 = reader.ipv4_start()
    nets = []
    for first, plen, rec in reader.leaves(v4, 32):
        nets.append((first, 96 + plen, country_of(reader.value(rec)) if rec != reader.node_count else None))
    if reader.ip_version == 6 and not args.ipv4_only:
        for first, plen, rec in reader.leaves(0, 128, skip={v4}):
            if first >> 32 == 0 and plen >= 96:
                continue  # ::/96 is the IPv4 space, written above
            nets.append((first, plen, country_of(reader.value(rec)) if rec != reader.node_count else None))
    nets.sort()
    values = {}
    unknown = set()
    for _, _, cc in nets:
        if cc is None or cc in values:
            continue
        v = {"country": {"iso_code": cc}}
        cont = CONTINENT_OF.get(cc)
        if cont:
            v = {"continent": {"code": cont}, "country": {"iso_code": cc}}
        else:
            unknown.add(cc)
        values[cc] = v
    if unknown:
        log(f"no continent known for {' '.join(sorted(unknown))}")
    count, rsize = mmdb.write(args.out, nets, values, "GeoIP2-Country",
                              f"GeoIP2-Country-shaped copy of {os.path.basename(args.db)} (benches/scope)")
    log(f"wrote {args.out}: {len(nets):,} networks, {count:,} nodes, record size {rsize}")
    if args.prefixes:
        # Every network with data, as benches/queries.py reads them.
        with open(args.prefixes, "w") as f:
            for first, plen, cc in nets:
                if cc is None:
                    continue
                if first >> 32 == 0 and plen >= 96:
                    f.write(f"{ipaddress.IPv4Address(first)}/{plen - 96}\t{cc}\t{CONTINENT_OF.get(cc, '')}\n")
                else:
                    f.write(f"{ipaddress.IPv6Address(first)}/{plen}\t{cc}\t{CONTINENT_OF.get(cc, '')}\n")
    return 0


DEMO = [
    ({"GB", "IE", "DE", "FR", "NL", "ES", "IT"}, {"fastly": 90, "cloudflare": 10}),
    ({"US", "CA", "MX"}, {"fastly": 85, "cloudflare": 15}),
    ({"AU", "NZ", "SG", "JP"}, {"fastly": 10, "cloudflare": 90}),
]


def is_demo(args):
    """Exit 0 if the policy answers like the demo policy (the one gdnsd is configured
    for in ../shared/peers/gdnsd): same regions, same answer distributions."""
    _, regions, default = load_policy(args.policy, args.name)
    want = [(c, tuple(sorted((k, Fraction(w, 100)) for k, w in ws.items()))) for c, ws in DEMO]
    got = [(c, lab) for c, conts, lab in regions if c or conts]
    same = (all(not conts for _, conts, _ in regions) and got == want
            and default == (("cloudflare", Fraction(1, 2)), ("fastly", Fraction(1, 2))))
    return 0 if same else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure")
    m.add_argument("--db", default="geo/country.mmdb")
    m.add_argument("--policy", default="steering.yaml")
    m.add_argument("--name", help="the steered name (default: the policy's first)")
    m.add_argument("--server", action="append", required=True, help="NAME=PORT on 127.0.0.1")
    m.add_argument("--sample", type=int, default=5000)
    m.add_argument("--seed", type=int, default=16)
    m.add_argument("--source", type=int, choices=range(1, 33), metavar="BITS",
                   help="one source prefix for every query (the issue's own measure: 24); "
                        "default: /24, or the network's prefix when longer")
    m.add_argument("--timeout", type=float, default=1.0)
    m.add_argument("--examples", type=int, default=10)
    g = sub.add_parser("geoip2")
    g.add_argument("--db", default="geo/country.mmdb")
    g.add_argument("--prefixes", help="also write every network with data to this file "
                   "(prefix, country, continent; tab-separated), for benches/queries.py")
    g.add_argument("--out", required=True)
    g.add_argument("--ipv4-only", action="store_true")
    d = sub.add_parser("is-demo")
    d.add_argument("--policy", default="steering.yaml")
    d.add_argument("--name")
    args = ap.parse_args()
    return {"measure": measure, "geoip2": geoip2, "is-demo": is_demo}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
