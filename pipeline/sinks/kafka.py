"""Kafka sinks of the graph: dead letters and verdict rows, published and acknowledged.

`PublishDeadLetters` and `PublishVerdicts` are the last steps of serve's Beam graph
(`pipeline.graphs.bounded`). Each bundle's records are sent and their acknowledgements awaited
before the bundle ends (`deliver`), so when the run returns every record is delivered, refused for
good, or reported as unacknowledged; serve saves the cycle's offsets only after that. `deliver`
tells records the broker refused for good (counted at once in
`ragpulse_dead_letters_undeliverable_total`) from records it did not acknowledge (yet): those are
handed to the caller (a Beam counter in UNACKNOWLEDGED_NAMESPACE, named by topic and reason),
which fails the cycle, or gives up on them after --undeliverable-after.

In `ragpulse stream`'s unbounded pipeline no caller waits for the run to end, so there the
sinks raise `Unacknowledged` instead: the runner retries the bundle (Dataflow and Flink retry
a failed bundle of a streaming job until it succeeds), which sends the bundle's records again
(at least once). `PublishRatings` publishes the stream's window panes (`rating_rows`), and
`PublishReviewItems` the review queue's items (`formats.review`) of both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import apache_beam as beam
import orjson
from apache_beam.metrics import Metrics
from kafka import KafkaProducer
from kafka import errors as kafka_errors

from ragpulse.judges import TextPolicy
from ragpulse.pipeline.composite import composite_transform
from ragpulse.pipeline.formats import rating_rows
from ragpulse.pipeline.formats.verdict_rows import verdict_row
from ragpulse.pipeline.kafka_security import KafkaSecurity, connect
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import HEAD_BYTES, Rejected

log = logging.getLogger(__name__)

UNDELIVERABLE = catalogue.UNDELIVERABLE
UNACKNOWLEDGED_NAMESPACE = "ragpulse.unacknowledged"
# Dead letters carry the whole record up to this size and only its head above it: Kafka's
# default limits on one record (broker message.max.bytes, producer max.request.size) are 1 MiB,
# and the headers and the batch framing need room too.
DEAD_LETTER_MAX_VALUE_BYTES = 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class OutputRecord:
    """A record ragpulse publishes: dead letters, verdict rows, rating rows (stream)."""

    value: bytes
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


def dead_letter_record(rejected: Rejected) -> OutputRecord:
    """The dead-letter record: the value (bounded, see DEAD_LETTER_MAX_VALUE_BYTES) with headers
    reason, source-partition, source-offset, original-size and truncated."""
    record = rejected.record
    size = len(record.raw) if record.oversize_bytes is None else record.oversize_bytes
    value = record.raw
    if len(value) > DEAD_LETTER_MAX_VALUE_BYTES:
        value = value[:HEAD_BYTES]
    return OutputRecord(
        value,
        None,
        (
            ("reason", rejected.reason.encode("utf-8")),
            ("source-partition", str(record.partition).encode()),
            ("source-offset", str(record.position).encode()),
            ("original-size", str(size).encode()),
            ("truncated", b"true" if len(value) < size else b"false"),
        ),
    )


def dead_letter_head(record: OutputRecord, why: str) -> OutputRecord | None:
    """The dead letter again as the head of its value (HEAD_BYTES), for a dead-letter topic
    whose max.message.bytes is below the record; None if it is not a whole dead letter."""
    headers = dict(record.headers)
    if headers.get("truncated") != b"false" or len(record.value) <= HEAD_BYTES:
        return None
    reason = headers["reason"] + f"; the dead-letter topic refused it whole: {why}".encode()
    return OutputRecord(
        record.value[:HEAD_BYTES],
        record.key,
        tuple(
            (k, reason if k == "reason" else b"true" if k == "truncated" else v)
            for k, v in record.headers
        ),
    )


# Refusals that concern the record itself: sending the same bytes again can never succeed.
# Every other error (broker away, timeouts, authorization, unknown server errors) may clear up.
_REFUSED_RECORD = (
    kafka_errors.MessageSizeTooLargeError,
    kafka_errors.RecordListTooLargeError,
    kafka_errors.InvalidRecordError,
    kafka_errors.CorruptRecordError,
)


@dataclasses.dataclass(frozen=True)
class Delivery:
    """What became of records sent to one topic.

    `refused`: records the broker (or the producer, for its size limit) refused for good, with
    the reason. `unacknowledged`: records not acknowledged for a reason that may clear up
    (broker away, timeout, not authorised, server error), with the reason.
    """

    topic: str
    delivered: int
    refused: list[tuple[OutputRecord, str]]
    unacknowledged: list[tuple[OutputRecord, str]]


def describe_error(exc: BaseException) -> str:
    """One line about a Kafka error, with the broker's own description of its code."""
    text = str(exc).removesuffix(": None") or type(exc).__name__
    description = getattr(exc, "description", None)
    return f"{text} ({description})" if description else text


