#!/usr/bin/env python3
"""A relay that makes a link look like a long-distance one: delay, jitter and loss per
direction, for TCP and UDP, without the kernel's netem (this machine has none).

    python3 tests/wan-relay.py --profile FILE [--site SITE] [--stats FILE] LINK...

    LINK   tcp:LISTEN_HOST:PORT=TARGET_HOST:PORT   or   udp:LISTEN_HOST:PORT=TARGET_HOST:PORT

It stands in front of a server (an etcd member, a node), in that server's network
namespace: the server listens on the target, its clients reach the listen address.
What a chunk of a TCP stream or a UDP datagram suffers depends on where it comes from
(the client's address) and on this relay's site, read from the profile, a JSON file
read again whenever it changes (a drill changes the link while it runs):

    {"sites": {"10.214.0.21": "A", "10.214.0.22": "B"},      # address -> site
     "links": {"A-B": {"delay_ms": 40, "jitter_ms": 4},       # one way, each direction
               "A-A": {"delay_ms": 0}},
     "from":  {"10.214.0.21": {"delay_ms": 200, "loss": 0.05, "up": {...}, "down": {...}}},
     "site_faults": {"A": {"loss": 0.03}}}

A rule has `delay_ms` (one way), `jitter_ms` (uniform, plus or minus) and `loss` (a
fraction), and may give `up` (client to server) or `down` (server to client) its own
values. The link's rule (the pair of sites, in either order) and the client's own rule
(`from`, a fault on one client's link) and a fault on a whole site (`site_faults`: every
link from or to it, both ways) add up: delays and jitters sum, losses combine.

Loss on UDP drops the datagram. Loss on TCP cannot drop bytes (the stream is reliable):
a lost chunk, and everything behind it, waits one retransmission timeout (200 ms plus
the round trip), as the kernel's TCP would make it. Jitter never reorders a stream.
The first bytes of a TCP connection wait one more round trip (the handshake).

With `--stats FILE` it writes every second the bytes it relayed per client address
and direction since it started: {"10.214.0.21": {"up": N, "down": N}, ...}.
"""

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import sys
import time

RTO_FLOOR = 0.2  # Linux's minimum retransmission timeout, in seconds


