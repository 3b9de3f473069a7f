"""The `ragpulse` command as users run it, for tests: as a subprocess, and its one-line errors.

    done = ragpulse("windows", "--state", str(state))
    line = one_line_error(done.returncode, done.stderr)
    assert line.startswith("ragpulse windows: state file")

`ragpulse_in_process` runs the same command line through `main()` in the test's process, for
tests of what the command line is told and answers (flags, config files, the environment),
not of the process: each subprocess costs a second of interpreter start and imports, and
more on a loaded machine.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
import traceback
from collections.abc import Mapping
from pathlib import Path
from unittest import mock


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


# The loggers whose level `main()` sets (ragpulse/pipeline/cli.py), restored after each call.
_LOGGERS_MAIN_SETS = ("ragpulse", "apache_beam", "httpx2", "kafka")


def ragpulse_in_process(
    *args: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`ragpulse ARGS` as `ragpulse(...)` runs it, by `main()` in this process: in the
    environment `env` (by default this process's) and with stdout and stderr captured. An
    exception is printed to the captured stderr with exit code 1 and an argparse exit gives its
    code, as the console script would. The logging `main()` configures is undone after it."""
    from ragpulse.pipeline.cli import main

    environment = dict(env) if env is not None else dict(os.environ)
    root = logging.getLogger()
    handlers, filters, root_level = root.handlers[:], root.filters[:], root.level
    levels = {name: logging.getLogger(name).level for name in _LOGGERS_MAIN_SETS}
    out, err = io.StringIO(), io.StringIO()
    try:
        with (
            mock.patch.dict(os.environ, environment, clear=True),
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            try:
                code = main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:], root.filters[:] = handlers, filters
        root.setLevel(root_level)
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
    return subprocess.CompletedProcess(["ragpulse", *args], code, out.getvalue(), err.getvalue())
