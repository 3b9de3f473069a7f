"""Judge canaries: human-labelled golden events judged alongside production traffic.

For operators who want to know when the judges themselves drift (a new judge model, a changed
prompt, a broken endpoint). A golden set is a JSON Lines file of inference-log events in the
usual schema (see `pipeline.formats.events`) plus the human label of each judge the line is labelled
for:

    {"request_id": "canary-01", "request": "...", "response": "...",
     "retrieved_context": [...], "labels": {"groundedness": "no", "safety": "yes"}}

`ragpulse serve --canary-file FILE --canary-rate N` puts N of them per minute, in turn, into
the cycles it runs; they go through the same judge panel in the same bounded pipeline as the
traffic, but never into its counters, windows or verdict rows. Each verdict on a canary counts
once in `ragpulse_canary_verdicts_total{judge, outcome}`: `agree` (rating = label), `disagree`,
or `error` (the judge could not grade). `timestamp` is optional in a golden event.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from pathlib import Path

import orjson

from ragpulse.judges import judge_entry
from ragpulse.judges.base import Verdict
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event
from ragpulse.pipeline.metrics import catalogue
from ragpulse.pipeline.records import InferenceRecord

CANARY_VERDICTS = catalogue.CANARY_VERDICTS
CanaryOutcome = catalogue.CanaryOutcome
CANARY_OUTCOMES = catalogue.CANARY_OUTCOMES
# Golden events need no timestamp: they never enter a window. This one is only there so that
# the event parser, which requires an event time, accepts them.
_ANY_TIME = 1_000_000_000.0


class GoldenSetError(ValueError):
    """The golden-set file cannot be used; the message names the file and line."""


@dataclasses.dataclass(frozen=True, slots=True)
class CanaryEvent:
    """One golden event and its human labels, marked as a canary for the judge stage."""

    record: InferenceRecord
    labels: tuple[tuple[str, str], ...]  # (judge, "yes" | "no"), only for judges in use


def outcome(verdict: Verdict, label: str) -> CanaryOutcome:
    """How a judge's verdict on a canary compares with the human label."""
    if verdict.rating == "error":
        return "error"
    return "agree" if verdict.rating == label else "disagree"


def load_golden_set(path: Path, judges: Sequence[str]) -> list[CanaryEvent]:
    """Read and validate a golden set; labels for judges not in `judges` are left out.

    Raises GoldenSetError naming the file and line of the first bad line, or when no line is
    labelled for any judge in use.
    """
    try:
        lines = path.read_bytes().splitlines()
    except OSError as exc:
        raise GoldenSetError(f"canary file {path}: cannot read it ({exc.strerror})") from None
    canaries: list[CanaryEvent] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            canary = _parse_line(raw, judges)
        except (InvalidEvent, ValueError) as exc:
            reason = exc.reason if isinstance(exc, InvalidEvent) else str(exc)
            raise GoldenSetError(f"canary file {path}, line {number}: {reason}") from None
        if canary.labels:
            canaries.append(canary)
    if not canaries:
        raise GoldenSetError(
            f"canary file {path}: no event is labelled for the judges in use ({', '.join(judges)})"
        )
    return canaries


def _parse_line(raw: bytes, judges: Sequence[str]) -> CanaryEvent:
    record = parse_event(raw, record_time=_ANY_TIME)
    labels = orjson.loads(raw).get("labels")
    if not isinstance(labels, dict) or not labels:
        raise ValueError(
            "'labels' must be an object of judge name to \"yes\" or \"no\", "
            'e.g. {"groundedness": "no"}'
        )
    for judge, label in labels.items():
        if judge not in judges:  # a judge in use is known (a custom judge is in no table here)
            judge_entry(judge)  # ValueError: "unknown judge 'x'; known judges: ..."
        if label not in ("yes", "no"):
            raise ValueError(f"'labels.{judge}' must be \"yes\" or \"no\", not {label!r}")
    return CanaryEvent(record, tuple((j, labels[j]) for j in judges if j in labels))


class CanaryFeed:
    """Hands out golden events in turn, `per_minute` of them per minute of wall time.

    A cycle takes what has come due since the last one. At most one minute's worth (and at
    least one canary) is carried over, so a cycle after an idle hour does not judge an hour of
    canaries at once; the first cycle gets that much, so a broken judge shows at start-up.
    """

    def __init__(self, canaries: Sequence[CanaryEvent], per_minute: float, now: float) -> None:
        if not canaries:
            raise ValueError("a canary feed needs at least one canary")
        self._canaries = tuple(canaries)
        self._per_minute = per_minute
        self._cap = max(per_minute, 1.0)  # below 1 a minute, a whole canary must still come due
        self._due = self._cap
        self._last = now
        self._next = 0

    def take(self, now: float) -> list[CanaryEvent]:
        """The canaries due at `now`, in turn through the golden set."""
        elapsed = max(0.0, now - self._last)
        self._last = now
        self._due = min(self._cap, self._due + self._per_minute * elapsed / 60.0)
        n = math.floor(self._due)
        self._due -= n
        taken = [self._canaries[(self._next + i) % len(self._canaries)] for i in range(n)]
        self._next = (self._next + n) % len(self._canaries)
        return taken
