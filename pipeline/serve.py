"""`ragpulse serve`: watch a live Kafka topic in micro-batches, exactly once, with /metrics.

Each cycle reads every partition from its saved offset up to the end offset seen when the cycle
started (capped by --max-batch-events), runs the same bounded Beam pipeline as `ragpulse run`
(`pipeline.batch.run_batch`), sends dead letters to the dead-letter topic, then saves the
partial window counts, counter increments, watermark and offsets in ONE SQLite transaction, and
only then commits the offsets to the Kafka consumer group (for lag tools; the state file is the
source of truth). A crash at any point therefore replays at most the cycle in flight, whose
counts were not saved: nothing is lost and nothing is counted twice. Dead-letter records of a
replayed cycle may be produced twice (at least once); their headers carry the source partition
and offset to deduplicate on.

What can still go wrong is counted and logged, never silent (see README, "Reliability"):
a saved offset outside the partition (topic recreated or truncated, retention ahead of serve) is
handled by --on-offset-reset and counted in `ragpulse_offset_resets_total` and
`ragpulse_records_lost_total`; output records the broker refuses for good, or still does not
acknowledge after --undeliverable-after, are counted in
`ragpulse_dead_letters_undeliverable_total` and the cycle moves on; a state file that cannot be
used stops serve with one line saying what to do (--state-reset).
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import logging
import signal
import tempfile
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import apache_beam as beam
import orjson
from kafka import KafkaProducer
from prometheus_client import Counter, Histogram, make_wsgi_app
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline import stats
from pipeline.batch import VERDICTS_FILE, BatchConfig, BatchResult, run_batch
from pipeline.canaries import CanaryFeed, GoldenSetError, load_golden_set
from pipeline.config import (
    JudgeSettings,
    SettingsError,
    add_judge_arguments,
    describe_validation_error,
    duration,
    judge_settings,
    positive_duration,
    sample_rate,
)
from pipeline.kafka_security import (
    PLAINTEXT,
    KafkaSecurity,
    add_kafka_security_arguments,
    check_access,
    connect,
    security_from_args,
)
from pipeline.kafka_source import (
    RECORDS_LOST,
    DeadLetter,
    Delivery,
    KafkaRecord,
    LogBounds,
    OffsetReset,
    OutputRecord,
    ReadKafkaRanges,
    commit_offsets,
    committed_offsets,
    consumer_lag,
    deliver,
    end_offsets,
    log_bounds,
    offset_resets,
    plan_batch,
    reset_starts,
)
from pipeline.labels import LabelBudget, LabelLimits, add_label_arguments, label_limits
from pipeline.metrics import (
    FailingExample,
    MetricsSnapshot,
    latest_failing_examples,
    registry_for,
)
from pipeline.metrics_http import (
    MetricsHTTPServer,
    WebConfig,
    exporter_app,
    load_web_config,
    start_metrics_server,
)
from pipeline.state import CounterIncrement, ExemplarPointer, StateError, StateStore, WindowPartial
from pipeline.transforms import SourceRecord
from pipeline.verdict_rows import failing_verdicts
from pipeline.watermark import closed_before, compute_watermark, merge_latest
from pipeline.windows import RatingCounts, WindowKey

log = logging.getLogger(__name__)

OFFSET_RESETS = "ragpulse_offset_resets_total"
UNDELIVERABLE = "ragpulse_dead_letters_undeliverable_total"
# A delivery failure that may clear up is given up on only after --undeliverable-after AND this
# many failed attempts, so that a broker just back from an outage gets a few tries.
MIN_DELIVERY_ATTEMPTS = 3
EXIT_OFFSET_RESET = 3
RESET_KINDS = ("beyond_end", "below_start")
LOSS_REASONS = ("retention", "topic_reset")


class OffsetResetRefused(RuntimeError):
    """A saved offset is outside its partition and --on-offset-reset is `fail`."""


class PublishError(RuntimeError):
    """Output records were not acknowledged and --undeliverable-after has not passed yet."""


class ServeSettings(BaseModel):
    """Validated settings of `ragpulse serve`; a field's title is its flag, when the field's
    name is not (errors name the flag)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(min_length=3, title="--kafka-bootstrap")
    topic: str = Field(min_length=1)
    dead_letter_topic: str = Field(min_length=1)
    verdicts_topic: str = Field(min_length=1)
    publish_verdicts: Literal["failing", "all", "none"]
    group_id: str = Field(min_length=1)
    state: Path
    judges: JudgeSettings
    sample_rate: float = Field(ge=0, le=1)
    window_seconds: float = Field(gt=0, title="--window")
    allowed_lateness_seconds: float = Field(ge=0, title="--allowed-lateness")
    out_of_orderness_seconds: float = Field(ge=0, title="--out-of-orderness")
    trigger_interval_seconds: float = Field(gt=0, title="--trigger-interval")
    max_batch_events: int = Field(ge=1)
    metrics_host: str
    metrics_port: int = Field(ge=0, le=65535)
    web_config_file: Path | None = None
    unhealthy_after_seconds: float = Field(gt=0, title="--unhealthy-after")
    retention_seconds: float = Field(gt=0, title="--retention")
    kafka_timeout_seconds: float = Field(gt=0, title="--kafka-timeout")
    max_event_bytes: int = Field(ge=1024)
    kafka_security: KafkaSecurity = PLAINTEXT
    canary_file: Path | None = None
    canary_rate_per_minute: float = Field(1.0, gt=0, le=10_000, title="--canary-rate")
    on_offset_reset: Literal["earliest", "latest", "fail"]
    undeliverable_after_seconds: float = Field(gt=0, title="--undeliverable-after")
    state_reset: bool
    labels: LabelLimits = LabelLimits()


