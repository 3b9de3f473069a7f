"""The HTTP listeners of `ragpulse serve` and `ragpulse exporter`: TLS, basic auth, bounded
threads, and a thread that never dies.

For operators securing the endpoints, and for `pipeline.commands.serve` and `.exporter`, which
start two listeners:
- the metrics listener (--metrics-port): /metrics, with the TLS and basic auth of
  --web-config-file, and /healthz (open) for probes written before --health-port;
- the health listener (--health-port): /healthz alone, plain HTTP, no auth, for the kubelet's
  and Docker's probes. A crowd of slow clients on the metrics port, even from the prober's own
  (NAT) address, holds nothing of it (see `start_health_server`).

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

Every connection is bounded, so that a flood of idle or slow clients neither exhausts threads nor
keeps a scrape or a probe from being answered:
- a request is read, TLS handshake, head and body, without a thread (in one selector), and must
  be complete within `REQUEST_DEADLINE_S` of connecting, or the connection is closed: a client
  sending one byte every few seconds holds nothing for longer;
- at most `MAX_WAITING_CONNECTIONS` are being read (the oldest is closed beyond that), and at
  most `MAX_CONNECTIONS_PER_ADDRESS` are open from one client address (more are closed at once);
- a complete request gets a thread, at most `MAX_CONNECTIONS` at once for /metrics and
  `HEALTH_CONNECTIONS` more kept for /healthz (beyond that it is closed at once); the answer's
  socket writes time out after `CONNECTION_TIMEOUT_S`.

No fault ends a listener: an exception while reading one connection closes that connection, any
other exception in the selector thread is logged and the thread goes on, and an exception in an
app is logged and answered 500 (`MetricsHTTPServer`).
"""

from __future__ import annotations

import base64
import binascii
import collections
import contextlib
import dataclasses
import functools
import hashlib
import io
import logging
import selectors
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import bcrypt

from ragpulse.pipeline.errors import SettingsError, load_settings_file

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 64  # requests being answered at once, one thread each
HEALTH_CONNECTIONS = 4  # more threads, for /healthz alone: slow scrapes cannot starve probes
MAX_WAITING_CONNECTIONS = 512  # connections whose request is still being read (no thread)
MAX_CONNECTIONS_PER_ADDRESS = 16  # open connections from one client address
REQUEST_DEADLINE_S = 10.0  # to send the whole request (TLS handshake, head, body) after connecting
MAX_REQUEST_BYTES = 65536  # head and body together
CONNECTION_TIMEOUT_S = 10.0  # per socket operation while answering

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

    def describe(self, host: str, port: int) -> str:
        """The endpoints served with this configuration, for the start-up log line."""
        auth = ", basic auth" if self.users else ""
        return f"/metrics ({'https' if self.tls else 'http'}{auth}) and /healthz on {host}:{port}"


def load_web_config(path: Path) -> WebConfig:
    """Read and check `path`; SettingsError naming the key at fault when it cannot be used."""
    where = f"--web-config-file {path}"
    document = load_settings_file(path, where)
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
        return self.user(header) is not None

    def user(self, header: str | None) -> str | None:
        """The user an `Authorization: Basic` header logs in, or None when it does not
        (`ragpulse review` names the reviewer by it)."""
        credentials = _basic_credentials(header)
        if credentials is None:
            return None
        user, password = credentials
        remembered = (user, hashlib.sha256(password).digest())
        with self._lock:
            if remembered in self._accepted:
                return user
        hashed = self._users.get(user)
        # An unknown user is checked against a hash too, so it costs as long as a bad password.
        ok = bcrypt.checkpw(password, hashed or _dummy_hash()) and hashed is not None
        if not ok:
            return None
        with self._lock:
            if len(self._accepted) >= self._CACHE_SIZE:
                self._accepted.clear()
            self._accepted.add(remembered)
        return user


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
    health = health_app(healthy)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") == "/healthz":
            return health(environ, start_response)
        if auth is not None and not auth.allows(environ.get("HTTP_AUTHORIZATION")):
            start_response(
                "401 Unauthorized",
                [("Content-Type", "text/plain"), ("WWW-Authenticate", 'Basic realm="ragpulse"')],
            )
            return [b"Unauthorized\n"]
        return metrics_app(environ, start_response)

    return app


