"""Flags have one home, pipeline/settings/: each command's parser is generated from the flag
table of the settings model it builds, so every flag it accepts sets a field of that model, and
no module elsewhere in pipeline/ adds a flag of its own (issue 21)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path
from typing import Any

import pytest
from cli import one_line_error, ragpulse_in_process

from ragpulse.pipeline.cli import _subparser, build_parser
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.settings import command_flags
from ragpulse.pipeline.settings.command_flags import settings_from
from ragpulse.pipeline.settings.flags import Block, FlagTable, fields_from_flags
from ragpulse.pipeline.settings.models import setting_flag

PIPELINE = Path(__file__).resolve().parents[1] / "pipeline"
_NOT_SETTINGS = {"help", "config", "print_config"}
TABLES: dict[str, FlagTable[Any]] = {
    "run": command_flags.RUN,
    "serve": command_flags.SERVE,
    "stream": command_flags.STREAM,
    "exporter": command_flags.EXPORTER,
    "calibrate": command_flags.CALIBRATE,
    "windows": command_flags.WINDOWS,
    "explain": command_flags.EXPLAIN,
    "simulate": command_flags.SIMULATE,
}


def flag_calls(source: str) -> list[int]:
    """The lines of `source` that call `add_argument` (on any parser or group)."""
    if "add_argument" not in source:  # no such call: skip the (slow) parse
        return []
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "add_argument"
    ]


def modules_defining_flags() -> set[str]:
    return {
        str(path.relative_to(PIPELINE))
        for path in PIPELINE.rglob("*.py")
        if "settings" not in path.relative_to(PIPELINE).parts
        and flag_calls(path.read_text(encoding="utf-8"))
    }


def test_no_module_outside_settings_defines_a_flag() -> None:
    assert modules_defining_flags() == set()


def test_the_top_level_flags_are_the_log_level_table() -> None:
    parser = build_parser()
    accepted = {a.dest for a in parser._actions} - _NOT_SETTINGS - {"command"}
    assert accepted == {flag.key for flag, _ in command_flags.LOG_LEVEL.flags()}


def test_a_flag_added_outside_settings_is_found() -> None:
    planted = "def configure(p):\n    g = p.add_argument_group('x')\n    g.add_argument('--y')\n"
    assert flag_calls(planted) == [3]
    assert flag_calls("def configure(p):\n    p.set_defaults(y=1)\n") == []


@pytest.mark.parametrize("command", sorted(TABLES))
def test_every_flag_a_command_accepts_sets_a_field_of_its_settings_model(command: str) -> None:
    table = TABLES[command]
    assert table.model is not None
    parser = _subparser(build_parser(), command)
    accepted = {a.dest for a in parser._actions} - _NOT_SETTINGS
    assert accepted == {flag.key for flag, _ in table.flags()}
    for item in table.items:
        assert item.field in table.model.model_fields, f"{command}: {item.field}"
        if isinstance(item, Block) and item.model is not None:
            for flag in item.flags:
                assert flag.field in item.model.model_fields, f"{command}: {flag.name}"


@pytest.mark.parametrize("command", sorted(TABLES))
def test_an_error_names_each_setting_by_the_flag_of_the_command_that_sets_it(
    command: str,
) -> None:
    table = TABLES[command]
    for item in table.items:
        if isinstance(item, Block):
            if item.model is None:
                continue  # a block's own build words its errors
            model, names, flags = item.model, item.flag_names(), item.flags
        else:
            assert table.model is not None
            model, names, flags = table.model, table.flag_names(), (item,)
        for flag in flags:
            named = setting_flag(model, flag.field, names)
            assert named.split(" / ")[0] == flag.shown, f"{command}: {flag.field} is {named}"


def test_calibrate_names_its_own_judge_flag_in_an_error() -> None:
    # `--judges` (run's flag) used to be named here, a flag calibrate does not take.
    parser = build_parser()
    args = parser.parse_args(["calibrate", __file__, "--judge", "nonexistent"])
    with pytest.raises(SettingsError, match=r"^invalid settings: --judge: unknown judge"):
        settings_from(command_flags.CALIBRATE, args)


def test_a_flag_for_a_field_the_model_lacks_is_refused() -> None:
    run = command_flags.RUN
    stray = FlagTable(command_flags.StreamSettings, (*command_flags.STREAM.items, run.items[1]))
    args = argparse.Namespace(
        **{f.key: [] if f.action == "append" else None for f, _ in stray.flags()}
    )
    with pytest.raises(ValueError, match="StreamSettings has no field output"):
        fields_from_flags(stray, args)


def test_a_set_of_flags_one_of_which_is_required_takes_exactly_one() -> None:
    parser = _subparser(build_parser(), "simulate")
    for argv in ([], ["--output", "f", "--kafka-bootstrap", "h:1"]):
        with pytest.raises(SystemExit):
            parser.parse_args(argv)
    assert parser.parse_args(["--output", "f"]).kafka_bootstrap is None


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--start-time", "nonsense", "--start-time 'nonsense': not an ISO 8601 time"),
        ("--apps", "", "--apps: expected a comma-separated list of names, got ''"),
        ("--models", " , ", "--models: expected a comma-separated list of names"),
        ("--rate", "0", "--rate and --duration must be positive"),
    ],
)
def test_a_value_the_parser_took_but_the_setting_cannot_is_one_line_and_exit_2(
    tmp_path: Path, flag: str, value: str, said: str
) -> None:
    done = ragpulse_in_process(
        "simulate", "--output", str(tmp_path / "events.jsonl"), f"{flag}={value}"
    )
    assert one_line_error(done.returncode, done.stderr).startswith(f"ragpulse simulate: {said}")
    assert not (tmp_path / "events.jsonl").exists()
