"""The Beam stages that take raw inference-log records to windowed rating counts.

One composite transform per stage, in the order an event travels:

    SourceRecord --ParseEvents--> InferenceRecord --JudgeEvents--> JudgedEvent
        |                                                              |
        +--> dead letters (invalid or late)          WindowRatings --> (WindowKey, RatingCounts)

Counts that become Prometheus counters leave the workers as Beam counters (see `pipeline.stats`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import Duration

from judges import JudgeSpec
from judges.base import RATINGS, Verdict
from pipeline import stats
from pipeline.events import InferenceRecord, InvalidEvent, dead_letter, parse_event
from pipeline.sampling import is_sampled
from pipeline.windows import RatingCounts, WindowKey, isoformat_utc, window_start

COUNTER_NAMESPACE = "ragpulse"


@dataclasses.dataclass(frozen=True, slots=True)
class SourceRecord:
    """One raw record as a reader found it, with where it came from for dead-letter rows."""

    raw: bytes
    source: str  # a file path, or "topic/partition"
    position: int  # 1-based line number, or Kafka offset
    record_time: float | None = None  # Kafka record time (epoch seconds), used without `timestamp`
    oversize_bytes: int | None = None  # set when the reader refused to load an over-long record


@dataclasses.dataclass(frozen=True, slots=True)
class JudgedEvent:
    """An event and one verdict per judge of the panel."""

    record: InferenceRecord
    verdicts: tuple[Verdict, ...]


class _Counters:
    """Beam counters created on first use, named by `pipeline.stats.encode`."""

    def __init__(self) -> None:
        self._cache: dict[stats.CounterKey, Any] = {}

    def inc(self, counter_key: stats.CounterKey, n: int = 1) -> None:
        counter = self._cache.get(counter_key)
        if counter is None:
            counter = Metrics.counter(COUNTER_NAMESPACE, stats.encode(counter_key))
            self._cache[counter_key] = counter
        counter.inc(n)


EVENTS_ACCEPTED = stats.key("ragpulse_events_total", outcome="accepted")
EVENTS_INVALID = stats.key("ragpulse_events_total", outcome="invalid")
EVENTS_SAMPLED = stats.key("ragpulse_events_sampled_total")
LATE_EVENTS = stats.key("ragpulse_late_events_total")
DEAD_LETTERS = stats.key("ragpulse_dead_letters_total")
LATEST_EVENT_TIME_PREFIX = "event_time_ms:"


class _ParseAndSample(beam.DoFn):
    def __init__(
        self,
        sample_rate: float,
        window_size: float,
        closed_before: float | None,
        max_bytes: int,
    ) -> None:
        self._sample_rate = sample_rate
        self._window_size = window_size
        self._closed_before = closed_before
        self._max_bytes = max_bytes

    def setup(self) -> None:
        self._counters = _Counters()
        self._latest_by_source: dict[str, Any] = {}

    def _latest(self, source: str) -> Any:
        """Distribution of event times per source; its max feeds `serve`'s watermark."""
        dist = self._latest_by_source.get(source)
        if dist is None:
            dist = Metrics.distribution(COUNTER_NAMESPACE, LATEST_EVENT_TIME_PREFIX + source)
            self._latest_by_source[source] = dist
        return dist

    def _reject(self, record: SourceRecord, reason: str, *, late: bool = False) -> Any:
        self._counters.inc(LATE_EVENTS if late else EVENTS_INVALID)
        self._counters.inc(DEAD_LETTERS)
        row = dead_letter(record.raw, source=record.source, position=record.position, reason=reason)
        return beam.pvalue.TaggedOutput(ParseEvents.DEAD_LETTER, (row, record.raw))

    def process(self, record: SourceRecord) -> Iterator[Any]:
        if record.oversize_bytes is not None:
            yield self._reject(
                record,
                f"record is {record.oversize_bytes} bytes, over the {self._max_bytes}-byte limit",
            )
            return
        try:
            event = parse_event(
                record.raw, record_time=record.record_time, max_bytes=self._max_bytes
            )
        except InvalidEvent as exc:
            yield self._reject(record, exc.reason)
            return
        self._counters.inc(EVENTS_ACCEPTED)
        self._latest(record.source).update(round(event.event_time * 1000))
        if self._closed_before is not None:
            end = window_start(event.event_time, self._window_size) + self._window_size
            if end <= self._closed_before:
                yield self._reject(
                    record,
                    f"late event: its window ending {isoformat_utc(end)} was already closed "
                    f"(windows ending at or before {isoformat_utc(self._closed_before)} are final)",
                    late=True,
                )
                return
        if is_sampled(event.request_id, self._sample_rate):
            self._counters.inc(EVENTS_SAMPLED)
            yield event


class ParseEvents(beam.PTransform):
    """Parses, validates and samples records.

    The main output holds sampled `InferenceRecord`s; the `dead_letter` output holds
    (row, raw bytes) with its reason for every record that was invalid, or late for a window
    already closed (`closed_before`, set by `serve`; a file run has no closed windows).
    """

    DEAD_LETTER = "dead_letter"

    def __init__(
        self,
        *,
        sample_rate: float,
        window_size: float,
        closed_before: float | None = None,
        max_bytes: int = 1_048_576,
    ) -> None:
        super().__init__()
        self._fn = _ParseAndSample(sample_rate, window_size, closed_before, max_bytes)

    def expand(self, records: Any) -> Any:
        return records | "ParseAndSample" >> beam.ParDo(self._fn).with_outputs(
            self.DEAD_LETTER, main="events"
        )