def _record(topic: str) -> Callable[[KafkaRecord], SourceRecord]:
    def to_source(r: KafkaRecord) -> SourceRecord:
        return SourceRecord(
            r.value, f"{topic}/{r.partition}", r.offset, r.timestamp_s, r.oversize_bytes
        )

    return to_source


def _partition_of(source: str) -> int:
    return int(source.rsplit("/", 1)[1])


class CycleMetrics:
    """Metrics of the serve loop itself; not persisted, since they describe this process."""

    def __init__(self, registry: Any) -> None:
        self.cycles = Counter(
            "ragpulse_cycles",
            "Serve micro-batch cycles, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.duration = Histogram(
            "ragpulse_cycle_duration_seconds",
            "Wall time of one serve cycle that read events.",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300),
            registry=registry,
        )
        for outcome in ("ok", "failed"):
            self.cycles.labels(outcome)


class TopicWatcher:
    """The serve loop: cycles over the topic, keeps the state, feeds /metrics and /healthz."""

    def __init__(
        self,
        settings: ServeSettings,
        state: StateStore | None = None,
        *,
        was_reset: bool = False,
        canaries: CanaryFeed | None = None,
    ) -> None:
        """`state`: the store, when the caller opened it (`open_state`); `was_reset`: it is
        fresh because --state-reset moved an unusable file aside; `canaries`: the golden-set
        feed (`canary_feed`), checked by the caller before anything was opened."""
        self.settings = settings
        self._canaries = canaries
        if state is None:
            state, was_reset = open_state(settings.state, reset=settings.state_reset)
        self.state = state
        self._producer: KafkaProducer | None = None
        # After a reset, the consumer group's committed offsets say where the lost file had got.
        self._group_offsets: dict[int, int] | None = None if was_reset else {}
        self._delivery_failing_since: float | None = None
        self._delivery_failures = 0
        self._lock = threading.Lock()
        self._lag: dict[tuple[str, int], int] = {}
        self._heartbeat = time.time()  # start-up counts as alive until the first cycle fails
        self._first_failure: float | None = None
        self._cycle_started: float | None = None
        self._snapshot = self._load_snapshot()
        self.labels = LabelBudget(settings.labels)

    # ----- one cycle -------------------------------------------------------------------------
    def run_cycle(self) -> int:
        """Read, judge and save one micro-batch; returns how many records it covered."""
        s = self.settings
        topic = s.topic
        bounds = log_bounds(
            s.bootstrap, topic, timeout_s=s.kafka_timeout_seconds, security=s.kafka_security
        )
        ends = bounds.ends
        saved = self.state.offsets(topic)
        starts = {**self._fresh_starts(saved, bounds), **saved}
        reset_to, increments = self._apply_reset_policy(
            offset_resets(starts, bounds.beginnings, ends, bounds.unconfirmed_ends)
        )
        starts.update(reset_to)
        ranges = plan_batch(starts, ends, s.max_batch_events, bounds.beginnings)
        previous_wm = self.state.watermark(topic)
        cutoff = closed_before(previous_wm, s.allowed_lateness_seconds)
        latest = self.state.latest_event_times(topic)
        result: BatchResult | None = None
        examples: list[ExemplarPointer] = []
        if ranges:
            started = time.perf_counter()
            result, letters, verdicts = self._judge(ranges, cutoff)
            result = self._bound_labels(result)
            increments += self._publish(letters, verdicts)
            increments += _increments(result.counts)
            examples = _exemplar_pointers(verdicts, result.counts)
            batch_latest = {_partition_of(k): v for k, v in result.latest_event_time.items()}
            latest = merge_latest(latest, batch_latest)
            self.cycle_metrics.duration.observe(time.perf_counter() - started)
        watermark = compute_watermark(
            latest, list(ranges), s.out_of_orderness_seconds, previous=previous_wm
        )
        new_offsets = {p: stop for p, (_, stop) in ranges.items()}
        completed = self.state.apply_cycle(
            topic,
            _partials(result.windows) if result else [],
            new_offsets,
            increments,
            closed_before(watermark, s.allowed_lateness_seconds),
            watermark=watermark,
            latest_event_times=latest,
            reset_offsets=reset_to,
        )
        self._delivery_failing_since, self._delivery_failures = None, 0
        _log_completed(completed)
        self.state.save_exemplars(examples)
        if watermark is not None:
            self.state.prune_windows(ended_before=watermark - s.retention_seconds)
        if new_offsets or reset_to:
            self._commit_group_offsets()
        # The lag is measured against the ends as they are NOW: measured against the ends seen
        # at the start of the cycle it would read 0 after every cycle that caught up with them,
        # however much arrived while the cycle ran (a 16 s cycle at 3,000 events/s hid 48,000).
        self._update_lag(self._ends_after_cycle(ends) if ranges else ends, starts)
        self._refresh_snapshot()
        covered = sum(stop - start for start, stop in ranges.values())
        if result is not None:
            log.info(
                "cycle covered %d records in %d partitions; %d dead letters; watermark %s",
                covered,
                len(ranges),
                result.dead_letters,
                watermark,
            )
        return covered

    def _fresh_starts(self, saved: Mapping[int, int], bounds: LogBounds) -> dict[int, int]:
        """Start offsets of partitions with no saved offset: the log start, except after
        --state-reset moved an unusable file aside, when the consumer group's committed
        offsets (where that file had got to) are used where there are any.

        Only then: a missing file is a fresh start from the log start, so that a second
        deployment sharing the group (or a deliberate recount) is not silently skipped ahead.
        """
        s = self.settings
        missing = [p for p in bounds.ends if p not in saved]
        if not missing:
            return {}
        if self._group_offsets is None:
            self._group_offsets = committed_offsets(
                s.bootstrap,
                s.group_id,
                s.topic,
                timeout_s=s.kafka_timeout_seconds,
                security=s.kafka_security,
            )
            if self._group_offsets:
                log.warning(
                    "fresh state after --state-reset: going on from consumer group %s's committed "
                    "offsets %s for %s (other partitions from their log start)",
                    s.group_id,
                    self._group_offsets,
                    s.topic,
                )
        group = self._group_offsets or {}
        return {p: group.get(p, bounds.beginnings.get(p, 0)) for p in missing}

    def _apply_reset_policy(
        self, resets: list[OffsetReset]
    ) -> tuple[dict[int, int], list[CounterIncrement]]:
        """Log each reset as an error and apply --on-offset-reset: the offsets to go on from
        and the counter increments (resets by kind, records skipped by reason)."""
        s = self.settings
        if not resets:
            return {}, []
        for r in resets:
            log.error(
                "%s/%d: saved offset %d is %s the partition (log start %d, end %d): %s",
                s.topic,
                r.partition,
                r.saved,
                "beyond the end of" if r.kind == "beyond_end" else "below the log start of",
                r.log_start,
                r.log_end,
                "the topic was recreated, truncated or emptied"
                if r.kind == "beyond_end"
                else "retention deleted records before ragpulse read them",
            )
        if s.on_offset_reset == "fail":
            raise OffsetResetRefused(
                f"offsets saved in {s.state} are outside topic {s.topic!r} (partitions "
                f"{', '.join(str(r.partition) for r in resets)}) and --on-offset-reset is fail: "
                "check the topic, then restart with --on-offset-reset earliest (read what the "
                "partition holds) or latest (skip to its end)"
            )
        starts, lost = reset_starts(resets, s.on_offset_reset)
        log.error(
            "going on from offsets %s (--on-offset-reset %s); records skipped: %s",
            starts,
            s.on_offset_reset,
            lost or "none",
        )
        kinds = Tally(r.kind for r in resets)
        resets_by_kind = [
            CounterIncrement(OFFSET_RESETS, {"topic": s.topic, "kind": k}, n)
            for k, n in kinds.items()
        ]
        lost_by_reason = [
            CounterIncrement(RECORDS_LOST, {"topic": s.topic, "reason": why}, n)
            for why, n in lost.items()
        ]
        return starts, resets_by_kind + lost_by_reason

    def _bound_labels(self, result: BatchResult) -> BatchResult:
        """The batch with app and model labels bounded; the saved counters (the snapshot's)
        hold the values admitted so far, so the choice survives restarts."""
        windows, counts = self.labels.bound(result.windows, result.counts, self.snapshot().counts)
        return dataclasses.replace(result, windows=windows, counts=counts)

    def _update_lag(self, ends: Mapping[int, int], starts: Mapping[int, int]) -> None:
        topic = self.settings.topic
        offsets = {**starts, **self.state.offsets(topic)}
        with self._lock:
            self._lag = {(topic, p): n for p, n in consumer_lag(offsets, ends).items()}

    def _ends_after_cycle(self, ends: Mapping[int, int]) -> dict[int, int]:
        """End offsets after a cycle, for the lag gauge; the ones from its start if that fails."""
        s = self.settings
        try:
            return {
                **ends,
                **end_offsets(
                    s.bootstrap,
                    s.topic,
                    timeout_s=s.kafka_timeout_seconds,
                    security=s.kafka_security,
                ),
            }
        except Exception as exc:  # visibility only: the next cycle asks again
            log.warning("could not read end offsets for the lag gauge: %s", exc)
            return dict(ends)

    def _judge(
        self, ranges: Mapping[int, tuple[int, int]], cutoff: float | None
    ) -> tuple[BatchResult, list[DeadLetter], list[OutputRecord]]:
        s = self.settings
        config = BatchConfig(
            judges=s.judges.spec(),
            sample_rate=s.sample_rate,
            window_seconds=s.window_seconds,
            closed_before=cutoff,
            max_event_bytes=s.max_event_bytes,
            judge_batch_size=max(256, s.judges.concurrency * 16),
        )

        def read(p: beam.Pipeline) -> Any:
            return (
                p
                | "ReadKafka"
                >> ReadKafkaRanges(
                    s.bootstrap,
                    s.topic,
                    ranges,
                    stall_timeout_s=s.kafka_timeout_seconds,
                    security=s.kafka_security,
                    max_value_bytes=s.max_event_bytes,
                )
                | "ToSourceRecord" >> beam.Map(_record(s.topic))
            )

        with tempfile.TemporaryDirectory(prefix="ragpulse-cycle-") as tmp:
            result = run_batch(
                read,
                config,
                Path(tmp),
                write_verdicts=s.publish_verdicts != "none",
                only_failing_verdicts=s.publish_verdicts == "failing",
                keep_raw_dead_letters=True,
                canaries=self._canaries.take(time.time()) if self._canaries else (),
            )
            letters = list(_dead_letters(result.dead_letter_path))
            verdicts = (
                list(_verdict_records(Path(tmp) / VERDICTS_FILE))
                if s.publish_verdicts != "none"
                else []
            )
            return result, letters, verdicts

    def _publish(
        self, letters: list[DeadLetter], verdicts: list[OutputRecord]
    ) -> list[CounterIncrement]:
        """Dead letters and verdict rows, acknowledged before the cycle saves its offsets.

        Records refused for good (too large, rejected by the broker's validation) are counted
        as undeliverable at once. Records not acknowledged for a reason that may clear up fail
        the cycle, which is retried as after any failure, until delivery has failed for
        --undeliverable-after (and at least MIN_DELIVERY_ATTEMPTS times): then they are counted
        as undeliverable too and the cycle moves on. Returns the counter increments.
        """
        if not letters and not verdicts:
            return []
        s = self.settings
        outputs = [(s.dead_letter_topic, [letter.to_record() for letter in letters])]
        if verdicts:
            outputs.append((s.verdicts_topic, verdicts))
        deliveries = []
        for topic, rows in outputs:
            if not rows:
                continue
            d = deliver(self._get_producer(), topic, rows, timeout_s=s.kafka_timeout_seconds)
            if d.refused or d.unacknowledged:
                # After some broker errors kafka-python's (idempotent) producer aborts every
                # later batch too ("fatal error"): the next delivery gets a new producer.
                self._close_producer()
            if d.delivered:
                log.info("published %d records to %s", d.delivered, d.topic)
            deliveries.append(d)
        waiting = [(d.topic, why) for d in deliveries for _, why in d.unacknowledged]
        if waiting:
            now = time.monotonic()
            if self._delivery_failing_since is None:
                self._delivery_failing_since = now
            self._delivery_failures += 1
            failing_for = now - self._delivery_failing_since
            if (
                failing_for < s.undeliverable_after_seconds
                or self._delivery_failures < MIN_DELIVERY_ATTEMPTS
            ):
                topic, why = waiting[0]
                raise PublishError(
                    f"{len(waiting)} records not acknowledged by {topic} ({why}); delivery has "
                    f"failed for {failing_for:.0f}s, given up after "
                    f"{s.undeliverable_after_seconds:.0f}s (--undeliverable-after)"
                )
        increments = []
        for d in deliveries:
            lost = d.refused + d.unacknowledged  # unacknowledged ones get here past the budget
            if lost:
                _log_undeliverable(d)
                increments.append(CounterIncrement(UNDELIVERABLE, {"topic": d.topic}, len(lost)))
        return increments

    def _get_producer(self) -> KafkaProducer:
        if self._producer is None:
            timeout_ms = int(self.settings.kafka_timeout_seconds * 1000)
            self._producer = connect(
                KafkaProducer,
                self.settings.bootstrap,
                self.settings.kafka_security,
                acks="all",
                linger_ms=5,
                request_timeout_ms=timeout_ms,
                # Connecting and waiting for metadata take 30 s and 60 s by default: bound them
                # by --kafka-timeout too, so a broker outage fails the cycle in that time.
                bootstrap_timeout_ms=timeout_ms,
                max_block_ms=timeout_ms,
            )
        return self._producer

    def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close(timeout=0)
            except Exception as exc:  # its unsent batches are given up on either way
                log.debug("closing the producer: %s", exc)

    def _commit_group_offsets(self) -> None:
        s = self.settings
        try:
            commit_offsets(
                s.bootstrap,
                s.group_id,
                s.topic,
                self.state.offsets(s.topic),
                timeout_s=s.kafka_timeout_seconds,
                security=s.kafka_security,
            )
        except Exception as exc:  # visibility only: the state file already holds the offsets
            log.warning("could not commit offsets to consumer group %s: %s", s.group_id, exc)

    # ----- metrics ---------------------------------------------------------------------------
    def _load_snapshot(self) -> MetricsSnapshot:
        counts = stats.merge(
            (stats.key(c.name, **c.labels), c.value) for c in self.state.counters()
        )
        for zero in self._zero_counters():
            counts.setdefault(zero, 0)
        complete, in_progress = _split_windows(self.state.current_windows())
        wm = self.state.watermark(self.settings.topic)
        gauges = {"ragpulse_heartbeat_timestamp_seconds": self._heartbeat}
        if wm is not None:
            gauges["ragpulse_watermark_timestamp_seconds"] = wm
        if complete:
            gauges["ragpulse_last_complete_window_end_timestamp_seconds"] = max(
                k.window_end for k in complete
            )
        with self._lock:
            lag = dict(self._lag)
        exemplars = {
            stats.key(e.name, **e.labels): FailingExample(e.request_id, e.timestamp)
            for e in self.state.exemplars()
        }
        return MetricsSnapshot(counts, complete, in_progress, gauges, lag, exemplars)

    def _zero_counters(self) -> list[stats.CounterKey]:
        """Data-loss counters whose labels are known at start-up, exported at 0 until they
        grow, so that increase() in the alerts sees their first increment."""
        s = self.settings
        keys = [stats.key(OFFSET_RESETS, topic=s.topic, kind=k) for k in RESET_KINDS]
        keys += [stats.key(RECORDS_LOST, topic=s.topic, reason=r) for r in LOSS_REASONS]
        keys.append(stats.key(UNDELIVERABLE, topic=s.dead_letter_topic))
        if s.publish_verdicts != "none":
            keys.append(stats.key(UNDELIVERABLE, topic=s.verdicts_topic))
        return keys

    def _refresh_snapshot(self) -> None:
        snap = self._load_snapshot()
        with self._lock:
            self._snapshot = snap

    def _touch_heartbeat(self) -> None:
        with self._lock:
            snap = self._snapshot
            gauges = {**snap.gauges, "ragpulse_heartbeat_timestamp_seconds": self._heartbeat}
            self._snapshot = dataclasses.replace(snap, gauges=gauges)

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return self._snapshot

    def healthy(self) -> tuple[bool, str]:
        """Healthy while cycles complete; unhealthy once they have failed, or one cycle has
        run, for longer than --unhealthy-after (a hung cycle never fails)."""
        now = time.time()
        started = self._cycle_started
        if started is not None and now - started > self.settings.unhealthy_after_seconds:
            return False, f"the cycle in flight has run for {now - started:.0f}s"
        if self._first_failure is None:
            return True, "ok"
        failing_for = now - self._first_failure
        if failing_for > self.settings.unhealthy_after_seconds:
            return False, f"cycles have failed for {failing_for:.0f}s"
        return True, f"cycles failing for {failing_for:.0f}s"

    # ----- the loop --------------------------------------------------------------------------
    def serve_forever(self, stop: StopRequest) -> None:
        """Cycle until a stop is requested; the cycle in flight always finishes and is saved."""
        backoff = 1.0
        while not stop.requested:
            started = time.monotonic()
            self._cycle_started = time.time()
            try:
                covered = self.run_cycle()
            except OffsetResetRefused:
                raise
            except Exception as exc:
                self._cycle_started = None
                self.cycle_metrics.cycles.labels("failed").inc()
                if self._first_failure is None:
                    self._first_failure = time.time()
                log.error("cycle failed (retrying in %.0fs): %s", backoff, exc)
                stop.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 1.0
            self._cycle_started = None
            self._first_failure = None
            self._heartbeat = time.time()
            self.cycle_metrics.cycles.labels("ok").inc()
            # run_cycle has just rebuilt the snapshot; only the heartbeat is new. A second full
            # rebuild would query the state again for one gauge.
            self._touch_heartbeat()
            if covered >= self.settings.max_batch_events:
                continue  # a backlog remains: go on at once
            stop.sleep(self.settings.trigger_interval_seconds - (time.monotonic() - started))
        log.info("stop requested (%s): the cycle in flight has finished and is saved", stop.why)

    def close(self) -> None:
        if self._producer is not None:
            self._producer.close(timeout=5)
        self.state.close()

    # Bound by `serve_http`, which owns the registry.
    cycle_metrics: CycleMetrics


