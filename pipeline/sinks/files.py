"""File sinks of the graph: the outputs `ragpulse run` writes into its output directory.

    verdicts.jsonl     one verdict row per judged event (`pipeline.formats.verdict_rows`)
    windows.jsonl      counts, pass ratio and its Wilson interval per window, judge, app, model
                       (and the corrected pass ratio of judges given --judge-calibration)
    dead_letter.jsonl  every line that was not judged, with where it was and why

(metrics.prom, the fourth output, is written from the run's result by `pipeline.metrics.collector`.)
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import apache_beam as beam
import orjson
from apache_beam.utils.windowed_value import WindowedValue

from ragpulse.judges import TextPolicy
from ragpulse.pipeline.calibration import JudgeCalibration, corrected_fields
from ragpulse.pipeline.composite import composite_transform
from ragpulse.pipeline.formats.events import dead_letter
from ragpulse.pipeline.formats.verdict_rows import verdict_row
from ragpulse.pipeline.records import Rejected
from ragpulse.pipeline.sinks import DEAD_LETTER_FILE, VERDICTS_FILE, WINDOWS_FILE
from ragpulse.pipeline.windows import RatingCounts, WindowKey, window_row


def _json_line(row: dict[str, Any]) -> str:
    return orjson.dumps(row).decode()


def dead_letter_line(rejected: Rejected) -> str:
    """The dead_letter.jsonl row of a rejected record."""
    record = rejected.record
    row = dead_letter(
        record.raw, source=record.source, position=record.position, reason=rejected.reason
    )
    if record.oversize_bytes is not None:  # `raw` is only the head the reader kept
        row = {**row, "raw_bytes": record.oversize_bytes, "raw_truncated": True}
    return _json_line(row)


class _JoinLines(beam.DoFn):
    """Joins text lines of the global window into newline-separated blocks of `max_lines`.

    `WriteToText` writes a block as the same lines, but its per-element cost (a shard key, a
    re-windowing and a shuffle write and read for each element) is paid once per block
    instead of once per verdict (see tests/bench/bench_pipeline.py).
    """

    def __init__(self, max_lines: int = 1000) -> None:
        self._max_lines = max_lines

    def start_bundle(self) -> None:
        self._lines: list[str] = []

    def process(self, line: str) -> Iterator[str]:
        self._lines.append(line)
        if len(self._lines) >= self._max_lines:
            yield "\n".join(self._lines)
            self._lines = []

    def finish_bundle(self) -> Iterator[WindowedValue]:
        if self._lines:
            yield beam.transforms.window.GlobalWindows.windowed_value("\n".join(self._lines))
            self._lines = []


@composite_transform
def WriteLines(lines: Any, path: Path) -> Any:
    """Writes text lines to one file (`path`, no shard suffix)."""
    return (
        lines
        | "JoinLines" >> beam.ParDo(_JoinLines())
        | "Write" >> beam.io.WriteToText(str(path), shard_name_template="", num_shards=1)
    )


@composite_transform
def WriteDeadLetters(rejected: Any, out_dir: Path) -> Any:
    """Sink: `Rejected` records as dead_letter.jsonl rows."""
    return (
        rejected
        | "Format" >> beam.Map(dead_letter_line)
        | "WriteLines" >> WriteLines(out_dir / DEAD_LETTER_FILE)
    )


@composite_transform
def WriteVerdicts(judged: Any, out_dir: Path, policy: TextPolicy) -> Any:
    """Sink: `JudgedEvent`s as verdicts.jsonl rows, text kept as `policy` says."""
    return (
        judged
        | "Format" >> beam.Map(lambda j: _json_line(verdict_row(j, policy)))
        | "WriteLines" >> WriteLines(out_dir / VERDICTS_FILE)
    )


@composite_transform
def WriteWindows(
    windows: Any, out_dir: Path, calibrations: Mapping[str, JudgeCalibration] | None = None
) -> Any:
    """Sink: (WindowKey, RatingCounts) rows as windows.jsonl; the rows of a judge in
    `calibrations` (--judge-calibration) also hold its corrected pass ratio."""
    by_judge = dict(calibrations or {})

    def row(key: WindowKey, counts: RatingCounts) -> str:
        extra = corrected_fields(key.judge, counts.yes, counts.graded, by_judge)
        return _json_line({**window_row(key, counts), **extra})

    return (
        windows
        | "Format" >> beam.MapTuple(row)
        | "WriteLines" >> WriteLines(out_dir / WINDOWS_FILE)
    )
