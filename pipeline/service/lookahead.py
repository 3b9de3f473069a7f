"""Judge calls started ahead of serve's next cycle, so that calls keep flowing between cycles.

For whoever changes the serve cycle. A cycle's Beam graph judges the events it reads and ends
when they are judged; then the cycle saves its counts and commits its offsets, and the next
cycle plans, builds and starts its graph and reads before its first events reach the judges.
Left alone, the judge endpoint sits idle all that time (about 2 s a cycle here: a fifth of a
500-event cycle at 32 calls in flight).

`Lookahead` fills that gap. A thread of its own watches the process's judge panel
(`judges.shared_panel`, the one the graph's judge stage uses); whenever fewer than twice the
endpoint's concurrency of calls are in flight or queued, the graph's calls are running out,
and it reads the records after the ones the running cycle covers from Kafka (a consumer of its
own, which commits nothing), parses, filters and samples them with `ParseEvents`' own functions
(`judge_input_ahead`: the cycle's `pipeline.stages.parse.AdmissionRules`), and starts
the judge calls for them (`JudgePanel.start_ahead`): at most one judge batch of events per
cycle. The next cycle's judge stage takes those calls over, running or finished, by judge and
input digest (`JudgePanel.submit`), and counts them as its own.

Only calls are shared, never counts. Everything that is counted, saved and committed is still
done by the cycle whose graph read the event, in the order the state module requires (counts,
windows, watermark and offsets in one transaction, then the group commit), so a crash still
replays at most the cycle in flight and nothing is counted twice. What a crash loses is the
calls started ahead: they are made again after the restart, and since no cycle took them over
their cost is counted nowhere. The same goes for calls on events the next cycle does not judge
after all (an offset reset, an event late by the next cycle's watermark): at most one batch.

Only with the graph in this process (no --runner, no multi-processing): on other runners the
judge stage runs in other processes, where calls started here would be made a second time.
"""

from __future__ import annotations

import logging
import math
import threading

from kafka import KafkaConsumer, TopicPartition

from ragpulse.judges.base import JudgeInput, ThrottledLog
from ragpulse.judges.panel import JudgePanel
from ragpulse.pipeline.costs.controls import CostControl, CycleStart
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.models import ServeSettings
from ragpulse.pipeline.sources.kafka import _consumer
from ragpulse.pipeline.stages.parse import AdmissionRules

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05
# Records read at most per poll: a few polls cover a judge batch even at low sample rates, and
# each stays small.
READ_CHUNK = 2000


def runs_here(settings: ServeSettings) -> bool:
    """Whether the graph's judge stage runs in this process, where calls started ahead can be
    taken over (FnApiRunner, threads at most)."""
    return settings.runner is None and not any(
        "multi_processing" in arg for arg in settings.beam_args
    )