class StopRequest:
    """A stop request set from a signal handler, polled by the serve loop.

    A plain attribute on purpose: `threading.Event.set()` takes the event's lock, and a signal
    that lands while the main thread holds that lock inside `Event.wait()` deadlocks the
    process (seen as a serve that ignored SIGTERM once it had gone idle).
    """

    POLL_SECONDS = 0.1

    def __init__(self) -> None:
        self.requested = False
        self.why = ""

    def request(self, why: str) -> None:
        self.why = why
        self.requested = True

    def sleep(self, seconds: float) -> None:
        """Sleep up to `seconds`, returning within POLL_SECONDS of a stop request."""
        deadline = time.monotonic() + seconds
        while not self.requested:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, self.POLL_SECONDS))


def open_state(path: Path, *, reset: bool) -> tuple[StateStore, bool]:
    """The state store at `path`, and whether it was reset: with `reset`, an unusable file is
    moved aside (to FILE.corrupt-<time>) and a fresh one started. Without it, SettingsError
    says what to do."""
    try:
        return StateStore(path), False
    except StateError as exc:
        if not reset:
            raise SettingsError(str(exc)) from None
        moved = StateStore.move_aside(path)
        log.warning("%s; --state-reset: moved it to %s and starting a fresh state", exc, moved)
    return StateStore(path), True


