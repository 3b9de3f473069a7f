"""The reviewers' labels in `ragpulse stream`: the labels topic read back into each judge's
confusion counts, exactly once, as serve does it (pipeline/service/labels.py).

A branch of the stream's graph beside the review queue (graphs/unbounded.py):

    labels topic -> DecodeLabels -> KeyByItem ---------------\\
    QueueForReview's queued verdicts -> KeyQueuedByItem ------+-> Flatten -> SortLabels
        -> the outcome of each label (counters) -> CountLabels -> label-count rows (ratings topic)
        -> the labels kept apart, with their reason -> the dead-letter topic

`SortLabels` is a stateful DoFn keyed by (event id, judge): the key of a label on the labels
topic and of a review item's verdict. Its state holds, per key, the prompt version of the
verdict queued for review (the record of queued items, kept `horizon` seconds of event time
after the event, then forgotten: this bounds the state), the ids of the labels counted
(`label_id` is a digest of event, judge, version and reviewer, so every copy of a label has
the same key, and a copy is a `duplicate`), and the labels waiting for their decision. A label
is decided when the watermark passes its own time (its Kafka record time): by then every
verdict queued before it was labelled has reached the state (a person labels an item after it
was queued), however the runner orders the two inputs.

The outcome of a label is `label_outcome` (pure, shared with serve): `unknown_judge` (a judge
the stream does not run), `unknown_event` (no review item with this event id and judge was
queued within the horizon: never queued, queued by another job, or queued longer ago than
`--review-label-horizon`), `other_version` (another prompt version than the queued verdict's),
`duplicate`, `not_binary` (the judge could not grade, or a correct score of a judge whose
pass score is not known), or `counted` (a correct score on a graded scale too, mapped to pass
or fail by the judge's pass score, and counted per grade in
`ragpulse_review_label_grades_total`); a record that is not a label is `malformed`. Each
outcome is counted in `ragpulse_review_labels_read_total{outcome}`; only `counted` labels enter
`ragpulse_review_labels_total{judge, version, slice, human, rating}`; unknown and malformed
ones go to the dead-letter topic with their reason.

The counts are summed in the global window in accumulating panes (an early pane every
`--early-firing` seconds of processing time): each pane holds the whole count so far, which
`ragpulse exporter` reads from the ratings topic (formats/label_counts.py) and turns into the
metrics serve exports (kappa, sensitivity, specificity, the corrected pass ratio). Exactly once
is the runner's: Beam state and combines are checkpointed with the read offsets.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import apache_beam as beam
from apache_beam import coders
from apache_beam.transforms import trigger, userstate, window

from ragpulse.pipeline.composite import composite_transform
from ragpulse.pipeline.formats import label_counts
from ragpulse.pipeline.formats.review import (
    InvalidReviewRecord,
    LabelRecord,
    decode_label,
    human_rating,
)
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import QueuedVerdict, Rejected, SourceRecord

__all__ = [
    "CountLabels",
    "LabelsConfig",
    "SortLabels",
    "label_counters",
    "label_outcome",
]

REVIEW_LABELS = catalogue.REVIEW_LABELS
REVIEW_LABEL_GRADES = catalogue.REVIEW_LABEL_GRADES
LABELS_READ = catalogue.REVIEW_LABELS_READ
# A label record is a few hundred bytes (a note is at most 2,000 characters).
MAX_LABEL_BYTES = 64 * 1024
DEAD_LETTERS = "dead_letters"
NOT_TRACKED = "not tracked"  # label_outcome's `queued` when no record of queued items is kept


@dataclasses.dataclass(frozen=True)
class LabelsConfig:
    """What the stream's labels branch takes (picklable): the running judges' prompt
    `versions` ({judge: version}, as their verdicts carry it), how long a queued verdict is
    remembered (`horizon_seconds` of event time), how often the counts are published, and the
    graded judges' `pass_scores`."""

    versions: Mapping[str, str]
    horizon_seconds: float
    early_firing_seconds: float
    # The pass score of each judge on a graded scale (its reviewers' correct scores are mapped
    # to pass or fail by it).
    pass_scores: Mapping[str, float] = dataclasses.field(default_factory=dict)


