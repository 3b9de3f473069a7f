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
from ragpulse.pipeline.settings.command_flags import BEAM_VERSION, EXPANSION_JAR
from ragpulse.pipeline.settings.models import StreamSettings

if TYPE_CHECKING:
    from ragpulse.pipeline.graphs.unbounded import StreamSinks

log = logging.getLogger(__name__)


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
            source=ReadKafkaStream(
                settings.bootstrap, settings.labels_topic, dict(settings.consumer_config),
                settings.expansion_service,
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

    options = pipeline_options((*settings.beam_args, "--streaming"), settings.runner)
    source = ReadKafkaStream(
        settings.bootstrap,
        settings.topic,
        dict(settings.consumer_config),
        settings.expansion_service,
    )
    schedule = PaneSchedule(settings.allowed_lateness_seconds, settings.early_firing_seconds)
    with own_temp_dir(beam.Pipeline(options=options)) as p:
        try:
            build_stream(p, source, settings.stage_config(), schedule, stream_sinks(settings))
        except (RuntimeError, grpc.RpcError) as exc:
            # Beam raises these while expanding the Java reader: no jar, no java, no service.
            where = settings.expansion_service or "the expansion service Beam starts"
            raise SettingsError(
                f"cannot expand the Kafka reader (ReadFromKafka) with {where}: "
                f"{_first_line(exc)}; start one (java -jar "
                f"{EXPANSION_JAR.format(version=BEAM_VERSION)} PORT) and pass "
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
