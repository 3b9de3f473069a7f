"""The error every command turns into one line on stderr and exit code 2, serve's other exit
codes (its --on-offset-reset help names one), and the one reader of an operator's settings file
that words its failures as such an error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ragpulse.judges.yaml_file import YamlFileError, load_yaml

# `ragpulse serve --on-offset-reset fail` stops with this code when a saved offset is gone.
EXIT_OFFSET_RESET = 3
# `ragpulse serve` stops with this code when the cycle in flight had not finished
# STOP_GRACE_SECONDS after SIGTERM: it was abandoned unsaved and replays after a restart.
EXIT_CYCLE_ABANDONED = 4


class SettingsError(Exception):
    """A setting is missing or invalid; the message says which and how to fix it."""


def load_settings_file(
    path: Path, where: str, error: type[Exception] = SettingsError
) -> Any:
    """The YAML document of the operator's file at `path` (judges/yaml_file.py: bounded and
    safe; None when empty), or `error` with one line: `where` (the flag and the file), then
    "cannot read it: REASON" or what is wrong with its YAML."""
    try:
        return load_yaml(path)
    except OSError as exc:
        raise error(f"{where}: cannot read it: {exc.strerror}") from None
    except YamlFileError as exc:
        raise error(f"{where}: {exc}") from None
