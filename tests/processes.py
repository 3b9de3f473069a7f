"""Stopping the server processes that tests start (broker, Prometheus, Alertmanager)."""

from __future__ import annotations

import subprocess


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
