#!/usr/bin/env python3
"""Hostile traffic for tests/soak.sh (issue 14, item 11), on loopback only.

    hostile-traffic.py DNS_PORT API_PORT SECONDS [GARBAGE_PORT]

For SECONDS, at the same time:
  - a TCP slowloris from 127.66.0.1: up to 300 connections to the DNS port, each sending
    one byte every 2 s of a message that never ends (a length of 257); the connections
    the server closes are opened again (at most 50 a second);
  - UDP garbage from 127.67.0.1: about 1,000 datagrams a second to GARBAGE_PORT (the
    DNS port unless given: the soak gives another port of the same server, so that the
    kernel's drops of the garbage are not counted with its load's): random bytes of
    random length (0 to 600), headers only, and responses (QR=1);
  - an API connection flood from 127.68.0.1: up to 300 idle connections to the API port,
    opened again when closed;
  - the same flood spread over the addresses of one /24 (127.70.0.1 to .250), which the
    API counts as one source: all but 32 are closed at once;
  - a DNS-over-TCP amplification: 64 connections from three /24s (127.69.0-2.x), each
    sending a padded 64 KiB query and 1000 pipelined queries, reading nothing for 2 s,
    then every answer (counted: each must arrive, whole); again until the end.
Prints one JSON line of what it did. Every socket is closed on exit.
"""

import json
import os
import random
import resource
import socket
import sys
import threading
import time

HOLD = 300
REOPEN_PER_SECOND = 50


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 4096) if hard != resource.RLIM_INFINITY else 4096
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def connect(src, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(1.0)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    s.setblocking(False)
    return s


def holder(name, src, port, until, stats, trickle):
    """Keeps up to HOLD connections from src (an address, or a list to spread them
    over) open; trickle: send a byte every 2 s."""
    srcs = src if isinstance(src, list) else [src]
    opened = 0
    conns = []
    last_trickle = 0.0
    while time.monotonic() < until:
        tick = time.monotonic()
        for _ in range(min(REOPEN_PER_SECOND // 2, HOLD - len(conns))):
            try:
                conns.append(connect(srcs[opened % len(srcs)], port))
                opened += 1
                stats[name + "_opened"] += 1
            except OSError:
                stats[name + "_connect_failed"] += 1
                break
        alive = []
        for s in conns:
            try:
                # A read of 0 bytes: the server closed it.
                if s.recv(4096) == b"":
                    stats[name + "_closed_by_server"] += 1
                    s.close()
                    continue
            except BlockingIOError:
                pass
            except OSError:
                stats[name + "_closed_by_server"] += 1
                s.close()
                continue
            alive.append(s)
        conns = alive
        if trickle and tick - last_trickle >= 2.0:
            last_trickle = tick
            for s in conns:
                try:
                    s.send(b"\x01")
                except OSError:
                    pass
        stats[name + "_held_max"] = max(stats[name + "_held_max"], len(conns))
        time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
    for s in conns:
        s.close()


def garbage(port, until, stats):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.67.0.1", 0))
    s.setblocking(False)
    rng = random.Random(14)
    while time.monotonic() < until:
        for _ in range(50):
            kind = rng.randrange(3)
            if kind == 0:
                d = os.urandom(rng.randrange(0, 601))
            elif kind == 1:
                d = os.urandom(rng.randrange(0, 13))
            else:
                # A response (QR=1) with a random body.
                d = os.urandom(2) + bytes([0x80 | rng.randrange(128), 0]) + os.urandom(rng.randrange(8, 100))
            try:
                s.sendto(d, ("127.0.0.1", port))
                stats["udp_garbage_sent"] += 1
            except OSError:
                pass
        # Answers (FORMERR) are read and thrown away.
        try:
            while s.recv(4096):
                pass
        except OSError:
            pass
        time.sleep(0.05)
    s.close()


def query(qid, pad=0):
    """A query for www.example.com A, its OPT padded with `pad` bytes (option 12)."""
    q = qid.to_bytes(2, "big") + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x01"
    q += b"\x03www\x07example\x03com\x00\x00\x01\x00\x01"
    q += b"\x00\x00\x29\x04\xd0\x00\x00\x00\x00" + (pad + 4).to_bytes(2, "big")
    q += b"\x00\x0c" + pad.to_bytes(2, "big") + bytes(pad)
    return len(q).to_bytes(2, "big") + q


def read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise OSError("closed")
        buf += chunk
    return buf


def amplify(port, until, stats):
    """64 connections from three /24s pipelining queries without reading, then reading
    every answer; each round's answers must all arrive, whole and in order."""
    pad = 65535 - len(query(0)) + 2
    burst = query(0, pad) + b"".join(query(i) for i in range(1, 1001))
    while time.monotonic() + 10 < until:
        conns = []
        for i in range(64):
            try:
                s = connect("127.69.%d.%d" % (i % 3, 1 + i // 3), port)
                s.setblocking(True)
                s.settimeout(10.0)
                conns.append(s)
            except OSError:
                stats["amplify_connect_failed"] += 1
        senders = [threading.Thread(target=s.sendall, args=(burst,)) for s in conns]
        for t in senders:
            t.start()
        time.sleep(2)
        for s in conns:
            try:
                for want in range(1001):
                    n = int.from_bytes(read_exact(s, 2), "big")
                    answer = read_exact(s, n)
                    if int.from_bytes(answer[:2], "big") != want:
                        raise OSError("out of order")
                    stats["amplify_answers"] += 1
            except OSError:
                stats["amplify_incomplete"] += 1
            s.close()
        for t in senders:
            t.join()
        stats["amplify_rounds"] += 1


def main():
    dns_port, api_port, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
    garbage_port = int(sys.argv[4]) if len(sys.argv) > 4 else dns_port
    raise_fd_limit()
    until = time.monotonic() + seconds
    stats = {
        k: 0
        for k in (
            "tcp_opened", "tcp_connect_failed", "tcp_closed_by_server", "tcp_held_max",
            "api_opened", "api_connect_failed", "api_closed_by_server", "api_held_max",
            "udp_garbage_sent", "api_spread_opened", "api_spread_connect_failed",
            "api_spread_closed_by_server", "api_spread_held_max", "amplify_answers",
            "amplify_incomplete", "amplify_rounds", "amplify_connect_failed",
        )
    }
    threads = [
        threading.Thread(target=holder, args=("tcp", "127.66.0.1", dns_port, until, stats, True)),
        threading.Thread(target=holder, args=("api", "127.68.0.1", api_port, until, stats, False)),
        threading.Thread(target=garbage, args=(garbage_port, until, stats)),
        threading.Thread(
            target=holder,
            args=("api_spread", ["127.70.0.%d" % i for i in range(1, 251)], api_port, until,
                  stats, False),
        ),
        threading.Thread(target=amplify, args=(dns_port, until, stats)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(stats))


if __name__ == "__main__":
    main()
