"""Every flag a command takes is read by its settings: a command cannot accept a flag it ignores.

`ragpulse stream --sampling-rules FILE --input-format otlp_json --judge-calibration MISSING
--cascade-llm-sample-rate 0.2 --print-config` used to exit 0 and print all four as in effect,
though the stream never read them (issues 19 and 21).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from cli import ragpulse_in_process

from ragpulse.pipeline.cli import COMMANDS, _subparser, build_parser
from ragpulse.pipeline.settings.command_flags import settings_from

_NOT_SETTINGS = {"help", "config", "print_config"}


class _Recording(argparse.Namespace):
    """A namespace that remembers which flags' values were read."""

    def __getattribute__(self, name: str) -> Any:
        if not name.startswith("_"):
            object.__getattribute__(self, "_read").add(name)
        return object.__getattribute__(self, name)


def unread_flags(command: str, argv: list[str]) -> set[str]:
    """The flags of `command` whose values its settings never look at."""
    parser = build_parser()
    args = parser.parse_args([command, *argv], namespace=_Recording())
    object.__setattr__(args, "_read", set())
    settings_from(COMMANDS[command].flags, args)
    sub = _subparser(parser, command)
    return {a.dest for a in sub._actions if a.option_strings} - _NOT_SETTINGS - args._read


OPENAI = ["--judge-backend", "openai", "--judge-base-url", "http://127.0.0.1:9/v1"]
KAFKA = ["--kafka-bootstrap", "127.0.0.1:9092"]


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("stream", [*KAFKA, "--topic", "logs", "--runner", "FlinkRunner"]),
        (
            "serve",
            [*KAFKA, "--topic", "logs", *OPENAI, "--judge-budget-per-hour", "1000",
             "--cascade-llm-sample-rate", "0.2"],
        ),
        ("exporter", [*KAFKA, "--ratings-topic", "logs.ratings"]),
    ],
)
def test_each_flag_of_a_command_is_read_by_its_settings(command: str, argv: list[str]) -> None:
    assert unread_flags(command, argv) == set()


def test_run_reads_each_of_its_flags(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    events.write_text("")
    argv = [str(events), *OPENAI, "--cascade-llm-sample-rate", "0.2"]
    assert unread_flags("run", argv) == set()


@pytest.mark.parametrize(
    "flag",
    [
        ["--sampling-rules", "rules.yaml"],
        ["--input-format", "otlp_json"],
        ["--judge-calibration", "/nonexistent/calibration.json"],
        ["--cascade-llm-sample-rate", "0.2"],
    ],
)
def test_stream_refuses_the_flags_it_does_not_read(flag: list[str]) -> None:
    done = ragpulse_in_process(
        "stream", *KAFKA, "--topic", "logs", "--runner", "FlinkRunner", *flag, "--print-config"
    )
    assert done.returncode == 2, done.stdout
    assert f"unrecognized arguments: {' '.join(flag)}" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
