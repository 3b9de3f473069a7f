"""Hold a `ragpulse serve` subprocess at a phase of its cycle (pipeline/service/cycle_hooks.py),
so that a test kills or scrapes it at a point it has seen rather than after a guessed delay.

    holds = CycleHolds(tmp_path / "hooks")
    holds.hold("judged")
    serve = serve_processes(bootstrap, topic, state, args, env=holds.env).start()
    holds.wait_at("judged", serve)      # serve has judged a batch and saved none of it
    serve.kill()
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import orjson
from serve_process import ServeProcess

from ragpulse.pipeline.service.cycle_hooks import ENV_VAR, PHASES


class CycleHolds:
    """The hook directory of one or more serve processes, and the holds set in it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    @property
    def env(self) -> dict[str, str]:
        """The environment for a ServeProcess that obeys these holds."""
        return {**os.environ, ENV_VAR: str(self.directory)}

    def hold(self, phase: str) -> None:
        """The next cycle to reach `phase` waits there until `release(phase)`."""
        assert phase in PHASES, phase
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"at-{phase}").unlink()
        (self.directory / f"hold-{phase}").touch()

    def release(self, phase: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / f"hold-{phase}").unlink()

    def wait_at(self, phase: str, serve: ServeProcess, timeout: float = 120.0) -> float:
        """Wait until `serve` holds at `phase`; returns the time.time() it got there."""
        marker = self.directory / f"at-{phase}"
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if not serve.running:
                raise AssertionError(
                    f"serve exited (code {serve.returncode}) before reaching {phase}:\n"
                    f"{serve.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"serve did not reach {phase} within {timeout}s:\n{serve.log_tail()}"
                )
            time.sleep(0.02)
        at = orjson.loads(marker.read_bytes())
        assert at["pid"] == serve.process.pid if serve.process else False
        return float(at["time"])
