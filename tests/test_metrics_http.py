"""The /metrics and /healthz server of `ragpulse serve`, on real sockets: where it listens, TLS
and basic auth from a Prometheus web config file, and bounded threads under a connection flood.

The server is started with `serve_http` on a real `TopicWatcher` (its state file in tmp_path; no
broker is needed until a cycle runs), so what is tested is what `ragpulse serve` runs.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import http.client
import logging
import select
import socket
import ssl
import struct
import termios
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from certs import make_ca, make_leaf
from cli import one_line_error

from ragpulse.pipeline import cli
from ragpulse.pipeline.commands.serve import serve_http
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.metrics.http import (
    MetricsHTTPServer,
    WebConfig,
    exporter_app,
    load_web_config,
    start_health_server,
)
from ragpulse.pipeline.service.loop import TopicWatcher
from ragpulse.pipeline.settings.command_flags import EXPORTER, SERVE, settings_from

PASSWORD = "correct horse battery staple"

StartServer = Callable[..., MetricsHTTPServer]


def serve_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "serve",
        "--kafka-bootstrap", "127.0.0.1:1",  # never contacted: no cycle runs in these tests
        "--topic", "chat",
        "--state", str(tmp_path / "state.sqlite"),
        "--metrics-port", "0",
        "--judge-backend", "local",
        *extra,
    ]


@pytest.fixture
def watcher(tmp_path: Path) -> Iterator[TopicWatcher]:
    args = cli.build_parser().parse_args(serve_args(tmp_path))
    w = TopicWatcher(settings_from(SERVE, args))
    try:
        yield w
    finally:
        w.close()


@pytest.fixture
def start(watcher: TopicWatcher) -> Iterator[StartServer]:
    """`start(web=None, host="127.0.0.1")` runs serve_http; every server is shut at teardown."""
    servers: list[MetricsHTTPServer] = []

    def run(web: WebConfig | None = None, host: str = "127.0.0.1") -> MetricsHTTPServer:
        server = serve_http(watcher, host, 0, web)
        servers.append(server)
        return server

    yield run
    for server in servers:
        server.shutdown()
        server.server_close()


# --- web config and requests ------------------------------------------------------------------


def web_config(directory: Path, document: dict[str, object]) -> Path:
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


def get(
    url: str, *, context: ssl.SSLContext | None = None, user: str | None = None,
    password: str = PASSWORD, timeout: float = 10.0,
) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return int(response.status), response.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


# --- where it listens --------------------------------------------------------------------------


def test_metrics_server_listens_on_loopback_only_unless_told_otherwise(
    tmp_path: Path, start: StartServer
) -> None:
    args = cli.build_parser().parse_args(serve_args(tmp_path))
    settings = settings_from(SERVE, args)
    assert settings.metrics_host == "127.0.0.1"
    server = start(host=settings.metrics_host)
    assert server.server_address[0] == "127.0.0.1"
    status, body = get(f"http://127.0.0.1:{server.server_port}/metrics")
    assert status == 200 and "ragpulse_events_total" in body


# --- TLS ---------------------------------------------------------------------------------------


def test_https_scrape_is_verified_with_the_ca_and_plain_http_gets_no_metrics(
    tmp_path: Path, start: StartServer
) -> None:
    ca = make_ca(tmp_path, "test-ca")
    cert, key = make_leaf(tmp_path, "ragpulse", ca, ips=["127.0.0.1"], server=True)
    web = load_web_config(web_config(tmp_path, {"tls_server_config": {"cert_file": cert.name,
                                                           "key_file": key.name}}))
    server = start(web)
    port = server.server_port
    assert web.describe("127.0.0.1", port) == f"/metrics (https) and /healthz on 127.0.0.1:{port}"

    trusting = ssl.create_default_context(cafile=str(ca.cert))
    status, body = get(f"https://127.0.0.1:{port}/metrics", context=trusting)
    assert status == 200 and "ragpulse_events_total" in body
    assert get(f"https://127.0.0.1:{port}/healthz", context=trusting) == (200, "ok\n")

    with pytest.raises(urllib.error.URLError) as untrusted:
        get(f"https://127.0.0.1:{port}/metrics", context=ssl.create_default_context())
    assert isinstance(untrusted.value.reason, ssl.SSLCertVerificationError)
    with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
        get(f"http://127.0.0.1:{port}/metrics")


def test_client_ca_file_makes_the_server_require_a_client_certificate_signed_by_it(
    tmp_path: Path, start: StartServer
) -> None:
    server_ca, client_ca = make_ca(tmp_path, "server-ca"), make_ca(tmp_path, "client-ca")
    cert, key = make_leaf(tmp_path, "ragpulse", server_ca, ips=["127.0.0.1"], server=True)
    client_cert, client_key = make_leaf(tmp_path, "prometheus", client_ca, server=False)
    stranger_cert, stranger_key = make_leaf(tmp_path, "stranger", server_ca, server=False)
    web = load_web_config(web_config(tmp_path, {"tls_server_config": {
        "cert_file": cert.name, "key_file": key.name, "client_ca_file": client_ca.cert.name}}))
    server = start(web)
    url = f"https://127.0.0.1:{server.server_port}/metrics"

    def client(cert_file: Path | None, key_file: Path | None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(server_ca.cert))
        if cert_file is not None:
            context.load_cert_chain(cert_file, key_file)
        return context

    assert get(url, context=client(client_cert, client_key))[0] == 200
    for no_good in (client(None, None), client(stranger_cert, stranger_key)):
        # TLS 1.3 reports the rejected certificate on the first read, not in the handshake.
        with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
            get(url, context=no_good)


# --- basic auth ----------------------------------------------------------------------------------


def test_basic_auth_answers_401_to_a_wrong_password_200_to_the_right_one_and_leaves_healthz_open(
    tmp_path: Path, start: StartServer
) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = load_web_config(web_config(tmp_path, {"basic_auth_users": {"prometheus": hashed}}))
    server = start(web)
    url = f"http://127.0.0.1:{server.server_port}"
    assert web.describe("::", 80) == "/metrics (http, basic auth) and /healthz on :::80"

    for user, password in (("prometheus", "wrong"), ("nobody", PASSWORD), ("prometheus", "")):
        status, body = get(url + "/metrics", user=user, password=password)
        assert status == 401 and "ragpulse" not in body
    status, _ = get(url + "/metrics")
    assert status == 401
    for _ in range(2):  # the second time from the cache of accepted credentials
        status, body = get(url + "/metrics", user="prometheus")
        assert status == 200 and "ragpulse_events_total" in body
    assert get(url + "/metrics", user="prometheus", password=PASSWORD + "x")[0] == 401
    # Kubernetes probes and Docker health checks send no password.
    assert get(url + "/healthz") == (200, "ok\n")


@pytest.mark.parametrize(
    ("document", "named"),
    [
        ({"tls_server_config": {"cert_file": "ragpulse.pem"}}, "'tls_server_config.key_file'"),
        ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "ragpulse.key"}},
         "'tls_server_config.cert_file': no such file"),
        ({"tls_server_config": {"cert_file": "ragpulse.pem", "key_file": "other.key"}},
         "'tls_server_config.cert_file' and 'tls_server_config.key_file' cannot be used"),
        ({"tls_server_config": {"cert_file": "ragpulse.pem", "key_file": "ragpulse.key",
                                "client_auth_type": "RequireAnyClientCert"}},
         "'tls_server_config.client_auth_type' must be one of"),
        ({"tls_server_config": {"cert_file": "ragpulse.pem", "key_file": "ragpulse.key",
                                "cipher_suites": ["x"]}},
         "unsupported key 'tls_server_config.cipher_suites'"),
        ({"basic_auth_users": {"prometheus": "hunter2"}},
         "'basic_auth_users.prometheus' must be a bcrypt hash"),
        ({"basic_auth_users": {"prometheus": "$2b$12$notahash"}},
         "'basic_auth_users.prometheus' is not a valid bcrypt hash"),
        ({"basic_auth_user": {}}, "unsupported key 'basic_auth_user'"),
    ],
)
def test_a_bad_web_config_stops_serve_at_start_with_one_line_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: dict[str, object], named: str
) -> None:
    make_leaf(tmp_path, "ragpulse", make_ca(tmp_path, "ca"), server=True)
    make_leaf(tmp_path, "other", make_ca(tmp_path, "ca2"), server=True)
    path = web_config(tmp_path, document)
    code = cli.main(serve_args(tmp_path, "--web-config-file", str(path)))
    err = capsys.readouterr().err
    line = one_line_error(code, err, allow_info=True)
    assert line.startswith("ragpulse serve:") and named in line
    assert "hunter2" not in err
    assert not (tmp_path / "state.sqlite").exists()  # stopped before opening anything


# --- bounded connections -----------------------------------------------------------------------


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A connection from `source`, any address of 127.0.0.0/8 (all loopback on Linux)."""
    return socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))


