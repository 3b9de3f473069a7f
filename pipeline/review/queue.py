"""What `ragpulse review` knows of the topics: the review items queued, the labels given, and
the publisher of new labels.

`ReviewQueue` reads the review topic and the labels topic from their start on a thread of its
own (every partition assigned, no consumer group: each page server sees everything) and keeps
the items (the newest `MAX_ITEMS`) and the label ids, so the page knows which items a reviewer
has not labelled yet and which label would be a second copy. `LabelPublisher` publishes labels
and waits for the broker's acknowledgement: a label the page says is saved is on the topic.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable, Sequence

from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from ragpulse.pipeline.formats.review import (
    MAX_REVIEW_ITEM_BYTES,
    InvalidReviewRecord,
    LabelRecord,
    ReviewItem,
    decode_item,
    decode_label,
    encode_label,
)
from ragpulse.pipeline.kafka_security import KafkaSecurity, connect
from ragpulse.pipeline.sinks.kafka import (
    KafkaTopic,
    OutputRecord,
    close_producer,
    dead_letter_head,
    deliver,
    new_producer,
    review_dead_letter,
)

log = logging.getLogger(__name__)

MAX_ITEMS = 50_000  # items kept in memory; the oldest are forgotten beyond that
_POLL_S = 0.5


@dataclasses.dataclass(frozen=True)
class QueueStatus:
    """How the topics' reading goes: items held, records refused (by reason: `too_large`,
    `invalid`; each one dead-lettered), the last read error."""

    items: int
    labels: int
    refused: dict[str, int]
    error: str | None
    # The queue's depth: items held that no reviewer has labelled a judge of yet, and
    # review-topic records not read yet (end offsets less the page's positions, as of the
    # last poll).
    unlabelled: int = 0
    unread: int = 0


# Publishes one dead letter (key, value, headers) and returns once the broker acknowledged it;
# raises otherwise (the reader then reads the topics again from their start: none is lost).
DeadLetters = Callable[[OutputRecord], None]


def dead_letter_publisher(target: KafkaTopic) -> DeadLetters:
    """Dead letters to `target`, each acknowledged before the reader goes on."""
    producer: list[KafkaProducer] = []

    def publish(record: OutputRecord) -> None:
        if not producer:
            producer.append(new_producer(target))
        d = deliver(producer[0], target.topic, [record], timeout_s=target.timeout_s)
        problems = d.refused + d.unacknowledged
        if problems and d.refused:  # too large even for the dead-letter topic: its head
            head = dead_letter_head(record, problems[0][1])
            if head is not None:
                d = deliver(producer[0], target.topic, [head], timeout_s=target.timeout_s)
                problems = d.refused + d.unacknowledged
        if problems:
            close_producer(producer.pop(), 0)
            raise RuntimeError(f"dead letter to {target.topic} not acknowledged: "
                               f"{problems[0][1]}")

    return publish


def refused_record(topic: str, partition: int, offset: int, key: bytes | None, value: bytes,
                   reason: str) -> OutputRecord:
    """A review-topic record the page cannot use, as a dead letter (`review_dead_letter`)."""
    return review_dead_letter(value, key, reason, (
        ("source-topic", topic.encode("utf-8")),
        ("source-partition", str(partition).encode()),
        ("source-offset", str(offset).encode()),
    ))


class ReviewQueue:
    """The review items and label ids read so far, and who labelled what (thread-safe)."""

    def __init__(self, bootstrap: str, security: KafkaSecurity, review_topic: str,
                 labels_topic: str, timeout_s: float,
                 dead_letters: DeadLetters | None = None) -> None:
        self._bootstrap = bootstrap
        self._security = security
        self._topics = (review_topic, labels_topic)
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._items: collections.OrderedDict[str, ReviewItem] = collections.OrderedDict()
        self._label_ids: set[str] = set()
        # (event id, reviewer) -> the judges that reviewer labelled on that item.
        self._labelled: dict[tuple[str, str], set[str]] = {}
        self._skipped: dict[str, set[str]] = {}
        self._dead_letters = dead_letters
        self._refused: dict[str, int] = {}
        # The review-topic records refused and dead-lettered since this reading began (a
        # re-read after an error refuses them again: they are not sent twice).
        self._lettered: set[tuple[int, int]] = set()
        self._error: str | None = None
        self._unread_count = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading the topics ---------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="review-queue", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        consumer: KafkaConsumer | None = None
        assigned: set[TopicPartition] = set()
        while not self._stop.is_set():
            try:
                if consumer is None:
                    consumer = connect(
                        KafkaConsumer, self._bootstrap, self._security,
                        enable_auto_commit=False, group_id=None,
                        request_timeout_ms=int(self._timeout_s * 1000) + 5000,
                    )
                assigned = self._assign(consumer, assigned)
                batches = consumer.poll(timeout_ms=int(_POLL_S * 1000)) if assigned else {}
                if not assigned:
                    self._stop.wait(_POLL_S)
                for tp, records in batches.items():
                    for record in records:
                        self._take(tp.topic, record.value or b"", tp.partition,
                                   record.offset, record.key)
                unread = self._unread(consumer, assigned)
                with self._lock:
                    self._error = None
                    self._unread_count = unread
            except Exception as exc:  # the broker away, a topic gone: said on the page, retried
                with self._lock:
                    self._error = f"{type(exc).__name__}: {exc}"
                log.warning("reading the review topics: %s", exc)
                if consumer is not None:
                    try:
                        consumer.close()
                    except Exception as close_exc:
                        log.debug("closing the consumer: %s", close_exc)
                consumer, assigned = None, set()
                self._stop.wait(2.0)
        if consumer is not None:
            consumer.close()

    def _unread(self, consumer: KafkaConsumer, assigned: set[TopicPartition]) -> int:
        """Review-topic records past the page's positions (the broker's end offsets now)."""
        review = sorted(tp for tp in assigned if tp.topic == self._topics[0])
        if not review:
            return 0
        ends = consumer.end_offsets(review)
        return sum(max(0, ends[tp] - consumer.position(tp)) for tp in review)

    def _assign(
        self, consumer: KafkaConsumer, assigned: set[TopicPartition]
    ) -> set[TopicPartition]:
        """Every partition of both topics (new ones too), read from their start."""
        wanted = set(assigned)
        for topic in self._topics:
            for p in consumer.partitions_for_topic(topic) or ():
                wanted.add(TopicPartition(topic, p))
        if wanted != assigned:
            new = wanted - assigned
            consumer.assign(sorted(wanted))
            consumer.seek_to_beginning(*new)
        return wanted

    def _take(self, topic: str, value: bytes, partition: int = 0, offset: int = -1,
              key: bytes | None = None) -> None:
        try:
            if topic == self._topics[0]:
                self.add_item(decode_item(value))
            else:
                self.add_label(decode_label(value))
        except InvalidReviewRecord as exc:
            if topic != self._topics[0]:
                # The labels topic's consumers (serve, stream) dead-letter bad labels.
                log.warning("a record of %s is not a label and is left out: %s", topic, exc)
                return
            self.refuse(topic, partition, offset, key, value, str(exc))

    def refuse(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes,
               why: str) -> None:
        """A review-topic record the page cannot show: dead-lettered with its reason (once per
        record) and counted; raises when the dead letter is not acknowledged."""
        reason = "too_large" if len(value) > MAX_REVIEW_ITEM_BYTES else "invalid"
        with self._lock:
            if (partition, offset) in self._lettered:
                return
        if self._dead_letters is not None:
            self._dead_letters(refused_record(topic, partition, offset, key, value,
                                              f"{reason}: {why}"))
        log.warning("a review item of %s (partition %d, offset %d) cannot be shown and is "
                    "dead-lettered: %s", topic, partition, offset, why)
        with self._lock:
            self._lettered.add((partition, offset))
            self._refused[reason] = self._refused.get(reason, 0) + 1

    # -- what the page asks ---------------------------------------------------------------------

    def add_item(self, item: ReviewItem) -> None:
        with self._lock:
            self._items.pop(item.event_id, None)  # a republished item keeps one place, the last
            self._items[item.event_id] = item
            while len(self._items) > MAX_ITEMS:
                self._items.popitem(last=False)

    def add_label(self, label: LabelRecord) -> None:
        with self._lock:
            self._label_ids.add(label.label_id)
            self._labelled.setdefault((label.event_id, label.reviewer), set()).add(label.judge)

    def item(self, event_id: str) -> ReviewItem | None:
        with self._lock:
            return self._items.get(event_id)

    def has_label(self, label_id: str) -> bool:
        with self._lock:
            return label_id in self._label_ids

    def skip(self, reviewer: str, event_id: str) -> None:
        with self._lock:
            self._skipped.setdefault(reviewer, set()).add(event_id)

    def next_item(self, reviewer: str) -> ReviewItem | None:
        """The first item `reviewer` has verdicts left to label on (random items first: they
        feed the unbiased estimate), skipping those they skipped."""
        with self._lock:
            skipped = self._skipped.get(reviewer, set())
            for want_random in (True, False):
                for item in self._items.values():
                    if item.random != want_random or item.event_id in skipped:
                        continue
                    if self._open_judges(item, reviewer):
                        return item
        return None

    def open_judges(self, item: ReviewItem, reviewer: str) -> list[str]:
        with self._lock:
            return self._open_judges(item, reviewer)

    def _open_judges(self, item: ReviewItem, reviewer: str) -> list[str]:
        done = self._labelled.get((item.event_id, reviewer), set())
        return [v.judge for v in item.verdicts if v.rating != "error" and v.judge not in done]

    def status(self) -> QueueStatus:
        with self._lock:
            labelled = {event_id for event_id, _ in self._labelled}
            unlabelled = sum(1 for event_id in self._items if event_id not in labelled)
            return QueueStatus(len(self._items), len(self._label_ids), dict(self._refused),
                               self._error, unlabelled, self._unread_count)


class LabelNotSaved(RuntimeError):
    """The broker did not acknowledge a label; the message says why."""


class LabelPublisher:
    """Publishes labels to the labels topic, keyed by event id and judge, and waits for them."""

    def __init__(self, target: KafkaTopic) -> None:
        self._target = target
        self._lock = threading.Lock()
        self._producer: KafkaProducer | None = None

    def publish(self, labels: Sequence[LabelRecord]) -> None:
        """Every label acknowledged, or LabelNotSaved (then none may be taken as saved; sending
        them again is safe: a label's id says it is the same label)."""
        records = [OutputRecord(value, key) for key, value in map(encode_label, labels)]
        with self._lock:
            try:
                if self._producer is None:
                    self._producer = new_producer(self._target)
                d = deliver(self._producer, self._target.topic, records,
                            timeout_s=self._target.timeout_s)
            except Exception as exc:  # no broker to connect to
                self._close()
                raise LabelNotSaved(f"{type(exc).__name__}: {exc}") from None
            problems = d.refused + d.unacknowledged
            if problems:
                self._close()
                raise LabelNotSaved(problems[0][1])

    def _close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            close_producer(producer, 0)

    def close(self) -> None:
        with self._lock:
            self._close()

