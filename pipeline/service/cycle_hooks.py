"""Test hooks: hold serve at a named phase of a cycle, so that a test can act (kill it, scrape
it) at a point it has observed instead of at a moment it guessed.

Off unless the environment variable TEST_RAGPULSE_CYCLE_HOOKS names a directory (the name is
outside the RAGPULSE_ prefix on purpose: it is no setting of ragpulse). When it does, and the
file `hold-PHASE` exists in it as the cycle reaches PHASE, serve writes `at-PHASE` (its pid and
the time.time() at which it got there, as JSON) and waits until the test removes
`hold-PHASE`. The phases, in cycle order:

- `planned`: the offset ranges are planned and some partition has records to read;
- `judged`: the graph has run over them; nothing of the cycle is saved yet;
- `saved`: the cycle's transaction is committed; the consumer group is not told yet;
- `labels`: the cycle has read labels from the labels topic (pipeline/service/labels.py) and
  published their dead letters; nothing of the cycle is saved yet;
- `labels_saved`: the cycle holding those labels is committed.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

ENV_VAR = "TEST_RAGPULSE_CYCLE_HOOKS"
PHASES = ("planned", "judged", "saved", "labels", "labels_saved")
_POLL_S = 0.01


class CycleHooks:
    """The hooks of one serve process (`from_environment`); `at(phase)` is a no-op when off."""

    def __init__(self, directory: Path | None) -> None:
        self._dir = directory

    @classmethod
    def from_environment(cls) -> CycleHooks:
        value = os.environ.get(ENV_VAR)
        return cls(Path(value) if value else None)

    def at(self, phase: str) -> None:
        """Hold here while `hold-PHASE` exists, having said so in `at-PHASE`."""
        if self._dir is None:
            return
        hold = self._dir / f"hold-{phase}"
        if not hold.exists():
            return
        marker = self._dir / f"at-{phase}"
        partial = marker.with_suffix(".partial")
        partial.write_text(json.dumps({"pid": os.getpid(), "time": time.time()}))
        partial.replace(marker)  # appears whole
        while hold.exists():
            time.sleep(_POLL_S)
