"""The `ragpulse` command: run (a file), serve (a Kafka topic), windows (read state), simulate,
explain (the failing answers of a window), calibrate (a judge against human labels), stream
(one unbounded Beam job), exporter (its ratings as /metrics), review (the review page),
align (a judge's prompt aligned to its labels) and import-labels (labels from elsewhere)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys
from typing import Any

from ragpulse.judges.registry import JUDGE_NAMES
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.settings import sources as config_sources
from ragpulse.pipeline.settings.command_flags import (
    ALIGN,
    CALIBRATE,
    EXPLAIN,
    EXPORTER,
    IMPORT_LABELS,
    LOG_LEVEL,
    REVIEW_PAGE,
    RUN,
    SERVE,
    SIMULATE,
    STREAM,
    WINDOWS,
    settings_from,
)
from ragpulse.pipeline.settings.flags import FlagTable, add_flags
from ragpulse.pipeline.settings.sources import add_config_arguments

# Beam warns at import, before logging is configured (so on stderr, bare), that its Google Cloud
# Storage filesystem cannot load when a `google.cloud` namespace exists without the storage
# client. ragpulse reads local files and Kafka only; the line would break every one-line error.
logging.getLogger("apache_beam.io.filesystems").setLevel(logging.ERROR)
# The one logger --log-level DEBUG reaches (ragpulse's own lines carry no user text).
_OWN_LOGGER = "ragpulse"


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: what `ragpulse --help` says of it, its flags (the settings model they
    build, which `main(settings)` of its module in pipeline/commands/ runs with) and whether a
    --config file and RAGPULSE_ variables may give them too."""

    help: str
    flags: FlagTable[Any]
    takes_config: bool = False


COMMANDS: dict[str, Command] = {
    "run": Command(
        "judge a file of inference-log events and write windowed ratings", RUN, takes_config=True
    ),
    "serve": Command(
        "watch a Kafka topic continuously and serve /metrics", SERVE, takes_config=True
    ),
    "windows": Command("print the window aggregates saved by serve, as JSON lines", WINDOWS),
    "simulate": Command("produce synthetic chatbot traffic to Kafka or a file", SIMULATE),
    "explain": Command(
        "show the failing answers of a time window with the judges' rationales", EXPLAIN
    ),
    "calibrate": Command(
        "measure a judge against human labels (agreement, kappa, sensitivity, specificity)",
        CALIBRATE,
    ),
    "stream": Command(
        "run one unbounded Beam job on a distributed runner (Dataflow, Flink), publishing "
        "window ratings to a Kafka topic",
        STREAM,
        takes_config=True,
    ),
    "exporter": Command(
        "serve the window ratings of `ragpulse stream` as /metrics", EXPORTER, takes_config=True
    ),
    "review": Command(
        "serve the review page: reviewers see the items serve or stream queued for review "
        "(--review-rate) and mark each judge's verdict right or wrong; labels go to a Kafka "
        "topic",
        REVIEW_PAGE,
    ),
    "align": Command(
        "write a new prompt version of an LLM judge with few-shot examples from its "
        "reviewers' labels, and report its agreement with them before and after "
        "(cross-validated); the running prompt is not changed",
        ALIGN,
    ),
    "import-labels": Command(
        "publish human labels a team already has (MLflow traces' HUMAN assessments, or a CSV "
        "or JSON Lines of event id, judge, label) to the labels topic",
        IMPORT_LABELS,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command, generated from their flag tables (no command's
    module is imported: those that build Beam pipelines take seconds to import, which
    `ragpulse --help` and a refused flag should not pay)."""
    parser = argparse.ArgumentParser(
        prog="ragpulse",
        description="Watch the quality of a live RAG chatbot: sample its inference logs, grade "
        f"them with judges ({', '.join(JUDGE_NAMES)}) and publish windowed pass ratios to "
        "Prometheus.",
    )
    add_flags(parser, LOG_LEVEL)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, command in COMMANDS.items():
        p = sub.add_parser(
            name, help=command.help, description=command.help[0].upper() + command.help[1:] + "."
        )
        add_flags(p, command.flags)
        if command.takes_config:
            add_config_arguments(p)
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = action.choices[command]
    return sub


def _variables_of_every_command(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each RAGPULSE_ variable a flag of some command reads, with that command."""
    found: dict[str, str] = {}
    for name in COMMANDS:
        for action in config_sources._options(_subparser(parser, name)):
            found.setdefault(config_sources.env_of(action), name)
    return found


def _not_beam_import_noise(record: logging.LogRecord) -> bool:
    # Beam's GCP I/O module warns at import about clients ragpulse never uses.
    return not record.getMessage().startswith("apitools not found")


def main(argv: list[str] | None = None) -> int:
    logging.getLogger().addFilter(_not_beam_import_noise)
    words = sys.argv[1:] if argv is None else argv
    name = next((w for w in words if w in COMMANDS), None)
    parser = build_parser()
    sub = _subparser(parser, name) if name is not None else None
    takes_config = name is not None and COMMANDS[name].takes_config
    required = config_sources.relax_required(sub) if sub is not None and takes_config else []
    args = parser.parse_args(argv)
    # At DEBUG, libraries log what they carry: kafka-python every request and response (the
    # events' records, the verdicts published), the OpenAI client each request's body (the
    # prompt, unredacted when --redact-pii is off for a trusted endpoint), httpx, httpcore and
    # urllib3 the calls (380 payload lines in one serve run before issue 31). Users' text may
    # only be logged as --store-text allows, so DEBUG is ragpulse's own: every other logger,
    # named here or not, stays at INFO or above whatever --log-level says.
    requested = logging.getLevelName(args.log_level)
    logging.basicConfig(
        level=max(logging.INFO, requested),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        # Beam logs a warning on the root logger at import, which installs a WARNING-level
        # handler first; without force the INFO lines of serve (cycles, windows) are lost.
        force=True,
    )
    # Beam logs every pipeline step at INFO; kafka-python logs several ERROR lines per
    # reconnect attempt while a broker is away. ragpulse logs each failed cycle with its cause,
    # so below DEBUG they only bury it.
    logging.getLogger(_OWN_LOGGER).setLevel(requested)
    root_level = logging.getLogger().level
    logging.getLogger("apache_beam").setLevel(max(logging.WARNING, root_level))
    # The OpenAI client's HTTP library (httpx2) logs every judge call at INFO: a line per call
    # buries the cycle lines and costs CPU on the judge loop's thread.
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, root_level))
    if requested > logging.DEBUG:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        if takes_config:
            assert sub is not None and name is not None
            config_sources.apply(
                sub, words[words.index(name) + 1 :], args, required,
                every_command=lambda: _variables_of_every_command(parser),
            )
        settings = settings_from(COMMANDS[args.command].flags, args)
        if takes_config and args.print_config:  # checked like a start, then printed
            assert sub is not None
            print(config_sources.effective_config(sub, args), end="")
            return 0
        module = importlib.import_module(
            f"ragpulse.pipeline.commands.{args.command.replace('-', '_')}"
        )
        return int(module.main(settings))
    except SettingsError as exc:
        print(f"ragpulse {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
