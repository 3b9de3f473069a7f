"""`ragpulse stream` queues review items too: the unbounded graph under TestStream (as in
tests/test_stream_kafka.py) with the review queue on, publishing to a real Apache Kafka topic."""

from __future__ import annotations

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from graph_runs import stage_config
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import read_topic
from test_stream import GROUNDED, SCHEDULE, T0, UNGROUNDED, event, kafka_record

from ragpulse.judges import TextPolicy
from ragpulse.pipeline.formats.review import (
    MAX_REVIEW_ITEM_BYTES,
    ReviewItem,
    TargetedReason,
    decode_item,
)
from ragpulse.pipeline.graphs.unbounded import StreamSinks, build_stream
from ragpulse.pipeline.kafka_security import PLAINTEXT
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.sinks.kafka import KafkaTopic, PublishDeadLetters, PublishRatings
from ragpulse.pipeline.stages.review import HourlyBound, ReviewQueueConfig

pytestmark = [pytest.mark.slow, pytest.mark.kafka]
BIG_WORDS = MAX_REVIEW_ITEM_BYTES // 5 + 1000  # " Also" is 5 bytes: the item is over the limit


def topic_on(broker: ApacheKafkaBroker, topic: str) -> KafkaTopic:
    """`topic` of `broker` as a sink's target (plaintext, 10 s requests)."""
    return KafkaTopic(broker.bootstrap, PLAINTEXT, topic, 10.0)


def stream_review_queue(
    broker: ApacheKafkaBroker, rate: float, targets: tuple[TargetedReason, ...]
) -> ReviewQueueConfig:
    """The stream tests' review queue on `broker`: the topics logs.ratings, logs.dlq,
    logs.review and logs.review.dlq made, the hourly bound reset, items to logs.review."""
    for topic in ("logs.ratings", "logs.dlq", "logs.review", "logs.review.dlq"):
        broker.create_topic(topic)
    HourlyBound.reset()
    return ReviewQueueConfig(
        target=topic_on(broker, "logs.review"), rate=rate, targets=targets, unsure_band=0.1,
        max_per_hour=100, window_seconds=60.0, policy=TextPolicy("on"),
        dead_letters=topic_on(broker, "logs.review.dlq"),
    )


def test_the_stream_publishes_failing_verdicts_to_the_review_topic(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    review = stream_review_queue(kafka_broker, rate=1e-9, targets=("failing",))
    config = stage_config(
        judges=JudgeSettings(backend="local", names=("groundedness",)).spec(),
        window_seconds=60.0, review=review,
    )
    script = (
        TestStream()
        .advance_watermark_to(T0)
        .add_elements([
            kafka_record(0, event("r0", T0 + 5, GROUNDED), T0 + 5),
            kafka_record(1, event("r1", T0 + 6, UNGROUNDED), T0 + 6),
            kafka_record(2, event("r2", T0 + 7, UNGROUNDED), T0 + 7),
            # A failing answer whose item is over the page's limit: a dead letter, not an item.
            kafka_record(3, event("r3", T0 + 8, UNGROUNDED + " Also" * BIG_WORDS), T0 + 8),
        ])
        .advance_watermark_to_infinity()
    )
    sinks = StreamSinks(
        dead_letters=PublishDeadLetters(topic_on(kafka_broker, "logs.dlq"), runner_retries=True),
        ratings=PublishRatings(topic_on(kafka_broker, "logs.ratings")),
    )
    options = PipelineOptions(["--streaming", "--runner=BundleBasedDirectRunner"])
    with beam.Pipeline(options=options) as p:
        build_stream(p, script, config, SCHEDULE, sinks)

    records = read_topic(kafka_broker.bootstrap, "logs.review", 2)
    items = sorted((decode_item(r.value) for r in records), key=lambda i: i.event_id)
    assert [(i.event_id, i.reason, i.reason_judges) for i in items] == [
        ("r1", "failing", ("groundedness",)), ("r2", "failing", ("groundedness",)),
    ]
    assert {r.key for r in records} == {b"r1", b"r2"}
    assert items[0].response == UNGROUNDED and items[0].redacted
    assert items[0].window_start.timestamp() == T0
    [letter] = read_topic(kafka_broker.bootstrap, "logs.review.dlq", 1)
    headers = dict(letter.headers)
    assert letter.key == b"r3"
    assert headers["reason"].startswith(b"too_large: review item of ")
    assert int(headers["original-size"]) > MAX_REVIEW_ITEM_BYTES
    assert decode_item_unbounded(letter.value).event_id == "r3"  # kept whole, not cut
    HourlyBound.reset()


def decode_item_unbounded(value: bytes) -> ReviewItem:
    return ReviewItem.model_validate_json(value)
