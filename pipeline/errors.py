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


# What stands in an error for a setting's value: a value may be a secret put under the wrong
# key (an API key as a number of workers), so errors name the setting and what it must be,
# never what it is.
NOT_SHOWN = "(value not shown)"


def kind_of(value: Any) -> str:
    """What an invalid setting's value is, without showing it: 'a string (value not shown)'."""
    kinds = {bool: "true or false", str: "a string", int: "a number", float: "a number",
             list: "a list", dict: "a mapping", type(None): "nothing"}
    return f"{kinds.get(type(value), type(value).__name__)} {NOT_SHOWN}"


def without_value(message: str, value: Any) -> str:
    """`message` (from a parser of setting values: int(), a duration, a validator) with every
    text of `value` in it, quoted or bare, replaced by NOT_SHOWN; a list's items each. Bare
    texts shorter than 4 characters stay (a number like 0 or 5m is no secret, and replacing it
    would garble the rest of the message)."""
    texts = (
        [str(v) for v in value if isinstance(v, (str, int, float))]
        if isinstance(value, (list, tuple, set, frozenset))
        else [str(value)]
    )
    for text in sorted({t for t in texts if t}, key=len, reverse=True):
        for form in (repr(text), f'"{text}"', f"'{text}'"):
            message = message.replace(form, NOT_SHOWN)
        if len(text) >= 4:
            message = message.replace(text, NOT_SHOWN)
    return message


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
