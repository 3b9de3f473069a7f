"""The serve loop: one micro-batch cycle after another over a live Kafka topic, exactly once.

A cycle (`TopicWatcher.run_cycle`) asks the broker for each partition's bounds, plans
[start, stop) offset ranges from the offsets in the state store (`pipeline.service.plan`, pure),
runs the Beam graph over them (`pipeline.graphs.bounded.run_graph`: read, parse, judge, window,
and publish dead letters and verdict rows, each acknowledged before the run ends), then saves
the window counts, counter increments, watermark and offsets (a `CycleOutcome`) in ONE SQLite
transaction, and only then commits the offsets to the Kafka consumer group (for lag tools; the
state file is the source of truth). A crash at any point replays at most the cycle in flight,
whose counts were not saved: nothing is lost and nothing is counted twice. Dead-letter records
of a replayed cycle may be published twice (at least once); their headers carry the source
partition and offset to deduplicate on.

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
the next (`pipeline.service.owners`), so a second live owner of a partition, or an instance with
other --instances, stops the newer instance (/healthz 503, one ERROR line); the lag of every
partition of the topic, read or not, is exported (`ragpulse_consumer_group_lag`).

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

import dataclasses
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import apache_beam as beam

from ragpulse.judges import shared_panel
from ragpulse.judges.sessions import Session
from ragpulse.pipeline.calibration import by_judge
from ragpulse.pipeline.canaries import CanaryFeed
from ragpulse.pipeline.costs.budget import TOKENS, BudgetGovernor
from ragpulse.pipeline.costs.sampling import SPEND, SamplingPlan
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.graphs.bounded import (
    GraphResult,
    Sinks,
    StageConfig,
    pipeline_options,
    run_graph,
)
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.collector import CycleStats, MetricsSnapshot
from ragpulse.pipeline.metrics.labels import LabelBudget
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.service.conversations import (
    DueSessions,
    SavedConversations,
    SessionChanges,
    new_turns,
)
from ragpulse.pipeline.service.cycle_hooks import CycleHooks
from ragpulse.pipeline.service.journal import AnsweredCalls, Settlement
from ragpulse.pipeline.service.lookahead import Lookahead, runs_here
from ragpulse.pipeline.service.owners import Commit, Owner, conflicts, read_metadata
from ragpulse.pipeline.service.plan import CyclePlan, plan_cycle
from ragpulse.pipeline.service.state import CycleOutcome, HourSpend, StateError, StateStore
from ragpulse.pipeline.service.watermark import (
    ceiling,
    closed_before,
    compute_watermark,
    holding_partitions,
    merge_latest,
)
from ragpulse.pipeline.settings.models import ServeSettings
from ragpulse.pipeline.sinks.kafka import (
    UNDELIVERABLE,
    KafkaTopic,
    PublishDeadLetters,
    PublishVerdicts,
)
from ragpulse.pipeline.sinks.otlp_evaluations import ExportEvaluations
from ragpulse.pipeline.sources.kafka import (
    RECORDS_LOST,
    KafkaGroup,
    KafkaRangeSource,
    LogBounds,
    ReadKafkaRanges,
    consumer_lag,
)
from ragpulse.pipeline.sources.otlp import TraceBatch, collect_traces
from ragpulse.pipeline.stages.sessions import session_record
from ragpulse.pipeline.windows import RatingCounts, WindowKey, isoformat_utc

log = logging.getLogger(__name__)

OFFSET_RESETS = catalogue.OFFSET_RESETS
# A delivery failure that may clear up is given up on only after --undeliverable-after AND this
# many failed attempts, so that a broker just back from an outage gets a few tries.
MIN_DELIVERY_ATTEMPTS = 3
RESET_KINDS = ("beyond_end", "below_start")
LOSS_REASONS = ("retention", "topic_reset")


class OffsetResetRefused(RuntimeError):
    """A saved offset is outside its partition and --on-offset-reset is `fail`."""


class PublishError(RuntimeError):
    """Output records were not acknowledged and --undeliverable-after has not passed yet."""


@dataclasses.dataclass(frozen=True, slots=True)
class _CycleRun:
    """What running a cycle's graph gave, for its outcome: its clock (`now`), the watermark it
    started from, the latest event time per partition, its counter increments (records lost
    on reading, undeliverable outputs, verdicts with bounded labels, sessions), the graph's
    result, the traces it assembled, its changes to the conversations and the cut-off of final
    windows its open sessions hold (`conversations.hold`; None: no open session), and how long
    it judged (None: it read nothing)."""

    now: float
    previous_watermark: float | None
    latest: dict[int, float]
    counts: counting.Counts
    result: GraphResult | None = None
    traces: TraceBatch | None = None
    sessions: SessionChanges | None = None
    sessions_hold: float | None = None
    took: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _ReadHere:
    """A cycle's records read in this process (`TopicWatcher._read_here`), the traces
    assembled from them (--input-format otlp_*; None otherwise: the records are events), and
    the counter increments of the read (records retention deleted first, counted lost)."""

    records: list[SourceRecord]
    counts: counting.Counts
    traces: TraceBatch | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Paid:
    """The judge calls a cycle pays for: the journal's settlement (None without a journal) and
    the tokens counted, marked paid once the cycle is saved."""

    settlement: Settlement | None
    tokens: counting.Counts


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
    ) -> None:
        """`state`: the store, when the caller opened it (`open_state`); `was_reset`: it is
        fresh because --state-reset moved an unusable file aside; `canaries`: the golden-set
        feed, checked by the caller before anything was opened; `owner`: this process as it
        signs its commits, and `previous_owner` the one that held the state file's lock before
        (`pipeline.service.owners`)."""
        self.settings = settings
        # Where the cycles read their ranges, in the graph or (traces, conversations) here.
        self._source = KafkaRangeSource(
            settings.bootstrap,
            settings.topic,
            settings.kafka_security,
            stall_timeout_s=settings.kafka_timeout_seconds,
            max_value_bytes=settings.max_event_bytes,
        )
        # The topic's bounds and the consumer group's commits, asked outside the graph.
        self._group = KafkaGroup(
            settings.bootstrap,
            settings.group_id,
            settings.topic,
            settings.kafka_timeout_seconds,
            settings.kafka_security,
        )
        self.owner = owner or Owner.this_process(
            settings.instance, settings.instances, settings.unhealthy_after_seconds
        )
        self._previous_owner = previous_owner
        # The offsets this process last committed (None before its first commit), and why it
        # stopped counting, if another owner of its partitions was found.
        self._committed: dict[int, int] | None = None
        self._refused: str | None = None
        self._newer_owners_logged: set[str] = set()
        self._group_lag: dict[tuple[str, int], int] = {}
        self._canaries = canaries
        if state is None:
            state, was_reset = open_state(settings)
        self.state = state
        self._sessions = _saved_conversations(settings, state)
        # After a reset, the consumer group's committed offsets say where the lost file had got;
        # for a sharded instance they say where the previous owner of a partition had got.
        self._group_offsets: dict[int, int] | None = (
            None if was_reset or settings.instances > 1 else {}
        )
        self._delivery_failing_since: float | None = None
        self._delivery_failures = 0
        self._lock = threading.Lock()
        self._lag: dict[tuple[str, int], int] = {}
        self._cycles = CycleStats()
        self._governor = _governor(settings, state)
        self._journal = _journal(settings, state)
        self._heartbeat = time.time()  # start-up counts as alive until the first cycle fails
        self._first_failure: float | None = None
        self._cycle_started: float | None = None
        self._snapshot = self._load_snapshot()
        self.labels = LabelBudget(settings.labels)
        self._lookahead = _lookahead(settings)
        self._hooks = CycleHooks.from_environment()
        # When each partition last had a backlog (time.monotonic()), for --partition-idle-after;
        # every partition counts from start-up (or from when it appears), so a restart idles
        # none before its grace.
        self._started = time.monotonic()
        self._last_backlog: dict[int, float] = {}
        if settings.instances > 1:
            log.info(
                "instance %d of %d: reading the partitions p of %s with p %% %d == %d",
                settings.instance,
                settings.instances,
                settings.topic,
                settings.instances,
                settings.instance,
            )

    # ----- one cycle -------------------------------------------------------------------------
    def run_cycle(self) -> tuple[int, float | None]:
        """Read, judge and save one micro-batch; returns how many records it covered and, if
        it read any, how long it took.

        Read the partitions' bounds, plan the cycle's ranges (`plan_cycle`), run the graph over
        them, save what it gave (`CycleOutcome`, one transaction), then report: the group's
        commit, the lag, the snapshot /metrics serves."""
        every = self._group.bounds()
        plan = self._plan(every.only(self.settings.owns))
        run = self._run(plan)
        outcome, paid = self._outcome(plan, run)
        completed = self.state.apply_cycle(self.settings.topic, outcome)
        self._after_save(plan, run, outcome, paid)
        self._report(every, plan, run, outcome, completed)
        return plan.covered, run.took

    def _plan(self, bounds: LogBounds) -> CyclePlan:
        """The cycle's plan over `bounds` (this instance's partitions), from the saved offsets;
        resets are logged, and refused under --on-offset-reset fail (OffsetResetRefused)."""
        s = self.settings
        saved = self.state.offsets(s.topic)
        plan = plan_cycle(
            bounds,
            saved,
            max_records=s.max_batch_events,
            on_offset_reset=s.on_offset_reset,
            group_offsets=self._group_offsets_for(saved, bounds),
        )
        self._log_resets(plan)
        if self._journal is not None:
            self._journal.begin_attempt()
        if plan.ranges:
            self._hooks.at("planned")
        return plan

    def _run(self, plan: CyclePlan) -> _CycleRun:
        """Run the graph over the plan's ranges (read here first for traces and
        conversations), with the sessions the watermark has closed; the verdict counts come
        back with their labels bounded, undeliverable outputs decided on."""
        s = self.settings
        previous_wm = self._previous_watermark()
        conversations = self._sessions
        cutoff = _earlier(
            closed_before(previous_wm, s.allowed_lateness_seconds),
            conversations.hold() if conversations is not None else None,
        )
        due = conversations.due(previous_wm) if conversations is not None else None
        sessions_due = due.sessions if due is not None else []
        if self._lookahead is not None:
            self._lookahead.cycle_started(plan.starts, plan.stops, cutoff, reset=plan.reset_to)
        started, now = time.perf_counter(), time.time()
        here = self._read_here(plan.ranges, now, conversations is not None)
        records = here.records if here is not None else None
        counts = Counter(here.counts if here is not None else {})
        latest = self.state.latest_event_times(s.topic)
        result: GraphResult | None = None
        changes: SessionChanges | None = None
        took: float | None = None
        if (records if records is not None else plan.ranges) or sessions_due:
            config = self._config(plan.ranges, records, cutoff, now)
            result, judged = self._graph(plan.ranges, records, config, sessions_due)
            counts.update(judged)
            latest = merge_latest(latest, result.latest_event_time)
            if due is not None:
                changes = self._conversations(due, result, records or [], config)
                counts.update(changes.counts)
            took = time.perf_counter() - started
        elif conversations is not None and due is not None:
            # A cycle that judged nothing still forgets the judged sessions no turn can join.
            changes = conversations.changes(due, {}, [], cutoff)
        return _CycleRun(
            now, previous_wm, latest, counts, result, here.traces if here else None, changes,
            sessions_hold=changes.hold if changes is not None else None, took=took,
        )

    def _previous_watermark(self) -> float | None:
        """The saved watermark the cycle starts from. One saved from a future-dated event
        (before --max-future-skew) would close every window for this cycle too: it is pulled
        back to the ceiling at once."""
        s = self.settings
        saved = self.state.watermark(s.topic)
        if saved is None:
            return None
        return min(saved, ceiling(time.time(), s.out_of_orderness_seconds))

    def _graph(
        self,
        ranges: Mapping[int, tuple[int, int]],
        records: list[SourceRecord] | None,
        config: StageConfig,
        sessions_due: Sequence[Session],
    ) -> tuple[GraphResult, counting.Counts]:
        """Run the graph (`_judge`) and make its result one to save: without the tokens the
        journal counts, undeliverable outputs decided on (`_undeliverable`), labels bounded.
        Returns that result and the counter increments it adds (undeliverable records, the
        bounded counts)."""
        result = self._judge(ranges, records, config, sessions_due)
        self._hooks.at("judged")
        if self._journal is not None:
            # Tokens are counted from the journal (`_outcome`), once per paid call.
            result = dataclasses.replace(
                result, counts=Counter({k: n for k, n in result.counts.items() if k[0] != TOKENS})
            )
        counts = self._undeliverable(result)
        result = self._bound_labels(result)
        counts.update(result.counts)
        return result, counts

    def _outcome(self, plan: CyclePlan, run: _CycleRun) -> tuple[CycleOutcome, _Paid]:
        """What the cycle saves: its counts, windows and offsets, the watermark it moved to,
        and the judge calls it pays for (the journal's settlement, the budget's spend)."""
        s = self.settings
        clock = time.monotonic()
        for p in plan.ends:
            self._last_backlog.setdefault(p, self._started)
        self._last_backlog.update(dict.fromkeys(plan.ranges, clock))
        watermark = compute_watermark(
            run.latest,
            holding_partitions(self._last_backlog, clock, s.partition_idle_after_seconds),
            s.out_of_orderness_seconds,
            previous=run.previous_watermark,
            now=run.now,
        )
        result, traces = run.result, run.traces
        settlement = self._journal.settle() if self._journal is not None else None
        paid = _Paid(
            settlement,
            counting.merge(
                result.counts if result is not None else {},
                settlement.tokens if settlement is not None else {},
            ),
        )
        counts = plan.counts(s.topic)
        counts.update(run.counts)
        hour_spend = None
        if settlement is not None:
            counts.update(settlement.tokens)
        if self._governor is not None:
            spend = self._governor.spend(paid.tokens)
            counts.update(self._governor.spend_counter(spend))
            hour, spent = self._governor.this_hour_with(spend)
            hour_spend = HourSpend(hour, self._governor.settings.unit, spent)
        final_before = _earlier(
            closed_before(watermark, s.allowed_lateness_seconds), run.sessions_hold
        )
        outcome = CycleOutcome(
            windows=result.windows if result else {},
            offsets=plan.stops,
            counts=counts,
            closed_before=final_before,
            watermark=watermark,
            latest_event_times=run.latest,
            reset_offsets=plan.reset_to,
            spans_added=traces.spans_added if traces else (),
            traces_finished=traces.traces_finished if traces else (),
            finished_at=run.now,
            # A finished trace is remembered as long as a span of it could still be counted:
            # its wait, then its window until the watermark closes it.
            forget_finished_before=run.now
            - (
                s.trace_assembly_wait_seconds
                + s.window_seconds
                + s.out_of_orderness_seconds
                + s.allowed_lateness_seconds
            ),
            hour_spend=hour_spend,
            calls_settled=settlement.calls if settlement is not None else None,
            sessions=run.sessions,
        )
        return outcome, paid

    def _after_save(
        self, plan: CyclePlan, run: _CycleRun, outcome: CycleOutcome, paid: _Paid
    ) -> None:
        """What follows the cycle's transaction: its calls marked paid in the journal and the
        budget, the delivery retries reset, its exemplars kept and old windows pruned."""
        if self._journal is not None and paid.settlement is not None:
            self._journal.settled(paid.settlement)
        if self._governor is not None:
            self._governor.record(paid.tokens)
        self._delivery_failing_since, self._delivery_failures = None, 0
        if plan.ranges:
            self._hooks.at("saved")
        if run.result is not None:
            self.state.save_exemplars(run.result.exemplars)
        if outcome.watermark is not None:
            retention = self.settings.retention_seconds
            self.state.prune_windows(ended_before=outcome.watermark - retention)

    def _report(
        self,
        every: LogBounds,
        plan: CyclePlan,
        run: _CycleRun,
        outcome: CycleOutcome,
        completed: Mapping[WindowKey, RatingCounts],
    ) -> None:
        """The saved cycle made visible: windows completed, the group's commit, the lag gauges
        (`every`: all the topic's partitions) and the snapshot /metrics serves."""
        _log_completed(completed)
        # Every cycle, even one that read nothing: the signed commit is this owner's heartbeat.
        group = self._commit_group_offsets()
        # The lag is measured against the ends as they are NOW: measured against the ends seen
        # at the start of the cycle it would read 0 after every cycle that caught up with them,
        # however much arrived while the cycle ran (a 16 s cycle at 3,000 events/s hid 48,000).
        now_ends = self._ends_after_cycle(plan.ends) if plan.ranges else dict(plan.ends)
        self._update_lag(now_ends, plan.starts)
        self._update_group_lag(group, {**every.ends, **now_ends}, every.beginnings)
        self._refresh_snapshot()
        if run.result is not None:
            log.info(
                "cycle covered %d records in %d partitions; %d dead letters; watermark %s",
                plan.covered,
                len(plan.ranges),
                run.result.dead_letters,
                outcome.watermark,
            )

    def _read_here(
        self, ranges: Mapping[int, tuple[int, int]], now: float, conversations: bool
    ) -> _ReadHere | None:
        """The records of `ranges` read in this process, where the cycle needs them before its
        graph: to assemble traces (--input-format otlp_*, `_traces`) or, with `conversations`,
        to save their turns with the cycle (pipeline/service/conversations.py). None elsewhere:
        the graph reads them. Records the broker's retention deleted first are counted as lost,
        as the graph's reader counts them."""
        s = self.settings
        if s.input_format == "ragpulse" and not conversations:
            return None
        counts: counting.Counts = Counter()
        lost = counting.key(RECORDS_LOST, topic=s.topic, reason="retention")
        read = list(self._source.read(ranges, lambda n: counts.update({lost: n})))
        if s.input_format == "ragpulse":
            return _ReadHere(read, counts)
        traces = self._traces(read, now)
        return _ReadHere(list(traces.records), counts, traces)

    def _traces(self, records: list[SourceRecord], now: float) -> TraceBatch:
        """--input-format otlp_*: assemble from `records`, with the spans pending in the state,
        the traces whose --trace-assembly-wait is over (pipeline/formats/otlp.py)."""
        s = self.settings
        batch = collect_traces(
            records,
            self.state.pending_spans(s.topic),
            encoding=s.input_format,
            now=now,
            wait=s.trace_assembly_wait_seconds,
            origin=s.topic,
            finished=lambda ids: self.state.finished_traces(s.topic, ids),
        )
        log.info(
            "%d OTLP records read; %d traces assembled or refused, %d still pending",
            batch.records_read,
            len(batch.traces_finished),
            batch.pending_traces,
        )
        return batch

    def _config(
        self,
        ranges: Mapping[int, tuple[int, int]],
        records: list[SourceRecord] | None,
        cutoff: float | None,
        now: float,
    ) -> StageConfig:
        """The cycle's stage configuration: its cut-off of final windows, its clock, and the
        budget governor's sampling rates for its number of records."""
        config = dataclasses.replace(self.settings.stage_config(closed_before=cutoff), now=now)
        if self._governor is not None:
            plan = config.sampling or SamplingPlan((), config.sample_rate)
            n = (
                len(records)
                if records is not None
                else sum(stop - start for start, stop in ranges.values())
            )
            config = dataclasses.replace(config, sampling=self._governor.plan_for(plan, n))
        return config

    def _judge(
        self,
        ranges: Mapping[int, tuple[int, int]],
        records: list[SourceRecord] | None,
        config: StageConfig,
        sessions_due: Sequence[Session] = (),
    ) -> GraphResult:
        """Run the graph over `ranges` (or their `records`, read already), with the sessions
        due: Kafka in, the dead-letter and verdicts topics out."""
        s = self.settings

        def topic(name: str) -> KafkaTopic:
            return KafkaTopic(s.bootstrap, s.kafka_security, name, s.kafka_timeout_seconds)

        verdicts = s.publish_verdicts != "none"
        sinks = Sinks(
            dead_letters=PublishDeadLetters(topic(s.dead_letter_topic)),
            verdicts=(
                PublishVerdicts(topic(s.verdicts_topic), s.judges.text_policy())
                if verdicts
                else None
            ),
            only_failing_verdicts=s.publish_verdicts == "failing",
            # An exemplar names a verdict row in the verdicts topic: none without them.
            exemplars=verdicts,
            evaluations=(
                ExportEvaluations(
                    s.evaluation_events_endpoint, s.judges.text_policy(), s.kafka_timeout_seconds
                )
                if s.evaluation_events_endpoint
                else None
            ),
        )
        source = (
            beam.Create(records)
            if records is not None
            else ReadKafkaRanges(self._source, ranges)
        )
        return run_graph(
            source,
            config,
            sinks,
            canaries=self._canaries.take(time.time()) if self._canaries else (),
            options=pipeline_options(s.beam_args, s.runner),
            sessions_due=(
                [session_record(x) for x in sessions_due] if config.sessions is not None else None
            ),
        )

    def _conversations(
        self, due: DueSessions, result: GraphResult, records: list[SourceRecord],
        config: StageConfig,
    ) -> SessionChanges:
        """The cycle's changes to the saved conversations: the sessions it judged, its new
        turns (the events its graph judged that name a session), the sessions they re-open."""
        assert self._sessions is not None and config.now is not None
        fresh = new_turns(
            records,
            now=config.now,
            max_bytes=config.max_event_bytes,
            max_future_skew_s=config.max_future_skew_s,
            window_size=config.window_seconds,
            closed_before=config.closed_before,
            sample_rate=config.sample_rate,
            sampling=config.sampling,
        )
        return self._sessions.changes(due, result.session_windows, fresh, config.closed_before)

    def _undeliverable(self, result: GraphResult) -> counting.Counts:
        """Decide on records an output topic did not acknowledge (refused ones are counted by
        the sink itself): fail the cycle, which is retried as after any failure, until delivery
        has failed for --undeliverable-after (and at least MIN_DELIVERY_ATTEMPTS times); then
        count them as undeliverable and move on. Returns those counter increments."""
        s = self.settings
        if not result.unacknowledged:
            return Counter()
        now = time.monotonic()
        if self._delivery_failing_since is None:
            self._delivery_failing_since = now
        self._delivery_failures += 1
        failing_for = now - self._delivery_failing_since
        if (
            failing_for < s.undeliverable_after_seconds
            or self._delivery_failures < MIN_DELIVERY_ATTEMPTS
        ):
            topic, (n, why) = next(iter(result.unacknowledged.items()))
            raise PublishError(
                f"{n} records not acknowledged by {topic} ({why}); delivery has failed for "
                f"{failing_for:.0f}s, given up after {s.undeliverable_after_seconds:.0f}s "
                "(--undeliverable-after)"
            )
        lost: counting.Counts = Counter()
        for topic, (n, why) in result.unacknowledged.items():
            log.error(
                "%d records for %s are undeliverable and were dropped (not acknowledged for "
                "%.0fs: %s)",
                n,
                topic,
                failing_for,
                why,
            )
            lost[counting.key(UNDELIVERABLE, topic=topic)] += n
        return lost

    def _group_offsets_for(self, saved: Mapping[int, int], bounds: LogBounds) -> dict[int, int]:
        """Where partitions with no saved offset go on from, if not from their log start:
        after --state-reset moved an unusable file aside (and for a sharded instance), the
        consumer group's committed offsets (where that file, or the partition's previous owner,
        had got to); asked once, and only when a partition has no saved offset.

        Only then: a missing file is a fresh start from the log start, so that a second
        deployment sharing the group (or a deliberate recount) is not silently skipped ahead.
        """
        s = self.settings
        if all(p in saved for p in bounds.ends):
            return {}
        if self._group_offsets is None:
            self._group_offsets = self._group.committed()
            if self._group_offsets:
                log.warning(
                    "fresh state after --state-reset: going on from consumer group %s's committed "
                    "offsets %s for %s (other partitions from their log start)",
                    s.group_id,
                    self._group_offsets,
                    s.topic,
                )
        return self._group_offsets or {}

    def _log_resets(self, plan: CyclePlan) -> None:
        """Log each reset of `plan` as an error and where it goes on from; raise
        OffsetResetRefused when --on-offset-reset is fail."""
        s = self.settings
        if not plan.resets:
            return
        for r in plan.resets:
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
        if plan.refused:
            raise OffsetResetRefused(
                f"offsets saved in {s.state} are outside topic {s.topic!r} (partitions "
                f"{', '.join(str(r.partition) for r in plan.resets)}) and --on-offset-reset is "
                "fail: check the topic, then restart with --on-offset-reset earliest (read what "
                "the partition holds) or latest (skip to its end)"
            )
        log.error(
            "going on from offsets %s (--on-offset-reset %s); records skipped: %s",
            dict(plan.reset_to),
            s.on_offset_reset,
            dict(plan.lost) or "none",
        )

    def _bound_labels(self, result: GraphResult) -> GraphResult:
        """The run with app and model labels bounded; the saved counters (the snapshot's)
        hold the values admitted so far, so the choice survives restarts.

        Exemplars are kept only for series the bounded counts hold: a pointer for a value
        counted as `other` would be kept, and loaded at every scrape, for a series that is
        never exported (30,000 such apps grew serve by 36 MiB).
        """
        windows, counts = self.labels.bound(result.windows, result.counts, self.snapshot().counts)
        exemplars = {k: v for k, v in result.exemplars.items() if k in counts}
        return dataclasses.replace(result, windows=windows, counts=counts, exemplars=exemplars)

    def _update_lag(self, ends: Mapping[int, int], starts: Mapping[int, int]) -> None:
        topic = self.settings.topic
        offsets = {**starts, **self.state.offsets(topic)}
        with self._lock:
            self._lag = {(topic, p): n for p, n in consumer_lag(offsets, ends).items()}

    def _ends_after_cycle(self, ends: Mapping[int, int]) -> dict[int, int]:
        """End offsets after a cycle, for the lag gauge; the ones from its start if that fails."""
        try:
            now = self._group.bounds().ends
        except Exception as exc:  # visibility only: the next cycle asks again
            log.warning("could not read end offsets for the lag gauge: %s", exc)
            return dict(ends)
        return {**ends, **{p: end for p, end in now.items() if self.settings.owns(p)}}

    def _group_commits(self) -> dict[int, Commit] | None:
        """The consumer group's commits on every partition; None when they cannot be read."""
        try:
            found = self._group.commits()
        except Exception as exc:  # visibility only: the next cycle asks again
            log.warning("could not read consumer group %s's offsets: %s", self._group.group_id, exc)
            return None
        return {p: read_metadata(offset, meta) for p, (offset, meta) in found.items()}

    def check_owners(self) -> list[tuple[str, Owner | None]]:
        """Another live owner of this instance's partitions, or another --instances, as the
        consumer group's commits show them (`pipeline.service.owners.conflicts`)."""
        group = self._group_commits()
        if group is None:
            return []
        return conflicts(
            self.owner, group, self._committed,
            previous_owner=self._previous_owner, now=time.time(),
        )

    def _commit_group_offsets(self) -> dict[int, Commit] | None:
        """Read the group's commits back, refuse to go on if another owner made some of them,
        else commit this instance's offsets, signed; returns the group's commits (these
        included) for the lag gauge, None when they could not be read."""
        s = self.settings
        group = self._group_commits()
        if group is not None:
            found = conflicts(
                self.owner, group, self._committed,
                previous_owner=self._previous_owner, now=time.time(),
            )
            # The newer owner steps aside; when the other's commits do not say when it
            # started (a broker that drops commit metadata), this one cannot know: it stops.
            if any(o is None or o.started <= self.owner.started for _, o in found):
                self._refuse(found)
                return group
            for why, other in found:
                if other is not None and other.id not in self._newer_owners_logged:
                    self._newer_owners_logged.add(other.id)
                    log.error("%s; that owner started later and stops", why)
        offsets = self._owned_offsets()
        try:
            self._group.commit(offsets, metadata=self.owner.metadata(time.time()))
        except Exception as exc:  # visibility only: the state file already holds the offsets
            log.warning("could not commit offsets to consumer group %s: %s", s.group_id, exc)
            self._committed = None  # not known to have landed: nothing to compare with
            return group
        if offsets:
            self._committed = dict(offsets)
        return None if group is None else {**group, **{p: Commit(o) for p, o in offsets.items()}}

    def _owned_offsets(self) -> dict[int, int]:
        """The saved offsets of this instance's partitions: the others' owners commit theirs."""
        s = self.settings
        return {p: o for p, o in self.state.offsets(s.topic).items() if s.owns(p)}

    def _refuse(self, found: list[tuple[str, Owner | None]]) -> None:
        s = self.settings
        self._refused = (
            f"another serve reads the partitions of --instance {s.instance} --instances "
            f"{s.instances} in consumer group {s.group_id!r} ({'; '.join(w for w, _ in found)}): "
            "each event would be counted twice; this instance stopped counting. Give every "
            "instance the same --instances and its own --instance, then restart this one"
        )
        log.error("%s", self._refused)

    def _update_group_lag(
        self,
        group: Mapping[int, Commit] | None,
        ends: Mapping[int, int],
        beginnings: Mapping[int, int],
    ) -> None:
        """The lag of every partition of the topic, as the consumer group's commits show it:
        a partition no instance reads has no commit and lags from its log start."""
        if group is None:
            return
        topic = self.settings.topic
        lag = {
            (topic, p): max(0, end - (group[p].offset if p in group else beginnings.get(p, 0)))
            for p, end in ends.items()
        }
        with self._lock:
            self._group_lag = lag

    def release(self) -> None:
        """Mark this owner's commits released (a clean stop), so that the next owner need not
        wait for the lease of this one to run out. Visibility only: a failure is logged."""
        s = self.settings
        if self._committed is None or self._refused is not None:
            return
        try:
            self._group.commit(
                self._owned_offsets(), metadata=self.owner.metadata(time.time(), released=True)
            )
        except Exception as exc:
            log.warning("could not release consumer group %s's offsets: %s", s.group_id, exc)

    # ----- metrics ---------------------------------------------------------------------------
    def _load_snapshot(self) -> MetricsSnapshot:
        counts = self.state.counters()
        for zero in self._zero_counters():
            counts.setdefault(zero, 0)
        complete, in_progress = self.state.current_windows()
        wm = self.state.watermark(self.settings.topic)
        gauges = {catalogue.HEARTBEAT: self._heartbeat}
        if wm is not None:
            gauges[catalogue.WATERMARK] = wm
        if self._governor is not None:
            gauges.update(self._governor.gauges())
        if self._sessions is not None:
            gauges[catalogue.SESSIONS_OPEN] = self.state.open_session_count(self.settings.topic)
        if self.settings.input_format != "ragpulse":
            gauges[catalogue.TRACES_PENDING] = self.state.pending_trace_count(self.settings.topic)
        if complete:
            gauges[catalogue.LAST_COMPLETE_WINDOW_END] = max(
                k.window_end for k in complete
            )
        with self._lock:
            lag = dict(self._lag)
            group_lag = dict(self._group_lag)
            cycles = self._cycles
        return MetricsSnapshot(
            counts, complete, in_progress, gauges, lag, self.state.exemplars(), cycles,
            calibrations=by_judge(self.settings.judge_calibrations),
            group_lag=group_lag,
        )

    def _zero_counters(self) -> list[counting.CounterKey]:
        """Data-loss counters whose labels are known at start-up, exported at 0 until they
        grow, so that increase() in the alerts sees their first increment."""
        s = self.settings
        keys = [counting.key(OFFSET_RESETS, topic=s.topic, kind=k) for k in RESET_KINDS]
        keys += [counting.key(RECORDS_LOST, topic=s.topic, reason=r) for r in LOSS_REASONS]
        keys.append(counting.key(UNDELIVERABLE, topic=s.dead_letter_topic))
        if s.publish_verdicts != "none":
            keys.append(counting.key(UNDELIVERABLE, topic=s.verdicts_topic))
        if s.budget is not None:
            keys.append(counting.key(SPEND, unit=s.budget.unit))
        return keys

    def _refresh_snapshot(self) -> None:
        snap = self._load_snapshot()
        with self._lock:
            self._snapshot = snap

    def _record_cycle(self, ok: bool, took: float | None = None) -> None:
        """Count a finished cycle and, after a good one, move the heartbeat; the snapshot is
        updated in place (run_cycle has just rebuilt it; only these are new)."""
        with self._lock:
            self._cycles = self._cycles.with_cycle(ok, took)
            gauges = dict(self._snapshot.gauges)
            if ok:
                gauges[catalogue.HEARTBEAT] = self._heartbeat
            self._snapshot = dataclasses.replace(
                self._snapshot, gauges=gauges, cycles=self._cycles
            )

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return self._snapshot

    def healthy(self) -> tuple[bool, str]:
        """Healthy while cycles complete; unhealthy once they have failed, or one cycle has
        run, for longer than --unhealthy-after (a hung cycle never fails)."""
        if self._refused is not None:
            return False, self._refused
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
        """Cycle until a stop is requested; the cycle in flight finishes and is saved (or, if
        it takes longer than serve's STOP_GRACE_SECONDS, is abandoned unsaved by the command)."""
        backoff = 1.0
        while not stop.requested:
            if self._refused is not None:  # /metrics and /healthz go on; counting does not
                stop.sleep(self.settings.trigger_interval_seconds)
                continue
            started = time.monotonic()
            self._cycle_started = time.time()
            try:
                covered, took = self.run_cycle()
            except OffsetResetRefused:
                raise
            except Exception as exc:
                self._cycle_started = None
                self._record_cycle(ok=False)
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
            self._record_cycle(ok=True, took=took)
            if covered >= self.settings.max_batch_events:
                continue  # a backlog remains: go on at once
            stop.sleep(self.settings.trigger_interval_seconds - (time.monotonic() - started))
        log.info("stop requested (%s): the cycle in flight has finished and is saved", stop.why)

    def close(self) -> None:
        if self._first_failure is None:
            self.release()
        if self._lookahead is not None:
            self._lookahead.close()
        if self._journal is not None:
            self._journal.close()
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


def _saved_conversations(settings: ServeSettings, state: StateStore) -> SavedConversations | None:
    """The conversations kept between cycles, with --session-judges (None without)."""
    config = settings.session_config()
    if config is None:
        return None
    return SavedConversations(
        state, settings.topic, config, window_size=settings.window_seconds,
        max_open=settings.session_max_open, max_due=settings.max_batch_events,
    )


def _lookahead(settings: ServeSettings) -> Lookahead | None:
    """Calls started ahead of each cycle, where judging waits on an endpoint and the judge
    stage runs in this process (see `pipeline.service.lookahead`)."""
    config = settings.stage_config()
    if not runs_here(settings) or settings.judges.backend == "local":
        return None
    # It samples as ParseEvents does with --sample-rate and --sampling-rules; a budget changes
    # the rates at each cycle, a cascade judges with other judges, and its records are not
    # events with assembled traces: it would start calls the cycle does not take over.
    if (
        settings.budget is not None
        or settings.cascade is not None
        or settings.input_format != "ragpulse"
    ):
        return None
    return Lookahead(settings, shared_panel(config.judges), config.judge_batch_size)


def _governor(settings: ServeSettings, state: StateStore) -> BudgetGovernor | None:
    """The judge budget's governor, going on from the spend and counters saved in `state`."""
    if settings.budget is None:
        return None
    governor = BudgetGovernor(settings.budget)
    saved = state.hour_spend()
    if saved is not None:
        governor.restore(saved.hour, saved.unit, saved.spent, state.counters())
    return governor


def _journal(settings: ServeSettings, state: StateStore) -> AnsweredCalls | None:
    """The journal of answered calls, attached to the process's judge panel, where calls are
    paid for (an LLM backend) and the judge stage runs in this process (the panel is there to
    attach it to); the cascade's panels are its bundles' own, and are not journaled."""
    if (
        settings.judges.backend == "local"
        or not runs_here(settings)
        or settings.cascade is not None
    ):
        return None
    journal = AnsweredCalls(state.path, settings.judges.text_policy())
    shared_panel(settings.stage_config().judges).journal = journal
    return journal


def open_state(settings: ServeSettings) -> tuple[StateStore, bool]:
    """The state store at --state, and whether it was reset: with --state-reset, an unusable
    file (or one written under another partition assignment) is moved aside (to
    FILE.corrupt-<time>) and a fresh one started. Without it, SettingsError says what to do."""
    path = settings.state
    try:
        state = StateStore(path)
        _check_assignment(state, settings)
        return state, False
    except StateError as exc:
        if not settings.state_reset:
            raise SettingsError(str(exc)) from None
        moved = StateStore.move_aside(path)
        log.warning("%s; --state-reset: moved it to %s and starting a fresh state", exc, moved)
    return StateStore(path), True


def _check_assignment(state: StateStore, settings: ServeSettings) -> None:
    """Refuse (StateError, the store closed) a state file holding offsets of partitions this
    instance does not own: it was written with other --instance/--instances, or is another
    instance's, and going on would count those partitions twice or leave them unread."""
    foreign = sorted(p for p in state.offsets(settings.topic) if not settings.owns(p))
    if not foreign:
        return
    state.close()
    raise StateError(
        f"state file {settings.state} holds offsets of partitions "
        f"{','.join(map(str, foreign))} of {settings.topic!r}, which --instance "
        f"{settings.instance} --instances {settings.instances} does not read: it was written "
        "under another assignment or by another instance. Give each instance its own state "
        "file and keep its --instance and --instances; to change --instances, stop every "
        "instance and start each with --state-reset (it goes on from the consumer group's "
        "committed offsets)"
    )


def _earlier(a: float | None, b: float | None) -> float | None:
    """The earlier of two cut-offs of final windows (None: no window is final)."""
    if a is None or b is None:
        return a
    return min(a, b)


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
