"""The rating row: one pane of one window's ratings, as `ragpulse stream` publishes it to the
ratings topic and `ragpulse exporter` reads it back.

A row is the `windows.jsonl` row of `ragpulse run` (`pipeline.windows.window_row`: counts,
percentage, Wilson interval) plus which pane it is: `pane` is `early` (the window is still open;
a processing-time firing), `on_time` (the watermark passed the window's end) or `late` (a late
event arrived within the allowed lateness), and `pane_index` counts the window's panes from 0.
Panes accumulate: each row holds the window's whole count so far, so a later pane replaces an
earlier one and a row read twice changes nothing.

The Kafka key is the window's identity (start, judge, app, model): every pane of a window lands
on the same partition, in order, and a compacted ratings topic keeps each window's latest pane.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Literal, get_args

import orjson

from ragpulse.pipeline.formats.events import MAX_LABEL_CHARS
from ragpulse.pipeline.windows import RatingCounts, WindowKey, window_row

PaneTiming = Literal["early", "on_time", "late"]
PANE_TIMINGS: tuple[PaneTiming, ...] = get_args(PaneTiming)
# The stream fires an early pane at most once a second while a window is open, and a late one
# per late bundle within the allowed lateness: a million panes is over eleven days of early
# panes. A larger index is a forged or corrupt row, which would otherwise outrank every real
# pane of its window until the window is folded.
MAX_PANE_INDEX = 1_000_000


# The fields of a row that are WindowKey's label values, and those that are RatingCounts'.
_LABELS = ("judge", "app", "model", "version")
_COUNTS = tuple(field.name for field in dataclasses.fields(RatingCounts))


class InvalidRatingRow(ValueError):
    """A ratings-topic record that is not a rating row; the message says what is wrong."""


@dataclasses.dataclass(frozen=True, slots=True)
class RatingPane:
    """One pane of one window's ratings (counts accumulated over the window's panes so far)."""

    key: WindowKey
    counts: RatingCounts
    timing: PaneTiming
    index: int

    @property
    def complete(self) -> bool:
        """Whether the watermark has passed the window's end (the pane is on time or late)."""
        return self.timing != "early"


def encode(pane: RatingPane) -> tuple[bytes, bytes]:
    """(Kafka key, value) of a pane."""
    k = pane.key
    row = {
        **window_row(k, pane.counts),
        # Exact, unlike score_mean: the exporter adds it to ragpulse_judge_score_sum.
        "score_milli": pane.counts.score_milli,
        "pane": pane.timing,
        "pane_index": pane.index,
    }
    return orjson.dumps([k.window_start, k.judge, k.version, k.app, k.model]), orjson.dumps(row)


def decode(value: bytes) -> RatingPane:
    """The pane a ratings-topic value holds; InvalidRatingRow says what is wrong."""
    try:
        row = orjson.loads(value)
        key = WindowKey(
            _epoch(row["window_start"]),
            _epoch(row["window_end"]),
            **{label: _text(row[label]) for label in _LABELS},
        )
        counts = RatingCounts(**{name: _count(row[name]) for name in _COUNTS})
        timing, index = row["pane"], _count(row["pane_index"])
    except orjson.JSONDecodeError as exc:
        raise InvalidRatingRow(f"not JSON: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise InvalidRatingRow(f"not a rating row: missing or mistyped {exc}") from None
    if timing not in PANE_TIMINGS:
        raise InvalidRatingRow(f"pane must be one of {', '.join(PANE_TIMINGS)}, got {timing!r}")
    if key.window_end <= key.window_start:
        raise InvalidRatingRow("window_end is not after window_start")
    if index > MAX_PANE_INDEX:
        raise InvalidRatingRow(f"pane_index {index} is over {MAX_PANE_INDEX:,}")
    for label in _LABELS:
        if len(getattr(key, label)) > MAX_LABEL_CHARS:
            raise InvalidRatingRow(
                f"{label} is {len(getattr(key, label)):,} characters, over the "
                f"{MAX_LABEL_CHARS}-character limit of label values"
            )
    return RatingPane(key, counts, timing, index)


def _epoch(text: object) -> float:
    if not isinstance(text, str):
        raise TypeError("window bound (an ISO 8601 time)")
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise TypeError(f"window bound {text!r} (an ISO 8601 time)") from None


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"label {value!r} (a string)")
    return value


def _count(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise TypeError(f"count {value!r} (an integer >= 0)")
    return value
