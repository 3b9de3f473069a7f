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
from apache_beam.metrics import Metrics

from ragpulse.pipeline.composite import composite_transform
from ragpulse.pipeline.costs.sampling import MICRO, WeightedCounts, to_micros
from ragpulse.pipeline.records import JudgedEvent
from ragpulse.pipeline.stages.windows import WindowByEventTime, ratings_by_judge, window_key
from ragpulse.pipeline.windows import WindowKey, decode_window, encode_window

WEIGHTED_WINDOW_NAMESPACE = "ragpulse.weighted_windows"

_Weighed = tuple[tuple[tuple[str, str, str, str], str], int]


def _weighted_ratings(judged: JudgedEvent) -> Iterable[_Weighed]:
    """(((judge, version, app, model), rating), weight in millionths) for each verdict of a
    judged event (`ratings_by_judge`: a judge that did not run has nothing to weigh)."""
    micros = to_micros(judged.record.weight)
    return [((key, rating), micros) for key, (rating, _) in ratings_by_judge(judged)]


class _ReportWeightedWindow(beam.DoFn):
    def process(self, element: _Weighed, win: Any = beam.DoFn.WindowParam) -> None:
        (key, rating), micros = element
        name = encode_window(window_key(key, win), rating)
        Metrics.counter(WEIGHTED_WINDOW_NAMESPACE, name).inc(micros)


def decode_weighted_window(name: str, micros: int) -> tuple[WindowKey, WeightedCounts]:
    """The window and weighted count of one counter of `WEIGHTED_WINDOW_NAMESPACE`."""
    key, rating = decode_window(name)
    return key, WeightedCounts(**{rating: micros / MICRO})


@composite_transform
def ReportWeightedWindows(judged: Any, *, window_size: float) -> Any:
    """Sums the weights of each rating per (event-time window, judge, app, model) and hands
    the sums to the caller as Beam counters."""
    return (
        judged
        | "WindowByEventTime" >> WindowByEventTime(window_size=window_size)
        | "WeightPerRating" >> beam.FlatMap(_weighted_ratings)
        | "SumWeights" >> beam.CombinePerKey(sum)
        | "Report" >> beam.ParDo(_ReportWeightedWindow())
    )
