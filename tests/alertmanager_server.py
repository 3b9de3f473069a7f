"""A real Alertmanager and a webhook receiver that records what it is sent, for tests.

For test authors who follow an alert all the way to a notification::

    from alertmanager_server import WebhookRecorder, config_for_test, running_alertmanager

    with WebhookRecorder() as hook:
        config = config_for_test(SHIPPED, hook.url, group_wait="1s", group_interval="2s")
        with running_alertmanager(config) as am:
            ...  # point Prometheus at am.url
            hook.wait_for(lambda n: n.status == "firing", timeout=60)

`config_for_test` derives the test configuration from the shipped
deploy/alertmanager/alertmanager.yml (same routing tree, grouping and inhibitions) by pointing
every webhook at the recorder, keeping each URL's path so a test can tell the receivers apart,
and shortening the timings.
"""

from __future__ import annotations

import copy
import json
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from processes import configured_server, require_binary

ALERTMANAGER_BINARY = "/usr/bin/prometheus-alertmanager"
ROUTE_TIMINGS = ("group_wait", "group_interval", "repeat_interval")


@dataclass(frozen=True)
class Notification:
    """One webhook POST from Alertmanager: when it arrived (epoch s), where, and its body."""

    received_at: float
    path: str
    payload: dict[str, Any]

    @property
    def status(self) -> str:
        """"firing" or "resolved" (of the whole group)."""
        return str(self.payload.get("status", ""))

    @property
    def alerts(self) -> list[dict[str, Any]]:
        return list(self.payload.get("alerts", []))

    @property
    def group_labels(self) -> dict[str, str]:
        return dict(self.payload.get("groupLabels", {}))


class WebhookRecorder:
    """An HTTP server on 127.0.0.1 that stores every POSTed Alertmanager notification."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received: list[Notification] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received_at = time.time()
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                try:
                    payload = json.loads(body)
                except ValueError:
                    payload = {"unparsable_body": body.decode("utf-8", "replace")}
                recorder._add(Notification(received_at, self.path, payload))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="webhook-recorder", daemon=True
        )

    @property
    def url(self) -> str:
        """Base URL (no path); Alertmanager receivers append their own path."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _add(self, notification: Notification) -> None:
        with self._lock:
            self._received.append(notification)

    def notifications(self) -> list[Notification]:
        """Everything received so far, in arrival order."""
        with self._lock:
            return list(self._received)

    def wait_for(
        self, match: Callable[[Notification], bool], timeout: float, interval: float = 0.2
    ) -> Notification | None:
        """The first notification matching ``match``, waiting up to ``timeout`` s; else None."""
        deadline = time.monotonic() + timeout
        while True:
            for notification in self.notifications():
                if match(notification):
                    return notification
            if time.monotonic() > deadline:
                return None
            time.sleep(interval)

    def __enter__(self) -> WebhookRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def config_for_test(
    shipped: Mapping[str, Any] | Path,
    webhook_base_url: str,
    *,
    group_wait: str | None = "1s",
    group_interval: str | None = "2s",
    repeat_interval: str | None = "1h",
) -> dict[str, Any]:
    """The shipped config with webhook hosts replaced and route timings shortened.

    Nothing else changes: receivers, matchers, grouping and inhibitions stay as shipped, so the
    test exercises the real routing tree. Timings are replaced wherever the shipped tree sets
    them (root and child routes); a timing given as None keeps the shipped values.
    """
    source: Mapping[str, Any] = (
        yaml.safe_load(shipped.read_text(encoding="utf-8"))
        if isinstance(shipped, Path)
        else shipped
    )
    config: dict[str, Any] = copy.deepcopy(dict(source))
    base = urllib.parse.urlsplit(webhook_base_url)
    for receiver in config.get("receivers", []):
        for hook in receiver.get("webhook_configs", []):
            url = urllib.parse.urlsplit(hook["url"])
            hook["url"] = urllib.parse.urlunsplit(
                (base.scheme, base.netloc, url.path, url.query, url.fragment)
            )
    timings = {
        "group_wait": group_wait,
        "group_interval": group_interval,
        "repeat_interval": repeat_interval,
    }

    def shorten(route: dict[str, Any], root: bool) -> None:
        for key in ROUTE_TIMINGS:
            if timings[key] is not None and (root or key in route):
                route[key] = timings[key]
        for child in route.get("routes", []):
            shorten(child, root=False)

    shorten(config["route"], root=True)
    return config


@dataclass
class AlertmanagerServer:
    """A running Alertmanager: base URL, working directory, process."""

    url: str
    work_dir: Path
    process: subprocess.Popen[bytes]

    def log(self, tail: int = 40) -> str:
        path = self.work_dir / "alertmanager.log"
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(lines[-tail:])


def require_alertmanager(binary: str = ALERTMANAGER_BINARY) -> str:
    """Path of the Alertmanager binary, or fail (not skip) naming the Debian package."""
    return require_binary(binary, "prometheus-alertmanager")


@contextmanager
def running_alertmanager(
    config: Mapping[str, Any], *, ready_timeout: float = 30.0
) -> Iterator[AlertmanagerServer]:
    """Start Alertmanager on a free loopback port with a temporary storage directory.

    Clustering is switched off (``--cluster.listen-address=``) so nothing binds port 9094 and
    a single instance does not wait for peers before sending notifications.
    """
    with configured_server(
        "alertmanager", require_alertmanager(), config, "storage.path",
        ["--cluster.listen-address="], ready_timeout,
    ) as (url, directory, process):
        yield AlertmanagerServer(url, directory, process)


