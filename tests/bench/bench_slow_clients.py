"""64 slow clients (one byte at a time, never finishing) against the /metrics server's defaults,
then 40 /healthz probes and 40 /metrics scrapes from another address: how many are answered.

    PYTHONPATH=. python tests/bench/bench_slow_clients.py
"""

from __future__ import annotations

import socket
import threading
import urllib.request
from collections.abc import Callable

from ragpulse.pipeline.metrics.http import MetricsHTTPServer, exporter_app

SLOW_CLIENTS = 64
PROBES = 40


def main() -> None:
    def up(environ: dict[str, object], respond: Callable[..., object]) -> list[bytes]:
        respond("200 OK", [])
        return [b"up\n"]

    server = MetricsHTTPServer(("127.0.0.1", 0), exporter_app(up, lambda: (True, "ok"), {}))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_port
    slow = [
        socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.3.{n % 8 + 1}", 0))
        for n in range(SLOW_CLIENTS)
    ]
    for byte in b"GET /m":  # one byte at a time from every client, never a whole request line
        for conn in slow:
            conn.sendall(bytes([byte]))
    for path in ("/healthz", "/metrics"):
        answered = 0
        for _ in range(PROBES):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                    answered += r.status == 200
            except OSError:
                pass
        print(f"{path}: {answered} of {PROBES} answered behind {SLOW_CLIENTS} slow clients")
    for conn in slow:
        conn.close()
    server.shutdown()
    server.server_close()


if __name__ == "__main__":
    main()
