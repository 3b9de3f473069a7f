"""`ragpulse windows`: the window aggregates `ragpulse serve` saved, as JSON lines.

Rows have the `windows.jsonl` format of `ragpulse run` plus `complete`. Reads only the state
file, so it neither needs nor loads Beam.
"""

from __future__ import annotations

import sys

import orjson

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.service.state import StateError, StateStore
from ragpulse.pipeline.settings.models import WindowsSettings


def main(settings: WindowsSettings) -> int:
    try:
        state = StateStore(settings.state)
    except StateError as exc:
        raise SettingsError(str(exc)) from None
    with state:
        for row in state.windows(judge=settings.judge, since=settings.since):
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
    return 0
