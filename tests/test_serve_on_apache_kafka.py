"""What only a real Apache Kafka broker can stage, against a real `ragpulse serve`.

Records deleted before serve read them, by DeleteRecords (the admin call behind
kafka-delete-records.sh) or by retention deleting segments, are counted as lost
(`ragpulse_records_lost_total{reason="retention"}`, alert RagRecordsLost), logged as an error
and never skipped silently; the consumer group's committed offsets follow serve's saved ones; a
topic deleted and recreated; and records against the broker's real size limits (the topic's
max.message.bytes), for the events read and for the dead letters written.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from kafka.errors import MessageSizeTooLargeError
from kafka_broker import ApacheKafkaBroker, for_module
from serve_process import T0, ServeProcess, TopicFactory, caught_up, saved_offsets

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.sources.kafka import KafkaGroup, log_bounds

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    yield from for_module(apache_kafka)


def events(seed: int, count: int, start: float = T0) -> list[bytes]:
    return [e.payload for e in simulate(seed, count, start, rate=10)]


def wait_for_log_start(broker: ApacheKafkaBroker, topic: str, at_least: int) -> int:
    """Poll the broker's earliest offset of partition 0 until it reaches `at_least`."""
    deadline = time.monotonic() + 60
    while True:
        start = broker.log_start_offsets(topic)[0]
        if start >= at_least:
            return start
        assert time.monotonic() < deadline, (
            f"log start of {topic} still {start} after 60 s:\n{broker.log_text()[-3000:]}"
        )
        time.sleep(0.2)


def lost(m: object, topic: str) -> float:
    return m.total("ragpulse_records_lost_total", topic=topic)  # type: ignore[attr-defined]


def assert_counted_lost(serve: ServeProcess, topic: str, saved: int, log_start: int,
                        read: int) -> None:
    """serve went on from the log start and counted the records in between as lost
    (retention), logging it; the rest was judged. Where it noticed depends on where the pause
    found it: planning the next cycle (the saved offset is below the log start: an offset
    reset too) or reading a range planned before the deletion (an out-of-range read)."""
    m = serve.wait_for(caught_up(read), 90, f"{read} records read")
    assert m.value("ragpulse_records_lost_total", topic=topic, reason="retention") == (
        log_start - saved
    )
    assert m.value("ragpulse_events_total", outcome="accepted") == read
    log = serve.log_text()
    at_plan = f"saved offset {saved} is below the log start of the partition" in log
    at_read = f"offsets {saved}..{log_start - 1} were deleted by retention" in log
    assert at_plan or at_read, log[-3000:]
    resets = m.value("ragpulse_offset_resets_total", topic=topic, kind="below_start")
    assert resets == (1 if at_plan else 0)


def test_delete_records_past_the_saved_offset_counts_the_records_in_between_as_lost(
    served_topic: TopicFactory, broker: ApacheKafkaBroker
) -> None:
    topic = served_topic("delete-records", records=events(71, 100))
    serve = topic.serve()
    serve.wait_for(caught_up(100), 60, "the first 100 records")
    with serve.paused():
        topic.produce(events(72, 50, T0 + 10))  # offsets 100..149
        broker.delete_records(topic.name, {0: 130})  # 100..129 gone before serve read them
        assert wait_for_log_start(broker, topic.name, 130) == 130
    assert_counted_lost(serve, topic.name, saved=100, log_start=130, read=120)
    assert saved_offsets(topic.state, topic.name) == {0: 150}
    assert serve.terminate() == 0


def test_retention_deleting_segments_past_the_saved_offset_counts_them_as_lost(
    served_topic: TopicFactory, broker: ApacheKafkaBroker
) -> None:
    topic = served_topic("retention", records=events(73, 100))
    serve = topic.serve()
    serve.wait_for(caught_up(100), 60, "the first 100 records")
    with serve.paused():
        topic.produce(events(74, 60, T0 + 10))  # offsets 100..159
        # Records stamped now are 1 ms old at once: the retention check (every second) rolls
        # the active segment and deletes every segment; the log start reaches the log end.
        broker.alter_topic_config(topic.name, {"retention.ms": "1"})
        assert wait_for_log_start(broker, topic.name, 160) == 160
        broker.alter_topic_config(topic.name, {"retention.ms": "-1"})
    assert "due to log retention time 1ms breach" in broker.log_text()
    topic.produce(events(75, 20, T0 + 20))  # offsets 160..179, kept
    assert_counted_lost(serve, topic.name, saved=100, log_start=160, read=120)
    assert saved_offsets(topic.state, topic.name) == {0: 180}
    assert serve.terminate() == 0


