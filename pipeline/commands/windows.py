"""`ragpulse windows`: the window aggregates `ragpulse serve` saved, as JSON lines.

Rows have the `windows.jsonl` format of `ragpulse run` plus `complete`. Reads only the state
file, so it neither needs nor loads Beam.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

import orjson

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.service.state import StateError, StateStore


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state", type=Path, required=True, help="the state file of `ragpulse serve`")
    p.add_argument("--judge", default=None, help="only this judge")
    p.add_argument(
        "--since",
        default=None,
        metavar="TIME",
        help="only windows starting at or after TIME (ISO 8601, or epoch seconds)",
    )


def main(args: argparse.Namespace) -> int:
    if not os.path.lexists(args.state):
        raise SettingsError(f"state file not found: {args.state}")
    since = None if args.since is None else parse_time(args.since)
    try:
        state = StateStore(args.state)
    except StateError as exc:
        raise SettingsError(str(exc)) from None
    with state:
        for row in state.windows(judge=args.judge, since=since):
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
    return 0


def parse_time(text: str, flag: str = "--since") -> float:
    """Epoch seconds from epoch seconds or ISO 8601 text (no zone means UTC); `flag` names the
    option in the error."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise SettingsError(f"{flag} {text!r} is neither ISO 8601 nor epoch seconds") from None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