def label_outcome(
    label: LabelRecord,
    versions: Mapping[str, str],
    counted_before: set[str],
    queued: str | None = NOT_TRACKED,
    pass_scores: Mapping[str, float] | None = None,
) -> tuple[catalogue.LabelOutcome, str | None]:
    """(outcome, the dead letter's reason or None) of one valid label, against the running
    judges' prompt `versions`, the ids of the labels counted already, and `queued`: the prompt
    version of the verdict queued for review with the label's event id and judge (None: none
    was queued; NOT_TRACKED: no record of queued items is kept). An `imported` label
    (`ragpulse import-labels`: a team's own labels of its own choice of events) is of no
    queued item, and is checked against the running version. `pass_scores`: the pass score of
    each judge on a graded scale, which maps a reviewer's correct score to pass or fail."""
    if label.reason == "imported":
        queued = NOT_TRACKED
    version = versions.get(label.judge)
    if version is None:
        return "unknown_judge", (
            f"label for judge {label.judge!r}, which this job does not run "
            f"(judges: {', '.join(sorted(versions))})"
        )
    if queued is None:
        return "unknown_event", (
            f"label of event {label.event_id[:200]!r} and judge {label.judge}: no review item "
            "with this event id and judge was queued within the review label horizon"
        )
    expected = version if queued == NOT_TRACKED else queued
    if label.prompt_version != expected:
        return "other_version", (
            f"label of {label.judge} prompt version {label.prompt_version!r}; the verdict was "
            f"judged with {expected!r}: labels of another prompt version never enter its counts"
        )
    if label.label_id in counted_before:
        return "duplicate", None
    if human_rating(label, (pass_scores or {}).get(label.judge)) is None:
        return "not_binary", None
    return "counted", None


def label_counters(
    label: LabelRecord, outcome: str, pass_scores: Mapping[str, float] | None = None
) -> list[counting.CounterKey]:
    """The counters one label adds 1 to: its outcome; when it is counted, its cell of the
    judge's yes/no table; and a correct score on a graded scale (counted or not_binary), its
    grade."""
    keys = [counting.key(LABELS_READ, outcome=outcome)]
    slice_ = "random" if label.random else "targeted"
    human = human_rating(label, (pass_scores or {}).get(label.judge))
    if outcome == "counted" and human is not None:
        keys.append(counting.key(
            REVIEW_LABELS, judge=label.judge, version=label.prompt_version, slice=slice_,
            human=human, rating=label.judge_rating,
        ))
    if outcome in ("counted", "not_binary") and label.correct_score is not None:
        keys.append(counting.key(
            REVIEW_LABEL_GRADES, judge=label.judge, version=label.prompt_version,
            slice=slice_, grade=f"{label.correct_score:g}", rating=label.judge_rating,
        ))
    return keys


# What reaches SortLabels under one (event id, judge) key.
_Arrival = tuple[Literal["queued"], str] | tuple[Literal["label"], tuple[SourceRecord, LabelRecord]]


class _DecodeLabels(beam.DoFn):
    """A labels-topic record as ((event id, judge), its label); a record that is not a label
    is counted `malformed` and kept apart with the reason."""

    def process(self, record: SourceRecord) -> Iterator[Any]:
        try:
            if record.oversize_bytes is not None or len(record.raw) > MAX_LABEL_BYTES:
                size = record.oversize_bytes or len(record.raw)
                raise InvalidReviewRecord(f"{size} bytes, over the label limit of "
                                          f"{MAX_LABEL_BYTES}")
            label = decode_label(record.raw)
        except InvalidReviewRecord as exc:
            yield beam.pvalue.TaggedOutput(
                DEAD_LETTERS, Rejected(record, f"not a label record: {exc}")
            )
            yield counting.key(LABELS_READ, outcome="malformed")
            return
        yield beam.pvalue.TaggedOutput("labels", ((label.event_id, label.judge),
                                                  ("label", (record, label))))


def _queued_arrival(queued: QueuedVerdict) -> tuple[tuple[str, str], _Arrival]:
    return (queued.event_id, queued.judge), ("queued", queued.prompt_version)


# SortLabels' state and timers (module-level: Beam finds them by the DoFn's parameters).
_QUEUED = userstate.ReadModifyWriteStateSpec("queued", coders.StrUtf8Coder())
_COUNTED = userstate.SetStateSpec("counted", coders.StrUtf8Coder())
_PENDING = userstate.BagStateSpec("pending", coders.PickleCoder())
_DECIDE_AT = userstate.ReadModifyWriteStateSpec("decide_at", coders.FloatCoder())
_DECIDE = userstate.TimerSpec("decide", userstate.TimeDomain.WATERMARK)
_FORGET = userstate.TimerSpec("forget", userstate.TimeDomain.WATERMARK)
_QUEUED_PARAM = beam.DoFn.StateParam(_QUEUED)
_COUNTED_PARAM = beam.DoFn.StateParam(_COUNTED)
_PENDING_PARAM = beam.DoFn.StateParam(_PENDING)
_DECIDE_AT_PARAM = beam.DoFn.StateParam(_DECIDE_AT)
_DECIDE_PARAM = beam.DoFn.TimerParam(_DECIDE)
_FORGET_PARAM = beam.DoFn.TimerParam(_FORGET)


