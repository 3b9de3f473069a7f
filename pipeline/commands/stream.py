"""`ragpulse stream`: submit one unbounded Beam job that judges a Kafka topic on a distributed
runner (Dataflow, Flink), publishing window panes to a ratings topic.

This module is the command: its flags, its settings, and the submission. The graph is
`pipeline.graphs.unbounded.build_stream`; `ragpulse exporter` turns the ratings topic into /metrics.
Where `serve` runs micro-batches on one machine and keeps its own state, the stream's state
(windows, offsets) is the runner's, and a worker restart is the runner's business.
Deployment: deploy/dataflow/README.md, deploy/flink/README.md.
"""

from __future__ import annotations

import argparse
import logging
from importlib.metadata import version
from typing import TYPE_CHECKING

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.kafka_security import add_kafka_security_arguments, security_from_args
from ragpulse.pipeline.settings.models import (
    STREAM_RUNNERS,
    StreamSettings,
    add_duration_flag,
    add_event_arguments,
    add_judge_arguments,
    add_session_arguments,
    build,
    judge_settings,
    session_fields,
)
from ragpulse.pipeline.settings.sources import add_config_arguments

if TYPE_CHECKING:
    from ragpulse.pipeline.graphs.unbounded import StreamSinks

log = logging.getLogger(__name__)

EXPANSION_JAR = "beam-sdks-java-io-expansion-service-{version}.jar"
# The installed Beam's version, read without importing Beam: the flags (and a refused flag's
# one-line error) should not wait the seconds that import takes; main() imports it.
BEAM_VERSION = version("apache-beam")


def _key_value(text: str) -> str:
    """argparse type for KEY=VALUE (kept as text, so that --print-config shows it as given)."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return text


def _split(text: str) -> tuple[str, str]:
    key, _, value = text.partition("=")
    return key.strip(), value


def configure_parser(p: argparse.ArgumentParser) -> None:
    k = p.add_argument_group("kafka")
    k.add_argument(
        "--kafka-bootstrap", required=True, metavar="HOST:PORT",
        help="Kafka bootstrap servers, comma-separated (as the runner's workers reach them)",
    )
    k.add_argument("--topic", required=True, help="the chatbot's inference-log topic")
    k.add_argument(
        "--dead-letter-topic", default=None,
        help="where invalid records go, with reason, source partition and offset headers "
        "(default: TOPIC.dlq)",
    )
    k.add_argument(
        "--ratings-topic", default=None,
        help="where each window pane is published for `ragpulse exporter`, keyed by window "
        "(default: TOPIC.ratings; make it a compacted topic)",
    )
    add_duration_flag(
        k, "--kafka-timeout", StreamSettings, "kafka_timeout_seconds",
        "timeout of one publish to the dead-letter and ratings topics "
        "(default: {default})",
    )
    k.add_argument(
        "--kafka-consumer-config",
        type=_key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Java Kafka consumer property of the reader (repeatable), e.g. "
        "security.protocol=SASL_SSL, group.id=ragpulse; the reader is Beam's Java KafkaIO, "
        "which does not use the --kafka-* security flags (those are for the publishers)",
    )
    k.add_argument(
        "--expansion-service",
        default=None,
        metavar="HOST:PORT",
        help="a running Beam IO expansion service that expands the Java Kafka reader (default: "
        "Beam starts " + EXPANSION_JAR.format(version=BEAM_VERSION) + " with the local "
        "java, downloading it from Maven Central)",
    )
    add_kafka_security_arguments(p.add_argument_group("kafka security (publishers)"))
    add_event_arguments(p)
    w = p.add_argument_group("panes")
    add_duration_flag(
        w, "--allowed-lateness", StreamSettings, "allowed_lateness_seconds",
        "how long after the watermark passed its end a window still takes late events, "
        "each in a late pane (default: {default}); later ones are "
        "dropped by the runner and counted in its metrics",
        positive=False,
    )
    add_duration_flag(
        w, "--early-firing", StreamSettings, "early_firing_seconds",
        "processing time between early panes of an open window, whole seconds "
        "(default: {default})",
    )
    add_session_arguments(p)
    add_judge_arguments(p)
    b = p.add_argument_group("beam")
    b.add_argument(
        "--runner",
        required=True,
        metavar="NAME",
        help=f"the Beam runner: {', '.join(STREAM_RUNNERS)}; its options with --beam-arg",
    )
    b.add_argument(
        "--beam-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="a Beam pipeline option for the runner (repeatable), e.g. "
        "--beam-arg=--project=P --beam-arg=--region=R (Dataflow) or "
        "--beam-arg=--job_endpoint=HOST:8099 (Flink job server); --streaming is always set",
    )
    b.add_argument(
        "--wait",
        action="store_true",
        help="wait for the job to end instead of returning once it is submitted (needed with "
        "--beam-arg=--environment_type=LOOPBACK, whose workers live in this process)",
    )
    add_config_arguments(p)


def settings_from_args(args: argparse.Namespace) -> StreamSettings:
    """`StreamSettings` from the command line; SettingsError says what is wrong."""
    return build(
        StreamSettings,
        judges=judge_settings(args),
        sample_rate=args.sample_rate,
        window_seconds=args.window,
        max_event_bytes=args.max_event_bytes,
        max_future_skew_seconds=args.max_future_skew,
        bootstrap=args.kafka_bootstrap,
        topic=args.topic,
        dead_letter_topic=args.dead_letter_topic or f"{args.topic}.dlq",
        ratings_topic=args.ratings_topic or f"{args.topic}.ratings",
        kafka_timeout_seconds=args.kafka_timeout,
        kafka_security=security_from_args(args),
        consumer_config=tuple(_split(kv) for kv in args.kafka_consumer_config),
        expansion_service=args.expansion_service,
        allowed_lateness_seconds=args.allowed_lateness,
        early_firing_seconds=args.early_firing,
        runner=args.runner,
        beam_args=tuple(args.beam_arg),
        wait=args.wait,
        **session_fields(args),
    )


def stream_sinks(settings: StreamSettings) -> StreamSinks:
    """The dead-letter and ratings topics, both retried by the runner until acknowledged."""
    from ragpulse.pipeline.graphs.unbounded import StreamSinks
    from ragpulse.pipeline.sinks.kafka import KafkaTopic, PublishDeadLetters, PublishRatings

    def topic(name: str) -> KafkaTopic:
        return KafkaTopic(
            settings.bootstrap, settings.kafka_security, name, settings.kafka_timeout_seconds
        )

    return StreamSinks(
        dead_letters=PublishDeadLetters(topic(settings.dead_letter_topic), runner_retries=True),
        ratings=PublishRatings(topic(settings.ratings_topic)),
    )


def main(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
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
