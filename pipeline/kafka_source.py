"""Bounded reads of a Kafka topic for `ragpulse serve`, one micro-batch at a time.

A cycle asks the broker for every partition's end offset, plans per-partition [start, stop)
ranges from the offsets saved in the state store (`plan_batch`, pure), reads exactly those
ranges inside a bounded Beam pipeline (`ReadKafkaRanges`), and after the state store has saved the
results, commits the new offsets to the consumer group (`commit_offsets`) so that Kafka tools show
the lag. No consumer ever joins the group: partitions are assigned by hand, which is both faster
(no rebalance) and what lets several short-lived consumers cover one cycle.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import apache_beam as beam
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from pipeline.kafka_security import PLAINTEXT, KafkaSecurity, connect

DEFAULT_TIMEOUT_S = 10.0


log = logging.getLogger(__name__)


class KafkaReadError(RuntimeError):
    """A planned offset range could not be read (broker down, topic gone, records missing)."""


class DeadLetterDeliveryError(RuntimeError):
    """The broker did not acknowledge a dead-letter record."""


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaRecord:
    """One record read from the topic; `timestamp_s` is the record timestamp in epoch seconds."""

    partition: int
    offset: int
    timestamp_s: float
    value: bytes
    key: bytes | None = None


def _consumer(
    bootstrap: str, timeout_s: float, security: KafkaSecurity, **config: Any
) -> KafkaConsumer:
    return connect(
        KafkaConsumer,
        bootstrap,
        security,
        enable_auto_commit=False,
        request_timeout_ms=int(timeout_s * 1000) + 1000,
        # The constructor connects eagerly; without this bound it waits 30 s for a broker that
        # is down, whatever timeout the caller asked for.
        bootstrap_timeout_ms=int(timeout_s * 1000),
        **config,
    )


def partitions(
    bootstrap: str,
    topic: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    security: KafkaSecurity = PLAINTEXT,
) -> list[int]:
    """Partition ids of `topic` as the broker reports them now (new partitions show up here)."""
    consumer = _consumer(bootstrap, timeout_s, security)
    try:
        return _partitions(consumer, topic, timeout_s)
    finally:
        consumer.close(autocommit=False)


def _partitions(consumer: KafkaConsumer, topic: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        # A fresh metadata request each call: the cached answer would hide added partitions.
        found = consumer.partitions_for_topic(topic)
        if found:
            return sorted(found)
        if time.monotonic() >= deadline:
            raise KafkaReadError(f"topic {topic!r} not found on {bootstrap_of(consumer)}")
        time.sleep(0.1)


def bootstrap_of(consumer: KafkaConsumer) -> str:
    return str(consumer.config.get("bootstrap_servers"))


def end_offsets(
    bootstrap: str,
    topic: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[int, int]:
    """Offset after the last record of every partition of `topic` (its high watermark).

    Asked with ListOffsets, then checked with one fetch of the last batch: some brokers (Tansu
    0.6) answer ListOffsets with the last batch's base offset + 1, which would leave the rest of
    that batch unread until more data arrived. The fetch response carries the true high
    watermark; with Apache Kafka both answers agree and the check costs one round trip.
    """
    consumer = _consumer(
        bootstrap, timeout_s, security, fetch_max_wait_ms=10, max_poll_records=1
    )
    try:
        parts = _partitions(consumer, topic, timeout_s)
        tps = [TopicPartition(topic, p) for p in parts]
        listed = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
        begins = consumer.beginning_offsets(tps, timeout_ms=int(timeout_s * 1000))
        ends = {tp.partition: int(listed[tp]) for tp in tps}
        probe = [tp for tp in tps if listed[tp] > begins[tp]]
        if probe:
            consumer.assign(probe)
            for tp in probe:
                consumer.seek(tp, listed[tp] - 1)
            waiting = set(probe)
            # A partition whose last batch holds only a transaction marker returns no records
            # (and so no high watermark); it keeps its listed offset after this short bound.
            deadline = time.monotonic() + min(timeout_s, 2.0)
            while waiting and time.monotonic() < deadline:
                consumer.poll(timeout_ms=50)
                for tp in list(waiting):
                    highwater = consumer.highwater(tp)
                    if highwater is not None:
                        ends[tp.partition] = max(ends[tp.partition], int(highwater))
                        waiting.discard(tp)
                        consumer.pause(tp)
        return ends
    finally:
        consumer.close(autocommit=False)


def beginning_offsets(
    bootstrap: str,
    topic: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[int, int]:
    """Offset of the first record still kept in every partition of `topic`."""
    consumer = _consumer(bootstrap, timeout_s, security)
    try:
        tps = [TopicPartition(topic, p) for p in _partitions(consumer, topic, timeout_s)]
        found = consumer.beginning_offsets(tps, timeout_ms=int(timeout_s * 1000))
        return {tp.partition: int(found[tp]) for tp in tps}
    finally:
        consumer.close(autocommit=False)


def plan_batch(
    saved: Mapping[int, int],
    ends: Mapping[int, int],
    max_events: int,
    beginnings: Mapping[int, int] | None = None,
) -> dict[int, tuple[int, int]]:
    """Per-partition [start, stop) ranges for one cycle, at most `max_events` offsets in total.

    A partition missing from `saved` (new, or never read) starts at its beginning offset (0 unless
    `beginnings` says otherwise); a saved offset below the beginning (records deleted by
    retention) starts at the beginning too. The cap is split fairly: every partition with a
    backlog gets an equal share, and what a small backlog leaves unused goes to the others
    (lower partition ids take the remainder of an uneven split). Partitions with nothing to read
    are left out of the result.
    """
    if max_events < 1:
        raise ValueError("max_events must be at least 1")
    begins = beginnings or {}
    starts: dict[int, int] = {}
    backlog: dict[int, int] = {}
    for partition, end in ends.items():
        start = max(saved.get(partition, 0), begins.get(partition, 0))
        if end > start:
            starts[partition] = start
            backlog[partition] = end - start
    quota: dict[int, int] = dict.fromkeys(backlog, 0)
    remaining = max_events
    open_parts = sorted(backlog)
    while remaining > 0 and open_parts:
        share, extra = divmod(remaining, len(open_parts))
        still_open = []
        for i, partition in enumerate(open_parts):
            want = backlog[partition] - quota[partition]
            give = min(want, share + (1 if i < extra else 0))
            quota[partition] += give
            remaining -= give
            if quota[partition] < backlog[partition]:
                still_open.append(partition)
        if len(still_open) == len(open_parts):
            break  # every share was used in full: the cap is spent
        open_parts = still_open
    return {p: (starts[p], starts[p] + quota[p]) for p in sorted(quota) if quota[p] > 0}


def consumer_lag(saved: Mapping[int, int], ends: Mapping[int, int]) -> dict[int, int]:
    """Records not yet covered per partition (for `ragpulse_consumer_lag`)."""
    return {p: max(0, end - saved.get(p, 0)) for p, end in ends.items()}


def read_range(
    consumer: KafkaConsumer,
    topic: str,
    partition: int,
    start: int,
    stop: int,
    *,
    stall_timeout_s: float = 30.0,
    poll_timeout_s: float = 0.5,
) -> Iterator[KafkaRecord]:
    """Records with start <= offset < stop of one partition, in offset order.

    Stops as soon as the consumer's position reaches `stop`, so offsets that do not exist
    (compacted away, transaction markers, aborted records) end the range as well. Offsets the
    range skips are logged as a warning: records deleted by retention before ragpulse read them
    are lost to it, and that must not be silent. Raises KafkaReadError when no progress is made
    for `stall_timeout_s` (broker down, records gone).
    """
    if stop <= start:
        return
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, start)
    last_progress = time.monotonic()
    position = start
    expected = start  # the next offset a gap-free range would hold
    while position < stop:
        batch = consumer.poll(timeout_ms=int(poll_timeout_s * 1000)).get(tp, [])
        for record in batch:
            if record.offset >= stop:
                _log_skipped(topic, partition, expected, stop)
                return
            if record.offset >= start:
                _log_skipped(topic, partition, expected, record.offset)
                expected = record.offset + 1
                yield KafkaRecord(
                    partition=partition,
                    offset=record.offset,
                    timestamp_s=record.timestamp / 1000.0,
                    value=record.value if record.value is not None else b"",
                    key=record.key,
                )
        new_position = int(consumer.position(tp, timeout_ms=int(poll_timeout_s * 1000) + 1000))
        if new_position > position:
            position = new_position
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_timeout_s:
            raise KafkaReadError(
                f"{topic}/{partition}: no progress at offset {position} (range {start}..{stop}) "
                f"for {stall_timeout_s:.0f}s; is the broker at {bootstrap_of(consumer)} up?"
            )
    _log_skipped(topic, partition, expected, stop)


def _log_skipped(topic: str, partition: int, first: int, end: int) -> None:
    if end > first:
        log.warning(
            "%s/%d: offsets %d..%d held no record to read (deleted by retention or compaction, "
            "or transaction markers); %d offsets skipped",
            topic,
            partition,
            first,
            end - 1,
            end - first,
        )


class _ReadRangeFn(beam.DoFn):
    """Reads one (partition, start, stop) element; one consumer per DoFn instance."""

    def __init__(
        self, bootstrap: str, topic: str, stall_timeout_s: float, security: KafkaSecurity
    ) -> None:
        self._bootstrap = bootstrap
        self._security = security
        self._topic = topic
        self._stall_timeout_s = stall_timeout_s
        self._consumer: KafkaConsumer | None = None

    def setup(self) -> None:
        self._consumer = _consumer(
            self._bootstrap,
            DEFAULT_TIMEOUT_S,
            self._security,
            auto_offset_reset="earliest",
            max_poll_records=5000,
            max_partition_fetch_bytes=8 * 1024 * 1024,
            fetch_max_bytes=64 * 1024 * 1024,
        )

    def process(self, element: tuple[int, int, int]) -> Iterator[KafkaRecord]:
        assert self._consumer is not None
        partition, start, stop = element
        yield from read_range(
            self._consumer,
            self._topic,
            partition,
            start,
            stop,
            stall_timeout_s=self._stall_timeout_s,
        )

    def teardown(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None


class ReadKafkaRanges(beam.PTransform):
    """Bounded source: the records of `ranges` ({partition: (start, stop)}) as KafkaRecords."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        ranges: Mapping[int, tuple[int, int]],
        *,
        stall_timeout_s: float = 30.0,
        security: KafkaSecurity = PLAINTEXT,
    ) -> None:
        super().__init__()
        self._bootstrap = bootstrap
        self._security = security
        self._topic = topic
        self._elements = [(p, start, stop) for p, (start, stop) in sorted(ranges.items())]
        self._stall_timeout_s = stall_timeout_s

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "Ranges" >> beam.Create(self._elements)
            # One range per worker bundle when a runner parallelises; a no-op on FnApiRunner.
            | "Spread" >> beam.Reshuffle()
            | "Read"
            >> beam.ParDo(
                _ReadRangeFn(self._bootstrap, self._topic, self._stall_timeout_s, self._security)
            )
        )


