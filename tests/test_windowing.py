"""Event-time windowing under streaming semantics: TestStream on the BundleBasedDirectRunner."""

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.test_stream import TestStream
from apache_beam.testing.util import assert_that, equal_to_per_window
from apache_beam.transforms.window import IntervalWindow, TimestampedValue

from judges.base import JudgeInput, Verdict
from pipeline.events import InferenceRecord
from pipeline.stages import JudgedEvent, WindowRatings
from pipeline.windows import RatingCounts, WindowKey

pytestmark = pytest.mark.slow  # each runs a Beam pipeline

T0 = 1_700_000_400.0  # a multiple of 60: the start of a one-minute window


def judged(request_id: str, at: float, rating: str) -> JudgedEvent:
    record = InferenceRecord(
        request_id=request_id,
        event_time=at,
        app="help-bot",
        model="m1",
        judge_input=JudgeInput(question="q", answer="a"),
    )
    verdict = Verdict(
        "groundedness",
        rating,  # type: ignore[arg-type]
        error_message="boom" if rating == "error" else None,
    )
    return JudgedEvent(record, (verdict,))


def stamped(request_id: str, at: float, rating: str) -> TimestampedValue:
    return TimestampedValue(judged(request_id, at, rating), at)


def key(start: float) -> WindowKey:
    return WindowKey(start, start + 60, "groundedness", "help-bot", "m1")


def streaming_pipeline() -> TestPipeline:
    options = PipelineOptions(runner="BundleBasedDirectRunner")
    options.view_as(StandardOptions).streaming = True
    return TestPipeline(options=options)


def test_windows_count_on_time_and_allowed_late_events_and_exclude_too_late_ones() -> None:
    stream = (
        TestStream()
        .advance_watermark_to(T0)
        .add_elements([stamped("a", T0 + 1, "yes"), stamped("b", T0 + 20, "no")])
        .add_elements([stamped("c", T0 + 70, "yes"), stamped("d", T0 + 75, "error")])
        # The first window [T0, T0+60) is now complete (on-time pane) ...
        .advance_watermark_to(T0 + 90)
        # ... and a late event within the 60 s allowed lateness updates it (late pane).
        .add_elements([stamped("late-ok", T0 + 30, "yes")])
        # Past end + lateness the first window is closed: this event must not change it.
        .advance_watermark_to(T0 + 150)
        .add_elements([stamped("too-late", T0 + 40, "no")])
        .advance_watermark_to_infinity()
    )
    with streaming_pipeline() as p:
        counts = p | stream | WindowRatings(window_size=60, allowed_lateness=60)
        assert_that(
            counts,
            equal_to_per_window(
                {
                    IntervalWindow(T0, T0 + 60): [
                        (key(T0), RatingCounts(yes=1, no=1)),  # on-time pane
                        (key(T0), RatingCounts(yes=1)),  # late pane: a partial that adds up
                    ],
                    IntervalWindow(T0 + 60, T0 + 120): [
                        (key(T0 + 60), RatingCounts(yes=1, error=1))
                    ],
                }
            ),
        )


def test_bounded_run_gives_one_total_per_window_and_judge() -> None:
    events = [judged(str(i), T0 + i * 7, "yes" if i % 3 else "no") for i in range(20)]
    with TestPipeline(runner="FnApiRunner") as p:
        counts = (
            p
            | beam.Create(events)
            | WindowRatings(window_size=60)
            | beam.MapTuple(lambda k, c: (k.window_start, (c.yes, c.no, c.error)))
        )
        # i*7 < 60 for i <= 8: window 1 holds i=0..8 (no at 0, 3, 6),
        # window 2 holds i=9..17, window 3 holds i=18, 19.
        assert_that(
            counts,
            lambda got: _check(got, {T0: (6, 3, 0), T0 + 60: (6, 3, 0), T0 + 120: (1, 1, 0)}),
        )


def _check(got: list, want: dict) -> None:
    assert dict(got) == want, got
