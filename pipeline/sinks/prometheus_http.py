"""The /metrics and /healthz HTTP server of `ragpulse serve`: TLS, basic auth, bounded threads.

For operators securing the endpoint, and for `pipeline.commands.serve`, which starts it.

`--web-config-file` takes the web configuration file of the Prometheus exporters
(exporter-toolkit's format), so one file serves node_exporter and ragpulse alike:

    tls_server_config:
      cert_file: server.crt            # PEM; paths are relative to this file
      key_file: server.key
      client_ca_file: clients-ca.crt   # optional: client certificates signed by this CA ...
      client_auth_type: RequireAndVerifyClientCert   # ... are required (or VerifyClientCertIfGiven)
      min_version: TLS12               # optional: TLS12 (default) or TLS13
    basic_auth_users:
      prometheus: $2b$12$...           # bcrypt hash, e.g. htpasswd -nBC 12 "" | tr -d ':\\n'

The file is read and checked once, at start; a bad key, a missing file or a certificate that does
not match its key stops serve with one line naming the key. /metrics requires a basic-auth user
when `basic_auth_users` is set; /healthz never does (see `exporter_app`).

Every connection is bounded: a connection that has not sent a byte holds no thread (it waits in
one selector, for at most `CONNECTION_TIMEOUT_S`, and the oldest is closed once
`MAX_WAITING_CONNECTIONS` wait); one that has sent data gets a thread, at most
`MAX_CONNECTIONS` at once (beyond that it is closed at once), and every socket read, write and
TLS handshake times out after `CONNECTION_TIMEOUT_S`. A flood of idle or slow clients therefore
neither exhausts threads nor keeps a scrape from being answered.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import functools
import hashlib
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import bcrypt

from judges.yaml_file import YamlFileError, load_yaml
from pipeline.errors import SettingsError

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64  # connections being answered at once, one thread each
MAX_WAITING_CONNECTIONS = 512  # accepted connections that have sent nothing yet (no thread)
CONNECTION_TIMEOUT_S = 10.0  # per socket operation, and for the first byte of a request

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

_CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
_TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "min_version"}
_TOP_KEYS = {"tls_server_config", "basic_auth_users"}


@dataclasses.dataclass(frozen=True)
class WebConfig:
    """A validated web configuration file: the TLS context (if any) and the basic-auth users."""

    tls: ssl.SSLContext | None = None
    users: Mapping[str, bytes] = dataclasses.field(default_factory=dict)


def load_web_config(path: Path) -> WebConfig:
    """Read and check `path`; SettingsError naming the key at fault when it cannot be used."""
    where = f"--web-config-file {path}"
    try:
        document = load_yaml(path)
    except OSError as exc:
        raise SettingsError(f"{where}: cannot read it: {exc.strerror}") from None
    except YamlFileError as exc:
        raise SettingsError(f"{where}: {exc}") from None
    document = {} if document is None else document
    if not isinstance(document, dict):
        raise SettingsError(f"{where}: the top level must be a mapping")
    _no_unknown_keys(where, "", document, _TOP_KEYS)
    tls_section = document.get("tls_server_config")
    tls = None if tls_section is None else _tls_context(where, path.parent, tls_section)
    return WebConfig(tls, _users(where, document.get("basic_auth_users")))


def _no_unknown_keys(where: str, prefix: str, section: Mapping[Any, Any], known: set[str]) -> None:
    unknown = sorted(str(k) for k in section if k not in known)
    if unknown:
        raise SettingsError(
            f"{where}: unsupported key '{prefix}{unknown[0]}' (supported: "
            f"{', '.join(prefix + k for k in sorted(known))})"
        )


def _tls_context(where: str, base: Path, section: Any) -> ssl.SSLContext:
    prefix = "tls_server_config."
    if not isinstance(section, dict):
        raise SettingsError(f"{where}: 'tls_server_config' must be a mapping")
    _no_unknown_keys(where, prefix, section, _TLS_KEYS)

    def file(key: str, required: bool) -> Path | None:
        value = section.get(key)
        if value is None:
            if required:
                raise SettingsError(f"{where}: '{prefix}{key}' is required with tls_server_config")
            return None
        if not isinstance(value, str) or not value:
            raise SettingsError(f"{where}: '{prefix}{key}' must be a file path")
        found = base / value
        if not found.is_file():
            raise SettingsError(f"{where}: '{prefix}{key}': no such file {found}")
        return found

    cert, key, client_ca = file("cert_file", True), file("key_file", True), file(
        "client_ca_file", False
    )
    assert cert is not None and key is not None  # required above
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    version = section.get("min_version", "TLS12")
    if version not in _TLS_VERSIONS:
        raise SettingsError(
            f"{where}: '{prefix}min_version' must be one of {', '.join(_TLS_VERSIONS)}, "
            f"not {version!r}"
        )
    context.minimum_version = _TLS_VERSIONS[version]
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        raise SettingsError(
            f"{where}: '{prefix}cert_file' and '{prefix}key_file' cannot be used together "
            f"({exc.reason or exc}): is the key the certificate's, both PEM?"
        ) from None
    auth_type = section.get(
        "client_auth_type", "RequireAndVerifyClientCert" if client_ca else "NoClientCert"
    )
    if auth_type not in _CLIENT_AUTH:
        raise SettingsError(
            f"{where}: '{prefix}client_auth_type' must be one of {', '.join(_CLIENT_AUTH)}, "
            f"not {auth_type!r}"
        )
    if _CLIENT_AUTH[auth_type] != ssl.CERT_NONE:
        if client_ca is None:
            raise SettingsError(f"{where}: '{prefix}client_auth_type: {auth_type}' needs "
                                f"'{prefix}client_ca_file'")
        try:
            context.load_verify_locations(client_ca)
        except ssl.SSLError as exc:
            raise SettingsError(
                f"{where}: '{prefix}client_ca_file' is not a PEM certificate ({exc.reason})"
            ) from None
    context.verify_mode = _CLIENT_AUTH[auth_type]
    return context


def _users(where: str, section: Any) -> dict[str, bytes]:
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise SettingsError(f"{where}: 'basic_auth_users' must map user names to bcrypt hashes")
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        name = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            raise SettingsError(f"{where}: '{name}': a user name is a non-empty string without ':'")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise SettingsError(
                f"{where}: '{name}' must be a bcrypt hash ($2b$...), never a plain password"
            )
        try:
            bcrypt.checkpw(b"", hashed.encode())
        except ValueError:
            raise SettingsError(f"{where}: '{name}' is not a valid bcrypt hash") from None
        users[user] = hashed.encode()
    return users


class BasicAuth:
    """Checks `Authorization: Basic` headers against bcrypt hashes.

    bcrypt is slow on purpose (~50-250 ms a check); a scrape every 15 s would pay that each time,
    so a successful (user, password) is remembered, by a SHA-256 of the password, never in clear.
    """

    _CACHE_SIZE = 64

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._accepted: set[tuple[str, bytes]] = set()
        self._lock = threading.Lock()

    def allows(self, header: str | None) -> bool:
        credentials = _basic_credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        remembered = (user, hashlib.sha256(password).digest())
        with self._lock:
            if remembered in self._accepted:
                return True
        hashed = self._users.get(user)
        # An unknown user is checked against a hash too, so it costs as long as a bad password.
        ok = bcrypt.checkpw(password, hashed or _dummy_hash()) and hashed is not None
        if ok:
            with self._lock:
                if len(self._accepted) >= self._CACHE_SIZE:
                    self._accepted.clear()
                self._accepted.add(remembered)
        return ok


@functools.cache
def _dummy_hash() -> bytes:
    return bcrypt.hashpw(b"ragpulse", bcrypt.gensalt(rounds=10))


def _basic_credentials(header: str | None) -> tuple[str, bytes] | None:
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    return user.decode("utf-8", errors="replace"), password


def exporter_app(
    metrics_app: WsgiApp, healthy: Callable[[], tuple[bool, str]], users: Mapping[str, bytes]
) -> WsgiApp:
    """/healthz, and everything else to `metrics_app`, behind basic auth when `users` is set.

    /healthz stays open: Kubernetes httpGet probes and Docker health checks cannot send a
    password without writing it into the manifest, and the endpoint only tells whether cycles
    complete ("ok" or "cycles failing for 42s"), never a count, a label or a setting.
    """
    auth = BasicAuth(users) if users else None

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            ok, why = healthy()
            start_response(
                "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")]
            )
            return [why.encode() + b"\n"]
        if auth is not None and not auth.allows(environ.get("HTTP_AUTHORIZATION")):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Basic realm="ragpulse"')],
            )
            return [b"Unauthorized\n"]
        return metrics_app(environ, start_response)

    return app


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


class MetricsHTTPServer(WSGIServer):
    """A WSGI server with bounded connections (see the module docstring); TLS when given.

    One thread (`serve_forever`) accepts connections and waits for their first byte; each
    connection that sends one is answered in a thread of its own, up to `max_connections`.
    """

    # The kernel drops new connections while this many wait to be accepted, and the client
    # retries only a second later: socketserver's 5 made a burst of 500 take 80 s to connect.
    request_queue_size = socket.SOMAXCONN

    def __init__(
        self,
        address: tuple[str, int],
        app: WsgiApp,
        tls: ssl.SSLContext | None = None,
        *,
        max_connections: int = MAX_CONNECTIONS,
        max_waiting: int = MAX_WAITING_CONNECTIONS,
        timeout_s: float = CONNECTION_TIMEOUT_S,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _QuietHandler)
        self.set_app(app)
        self._tls = tls
        self._slots = threading.BoundedSemaphore(max_connections)
        self._max_waiting = max_waiting
        self._timeout_s = timeout_s
        # Accepted connections without a byte yet, oldest first, with the time they give up.
        self._waiting: dict[socket.socket, tuple[Any, float]] = {}
        self._wake_r, self._wake_w = socket.socketpair()
        self._stop = False
        self._serving = False
        self._stopped = threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving = True
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            try:
                while not self._stop:
                    for key, _ in selector.select(self._wait_time(poll_interval)):
                        if key.fileobj is self.socket:
                            self._accept(selector)
                        elif key.fileobj is self._wake_r:
                            self._wake_r.recv(64)
                        else:
                            conn = key.fileobj
                            assert isinstance(conn, socket.socket)
                            selector.unregister(conn)
                            address, _ = self._waiting.pop(conn)
                            self._dispatch(conn, address)
                    self._expire(selector)
            finally:
                for conn in self._waiting:
                    conn.close()
                self._waiting.clear()
                self._stopped.set()

    def _wait_time(self, poll_interval: float) -> float:
        if not self._waiting:
            return poll_interval
        oldest_deadline = min(deadline for _, deadline in self._waiting.values())
        return max(0.0, min(poll_interval, oldest_deadline - time.monotonic()))

    def _accept(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                conn, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: the next select retries
                log.warning("metrics server cannot accept a connection: %s", exc)
                return
            if len(self._waiting) >= self._max_waiting:
                oldest = next(iter(self._waiting))
                selector.unregister(oldest)
                del self._waiting[oldest]
                oldest.close()
            conn.setblocking(False)
            self._waiting[conn] = (address, time.monotonic() + self._timeout_s)
            selector.register(conn, selectors.EVENT_READ)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for conn, (_, deadline) in list(self._waiting.items()):
            if deadline <= now:
                selector.unregister(conn)
                del self._waiting[conn]
                conn.close()

    def _dispatch(self, conn: socket.socket, address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            conn.close()  # every slot is busy: refusing now beats queueing behind slow clients
            return
        threading.Thread(
            target=self._answer, args=(conn, address), name="metrics-conn", daemon=True
        ).start()

    def _answer(self, conn: socket.socket, address: Any) -> None:
        try:
            conn.settimeout(self._timeout_s)
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True)  # handshake, timed out too
            self.finish_request(conn, address)
        except (OSError, ValueError) as exc:  # timeouts, resets, TLS failures: the client's loss
            log.debug("metrics connection from %s dropped: %s", address, exc)
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            conn.close()
            self._slots.release()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait until it has returned."""
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._serving:
            self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()


def start_metrics_server(
    app: WsgiApp, host: str, port: int, tls: ssl.SSLContext | None = None
) -> MetricsHTTPServer:
    """Bind `host:port` and serve `app` from a daemon thread; returns the server (for its port)."""
    server = MetricsHTTPServer((host, port), app, tls)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