def _log_undeliverable(d: Delivery) -> None:
    lost = d.refused + d.unacknowledged
    reasons = Tally(why for _, why in lost)
    log.error(
        "%d records for %s are undeliverable and were dropped (%s); first: %s",
        len(lost),
        d.topic,
        "; ".join(f"{n} x {why}" for why, n in reasons.most_common()),
        ", ".join(_identify(record) for record, _ in lost[:5]),
    )


def _identify(record: OutputRecord) -> str:
    """Where a dead letter came from (partition/offset), or a verdict row's request_id."""
    headers = dict(record.headers)
    if "source-offset" in headers:
        return f"{headers['source-partition'].decode()}/{headers['source-offset'].decode()}"
    return (record.key or b"?").decode(errors="replace")


def _log_completed(rows: Iterable[Mapping[str, Any]]) -> None:
    for row in rows:
        log.info(
            "window %s..%s complete: %s %s/%s pass %s (n=%d)",
            row["window_start"],
            row["window_end"],
            row["judge"],
            row["app"],
            row["model"],
            "-" if row["percentage"] is None else f"{row['percentage']:.1%}",
            row["yes"] + row["no"],
        )


def _partials(windows: Mapping[WindowKey, RatingCounts]) -> list[WindowPartial]:
    return [
        WindowPartial(k.window_start, k.window_end, k.judge, k.app, k.model, c.yes, c.no, c.error)
        for k, c in windows.items()
    ]


