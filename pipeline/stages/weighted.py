"""Weighted window ratings: the summed sample weights of each rating per event-time window.

The stage beside `pipeline.stages.windows.WindowRatings` when sampling is stratified or governed by
a judge budget (`pipeline.costs.sampling`): the same windows and keys, but each verdict counts for
its event's weight (1 / the rate it was sampled at), so yes / (yes + no) estimates the window's
pass ratio in all traffic rather than in the judged sample. The sums leave the workers as Beam
counters in millionths (`WEIGHTED_WINDOW_NAMESPACE`), which `pipeline.graphs.bounded` decodes into
`GraphResult.weighted_windows`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import apache_beam as beam
import orjson
from apache_beam.metrics import Metrics
from apache_beam.transforms import window

from ragpulse.pipeline.costs.sampling import MICRO, WeightedCounts, to_micros
from ragpulse.pipeline.windows import WindowKey

WEIGHTED_WINDOW_NAMESPACE = "ragpulse.weighted_windows"


def _weighted_ratings(judged: Any) -> Iterable[tuple[tuple[str, str, str, str, str], int]]:
    """((judge, version, app, model, rating), weight in millionths) for each verdict of a
    judged event."""
    record = judged.record
    micros = to_micros(record.weight)
    return [
        ((v.judge, version, record.app, record.model, v.rating), micros)
        for v, version in judged.versioned()
        if v.rating != "skipped"  # the judge did not run on this event: nothing to weigh
    ]


class _ReportWeightedWindow(beam.DoFn):
    def process(
        self,
        element: tuple[tuple[str, str, str, str, str], int],
        win: Any = beam.DoFn.WindowParam,
    ) -> None:
        (judge, version, app, model, rating), micros = element
        name = orjson.dumps([float(win.start), float(win.end), judge, version, app, model, rating])
        Metrics.counter(WEIGHTED_WINDOW_NAMESPACE, name.decode()).inc(micros)


def decode_weighted_window(name: str, micros: int) -> tuple[WindowKey, WeightedCounts]:
    """The window and weighted count of one counter of `WEIGHTED_WINDOW_NAMESPACE`."""
    start, end, judge, version, app, model, rating = orjson.loads(name)
    key = WindowKey(float(start), float(end), judge, app, model, version)
    return key, WeightedCounts(**{rating: micros / MICRO})


class ReportWeightedWindows(beam.PTransform):
    """Sums the weights of each rating per (event-time window, judge, app, model) and hands
    the sums to the caller as Beam counters."""

    def __init__(self, *, window_size: float) -> None:
        super().__init__()
        self._size = window_size

    def expand(self, judged: Any) -> Any:
        return (
            judged
            | "StampEventTime"
            >> beam.Map(lambda j: window.TimestampedValue(j, j.record.event_time))
            | "FixedWindows" >> beam.WindowInto(window.FixedWindows(self._size))
            | "WeightPerRating" >> beam.FlatMap(_weighted_ratings)
            # Beam 2.62's stubs type CombinePerKey's argument as a CombineFn; a callable works.
            | "SumWeights" >> beam.CombinePerKey(sum)  # type: ignore[arg-type]
            | "Report" >> beam.ParDo(_ReportWeightedWindow())
        )
