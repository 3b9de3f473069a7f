"""The `ragpulse` command as users run it, for tests: as a subprocess, and its one-line errors.

    done = ragpulse("windows", "--state", str(state))
    line = one_line_error(done.returncode, done.stderr)
    assert line.startswith("ragpulse windows: state file")
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def ragpulse_command() -> list[str]:
    """The installed console script when there is one (it is what users run), else the module."""
    script = Path(sys.executable).with_name("ragpulse")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "ragpulse.pipeline.cli"]


def ragpulse(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """Run `ragpulse ARGS` to its end, in the environment `env` (by default this process's).
    Output is captured as text; the exit code is left to the caller."""
    return subprocess.run(
        [*ragpulse_command(), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def one_line_error(code: int, stderr: str, *, exit_code: int = 2, allow_info: bool = False) -> str:
    """The error of a command refused on bad input, once it is shown to have exited with
    `exit_code` and printed that one line, with no traceback; returns the line.

    `allow_info`: log lines at INFO (serve logs its settings before it checks the state file, for
    example) may come before it.
    """
    lines = [line for line in stderr.strip().splitlines() if not (allow_info and " INFO " in line)]
    assert code == exit_code, stderr
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]
