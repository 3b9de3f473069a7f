"""What one serve cycle hands the Beam graph, and what it takes back from it.

For whoever changes what a cycle reads or publishes. `CycleGraph` owns, across cycles, the
graph's source (`pipeline.sources.kafka.KafkaRangeSource`: the graph reads the cycle's offset
ranges, or serve's process reads them first where the input format or the conversations need the
records before the graph), what its sinks are (the dead-letter, verdicts and evaluation
outputs), the canaries, the label budget (app and model labels bounded, the choice surviving
restarts through the saved counters) and how long output delivery has failed (--undeliverable-
after).

A cycle asks it to `read` (records read here, or None), for its stage `config` (its clock,
cut-off and the sampling plan its cost controls set), and to `judge`: run the graph and give
back its result with labels bounded and undeliverable outputs decided on.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import apache_beam as beam

from ragpulse.judges.sessions import Session
from ragpulse.pipeline.canaries import CanaryFeed
from ragpulse.pipeline.costs.budget import TOKENS
from ragpulse.pipeline.costs.controls import CostControl
from ragpulse.pipeline.graphs.bounded import (
    GraphResult,
    Sinks,
    StageConfig,
    pipeline_options,
    run_graph,
)
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.labels import LabelBudget
from ragpulse.pipeline.settings.models import ServeSettings
from ragpulse.pipeline.sinks.kafka import (
    UNDELIVERABLE,
    KafkaTopic,
    PublishDeadLetters,
    PublishVerdicts,
)
from ragpulse.pipeline.sinks.otlp_evaluations import ExportEvaluations
from ragpulse.pipeline.sources.inputs import EventInput, InputBatch, SpanStore, TraceInput
from ragpulse.pipeline.sources.kafka import RECORDS_LOST, KafkaRangeSource, ReadKafkaRanges
from ragpulse.pipeline.stages.sessions import session_record

log = logging.getLogger(__name__)

# A delivery failure that may clear up is given up on only after --undeliverable-after AND this
# many failed attempts, so that a broker just back from an outage gets a few tries.
MIN_DELIVERY_ATTEMPTS = 3
Ranges = Mapping[int, tuple[int, int]]


class PublishError(RuntimeError):
    """Output records were not acknowledged and --undeliverable-after has not passed yet."""


class CycleGraph:
    """The graph's source, sinks, canaries and label budget across cycles (module docstring)."""

    def __init__(
        self,
        settings: ServeSettings,
        inputs: EventInput | TraceInput,
        *,
        canaries: CanaryFeed | None,
        saved_counts: Callable[[], Mapping[counting.CounterKey, float]],
        controls: Sequence[CostControl] = (),
    ) -> None:
        """`inputs`: the --input-format; `saved_counts`: the counters saved so far (the label
        budget's admitted values); `controls`: the cost controls, which set the sampling plan
        and may count the tokens of paid calls themselves."""
        s = self.settings = settings
        self.inputs = inputs
        self.source = KafkaRangeSource(
            s.bootstrap,
            s.topic,
            s.kafka_security,
            stall_timeout_s=s.kafka_timeout_seconds,
            max_value_bytes=s.max_event_bytes,
        )
        self._canaries = canaries
        self.labels = LabelBudget(s.labels)
        self._saved_counts = saved_counts
        self._controls = controls
        self._drop_tokens = any(c.counts_tokens for c in controls)
        self._delivery_failing_since: float | None = None
        self._delivery_failures = 0

    def read(
        self, ranges: Ranges, now: float, store: SpanStore, *, records_needed: bool
    ) -> tuple[InputBatch | None, counting.Counts]:
        """The records of `ranges` read in this process, where the cycle needs them before its
        graph (the input format reads here, or `records_needed`: the conversations save their
        turns with the cycle), collected by the input format; None elsewhere: the graph reads
        them. Records the broker's retention deleted first are counted as lost, as the graph's
        reader counts them."""
        counts: counting.Counts = Counter()
        if not (self.inputs.reads_here or records_needed):
            return None, counts
        s = self.settings
        lost = counting.key(RECORDS_LOST, topic=s.topic, reason="retention")
        read = self.source.read(ranges, lambda n: counts.update({lost: n}))
        return self.inputs.collect(read, now=now, store=store, topic=s.topic), counts

    def config(
        self, ranges: Ranges, batch: InputBatch | None, cutoff: float | None, now: float
    ) -> StageConfig:
        """The cycle's stage configuration: its cut-off of final windows, its clock, and the
        sampling plan its cost controls set for its number of records."""
        config = self.settings.stage_config(closed_before=cutoff)
        records = (
            len(batch.records)
            if batch is not None
            else sum(stop - start for start, stop in ranges.values())
        )
        plan = config.admission.sampling
        for control in self._controls:
            plan = control.sampling(plan, config.admission.sample_rate, records)
        return config.admitting(now=now, sampling=plan)

    def judge(
        self,
        ranges: Ranges,
        batch: InputBatch | None,
        config: StageConfig,
        sessions_due: Sequence[Session],
    ) -> tuple[GraphResult, counting.Counts]:
        """Run the graph over `ranges` (or the records of `batch`, read already), with the
        sessions due, and make its result one to save: without the tokens a cost control
        counts itself, undeliverable outputs decided on, labels bounded. Returns that result
        and the counter increments it adds (undeliverable records, the bounded counts)."""
        source = (
            beam.Create(batch.records)
            if batch is not None
            else ReadKafkaRanges(self.source, ranges)
        )
        s = self.settings
        # The sinks and options are built for each graph, as its steps are.
        result = run_graph(
            source,
            config,
            _sinks(s),
            canaries=self._canaries.take(time.time()) if self._canaries else (),
            options=pipeline_options(s.beam_args, s.runner),
            sessions_due=(
                [session_record(x) for x in sessions_due] if config.sessions is not None else None
            ),
        )
        if self._drop_tokens:
            result = dataclasses.replace(
                result, counts=Counter({k: n for k, n in result.counts.items() if k[0] != TOKENS})
            )
        counts = self._undeliverable(result)
        windows, bounded = self.labels.bound(result.windows, result.counts, self._saved_counts())
        # Exemplars are kept only for series the bounded counts hold: a pointer for a value
        # counted as `other` would be kept, and loaded at every scrape, for a series that is
        # never exported (30,000 such apps grew serve by 36 MiB).
        exemplars = {k: v for k, v in result.exemplars.items() if k in bounded}
        result = dataclasses.replace(result, windows=windows, counts=bounded, exemplars=exemplars)
        counts.update(bounded)
        return result, counts

    def delivered(self) -> None:
        """A cycle was saved: output delivery is no longer failing."""
        self._delivery_failing_since, self._delivery_failures = None, 0

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


def _sinks(s: ServeSettings) -> Sinks:
    """serve's outputs: Kafka in, the dead-letter and verdicts topics (and OTLP evaluation
    events) out."""

    def topic(name: str) -> KafkaTopic:
        return KafkaTopic(s.bootstrap, s.kafka_security, name, s.kafka_timeout_seconds)

    verdicts = s.publish_verdicts != "none"
    return Sinks(
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
