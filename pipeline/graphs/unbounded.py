"""The unbounded graph of `ragpulse stream`: one Beam streaming job on a distributed runner.

    ReadKafkaStream (or any source of SourceRecords: tests use TestStream)
        -> ParseEvents (sample) -> JudgeEvents         the same stages as `run` and `serve`
           (--session-judges: + GroupSessions -> JudgeEvents of the session judges, as `run`)
        -> PaneRatings: event-time fixed windows, early / on-time / late panes, accumulating
        -> PublishRatings: each pane as a rating row on the ratings topic
    ParseEvents' dead letters -> PublishDeadLetters -> the dead-letter topic
    JudgeEvents' verdicts -> QueueForReview -> the review topic (--review-rate, stages/review.py)
        the verdicts queued + the labels topic -> CountLabels (stages/labels.py)
        -> label counts to the ratings topic, labels kept apart to the dead-letter topic

How the window ratings get to Prometheus: (a) a ratings topic read by `ragpulse exporter`,
which serves /metrics, rather than (b) the Prometheus Pushgateway. Panes accumulate, so each
pane carries the window's whole count so far and the exporter keeps the latest pane of each
window: a pane written twice (a retried bundle, a restarted worker, a replayed topic) changes
nothing, and the exporter rebuilds everything from the topic after its own restart. With the
Pushgateway, every worker would push its own panes under one grouping key and the last push
would win (pushes from many workers collide, and counts of another worker's windows vanish),
counters would reset whenever a worker restarts, and the gateway holds no history to rebuild
from. The exporter exports through serve's collector (`pipeline.metrics.collector`), with the
same metric names and labels, so the shipped recording rules, alerts and dashboards work on
either deployment.

Lateness is Beam's here, not serve's watermark: a window's on-time pane fires when the
runner's watermark (the Kafka record times, `CreateTime`) passes its end; events up to
`allowed_lateness` behind the watermark update the window in late panes; events later than that
are dropped by the runner and counted in its own metrics (Dataflow: the step's
"droppedDueToLateness" counter; Flink: numLateRecordsDropped), which the exporter cannot see.

Counts that serve exports from Beam counters (events read, calls, tokens, latency) stay Beam
counters in the workers here: the runner's monitoring shows them (Dataflow job metrics, Flink
metrics reporters); only the verdicts reach Prometheus, through the window panes.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterator, Mapping
from typing import Any

import apache_beam as beam
from apache_beam.utils.windowed_value import PaneInfoTiming

from ragpulse.pipeline.composite import composite_transform
from ragpulse.pipeline.formats.rating_rows import PaneTiming, RatingPane
from ragpulse.pipeline.graphs.bounded import StageConfig, with_sessions
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.stages.judge import JudgeEvents
from ragpulse.pipeline.stages.labels import CountLabels, LabelsConfig
from ragpulse.pipeline.stages.parse import ParseEvents
from ragpulse.pipeline.stages.review import QueueForReview
from ragpulse.pipeline.stages.windows import (
    CountRatings,
    PaneSchedule,
    WindowByEventTime,
    weighted_ratings,
    window_key,
)
from ragpulse.pipeline.windows import RatingCounts

_TIMINGS: dict[int, PaneTiming] = {
    PaneInfoTiming.EARLY: "early",
    PaneInfoTiming.ON_TIME: "on_time",
    PaneInfoTiming.LATE: "late",
}


class _ToPane(beam.DoFn):
    def process(
        self,
        element: tuple[tuple[str, str, str, str], RatingCounts],
        win: Any = beam.DoFn.WindowParam,
        pane: Any = beam.DoFn.PaneInfoParam,
    ) -> Iterator[RatingPane]:
        key, counts = element
        yield RatingPane(window_key(key, win), counts, _TIMINGS[pane.timing], pane.index)


@composite_transform
def PaneRatings(judged: Any, *, window_size: float, schedule: PaneSchedule) -> Any:
    """Counts ratings per (event-time fixed window, judge, app, model) of an unbounded stream,
    in accumulating panes (`PaneSchedule`): `JudgedEvent`s (and `Retraction`s, which take
    verdicts back out) in, `RatingPane`s out."""
    return (
        judged
        | "WindowByEventTime" >> WindowByEventTime(window_size=window_size, schedule=schedule)
        | "RatingPerJudge" >> beam.FlatMap(weighted_ratings)
        | "CountRatings" >> beam.CombinePerKey(CountRatings())
        | "ToPane" >> beam.ParDo(_ToPane())
    )


@dataclasses.dataclass(frozen=True)
class StreamSinks:
    """Where the stream's outputs go: `dead_letters` takes `Rejected` records, `ratings` takes
    `RatingPane`s."""

    dead_letters: beam.PTransform
    ratings: beam.PTransform
    # The reviewers' labels read back (stages/labels.py): their source and where the label
    # counts go (the ratings topic); None: no labels read.
    labels: StreamLabels | None = None


@dataclasses.dataclass(frozen=True)
class StreamLabels:
    """The labels branch: `source` yields the labels topic's `SourceRecord`s stamped with their
    Kafka record time, `counts` takes label-count rows (Kafka key, value)."""

    source: beam.PTransform
    counts: beam.PTransform
    config: LabelsConfig


def build_stream(
    p: beam.Pipeline,
    source: beam.PTransform,
    config: StageConfig,
    schedule: PaneSchedule,
    sinks: StreamSinks,
) -> None:
    """Adds the whole stream to `p`: `source` yields `SourceRecord`s stamped with their event
    time (Kafka record time), `sinks` take the dead letters and the window panes."""
    parsed = p | "Read" >> source | "ParseEvents" >> ParseEvents(config.admission)
    _ = parsed[ParseEvents.DEAD_LETTER] | "WriteDeadLetters" >> sinks.dead_letters
    judged = parsed.events | "JudgeEvents" >> JudgeEvents(
        config.judges, batch_size=config.judge_batch_size
    )
    if config.review is not None:
        queued = judged | "QueueForReview" >> QueueForReview(config.review, runner_retries=True)
        if sinks.labels is not None:
            _count_labels(p, queued, sinks)
    if config.sessions is not None:
        # As in `run` (pipeline.stages.sessions): a session is judged when the watermark passes its
        # last turn + the gap, and counted in the window of its last turn, in a late pane of
        # that window (the settings keep --session-gap within --allowed-lateness). A late turn
        # re-opens it for --allowed-lateness minus the gap, so that the windows of its earlier
        # verdicts, which are taken back out, are still open (`rejudge_lateness_seconds`).
        judged = with_sessions(
            judged,
            parsed.events,
            config.sessions,
            config.judge_batch_size,
            rejudge_lateness_seconds=schedule.allowed_lateness_seconds
            - config.sessions.gap_seconds,
        )
    panes = judged | "PaneRatings" >> PaneRatings(
        window_size=config.window_seconds, schedule=schedule
    )
    _ = panes | "WriteRatings" >> sinks.ratings


def _count_labels(p: beam.Pipeline, queued: Any, sinks: StreamSinks) -> None:
    """The labels branch (stages/labels.py), checked against the verdicts `queued`."""
    assert sinks.labels is not None
    labels = p | "ReadLabels" >> sinks.labels.source
    rows, rejected = (labels, queued) | "CountLabels" >> CountLabels(config=sinks.labels.config)
    _ = rows | "WriteLabelCounts" >> sinks.labels.counts
    _ = rejected | "WriteLabelDeadLetters" >> sinks.dead_letters


def _source_record(row: Any) -> SourceRecord:
    """A row of ragpulse's Kafka read (java/kafka-read, `ReadKafkaRecords.RECORD_SCHEMA`) as a
    `SourceRecord`."""
    return SourceRecord(
        row.value or b"", row.topic, row.partition, row.offset, record_time=row.timestamp / 1000
    )


# ragpulse's Kafka read, offered by java/kafka-read's registrar to an expansion service that has
# its jar on the classpath (java/kafka-read/src/main/java/io/ragpulse/kafka/ReadKafkaRecords.java).
KAFKA_READ_URN = "beam:transform:io.ragpulse:kafka_read:v1"


# The read's configuration as the Java side's `ReadKafkaRecords.Configuration` takes it. The
# functional form with `typing` types: Beam builds the payload's schema from the field types,
# which `from __future__ import annotations` would leave as strings.
_KafkaReadPayload = typing.NamedTuple(  # noqa: UP014 (see above)
    "_KafkaReadPayload",
    [
        ("consumer_config", typing.Mapping[str, str]),
        ("topics", typing.List[str]),  # noqa: UP006 (Beam's schemas know typing.List)
        ("commit_offset_in_finalize", bool),
        ("out_of_orderness_millis", int),
        ("partition_idle_after_millis", int),
    ],
)


class ReadKafkaStream(beam.PTransform):
    """The stream's source: Beam's Java KafkaIO with ragpulse's timestamp policy (java/kafka-read,
    `PartitionWatermarkPolicy`), records stamped with their Kafka record time, from the earliest
    offset unless `consumer_config` says otherwise. The watermark is serve's: per partition, the
    latest record time read minus `out_of_orderness_s`; a partition with nothing to read for
    `partition_idle_after_s` stops holding it back. With a `group.id` in `consumer_config`, the
    reader commits the group's offsets when the runner finalizes a checkpoint (Flink: every
    `--checkpointing_interval`), so a job submitted again with the same group starts where the
    stopped one had checkpointed.

    Expanding it needs a Java expansion service with java/kafka-read's jar on its classpath
    (`expansion_service`, host:port); the runner runs the Java read (Flink: the legacy
    UnboundedSource read, natively, with the expansion service's
    `--experiments=use_deprecated_read`; docs/operations.md says why).
    """

    # A class, not a `composite_transform`: that would show `consumer_config`, which may hold a
    # password (sasl.jaas.config), as display data in the runner's UI.
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        expansion_service: str,
        consumer_config: Mapping[str, str] | None = None,
        *,
        out_of_orderness_s: float,
        partition_idle_after_s: float,
    ) -> None:
        super().__init__()
        self._payload = _KafkaReadPayload(
            consumer_config={
                "bootstrap.servers": bootstrap,
                "auto.offset.reset": "earliest",
                **(consumer_config or {}),
                # Offsets are committed with checkpoints only (commit_offset_in_finalize); the
                # settings refuse a consumer_config that turns the consumer's auto-commit on.
                "enable.auto.commit": "false",
            },
            topics=[topic],
            commit_offset_in_finalize="group.id" in (consumer_config or {}),
            out_of_orderness_millis=round(out_of_orderness_s * 1000),
            partition_idle_after_millis=round(partition_idle_after_s * 1000),
        )
        self._expansion_service = expansion_service

    def expand(self, pbegin: Any) -> Any:
        from apache_beam.transforms.external import (  # imported only to expand the read
            ExternalTransform,
            NamedTupleBasedPayloadBuilder,
        )

        return (
            pbegin
            | "ReadKafkaRecords"
            >> ExternalTransform(
                KAFKA_READ_URN,
                NamedTupleBasedPayloadBuilder(self._payload),
                self._expansion_service,
            )
            | "ToSourceRecord" >> beam.Map(_source_record)
        )
