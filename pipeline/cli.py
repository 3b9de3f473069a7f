"""The `ragpulse` command: run (a file), serve (a Kafka topic), windows (read state), simulate,
explain (the failing answers of a window), calibrate (a judge against human labels), stream
(one unbounded Beam job) and exporter (its ratings as /metrics)."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ragpulse.judges.registry import JUDGE_NAMES
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.settings import sources as config_sources
from ragpulse.pipeline.settings.command_flags import LOG_LEVEL
from ragpulse.pipeline.settings.flags import add_flags

# Beam warns at import, before logging is configured (so on stderr, bare), that its Google Cloud
# Storage filesystem cannot load when a `google.cloud` namespace exists without the storage
# client. ragpulse reads local files and Kafka only; the line would break every one-line error.
logging.getLogger("apache_beam.io.filesystems").setLevel(logging.ERROR)

COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("run", "judge a file of inference-log events and write windowed ratings"),
    "serve": ("serve", "watch a Kafka topic continuously and serve /metrics"),
    "windows": ("windows", "print the window aggregates saved by serve, as JSON lines"),
    "simulate": ("simulate", "produce synthetic chatbot traffic to Kafka or a file"),
    "explain": (
        "explain",
        "show the failing answers of a time window with the judges' rationales",
    ),
    "calibrate": (
        "calibrate",
        "measure a judge against human labels (agreement, kappa, sensitivity, specificity)",
    ),
    "stream": (
        "stream",
        "run one unbounded Beam job on a distributed runner (Dataflow, Flink), publishing "
        "window ratings to a Kafka topic",
    ),
    "exporter": ("exporter", "serve the window ratings of `ragpulse stream` as /metrics"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser; with `command`, only that subcommand's module is imported.

    Importing a module that builds Beam pipelines takes seconds, which `ragpulse --help` and
    `ragpulse windows` should not pay.
    """
    parser = argparse.ArgumentParser(
        prog="ragpulse",
        description="Watch the quality of a live RAG chatbot: sample its inference logs, grade "
        f"them with judges ({', '.join(JUDGE_NAMES)}) and publish windowed pass ratios to "
        "Prometheus.",
    )
    add_flags(parser, LOG_LEVEL)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(
            name, help=help_text, description=help_text[0].upper() + help_text[1:] + "."
        )
        if command is None or name == command:
            module = importlib.import_module(f"ragpulse.pipeline.commands.{module_name}")
            module.configure_parser(p)
            p.set_defaults(_main=module.main, _settings=getattr(module, "settings_from_args", None))
    return parser


def _subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = action.choices[command]
    return sub


def _variables_of_every_command() -> dict[str, str]:
    """Each RAGPULSE_ variable a flag of some command reads, with that command (this imports
    every command's module: only asked when a variable is not the running command's)."""
    parser = build_parser()
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
    command = next((w for w in words if w in COMMANDS), None)
    parser = build_parser(command)
    sub = _subparser(parser, command) if command is not None else None
    takes_config = sub is not None and any(a.dest == "config" for a in sub._actions)
    required = config_sources.relax_required(sub) if sub is not None and takes_config else []
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        # Beam logs a warning on the root logger at import, which installs a WARNING-level
        # handler first; without force the INFO lines of serve (cycles, windows) are lost.
        force=True,
    )
    # Beam logs every pipeline step at INFO; kafka-python logs several ERROR lines per
    # reconnect attempt while a broker is away. ragpulse logs each failed cycle with its cause,
    # so below DEBUG they only bury it.
    root_level = logging.getLogger().level
    logging.getLogger("apache_beam").setLevel(max(logging.WARNING, root_level))
    # The OpenAI client's HTTP library (httpx2) logs every judge call at INFO: a line per call
    # buries the cycle lines and costs CPU on the judge loop's thread.
    logging.getLogger("httpx2").setLevel(max(logging.WARNING, root_level))
    if root_level > logging.DEBUG:
        logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        if takes_config:
            assert sub is not None and command is not None
            config_sources.apply(
                sub, words[words.index(command) + 1 :], args, required,
                every_command=_variables_of_every_command,
            )
            if args.print_config:
                args._settings(args)  # checked like a start, then printed
                print(config_sources.effective_config(sub, args), end="")
                return 0
        return int(args._main(args))
    except SettingsError as exc:
        print(f"ragpulse {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