def _increments(counts: Mapping[stats.CounterKey, float]) -> list[CounterIncrement]:
    return [CounterIncrement(name, dict(labels), value) for (name, labels), value in counts.items()]


def canary_feed(settings: ServeSettings) -> CanaryFeed | None:
    """The golden-set feed of --canary-file (None without one); SettingsError names the file
    and line of a bad canary."""
    if settings.canary_file is None:
        return None
    try:
        golden = load_golden_set(settings.canary_file, settings.judges.names)
    except GoldenSetError as exc:
        raise SettingsError(str(exc)) from None
    log.info(
        "canaries: %d golden events from %s, %g per minute",
        len(golden),
        settings.canary_file,
        settings.canary_rate_per_minute,
    )
    return CanaryFeed(golden, settings.canary_rate_per_minute, time.time())


def _exemplar_pointers(
    verdicts: Iterable[OutputRecord], counts: Mapping[stats.CounterKey, float]
) -> list[ExemplarPointer]:
    """The latest failing answer per verdict series among the rows this cycle published.

    Only for series the cycle's (label-bounded) `counts` hold: verdict rows keep the real app
    and model, and a pointer for a value counted as `other` would be kept, and loaded at every
    scrape, for a series that is never exported (30,000 such apps grew serve by 36 MiB).
    """
    latest = latest_failing_examples(
        v for record in verdicts for v in failing_verdicts(orjson.loads(record.value))
    )
    return [
        ExemplarPointer(name, dict(labels), example.request_id, example.timestamp)
        for (name, labels), example in latest.items()
        if (name, labels) in counts
    ]


