"""Starting and stopping the server processes that tests run (broker, Prometheus, Alertmanager)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml


def require_binary(binary: str, package: str) -> str:
    """Path of `binary`, or fail (not skip) the test naming the Debian package that ships it."""
    found = shutil.which(binary)
    if found is None:
        pytest.fail(
            f"{binary} is not installed: install the Debian package '{package}' "
            f"(apt-get install -y {package}); make test does this when run as root.",
            pytrace=False,
        )
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def health_port_args(code: Path | None = None) -> list[str]:
    """`--health-port` and a free port, for a serve or exporter of `code` (a checkout; None:
    this one) that has the flag, else nothing: a bench that runs older code beside today's
    must not give it a flag it refuses, and today's must not take the default port twice."""
    flags = (code or Path(__file__).resolve().parents[1]) / "pipeline/settings/command_flags.py"
    known = flags.is_file() and "--health-port" in flags.read_text(encoding="utf-8")
    return ["--health-port", str(free_port())] if known else []


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `grace_s`; always reaps it."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=5)


@contextmanager
def ready_server(
    name: str, argv: list[str], log_path: Path, ready_url: str, timeout: float
) -> Iterator[subprocess.Popen[bytes]]:
    """Run `argv` (output to `log_path`) until the block ends, once `ready_url` answers 200."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"{name} exited with {process.returncode}:\n{log_path.read_text()}"
                )
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready after {timeout}s:\n{log_path.read_text()}")
            time.sleep(0.2)
        yield process
    finally:
        stop_process(process)


@contextmanager
def configured_server(
    name: str,
    binary: str,
    config: Mapping[str, Any],
    storage_flag: str,
    extra_args: Sequence[str] = (),
    ready_timeout: float = 30.0,
) -> Iterator[tuple[str, Path, subprocess.Popen[bytes]]]:
    """Run a Prometheus-family server (Prometheus, Alertmanager) until the block ends, once
    its /-/ready answers: `config` as NAME.yml and its data (`--STORAGE_FLAG`) in a temporary
    directory, removed afterwards, and its web listener on a free loopback port.

    Yields (base URL, the directory, which also holds NAME.log, the process).
    """
    directory = Path(tempfile.mkdtemp(prefix=f"ragpulse-{name}-"))
    config_path = directory / f"{name}.yml"
    config_path.write_text(yaml.safe_dump(dict(config), sort_keys=False), encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [
        binary,
        f"--config.file={config_path}",
        f"--{storage_flag}={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        *extra_args,
    ]
    try:
        log_path = directory / f"{name}.log"
        with ready_server(name, argv, log_path, f"{url}/-/ready", ready_timeout) as process:
            yield url, directory, process
    finally:
        shutil.rmtree(directory, ignore_errors=True)
