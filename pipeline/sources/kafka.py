"""Bounded reads of a Kafka topic for `ragpulse serve`, one micro-batch at a time.

A cycle asks the broker for every partition's end offset, plans per-partition [start, stop)
ranges from the offsets saved in the state store (`plan_batch`, pure), reads exactly those
ranges inside a bounded Beam pipeline (`ReadKafkaRanges`), and after the state store has saved
the results, commits the new offsets to the consumer group (`KafkaGroup.commit`) so that Kafka
tools show the lag. No consumer ever joins the group: partitions are assigned by hand, which is
both faster (no rebalance) and what lets several consumers cover one cycle. The consumers serve
asks every cycle are kept between cycles (`KafkaClients`, which alone decides how long a
consumer lives); a read of ranges and the fetch that checks an end get one of their own.

Faults that would lose data quietly are made loud here. A saved offset the partition can no
longer continue from (the topic was recreated, truncated or emptied, or retention deleted records
before they were read) is an `OffsetReset` (`offset_resets`, pure); `reset_starts` applies the
--on-offset-reset policy and says how many records that skips. A record over the size limit is
read as its head only (`SourceRecord.oversize_bytes`). Output records (dead letters, verdict rows)
are delivered by `deliver`, which tells records the broker refused for good from records it did
not acknowledge (yet), so that the caller can bound its retries.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Literal

import apache_beam as beam
from apache_beam.metrics import Metrics
from kafka import KafkaConsumer, TopicPartition
from kafka import errors as kafka_errors
from kafka.structs import OffsetAndMetadata

from ragpulse.pipeline.kafka_security import PLAINTEXT, KafkaSecurity, connect
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import HEAD_BYTES, SourceRecord

DEFAULT_TIMEOUT_S = 10.0
RECORDS_LOST = catalogue.RECORDS_LOST
OffsetResetPolicy = Literal["earliest", "latest", "fail"]


log = logging.getLogger(__name__)


class KafkaReadError(RuntimeError):
    """A planned offset range could not be read (broker down, topic gone, records missing)."""


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
        # topics() asks the broker every time; partitions_for_topic() alone answers from the
        # consumer's metadata cache, which in a kept consumer would hide added partitions and
        # a topic deleted or created since.
        if topic in consumer.topics():
            found = consumer.partitions_for_topic(topic)
            if found:
                return sorted(found)
        if time.monotonic() >= deadline:
            raise KafkaReadError(f"topic {topic!r} not found on {bootstrap_of(consumer)}")
        time.sleep(0.1)


class KafkaClients:
    """Where a process's Kafka consumers live, and for how long: the one place that decides.

    `KafkaClients()` keeps one consumer per key (a role: the topics' bounds, one consumer
    group's commits) from its first use to `close`, so that a serve asking the same questions
    every cycle opens no new connection for them (a new consumer is a bootstrap, a metadata
    request and a socket per broker, in serve and in the broker). A consumer that raised is
    closed and forgotten, so the next use connects afresh, as a new consumer always did: a
    broker outage or restart looks the same to the caller either way. Each use leaves the
    consumer unassigned (no partition, nothing paused, no position kept) for the next. Kept
    consumers ask what has no state in the client (metadata, ListOffsets, the group's commits);
    a fetch gets a consumer of its own (`for_fetch`), and the listed end a fetch confirmed on
    each partition is kept (`end_confirmed`), so that an idle cycle fetches nothing.

    `ONE_SHOT` (keep=False) makes a new consumer for each use and closes it after: for the
    commands that ask once.
    """

    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self._kept: dict[Hashable, KafkaConsumer] = {}
        self._confirmed: dict[TopicPartition, tuple[int, int]] = {}
        # A consumer is not thread-safe: one use at a time.
        self._lock = threading.RLock()

    @contextlib.contextmanager
    def consumer(
        self, key: Hashable, make: Callable[[], KafkaConsumer]
    ) -> Iterator[KafkaConsumer]:
        """The consumer kept under `key` (made by `make` on first use), for one use."""
        if not self.keep:
            consumer = make()
            try:
                yield consumer
            finally:
                consumer.close(autocommit=False)
            return
        with self._lock:
            consumer = self._kept.get(key)
            if consumer is None:
                consumer = self._kept[key] = make()
            try:
                yield consumer
                consumer.assign([])  # no partition, position or pause outlives the use
            except BaseException:
                del self._kept[key]
                _close_quietly(consumer)
                raise

    @contextlib.contextmanager
    def for_fetch(
        self, current: KafkaConsumer, make: Callable[[], KafkaConsumer]
    ) -> Iterator[KafkaConsumer]:
        """A consumer for fetches whose state must not outlive them: `current` when nothing is
        kept, else a new one closed after. A kept consumer's fetch state of a topic deleted
        and recreated since does not recover: with kafka-python 3.0.12 its fetch of the new
        topic's last record never answered again, and a saved offset beyond the new end would
        never have been found."""
        if not self.keep:
            yield current
            return
        with ONE_SHOT.consumer(None, make) as consumer:
            yield consumer

    def end_confirmed(self, tp: TopicPartition, log_start: int, listed: int) -> bool:
        """Whether a fetch confirmed `listed` as `tp`'s end at this log start (the same last
        batch: the same answer again); never when nothing is kept."""
        with self._lock:
            return self._confirmed.get(tp) == (log_start, listed)

    def confirm_end(self, tp: TopicPartition, log_start: int, listed: int) -> None:
        """Keep that a fetch confirmed `listed` as `tp`'s end at `log_start` (the last one per
        partition; not when nothing is kept)."""
        if self.keep:
            with self._lock:
                self._confirmed[tp] = (log_start, listed)

    @property
    def open_count(self) -> int:
        """How many consumers are kept now."""
        with self._lock:
            return len(self._kept)

    def close(self) -> None:
        """Close every kept consumer (serve's stop); a later use opens new ones."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for consumer in kept:
            _close_quietly(consumer)


ONE_SHOT = KafkaClients(keep=False)


def _close_quietly(consumer: KafkaConsumer) -> None:
    try:
        consumer.close(autocommit=False)
    except Exception as exc:  # closing a consumer of a broker that is away: nothing to save
        log.debug("closing a Kafka consumer: %s", exc)


def bootstrap_of(consumer: KafkaConsumer) -> str:
    return str(consumer.config.get("bootstrap_servers"))


@dataclasses.dataclass(frozen=True, slots=True)
class LogBounds:
    """Per partition, the first offset still kept (log start) and the offset after the last.

    `unconfirmed_ends` are partitions whose end is only the ListOffsets answer (no fetch
    confirmed it in time): with Tansu it may be too low, so it must not be taken as proof that
    the partition shrank.
    """

    beginnings: dict[int, int]
    ends: dict[int, int]
    unconfirmed_ends: frozenset[int] = frozenset()

    def only(self, keep: Callable[[int], bool]) -> LogBounds:
        """The bounds of the partitions `keep` says yes to."""
        return LogBounds(
            {p: o for p, o in self.beginnings.items() if keep(p)},
            {p: o for p, o in self.ends.items() if keep(p)},
            frozenset(p for p in self.unconfirmed_ends if keep(p)),
        )


def log_bounds(
    bootstrap: str,
    topic: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    security: KafkaSecurity = PLAINTEXT,
    wait_for_topic: bool = True,
    clients: KafkaClients = ONE_SHOT,
) -> LogBounds:
    """Log start and end offsets of every partition of `topic` (asked with `clients`' consumer
    for bounds on `bootstrap`); without `wait_for_topic`, no bounds at all for a topic that
    does not exist (yet).

    The ends are asked with ListOffsets, then checked with one fetch of the last batch: some
    brokers (Tansu 0.6) answer ListOffsets with the last batch's base offset + 1, which would
    leave the rest of that batch unread until more data arrived. The fetch response carries the
    true high watermark; with Apache Kafka both answers agree and the check costs one round trip.
    A listed end a fetch confirmed at the same log start is not checked again
    (`KafkaClients.end_confirmed`): an idle serve's cycles fetch nothing. One that was not
    confirmed (a higher high watermark, or no answer in time) is checked every time, as before.
    """

    def make() -> KafkaConsumer:
        return _consumer(bootstrap, timeout_s, security, fetch_max_wait_ms=10, max_poll_records=1)

    with clients.consumer(("bounds", bootstrap), make) as consumer:
        try:
            parts = _partitions(consumer, topic, timeout_s if wait_for_topic else 0.0)
        except KafkaReadError:
            if wait_for_topic:
                raise
            return LogBounds({}, {})
        tps = [TopicPartition(topic, p) for p in parts]
        listed = consumer.end_offsets(tps, timeout_ms=int(timeout_s * 1000))
        begins = consumer.beginning_offsets(tps, timeout_ms=int(timeout_s * 1000))
        ends = {tp.partition: int(listed[tp]) for tp in tps}
        probe = [
            tp for tp in tps
            if listed[tp] > begins[tp]
            and not clients.end_confirmed(tp, int(begins[tp]), int(listed[tp]))
        ]
        unconfirmed = set(probe)
        if probe:
            with clients.for_fetch(consumer, make) as fetcher:
                highwaters = _highwaters(fetcher, probe, listed, timeout_s)
            for tp, highwater in highwaters.items():
                unconfirmed.discard(tp)
                if highwater > listed[tp]:
                    ends[tp.partition] = highwater  # checked again next time: Tansu, or a race
                else:
                    clients.confirm_end(tp, int(begins[tp]), int(listed[tp]))
        return LogBounds(
            {tp.partition: int(begins[tp]) for tp in tps},
            ends,
            frozenset(tp.partition for tp in unconfirmed),
        )


def _highwaters(
    consumer: KafkaConsumer,
    probe: list[TopicPartition],
    listed: Mapping[TopicPartition, int],
    timeout_s: float,
) -> dict[TopicPartition, int]:
    """The high watermark of each partition of `probe` that one fetch of its last record
    (before its `listed` end) answered in time."""
    found: dict[TopicPartition, int] = {}
    consumer.assign(probe)
    for tp in probe:
        consumer.seek(tp, listed[tp] - 1)
    # A partition whose last batch holds only a transaction marker returns no records
    # (and so no high watermark); it keeps its listed offset after this short bound.
    deadline = time.monotonic() + min(timeout_s, 2.0)
    while len(found) < len(probe) and time.monotonic() < deadline:
        consumer.poll(timeout_ms=50)
        for tp in probe:
            highwater = consumer.highwater(tp)
            if tp not in found and highwater is not None:
                found[tp] = int(highwater)
                consumer.pause(tp)
    return found


@dataclasses.dataclass(frozen=True, slots=True)
class OffsetReset:
    """A partition whose saved offset it can no longer continue from.

    `beyond_end`: the saved offset is past the partition's end (the topic was recreated,
    truncated or emptied). `below_start`: it is before the partition's log start (retention
    deleted records before they were read).
    """

    partition: int
    saved: int
    log_start: int
    log_end: int
    kind: Literal["beyond_end", "below_start"]


def offset_resets(
    saved: Mapping[int, int],
    beginnings: Mapping[int, int],
    ends: Mapping[int, int],
    unconfirmed_ends: Iterable[int] = (),
) -> list[OffsetReset]:
    """The partitions of `saved` whose offset lies outside [log start, log end].

    A partition in `unconfirmed_ends` is never taken to be beyond its end (see `LogBounds`).
    """
    found = []
    unsure = set(unconfirmed_ends)
    for partition, offset in sorted(saved.items()):
        if partition not in ends:
            continue  # a partition that no longer exists has nothing to read
        start, end = beginnings.get(partition, 0), ends[partition]
        if offset > end and partition not in unsure:
            found.append(OffsetReset(partition, offset, start, end, "beyond_end"))
        elif offset < start:
            found.append(OffsetReset(partition, offset, start, end, "below_start"))
    return found


def reset_starts(
    resets: Iterable[OffsetReset], policy: OffsetResetPolicy
) -> tuple[dict[int, int], dict[str, int]]:
    """Where each reset partition goes on under `policy`, and the records that skips by reason.

    `earliest` goes on from the log start: nothing that can still be read is skipped, and only
    records retention deleted (below_start) are lost. `latest` goes on from the log end, also
    skipping what the partition still holds (reason `topic_reset`). `fail` is the caller's to
    handle (it stops before this point) and is refused here.
    """
    if policy == "fail":
        raise ValueError("policy 'fail' has no restart offset")
    starts: dict[int, int] = {}
    lost = {"retention": 0, "topic_reset": 0}
    for r in resets:
        if r.kind == "below_start":
            lost["retention"] += r.log_start - r.saved
        if policy == "earliest":
            starts[r.partition] = r.log_start
        else:
            starts[r.partition] = r.log_end
            lost["topic_reset"] += r.log_end - r.log_start
    return starts, {reason: n for reason, n in lost.items() if n}


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
    max_value_bytes: int | None = None,
    on_lost: Callable[[int], None] | None = None,
) -> Iterator[SourceRecord]:
    """Records with start <= offset < stop of one partition, in offset order (`position` is
    the offset, `record_time` the record's timestamp in epoch seconds).

    Stops as soon as the consumer's position reaches `stop`, so offsets that do not exist
    (compacted away, transaction markers, aborted records) end the range as well; those are
    logged as a warning. A value longer than `max_value_bytes` is cut to its head at once (see
    `SourceRecord.oversize_bytes`), so the whole value is not kept past this point.

    The consumer must not reset offsets by itself (auto_offset_reset="none"): when retention
    deletes records of the range after it was planned, the read goes on from the new log start
    and the deleted records are reported to `on_lost` (and logged as an error). Raises
    KafkaReadError when the range is beyond the partition's end (the topic was recreated or
    truncated meanwhile: the next cycle sees it; on Apache Kafka the consumer finds it by
    KIP-320 validation of its position, whose leader epoch is that of the records it read, and
    kafka-python raises LogTruncationError) or no progress is made for `stall_timeout_s`
    (broker down, records gone).
    """
    if stop <= start:
        return
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek(tp, start)
    last_progress = time.monotonic()
    position = start
    expected = start  # the next offset a gap-free range would hold
    timeout_ms = int(poll_timeout_s * 1000) + 1000
    while position < stop:
        try:
            batch = consumer.poll(timeout_ms=int(poll_timeout_s * 1000)).get(tp, [])
        except kafka_errors.LogTruncationError:
            raise KafkaReadError(_replaced(topic, partition, position)) from None
        except kafka_errors.OffsetOutOfRangeError:
            log_start = int(consumer.beginning_offsets([tp], timeout_ms=timeout_ms)[tp])
            if log_start <= position:
                raise KafkaReadError(_replaced(topic, partition, position)) from None
            resume = min(log_start, stop)
            log.error(
                "%s/%d: offsets %d..%d were deleted by retention before they were read; "
                "%d records lost",
                topic,
                partition,
                position,
                resume - 1,
                resume - position,
            )
            if on_lost is not None:
                on_lost(resume - position)
            position = expected = resume
            last_progress = time.monotonic()
            if position < stop:
                consumer.seek(tp, position)
            continue
        batch.reverse()  # popped from the end, so that no reference outlives its record
        while batch:
            record = batch.pop()
            if record.offset >= stop:
                _log_skipped(topic, partition, expected, stop)
                return
            if record.offset < start:
                continue
            _log_skipped(topic, partition, expected, record.offset)
            expected = record.offset + 1
            found = _source_record(record, topic, partition, max_value_bytes)
            del record  # an oversized value is dropped here, before the head goes downstream
            yield found
        try:
            new_position = int(consumer.position(tp, timeout_ms=timeout_ms))
        except kafka_errors.LogTruncationError:
            raise KafkaReadError(_replaced(topic, partition, position)) from None
        if new_position > position:
            position = new_position
            last_progress = time.monotonic()
        elif time.monotonic() - last_progress > stall_timeout_s:
            raise KafkaReadError(
                f"{topic}/{partition}: no progress at offset {position} (range {start}..{stop}) "
                f"for {stall_timeout_s:.0f}s; is the broker at {bootstrap_of(consumer)} up?"
            )
    _log_skipped(topic, partition, expected, stop)