def _verdict_records(path: Path) -> Iterator[OutputRecord]:
    """verdicts.jsonl rows as records keyed by request_id."""
    with path.open("rb") as f:
        for line in f:
            yield OutputRecord(line.rstrip(b"\n"), orjson.loads(line)["request_id"].encode())


def _dead_letters(path: Path) -> Iterator[DeadLetter]:
    with path.open("rb") as f:
        for line in f:
            row = orjson.loads(line)
            yield DeadLetter(
                value=base64.b64decode(row["raw_b64"]),
                reason=row["reason"],
                source_partition=_partition_of(row["source"]),
                source_offset=int(row["position"]),
                original_size=int(row["raw_bytes"]),
            )


def _split_windows(
    rows: Iterable[Mapping[str, Any]],
) -> tuple[dict[WindowKey, RatingCounts], dict[WindowKey, RatingCounts]]:
    complete: dict[WindowKey, RatingCounts] = {}
    in_progress: dict[WindowKey, RatingCounts] = {}
    for row in rows:
        key = WindowKey(
            datetime.fromisoformat(row["window_start"]).timestamp(),
            datetime.fromisoformat(row["window_end"]).timestamp(),
            row["judge"],
            row["app"],
            row["model"],
        )
        (complete if row["complete"] else in_progress)[key] = RatingCounts(
            row["yes"], row["no"], row["error"]
        )
    return complete, in_progress


