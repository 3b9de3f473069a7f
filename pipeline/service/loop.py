"""The serve loop: one micro-batch cycle after another over a live Kafka topic, exactly once.

A cycle (`TopicWatcher.run_cycle`) is a short sequence of calls on parts that own their state
(STYLE.md, habit 11): plan (`Partitions`, pipeline/service/partitions.py: the broker's bounds,
the offsets saved, `pipeline.service.plan`), read and judge (`CycleGraph`, cycle_graph.py; the
conversations due, `OpenSessions`, open_sessions.py), save (`CycleOutcome`, with each cost
control's charge) and publish (the group commit and the lag, `Partitions`; the snapshot,
`Health`, health.py); the reviewers' labels are read and saved with the cycle's transaction
(`ReviewLabels`, labels.py). The loop names no input format and no cost control: it asks the one
`pipeline.sources.inputs.input_for` gives and the controls serve built
(`pipeline.costs.controls`).

It asks the broker for each partition's bounds, plans [start, stop) offset ranges from the
offsets in the state store, runs the Beam graph over them (`pipeline.graphs.bounded.run_graph`:
read, parse, judge, window, and publish dead letters and verdict rows, each acknowledged before
the run ends), then saves the window counts, counter increments, watermark and offsets (a
`CycleOutcome`) in ONE SQLite transaction, and only then commits the offsets to the Kafka
consumer group (for lag tools; the state file is the source of truth). A crash at any point
replays at most the cycle in flight, whose counts were not saved: nothing is lost and nothing is
counted twice. Dead-letter records of a replayed cycle may be published twice (at least once);
their headers carry the source partition and offset to deduplicate on.

What can still go wrong is counted and logged, never silent (see README, "Reliability"): a saved
offset outside the partition (topic recreated or truncated, retention ahead of serve) is
handled by --on-offset-reset and counted in `ragpulse_offset_resets_total` and
`ragpulse_records_lost_total`; output records the broker refuses for good, or still does not
acknowledge after --undeliverable-after, are counted in
`ragpulse_dead_letters_undeliverable_total` and the cycle moves on; a state file that cannot be
used stops serve with one line saying what to do (--state-reset).

With --input-format otlp_json|otlp_proto the topic holds the OpenTelemetry Collector's span
batches: the cycle reads its ranges in this process, assembles the traces whose
--trace-assembly-wait is over together with the spans pending in the state store, and runs the
graph over the assembled events; the spans still waiting are saved in the cycle's transaction
(pipeline/formats/otlp.py says why there). The exactly-once argument above holds for them too.

Several instances split a topic's partitions by a fixed rule (--instance I of --instances N
reads the partitions p with p % N == I, partitions added later included), each with its own
state file, so each is exactly once on its own partitions as above and none reads, commits or
reports lag for another's. Fixed rather than Kafka group membership: a rebalance would move a
partition away from the state file holding its offsets and open windows, and a crashed member's
partitions would go to a survivor that has neither. A state file holding offsets of partitions
this instance does not own was written under another assignment and is refused at start; after
a change of N (with --state-reset, which moves it aside) and for a partition a state file has
never seen, a sharded instance goes on from the consumer group's committed offsets, the only
record the instances share of where each partition has got to. Mistakes in the assignment are
caught rather than absorbed: each commit is signed and the group's commits are read back before
the next (`pipeline.service.owners`), and ownership is claimed at start, before the first
cycle counts anything (`Partitions.claim`), so a second live owner of a partition, or an
instance with other --instances, is refused at start or stops the newer instance (/healthz 503,
one ERROR line, its counts no longer exported); the lag of every partition of the topic, read
or not, is exported (`ragpulse_consumer_lag`, `Partitions.lag`).

Judge calls are paid as they are answered, before the cycle commits: each answered call is
journaled in the state file as it arrives (`pipeline.service.journal`), so a cycle replayed
after a crash takes those answers instead of paying again, and the tokens of every paid call
are counted once, by the first cycle to commit after the answer. The judge budget's spend of
the clock hour is saved with each cycle (`pipeline.costs.budget`).

Judge calls keep flowing between cycles: while a cycle runs, `pipeline.service.lookahead`
starts the calls for the events after its ranges, which the next cycle's judge stage takes over
and counts as its own; only calls are shared, so the guarantees above hold as they are.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence

from ragpulse.pipeline.canaries import CanaryFeed
from ragpulse.pipeline.costs.controls import CostControl, CycleStart
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot
from ragpulse.pipeline.service.cycle_graph import CycleGraph, PublishError
from ragpulse.pipeline.service.cycle_hooks import CycleHooks
from ragpulse.pipeline.service.health import Health
from ragpulse.pipeline.service.labels import ReviewLabels
from ragpulse.pipeline.service.open_sessions import OpenSessions
from ragpulse.pipeline.service.owners import Owner
from ragpulse.pipeline.service.partitions import Partitions, open_state
from ragpulse.pipeline.service.plan import OffsetResetRefused
from ragpulse.pipeline.service.state import CycleOutcome, StateStore
from ragpulse.pipeline.service.watermark import (
    compute_watermark,
    final_before,
    merge_latest,
    starting_watermark,
)
from ragpulse.pipeline.settings.models import ServeSettings
from ragpulse.pipeline.sinks.kafka import UNDELIVERABLE
from ragpulse.pipeline.sources.inputs import input_for
from ragpulse.pipeline.sources.kafka import RECORDS_LOST, KafkaClients
from ragpulse.pipeline.windows import RatingCounts, WindowKey, isoformat_utc

log = logging.getLogger(__name__)

__all__ = [
    "OffsetResetRefused",
    "PublishError",
    "StopRequest",
    "TopicWatcher",
    "open_state",
]

OFFSET_RESETS = catalogue.OFFSET_RESETS
RESET_KINDS = ("beyond_end", "below_start")
LOSS_REASONS = ("retention", "topic_reset")


class TopicWatcher:
    """The serve loop: cycles over the topic, keeps the state, feeds /metrics and /healthz."""

    def __init__(
        self,
        settings: ServeSettings,
        state: StateStore | None = None,
        *,
        was_reset: bool = False,
        canaries: CanaryFeed | None = None,
        owner: Owner | None = None,
        previous_owner: str | None = None,
        controls: Sequence[CostControl] = (),
    ) -> None:
        """`state`: the store, when the caller opened it (`open_state`); `was_reset`: it is
        fresh because --state-reset moved an unusable file aside; `canaries`: the golden-set
        feed, checked by the caller before anything was opened; `owner`: this process as it
        signs its commits, and `previous_owner` the one that held the state file's lock before
        (`pipeline.service.owners`); `controls`: the cost controls, in the order a cycle's
        spend goes through them (`pipeline.costs.controls`)."""
        s = self.settings = settings
        if state is None:
            state, was_reset = open_state(settings)
        self.state = state
        owner = owner or Owner.this_process(s.instance, s.instances, s.unhealthy_after_seconds)
        # The consumers asked every cycle, kept from the first cycle to `close`.
        self.kafka = KafkaClients()
        self.partitions = Partitions(
            s, state, owner, previous_owner, was_reset=was_reset, clients=self.kafka
        )
        self.controls = tuple(controls)
        self.inputs = input_for(s.input_format, s.trace_assembly_wait_seconds)
        self.graph = CycleGraph(
            s, self.inputs, canaries=canaries, saved_counts=lambda: self.snapshot().counts,
            controls=self.controls,
        )
        self.sessions = OpenSessions(s, state)
        self.health = Health(s.unhealthy_after_seconds)
        self._hooks = CycleHooks.from_environment()
        self.labels = ReviewLabels(s, state, self._hooks, self.kafka)
        # The refusal /healthz reports: the one the last snapshot was published with, so that
        # /healthz says "stopped counting" only once /metrics has stopped exporting the counts.
        self._published_refusal: str | None = None
        self._publish()

    @property
    def owner(self) -> Owner:
        return self.partitions.owner

    # ----- one cycle -------------------------------------------------------------------------
    def run_cycle(self) -> tuple[int, float | None]:
        """Read, judge and save one micro-batch; returns how many records it covered and, if
        it read any, how long it took: plan, read, judge, save (`CycleOutcome`, one
        transaction), then publish (the group's commit, the lag, the snapshot /metrics
        serves)."""
        s, state = self.settings, self.state
        every, plan = self.partitions.plan()
        if plan.ranges:
            self._hooks.at("planned")
        started, now = time.perf_counter(), time.time()
        previous = starting_watermark(state.watermark(s.topic), now, s.out_of_orderness_seconds)
        due, held = self.sessions.begin(previous)
        cutoff = final_before(previous, s.allowed_lateness_seconds, held)
        cycle = CycleStart(plan.starts, plan.stops, cutoff, tuple(plan.reset_to))
        for control in self.controls:
            control.cycle_started(cycle)
        batch, counts = self.graph.read(
            plan.ranges, now, state, records_needed=self.sessions.active
        )
        latest = state.latest_event_times(s.topic)
        result = changes = took = None
        if (batch.records if batch is not None else plan.ranges) or due:
            config = self.graph.config(plan.ranges, batch, cutoff, now)
            result, judged = self.graph.judge(plan.ranges, batch, config, due)
            self._hooks.at("judged")
            counts.update(judged)
            latest = merge_latest(latest, result.latest_event_time)
            records = batch.records if batch is not None else []
            changes, session_counts = self.sessions.changes(result, records, config.admission)
            counts.update(session_counts)
            took = time.perf_counter() - started
        else:
            changes = self.sessions.idle(cutoff)
        watermark = compute_watermark(
            latest, self.partitions.holding(plan), s.out_of_orderness_seconds,
            previous=previous, now=now,
        )
        counts.update(plan.counts(s.topic))
        labels = self.labels.read()
        counts.update(labels.counts)
        paid = Counter(result.counts) if result is not None else Counter()
        saves: dict[str, object] = {}
        for control in self.controls:
            charge = control.charge(paid)
            paid = charge.paid
            counts.update(charge.counts)
            saves.update(charge.saves)
        outcome = CycleOutcome(
            windows=result.windows if result else {},
            offsets=plan.stops,
            counts=counts,
            closed_before=final_before(
                watermark, s.allowed_lateness_seconds, self.sessions.hold_after(changes)
            ),
            watermark=watermark,
            latest_event_times=latest,
            reset_offsets=plan.reset_to,
            spans_added=batch.spans_added if batch else (),
            traces_finished=batch.traces_finished if batch else frozenset(),
            finished_at=now,
            # A finished trace is remembered as long as a span of it could still be counted:
            # its wait, then its window until the watermark closes it.
            forget_finished_before=now - (
                s.trace_assembly_wait_seconds + s.window_seconds
                + s.out_of_orderness_seconds + s.allowed_lateness_seconds
            ),
            sessions=changes,
            labels=labels.taken,
            **saves,  # type: ignore[arg-type]  # each control's CycleOutcome fields
        )
        completed = state.apply_cycle(s.topic, outcome)
        for control in self.controls:
            control.committed()
        self.graph.delivered()
        self.labels.committed()
        if plan.ranges:
            self._hooks.at("saved")
        if result is not None:
            state.save_exemplars(result.exemplars)
        if watermark is not None:
            state.prune_windows(ended_before=watermark - s.retention_seconds)
        _log_completed(completed)
        self.partitions.after_cycle(every, plan)
        self._publish()
        if result is not None:
            log.info(
                "cycle covered %d records in %d partitions; %d dead letters; watermark %s",
                plan.covered, len(plan.ranges), result.dead_letters, watermark,
            )
        return plan.covered, took

    # ----- metrics and health ----------------------------------------------------------------
    def _publish(self) -> None:
        """The snapshot /metrics serves, from the state as it is now."""
        s = self.settings
        gauges: dict[str, float] = {}
        watermark = self.state.watermark(s.topic)
        if watermark is not None:
            gauges[catalogue.WATERMARK] = watermark
        for control in self.controls:
            gauges.update(control.gauges())
        gauges.update(self.inputs.gauges(self.state, s.topic))
        gauges.update(self.sessions.gauges())
        labels = self.labels.figures(self.state.counters())
        refusal = self.partitions.refused
        self.health.publish(
            self.state, s.topic, gauges=gauges, zero_counters=self._zero_counters(),
            lag=self.partitions.lag(), calibrations=labels.calibrations,
            agreements=labels.agreements, counting_stopped=refusal is not None,
            hidden=self.labels.hidden_counters(),
        )
        self._published_refusal = refusal

    def _zero_counters(self) -> list[counting.CounterKey]:
        """Data-loss counters whose labels are known at start-up, exported at 0 until they
        grow, so that increase() in the alerts sees their first increment."""
        s = self.settings
        keys = [counting.key(OFFSET_RESETS, topic=s.topic, kind=k) for k in RESET_KINDS]
        keys += [counting.key(RECORDS_LOST, topic=s.topic, reason=r) for r in LOSS_REASONS]
        keys.append(counting.key(UNDELIVERABLE, topic=s.dead_letter_topic))
        if s.publish_verdicts != "none":
            keys.append(counting.key(UNDELIVERABLE, topic=s.verdicts_topic))
        for control in self.controls:
            keys.extend(control.zero_counters())
        keys.extend(self.labels.zero_counters())
        return keys

    def snapshot(self) -> MetricsSnapshot:
        return self.health.snapshot()

    def healthy(self) -> tuple[bool, str]:
        """Unhealthy once another owner of this instance's partitions was found and /metrics
        stopped exporting the counts (the snapshot published after the finding); else as the
        cycles go (`Health.healthy`)."""
        refusal = self._published_refusal
        if refusal is not None:
            return False, refusal
        return self.health.healthy()

    # ----- the loop --------------------------------------------------------------------------
    def serve_forever(self, stop: StopRequest) -> None:
        """Cycle until a stop is requested; the cycle in flight finishes and is saved (or, if
        it takes longer than serve's STOP_GRACE_SECONDS, is abandoned unsaved by the command)."""
        backoff = 1.0
        while not stop.requested:
            if self.partitions.refused is not None:  # /metrics and /healthz go on; counting not
                stop.sleep(self.settings.trigger_interval_seconds)
                continue
            started = time.monotonic()
            self.health.cycle_began()
            try:
                covered, took = self.run_cycle()
            except OffsetResetRefused:
                raise
            except Exception as exc:
                self.health.cycle_ended(ok=False)
                log.error("cycle failed (retrying in %.0fs): %s", backoff, exc)
                stop.sleep(backoff)
                backoff = min(backoff * 2, 30.0)
                continue
            backoff = 1.0
            self.health.cycle_ended(ok=True, took=took)
            if covered >= self.settings.max_batch_events:
                continue  # a backlog remains: go on at once
            stop.sleep(self.settings.trigger_interval_seconds - (time.monotonic() - started))
        log.info("stop requested (%s): the cycle in flight has finished and is saved", stop.why)

    def close(self) -> None:
        if self.health.first_failure is None:
            self.partitions.release()
        for control in reversed(self.controls):  # the lookahead before the journal it feeds
            control.close()
        self.kafka.close()
        self.state.close()


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


def _log_completed(windows: Mapping[WindowKey, RatingCounts]) -> None:
    for key, c in windows.items():
        log.info(
            "window %s..%s complete: %s %s/%s pass %s (n=%d)",
            isoformat_utc(key.window_start),
            isoformat_utc(key.window_end),
            key.judge,
            key.app,
            key.model,
            f"{c.yes / c.graded:.1%}" if c.graded else "-",
            c.graded,
        )
