"""Where a command's settings come from: a YAML config file, the environment, the flags.

Every flag of `run` and `serve` can also be given as a key of the `--config` file (the flag's
name without the dashes: `window: 5m`, `kafka-bootstrap: kafka:9092`, `judges: [groundedness,
safety]`) or as an environment variable (`RAGPULSE_` + the name in upper case with underscores:
`RAGPULSE_WINDOW=5m`). Flags override the environment, which overrides the file, which
overrides the defaults of the settings model. Values go through the same parsing and the same
validation as the flags, so an error names the key (or the variable) and says what is wrong.

`--print-config` prints the effective settings in the file's format, so the output of one
deployment is a config file for the next. Secrets never have flags (they come from files or
the environment, see `pipeline.kafka_security`), so they are never printed.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from ragpulse.judges.yaml_file import shown_key
from ragpulse.pipeline.errors import (
    NOT_SHOWN,
    SettingsError,
    load_settings_file,
    without_value,
)
from ragpulse.pipeline.kafka_security import (
    ENV_SASL_PASSWORD,
    ENV_SASL_USERNAME,
    ENV_SSL_KEY_PASSWORD,
)
from ragpulse.pipeline.settings.flags import duration, format_duration, positive_duration

ENV_PREFIX = "RAGPULSE_"
# RAGPULSE_ variables that are not a flag: the config file, the Kafka secrets, and the
# project's own tooling (the Makefile's cache of pinned tools, the end-to-end test's report,
# the demo compose file's sample rate), which the commands leave alone.
OTHER_VARIABLES = frozenset(
    {
        ENV_PREFIX + "CONFIG",
        ENV_SASL_USERNAME,
        ENV_SASL_PASSWORD,
        ENV_SSL_KEY_PASSWORD,
        ENV_PREFIX + "CACHE",
        ENV_PREFIX + "E2E_REPORT",
        ENV_PREFIX + "DEMO_SAMPLE_RATE",
    }
)
_OWN = {"help", "config", "print_config"}
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

log = logging.getLogger(__name__)


def add_config_arguments(p: argparse.ArgumentParser) -> None:
    """`--config` and `--print-config`."""
    g = p.add_argument_group("configuration")
    g.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML file of settings keyed by flag name without the dashes (e.g. window: 5m); "
        f"{ENV_PREFIX}<FLAG> environment variables (e.g. {ENV_PREFIX}WINDOW=5m) override it, "
        f"and flags override both (default: ${ENV_PREFIX}CONFIG, else none)",
    )
    g.add_argument(
        "--print-config",
        action="store_true",
        help="check the settings, print them in the --config format and exit",
    )


def _options(parser: argparse.ArgumentParser) -> Iterator[argparse.Action]:
    """The optional flags a config file or the environment may set."""
    for action in parser._actions:
        if action.option_strings and action.dest not in _OWN:
            yield action


def key_of(action: argparse.Action) -> str:
    """The config-file key of a flag: its long name without the dashes."""
    return max(action.option_strings, key=len).removeprefix("--")


def env_of(action: argparse.Action) -> str:
    return ENV_PREFIX + key_of(action).upper().replace("-", "_")


def relax_required(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """Make required flags optional for parsing (a file or the environment may give them);
    returns them, for `apply` to check once every source has been read."""
    required = [a for a in _options(parser) if a.required]
    for action in required:
        action.required = False
    return required


def given_on_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]) -> set[str]:
    """The dests of the flags `argv` sets (parsed again with every default suppressed)."""
    saved = [(a, a.default) for a in parser._actions]
    try:
        for action, _ in saved:
            action.default = argparse.SUPPRESS
        given = parser.parse_known_args(list(argv))[0]
    finally:
        for action, default in saved:
            action.default = default
    return set(vars(given))


def apply(
    parser: argparse.ArgumentParser,
    argv: Sequence[str],
    args: argparse.Namespace,
    required: Sequence[argparse.Action],
    env: Mapping[str, str] | None = None,
    every_command: Callable[[], Mapping[str, str]] | None = None,
) -> None:
    """Fill `args` from the config file and the environment where no flag was given.

    `every_command`: the variables of every command's flags, each with its command, asked
    only when the environment holds a RAGPULSE_ variable that is not this command's."""
    env = os.environ if env is None else env
    check_variables(parser, env, every_command)
    if args.config is None and env.get(ENV_PREFIX + "CONFIG"):
        args.config = Path(env[ENV_PREFIX + "CONFIG"])
    from_file = _read_file(args.config) if args.config is not None else {}
    actions = {key_of(a): a for a in _options(parser)}
    unknown = sorted(set(from_file) - set(actions))
    if unknown:
        raise SettingsError(
            f"config {args.config}: {len(unknown)} unknown key(s) "
            f"{', '.join(sorted({shown_key(k) for k in unknown}))}; the keys are the "
            "command's flags without the dashes (see --help)"
        )
    given = given_on_command_line(parser, argv)
    for key, action in actions.items():
        if action.dest in given:
            continue
        var = env_of(action)
        if var in env:
            setattr(args, action.dest, _convert(action, env[var], f"environment {var}", env=True))
        elif key in from_file:
            where = f"config {args.config}: {key}"
            setattr(args, action.dest, _convert(action, from_file[key], where, env=False))
    missing = [a for a in required if getattr(args, a.dest, None) is None]
    if missing:
        raise SettingsError(
            "missing "
            + ", ".join(
                f"{max(a.option_strings, key=len)} (or {key_of(a)}: in --config, or "
                f"{env_of(a)})"
                for a in missing
            )
        )