class SortLabels(beam.DoFn):
    """Keyed by (event id, judge): each label's outcome once the watermark passes its time
    (module docstring); counters out, the labels kept apart as a tagged output."""

    def __init__(self, config: LabelsConfig) -> None:
        self._config = config

    def process(
        self,
        element: tuple[tuple[str, str], _Arrival],
        timestamp: Any = beam.DoFn.TimestampParam,
        queued: Any = _QUEUED_PARAM,
        pending: Any = _PENDING_PARAM,
        decide_at: Any = _DECIDE_AT_PARAM,
        decide: Any = _DECIDE_PARAM,
        forget: Any = _FORGET_PARAM,
    ) -> None:
        _, (kind, value) = element
        at = float(timestamp)
        if kind == "queued":
            assert isinstance(value, str)
            queued.write(value)
            forget.set(_finite(at + self._config.horizon_seconds))
            return
        pending.add(value)
        latest = max(at, decide_at.read() or -math.inf)
        decide_at.write(latest)
        decide.set(_finite(latest))

    @userstate.on_timer(_DECIDE)
    def _decide(
        self,
        queued: Any = _QUEUED_PARAM,
        counted: Any = _COUNTED_PARAM,
        pending: Any = _PENDING_PARAM,
        decide_at: Any = _DECIDE_AT_PARAM,
    ) -> Iterator[Any]:
        waiting = sorted(pending.read(), key=lambda rl: (rl[1].labelled_at, rl[0].position))
        pending.clear()
        decide_at.clear()
        version = queued.read()
        known = set(counted.read())
        for record, label in waiting:
            outcome, why = label_outcome(
                label, self._config.versions, known, version, self._config.pass_scores
            )
            yield from label_counters(label, outcome, self._config.pass_scores)
            if why is not None:
                yield beam.pvalue.TaggedOutput(DEAD_LETTERS, Rejected(record, why))
            elif outcome != "duplicate":
                known.add(label.label_id)  # counted or not_binary: a copy is a duplicate
                counted.add(label.label_id)

    @userstate.on_timer(_FORGET)
    def _forget(
        self,
        queued: Any = _QUEUED_PARAM,
        counted: Any = _COUNTED_PARAM,
    ) -> None:
        # The bound of the record of queued items: a later label of this item is unknown_event.
        queued.clear()
        counted.clear()


def _finite(at: float) -> float:
    # A timer must stay inside the global window.
    return min(at, float(window.GlobalWindow().max_timestamp()))


def _sum_pane(config: LabelsConfig) -> dict[str, Any]:
    return {
        "trigger": trigger.AfterWatermark(
            early=trigger.AfterProcessingTime(max(1, round(config.early_firing_seconds))),
        ),
        "accumulation_mode": trigger.AccumulationMode.ACCUMULATING,
    }


@composite_transform
def CountLabels(inputs: tuple[Any, Any], *, config: LabelsConfig) -> tuple[Any, Any]:
    """(the labels topic's `SourceRecord`s, the review queue's `QueuedVerdict`s) in;
    (label-count rows as (Kafka key, value), `Rejected` labels) out."""
    labels, queued = inputs
    decoded = labels | "DecodeLabels" >> beam.ParDo(_DecodeLabels()).with_outputs(
        DEAD_LETTERS, "labels", main="malformed"
    )
    keyed_queued = queued | "KeyQueuedByItem" >> beam.Map(_queued_arrival)
    sorted_ = (
        (decoded["labels"], keyed_queued)
        | "FlattenLabelsAndQueued" >> beam.Flatten()
        | "GlobalWindowOfLabels" >> beam.WindowInto(window.GlobalWindows())
        | "SortLabels" >> beam.ParDo(SortLabels(config)).with_outputs(
            DEAD_LETTERS, main="counters"
        )
    )
    rows = (
        (decoded["malformed"], sorted_["counters"])
        | "FlattenCounters" >> beam.Flatten()
        | "PaneOfLabelCounts" >> beam.WindowInto(window.GlobalWindows(), **_sum_pane(config))
        | "OnePerCounter" >> beam.Map(lambda key: (key, 1))
        | "SumLabelCounts" >> beam.CombinePerKey(sum)
        | "ToLabelCountRow" >> beam.MapTuple(label_counts.encode)
    )
    rejected = (
        (decoded[DEAD_LETTERS], sorted_[DEAD_LETTERS])
        | "FlattenRejectedLabels" >> beam.Flatten()
    )
    return rows, rejected