def serve_http(
    watcher: TopicWatcher, host: str, port: int, web: WebConfig | None = None
) -> MetricsHTTPServer:
    """Start /metrics and /healthz in a daemon thread; returns the server (for its port)."""
    registry = registry_for(watcher.snapshot)
    watcher.cycle_metrics = CycleMetrics(registry)
    web = web or WebConfig()
    app = exporter_app(make_wsgi_app(registry), watcher.healthy, web.users)
    return start_metrics_server(app, host, port, web.tls)


def configure_parser(p: argparse.ArgumentParser) -> None:
    k = p.add_argument_group("kafka")
    k.add_argument(
        "--kafka-bootstrap",
        required=True,
        metavar="HOST:PORT",
        help="Kafka bootstrap servers, comma-separated",
    )
    k.add_argument("--topic", required=True, help="the chatbot's inference-log topic")
    k.add_argument(
        "--dead-letter-topic",
        default=None,
        help="where invalid and late records go, with reason, source partition and "
        "offset headers (default: TOPIC.dlq)",
    )
    k.add_argument(
        "--verdicts-topic",
        default=None,
        help="where verdict rows (the verdicts.jsonl format of `ragpulse run`, keyed by "
        "request_id) are published, to read the rationale of a failing answer "
        "(default: TOPIC.verdicts)",
    )
    k.add_argument(
        "--publish-verdicts",
        choices=["failing", "all", "none"],
        default="failing",
        help="which verdict rows to publish: failing (any judge said no or error), all, or "
        "none (default: %(default)s)",
    )
    k.add_argument(
        "--group-id",
        default="ragpulse",
        help="consumer group the processed offsets are committed to, for lag tools "
        "(default: %(default)s); the group is never joined",
    )
    k.add_argument(
        "--max-batch-events",
        type=int,
        default=50_000,
        help="most records one cycle reads (default: %(default)s)",
    )
    k.add_argument(
        "--kafka-timeout",
        type=positive_duration,
        default=30.0,
        metavar="DURATION",
        help="timeout of one Kafka request (default: 30s)",
    )
    k.add_argument(
        "--on-offset-reset",
        choices=["earliest", "latest", "fail"],
        default="earliest",
        help="what to do when a saved offset is outside its partition (topic recreated, "
        "truncated or emptied; retention ahead of serve): earliest goes on from the log start "
        "(skips nothing still readable), latest from the log end, fail stops serve (exit code "
        f"{EXIT_OFFSET_RESET}); always logged and counted (default: %(default)s)",
    )
    k.add_argument(
        "--undeliverable-after",
        type=positive_duration,
        default=600.0,
        metavar="DURATION",
        help="how long dead letters and verdict rows the broker does not acknowledge are "
        "retried (the cycle fails and runs again) before they are counted as undeliverable "
        "and the cycle moves on (default: 10m); records the broker refuses for good (too "
        "large, invalid) are counted at once",
    )
    add_kafka_security_arguments(p.add_argument_group("kafka security"))
    w = p.add_argument_group("windows")
    w.add_argument(
        "--sample-rate",
        type=sample_rate,
        default=1.0,
        help="share of events judged, by a hash of request_id (default: 1.0)",
    )
    w.add_argument(
        "--window",
        type=positive_duration,
        default=300.0,
        metavar="DURATION",
        help="event-time window size (default: 5m)",
    )
    w.add_argument(
        "--allowed-lateness",
        type=duration,
        default=600.0,
        metavar="DURATION",
        help="how long after its end a window still takes late events (default: 10m)",
    )
    w.add_argument(
        "--out-of-orderness",
        type=duration,
        default=30.0,
        metavar="DURATION",
        help="how far event times may run behind within a partition; the watermark "
        "trails the latest event time by this much (default: 30s)",
    )
    w.add_argument(
        "--trigger-interval",
        type=positive_duration,
        default=15.0,
        metavar="DURATION",
        help="time between cycles when caught up (default: 15s)",
    )
    w.add_argument(
        "--max-event-bytes",
        type=int,
        default=1_048_576,
        help="largest accepted record (default: 1 MiB)",
    )
    s = p.add_argument_group("service")
    s.add_argument(
        "--state",
        type=Path,
        default=Path("ragpulse-state.sqlite"),
        help="SQLite file holding windows, offsets and counters (default: %(default)s); "
        "only a missing file starts fresh",
    )
    s.add_argument(
        "--state-reset",
        action="store_true",
        help="if the state file cannot be used (empty, damaged, newer schema, ...), rename it "
        "to FILE.corrupt-<time> and start fresh, going on from the consumer group's committed "
        "offsets (else the log start); windows and counters restart from zero",
    )
    s.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        help="address of the /metrics and /healthz server (default: %(default)s, this host "
        "only; in a container pass 0.0.0.0 or the pod address so Prometheus can reach it)",
    )
    s.add_argument(
        "--metrics-port",
        type=int,
        default=9464,
        help="port of the /metrics and /healthz server (default: %(default)s)",
    )
    s.add_argument(
        "--web-config-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="TLS and basic auth for /metrics, in the Prometheus exporters' web config format "
        "(tls_server_config, basic_auth_users with bcrypt hashes); /healthz stays open",
    )
    s.add_argument(
        "--unhealthy-after",
        type=positive_duration,
        default=300.0,
        metavar="DURATION",
        help="/healthz answers 503 once cycles have failed, or one cycle has run, for this long "
        "(default: 5m); set it above your longest cycle",
    )
    s.add_argument(
        "--retention",
        type=positive_duration,
        default=30 * 86400.0,
        metavar="DURATION",
        help="how long complete windows stay in the state file for `ragpulse windows`, in event "
        "time (default: 30d); counters are never pruned",
    )
    c = p.add_argument_group("judge canaries")
    c.add_argument(
        "--canary-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="golden set: JSON Lines of events with human labels, e.g. "
        '{..., "labels": {"groundedness": "no"}}; they are judged with the traffic and '
        "counted only in ragpulse_canary_verdicts_total (default: no canaries)",
    )
    c.add_argument(
        "--canary-rate",
        type=float,
        default=1.0,
        metavar="N",
        help="golden events judged per minute, in turn (default: %(default)s)",
    )
    add_label_arguments(p)
    add_judge_arguments(p)


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    judges = judge_settings(args)
    try:
        return ServeSettings(
            bootstrap=args.kafka_bootstrap,
            topic=args.topic,
            dead_letter_topic=args.dead_letter_topic or f"{args.topic}.dlq",
            verdicts_topic=args.verdicts_topic or f"{args.topic}.verdicts",
            publish_verdicts=args.publish_verdicts,
            group_id=args.group_id,
            state=args.state,
            judges=judges,
            sample_rate=args.sample_rate,
            window_seconds=args.window,
            allowed_lateness_seconds=args.allowed_lateness,
            out_of_orderness_seconds=args.out_of_orderness,
            trigger_interval_seconds=args.trigger_interval,
            max_batch_events=args.max_batch_events,
            metrics_host=args.metrics_host,
            metrics_port=args.metrics_port,
            web_config_file=args.web_config_file,
            unhealthy_after_seconds=args.unhealthy_after,
            retention_seconds=args.retention,
            kafka_timeout_seconds=args.kafka_timeout,
            max_event_bytes=args.max_event_bytes,
            kafka_security=security_from_args(args),
            canary_file=args.canary_file,
            canary_rate_per_minute=args.canary_rate,
            on_offset_reset=args.on_offset_reset,
            undeliverable_after_seconds=args.undeliverable_after,
            state_reset=args.state_reset,
            labels=label_limits(args),
        )
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc, ServeSettings)) from None