def health_app(healthy: Callable[[], tuple[bool, str]]) -> WsgiApp:
    """/healthz ("ok" 200, or 503 and why), and 404 for any other path: the health listener's
    app, and the /healthz of `exporter_app`."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/healthz":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"Not Found: this port serves /healthz alone\n"]
        ok, why = healthy()
        start_response(
            "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")]
        )
        return [why.encode() + b"\n"]

    return app


def _logging_errors(app: WsgiApp) -> WsgiApp:
    """`app`, with an exception it raises logged (through `log`, not wsgiref's stderr) and
    answered 500: a broken snapshot or health check costs one answer, not the listener."""

    def answer(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        try:
            result = app(environ, start_response)
            try:
                return list(result)  # the body is built here, so its errors are caught here
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()
        except Exception:
            log.exception("HTTP listener: answering %r failed", environ.get("PATH_INFO", ""))
            # exc_info: replaces headers already given; re-raises if they were sent (wsgiref
            # then closes the connection).
            start_response(
                "500 Internal Server Error", [("Content-Type", "text/plain")], sys.exc_info()
            )
            return [b"Internal Server Error\n"]

    return answer


class _QuietHandler(WSGIRequestHandler):
    """Answers one request whose bytes the server has already read (see `_Pending`)."""

    def __init__(self, request_bytes: bytes, *args: Any) -> None:
        self._request_bytes = request_bytes
        super().__init__(*args)

    def setup(self) -> None:
        super().setup()
        self.rfile = io.BytesIO(self._request_bytes)

    def log_message(self, format: str, *args: Any) -> None:  # scrapes are not news
        pass


@dataclasses.dataclass
class _Pending:
    """An accepted connection whose request is still being read, without a thread."""

    address: Any
    deadline: float  # the whole request (TLS handshake, head and body) by then, or it is closed
    handshaken: bool
    data: bytearray = dataclasses.field(default_factory=bytearray)


class MetricsHTTPServer(WSGIServer):
    """A WSGI server with bounded connections (see the module docstring); TLS when given. It
    runs both listeners, metrics and health.

    One thread (`serve_forever`) accepts connections and reads each request, head and body, in a
    selector, without a thread; a complete request is answered in a thread of its own, up to
    `max_connections` at once, plus `health_connections` kept for /healthz alone. Nothing ends
    `serve_forever` but `shutdown`: a fault is logged and serving goes on.
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
        health_connections: int = HEALTH_CONNECTIONS,
        max_waiting: int = MAX_WAITING_CONNECTIONS,
        max_per_address: int = MAX_CONNECTIONS_PER_ADDRESS,
        request_deadline_s: float = REQUEST_DEADLINE_S,
        timeout_s: float = CONNECTION_TIMEOUT_S,
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        # Before the bind: a port in use makes socketserver call `server_close` at once.
        self._wake_r, self._wake_w = socket.socketpair()
        super().__init__(address, _QuietHandler)
        self.set_app(_logging_errors(app))
        self._tls = tls
        self._slots = threading.BoundedSemaphore(max_connections)
        self._health_slots = threading.BoundedSemaphore(health_connections)
        self._max_waiting = max_waiting
        self._max_per_address = max_per_address
        self._request_deadline_s = request_deadline_s
        self._timeout_s = timeout_s
        # Connections whose request is being read, oldest first.
        self._waiting: dict[socket.socket, _Pending] = {}
        # Open connections (being read or answered) by client host, for the per-address cap.
        self._per_address: collections.Counter[str] = collections.Counter()
        self._per_address_lock = threading.Lock()
        self._stop = threading.Event()
        self._serving = False
        self._stopped = threading.Event()

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        self._serving = True
        self.socket.setblocking(False)
        with selectors.DefaultSelector() as selector:
            selector.register(self.socket, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            try:
                while not self._stop.is_set():
                    try:
                        self._serve_once(selector, poll_interval)
                    except Exception:
                        # A listener that ends leaves serve running without /healthz, and the
                        # kubelet restarts it: log the fault and go on, after a pause, so that
                        # a fault that comes back each time does not spin a core.
                        log.exception("HTTP listener on port %d: unexpected error; serving on",
                                      self.server_port)
                        self._stop.wait(poll_interval)
            finally:
                for conn in list(self._waiting):
                    with contextlib.suppress(Exception):
                        self._drop(selector, conn)
                self._stopped.set()

    def _serve_once(self, selector: selectors.BaseSelector, poll_interval: float) -> None:
        """One select: accept, read what arrived, close what is past its deadline."""
        for key, _ in selector.select(self._wait_time(poll_interval)):
            if key.fileobj is self.socket:
                self._accept(selector)
            elif key.fileobj is self._wake_r:
                self._wake_r.recv(64)
            else:
                conn = key.fileobj
                assert isinstance(conn, socket.socket)
                try:
                    self._read(selector, conn)
                except Exception:  # a bug, not the client's doing: this connection pays for it
                    pending = self._waiting.get(conn)
                    log.exception(
                        "HTTP listener on port %d: reading a request from %s failed; "
                        "connection closed",
                        self.server_port, pending.address[0] if pending else "a client",
                    )
                    self._drop(selector, conn)
        self._expire(selector)

    def _wait_time(self, poll_interval: float) -> float:
        if not self._waiting:
            return poll_interval
        oldest_deadline = min(pending.deadline for pending in self._waiting.values())
        return max(0.0, min(poll_interval, oldest_deadline - time.monotonic()))

    def _accept(self, selector: selectors.BaseSelector) -> None:
        while True:
            try:
                conn, address = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. out of file descriptors: the next select retries
                log.warning("HTTP listener cannot accept a connection: %s", exc)
                return
            if not self._admit(address):
                conn.close()  # this address holds its share already: it cannot crowd others out
                continue
            try:
                self._hold(selector, conn, address)
            except Exception:  # `_hold` has closed it and released its address
                log.exception("HTTP listener: a connection from %s could not be held; closed",
                              address[0])

    def _hold(self, selector: selectors.BaseSelector, conn: socket.socket, address: Any) -> None:
        """Wait for `conn`'s request in the selector, closing the oldest waiting connection
        when `max_waiting` are waiting already. Whatever fails, `conn` is closed and its
        address released."""
        try:
            if len(self._waiting) >= self._max_waiting:
                # It may be in this select's batch still: `_read` then finds it gone.
                self._drop(selector, next(iter(self._waiting)))
            conn.setblocking(False)
            if self._tls is not None:
                conn = self._tls.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            deadline = time.monotonic() + self._request_deadline_s
            self._waiting[conn] = _Pending(address, deadline, handshaken=self._tls is None)
            selector.register(conn, selectors.EVENT_READ)
        except Exception as exc:
            if conn in self._waiting:
                self._drop(selector, conn)
            else:
                conn.close()
                self._release(address)
            if not isinstance(exc, (OSError, ValueError)):
                raise
            log.debug("metrics connection from %s dropped: %s", address, exc)

    def _admit(self, address: Any) -> bool:
        with self._per_address_lock:
            if self._per_address[address[0]] >= self._max_per_address:
                return False
            self._per_address[address[0]] += 1
            return True

    def _release(self, address: Any) -> None:
        with self._per_address_lock:
            self._per_address[address[0]] -= 1
            if not self._per_address[address[0]]:
                del self._per_address[address[0]]

    def _drop(self, selector: selectors.BaseSelector, conn: socket.socket) -> None:
        """Close `conn`; if it was waiting, forget it (once, however often it is dropped)."""
        pending = self._waiting.pop(conn, None)
        if pending is not None:
            with contextlib.suppress(KeyError, ValueError):  # never registered, or closed
                selector.unregister(conn)
            self._release(pending.address)
        conn.close()

    def _read(self, selector: selectors.BaseSelector, conn: socket.socket) -> None:
        """Read what `conn` has sent; answer its request in a thread once it is complete."""
        pending = self._waiting.get(conn)
        if pending is None:  # closed earlier in this select's batch, as the oldest waiting
            return
        try:
            if not pending.handshaken:
                assert isinstance(conn, ssl.SSLSocket)
                conn.do_handshake()
                pending.handshaken = True
                selector.modify(conn, selectors.EVENT_READ)
            while True:  # until the socket (and TLS's own buffer) has nothing more
                chunk = conn.recv(65536)
                if not chunk:
                    self._drop(selector, conn)  # the client gave up
                    return
                pending.data += chunk
                if len(pending.data) > MAX_REQUEST_BYTES:
                    self._drop(selector, conn)
                    return
        except (BlockingIOError, InterruptedError, ssl.SSLWantReadError):
            pass
        except ssl.SSLWantWriteError:
            selector.modify(conn, selectors.EVENT_WRITE)
            return
        except (OSError, ValueError) as exc:  # resets, TLS failures: the client's loss
            log.debug("metrics connection from %s dropped: %s", pending.address, exc)
            self._drop(selector, conn)
            return
        if _request_complete(pending.data):
            selector.unregister(conn)
            del self._waiting[conn]
            self._dispatch(conn, pending)

    def _expire(self, selector: selectors.BaseSelector) -> None:
        now = time.monotonic()
        for conn, pending in list(self._waiting.items()):
            if pending.deadline <= now:
                self._drop(selector, conn)

    def _dispatch(self, conn: socket.socket, pending: _Pending) -> None:
        slots = self._health_slots if _is_health_check(pending.data) else self._slots
        if not slots.acquire(blocking=False):
            conn.close()  # every slot is busy: refusing now beats queueing behind slow clients
            self._release(pending.address)
            return
        try:
            threading.Thread(
                target=self._answer,
                args=(conn, pending, slots),
                name="metrics-conn",
                daemon=True,
            ).start()
        except BaseException:  # e.g. RuntimeError: can't start new thread
            conn.close()
            slots.release()
            self._release(pending.address)
            raise

    def _answer(
        self, conn: socket.socket, pending: _Pending, slots: threading.BoundedSemaphore
    ) -> None:
        try:
            conn.settimeout(self._timeout_s)  # the answer's writes time out too
            _QuietHandler(bytes(pending.data), conn, pending.address, self)
        except (OSError, ValueError) as exc:  # timeouts, resets: the client's loss
            log.debug("metrics connection from %s dropped: %s", pending.address, exc)
        except Exception:
            log.exception("HTTP listener: answering %s failed", pending.address[0])
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
            conn.close()
            slots.release()
            self._release(pending.address)

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait until it has returned."""
        self._stop.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._serving:
            self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake_r.close()
        self._wake_w.close()


def _request_complete(data: bytearray) -> bool:
    """Whether `data` holds a whole HTTP request: its head and the body its Content-Length says."""
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return False
    length = 0
    for line in bytes(data[:end]).split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            try:
                length = int(value.strip())
            except ValueError:
                return True  # a bad head: the handler answers 400 at once
    return len(data) >= end + 4 + length


def _is_health_check(data: bytearray) -> bool:
    request_line = bytes(data[: data.find(b"\r\n")]).split()
    return len(request_line) >= 2 and request_line[1].split(b"?")[0] == b"/healthz"


def start_metrics_server(
    app: WsgiApp,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
    *,
    flag: str = "--metrics-port",
    thread_name: str = "metrics-http",
) -> MetricsHTTPServer:
    """Bind `host:port` and serve `app` from a daemon thread; returns the server (for its port).
    SettingsError, naming `flag`, when the port cannot be had."""
    try:
        server = MetricsHTTPServer((host, port), app, tls)
    except OSError as exc:
        raise SettingsError(
            f"{flag} {port}: cannot listen on {host}:{port} ({exc.strerror or exc})"
        ) from None
    threading.Thread(target=server.serve_forever, name=thread_name, daemon=True).start()
    return server


def start_health_server(
    healthy: Callable[[], tuple[bool, str]], host: str, port: int
) -> MetricsHTTPServer:
    """The health listener (--health-port): /healthz alone, in a thread, selector and limits of
    its own, so that no crowd on the metrics port can keep a probe from being answered.

    Plain HTTP without auth, whatever --web-config-file says: the kubelet's httpGet probes and
    Docker's health checks send neither a client certificate nor a password, and /healthz tells
    only whether cycles complete."""
    return start_metrics_server(
        health_app(healthy), host, port, flag="--health-port", thread_name="health-http"
    )