def deliver(
    producer: KafkaProducer,
    topic: str,
    records: Iterable[OutputRecord],
    *,
    timeout_s: float = 30.0,
) -> Delivery:
    """Send `records` to `topic` and wait up to `timeout_s` for every acknowledgement.

    Never raises for a record: each one ends delivered, refused or unacknowledged (see
    `Delivery`), and the caller decides whether to retry. Once a send fails for a reason that
    may clear up (the producer could not even get the topic's metadata), the rest are left
    unacknowledged without trying, since each would wait as long again.
    """
    pending = list(records)
    sent: list[tuple[OutputRecord, Any]] = []
    refused: list[tuple[OutputRecord, str]] = []
    unacknowledged: list[tuple[OutputRecord, str]] = []
    for i, record in enumerate(pending):
        try:
            future = producer.send(
                topic, value=record.value, key=record.key, headers=list(record.headers)
            )
        except _REFUSED_RECORD as exc:
            refused.append((record, describe_error(exc)))
            continue
        except Exception as exc:
            why = describe_error(exc)
            unacknowledged.extend((rest, why) for rest in pending[i:])
            break
        sent.append((record, future))
    # On a timeout, the futures below tell which records are still unacknowledged.
    with contextlib.suppress(kafka_errors.KafkaTimeoutError):
        producer.flush(timeout=timeout_s)
    delivered = 0
    for record, future in sent:
        try:
            future.get(timeout=0.01)
        except _REFUSED_RECORD as exc:
            refused.append((record, describe_error(exc)))
        except Exception as exc:
            unacknowledged.append((record, describe_error(exc)))
        else:
            delivered += 1
    return Delivery(topic, delivered, refused, unacknowledged)


@dataclasses.dataclass(frozen=True)
class KafkaTopic:
    """Where and how to publish: the broker, its security settings, the topic, the timeout."""

    bootstrap: str
    security: KafkaSecurity
    topic: str
    timeout_s: float


def new_producer(target: KafkaTopic) -> KafkaProducer:
    timeout_ms = int(target.timeout_s * 1000)
    return connect(
        KafkaProducer,
        target.bootstrap,
        target.security,
        acks="all",
        linger_ms=5,
        request_timeout_ms=timeout_ms,
        # Connecting and waiting for metadata take 30 s and 60 s by default: bound them by
        # --kafka-timeout too, so a broker outage fails the cycle in that time.
        bootstrap_timeout_ms=timeout_ms,
        max_block_ms=timeout_ms,
    )


def close_producer(producer: KafkaProducer, timeout_s: float) -> None:
    """Close `producer` for good: its unsent records are given up on after `timeout_s`.

    kafka-python 3's `close` flushes first and raises KafkaTimeoutError when records are still
    pending (a broker outage), before it stops its I/O thread: that producer would live on,
    retrying the records (sent again later, after the caller gave up on them) and refreshing
    metadata, which recreates a deleted topic on a broker that creates topics on demand. So
    then its I/O thread is stopped without sending (`force_close`) and the close completed.
    """
    try:
        producer.close(timeout=timeout_s)
        return
    except kafka_errors.KafkaTimeoutError:
        pass
    sender = producer._sender  # no public way to abandon pending records
    if sender is not None:
        sender.force_close()
        sender.join(timeout=max(timeout_s, 5.0))
    producer.close(timeout=0)  # the pending records failed with the I/O thread: nothing waits


