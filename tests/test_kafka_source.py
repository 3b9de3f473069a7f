"""Bounded Kafka reads against a real Apache Kafka broker, and the pure batch planner."""

from __future__ import annotations

import contextlib
import logging
import time

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.consumer.fetcher import ConsumerRecord
from kafka.errors import KafkaError, KafkaTimeoutError, OffsetOutOfRangeError
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401

from ragpulse.pipeline.records import Rejected, SourceRecord
from ragpulse.pipeline.sinks.kafka import dead_letter_record, deliver
from ragpulse.pipeline.sources.kafka import (
    HEAD_BYTES,
    KafkaClients,
    KafkaGroup,
    KafkaRangeSource,
    KafkaReadError,
    OffsetReset,
    ReadKafkaRanges,
    consumer_lag,
    log_bounds,
    offset_resets,
    partitions,
    plan_batch,
    read_range,
    reset_starts,
)

# --- plan_batch (pure) ---


def test_plan_reads_everything_when_backlog_fits_the_cap() -> None:
    assert plan_batch({0: 5, 1: 0}, {0: 10, 1: 3}, 100) == {0: (5, 10), 1: (0, 3)}


def test_plan_splits_the_cap_evenly_between_busy_partitions() -> None:
    plan = plan_batch({0: 0, 1: 0, 2: 0}, {0: 1000, 1: 1000, 2: 1000}, 90)
    assert plan == {0: (0, 30), 1: (0, 30), 2: (0, 30)}


def test_plan_gives_what_a_small_backlog_leaves_to_the_other_partitions() -> None:
    plan = plan_batch({0: 0, 1: 0, 2: 0}, {0: 2, 1: 1000, 2: 1000}, 100)
    assert plan == {0: (0, 2), 1: (0, 49), 2: (0, 49)}
    assert sum(stop - start for start, stop in plan.values()) == 100


def test_plan_never_exceeds_the_cap_with_an_uneven_split() -> None:
    plan = plan_batch({}, {0: 50, 1: 50, 2: 50}, 10)
    sizes = [stop - start for start, stop in plan.values()]
    assert sum(sizes) == 10
    assert max(sizes) - min(sizes) <= 1


def test_plan_starts_new_partitions_at_their_beginning_offset() -> None:
    plan = plan_batch({0: 7}, {0: 9, 1: 40}, 100, beginnings={0: 0, 1: 25})
    assert plan == {0: (7, 9), 1: (25, 40)}


def test_plan_skips_offsets_deleted_by_retention() -> None:
    assert plan_batch({0: 3}, {0: 20}, 100, beginnings={0: 10}) == {0: (10, 20)}


def test_plan_leaves_out_caught_up_partitions() -> None:
    assert plan_batch({0: 10, 1: 4}, {0: 10, 1: 5}, 100) == {1: (4, 5)}


def test_plan_rejects_a_cap_below_one() -> None:
    with pytest.raises(ValueError, match="max_events"):
        plan_batch({}, {0: 1}, 0)


# --- offset resets (pure) ---


def test_saved_offsets_beyond_the_end_or_below_the_log_start_are_resets() -> None:
    found = offset_resets({0: 100, 1: 5, 2: 40, 3: 7}, {0: 0, 1: 20, 2: 0}, {0: 30, 1: 50, 2: 40})
    assert found == [
        OffsetReset(0, 100, 0, 30, "beyond_end"),  # recreated, or truncated
        OffsetReset(1, 5, 20, 50, "below_start"),  # retention ran ahead
    ]  # partition 2 is caught up; partition 3 no longer exists


def test_an_end_no_fetch_confirmed_is_not_taken_for_a_shrunk_partition() -> None:
    assert offset_resets({0: 100}, {0: 0}, {0: 1}, unconfirmed_ends={0}) == []


def test_earliest_goes_on_from_the_log_start_and_counts_only_what_retention_deleted() -> None:
    resets = [OffsetReset(0, 100, 0, 30, "beyond_end"), OffsetReset(1, 5, 20, 50, "below_start")]
    assert reset_starts(resets, "earliest") == ({0: 0, 1: 20}, {"retention": 15})


def test_latest_goes_on_from_the_end_and_counts_what_it_skips() -> None:
    resets = [OffsetReset(0, 100, 0, 30, "beyond_end"), OffsetReset(1, 5, 20, 50, "below_start")]
    assert reset_starts(resets, "latest") == (
        {0: 30, 1: 50},
        {"retention": 15, "topic_reset": 30 + 30},
    )


def test_lag_counts_records_not_yet_covered() -> None:
    assert consumer_lag({0: 4}, {0: 10, 1: 3}) == {0: 6, 1: 3}


# --- against the broker ---