def commit_offsets(
    bootstrap: str,
    group_id: str,
    topic: str,
    offsets: Mapping[int, int],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    security: KafkaSecurity = PLAINTEXT,
) -> None:
    """Store `offsets` ({partition: next offset to read}) as `group_id`'s committed offsets.

    The consumer never joins the group (manual assignment, generation -1), which Kafka accepts
    for groups with no active members; Kafka tools then show this group's lag. The state store
    stays the source of truth: these commits are for visibility only.
    """
    if not offsets:
        return
    consumer = _consumer(bootstrap, timeout_s, security, group_id=group_id)
    try:
        tps = {TopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()}
        consumer.assign(list(tps))
        consumer.commit(tps)
    finally:
        consumer.close(autocommit=False)


def committed_offsets(
    bootstrap: str,
    group_id: str,
    topic: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    security: KafkaSecurity = PLAINTEXT,
) -> dict[int, int]:
    """The group's committed offsets for `topic` (partitions without a commit are left out)."""
    consumer = _consumer(bootstrap, timeout_s, security, group_id=group_id)
    try:
        found: dict[int, int] = {}
        for partition in _partitions(consumer, topic, timeout_s):
            offset = consumer.committed(TopicPartition(topic, partition))
            if offset is not None:
                found[partition] = int(offset)
        return found
    finally:
        consumer.close(autocommit=False)


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record that could not be used, sent unchanged to the dead-letter topic with its reason."""

    value: bytes
    reason: str
    source_partition: int
    source_offset: int
    key: bytes | None = None


def produce_dead_letters(
    producer: KafkaProducer, topic: str, rows: Iterable[DeadLetter], *, timeout_s: float = 30.0
) -> int:
    """Send `rows` to `topic` with headers reason / source-partition / source-offset.

    Waits for every acknowledgement and raises DeadLetterDeliveryError if any is missing, so
    the caller does not save its offsets past records that were neither judged nor kept.
    Returns the number of records delivered.
    """
    records = [
        OutputRecord(
            row.value,
            row.key,
            (
                ("reason", row.reason.encode("utf-8")),
                ("source-partition", str(row.source_partition).encode()),
                ("source-offset", str(row.source_offset).encode()),
            ),
        )
        for row in rows
    ]
    try:
        return produce_acknowledged(producer, topic, records, timeout_s=timeout_s)
    except DeliveryError as exc:
        raise DeadLetterDeliveryError(f"dead-letter {exc}") from exc


@dataclasses.dataclass(frozen=True, slots=True)
class OutputRecord:
    """A record serve publishes: dead letters, verdicts."""

    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class DeliveryError(RuntimeError):
    """Some records were not acknowledged by the broker."""


def produce_acknowledged(
    producer: KafkaProducer,
    topic: str,
    records: Iterable[OutputRecord],
    *,
    timeout_s: float = 30.0,
) -> int:
    """Send `records` to `topic` and wait for every acknowledgement (DeliveryError if one is
    missing), so that the caller saves its offsets only past records whose output is kept."""
    try:
        futures = [
            producer.send(topic, value=r.value, key=r.key, headers=list(r.headers))
            for r in records
        ]
        producer.flush(timeout=timeout_s)
        for future in futures:
            future.get(timeout=timeout_s)
    except Exception as exc:
        raise DeliveryError(f"records not acknowledged by topic {topic!r}: {exc!r}") from exc
    return len(futures)