def check_variables(
    parser: argparse.ArgumentParser,
    env: Mapping[str, str],
    every_command: Callable[[], Mapping[str, str]] | None,
) -> None:
    """Refuse a RAGPULSE_ variable no command reads: a typo in, say, the budget's variable
    used to mean no budget, silently. One of another command's flags is logged and left."""
    own = {env_of(a) for a in _options(parser)} | OTHER_VARIABLES
    strangers = sorted(v for v in env if v.startswith(ENV_PREFIX) and v not in own)
    if not strangers:
        return
    others = every_command() if every_command is not None else {}
    for var in strangers:
        if var in others:
            log.info("environment %s sets a flag of `ragpulse %s` only: ignored", var, others[var])
            continue
        close = difflib.get_close_matches(var, sorted(own), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise SettingsError(
            f"environment {var}: no such setting{hint}; {ENV_PREFIX}<FLAG> variables set "
            "the command's flags (see --help)"
        )


def _read_file(path: Path) -> dict[str, Any]:
    data = load_settings_file(path, f"config {path}")
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise SettingsError(f"config {path}: must be a mapping of flag names to values")
    return data


def _convert(action: argparse.Action, value: Any, where: str, *, env: bool) -> Any:
    """`value` as the flag would have parsed it; SettingsError names `where` otherwise."""
    try:
        if isinstance(action, argparse._StoreTrueAction):
            return _boolean(value)
        if isinstance(action, argparse._AppendAction):
            items = [value] if env or not isinstance(value, list) else value
            return [_one(action, item) for item in items]
        return _one(action, value)
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise SettingsError(f"{where}: {without_value(str(exc), value)}") from None


def _one(action: argparse.Action, value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        value = ",".join(str(v) for v in value)  # e.g. judges: [groundedness, safety]
    if isinstance(value, (dict, list)):
        raise ValueError(f"must be a single value, got {type(value).__name__}")
    text = str(value).lower() if isinstance(value, bool) else str(value)
    converted = action.type(text) if callable(action.type) else text
    if action.choices is not None and converted not in action.choices:
        raise ValueError(
            f"must be one of {', '.join(str(c) for c in action.choices)} {NOT_SHOWN}"
        )
    return converted


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"must be true or false {NOT_SHOWN}")


def effective_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str:
    """The settings in effect, in the --config format (round-trips through `apply`)."""
    out: dict[str, Any] = {}
    for action in _options(parser):
        value = getattr(args, action.dest, None)
        if value is None or isinstance(action, argparse._HelpAction):
            continue
        out[key_of(action)] = _as_config_value(action, value)
    lines = yaml.safe_dump(out, sort_keys=True, default_flow_style=False, allow_unicode=True)
    return "# ragpulse settings in effect (secrets come from files or the environment and are " \
        "not shown)\n" + lines


def _as_config_value(action: argparse.Action, value: Any) -> Any:
    if action.type in (duration, positive_duration):
        return format_duration(float(value))
    if isinstance(value, (frozenset, set)):
        return ",".join(sorted(value))
    if isinstance(value, list):
        return [str(v) if isinstance(v, Path) else v for v in value]
    if isinstance(value, Path):
        return str(value)
    return value