def test_five_hundred_idle_connections_hold_no_threads_and_a_scrape_still_answers_at_once(
    start: StartServer,
) -> None:
    server = start()
    port = server.server_port
    threads_before = threading.active_count()
    # Ten from each of fifty addresses: under the per-address cap, so all are held.
    idle = [connect(port, f"127.0.1.{n // 10 + 1}") for n in range(500)]
    try:
        status, body = get(f"http://127.0.0.1:{port}/metrics", timeout=60)
        assert status == 200 and "ragpulse_events_total" in body
        # Answered while all 500 are still held: a server that made the scrape wait for a
        # thread or a slot would answer only once it had dropped them (after their request
        # deadline), and they would read as closed here.
        still_open = 0
        for conn in idle:
            conn.setblocking(False)
            try:
                closed = conn.recv(1) == b""
            except BlockingIOError:
                closed = False
            still_open += not closed
        assert still_open == 500
        assert threading.active_count() <= threads_before + 4
    finally:
        for conn in idle:
            conn.close()


@pytest.fixture
def bounded() -> Iterator[Callable[..., MetricsHTTPServer]]:
    """`bounded(app=None, tls=None, **limits)`: a MetricsHTTPServer answering "up" (or `app`),
    shut down after the test."""
    servers: list[MetricsHTTPServer] = []

    def up(environ: dict[str, object], respond: Callable[..., object]) -> list[bytes]:
        respond("200 OK", [])
        return [b"up\n"]

    def run(
        app: Callable[..., list[bytes]] | None = None,
        tls: ssl.SSLContext | None = None,
        **limits: Any,
    ) -> MetricsHTTPServer:
        server = MetricsHTTPServer(
            ("127.0.0.1", 0), exporter_app(app or up, lambda: (True, "ok"), {}), tls, **limits
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield run
    for server in servers:
        server.shutdown()
        server.server_close()


def test_sixty_four_clients_sending_one_byte_at_a_time_hold_no_slot_and_healthz_answers(
    bounded: Callable[..., MetricsHTTPServer],
) -> None:
    # 8 answering slots for 64 slow clients: one thread per slow client would leave none.
    server = bounded(max_connections=8, request_deadline_s=3600, timeout_s=3600)
    port = server.server_port
    request = b"GET /metrics HTTP/1.1\r\nHost: ragpulse\r\nX-Padding: " + b"a" * 64
    slow = [connect(port, f"127.0.2.{n // 8 + 1}") for n in range(64)]
    try:
        for byte in range(4):  # each client sends its request one byte at a time, never ending it
            for conn in slow:
                conn.sendall(request[byte : byte + 1])
        url = f"http://127.0.0.1:{port}"
        assert [get(url + "/healthz", timeout=10) for _ in range(40)] == [(200, "ok\n")] * 40
        assert get(url + "/metrics", timeout=10) == (200, "up\n")
        for conn in slow:  # still connected, still sending: they were held all along
            conn.sendall(request[4:5])
            assert _open(conn)
    finally:
        for conn in slow:
            conn.close()


def test_a_client_that_never_finishes_its_request_is_closed_at_the_request_deadline(
    bounded: Callable[..., MetricsHTTPServer],
) -> None:
    # Per-operation timeouts alone never close a client that keeps sending a byte now and then.
    server = bounded(request_deadline_s=0.5, timeout_s=3600)
    request = b"GET /metrics HTTP/1.1\r\nX-Padding: " + b"a" * 2000
    slow = [connect(server.server_port) for _ in range(4)]
    try:
        for conn in slow:
            conn.settimeout(0.05)
            closed = False
            for byte in request:  # a byte, then a short wait for the server's close, and again
                try:
                    conn.sendall(bytes([byte]))
                    closed = conn.recv(1024) == b""
                except TimeoutError:
                    continue
                except ConnectionError:
                    closed = True
                break
            assert closed, "the server kept a request open for all of its 2,000 slow bytes"
    finally:
        for conn in slow:
            conn.close()


def test_over_tls_a_slow_request_is_closed_at_the_deadline_and_a_whole_one_answered(
    tmp_path: Path, bounded: Callable[..., MetricsHTTPServer]
) -> None:
    ca = make_ca(tmp_path, "ca")
    cert, key = make_leaf(tmp_path, "ragpulse", ca, ips=["127.0.0.1"], server=True)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server = bounded(tls=context, request_deadline_s=0.5, timeout_s=3600)
    client = ssl.create_default_context(cafile=str(ca.cert))
    slow = client.wrap_socket(connect(server.server_port), server_hostname="127.0.0.1")
    try:
        slow.settimeout(0.05)
        closed = False
        for byte in b"GET /metrics HTTP/1.1\r\nX-Padding: " + b"a" * 2000:
            try:
                slow.sendall(bytes([byte]))
                closed = slow.recv(1024) == b""
            except TimeoutError:
                continue
            except (ConnectionError, ssl.SSLError):
                closed = True
            break
        assert closed, "the server kept a slow TLS request open for all of its bytes"
    finally:
        slow.close()
    url = f"https://127.0.0.1:{server.server_port}/metrics"
    assert get(url, context=client) == (200, "up\n")


def test_healthz_has_threads_of_its_own_when_every_metrics_thread_is_busy(
    bounded: Callable[..., MetricsHTTPServer],
) -> None:
    inside = threading.Semaphore(0)
    release = threading.Event()

    def stuck(environ: dict[str, object], respond: Callable[..., object]) -> list[bytes]:
        inside.release()
        release.wait(60)
        respond("200 OK", [])
        return [b"late\n"]

    server = bounded(stuck, max_connections=2)
    url = f"http://127.0.0.1:{server.server_port}"
    busy = [threading.Thread(target=get, args=(url + "/metrics",), daemon=True) for _ in range(2)]
    try:
        for thread in busy:
            thread.start()
        for _ in busy:  # both /metrics threads are inside the app
            assert inside.acquire(timeout=30)
        with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
            get(url + "/metrics")  # no /metrics thread left: refused at once
        assert [get(url + "/healthz") for _ in range(10)] == [(200, "ok\n")] * 10
    finally:
        release.set()
        for thread in busy:
            thread.join(30)


def test_one_address_cannot_hold_more_than_its_share_of_connections(
    bounded: Callable[..., MetricsHTTPServer],
) -> None:
    server = bounded(max_per_address=4)
    port = server.server_port
    held = [connect(port, "127.0.0.3") for _ in range(4)]
    try:
        extra = connect(port, "127.0.0.3")
        assert _closed_by_server(extra, wait=10.0)  # closed as soon as accepted
        extra.close()
        assert all(_open(conn) for conn in held)
        assert get(f"http://127.0.0.1:{port}/metrics") == (200, "up\n")  # another address
    finally:
        for conn in held:
            conn.close()


def _open(conn: socket.socket) -> bool:
    """Whether the server has not closed `conn` (nothing to read, no end of stream)."""
    conn.setblocking(False)
    try:
        return conn.recv(1024) != b""
    except BlockingIOError:
        return True
    except ConnectionError:
        return False
    finally:
        conn.settimeout(10)


def _closed_by_server(conn: socket.socket, wait: float) -> bool:
    conn.settimeout(wait)
    try:
        return conn.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionError:
        return True


# --- no fault ends a listener --------------------------------------------------------------------


def _held_in_log_call(message: str) -> tuple[threading.Event, threading.Event, logging.Handler]:
    """A handler that stops the thread logging `message` (at any level) until `release` is
    set: (entered, release, handler), for lining up what the server's next select sees."""
    entered, release = threading.Event(), threading.Event()

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if message in record.getMessage() and not entered.is_set():
                entered.set()
                release.wait(60)

    return entered, release, Hold(logging.DEBUG)


def _acknowledged(conn: socket.socket) -> bool:
    """Whether the peer's TCP has acknowledged every byte sent on `conn`: they are in its
    receive queue, and its socket is readable (SIOCOUTQ, the bytes not yet acknowledged)."""
    queued = fcntl.ioctl(conn.fileno(), termios.TIOCOUTQ, b"\0\0\0\0")
    return bool(struct.unpack("i", queued)[0] == 0)


def test_the_oldest_waiting_connection_closed_while_it_sends_leaves_the_server_answering(
    bounded: Callable[..., MetricsHTTPServer], caplog: pytest.LogCaptureFixture
) -> None:
    # The case that ended the server thread with a KeyError (640 slow clients, 40 addresses):
    # one select returns the listening socket and then a waiting connection with a byte to
    # read; accepting the new clients closes that connection, the oldest waiting, and its read
    # comes next in the same batch. Built here step by step, with the server thread held.
    server = bounded(max_waiting=3, request_deadline_s=3600, timeout_s=3600)
    port = server.server_port
    url = f"http://127.0.0.1:{port}"
    oldest, resets = connect(port), connect(port)
    assert get(url + "/healthz") == (200, "ok\n")  # both accepted before this probe: held
    logger = logging.getLogger("ragpulse.pipeline.metrics.http")
    entered, release, hold = _held_in_log_call("dropped")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(hold)
    newcomers: list[socket.socket] = []
    try:
        # A reset: the server's read of it fails and is logged, where the thread now waits.
        resets.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        resets.close()
        assert entered.wait(30), "the server never read the reset connection"
        # Ready in this order (epoll reports in the order readiness came): the listening
        # socket, with three clients, then the oldest, with a byte.
        newcomers = [connect(port) for _ in range(3)]
        assert select.select([server.socket], [], [], 30)[0], "no connection to accept"
        oldest.sendall(b"G")
        deadline = time.monotonic() + 30
        while not _acknowledged(oldest):
            assert time.monotonic() < deadline, "the server's side never got the byte"
            time.sleep(0.01)
    finally:
        release.set()
        logger.removeHandler(hold)
        logger.setLevel(level)
    try:
        # The three clients came while three connections were waiting: the oldest is closed,
        # and the server goes on reading, accepting and answering.
        assert _closed_by_server(oldest, wait=10.0)
        assert [get(url + "/healthz", timeout=10) for _ in range(5)] == [(200, "ok\n")] * 5
        assert get(url + "/metrics", timeout=10) == (200, "up\n")
        # An expected case, not a fault caught by the last line of defence.
        assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        for conn in [oldest, *newcomers]:
            conn.close()


def test_an_app_that_raises_is_logged_and_answered_500_and_the_next_requests_answered(
    bounded: Callable[..., MetricsHTTPServer], caplog: pytest.LogCaptureFixture
) -> None:
    def broken(environ: dict[str, object], respond: Callable[..., object]) -> list[bytes]:
        raise RuntimeError("the snapshot could not be built")

    server = bounded(broken)
    url = f"http://127.0.0.1:{server.server_port}"
    with caplog.at_level(logging.ERROR, logger="ragpulse.pipeline.metrics.http"):
        assert get(url + "/metrics") == (500, "Internal Server Error\n")
    (record,) = [r for r in caplog.records if r.exc_info]
    assert "the snapshot could not be built" in str(record.exc_info[1] if record.exc_info else "")
    assert "'/metrics'" in record.getMessage()
    assert [get(url + "/healthz") for _ in range(5)] == [(200, "ok\n")] * 5


def test_a_thread_that_cannot_be_started_costs_one_request_and_no_share_of_its_address(
    bounded: Callable[..., MetricsHTTPServer],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # One connection per address: had the failed request kept its share, the next one from
    # the same address would be refused for good.
    server = bounded(max_per_address=1)
    url = f"http://127.0.0.1:{server.server_port}"
    start = threading.Thread.start
    failed: list[threading.Thread] = []

    def start_or_fail_once(thread: threading.Thread) -> None:
        if thread.name == "metrics-conn" and not failed:  # what the kernel's thread limit does
            failed.append(thread)
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_or_fail_once)
    with caplog.at_level(logging.ERROR, logger="ragpulse.pipeline.metrics.http"):
        with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
            get(url + "/metrics")
        assert _get_then_released(server, url + "/metrics") == (200, "up\n")
    assert failed
    assert any("can't start new thread" in r.getMessage() or (
        r.exc_info and "can't start new thread" in str(r.exc_info[1])) for r in caplog.records)
    assert [_get_then_released(server, url + "/healthz") for _ in range(5)] == [
        (200, "ok\n")
    ] * 5


def _get_then_released(server: MetricsHTTPServer, url: str) -> tuple[int, str]:
    """`get`, then wait until the answering thread has given back the address's share: the
    client has its whole answer (Content-Length) a moment before that thread ends, so with one
    connection per address the next request would otherwise race the release."""
    answer = get(url)
    deadline = time.monotonic() + 30
    while server._per_address.get("127.0.0.1"):
        assert time.monotonic() < deadline, "the answered connection never released its share"
        time.sleep(0.005)
    return answer


# --- the health listener -----------------------------------------------------------------------


@pytest.fixture
def health(watcher: TopicWatcher) -> Iterator[MetricsHTTPServer]:
    """serve's health listener (`start_health_server`, as `ragpulse serve` starts it)."""
    server = start_health_server(watcher.healthy, "127.0.0.1", 0)
    yield server
    server.shutdown()
    server.server_close()


def test_a_crowd_on_the_metrics_port_even_from_the_probes_address_leaves_every_probe_answered(
    bounded: Callable[..., MetricsHTTPServer], health: MetricsHTTPServer
) -> None:
    # The crowd: 160 slow clients from 10 addresses, more than the metrics listener keeps
    # waiting (it closes the oldest), then 16 from the probes' own address (a node's NAT
    # address), the newest, which fill that address's share.
    metrics = bounded(max_waiting=64, request_deadline_s=3600, timeout_s=3600)
    port = metrics.server_port
    crowd = [connect(port, f"127.0.6.{n % 10 + 1}") for n in range(160)]
    crowd += [connect(port, "127.0.0.1") for _ in range(16)]
    try:
        for byte in b"GET /m":
            for conn in crowd:
                with contextlib.suppress(OSError):  # closed as the oldest waiting
                    conn.sendall(bytes([byte]))
        # On the metrics port, the probes' address has no share left ...
        with pytest.raises((http.client.HTTPException, ConnectionError, urllib.error.URLError)):
            get(f"http://127.0.0.1:{port}/healthz")
        # ... and the health listener answers every probe.
        probe = f"http://127.0.0.1:{health.server_port}/healthz"
        assert [get(probe, timeout=10) for _ in range(40)] == [(200, "ok\n")] * 40
    finally:
        for conn in crowd:
            conn.close()


def test_the_health_listener_serves_healthz_alone_over_plain_http_without_auth(
    health: MetricsHTTPServer,
) -> None:
    url = f"http://127.0.0.1:{health.server_port}"
    assert get(url + "/healthz") == (200, "ok\n")
    # Never /metrics: the health port takes no password, so it must not show what
    # --web-config-file protects.
    status, body = get(url + "/metrics")
    assert status == 404 and "ragpulse_" not in body


@pytest.mark.parametrize("table", [SERVE, EXPORTER], ids=["serve", "exporter"])
def test_a_health_port_equal_to_the_metrics_port_is_refused_naming_both(
    tmp_path: Path, table: object
) -> None:
    argv = (
        serve_args(tmp_path) if table is SERVE
        else ["exporter", "--kafka-bootstrap", "127.0.0.1:1", "--ratings-topic", "r"]
    )
    args = cli.build_parser().parse_args([*argv, "--metrics-port", "9600", "--health-port", "9600"])
    with pytest.raises(SettingsError) as refused:
        settings_from(table, args)  # type: ignore[arg-type]
    assert "--health-port: must differ from --metrics-port (9600)" in str(refused.value)
    # Port 0 is any free port: two of them are two ports.
    zeros = cli.build_parser().parse_args([*argv, "--metrics-port", "0", "--health-port", "0"])
    assert settings_from(table, zeros).health_port == 0  # type: ignore[arg-type]


def test_a_health_port_in_use_stops_start_up_with_one_line_naming_the_flag(
    watcher: TopicWatcher,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(SettingsError) as refused:
            start_health_server(watcher.healthy, "127.0.0.1", port)
    assert str(refused.value).startswith(
        f"--health-port {port}: cannot listen on 127.0.0.1:{port} (Address already in use"
    )