def _replaced(topic: str, partition: int, position: int) -> str:
    return (
        f"{topic}/{partition}: offset {position} is beyond the partition's end: "
        "the topic was recreated or truncated while it was read"
    )


def _source_record(
    record: Any, topic: str, partition: int, max_value_bytes: int | None
) -> SourceRecord:
    value = record.value if record.value is not None else b""
    oversize = None
    if max_value_bytes is not None and len(value) > max_value_bytes:
        oversize, value = len(value), value[:HEAD_BYTES]
    return SourceRecord(
        raw=value,
        origin=topic,
        partition=partition,
        position=record.offset,
        record_time=record.timestamp / 1000.0,
        oversize_bytes=oversize,
    )


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


def range_consumer(bootstrap: str, security: KafkaSecurity) -> KafkaConsumer:
    """A consumer for `read_range`: assigned partitions, no group, no offset reset of its own."""
    return _consumer(
        bootstrap,
        DEFAULT_TIMEOUT_S,
        security,
        # read_range handles an offset out of range itself: it must count what it skips.
        auto_offset_reset="none",
        max_poll_records=5000,
        # A record larger than these limits is still returned whole (the broker sends the
        # first batch of a partition whatever its size, KIP-74), so they bound memory per
        # fetch without ever stalling on a big record.
        max_partition_fetch_bytes=8 * 1024 * 1024,
        fetch_max_bytes=64 * 1024 * 1024,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaRangeSource:
    """Where a cycle's offset ranges are read from, and how: the broker, the topic, the
    connection's security, how long a read may make no progress (`stall_timeout_s`) and the
    size over which a value comes as its head (`max_value_bytes`). One value serves the graph's
    reader (`ReadKafkaRanges`) and a read in the calling process (`read`)."""

    bootstrap: str
    topic: str
    security: KafkaSecurity = PLAINTEXT
    stall_timeout_s: float = 30.0
    max_value_bytes: int | None = None

    def consumer(self) -> KafkaConsumer:
        return range_consumer(self.bootstrap, self.security)

    def records(
        self,
        consumer: KafkaConsumer,
        partition: int,
        start: int,
        stop: int,
        on_lost: Callable[[int], None] | None = None,
    ) -> Iterator[SourceRecord]:
        """The records of one range (`read_range`)."""
        return read_range(
            consumer,
            self.topic,
            partition,
            start,
            stop,
            stall_timeout_s=self.stall_timeout_s,
            max_value_bytes=self.max_value_bytes,
            on_lost=on_lost,
        )

    def read(
        self, ranges: Mapping[int, tuple[int, int]], on_lost: Callable[[int], None]
    ) -> Iterator[SourceRecord]:
        """The records of `ranges` ({partition: (start, stop)}), read with one consumer in this
        process; records retention deleted first are reported to `on_lost`. No range, no
        consumer: an idle serve cycle connects for nothing. A new consumer each read: a kept
        one would carry the leader epochs and positions of a topic deleted and recreated since
        its last read into this one, which must find a range beyond the end as it is."""
        if not ranges:
            return
        consumer = self.consumer()
        try:
            for partition, (start, stop) in sorted(ranges.items()):
                yield from self.records(consumer, partition, start, stop, on_lost)
        finally:
            consumer.close(autocommit=False)


class _ReadRangeFn(beam.DoFn):
    """Reads one (partition, start, stop) element; one consumer per DoFn instance."""

    def __init__(self, source: KafkaRangeSource) -> None:
        self._source = source
        self._consumer: KafkaConsumer | None = None

    def setup(self) -> None:
        self._consumer = self._source.consumer()
        # Counted like every other ragpulse counter: a Beam counter, saved with the cycle.
        self._lost = Metrics.counter(
            counting.COUNTER_NAMESPACE,
            counting.encode(
                counting.key(RECORDS_LOST, topic=self._source.topic, reason="retention")
            ),
        )

    def process(self, element: tuple[int, int, int]) -> Iterator[SourceRecord]:
        assert self._consumer is not None
        partition, start, stop = element
        yield from self._source.records(self._consumer, partition, start, stop, self._lost.inc)

    def teardown(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None


class ReadKafkaRanges(beam.PTransform):
    """Bounded source: the records of `ranges` ({partition: (start, stop)}) of `source`'s
    topic as SourceRecords (a value over its size limit comes as its head,
    `SourceRecord.oversize_bytes`)."""

    def __init__(self, source: KafkaRangeSource, ranges: Mapping[int, tuple[int, int]]) -> None:
        super().__init__()
        self._source = source
        self._elements = [(p, start, stop) for p, (start, stop) in sorted(ranges.items())]

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "Ranges" >> beam.Create(self._elements)
            # One range per worker bundle when a runner parallelises; a no-op on FnApiRunner.
            | "Spread" >> beam.Reshuffle()
            | "Read" >> beam.ParDo(_ReadRangeFn(self._source))
        )


@dataclasses.dataclass(frozen=True, slots=True)
class KafkaGroup:
    """Serve's consumer group on one topic, and how it is asked: the broker, the group, the
    topic, how long a request may take (`timeout_s`) and the connection's security. Its
    methods are serve's questions to the broker outside the graph: the topic's log bounds
    (`bounds`) and the group's committed offsets (`commit`, `commits`, `committed`).

    No consumer ever joins the group (manual assignment, generation -1), which Kafka accepts
    for groups with no active members; Kafka tools then show this group's lag. The state store
    stays the source of truth: the commits are for visibility (and serve's owner check,
    `pipeline.service.owners`) only.
    """

    bootstrap: str
    group_id: str
    topic: str
    timeout_s: float = DEFAULT_TIMEOUT_S
    security: KafkaSecurity = PLAINTEXT
    clients: KafkaClients = dataclasses.field(default=ONE_SHOT, compare=False, repr=False)

    def bounds(self) -> LogBounds:
        """The log start and end offsets of every partition of the topic (`log_bounds`)."""
        return log_bounds(
            self.bootstrap, self.topic, timeout_s=self.timeout_s, security=self.security,
            clients=self.clients,
        )

    def commit(self, offsets: Mapping[int, int], metadata: str = "") -> None:
        """Store `offsets` ({partition: next offset to read}) as the group's committed offsets,
        each with the string `metadata` (serve signs its commits)."""
        if not offsets:
            return
        tps = {
            TopicPartition(self.topic, p): OffsetAndMetadata(o, metadata, -1)
            for p, o in offsets.items()
        }
        with self._use() as consumer:
            consumer.assign(list(tps))
            # A bound: a kept consumer's commit would retry a broker that is away for ever.
            consumer.commit(tps, timeout_ms=self._timeout_ms)

    def commits(self) -> dict[int, tuple[int, str | None]]:
        """The committed offset and metadata string of every partition of the topic that has
        a commit (brokers that do not keep metadata give None)."""
        found: dict[int, tuple[int, str | None]] = {}
        with self._use() as consumer:
            for partition in _partitions(consumer, self.topic, self.timeout_s):
                # committed() asks the group's coordinator each time (no cache): a kept
                # consumer sees the other instances' latest commits.
                commit = consumer.committed(
                    TopicPartition(self.topic, partition), metadata=True,
                    timeout_ms=self._timeout_ms,
                )
                if commit is not None:
                    found[partition] = (int(commit.offset), commit.metadata or None)
        return found

    def committed(self) -> dict[int, int]:
        """The committed offsets (partitions without a commit are left out)."""
        return {p: offset for p, (offset, _) in self.commits().items()}

    def delete(self) -> None:
        """Delete the group and its commits (it has no members: none ever joins)."""
        from kafka import KafkaAdminClient

        admin = connect(
            KafkaAdminClient, self.bootstrap, self.security,
            request_timeout_ms=int(self.timeout_s * 1000) + 1000,
        )
        try:
            result = admin.delete_groups([self.group_id])
        finally:
            admin.close()
        error = result.get(self.group_id, "OK")  # {group: "OK" or the error's name}
        if error not in ("OK", "GroupIdNotFoundError"):
            raise RuntimeError(f"deleting consumer group {self.group_id}: {error}")

    def _use(self) -> contextlib.AbstractContextManager[KafkaConsumer]:
        """The group's consumer for one use (kept by `clients`, one per group)."""
        return self.clients.consumer(("group", self.bootstrap, self.group_id), self._consumer)

    @property
    def _timeout_ms(self) -> int:
        return int(self.timeout_s * 1000)

    def _consumer(self) -> KafkaConsumer:
        return _consumer(self.bootstrap, self.timeout_s, self.security, group_id=self.group_id)