def test_end_offsets_cover_the_whole_last_batch(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    # Tansu's ListOffsets answered "last batch base + 1"; ten records in one batch must still
    # count as ten, on any broker.
    kafka_broker.create_topic("events", partitions=3)
    kafka_broker.produce("events", [b"x"] * 10, partition=0)
    kafka_broker.produce("events", [b"y"], partition=1)
    assert log_bounds(kafka_broker.bootstrap, "events").ends == {0: 10, 1: 1, 2: 0}


def test_partitions_added_while_running_are_discovered(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("events", partitions=2)
    assert partitions(kafka_broker.bootstrap, "events") == [0, 1]
    kafka_broker.produce("events", [b"old"], partition=1)
    kafka_broker.add_partitions("events", 4)  # CreatePartitions: the records stay
    kafka_broker.produce("events", [b"new"], partition=3)
    assert log_bounds(kafka_broker.bootstrap, "events").ends == {0: 0, 1: 1, 2: 0, 3: 1}


def test_missing_topic_fails_with_its_name(kafka_broker: ApacheKafkaBroker) -> None:  # noqa: F811
    with pytest.raises(KafkaReadError, match="nope"):
        log_bounds(kafka_broker.bootstrap, "nope", timeout_s=0.5)


def test_beam_source_reads_exactly_the_planned_ranges(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("events", partitions=2)
    kafka_broker.produce(
        "events", [f"a{i}".encode() for i in range(20)], partition=0, timestamp_ms=1_700_000_000_000
    )
    kafka_broker.produce("events", [f"b{i}".encode() for i in range(5)], partition=1)
    ranges = {0: (3, 17), 1: (0, 5)}
    expected = [(0, i, f"a{i}".encode()) for i in range(3, 17)] + [
        (1, i, f"b{i}".encode()) for i in range(5)
    ]
    source = KafkaRangeSource(kafka_broker.bootstrap, "events")
    with beam.Pipeline(runner=FnApiRunner()) as p:
        got = (
            p
            | ReadKafkaRanges(source, ranges)
            | beam.Map(lambda r: (r.partition, r.position, r.raw))
        )
        assert_that(got, equal_to(expected))
    # The same source read in this process (serve's read for traces and conversations).
    lost: list[int] = []
    here = [(r.partition, r.position, r.raw) for r in source.read(ranges, lost.append)]
    assert here == expected
    assert lost == []


def test_records_carry_the_kafka_timestamp_in_seconds(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("events")
    kafka_broker.produce("events", [b"v"], timestamp_ms=1_700_000_000_250)
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False)
    records = list(read_range(consumer, "events", 0, 0, 1))
    consumer.close()
    assert records == [SourceRecord(b"v", "events", 0, 0, 1_700_000_000.25)]


def test_range_ending_inside_a_batch_stops_at_its_stop_offset(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("events")
    kafka_broker.produce("events", [b"%d" % i for i in range(100)])  # one batch
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False)
    offsets = [r.position for r in read_range(consumer, "events", 0, 40, 60)]
    consumer.close()
    assert offsets == list(range(40, 60))


def test_range_past_the_end_fails_after_the_stall_bound(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("events")
    kafka_broker.produce("events", [b"only"])
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False)
    started = time.monotonic()
    with pytest.raises(KafkaReadError, match="no progress at offset 1"):
        list(read_range(consumer, "events", 0, 0, 5, stall_timeout_s=1.0, poll_timeout_s=0.2))
    consumer.close()
    assert time.monotonic() - started < 10


def test_group_offsets_are_committed_without_joining_the_group(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("events", partitions=2)
    started = time.monotonic()
    group = KafkaGroup(kafka_broker.bootstrap, "ragpulse", "events")
    group.commit({0: 12, 1: 3})
    elapsed = time.monotonic() - started
    assert group.committed() == {0: 12, 1: 3}
    # A group join takes seconds (~20 s on Tansu); a join-free commit is far below that.
    assert elapsed < 5, f"commit took {elapsed:.1f}s: did the consumer join the group?"
    group.commit({0: 20})
    assert group.committed() == {0: 20, 1: 3}


def test_a_restarted_broker_keeps_its_records_and_a_missing_topic_fails_clearly(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("events")
    kafka_broker.produce("events", [b"a", b"b"])
    kafka_broker.restart()
    assert log_bounds(kafka_broker.bootstrap, "events").ends == {0: 2}
    kafka_broker.delete_topic("events")
    with pytest.raises(KafkaReadError, match="events"):
        log_bounds(kafka_broker.bootstrap, "events", timeout_s=0.5)
    kafka_broker.create_topic("events")
    assert log_bounds(kafka_broker.bootstrap, "events").ends == {0: 0}


def test_kept_consumers_see_added_partitions_new_and_recreated_topics_and_fresh_commits(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    # serve's questions each cycle, on consumers kept between them: what a new consumer per
    # question saw, each answer must still see.
    clients = KafkaClients()
    bootstrap = kafka_broker.bootstrap
    try:
        kafka_broker.create_topic("events", partitions=1)
        kafka_broker.produce("events", [b"a", b"b", b"c"], partition=0)
        assert log_bounds(bootstrap, "events", clients=clients).ends == {0: 3}
        kafka_broker.add_partitions("events", 2)  # the kept consumer's cache knew one
        kafka_broker.produce("events", [b"new"], partition=1)
        assert log_bounds(bootstrap, "events", clients=clients).ends == {0: 3, 1: 1}
        assert log_bounds(bootstrap, "later", clients=clients, wait_for_topic=False).ends == {}
        kafka_broker.create_topic("later")
        assert log_bounds(bootstrap, "later", clients=clients, wait_for_topic=False).ends == {
            0: 0
        }
        # Recreated with fewer records: the saved offset 3 is beyond its end, as it is.
        kafka_broker.delete_topic("events")
        kafka_broker.create_topic("events", partitions=1)
        kafka_broker.produce("events", [b"z"], partition=0)
        bounds = log_bounds(bootstrap, "events", clients=clients)
        assert bounds.ends == {0: 1}
        assert offset_resets({0: 3}, bounds.beginnings, bounds.ends, bounds.unconfirmed_ends) == [
            OffsetReset(0, 3, 0, 1, "beyond_end")
        ]
        # Another instance's commit, made by a consumer of its own, is read back at once.
        kept = KafkaGroup(bootstrap, "ragpulse", "events", clients=clients)
        kept.commit({0: 1}, metadata="mine")
        assert kept.commits() == {0: (1, "mine")}
        KafkaGroup(bootstrap, "ragpulse", "events").commit({0: 0}, metadata="theirs")
        assert kept.commits() == {0: (0, "theirs")}
        assert clients.open_count == 2  # one for the bounds of every topic, one for the group
    finally:
        clients.close()
    assert clients.open_count == 0


def test_a_kept_consumer_that_failed_is_replaced_by_a_new_one_once_the_broker_is_back(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    clients = KafkaClients()
    bootstrap = kafka_broker.bootstrap
    try:
        kafka_broker.create_topic("events")
        kafka_broker.produce("events", [b"a"])
        group = KafkaGroup(bootstrap, "ragpulse", "events", timeout_s=1.0, clients=clients)
        assert group.bounds().ends == {0: 1}
        group.commit({0: 1})
        assert clients.open_count == 2
        kafka_broker.stop()
        try:
            with pytest.raises(KafkaError):
                group.bounds()
            with pytest.raises(KafkaError):
                group.commits()
            assert clients.open_count == 0  # both failed consumers were closed and forgotten
        finally:
            kafka_broker.start()
        kafka_broker.produce("events", [b"b"])
        assert group.bounds().ends == {0: 2}
        assert group.committed() == {0: 1}
    finally:
        clients.close()


def test_dead_letters_keep_the_record_and_say_why(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("dlq")
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap)
    letter = Rejected(SourceRecord(b"{not json", "events", 2, 41), "invalid JSON at line 1")
    delivery = deliver(producer, "dlq", [dead_letter_record(letter)])
    producer.close()
    assert (delivery.delivered, delivery.refused, delivery.unacknowledged) == (1, [], [])
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False)
    consumer.assign([TopicPartition("dlq", 0)])
    consumer.seek(TopicPartition("dlq", 0), 0)
    records = consumer.poll(timeout_ms=5000)[TopicPartition("dlq", 0)]
    consumer.close()
    assert records[0].value == b"{not json"
    assert dict(records[0].headers) == {
        "reason": b"invalid JSON at line 1",
        "source-partition": b"2",
        "source-offset": b"41",
        "original-size": b"9",
        "truncated": b"false",
    }


def test_dead_letters_a_broker_that_is_away_does_not_acknowledge_are_reported(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("dlq")
    producer = KafkaProducer(
        bootstrap_servers=kafka_broker.bootstrap, max_block_ms=1000, request_timeout_ms=1000,
        retries=0,
    )
    kafka_broker.stop()
    records = [dead_letter_record(Rejected(SourceRecord(b"x", "t", 0, i), "bad")) for i in range(3)]
    started = time.monotonic()
    delivery = deliver(producer, "dlq", records, timeout_s=1)
    assert delivery.delivered == 0 and delivery.refused == []
    assert [r for r, _ in delivery.unacknowledged] == records
    # Not one metadata wait per record: the rest are given up once the first cannot be sent.
    assert time.monotonic() - started < 6
    with contextlib.suppress(KafkaTimeoutError):  # close() flushes the undeliverable batch again
        producer.close(timeout=1)


class _GappyConsumer:
    """Stands in for kafka-python's consumer: offsets 2..4 of the partition no longer exist."""

    def __init__(self, offsets: list[int]) -> None:
        self._offsets = offsets
        self._position = 0
        self.config = {"bootstrap_servers": "stand-in"}

    def assign(self, tps: list[TopicPartition]) -> None:
        self._tp = tps[0]

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._position = offset

    def poll(self, timeout_ms: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        batch = [o for o in self._offsets if o >= self._position][:2]
        if not batch:
            return {}
        self._position = batch[-1] + 1
        records = [
            ConsumerRecord(
                topic="t", partition=0, leader_epoch=-1, offset=o, timestamp=1_700_000_000_000,
                timestamp_type=0, key=None, value=b"{}", headers=[], checksum=None,
                serialized_key_size=-1, serialized_value_size=2, serialized_header_size=-1,
            )
            for o in batch
        ]
        return {self._tp: records}

    def position(self, tp: TopicPartition, timeout_ms: int) -> int:
        return self._position


def test_offsets_a_range_cannot_read_are_logged_not_skipped_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = _GappyConsumer([0, 1, 5, 6])
    with caplog.at_level(logging.WARNING, logger="ragpulse.pipeline.sources.kafka"):
        got = [r.position for r in read_range(consumer, "t", 0, 0, 7)]
    assert got == [0, 1, 5, 6]
    assert "offsets 2..4 held no record" in caplog.text
    assert "3 offsets skipped" in caplog.text


class _RetentionConsumer(_GappyConsumer):
    """Stands in for kafka-python's consumer while retention deletes offsets 0..3 under it."""

    def __init__(self) -> None:
        super().__init__([4, 5, 6])
        self._log_start = 4

    def poll(self, timeout_ms: int) -> dict[TopicPartition, list[ConsumerRecord]]:
        if self._position < self._log_start:
            raise OffsetOutOfRangeError({self._tp: self._position})
        return super().poll(timeout_ms)

    def beginning_offsets(self, tps: list[TopicPartition], timeout_ms: int) -> dict:
        return {tp: self._log_start for tp in tps}


def test_records_retention_deleted_during_a_read_are_counted_lost_and_the_read_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lost: list[int] = []
    with caplog.at_level(logging.ERROR, logger="ragpulse.pipeline.sources.kafka"):
        records = read_range(_RetentionConsumer(), "t", 0, 1, 7, on_lost=lost.append)
        got = [r.position for r in records]
    assert got == [4, 5, 6]
    assert lost == [3]  # offsets 1, 2 and 3 of the range
    assert "offsets 1..3 were deleted by retention" in caplog.text


def test_a_record_over_the_limit_is_read_as_its_head_and_the_ones_behind_it_whole(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    # Apache Kafka refuses a record over the topic's max.message.bytes (1 MiB by default):
    # this topic is set up for large records, as a topic with such records must be.
    kafka_broker.create_topic("events", config={"max.message.bytes": str(16 << 20)})
    big = bytes(range(256)) * (10 * 4096)  # 10 MiB: over the reader's 8 MiB fetch size too
    kafka_broker.produce("events", [b"a", big, b"c"], max_request_size=16 << 20)
    with beam.Pipeline(runner=FnApiRunner()) as p:
        got = (
            p
            | ReadKafkaRanges(
                KafkaRangeSource(kafka_broker.bootstrap, "events", max_value_bytes=1 << 20),
                {0: (0, 3)},
            )
            | beam.Map(lambda r: (r.position, r.raw, r.oversize_bytes))
        )
        expected = [(0, b"a", None), (1, big[:HEAD_BYTES], len(big)), (2, b"c", None)]
        assert_that(got, equal_to(expected))


def test_a_topic_recreated_shorter_while_a_range_is_read_fails_the_read_saying_so(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    """The consumer's position carries the leader epoch of the records it read (KIP-320): on
    the recreated topic's shorter log kafka-python finds it truncated (LogTruncationError), which
    must end the read as the documented KafkaReadError, not as a client exception."""
    kafka_broker.create_topic("events")
    for batch in range(0, 20, 5):  # four batches; each fetch brings one (KIP-74)
        kafka_broker.produce("events", [b"%d" % i for i in range(batch, batch + 5)])
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="none",
        max_partition_fetch_bytes=1,
    )
    try:
        records = read_range(consumer, "events", 0, 0, 20)
        first = [next(records).position for _ in range(5)]
        kafka_broker.delete_topic("events")
        kafka_broker.create_topic("events")
        kafka_broker.produce("events", [b"new"])
        with pytest.raises(KafkaReadError, match="recreated or truncated"):
            list(records)
    finally:
        consumer.close()
    assert first == [0, 1, 2, 3, 4]
