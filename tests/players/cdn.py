#!/usr/bin/env python3
"""A stand-in CDN for tests/players.rs: serves DIR on 127.0.0.1:PORT with CORS (and
Timing-Allow-Origin), and
writes one access-log line per request to LOG ("<unix time> <method> <path> <status>"),
flushed at once so that the test can poll it.

    python3 cdn.py PORT DIR LOG
"""

import http.server
import sys
import time


class Handler(http.server.SimpleHTTPRequestHandler):
    def end_headers(self):
        self.send_header("Access-Control-Allow-Origin", "*")
        # The page's beacons read each segment's time to first byte.
        self.send_header("Timing-Allow-Origin", "*")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_request(self, code="-", size="-"):
        path = self.path.split("?", 1)[0]
        LOG.write(f"{time.time():.3f} {self.command} {path} {code}\n")
        LOG.flush()

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    port, root, log = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    LOG = open(log, "a", buffering=1)
    Handler.extensions_map.update(
        {".m3u8": "application/vnd.apple.mpegurl", ".mpd": "application/dash+xml",
         ".m4s": "video/iso.segment", ".ts": "video/mp2t", ".js": "text/javascript"}
    )
    handler = lambda *a, **k: Handler(*a, directory=root, **k)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
    server.daemon_threads = True
    server.serve_forever()
