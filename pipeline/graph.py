"""One bounded Beam pipeline run: records in, windowed counts and dead letters out.

`ragpulse run` calls it once over a file; `ragpulse serve` calls it once per micro-batch over
Kafka offset ranges. The runner is Beam's FnApiRunner: bounded pipelines are what runs reliably
on this SDK's local runners (see README, "Why micro-batches").
"""

from __future__ import annotations

import base64
import dataclasses
import logging
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import apache_beam as beam
import orjson
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.worker import sdk_worker
from apache_beam.utils.windowed_value import WindowedValue

from judges import JudgeSpec
from pipeline import counting
from pipeline.service.canaries import CanaryEvent
from pipeline.sinks.verdict_rows import VERDICTS_FILE, verdict_row
from pipeline.stages import (
    COUNTER_NAMESPACE,
    LATEST_EVENT_TIME_PREFIX,
    JudgedEvent,
    JudgeEvents,
    ParseEvents,
    WindowRatings,
)
from pipeline.windows import RatingCounts, WindowKey, window_row

log = logging.getLogger(__name__)

WINDOWS_FILE = "windows.jsonl"
DEAD_LETTER_FILE = "dead_letter.jsonl"


@dataclasses.dataclass(frozen=True)
class BatchConfig:
    """How one batch is parsed, sampled, judged and windowed."""

    judges: JudgeSpec
    sample_rate: float = 1.0
    window_seconds: float = 300.0
    closed_before: float | None = None  # windows ending at or before this are final (serve)
    max_event_bytes: int = 1_048_576
    judge_batch_size: int = 256


@dataclasses.dataclass(frozen=True)
class BatchResult:
    """What one batch produced: counter increments, per-window partial counts, dead letters."""

    counts: counting.Counts
    windows: dict[WindowKey, RatingCounts]
    dead_letter_path: Path
    dead_letters: int
    latest_event_time: dict[str, float]  # per record source, of the accepted events read


def is_failing(judged: JudgedEvent) -> bool:
    """True when some judge rated the event `no` or `error`."""
    return any(v.rating != "yes" for v in judged.verdicts)


def _json_line(row: dict[str, Any]) -> str:
    return orjson.dumps(row).decode()


def _dead_letter_line(keep_raw: bool) -> Callable[[Any], str]:
    def fmt(letter: Any) -> str:
        row, raw = letter
        if keep_raw:
            row = {**row, "raw_b64": base64.b64encode(raw).decode()}
        return _json_line(row)

    return fmt


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


def _write(path: Path) -> beam.io.WriteToText:
    return beam.io.WriteToText(str(path), shard_name_template="", num_shards=1)


def run_batch(
    read: Callable[[beam.Pipeline], Any],
    config: BatchConfig,
    out_dir: Path,
    *,
    write_verdicts: bool = True,
    only_failing_verdicts: bool = False,
    keep_raw_dead_letters: bool = False,
    canaries: Sequence[CanaryEvent] = (),
) -> BatchResult:
    """Run one bounded pipeline; `read(pipeline)` returns the PCollection of `SourceRecord`s.

    Writes `windows.jsonl`, `dead_letter.jsonl` and (optionally) `verdicts.jsonl` into `out_dir`
    and returns their content in a form the caller can merge or persist. With
    `only_failing_verdicts`, `verdicts.jsonl` holds only events some judge rated no or error.
    With `keep_raw_dead_letters` each dead-letter row also carries the whole record (`raw_b64`),
    for re-publishing it to a dead-letter topic. `canaries` are judged with the events and
    counted only in `ragpulse_canary_verdicts_total` (see `pipeline.service.canaries`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    options = PipelineOptions(["--direct_num_workers=1"])
    with beam.Pipeline(runner=FnApiRunner(), options=options) as p:
        parsed = read(p) | "ParseEvents" >> ParseEvents(
            sample_rate=config.sample_rate,
            window_size=config.window_seconds,
            closed_before=config.closed_before,
            max_bytes=config.max_event_bytes,
        )
        _ = (
            parsed[ParseEvents.DEAD_LETTER]
            | "FormatDeadLetters" >> beam.Map(_dead_letter_line(keep_raw_dead_letters))
            | "WriteDeadLetters" >> _write(out_dir / DEAD_LETTER_FILE)
        )
        to_judge = parsed.events
        if canaries:
            to_judge = (
                to_judge,
                p | "GoldenCanaries" >> beam.Create(list(canaries)),
            ) | "WithCanaries" >> beam.Flatten()
        judged = to_judge | "JudgeEvents" >> JudgeEvents(
            config.judges, batch_size=config.judge_batch_size
        )
        if write_verdicts:
            to_write = (
                judged | "KeepFailing" >> beam.Filter(is_failing)
                if only_failing_verdicts
                else judged
            )
            _ = (
                to_write
                | "FormatVerdicts"
                >> beam.Map(lambda j: _json_line(verdict_row(j, config.judges.text_policy)))
                | "JoinVerdictLines" >> beam.ParDo(_JoinLines())
                | "WriteVerdicts" >> _write(out_dir / VERDICTS_FILE)
            )
        _ = (
            judged
            | "WindowRatings" >> WindowRatings(window_size=config.window_seconds, bounded=True)
            | "FormatWindows" >> beam.MapTuple(lambda k, c: _json_line(window_row(k, c)))
            | "WriteWindows" >> _write(out_dir / WINDOWS_FILE)
        )
    query = p.result.metrics().query(beam.metrics.MetricsFilter().with_namespace(COUNTER_NAMESPACE))
    counts = counting.merge(
        (counting.decode(c.key.metric.name), c.committed) for c in query["counters"]
    )
    _forget_counter_names()
    latest = {
        d.key.metric.name.removeprefix(LATEST_EVENT_TIME_PREFIX): d.committed.max / 1000
        for d in query["distributions"]
        if d.key.metric.name.startswith(LATEST_EVENT_TIME_PREFIX) and d.committed.count
    }
    windows = read_windows(out_dir / WINDOWS_FILE)
    dead = counts[counting.key("ragpulse_dead_letters_total")]
    return BatchResult(counts, windows, out_dir / DEAD_LETTER_FILE, dead, latest)


def _forget_counter_names() -> None:
    """Drop the counter names Beam's in-process SDK worker has cached, once the batch is read.

    Beam keeps every metric name it has ever seen in a process-wide `SHORT_ID_CACHE`, never
    evicted; counter names carry the app and model labels, so each new value grew `serve` by
    ~2.5 KB per counter for good (12 MB per 1,000 new apps). Batches run one after another, and
    a finished batch's short ids are never looked up again.
    """
    sdk_worker.SHORT_ID_CACHE = sdk_worker.ShortIdCache()


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def read_windows(path: Path) -> dict[WindowKey, RatingCounts]:
    """Window counts from a `windows.jsonl` file, partial rows of one window summed."""
    windows: dict[WindowKey, RatingCounts] = {}
    with path.open("rb") as f:
        for line in f:
            row = orjson.loads(line)
            key = WindowKey(
                _epoch(row["window_start"]),
                _epoch(row["window_end"]),
                row["judge"],
                row["app"],
                row["model"],
            )
            counts = RatingCounts(row["yes"], row["no"], row["error"])
            windows[key] = windows.get(key, RatingCounts()) + counts
    return windows
