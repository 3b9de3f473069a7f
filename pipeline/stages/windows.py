"""Event-time windows of ratings: each verdict counted in its fixed window (WindowRatings,
CountRatings with a weight), and a re-judged session's earlier verdict taken back out
(ReplaceRejudged, `ragpulse stream`)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
from apache_beam import coders
from apache_beam.transforms import trigger, userstate, window
from apache_beam.utils.timestamp import Duration

from ragpulse.judges.base import RATINGS
from ragpulse.pipeline.composite import composite_transform
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import (
    JudgedEvent,
)
from ragpulse.pipeline.stages.counters import Counters
from ragpulse.pipeline.windows import RatingCounts, WindowKey

log = logging.getLogger(__name__)


Rated = tuple[tuple[str, str, str, str], tuple[str, int | None]]


def ratings_by_judge(judged: JudgedEvent) -> list[Rated]:
    """((judge, version, app, model), (rating, score in thousandths or None)) for each verdict
    of a judged event (skipped judges have none: they stay out of the window's counts)."""
    app, model = judged.record.app, judged.record.model
    return [
        ((v.judge, version, app, model),
         (v.rating, None if v.score is None else counting.milli(v.score)))
        for v, version in judged.versioned()
        if not v.missing
    ]


@dataclasses.dataclass(frozen=True)
class Retraction:
    """Verdicts taken back out of the windows they were counted in (`ragpulse stream`: the
    earlier verdicts of a session a late turn re-opened, `ReplaceRejudged` below):
    their event time and their `ratings_by_judge`, no text."""

    event_time: float
    ratings: tuple[Rated, ...]


def weighted_ratings(
    item: JudgedEvent | Retraction,
) -> Iterable[tuple[tuple[str, str, str, str], tuple[str, int | None, int]]]:
    """`ratings_by_judge` with a weight, what `CountRatings` adds up: +1 for a judged event's
    verdicts, -1 for retracted ones (stream)."""
    if isinstance(item, Retraction):
        return [(k, (rating, score, -1)) for k, (rating, score) in item.ratings]
    return [(k, (rating, score, 1)) for k, (rating, score) in ratings_by_judge(item)]


@dataclasses.dataclass(frozen=True)
class _JudgedSession:
    """What `ReplaceRejudged` keeps of a session it let through: its span, turns and ratings."""

    began: float
    end: float
    turns: int
    ratings: tuple[Rated, ...]


def _key_by_session(judged: JudgedEvent) -> tuple[tuple[str, str], JudgedEvent]:
    session = judged.record.session
    assert session is not None  # only the session judges' records come here
    return (session.app, session.session_id), judged


_JUDGED_SESSIONS = userstate.BagStateSpec("judged", coders.PickleCoder())
_FORGET_SESSIONS = userstate.TimerSpec("forget", userstate.TimeDomain.WATERMARK)
_JUDGED_SESSIONS_PARAM = beam.DoFn.StateParam(_JUDGED_SESSIONS)
_FORGET_SESSIONS_PARAM = beam.DoFn.TimerParam(_FORGET_SESSIONS)


class _ReplaceRejudged(beam.DoFn):

    def __init__(self, gap_seconds: float, lateness_seconds: float) -> None:
        self._gap = gap_seconds
        self._lateness = lateness_seconds

    def setup(self) -> None:
        self._counters = Counters()

    def process(
        self,
        element: tuple[tuple[str, str], JudgedEvent],
        judged_state: Any = _JUDGED_SESSIONS_PARAM,
        forget: Any = _FORGET_SESSIONS_PARAM,
    ) -> Iterator[JudgedEvent | Retraction]:
        (app, session_id), judged = element
        session = judged.record.session
        assert session is not None
        gap = self._gap
        new = _JudgedSession(
            session.began if session.began is not None else session.start,
            judged.record.event_time,
            session.turn_count,
            tuple(ratings_by_judge(judged)),
        )
        kept: list[_JudgedSession] = []
        replaced: list[_JudgedSession] = []
        for old in judged_state.read():
            if not (old.began < new.end + gap and new.began < old.end + gap):
                kept.append(old)  # another session of the same id
            elif old.turns > new.turns:
                # An earlier pane of a session whose later pane came first: superseded.
                log.debug(
                    "session %s of %s: a pane of %d turns after one of %d, not counted",
                    session_id, app, new.turns, old.turns,
                )
                return
            else:
                replaced.append(old)
        for old in replaced:
            yield Retraction(old.end, old.ratings)
            self._counters.inc(counting.key(catalogue.SESSIONS_REJUDGED, app=app))
        judged_state.clear()
        for entry in [*kept, new]:
            judged_state.add(entry)
        # A turn re-opens a session until its end + gap + lateness passes.
        forget.set(max(e.end for e in [*kept, new]) + gap + self._lateness)
        yield judged

    @userstate.on_timer(_FORGET_SESSIONS)
    def _forget(self, judged_state: Any = _JUDGED_SESSIONS_PARAM) -> None:
        judged_state.clear()


@composite_transform
def ReplaceRejudged(judged: Any, gap_seconds: float, lateness_seconds: float) -> Any:
    """The session judges' verdicts of `ragpulse stream`, where a late turn re-opens a judged
    session (accumulating session-window panes, `GroupSessions(lateness_seconds=...)`) and it
    is judged again: each verdict after the first of one session comes with a `Retraction` of
    the earlier one (counted in ragpulse_session_rejudged_total), so the windowed counts never
    count a session twice. Kept per (app, session id) in the runner's state until no turn can
    re-open the session (its end + gap + `lateness_seconds`); a pane overtaken by a later one
    of the same session is not counted."""
    return (
        judged
        # Typed, so that the state's key coder is a deterministic one (strings).
        | "KeyBySession"
        >> beam.Map(_key_by_session).with_output_types(
            beam.typehints.Tuple[beam.typehints.Tuple[str, str], beam.typehints.Any]
        )
        | "Replace" >> beam.ParDo(_ReplaceRejudged(gap_seconds, lateness_seconds))
    )


class CountRatings(beam.CombineFn):
    """Counts yes / no / error ratings, and scored verdicts with their score sum; partial
    counts add up (`RatingCounts.__add__`). Each rating comes with its weight
    (`weighted_ratings`): -1 takes a retracted verdict back out."""

    def create_accumulator(self) -> list[int]:
        return [0, 0, 0, 0, 0]

    def add_input(self, acc: list[int], rated: tuple[str, int | None, int]) -> list[int]:
        rating, score, weight = rated
        acc[RATINGS.index(rating)] += weight
        if score is not None:
            acc[3] += weight
            acc[4] += weight * score
        return acc

    def merge_accumulators(self, accs: Iterable[list[int]]) -> list[int]:
        total = [0, 0, 0, 0, 0]
        for acc in accs:
            for i in range(5):
                total[i] += acc[i]
        return total

    def extract_output(self, acc: list[int]) -> RatingCounts:
        return RatingCounts(*acc)


def window_key(key: tuple[str, str, str, str], win: Any) -> WindowKey:
    """The `WindowKey` of a (judge, version, app, model) key counted in the Beam window `win`."""
    judge, version, app, model = key
    return WindowKey(float(win.start), float(win.end), judge, app, model, version)


class _KeyByWindow(beam.DoFn):
    def process(
        self,
        element: tuple[tuple[str, str, str, str], RatingCounts],
        win: Any = beam.DoFn.WindowParam,
    ) -> Iterator[tuple[WindowKey, RatingCounts]]:
        key, counts = element
        yield window_key(key, win), counts


def at_event_time(judged: JudgedEvent | Retraction) -> window.TimestampedValue:
    """The judged event (or retraction) stamped with its event time, for event-time windows."""
    at = judged.event_time if isinstance(judged, Retraction) else judged.record.event_time
    return window.TimestampedValue(judged, at)


@dataclasses.dataclass(frozen=True)
class PaneSchedule:
    """When a window's panes fire in `ragpulse stream`: early every `early_firing_seconds` of
    processing time while it is open, on time when the watermark passes its end, late for each
    late event up to `allowed_lateness_seconds` after that."""

    allowed_lateness_seconds: float
    early_firing_seconds: float


@composite_transform
def WindowByEventTime(
    judged: Any, *, window_size: float, schedule: PaneSchedule | None = None
) -> Any:
    """Judged events (and `Retraction`s) into fixed windows of their event time: the one
    windowing of `run` and `serve` (`WindowRatings`, `ReportWeightedWindows`: a bounded batch,
    one pane per window) and of `stream` (`PaneRatings`: accumulating panes as `schedule`
    says)."""
    panes: dict[str, Any] = {} if schedule is None else {
        "trigger": trigger.AfterWatermark(
            # Beam takes whole seconds here (the runner API's delay is an integer).
            early=trigger.AfterProcessingTime(max(1, round(schedule.early_firing_seconds))),
            late=trigger.AfterCount(1),
        ),
        "allowed_lateness": Duration(seconds=schedule.allowed_lateness_seconds),
        "accumulation_mode": trigger.AccumulationMode.ACCUMULATING,
    }
    return (
        judged
        | "StampEventTime" >> beam.Map(at_event_time)
        | "FixedWindows" >> beam.WindowInto(window.FixedWindows(window_size), **panes)
    )


@composite_transform
def WindowRatings(judged: Any, *, window_size: float) -> Any:
    """Counts ratings per (event-time fixed window, judge, app, model) of a bounded batch.

    Every batch is bounded (a file, or one micro-batch of Kafka offset ranges), so each window
    gets one pane holding the batch's counts; `serve` adds up the partial counts of the same
    window across cycles (`RatingCounts.__add__`), and decides lateness itself, before judging
    (`ParseEvents(closed_before=...)`), which is why no late-pane trigger is needed here.
    """
    return (
        judged
        | "WindowByEventTime" >> WindowByEventTime(window_size=window_size)
        | "RatingPerJudge" >> beam.FlatMap(weighted_ratings)
        | "CountRatings" >> beam.CombinePerKey(CountRatings())
        | "KeyByWindow" >> beam.ParDo(_KeyByWindow())
        # Back to the global window, so sinks and the result see plain (key, counts) rows.
        | "Unwindow" >> beam.WindowInto(window.GlobalWindows())
    )
