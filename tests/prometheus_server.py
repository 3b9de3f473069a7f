"""A real Prometheus server for tests: start /usr/bin/prometheus on a free loopback port.

For test authors who need PromQL checked by the real engine (rules, dashboard queries) or a
Prometheus that scrapes a running ``ragpulse serve``::

    from prometheus_server import prometheus_config, running_prometheus

    with running_prometheus(prometheus_config(["127.0.0.1:9464"], [...], scrape_interval="1s",
                                              evaluation_interval="1s")) as prom:
        prom.wait_for(lambda: prom.query('up{job="ragpulse"}')["result"])
        data = prom.query("ragpulse_judge_pass_ratio")

The session fixture ``prometheus_server`` (import it into a test module to use it) gives an
empty server (no targets, no rules) for parse checks.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from processes import configured_server, require_binary

PROMETHEUS_BINARY = "/usr/bin/prometheus"


class PrometheusQueryError(AssertionError):
    """The Prometheus HTTP API answered with status 'error' (e.g. a PromQL parse error)."""


@dataclass
class PrometheusServer:
    """A running Prometheus: its base URL, working directory and process."""

    url: str
    work_dir: Path
    process: subprocess.Popen[bytes]

    def api(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        """GET ``/api/v1/<path>`` and return the decoded JSON body, also for 4xx answers."""
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        request = f"{self.url}/api/v1/{path}{query}"
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                body: dict[str, Any] = json.load(response)
        except urllib.error.HTTPError as err:  # 400/422 carry the PromQL error as JSON
            body = json.load(err)
        return body

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """Instant query; returns ``data`` ({resultType, result}); raises on a PromQL error."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = self.api("query", params)
        if body.get("status") != "success":
            raise PrometheusQueryError(
                f"{body.get('errorType')}: {body.get('error')} in query:\n{expr}"
            )
        data: dict[str, Any] = body["data"]
        return data

    def wait_for(
        self, condition: Callable[[], Any], timeout: float = 30.0, interval: float = 0.5
    ) -> Any:
        """Poll ``condition`` until it returns something truthy; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if time.monotonic() > deadline:
                raise TimeoutError(f"condition not met within {timeout}s; log:\n{self.log()}")
            time.sleep(interval)

    def log(self, tail: int = 40) -> str:
        """Last lines of the server's log, for failure messages."""
        path = self.work_dir / "prometheus.log"
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        return "\n".join(lines[-tail:])


def prometheus_config(
    scrape_targets: Sequence[str] = (),
    rule_files: Sequence[Path] = (),
    *,
    job: str = "ragpulse",
    scrape_interval: str = "15s",
    evaluation_interval: str = "15s",
) -> dict[str, Any]:
    """A minimal prometheus.yml: one job scraping ``scrape_targets``, the given rule files."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": scrape_interval,
            "evaluation_interval": evaluation_interval,
        },
        "rule_files": [str(Path(p).resolve()) for p in rule_files],
        "scrape_configs": [],
    }
    if scrape_targets:
        config["scrape_configs"].append(
            {"job_name": job, "static_configs": [{"targets": list(scrape_targets)}]}
        )
    return config


def require_prometheus(binary: str = PROMETHEUS_BINARY) -> str:
    """Path of the Prometheus binary, or fail (not skip) naming the Debian package."""
    return require_binary(binary, "prometheus")


@contextmanager
def running_prometheus(
    config: dict[str, Any] | None = None,
    *,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
) -> Iterator[PrometheusServer]:
    """Start Prometheus with `config` (by default `prometheus_config()`: no targets, no rules)
    and a temporary TSDB, wait until /-/ready, stop it afterwards.

    ``extra_args`` are added flags (e.g. ``--enable-feature=exemplar-storage``).
    """
    with configured_server(
        "prometheus", require_prometheus(), config or prometheus_config(), "storage.tsdb.path",
        ["--web.enable-lifecycle", *extra_args], ready_timeout,
    ) as (url, directory, process):
        yield PrometheusServer(url, directory, process)


@pytest.fixture(scope="session")
def prometheus_server() -> Iterator[PrometheusServer]:
    """An empty Prometheus (no targets, no rules) shared by the session, for PromQL checks."""
    with running_prometheus() as server:
        yield server