class _JudgeBatch(beam.DoFn):
    def __init__(self, spec: JudgeSpec) -> None:
        self._spec = spec

    def setup(self) -> None:
        self._panel = self._spec.build()
        self._counters = _Counters()

    def process(self, batch: list[InferenceRecord]) -> Iterator[JudgedEvent]:
        all_verdicts = self._panel.judge_batch([event.judge_input for event in batch])
        for event, verdicts in zip(batch, all_verdicts, strict=True):
            self._count(event, verdicts)
            yield JudgedEvent(event, verdicts)

    def _count(self, event: InferenceRecord, verdicts: tuple[Verdict, ...]) -> None:
        inc = self._counters.inc
        app, model = event.app, event.model
        inc(stats.key("ragpulse_events_judged_total", app=app, model=model))
        chunks = len(event.judge_input.chunks)
        if chunks:
            inc(stats.key("ragpulse_retrieved_chunks_total", app=app, model=model), chunks)
        else:
            inc(stats.key("ragpulse_events_without_context_total", app=app, model=model))
        for v in verdicts:
            inc(
                stats.key(
                    "ragpulse_judge_verdicts_total",
                    judge=v.judge,
                    rating=v.rating,
                    app=app,
                    model=model,
                )
            )
            inc(stats.key("ragpulse_judge_calls_total", judge=v.judge, backend=self._spec.backend))
            if v.error_cause is not None:
                inc(stats.key("ragpulse_judge_errors_total", judge=v.judge, cause=v.error_cause))
            if v.prompt_tokens:
                inc(
                    stats.key("ragpulse_judge_tokens_total", judge=v.judge, kind="prompt"),
                    v.prompt_tokens,
                )
            if v.completion_tokens:
                inc(
                    stats.key("ragpulse_judge_tokens_total", judge=v.judge, kind="completion"),
                    v.completion_tokens,
                )
            le = stats.latency_bucket(v.latency_seconds)
            inc(stats.key(stats.LATENCY_BUCKET, judge=v.judge, le=le))
            inc(stats.key(stats.LATENCY_COUNT, judge=v.judge))
            inc(stats.key(stats.LATENCY_SUM_US, judge=v.judge), round(v.latency_seconds * 1e6))

    def teardown(self) -> None:
        panel = getattr(self, "_panel", None)
        if panel is not None:
            panel.close()


class JudgeEvents(beam.PTransform):
    """Runs the judge panel over sampled events, in batches so LLM calls overlap."""

    def __init__(self, spec: JudgeSpec, *, batch_size: int) -> None:
        super().__init__()
        self._spec = spec
        self._batch_size = batch_size

    def expand(self, events: Any) -> Any:
        return (
            events
            | "BatchForJudges"
            >> beam.BatchElements(min_batch_size=self._batch_size, max_batch_size=self._batch_size)
            | "Judge" >> beam.ParDo(_JudgeBatch(self._spec))
        )


def ratings_by_judge(judged: JudgedEvent) -> Iterable[tuple[tuple[str, str, str], str]]:
    """((judge, app, model), rating) for each verdict of a judged event."""
    app, model = judged.record.app, judged.record.model
    return [((v.judge, app, model), v.rating) for v in judged.verdicts]


class CountRatings(beam.CombineFn):
    """Counts yes / no / error ratings; partial counts add up (`RatingCounts.__add__`)."""

    def create_accumulator(self) -> list[int]:
        return [0, 0, 0]

    def add_input(self, acc: list[int], rating: str) -> list[int]:
        acc[RATINGS.index(rating)] += 1
        return acc

    def merge_accumulators(self, accs: Iterable[list[int]]) -> list[int]:
        total = [0, 0, 0]
        for acc in accs:
            for i in range(3):
                total[i] += acc[i]
        return total

    def extract_output(self, acc: list[int]) -> RatingCounts:
        return RatingCounts(*acc)


class _KeyByWindow(beam.DoFn):
    def process(
        self,
        element: tuple[tuple[str, str, str], RatingCounts],
        win: Any = beam.DoFn.WindowParam,
    ) -> Iterator[tuple[WindowKey, RatingCounts]]:
        (judge, app, model), counts = element
        yield WindowKey(float(win.start), float(win.end), judge, app, model), counts


class WindowRatings(beam.PTransform):
    """Counts ratings per (event-time fixed window, judge, app, model).

    Every pane is a partial count (discarding mode): an on-time pane, then one pane per late
    element within `allowed_lateness`. Partials of the same window add up to what one pass over
    all its events gives, which is what lets `serve` merge cycles.
    """

    def __init__(self, *, window_size: float, allowed_lateness: float = 0.0) -> None:
        super().__init__()
        self._size = window_size
        self._lateness = allowed_lateness

    def expand(self, judged: Any) -> Any:
        return (
            judged
            | "StampEventTime"
            >> beam.Map(lambda j: window.TimestampedValue(j, j.record.event_time))
            | "FixedWindows"
            >> beam.WindowInto(
                window.FixedWindows(self._size),
                trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                allowed_lateness=Duration(micros=round(self._lateness * 1e6)),
                accumulation_mode=trigger.AccumulationMode.DISCARDING,
            )
            | "RatingPerJudge" >> beam.FlatMap(ratings_by_judge)
            | "CountRatings" >> beam.CombinePerKey(CountRatings())
            | "KeyByWindow" >> beam.ParDo(_KeyByWindow())
        )
