"""`ragpulse stream`'s Kafka sinks in the unbounded graph, against a real Apache Kafka broker.

The graph runs under TestStream (tests/test_stream.py says why) with the sinks `ragpulse
stream` uses: each pane published to the ratings topic and read back as the exporter reads it,
each dead letter to the dead-letter topic with its reason. In an unbounded job no caller waits
for the run to end to retry what the broker did not acknowledge, so those sinks fail the
bundle instead, and the runner retries it.
"""

from __future__ import annotations

import threading

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from graph_runs import stage_config
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import read_topic
from test_stream import GROUNDED, SCHEDULE, T0, UNGROUNDED, event, kafka_record

from ragpulse.pipeline.formats import rating_rows
from ragpulse.pipeline.graphs.unbounded import StreamSinks, build_stream
from ragpulse.pipeline.kafka_security import PLAINTEXT
from ragpulse.pipeline.records import Rejected, SourceRecord
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.sinks.kafka import (
    KafkaTopic,
    PublishDeadLetters,
    PublishRatings,
    Unacknowledged,
    _Publish,
    dead_letter_record,
)

pytestmark = pytest.mark.slow


def test_panes_and_dead_letters_reach_their_topics_and_read_back_as_the_published_panes(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    for topic in ("logs.ratings", "logs.dlq"):
        kafka_broker.create_topic(topic, partitions=2)

    def target(topic: str) -> KafkaTopic:
        return KafkaTopic(kafka_broker.bootstrap, PLAINTEXT, topic, 10.0)

    sinks = StreamSinks(
        dead_letters=PublishDeadLetters(target("logs.dlq"), runner_retries=True),
        ratings=PublishRatings(target("logs.ratings")),
    )
    script = (
        TestStream()
        .advance_watermark_to(T0)
        .add_elements([
            kafka_record(0, event("r0", T0 + 5, GROUNDED), T0 + 5),
            kafka_record(1, b"not an event", T0 + 6),
        ])
        .advance_processing_time(SCHEDULE.early_firing_seconds + 1)
        .advance_watermark_to(T0 + 61)
        .add_elements([kafka_record(2, event("r2", T0 + 30, UNGROUNDED), T0 + 30)])
        .advance_watermark_to_infinity()
    )
    config = stage_config(
        judges=JudgeSettings(backend="local", names=("groundedness",)).spec(),
        window_seconds=60.0,
    )
    options = PipelineOptions(["--streaming", "--runner=BundleBasedDirectRunner"])
    with beam.Pipeline(options=options) as p:
        build_stream(p, script, config, SCHEDULE, sinks)

    ratings = read_topic(kafka_broker.bootstrap, "logs.ratings", 3)
    panes = sorted((rating_rows.decode(r.value) for r in ratings), key=lambda p: p.index)
    assert [(p.timing, p.index, p.counts.yes, p.counts.no) for p in panes] == [
        ("early", 0, 1, 0), ("on_time", 1, 1, 0), ("late", 2, 1, 1),
    ]
    # Every pane of the window has the same key, so all land on one partition, in order.
    assert len({(r.key, r.partition) for r in ratings}) == 1
    (letter,) = read_topic(kafka_broker.bootstrap, "logs.dlq", 1)
    headers = dict(letter.headers)
    assert letter.value == b"not an event"
    assert headers["source-offset"] == b"1" and b"not valid JSON" in headers["reason"]


def test_records_the_broker_does_not_acknowledge_fail_the_bundle_so_the_runner_retries_it(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    # The DoFn is driven by hand: the broker must go away between two bundles of one worker,
    # which no runner lets a test time.
    kafka_broker.create_topic("logs.dlq")
    publish = _Publish(KafkaTopic(kafka_broker.bootstrap, PLAINTEXT, "logs.dlq", 2.0),
                       runner_retries=True)
    letter = dead_letter_record(Rejected(SourceRecord(b"x", "logs", 0, 7), "bad"))
    publish.setup()
    try:
        publish.start_bundle()
        publish.process(letter)
        publish.finish_bundle()  # acknowledged
        kafka_broker.stop()
        publish.start_bundle()
        publish.process(letter)
        with pytest.raises(Unacknowledged, match=r"1 records for logs\.dlq not acknowledged"):
            publish.finish_bundle()
    finally:
        publish.teardown()
    # The producer that gave up on the record is closed for good: its I/O thread would
    # otherwise send the record again later and recreate the topic after the test deletes it.
    assert not [t.name for t in threading.enumerate() if t.name.endswith("-network-thread")]
