"""serve's reviewers' labels: the labels topic read back into the numbers, exactly once.

For whoever changes how labels count. `ragpulse review` publishes one label record per
reviewer, judge and item to the labels topic (pipeline/formats/review.py). Each cycle,
`ReviewLabels.read` reads what came since the offsets saved in the state file, sorts every
record (`sort_labels`, pure) and hands the cycle what to save with its own transaction
(`LabelsRead`): the counter increments of the labels counted, the labels topic's next offsets
and the ids of the labels counted (`pipeline.service.state.LabelsTaken`). A crash before the
commit reads the same records again; after it, goes on past them; and a label whose id is in
the state file already (sent twice, or read again after the topic was recreated) is counted
once, as `duplicate`.

A label counts in `ragpulse_review_labels_total{judge, version, slice, human, rating}`: the
judge's rating and the reviewer's on a yes/no judge, per prompt version and per slice (`random`:
the uniform --review-rate slice, the only one from which error rates are estimated; `targeted`:
the items queued on purpose, kept apart). Every record read is counted once in
`ragpulse_review_labels_read_total{outcome}` (the outcome is `stages.labels.label_outcome`, the
stream's too): `counted`; `duplicate`; `not_binary` (the judge could not grade, or a graded
scale's correct score of a judge whose pass score is unknown: kept, not in a yes/no table; a
correct score of a graded LLM judge is `counted`, mapped to pass or fail by the judge's pass
score, and tabulated per grade in `ragpulse_review_label_grades_total`); and, sent to the
dead-letter topic with the reason, `unknown_judge` (a judge this serve does not run),
`unknown_event` (no review item with the label's event id and judge is on record),
`other_version` (another prompt version than the queued verdict's or, for an imported label,
the running one: a changed prompt starts new counts, and labels of the old one never mix in)
and `malformed` (not a label record).

What was queued is read from the review topic itself, before the labels of each cycle and to
its end (a label waits while the review topic has a backlog): every serve instance's and
stream's items, whoever queued them. The (event id, judge, prompt version) of each queued
verdict is saved in the state file with the review topic's offsets, in the same transaction
as the labels; the newest `state.QUEUED_KEPT` (1,000,000) verdicts are kept, so a label of an
item queued before those is `unknown_event` too. Labels of `ragpulse import-labels` (reason
`imported`: a team's labels of events it chose) are not checked against the queue.

From those counters `figures` makes what /metrics shows: per judge and running prompt version
and slice the confusion table (`pipeline.calibration.Confusion`: kappa, sensitivity,
specificity), and per judge the error rates behind the corrected pass ratio: the
--judge-calibration file as a seed plus the random slice's labels (`calibration.with_labels`),
in `label_figures`, which `ragpulse exporter` calls too for the stream's label counts.

With --instances N every instance reads the labels and review topics into its own state file
(each label exactly once there, as above): the labels are about judges, not partitions, and
every instance's windows need the same error rates for their corrected pass ratio, whichever
instance judged the labelled event. Only instance 0 exports the label counters and the
agreement figures and dead-letters the bad labels (`exports`): Prometheus sums the counters
over instances, so one copy is exported, and a bad label has one dead letter. Every instance
exports the calibration its corrected ratio uses (the same on each: aggregate it with max(),
not sum()). docs/review.md, "With several serve instances".
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from ragpulse.pipeline.calibration import Confusion, JudgeCalibration, by_judge, with_labels
from ragpulse.pipeline.formats.review import (
    MAX_REVIEW_ITEM_BYTES,
    InvalidReviewRecord,
    LabelRecord,
    ReviewItem,
    decode_item,
    decode_label,
)
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import Rejected, SourceRecord
from ragpulse.pipeline.service.cycle_hooks import CycleHooks
from ragpulse.pipeline.service.state import LabelsTaken, StateStore
from ragpulse.pipeline.settings.models import ServeSettings, judge_pass_scores
from ragpulse.pipeline.sinks.kafka import (
    KafkaTopic,
    close_producer,
    dead_letter_record,
    deliver,
    new_producer,
)
from ragpulse.pipeline.sources.kafka import ONE_SHOT, KafkaClients, KafkaRangeSource, log_bounds
from ragpulse.pipeline.stages.labels import NOT_TRACKED, label_counters, label_outcome

log = logging.getLogger(__name__)

__all__ = [
    "LabelFigures", "LabelsRead", "ReviewLabels", "SortedLabels", "label_figures", "sort_labels",
]

REVIEW_LABELS = catalogue.REVIEW_LABELS
LABELS_READ = catalogue.REVIEW_LABELS_READ
# A cycle reads at most this many labels (the rest the next cycle): people label slowly, so
# only a backlog (serve started after days of labels) ever reaches it.
MAX_LABELS_PER_CYCLE = 20_000
# And at most this many review items (the hourly bound keeps them few; a backlog waits).
MAX_REVIEW_ITEMS_PER_CYCLE = 5_000
# A label record is a few hundred bytes (a note is at most 2,000 characters); a larger record is
# no label, and is read as its head only.
MAX_LABEL_BYTES = 64 * 1024
SLICES = ("random", "targeted")
# What the labels add to the counters: exported by instance 0 only.
LABEL_COUNTERS = frozenset({REVIEW_LABELS, LABELS_READ, catalogue.REVIEW_LABEL_GRADES})


@dataclasses.dataclass(frozen=True, slots=True)
class SortedLabels:
    """What a batch of labels-topic records comes to: the counter increments, the labels to
    count (their ids, judges and versions) and the records kept apart with their reason."""

    counts: Counter[counting.CounterKey]
    counted: tuple[tuple[str, str, str], ...]
    rejected: tuple[Rejected, ...]


def sort_labels(
    records: Iterable[SourceRecord],
    versions: Mapping[str, str],
    counted_before: Callable[[Iterable[str]], set[str]],
    queued: Callable[[Iterable[tuple[str, str]]], Mapping[tuple[str, str], str]] | None = None,
    pass_scores: Mapping[str, float] | None = None,
) -> SortedLabels:
    """Sort `records` of the labels topic against the running judges' prompt `versions`
    ({judge: version}); `counted_before` says which label ids the state file holds already,
    `queued` the prompt version of each (event id, judge) queued for review (None: labels are
    not checked against the review queue), `pass_scores` the graded judges' pass scores
    (module docstring: the outcomes)."""
    counts: Counter[counting.CounterKey] = Counter()
    rejected: list[Rejected] = []
    labels: list[tuple[SourceRecord, LabelRecord]] = []
    for record in records:
        try:
            if record.oversize_bytes is not None:
                raise InvalidReviewRecord(
                    f"{record.oversize_bytes} bytes, over the label limit of {MAX_LABEL_BYTES}"
                )
            labels.append((record, decode_label(record.raw)))
        except InvalidReviewRecord as exc:
            counts[counting.key(LABELS_READ, outcome="malformed")] += 1
            rejected.append(Rejected(record, f"not a label record: {exc}"))
    known = counted_before({label.label_id for _, label in labels})
    queued_versions = (
        None if queued is None else queued({(label.event_id, label.judge) for _, label in labels})
    )
    counted: list[tuple[str, str, str]] = []
    for record, label in labels:
        version = (
            NOT_TRACKED if queued_versions is None
            else queued_versions.get((label.event_id, label.judge))
        )
        outcome, why = label_outcome(label, versions, known, version, pass_scores)
        counts[counting.key(LABELS_READ, outcome=outcome)] += 1
        if why is not None:
            rejected.append(Rejected(record, why))
            continue
        if outcome == "duplicate":
            continue
        known.add(label.label_id)  # counted or not_binary: kept, so that a copy is a duplicate
        counted.append((label.label_id, label.judge, label.prompt_version))
        counts.update(label_counters(label, outcome, pass_scores)[1:])  # the outcome is above
    return SortedLabels(counts, tuple(counted), tuple(rejected))


@dataclasses.dataclass(frozen=True, slots=True)
class LabelsRead:
    """A cycle's labels: what to save in its transaction (`taken`, None when the labels topic
    was not read) and the counter increments to add to its counts."""

    taken: LabelsTaken | None = None
    counts: Counter[counting.CounterKey] = dataclasses.field(default_factory=Counter)


@dataclasses.dataclass(frozen=True, slots=True)
class LabelFigures:
    """What /metrics shows of the labels: the confusion table of each (judge, running version,
    slice), and the error rates each judge's pass ratio is corrected with."""

    agreements: Mapping[tuple[str, str, str], Confusion]
    calibrations: Mapping[str, JudgeCalibration]