def count_unacknowledged(where: str, why: str, n: int) -> None:
    """Hands `n` outputs that `where` (a topic, an endpoint) did not acknowledge, and why, to the
    caller (a Beam counter in UNACKNOWLEDGED_NAMESPACE, which pipeline.graphs.bounded reads)."""
    Metrics.counter(UNACKNOWLEDGED_NAMESPACE, orjson.dumps([where, why]).decode()).inc(n)


def decode_unacknowledged(name: str) -> tuple[str, str]:
    """(where, why) of a counter `count_unacknowledged` made."""
    where, why = orjson.loads(name)
    return where, why


def count_undeliverable(where: str, n: int) -> None:
    """Counts `n` outputs that `where` refused for good (ragpulse_undeliverable_total)."""
    Metrics.counter(
        counting.COUNTER_NAMESPACE, counting.encode(counting.key(UNDELIVERABLE, topic=where))
    ).inc(n)


class SendPerBundle(beam.DoFn):
    """A sink's DoFn that sends the elements of a bundle together when the bundle ends (one
    request, one wait for acknowledgements), by `send`."""

    def start_bundle(self) -> None:
        self._bundle: list[Any] = []

    def process(self, element: Any) -> None:
        self._bundle.append(element)

    def finish_bundle(self) -> None:
        bundle, self._bundle = self._bundle, []
        if bundle:
            self.send(bundle)

    def send(self, bundle: list[Any]) -> None:
        """Sends one bundle's elements (they are never empty)."""
        raise NotImplementedError


class Unacknowledged(RuntimeError):
    """Records of a bundle the broker did not acknowledge; the runner retries the bundle."""


class _Publish(SendPerBundle):
    """Sends a bundle's records when the bundle ends and waits for their acknowledgements.

    With `runner_retries`, unacknowledged records fail the bundle (`Unacknowledged`) instead of
    being reported to the caller as a Beam counter.
    """

    def __init__(self, target: KafkaTopic, runner_retries: bool = False) -> None:
        self._target = target
        self._runner_retries = runner_retries

    def setup(self) -> None:
        self._producer: KafkaProducer | None = None

    def send(self, records: list[OutputRecord]) -> None:
        target = self._target
        if self._producer is None:
            self._producer = new_producer(target)
        d = deliver(self._producer, target.topic, records, timeout_s=target.timeout_s)
        d = self._send_heads_of_large_letters(d)
        if d.refused or d.unacknowledged:
            # After some broker errors kafka-python's (idempotent) producer aborts every later
            # batch too ("fatal error"): the next bundle gets a new producer.
            self._close(timeout=0)
        if d.delivered:
            log.info("published %d records to %s", d.delivered, d.topic)
        if d.refused:
            _log_refused(d)
            count_undeliverable(target.topic, len(d.refused))
        if d.unacknowledged and self._runner_retries:
            raise Unacknowledged(
                f"{len(d.unacknowledged)} records for {d.topic} not acknowledged "
                f"({d.unacknowledged[0][1]}); the bundle is retried"
            )
        for why, n in Counter(why for _, why in d.unacknowledged).items():
            count_unacknowledged(d.topic, why, n)

    def _send_heads_of_large_letters(self, d: Delivery) -> Delivery:
        """Dead letters the topic refused as too large go again as their head (a dead-letter
        topic may take smaller records than the source topic); the rest stay refused."""
        heads = [
            (head, record, why)
            for record, why in d.refused
            if "MessageSizeTooLarge" in why and (head := dead_letter_head(record, why))
        ]
        if not heads or self._producer is None:
            return d
        self._close(timeout=0)  # the producer may have aborted after the refusal
        self._producer = new_producer(self._target)
        again = deliver(self._producer, d.topic, [h for h, _, _ in heads],
                        timeout_s=self._target.timeout_s)
        log.warning(
            "%d dead letters for %s were over its size limit and were sent as their first "
            "%d bytes (header truncated=true)", again.delivered, d.topic, HEAD_BYTES,
        )
        retried = {id(record) for _, record, _ in heads}
        return Delivery(
            d.topic,
            d.delivered + again.delivered,
            [(r, why) for r, why in d.refused if id(r) not in retried] + again.refused,
            d.unacknowledged + again.unacknowledged,
        )

    def _close(self, timeout: float) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            close_producer(producer, timeout)

    def teardown(self) -> None:
        self._close(timeout=5)