class Lookahead(CostControl):
    """Starts judge calls on the events after the running cycle's ranges (module docstring);
    a serve cost control (`pipeline.costs.controls`) that makes no call the cycles would not
    make."""

    def __init__(self, settings: ServeSettings, panel: JudgePanel, batch_events: int) -> None:
        """`panel`: the process's shared panel; `batch_events`: the most events started ahead
        for one cycle (the judge batch size)."""
        self._settings = settings
        self._panel = panel
        self._batch_events = batch_events
        # Calls are added when fewer than `_low` are in flight or queued, up to `_high`: the
        # endpoint's slots never wait for this thread, which adds in chunks, not call by call.
        self._low = 2 * settings.judges.concurrency
        self._high = 4 * settings.judges.concurrency
        self._lock = threading.Lock()
        self._next: dict[int, int] = {}  # per partition, the next offset to read ahead
        self._rules = settings.stage_config().admission
        self._started = 0  # events started ahead since the cycle began
        self._cycles = 0  # cycles started: a read that saw another cycle begin is dropped
        self._reading_for = 0  # the cycle whose positions the last read started from
        self._stop = threading.Event()
        self._consumer: KafkaConsumer | None = None
        self._polled_to: dict[int, int] = {}  # where the consumer's positions are
        # Set when an offset reset moved partitions to another log: the next read starts on a
        # new consumer (see `_read_ahead`).
        self._renew_consumer = False
        self._failure_log = ThrottledLog(log, 30.0)
        self._thread = threading.Thread(target=self._run, name="ragpulse-lookahead", daemon=True)
        self._thread.start()

    def cycle_started(self, cycle: CycleStart) -> None:
        """The cycle now running reads [starts[p], stops[p]) (stops only where it reads
        anything) and drops events of windows ending at or before `closed_before`: look ahead
        from its stops, or from further on where this thread has already read. The partitions
        in `reset` start where an offset reset put them (a topic recreated or truncated): what
        this thread read there was another log, so it looks ahead from the stop."""
        starts, stops, reset = cycle.starts, cycle.stops, cycle.reset
        # The cycle's rules, but the clock read per record: the next cycle starts later.
        rules = self._settings.stage_config(closed_before=cycle.closed_before).admission
        with self._lock:
            for p, start in starts.items():
                stop = stops.get(p, start)
                seen = self._next.get(p, stop)
                kept = seen >= start and p not in reset
                self._next[p] = max(seen, stop) if kept else stop
            for p in [p for p in self._next if p not in starts]:
                del self._next[p]
            self._rules = rules
            self._started = 0
            self._cycles += 1
            self._renew_consumer = self._renew_consumer or bool(reset)
            if reset:
                # Under the lock, like the failures' warnings: a warning logged after this
                # line is about a read from this cycle's positions, never the old log's.
                log.info(
                    "cycle %d: partitions %s were reset to another log; reading ahead again "
                    "from this cycle's stops",
                    self._cycles,
                    sorted(reset),
                )

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._close_consumer()

    def _close_consumer(self) -> None:
        if self._consumer is not None:
            self._consumer.close(autocommit=False)
            self._consumer = None
        self._polled_to = {}

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            if self._panel.calls_in_flight >= self._low:
                continue  # the cycle's own calls fill the endpoint
            with self._lock:
                room = self._batch_events - self._started
            if room <= 0:
                continue
            free = self._high - self._panel.calls_in_flight
            wanted = min(room, -(-free // len(self._panel.judges)))  # events, rounded up
            try:
                items = self._read_ahead(wanted)
            except Exception as exc:  # only a missed head start: the cycle reads for itself
                with self._lock:
                    if self._cycles == self._reading_for:
                        # Kept: read again from the same positions in a second, on a new
                        # consumer. A failure that belongs to the positions (a topic recreated,
                        # records deleted) comes back until the next cycle sets positions from
                        # its ranges, at a warning per 30 s; one that belongs to the consumer
                        # (a validation it cached, a broken connection) does not, and dropping
                        # the positions would start no call ahead for the rest of the cycle.
                        self._failure_log.warning(
                            ("read",),
                            "could not read ahead of cycle %d (calls not started early; "
                            "trying again in 1 s on a new connection): %s",
                            self._reading_for,
                            exc,
                        )
                    else:
                        # A cycle started during the read and set positions of its own (after
                        # an offset reset, on another log): the failure was the old ones'.
                        log.debug(
                            "a read ahead of cycle %d failed after cycle %d began: %s",
                            self._reading_for,
                            self._cycles,
                            exc,
                        )
                # The consumer may hold the failure (its position, a cached validation
                # error): the next read starts on a new one.
                self._close_consumer()
                self._stop.wait(1.0)
                continue
            if items:
                log.debug("started the calls of %d events ahead of the next cycle", len(items))

    def _read_ahead(self, wanted: int) -> list[JudgeInput]:
        """Up to `wanted` sampled events after the read-ahead positions, which move past every
        record read (judged or not)."""
        s = self._settings
        with self._lock:
            positions = dict(self._next)
            rules = self._rules
            cycles = self._reading_for = self._cycles
            renew, self._renew_consumer = self._renew_consumer, False
        if renew:
            self._close_consumer()
        if not positions:
            return []
        if self._consumer is None:
            self._consumer = _consumer(
                s.bootstrap,
                s.kafka_timeout_seconds,
                s.kafka_security,
                # Not ListOffsets: Tansu answers it with the last batch's base offset + 1
                # (see `log_bounds`); a poll returns whatever the partitions hold.
                auto_offset_reset="none",
                max_poll_records=READ_CHUNK,
            )
        consumer = self._consumer
        # Assigned and sought only when the positions are not where the last poll left them:
        # each seek drops the fetch under way, and under load one may take longer than a poll.
        # Between seeks the consumer's position is the one its own fetches left, which carries
        # the leader epoch of the last record read (KIP-320): if the log under it changes (a
        # topic recreated shorter), kafka-python validates it against the broker and, with no
        # reset policy, raises LogTruncationError. A seek does not clear that: a validation
        # started from the old position (by a poll, in the background) and finished after the
        # seek is cached by the consumer and raised by the next poll, from the new positions.
        # So after an offset reset, and after any failure, reading goes on with a new consumer
        # (`_renew_consumer`, `_close_consumer`): with the old one kept, a stale validation
        # failed the first read from the reset cycle's positions and, positions dropped, no
        # call was started ahead for the rest of that cycle (seen in a CI run).
        if positions != self._polled_to:
            consumer.assign([TopicPartition(s.topic, p) for p in positions])
            for p, offset in positions.items():
                consumer.seek(TopicPartition(s.topic, p), offset)
        # Records the sampling will likely keep `wanted` of, and never more than a chunk.
        records = min(READ_CHUNK, max(wanted, math.ceil(wanted / max(s.sample_rate, 1e-9))))
        polled = consumer.poll(timeout_ms=500, max_records=records)
        items: list[JudgeInput] = []
        moved: dict[int, int] = {}
        for tp, batch in polled.items():
            for record in batch:
                moved[tp.partition] = record.offset + 1
                item = judge_input_ahead(
                    record.value or b"", record.timestamp / 1000.0, rules, s.topic
                )
                if item is not None:
                    items.append(item)
        self._polled_to = {**positions, **moved}
        with self._lock:
            if self._cycles != cycles:
                # A cycle started during the poll: these records may be its own, which its
                # graph may already have asked for; calls started now would be made twice.
                # Its positions are in `_next`; reading goes on from there.
                return []
            for p, offset in moved.items():
                self._next[p] = offset
            self._started += len(items)
            # Under the lock, so no cycle starts between the check and here; the panel's loop
            # registers these calls before the cycle's own batch (its queue is first in, first
            # out), so the cycle finds them.
            if items:
                self._panel.start_ahead(items)
        return items


def judge_input_ahead(
    raw: bytes, record_time: float, rules: AdmissionRules, topic: str
) -> JudgeInput | None:
    """The judge input `ParseEvents` makes of this record under the cycle's `rules`, or None
    where it judges none: the same `AdmissionRules.judged`, so the two cannot disagree."""
    oversize = len(raw) if len(raw) > rules.max_bytes else None
    event = rules.judged(SourceRecord(raw, topic, None, 0, record_time, oversize))
    return None if event is None else event.judge_input