class ReviewLabels:
    """The labels topic as a part of serve's cycle (module docstring)."""

    def __init__(
        self,
        settings: ServeSettings,
        state: StateStore,
        hooks: CycleHooks | None = None,
        clients: KafkaClients = ONE_SHOT,
    ) -> None:
        """`clients`: the Kafka consumers serve keeps (the topics' bounds are asked each
        cycle)."""
        s = self.settings = settings
        self.state = state
        self._clients = clients
        self.topic = s.labels_topic or f"{s.topic}.labels"
        # Every instance reads and keeps the labels; one exports them (module docstring).
        self.exports = s.instance == 0
        self._hooks = hooks or CycleHooks(None)
        self._source = KafkaRangeSource(
            s.bootstrap, self.topic, s.kafka_security, stall_timeout_s=s.kafka_timeout_seconds,
            max_value_bytes=MAX_LABEL_BYTES,
        )
        # The review topic (any serve's or stream's review queue): what was queued, and so
        # which labels are of a known item.
        self.review_topic = s.review_topic or f"{s.topic}.review"
        self._review_source = KafkaRangeSource(
            s.bootstrap, self.review_topic, s.kafka_security,
            stall_timeout_s=s.kafka_timeout_seconds, max_value_bytes=MAX_REVIEW_ITEM_BYTES,
        )
        self._dead_letters = KafkaTopic(
            s.bootstrap, s.kafka_security, s.dead_letter_topic, s.kafka_timeout_seconds
        )
        self._own_versions = settings.judges.spec().prompt_versions()
        self.versions = running_versions(settings, self._own_versions)
        self.pass_scores = judge_pass_scores(settings.judges)
        self._seeds = by_judge(s.judge_calibrations)
        self._missing_said: set[str] = set()
        self._read_last = 0

    def read(self) -> LabelsRead:
        """The labels that came since the saved offsets (at most MAX_LABELS_PER_CYCLE), sorted
        against the verdicts queued for review (the labels topic's bounds taken first, then the
        review topic read to its end);
        their dead letters are published and acknowledged before this returns (a broker that
        does not acknowledge them fails the cycle: nothing of it is saved)."""
        self._read_last = 0
        # The labels topic's bounds first: a label is published after its item was read from
        # the review topic, so every item labelled within these bounds is on the review topic
        # by the time its bounds are taken, just after.
        ranges = self._plan(self.topic, MAX_LABELS_PER_CYCLE)
        review_ranges = self._plan(self.review_topic, MAX_REVIEW_ITEMS_PER_CYCLE)
        queued = {
            (item.event_id, v.judge): v.prompt_version
            for item in _review_items(self._fetch(self.review_topic, self._review_source,
                                                  review_ranges))
            for v in item.verdicts
        }
        if any(stop < end for _, stop, end in (review_ranges or {}).values()):
            # A label read before the item it labels would be unknown: with the review topic
            # not read to its end, the labels wait for the next cycle.
            ranges = None
        records = self._fetch(self.topic, self._source, ranges)
        if ranges is None and review_ranges is None:
            return LabelsRead()

        def queued_versions(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
            keys = set(keys)
            return {**self.state.queued_versions(keys - queued.keys()),
                    **{k: v for k, v in queued.items() if k in keys}}

        sorted_labels = sort_labels(records, self.versions, self.state.labels_counted,
                                    queued_versions, self.pass_scores)
        if self.exports:
            self._publish_dead_letters(sorted_labels.rejected)
        self._read_last = len(records)
        if records:
            self._hooks.at("labels")
        return LabelsRead(
            LabelsTaken(
                self.topic, {p: stop for p, (_, stop, _) in (ranges or {}).items()},
                sorted_labels.counted, self.review_topic,
                {p: stop for p, (_, stop, _) in (review_ranges or {}).items()},
                tuple((e, j, v) for (e, j), v in queued.items()),
            ),
            sorted_labels.counts,
        )

    def _plan(self, topic: str, most: int) -> dict[int, tuple[int, int, int]] | None:
        """{partition: (start, stop, end)} of at most `most` records of `topic` since the
        saved offsets; None when the topic does not exist."""
        bounds = log_bounds(
            self.settings.bootstrap, topic, timeout_s=self.settings.kafka_timeout_seconds,
            security=self.settings.kafka_security, wait_for_topic=False, clients=self._clients,
        )
        if not bounds.ends:
            if topic not in self._missing_said:
                log.info("topic %s not found: no reviewers' labels or review items read yet",
                         topic)
                self._missing_said.add(topic)
            return None
        self._missing_said.discard(topic)
        saved = self.state.offsets(topic)
        ranges: dict[int, tuple[int, int, int]] = {}
        room = most
        for partition, end in sorted(bounds.ends.items()):
            start = saved.get(partition, 0)
            if not bounds.beginnings[partition] <= start <= end:
                # Retention went past it, or the topic was recreated: from the log start (the
                # labels' ids keep a label read again from counting twice).
                start = bounds.beginnings[partition]
            stop = min(end, start + room)
            room -= stop - start
            ranges[partition] = (start, stop, end)
        return ranges

    @staticmethod
    def _fetch(
        topic: str, source: KafkaRangeSource, ranges: dict[int, tuple[int, int, int]] | None
    ) -> list[SourceRecord]:
        """The records of `ranges` (`_plan`) of `topic`."""
        lost: list[int] = []
        records = list(source.read(
            {p: (start, stop) for p, (start, stop, _) in (ranges or {}).items() if stop > start},
            lost.append,
        ))
        if lost:
            log.error("topic %s: %d records deleted by retention before they were read",
                      topic, sum(lost))
        return records

    def committed(self) -> None:
        """The cycle holding the labels read is saved."""
        if self._read_last:
            log.info("labels topic %s: %d records read and saved", self.topic, self._read_last)
            self._hooks.at("labels_saved")

    def _publish_dead_letters(self, rejected: Sequence[Rejected]) -> None:
        if not rejected:
            return
        for r in rejected:
            log.warning("label at %s offset %d kept apart: %s", r.record.source,
                        r.record.position, r.reason)
        producer = new_producer(self._dead_letters)
        try:
            done = deliver(producer, self._dead_letters.topic,
                           [dead_letter_record(r) for r in rejected],
                           timeout_s=self._dead_letters.timeout_s)
        finally:
            close_producer(producer, self._dead_letters.timeout_s)
        if done.unacknowledged or done.refused:
            why = (done.unacknowledged or done.refused)[0][1]
            raise RuntimeError(
                f"{len(done.unacknowledged) + len(done.refused)} dead letters of labels not "
                f"acknowledged by {self._dead_letters.topic} ({why}); the labels are read again"
            )

    def figures(self, counts: Mapping[counting.CounterKey, float]) -> LabelFigures:
        """The agreement tables (instance 0's only, as its counters) and the corrected-ratio
        calibrations (every instance's) of the saved `counts`."""
        figures = label_figures(
            counts, self.versions, self._seeds, self.settings.judges.backend,
            self.settings.judges.model, seed_versions=self._own_versions,
        )
        return figures if self.exports else dataclasses.replace(figures, agreements={})

    def hidden_counters(self) -> frozenset[str]:
        """The counters this instance keeps in its state but does not export (instance 0
        exports them: module docstring)."""
        return frozenset() if self.exports else LABEL_COUNTERS

    def zero_counters(self) -> list[counting.CounterKey]:
        """The outcomes exported at 0 until they grow (increase() sees the first one)."""
        if not self.exports:
            return []
        return [counting.key(LABELS_READ, outcome=o) for o in catalogue.LABEL_OUTCOMES]


def _review_items(records: Iterable[SourceRecord]) -> Iterator[ReviewItem]:
    """The review items among `records` of the review topic; the others are the review page's
    to keep apart (it shows what it can, REVIEW_TOPIC.dlq), here only logged."""
    for record in records:
        try:
            if record.oversize_bytes is not None:
                raise InvalidReviewRecord(f"{record.oversize_bytes} bytes")
            yield decode_item(record.raw)
        except InvalidReviewRecord as exc:
            log.warning("review topic %s offset %d is not a review item (%s): no label of it "
                        "will count", record.source, record.position, exc)


def label_figures(
    counts: Mapping[counting.CounterKey, float],
    versions: Mapping[str, str],
    seeds: Mapping[str, JudgeCalibration],
    backend: str,
    model: str | None,
    seed_versions: Mapping[str, str] | None = None,
) -> LabelFigures:
    """The agreement tables of the label counters in `counts` for each judge's running prompt
    `versions` ({judge: version}; an earlier version's counts are kept, not shown as the
    judge's), and the calibrations of its corrected pass ratio: the random slice's labels plus
    its --judge-calibration seed (`seeds`, by judge; serve's and the stream's exporter's), a
    seed only where it measured the judge's prompt version (`seed_versions`, {judge:
    version}: `versions` unless given; serve's judge cascade marks its verdicts' versions
    `+local`, its seeds measured the judges' own)."""
    seed_versions = versions if seed_versions is None else seed_versions
    cells: dict[tuple[str, str, str], Counter[str]] = {}
    for (name, labels), value in counts.items():
        if name != REVIEW_LABELS:
            continue
        lab = dict(labels)
        if versions.get(lab["judge"]) != lab["version"]:
            continue
        cell = cells.setdefault((lab["judge"], lab["version"], lab["slice"]), Counter())
        cell[f"{lab['human']}_{lab['rating']}"] += int(value)
    agreements = {key: Confusion(**cell) for key, cell in sorted(cells.items())}
    calibrations: dict[str, JudgeCalibration] = {}
    for judge, version in sorted(versions.items()):
        seed = seeds.get(judge)
        if seed is not None and seed.prompt_version != seed_versions.get(judge):
            seed = None  # another prompt's error rates are not this one's
        merged = with_labels(
            seed, judge, version,
            agreements.get((judge, version, "random"), Confusion()), backend, model,
        )
        if merged is not None:
            calibrations[judge] = merged
    return LabelFigures(agreements, calibrations)


def running_versions(settings: ServeSettings, versions: Mapping[str, str]) -> dict[str, str]:
    """The prompt version each judge's verdicts carry in this serve (as review items and their
    labels name it): the judges' own `versions`, marked `+local` under the judge cascade."""
    if settings.cascade is not None:
        return {judge: f"{v}+local" for judge, v in versions.items()}
    return dict(versions)