def main(args: argparse.Namespace) -> int:
    # Settings and files first, all of them checked before anything is opened; then the state
    # file, whose one-line error (when it cannot be used) says how to recover.
    settings = settings_from_args(args)
    web = load_web_config(settings.web_config_file) if settings.web_config_file else WebConfig()
    canaries = canary_feed(settings)
    state, was_reset = open_state(args.state, reset=args.state_reset)
    # A refused certificate or password stops serve here, with the setting to fix; retrying
    # would only hammer the broker with connections it will refuse.
    check_access(
        settings.bootstrap, settings.kafka_security, timeout_s=settings.kafka_timeout_seconds
    )
    watcher = TopicWatcher(settings, state, was_reset=was_reset, canaries=canaries)
    server = serve_http(watcher, settings.metrics_host, settings.metrics_port, web)
    log.info(
        "serving /metrics (%s%s) and /healthz on %s:%d; watching %s on %s (%s) with %s "
        "(backend %s), "
        "sample rate %g, %gs windows, %gs allowed lateness; state %s",
        "https" if web.tls else "http",
        ", basic auth" if web.users else "",
        settings.metrics_host,
        server.server_port,
        settings.topic,
        settings.bootstrap,
        settings.kafka_security.describe(),
        ",".join(settings.judges.names),
        settings.judges.backend,
        settings.sample_rate,
        settings.window_seconds,
        settings.allowed_lateness_seconds,
        settings.state,
    )
    stop = StopRequest()

    def request_stop(signum: int, _frame: Any) -> None:
        # No logging and no locks in a signal handler: the loop logs once it sees the request.
        stop.request(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        watcher.serve_forever(stop)
    except OffsetResetRefused as exc:
        log.error("stopping: %s", exc)
        return EXIT_OFFSET_RESET
    finally:
        watcher.close()
        server.shutdown()
    log.info("stopped; state saved in %s", settings.state)
    return 0
