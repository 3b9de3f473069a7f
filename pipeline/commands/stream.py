"""`ragpulse stream`: submit one unbounded Beam job that judges a Kafka topic on a distributed
runner (Dataflow, Flink), publishing window panes to a ratings topic.

This module is the command: its flags, its settings, and the submission. The graph is
`pipeline.graphs.unbounded.build_stream`; `ragpulse exporter` turns the ratings topic into /metrics.
Where `serve` runs micro-batches on one machine and keeps its own state, the stream's state
(windows, offsets) is the runner's, and a worker restart is the runner's business.
Deployment: deploy/dataflow/README.md, deploy/flink/README.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.settings.command_flags import START_EXPANSION_SERVICE
from ragpulse.pipeline.settings.models import StreamSettings

if TYPE_CHECKING:
    from ragpulse.pipeline.graphs.unbounded import StreamSinks

log = logging.getLogger(__name__)

# What the stream adds to the Beam options of a runner. Flink (Beam 2.70's portable Flink
# runner): a checkpoint that comes while a bundle is open finishes the bundle and buffers its
# output until the checkpoint is taken, but sends the output watermark at once, ahead of that
# output (DoFnOperator.snapshotState, ExecutableStageDoFnOperator.finishBundleCallback); the
# events of a window that watermark has passed then reach the windowing late (late panes, or
# dropped beyond the allowed lateness). Finishing the bundle before the checkpoint barrier sends
# its output before the watermark (docs/operations.md, "The Kafka read on Flink").
RUNNER_BEAM_ARGS = {
    "PortableRunner": ("--finish_bundle_before_checkpointing",),
    "FlinkRunner": ("--finish_bundle_before_checkpointing",),
}


def runner_beam_args(settings: StreamSettings) -> tuple[str, ...]:
    """The Beam options of the job: the user's, streaming, and what its runner needs."""
    return (*settings.beam_args, "--streaming", *RUNNER_BEAM_ARGS.get(settings.runner, ()))


def expansion_service(settings: StreamSettings) -> str:
    """The expansion service that expands ragpulse's Kafka read (both topics the job reads)."""
    if settings.expansion_service is None:
        raise SettingsError(
            "--expansion-service HOST:PORT is needed: a Beam expansion service with ragpulse's "
            f"Kafka read on its classpath ({START_EXPANSION_SERVICE})"
        )
    return settings.expansion_service


def stream_sinks(settings: StreamSettings) -> StreamSinks:
    """The dead-letter and ratings topics, both retried by the runner until acknowledged; with
    the review queue on, the labels topic read back and its counts to the ratings topic."""
    from ragpulse.pipeline.graphs.unbounded import ReadKafkaStream, StreamLabels, StreamSinks
    from ragpulse.pipeline.sinks.kafka import (
        KafkaTopic,
        PublishDeadLetters,
        PublishLabelCounts,
        PublishRatings,
    )

    def topic(name: str) -> KafkaTopic:
        return KafkaTopic(
            settings.bootstrap, settings.kafka_security, name, settings.kafka_timeout_seconds
        )

    labels = settings.labels_config()
    return StreamSinks(
        dead_letters=PublishDeadLetters(topic(settings.dead_letter_topic), runner_retries=True),
        ratings=PublishRatings(topic(settings.ratings_topic)),
        labels=None if labels is None else StreamLabels(
            # The labels topic's partitions are idle most of the time: the same idle rule as
            # the events' topic lets the watermark, which decides labels, move on.
            source=ReadKafkaStream(
                settings.bootstrap, settings.labels_topic, expansion_service(settings),
                dict(settings.consumer_config),
                out_of_orderness_s=settings.out_of_orderness_seconds,
                partition_idle_after_s=settings.partition_idle_after_seconds,
            ),
            counts=PublishLabelCounts(topic(settings.ratings_topic)),
            config=labels,
        ),
    )


def main(settings: StreamSettings) -> int:
    # Beam is imported once the settings are checked (see BEAM_VERSION).
    import apache_beam as beam
    import grpc

    from ragpulse.pipeline.graphs.bounded import own_temp_dir, pipeline_options
    from ragpulse.pipeline.graphs.unbounded import PaneSchedule, ReadKafkaStream, build_stream

    options = pipeline_options(runner_beam_args(settings), settings.runner)
    source = ReadKafkaStream(
        settings.bootstrap,
        settings.topic,
        expansion_service(settings),
        dict(settings.consumer_config),
        out_of_orderness_s=settings.out_of_orderness_seconds,
        partition_idle_after_s=settings.partition_idle_after_seconds,
    )
    schedule = PaneSchedule(settings.allowed_lateness_seconds, settings.early_firing_seconds)
    with own_temp_dir(beam.Pipeline(options=options)) as p:
        try:
            build_stream(p, source, settings.stage_config(), schedule, stream_sinks(settings))
        except (RuntimeError, grpc.RpcError) as exc:
            # Beam raises these while expanding the Java reader: no jar, no java, no service.
            raise SettingsError(
                f"cannot expand the Kafka reader with {settings.expansion_service}: "
                f"{_first_line(exc)}; start one ({START_EXPANSION_SERVICE}) and pass "
                "--expansion-service HOST:PORT"
            ) from None
        result = p.run()
    log.info(
        "submitted the stream of %s to %s (job state %s): window panes to %s, dead letters "
        "to %s; %s judges (backend %s), sample rate %g, %gs windows, %gs allowed lateness, "
        "early panes every %gs",
        settings.topic, settings.runner, result.state, settings.ratings_topic,
        settings.dead_letter_topic, ",".join(settings.judges.names), settings.judges.backend,
        settings.sample_rate, settings.window_seconds, settings.allowed_lateness_seconds,
        settings.early_firing_seconds,
    )
    if settings.wait:
        result.wait_until_finish()
    return 0


def _first_line(exc: BaseException) -> str:
    import grpc

    if isinstance(exc, grpc.RpcError) and hasattr(exc, "details"):
        return str(exc.details())
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]
