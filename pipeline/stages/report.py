"""Window counts, session-window counts and the latest failing event of each series, reported
as Beam metrics (distributions named by an encoded window key) for the program that ran the graph
(pipeline.graphs.bounded.decode_metrics)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
import orjson
from apache_beam.metrics import Metrics

from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import (
    JudgedEvent,
)
from ragpulse.pipeline.stages.sessions import SessionKey, session_key
from ragpulse.pipeline.stages.windows import ratings_by_judge
from ragpulse.pipeline.windows import (
    RatingCounts,
    WindowKey,
    decode_window,
    encode_window,
    window_start,
)

WINDOW_NAMESPACE = "ragpulse.windows"


class _ReportWindow(beam.DoFn):
    """Hands each window's counts to the caller as Beam counters (yes, no, error, scored,
    score_milli: the fields of `RatingCounts`).

    Beam's metric results are how small aggregates get from the workers (in this process or
    others) back to the program that ran the pipeline, without a file in between.
    """

    def process(self, element: tuple[WindowKey, RatingCounts]) -> None:
        key, counts = element
        for field in _WINDOW_FIELDS:
            n = getattr(counts, field)
            if n:
                Metrics.counter(WINDOW_NAMESPACE, encode_window(key, field)).inc(n)


_WINDOW_FIELDS = tuple(f.name for f in dataclasses.fields(RatingCounts))


class ReportWindows(beam.PTransform):
    """The sink of window counts: Beam counters the caller reads (`pipeline.graphs.bounded`)."""

    def expand(self, windows: Any) -> Any:
        return windows | "CountersPerWindow" >> beam.ParDo(_ReportWindow())


SESSION_WINDOW_NAMESPACE = "ragpulse.session_windows"


class _ReportSessionWindow(beam.DoFn):
    """Each judged session's own counts per window, as Beam counters (serve keeps them with the
    session, to take them back out of the windows if a late turn re-opens it)."""

    def __init__(self, window_size: float) -> None:
        self._size = window_size

    def process(self, judged: JudgedEvent) -> None:
        session = judged.record.session
        if session is None:
            return
        start = window_start(judged.record.event_time, self._size)
        for (judge, version, app, model), (rating, score) in ratings_by_judge(judged):
            key = WindowKey(start, start + self._size, judge, app, model, version)
            fields = [(rating, 1)] if score is None else [
                (rating, 1), ("scored", 1), ("score_milli", score)
            ]
            for field, n in fields:
                Metrics.counter(
                    SESSION_WINDOW_NAMESPACE,
                    encode_session_window(session_key(session), key, field),
                ).inc(n)


def encode_session_window(session: SessionKey, key: WindowKey, rating: str) -> str:
    """The Beam counter name of one judged session's count of `rating` in one window."""
    return orjson.dumps([list(session), encode_window(key, rating)]).decode()


def decode_session_window(name: str) -> tuple[SessionKey, WindowKey, str]:
    """Inverse of `encode_session_window`."""
    (app, session_id, end), window = orjson.loads(name)
    key, rating = decode_window(window)
    return (app, session_id, float(end)), key, rating


class ReportSessionWindows(beam.PTransform):
    """serve: the judged sessions' counts per window, each session apart (Beam counters)."""

    def __init__(self, window_size: float) -> None:
        super().__init__()
        self._size = window_size

    def expand(self, judged: Any) -> Any:
        return judged | "CountersPerSession" >> beam.ParDo(_ReportSessionWindow(self._size))


EXEMPLAR_NAMESPACE = "ragpulse.exemplars"


def _failing_series(
    judged: JudgedEvent,
) -> Iterator[tuple[counting.CounterKey, tuple[float, str]]]:
    """(verdict counter key, (event time, request_id)) for each `no` or `error` verdict."""
    record = judged.record
    if len(record.request_id) > counting.MAX_EXEMPLAR_REQUEST_ID_CHARS:
        return
    for v, version in judged.versioned():
        if v.rating in ("no", "error"):
            k = counting.key(
                counting.VERDICTS,
                judge=v.judge,
                version=version,
                rating=v.rating,
                app=record.app,
                model=record.model,
            )
            yield k, (record.event_time, record.request_id)


def _report_exemplar(element: tuple[counting.CounterKey, tuple[float, str]]) -> None:
    k, (event_time, request_id) = element
    Metrics.string_set(EXEMPLAR_NAMESPACE, counting.encode(k)).add(
        orjson.dumps([event_time, request_id]).decode()
    )


class ReportLatestFailing(beam.PTransform):
    """The latest failing answer (by event time; ties to the greater request_id) of each
    `ragpulse_judge_verdicts_total` series, for its exemplar; handed to the caller as one
    Beam string-set entry per series."""

    def expand(self, judged: Any) -> Any:
        return (
            judged
            | "FailingSeries" >> beam.FlatMap(_failing_series)
            | "LatestPerSeries" >> beam.CombinePerKey(max)
            | "Report" >> beam.Map(_report_exemplar)
        )
