"""Slow clients (one byte at a time, never finishing a request) against serve's listeners with
their default limits, then /healthz probes and /metrics scrapes: how many are answered.

Three crowds, each against a fresh pair of listeners (the metrics listener, TLS and auth off,
and, where this code has one, the health listener of --health-port):
- 64 slow clients from 8 addresses (127.0.3.x), probes from 127.0.0.1;
- 640 slow clients from 40 addresses (127.0.4.x), each connecting and sending its first bytes
  while the server already holds its 512 waiting connections, so that it closes the oldest
  ones while they are sending: the case that ended the server thread with a KeyError;
- 16 slow clients from the probes' own address, 127.0.0.1 (a node whose kubelet and the crowd
  share one NAT address), which fill that address's share of the metrics listener.

    PYTHONPATH=. python tests/bench/bench_slow_clients.py [--probes 40]

Each probe waits at most --timeout seconds, so a dead listener costs probes x timeout at most.
Run it with PYTHONPATH pointing at an older checkout to measure that code (no health listener:
its column reads n/a).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from ragpulse.pipeline.metrics import http

CROWDS = (  # name, clients, their addresses
    ("64 from 8 addresses", 64, [f"127.0.3.{n}" for n in range(1, 9)]),
    ("640 from 40 addresses", 640, [f"127.0.4.{n}" for n in range(1, 41)]),
    ("16 from the probes' address", 16, ["127.0.0.1"]),
)


def up(environ: dict[str, Any], respond: Callable[..., object]) -> list[bytes]:
    respond("200 OK", [])
    return [b"up\n"]


@contextlib.contextmanager
def listeners() -> Iterator[tuple[int, int | None]]:
    """The metrics listener's port and the health listener's (None in code without one)."""
    healthy = lambda: (True, "ok")  # noqa: E731
    metrics = http.start_metrics_server(http.exporter_app(up, healthy, {}), "127.0.0.1", 0)
    start_health = getattr(http, "start_health_server", None)
    health = start_health(healthy, "127.0.0.1", 0) if start_health else None
    try:
        yield metrics.server_port, (health.server_port if health else None)
    finally:
        for server in (metrics, health):
            if server is not None:
                server.shutdown()
                server.server_close()


def crowd(port: int, clients: int, addresses: list[str]) -> list[socket.socket]:
    """`clients` connections that send a request one byte at a time, never finishing it; a
    client the server closes connects again (as an attacker's would), so that the server
    closes its oldest waiting connections while they are sending."""

    def connect(n: int) -> socket.socket | None:
        try:
            conn = socket.create_connection(
                ("127.0.0.1", port), timeout=5, source_address=(addresses[n % len(addresses)], 0)
            )
        except OSError:
            return None  # refused: that client is not part of the crowd this round
        return conn

    slow = [connect(n) for n in range(clients)]
    for byte in b"GET /m":  # one byte at a time from every client, never a whole request line
        for n, conn in enumerate(slow):
            try:
                if conn is None:
                    raise ConnectionError
                conn.sendall(bytes([byte]))
            except OSError:
                if conn is not None:
                    conn.close()
                slow[n] = connect(n)
    return [conn for conn in slow if conn is not None]


def answered(url: str, probes: int, timeout: float) -> int:
    count = 0
    for _ in range(probes):
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                count += response.status == 200
        except OSError:
            pass
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probes", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=2.0, help="seconds a probe waits")
    options = parser.parse_args()
    n = options.probes
    print("| slow clients | /metrics | /healthz, metrics port | /healthz, health port |")
    print("|---|---|---|---|")
    for name, clients, addresses in CROWDS:
        with listeners() as (metrics_port, health_port):
            slow = crowd(metrics_port, clients, addresses)
            try:
                base = f"http://127.0.0.1:{metrics_port}"
                scrapes = answered(base + "/metrics", n, options.timeout)
                on_metrics = answered(base + "/healthz", n, options.timeout)
                on_health = (
                    f"{answered(f'http://127.0.0.1:{health_port}/healthz', n, options.timeout)}"
                    f" of {n}" if health_port is not None else "n/a"
                )
                print(f"| {name} | {scrapes} of {n} | {on_metrics} of {n} | {on_health} |")
            finally:
                for conn in slow:
                    conn.close()
    alive = [t.name for t in threading.enumerate() if t.name in ("metrics-http", "health-http")]
    print(f"server threads still running after shutdown: {len(alive)}")


if __name__ == "__main__":
    main()