def test_the_consumer_group_commits_follow_the_saved_offsets_of_every_partition(
    served_topic: TopicFactory, broker: ApacheKafkaBroker
) -> None:
    topic = served_topic("group-commits", partitions=3, records=events(76, 90))
    serve = topic.serve("--group-id", "ragpulse-commits")
    serve.wait_for(caught_up(90), 60, "90 records")
    assert serve.terminate() == 0
    saved = saved_offsets(topic.state, topic.name)
    assert saved == log_bounds(broker.bootstrap, topic.name).ends == {0: 30, 1: 30, 2: 30}
    assert KafkaGroup(broker.bootstrap, "ragpulse-commits", topic.name).committed() == saved


def test_a_topic_deleted_and_recreated_is_read_from_its_new_start_without_loss(
    served_topic: TopicFactory, broker: ApacheKafkaBroker
) -> None:
    topic = served_topic("recreated", records=events(77, 100))
    serve = topic.serve()
    serve.wait_for(caught_up(100), 60, "the first 100 records")
    with serve.paused():
        broker.delete_topic(topic.name)
        broker.create_topic(topic.name, 1)
        topic.produce(events(78, 30, T0 + 10))
    m = serve.wait_for(caught_up(130), 60, "the 30 records of the recreated topic")
    assert m.value("ragpulse_offset_resets_total", topic=topic.name, kind="beyond_end") == 1
    assert lost(m, topic.name) == 0
    assert saved_offsets(topic.state, topic.name) == {0: 30}
    assert serve.terminate() == 0


def test_records_up_to_the_topics_max_message_bytes_are_read_and_dead_lettered_as_their_head(
    served_topic: TopicFactory, broker: ApacheKafkaBroker
) -> None:
    """Apache Kafka refuses a record over max.message.bytes (1 MiB by default), so a topic
    holding 2 and 10 MiB records is one configured for them; serve reads them (the 10 MiB one
    is over its 8 MiB fetch size too) and dead-letters their head to a default topic."""
    topic = served_topic("oversized-real")
    broker.alter_topic_config(topic.name, {"max.message.bytes": str(16 << 20)})
    big = {
        20: json.dumps({"request_id": "big-2", "response": "x" * (2 << 20)}).encode(),
        40: json.dumps({"request_id": "big-10", "response": "y" * (10 << 20)}).encode(),
    }
    values = events(79, 60)
    for at in sorted(big):
        values.insert(at, big[at])
    broker.produce(topic.name, values, partition=0, max_request_size=16 << 20)
    with pytest.raises(MessageSizeTooLargeError):  # the broker's limit holds
        broker.produce(topic.name, [b"z" * (17 << 20)], max_request_size=32 << 20)
    serve = topic.serve()
    m = serve.wait_for(caught_up(62), 90, "all 62 records")
    assert m.value("ragpulse_events_total", outcome="accepted") == 60
    assert m.value("ragpulse_events_total", outcome="invalid") == 2
    assert m.total("ragpulse_dead_letters_undeliverable_total") == 0
    letters = topic.read("dlq", 2)
    assert sorted(int(dict(x.headers)["original-size"]) for x in letters) == sorted(
        len(v) for v in big.values()
    )
    assert all(len(x.value) == 4096 for x in letters)
    assert serve.terminate() == 0


def test_a_dead_letter_over_the_dead_letter_topics_limit_is_sent_as_its_head(
    served_topic: TopicFactory, broker: ApacheKafkaBroker
) -> None:
    """The dead-letter topic takes records of up to 50 kB; an invalid record of 200 kB is
    refused there whole by the broker (MESSAGE_TOO_LARGE), so serve sends its head, saying so;
    nothing is counted undeliverable. (Before: the letter was dropped, counted undeliverable.)"""
    topic = served_topic("small-dlq")
    broker.create_topic("small-dlq.dlq", 1, config={"max.message.bytes": "50000"})
    too_big = b"{" + b"x" * 200_000  # invalid JSON, under serve's 1 MB dead-letter bound
    topic.produce([*events(80, 10), too_big, *events(81, 10, T0 + 5)])
    serve = topic.serve()
    m = serve.wait_for(caught_up(21), 90, "all 21 records")
    assert m.value("ragpulse_events_total", outcome="accepted") == 20
    assert m.value("ragpulse_events_total", outcome="invalid") == 1
    [letter] = topic.read("dlq", 1)
    headers = {k: v.decode() for k, v in letter.headers}
    assert letter.value == too_big[:4096]
    assert (headers["truncated"], headers["original-size"]) == ("true", str(len(too_big)))
    assert "the dead-letter topic refused it whole" in headers["reason"]
    assert "MessageSizeTooLarge" in headers["reason"]
    assert m.total("ragpulse_dead_letters_undeliverable_total") == 0
    assert "were sent as their first 4096 bytes" in serve.log_text()
    assert serve.terminate() == 0
