"""Starting and stopping the server processes that tests run (broker, Prometheus, Alertmanager)."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


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