def _log_refused(d: Delivery) -> None:
    reasons = Counter(why for _, why in d.refused)
    log.error(
        "%d records for %s are undeliverable and were dropped (%s); first: %s",
        len(d.refused),
        d.topic,
        "; ".join(f"{n} x {why}" for why, n in reasons.most_common()),
        ", ".join(identify(record) for record, _ in d.refused[:5]),
    )


def identify(record: OutputRecord) -> str:
    """Where a dead letter came from (partition/offset), or a verdict row's request_id."""
    headers = dict(record.headers)
    if "source-offset" in headers:
        return f"{headers['source-partition'].decode()}/{headers['source-offset'].decode()}"
    return (record.key or b"?").decode(errors="replace")


def _publish(
    elements: Any,
    to_record: Callable[[Any], OutputRecord],
    target: KafkaTopic,
    runner_retries: bool = False,
) -> Any:
    """The steps of every Kafka sink: each element as a record (`to_record`), published."""
    return (
        elements
        | "ToRecord" >> beam.Map(to_record)
        | "Publish" >> beam.ParDo(_Publish(target, runner_retries))
    )


@composite_transform
def PublishDeadLetters(rejected: Any, target: KafkaTopic, *, runner_retries: bool = False) -> Any:
    """Sink: `Rejected` records to the dead-letter topic, with reason and source headers.

    `runner_retries`: unacknowledged records fail the bundle, for unbounded pipelines.
    """
    return _publish(rejected, dead_letter_record, target, runner_retries)


def _rating_record(pane: rating_rows.RatingPane) -> OutputRecord:
    key, value = rating_rows.encode(pane)
    return OutputRecord(value, key)


@composite_transform
def PublishRatings(panes: Any, target: KafkaTopic) -> Any:
    """Sink of `ragpulse stream`: each window pane as a rating row, keyed by its window; the
    runner retries a bundle the broker did not acknowledge."""
    return _publish(panes, _rating_record, target, runner_retries=True)


@composite_transform
def PublishLabelCounts(rows: Any, target: KafkaTopic) -> Any:
    """Sink of `ragpulse stream`: the label counts so far (formats/label_counts.py), as
    (Kafka key, value) rows, to the ratings topic; the runner retries an unacknowledged bundle."""
    return _publish(rows, _review_record, target, runner_retries=True)


def _verdict_record(policy: TextPolicy) -> Callable[[Any], OutputRecord]:
    def to_record(judged: Any) -> OutputRecord:
        row = verdict_row(judged, policy)
        return OutputRecord(orjson.dumps(row), row["request_id"].encode())

    return to_record


@composite_transform
def PublishVerdicts(judged: Any, target: KafkaTopic, policy: TextPolicy) -> Any:
    """Sink: verdict rows (the verdicts.jsonl format of `ragpulse run`), keyed by request_id."""
    return _publish(judged, _verdict_record(policy), target)


def _review_record(item: tuple[bytes, bytes]) -> OutputRecord:
    key, value = item
    return OutputRecord(value, key)


@composite_transform
def PublishReviewItems(items: Any, target: KafkaTopic, *, runner_retries: bool = False) -> Any:
    """Sink of the review queue (stages/review.py): encoded review items, keyed by event id."""
    return _publish(items, _review_record, target, runner_retries)


def review_dead_letter(
    value: bytes, key: bytes | None, reason: str, source: tuple[tuple[str, bytes], ...] = ()
) -> OutputRecord:
    """A review item that cannot be queued or shown, as a dead letter of the review topic's
    dead-letter topic (REVIEW_TOPIC.dlq): the value (its head when over
    DEAD_LETTER_MAX_VALUE_BYTES), `reason`, where it came from (`source` headers), its size."""
    kept = value if len(value) <= DEAD_LETTER_MAX_VALUE_BYTES else value[:HEAD_BYTES]
    return OutputRecord(kept, key, (
        ("reason", reason.encode("utf-8")),
        *source,
        ("original-size", str(len(value)).encode()),
        ("truncated", b"true" if len(kept) < len(value) else b"false"),
    ))


@composite_transform
def PublishReviewDeadLetters(
    letters: Any, target: KafkaTopic, *, runner_retries: bool = False
) -> Any:
    """Sink of the review queue's refused items (`review_dead_letter` records)."""
    return _publish(letters, lambda record: record, target, runner_retries)