class Profile:
    """The profile file, read again when its modification time changes."""

    def __init__(self, path, site):
        self.path, self.site = path, site
        self.mtime = None
        self.doc = {}

    def refresh(self):
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError:
            return
        if mtime == self.mtime:
            return
        try:
            with open(self.path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            print(f"wan-relay: {self.path}: {e} (the last good profile stays)", file=sys.stderr)
            return
        self.mtime, self.doc = mtime, doc

    def rule(self, client, direction):
        """(delay s, jitter s, loss) for a chunk from `client`'s side or to it."""
        parts = []
        site = self.doc.get("sites", {}).get(client)
        if site is not None and self.site is not None:
            links = self.doc.get("links", {})
            link = links.get(f"{site}-{self.site}") or links.get(f"{self.site}-{site}")
            if link:
                parts.append(link)
        own = self.doc.get("from", {}).get(client)
        if own:
            parts.append(own)
        faults = self.doc.get("site_faults", {})
        for s in {site, self.site}:
            if s in faults:
                parts.append(faults[s])
        delay = jitter = 0.0
        keep = 1.0
        for p in parts:
            p = {**p, **p.get(direction, {})}
            delay += float(p.get("delay_ms", 0)) / 1000
            jitter += float(p.get("jitter_ms", 0)) / 1000
            keep *= 1 - float(p.get("loss", 0))
        return delay, jitter, 1 - keep

    def transit(self, client, direction):
        """How long one chunk takes, and whether it is lost."""
        delay, jitter, loss = self.rule(client, direction)
        t = max(0.0, delay + random.uniform(-jitter, jitter))
        return t, random.random() < loss

    def round_trip(self, client):
        return self.rule(client, "up")[0] + self.rule(client, "down")[0]


class Stats:
    def __init__(self, path):
        self.path = path
        self.bytes = {}

    def add(self, client, direction, n):
        c = self.bytes.setdefault(client, {"up": 0, "down": 0})
        c[direction] += n

    async def write_every_second(self):
        while self.path:
            await asyncio.sleep(1)
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(self.bytes, f)
            os.replace(tmp, self.path)


async def pipe(reader, writer, profile, stats, client, direction):
    """Copies one direction of a stream, each chunk held for its transit, in order."""
    queue = asyncio.Queue(maxsize=4096)
    loop = asyncio.get_running_loop()

    async def read():
        last = 0.0
        try:
            while True:
                data = await reader.read(65536)
                t, lost = profile.transit(client, direction)
                if lost:
                    t += RTO_FLOOR + profile.round_trip(client)
                due = max(loop.time() + t, last)
                last = due
                await queue.put((due, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            await queue.put((loop.time(), None))

    async def write():
        while True:
            due, data = await queue.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if data is None:
                writer.close()
                return
            if not data:
                if writer.can_write_eof():
                    writer.write_eof()
                return
            writer.write(data)
            stats.add(client, direction, len(data))
            await writer.drain()

    reading = asyncio.ensure_future(read())
    try:
        await write()
    except (ConnectionError, OSError):
        writer.close()
    finally:
        reading.cancel()


async def tcp_link(listen, target, profile, stats):
    async def handle(c_reader, c_writer):
        client = c_writer.get_extra_info("peername")[0]
        profile.refresh()
        await asyncio.sleep(profile.round_trip(client))  # the handshake
        try:
            s_reader, s_writer = await asyncio.open_connection(*target)
        except OSError:
            c_writer.close()
            return
        ups = pipe(c_reader, s_writer, profile, stats, client, "up")
        downs = pipe(s_reader, c_writer, profile, stats, client, "down")
        await asyncio.gather(ups, downs, return_exceptions=True)
        for w in (c_writer, s_writer):
            w.close()

    server = await asyncio.start_server(handle, *listen, reuse_address=True)
    async with server:
        await server.serve_forever()


class UdpLink(asyncio.DatagramProtocol):
    """Datagrams to `listen` go to `target` from one socket per client, and back."""

    def __init__(self, target, profile, stats):
        self.target, self.profile, self.stats = target, profile, stats
        self.sessions = {}
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        loop = asyncio.get_running_loop()
        self.profile.refresh()
        t, lost = self.profile.transit(addr[0], "up")
        if lost:
            return
        loop.call_later(t, lambda: asyncio.ensure_future(self.forward(data, addr)))

    async def forward(self, data, addr):
        loop = asyncio.get_running_loop()
        session = self.sessions.get(addr)
        if session is None:
            link = self

            class Back(asyncio.DatagramProtocol):
                def datagram_received(self, reply, _):
                    t, lost = link.profile.transit(addr[0], "down")
                    if not lost:
                        loop.call_later(t, link.reply, reply, addr)

            session, _ = await loop.create_datagram_endpoint(Back, remote_addr=self.target)
            self.sessions[addr] = session
        session.sendto(data)
        self.stats.add(addr[0], "up", len(data))

    def reply(self, data, addr):
        self.transport.sendto(data, addr)
        self.stats.add(addr[0], "down", len(data))


def parse_link(text):
    proto, _, rest = text.partition(":")
    listen, _, target = rest.partition("=")

    def hostport(s):
        host, _, port = s.rpartition(":")
        return host.strip("[]"), int(port)

    if proto not in ("tcp", "udp") or not target:
        raise SystemExit(f"wan-relay: {text}: expected tcp:HOST:PORT=HOST:PORT or udp:…")
    return proto, hostport(listen), hostport(target)


async def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True, help="the JSON profile (read again when it changes)")
    ap.add_argument("--site", help="this relay's site (the server's), for the profile's links")
    ap.add_argument("--stats", help="write the bytes relayed per client here every second")
    ap.add_argument("links", nargs="+", help="tcp:LISTEN=TARGET or udp:LISTEN=TARGET")
    args = ap.parse_args()
    profile = Profile(args.profile, args.site)
    profile.refresh()
    stats = Stats(args.stats)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, loop.stop)
    async def refresh_every_100ms():
        while True:
            await asyncio.sleep(0.1)
            profile.refresh()

    tasks = [asyncio.ensure_future(stats.write_every_second()), asyncio.ensure_future(refresh_every_100ms())]
    for text in args.links:
        proto, listen, target = parse_link(text)
        if proto == "tcp":
            tasks.append(asyncio.ensure_future(tcp_link(listen, target, profile, stats)))
        else:
            family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
            await loop.create_datagram_endpoint(
                lambda: UdpLink(target, profile, stats), local_addr=listen, family=family
            )
    print(f"wan-relay: {' '.join(args.links)} (site {args.site or '-'})", file=sys.stderr, flush=True)
    await asyncio.gather(*tasks)


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except RuntimeError:
        pass  # the loop stopped on a signal
