#!/usr/bin/env python3
"""Builds the query files for benches/peers.sh.

  queries.py PREFIXES.tsv OUTDIR [COUNT]

Writes into OUTDIR:
  plain.txt  dnsperf text format, no EDNS: the steered name only;
  ecs.bin    COUNT queries for www.example.com A, each with EDNS and an ECS option whose
             client subnet is drawn from PREFIXES.tsv (IPv4 /24 and IPv6 /56 or the
             prefix's own length when longer), in dnsperf's binary format (-B: each DNS
             message preceded by its 2-byte big-endian length, RFC 1035 4.2.2);
  mix.bin    the same, but 20 % of the queries are non-steered names: example.com SOA
             and NS, ns1/mail A, and NXDOMAIN names (with ECS too);
  ecs-do.bin the queries of ecs.bin with the DO bit set (a validating resolver's).
The random seed is fixed, so every run sends the same queries.
"""
import ipaddress
import random
import struct
import sys


def name_wire(name):
    out = b""
    for label in name.rstrip(".").split("."):
        out += bytes([len(label)]) + label.encode()
    return out + b"\0"


QTYPE = {"A": 1, "NS": 2, "SOA": 6, "AAAA": 28}


def message(qname, qtype, subnet, do=False):
    # id 0 (dnsperf rewrites it), flags 0 (a resolver's query to an authority: RD off)
    header = struct.pack("!HHHHHH", 0, 0, 1, 0, 0, 1)
    question = name_wire(qname) + struct.pack("!HH", QTYPE[qtype], 1)
    family = 1 if subnet.version == 4 else 2
    plen = subnet.prefixlen
    addr = subnet.network_address.packed[: (plen + 7) // 8]
    ecs = struct.pack("!HBB", family, plen, 0) + addr
    option = struct.pack("!HH", 8, len(ecs)) + ecs
    # OPT: root name, type 41, UDP size 1232, ext rcode/version 0, flags 0 or DO
    flags = 0x8000 if do else 0
    opt = b"\0" + struct.pack("!HHIH", 41, 1232, flags, len(option)) + option
    return header + question + opt


def subnets(path, rng):
    prefixes = []
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                prefixes.append(ipaddress.ip_network(line.split("\t")[0], strict=False))
    while True:
        net = rng.choice(prefixes)
        want = 24 if net.version == 4 else 56
        plen = max(want, net.prefixlen)
        bits = net.max_prefixlen
        host = rng.getrandbits(bits - net.prefixlen) if bits > net.prefixlen else 0
        addr = int(net.network_address) | host
        yield ipaddress.ip_network((addr >> (bits - plen) << (bits - plen), plen))


def write_bin(path, msgs):
    with open(path, "wb") as f:
        for m in msgs:
            f.write(struct.pack("!H", len(m)) + m)


def main():
    prefixes, out = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 20000
    rng = random.Random(5)
    nets = subnets(prefixes, rng)
    with open(f"{out}/plain.txt", "w") as f:
        f.write("www.example.com A\n")
    ecs = [next(nets) for _ in range(count)]
    write_bin(f"{out}/ecs.bin", (message("www.example.com", "A", n) for n in ecs))
    write_bin(f"{out}/ecs-do.bin", (message("www.example.com", "A", n, do=True) for n in ecs))
    other = [("example.com", "SOA"), ("example.com", "NS"), ("ns1.example.com", "A"),
             ("mail.example.com", "A")]
    mix = []
    for i in range(count):
        if i % 5 == 4:
            k = (i // 5) % 5
            q = other[k] if k < 4 else (f"nx{rng.randrange(10**6)}.example.com", "A")
        else:
            q = ("www.example.com", "A")
        mix.append(message(q[0], q[1], next(nets)))
    write_bin(f"{out}/mix.bin", mix)


if __name__ == "__main__":
    main()
