"""Prometheus exposition of ragpulse's counts and window ratings, from one place.

A custom collector yields fresh metric families at each scrape (or each textfile write) from a
`MetricsSnapshot`; nothing else in ragpulse touches prometheus-client. Counts come first:
every ratio is exported next to the sample size it rests on.

The `no` and `error` series of `ragpulse_judge_verdicts_total` carry an OpenMetrics exemplar,
`{request_id="..."}`, naming the latest failing answer of the series (by event time), so that a
dashboard can lead from a drop to an answer `ragpulse explain` shows. Exemplars exist only in
the OpenMetrics format: /metrics sends them when the scraper asks for it (Prometheus does); the
text format, and so `ragpulse run`'s textfile, leaves them out.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry, write_to_textfile
from prometheus_client.core import (
    CounterMetricFamily,
    Exemplar,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from ragpulse.judges.base import RATINGS
from ragpulse.pipeline.calibration import Confusion, JudgeCalibration, corrected_ratio
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.windows import RatingCounts, WindowKey, wilson_interval

# Counters whose label sets are known up front are exported at 0 before the first event,
# so that rates and alerts have a series to work with from the first scrape.
ALWAYS_PRESENT: tuple[counting.CounterKey, ...] = (
    counting.key(catalogue.EVENTS, outcome="accepted"),
    counting.key(catalogue.EVENTS, outcome="invalid"),
    counting.key(catalogue.EVENTS_SAMPLED),
    counting.key(catalogue.LATE_EVENTS),
    counting.key(catalogue.DEAD_LETTERS),
    counting.key(catalogue.LABEL_OVERFLOW, label="app"),
    counting.key(catalogue.LABEL_OVERFLOW, label="model"),
)
# Counters of judged events per (app, model), exported at 0 once the pair has verdicts.
_PER_APP_MODEL = (
    catalogue.EVENTS_JUDGED,
    catalogue.RETRIEVED_CHUNKS,
    catalogue.WITHOUT_CONTEXT,
)
_HISTOGRAM_PARTS = {
    counting.LATENCY_BUCKET, counting.LATENCY_COUNT, counting.LATENCY_SUM_US,
    counting.AGENT_LATENCY_BUCKET, counting.AGENT_LATENCY_COUNT, counting.AGENT_LATENCY_SUM_US,
}
_SUMMARY_PARTS = {counting.SCORE_COUNT, counting.SCORE_SUM_MILLI}




@dataclasses.dataclass(frozen=True)
class MetricsSnapshot:
    """Everything exported at one instant.

    `complete` holds closed windows (their counts are final); `in_progress` holds windows still
    open (serve only). `gauges` holds plain gauges by name (serve: heartbeat, watermark, ...);
    `lag` maps (topic, partition) to consumer lag; `exemplars` maps failing verdict counter
    keys to the answer their exemplar names.
    """

    counts: Mapping[counting.CounterKey, float]
    complete: Mapping[WindowKey, RatingCounts]
    in_progress: Mapping[WindowKey, RatingCounts] = dataclasses.field(default_factory=dict)
    gauges: Mapping[str, float] = dataclasses.field(default_factory=dict)
    lag: Mapping[tuple[str, int], int] = dataclasses.field(default_factory=dict)
    exemplars: Mapping[counting.CounterKey, counting.FailingExample] = dataclasses.field(
        default_factory=dict
    )
    cycles: CycleStats | None = None  # serve only
    # --judge-calibration, by judge: their windows also get the corrected pass ratio.
    calibrations: Mapping[str, JudgeCalibration] = dataclasses.field(default_factory=dict)
    # serve: each judge against the reviewers' labels, by (judge, prompt version, slice).
    agreements: Mapping[tuple[str, str, str], Confusion] = dataclasses.field(
        default_factory=dict
    )


# Upper bounds of the cycle duration histogram, in seconds.
CYCLE_BUCKETS: tuple[float, ...] = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


@dataclasses.dataclass(frozen=True)
class CycleStats:
    """Serve's own cycles in this process (not persisted: they describe this process).

    `durations` counts cycles that read events per CYCLE_BUCKETS bound (non-cumulative; the
    last entry is +Inf).
    """

    ok: int = 0
    failed: int = 0
    durations: tuple[int, ...] = (0,) * (len(CYCLE_BUCKETS) + 1)
    duration_sum: float = 0.0

    def with_cycle(self, ok: bool, read_seconds: float | None = None) -> CycleStats:
        """These stats after one more cycle; `read_seconds` is its time if it read events."""
        durations, total = self.durations, self.duration_sum
        if read_seconds is not None:
            i = next(
                (i for i, b in enumerate(CYCLE_BUCKETS) if read_seconds <= b), len(CYCLE_BUCKETS)
            )
            durations = (*durations[:i], durations[i] + 1, *durations[i + 1 :])
            total += read_seconds
        return CycleStats(self.ok + ok, self.failed + (not ok), durations, total)


def _cycle_families(stats: CycleStats) -> Iterator[Metric]:
    cycles = CounterMetricFamily(
        catalogue.CYCLES, catalogue.COUNTER_HELP[catalogue.CYCLES + "_total"], labels=["outcome"]
    )
    cycles.add_metric(["ok"], stats.ok)
    cycles.add_metric(["failed"], stats.failed)
    yield cycles
    duration = HistogramMetricFamily(
        catalogue.CYCLE_DURATION, catalogue.FAMILY_HELP[catalogue.CYCLE_DURATION]
    )
    cumulative, running = [], 0
    for bound, n in zip([*(repr(float(b)) for b in CYCLE_BUCKETS), "+Inf"], stats.durations,
                        strict=True):
        running += n
        cumulative.append((bound, float(running)))
    duration.add_metric([], cumulative, sum_value=stats.duration_sum)
    yield duration




def latest_by_series(
    windows: Mapping[WindowKey, RatingCounts],
) -> dict[tuple[str, str, str, str], tuple[WindowKey, RatingCounts]]:
    """The latest window of each (judge, app, model) series, by (judge, version, app, model).

    Only the versions judged in that latest window: once a judge's prompt changes, the gauges
    of the old version end (its counters stay), so a gauge never shows a stale prompt's ratio.
    """
    end: dict[tuple[str, str, str], float] = {}
    for key in windows:
        series = (key.judge, key.app, key.model)
        end[series] = max(end.get(series, key.window_end), key.window_end)
    return {
        (key.judge, key.version, key.app, key.model): (key, counts)
        for key, counts in windows.items()
        if key.window_end == end[(key.judge, key.app, key.model)]
    }


def _window_families(
    windows: Mapping[WindowKey, RatingCounts], prefix: str, what: str
) -> Iterator[Metric]:
    labels = ["judge", "version", "app", "model"]
    ratio = GaugeMetricFamily(
        f"{prefix}pass_ratio",
        f"yes / (yes + no) of the {what} window (errors excluded).",
        labels=labels,
    )
    samples = GaugeMetricFamily(
        f"{prefix}window_samples",
        f"Graded verdicts (yes + no) in the {what} window.",
        labels=labels,
    )
    low = GaugeMetricFamily(
        f"{prefix}pass_ratio_ci_low", f"95 % Wilson lower bound, {what} window.", labels=labels
    )
    high = GaugeMetricFamily(
        f"{prefix}pass_ratio_ci_high", f"95 % Wilson upper bound, {what} window.", labels=labels
    )
    mean = GaugeMetricFamily(
        f"{prefix}score_mean",
        f"Mean score of a judge on a graded scale (0-3, 1-5, a composite), {what} window; its "
        f"pass_ratio is the share at or above the pass score.",
        labels=labels,
    )
    for series, (_, counts) in sorted(latest_by_series(windows).items()):
        n = counts.graded
        _add(samples, series, n)
        if n:
            _add(ratio, series, counts.yes / n)
            ci_low, ci_high = wilson_interval(counts.yes, n)
            _add(low, series, ci_low or 0.0)
            _add(high, series, ci_high or 0.0)
        if counts.score_mean is not None:
            _add(mean, series, counts.score_mean)
    yield from (ratio, samples, low, high, mean)


def _add(family: Metric, series: tuple[str, str, str, str], value: float) -> None:
    """One sample of a window gauge; a named guideline's judge ("j/name") adds a `guideline`
    label, which the other series of the family do not have."""
    judge, version, app, model = series
    labels = {**counting.judge_labels(judge), "version": version, "app": app, "model": model}
    family.samples.append(Sample(family.name, labels, value))


def _corrected_families(
    windows: Mapping[WindowKey, RatingCounts],
    calibrations: Mapping[str, JudgeCalibration],
    prefix: str,
    what: str,
) -> Iterator[Metric]:
    """The pass ratio of calibrated judges corrected for their errors (pipeline.calibration),
    next to the ratio itself; no series where the correction is undefined."""
    labels = ["judge", "version", "app", "model"]
    name = f"{prefix}pass_ratio_corrected"
    ratio = GaugeMetricFamily(
        name,
        f"Rogan-Gladen estimate of the true pass ratio of the {what} window: the pass ratio "
        "corrected for the judge's sensitivity and specificity (--judge-calibration).",
        labels=labels,
    )
    low = GaugeMetricFamily(
        f"{name}_ci_low",
        f"95 % lower bound of the corrected pass ratio, {what} window (window and "
        "calibration-set uncertainty).",
        labels=labels,
    )
    high = GaugeMetricFamily(
        f"{name}_ci_high",
        f"95 % upper bound of the corrected pass ratio, {what} window (window and "
        "calibration-set uncertainty).",
        labels=labels,
    )
    for series, (_, counts) in sorted(latest_by_series(windows).items()):
        calibration = calibrations.get(series[0])
        corrected = corrected_ratio(counts.yes, counts.graded, calibration) if calibration else None
        if corrected is not None:
            ratio.add_metric(list(series), corrected.value)
            low.add_metric(list(series), corrected.low)
            high.add_metric(list(series), corrected.high)
    yield from (ratio, low, high)


def _calibration_families(calibrations: Mapping[str, JudgeCalibration]) -> Iterator[Metric]:
    """What each correction rests on: the labelled counts, then the two rates."""
    labelled = GaugeMetricFamily(
        catalogue.CALIBRATION_LABELLED,
        catalogue.FAMILY_HELP[catalogue.CALIBRATION_LABELLED],
        labels=["judge", "label"],
    )
    sensitivity = GaugeMetricFamily(
        catalogue.CALIBRATION_SENSITIVITY,
        catalogue.FAMILY_HELP[catalogue.CALIBRATION_SENSITIVITY],
        labels=["judge"],
    )
    specificity = GaugeMetricFamily(
        catalogue.CALIBRATION_SPECIFICITY,
        catalogue.FAMILY_HELP[catalogue.CALIBRATION_SPECIFICITY],
        labels=["judge"],
    )
    for judge, c in sorted(calibrations.items()):
        labelled.add_metric([judge, "yes"], c.positives)
        labelled.add_metric([judge, "no"], c.negatives)
        sensitivity.add_metric([judge], c.sensitivity)
        specificity.add_metric([judge], c.specificity)
    yield from (labelled, sensitivity, specificity)


def _agreement_families(agreements: Mapping[tuple[str, str, str], Confusion]) -> Iterator[Metric]:
    """Each judge against the reviewers (pipeline.service.labels): kappa, sensitivity and
    specificity where defined, and the labels they rest on."""
    labels = ["judge", "version", "slice"]
    kappa, sensitivity, specificity = (
        GaugeMetricFamily(name, catalogue.FAMILY_HELP[name], labels=labels)
        for name in (catalogue.HUMAN_KAPPA, catalogue.HUMAN_SENSITIVITY,
                     catalogue.HUMAN_SPECIFICITY)
    )
    counts = GaugeMetricFamily(
        catalogue.HUMAN_LABELS, catalogue.FAMILY_HELP[catalogue.HUMAN_LABELS],
        labels=[*labels, "human"],
    )
    for key, c in sorted(agreements.items()):
        for family, value in ((kappa, c.kappa), (sensitivity, c.sensitivity),
                              (specificity, c.specificity)):
            if value is not None:
                family.add_metric(list(key), value)
        counts.add_metric([*key, "yes"], c.yes_yes + c.yes_no)
        counts.add_metric([*key, "no"], c.no_yes + c.no_no)
    yield from (kappa, sensitivity, specificity, counts)


def _zero_series(
    counts: Mapping[counting.CounterKey, float], event_counters: bool = True
) -> set[counting.CounterKey]:
    """Series to export at 0: the fixed ones, and every rating of each judged series (without
    `event_counters`, only the latter).

    Prometheus' increase() cannot see a counter's first sample; a `no` series born during a
    groundedness drop would hide the drop's first verdicts from the alert.
    """
    zeros = set(ALWAYS_PRESENT) if event_counters else set()
    for metric, labels in counts:
        if metric == counting.VERDICTS:
            lab = dict(labels)
            for rating in RATINGS:
                zeros.add(counting.key(metric, **{**lab, "rating": rating}))
            for per_app in _PER_APP_MODEL if event_counters else ():
                zeros.add(counting.key(per_app, app=lab["app"], model=lab["model"]))
        elif metric == catalogue.WEIGHTED_VERDICTS:
            lab = dict(labels)
            for rating in RATINGS:
                zeros.add(counting.key(metric, **{**lab, "rating": rating}))
        elif metric == catalogue.CANARY_VERDICTS:
            judge = dict(labels)["judge"]
            for outcome in catalogue.CANARY_OUTCOMES:
                zeros.add(counting.key(metric, judge=judge, outcome=outcome))
        elif metric == catalogue.REVIEW_LABELS:
            # Every cell of a (judge, version, slice) table: the first overturned verdict is
            # what the agreement alert's increase() must see.
            lab = dict(labels)
            for human in ("yes", "no"):
                for rating in ("yes", "no"):
                    zeros.add(counting.key(metric, **{**lab, "human": human, "rating": rating}))
        elif metric == counting.GROUNDED_BY_CONTEXT:
            lab = dict(labels)
            for context in ("sufficient", "insufficient"):
                for rating in RATINGS:
                    zeros.add(counting.key(metric, **{**lab, "context": context,
                                                      "rating": rating}))
    return {k for k in zeros if k not in counts}


def _counter_families(
    counts: Mapping[counting.CounterKey, float],
    exemplars: Mapping[counting.CounterKey, counting.FailingExample],
    event_counters: bool = True,
) -> Iterator[Metric]:
    by_metric: dict[str, list[tuple[counting.Labels, float]]] = defaultdict(list)
    for k in _zero_series(counts, event_counters):
        by_metric[k[0]].append((k[1], 0.0))
    for (metric, labels), value in counts.items():
        if metric not in _HISTOGRAM_PARTS and metric not in _SUMMARY_PARTS:
            by_metric[metric].append((labels, value))
    for metric, series in sorted(by_metric.items()):
        # Every label any series has: counters saved before a label was added (the judges'
        # `version`) get it empty, which Prometheus reads as the label being absent.
        label_names = sorted({name for labels, _ in series for name, _ in labels})
        family = CounterMetricFamily(
            metric.removesuffix("_total"), catalogue.COUNTER_HELP.get(metric, metric),
            labels=label_names,
        )
        for labels, value in sorted(series):
            example = exemplars.get((metric, labels))
            exemplar = (
                Exemplar({counting.EXEMPLAR_LABEL: example.request_id}, 1.0, example.timestamp)
                if example is not None and value > 0
                else None
            )
            named = dict(labels)
            family.add_metric(
                [named.get(n, "") for n in label_names],
                counting.exported(metric, value),
                exemplar=exemplar,
            )
        yield family


def _latency_family(counts: Mapping[counting.CounterKey, float]) -> Metric:
    family = HistogramMetricFamily(
        catalogue.JUDGE_LATENCY, catalogue.FAMILY_HELP[catalogue.JUDGE_LATENCY], labels=["judge"]
    )
    per_judge: dict[str, dict[str, float]] = defaultdict(dict)
    sums: dict[str, float] = {}
    for (metric, labels), value in counts.items():
        lab = dict(labels)
        if metric == counting.LATENCY_BUCKET:
            # Added up: a judge graded per named guideline has a series per guideline.
            buckets = per_judge[lab["judge"]]
            buckets[lab["le"]] = buckets.get(lab["le"], 0.0) + value
        elif metric == counting.LATENCY_SUM_US:
            sums[lab["judge"]] = sums.get(lab["judge"], 0.0) + value / 1e6
    for judge, buckets in sorted(per_judge.items()):
        cumulative, running = [], 0.0
        for bound in [*(repr(b) for b in counting.LATENCY_BUCKETS), "+Inf"]:
            running += buckets.get(bound, 0.0)
            cumulative.append((bound, running))
        family.add_metric([judge], cumulative, sum_value=sums.get(judge, 0.0))
    return family


def _agent_latency_family(counts: Mapping[counting.CounterKey, float]) -> Metric:
    """`ragpulse_agent_latency_seconds`: the chatbot's own answer time, per app and model."""
    family = HistogramMetricFamily(
        catalogue.AGENT_LATENCY,
        catalogue.FAMILY_HELP[catalogue.AGENT_LATENCY],
        labels=["app", "model"],
    )
    buckets: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    sums: dict[tuple[str, str], float] = {}
    for (metric, labels), value in counts.items():
        lab = dict(labels)
        series = (lab.get("app", ""), lab.get("model", ""))
        if metric == counting.AGENT_LATENCY_BUCKET:
            buckets[series][lab["le"]] = buckets[series].get(lab["le"], 0.0) + value
        elif metric == counting.AGENT_LATENCY_SUM_US:
            sums[series] = sums.get(series, 0.0) + value / 1e6
    for series, per_le in sorted(buckets.items()):
        cumulative, running = [], 0.0
        for bound in [*(repr(b) for b in counting.AGENT_LATENCY_BUCKETS), "+Inf"]:
            running += per_le.get(bound, 0.0)
            cumulative.append((bound, running))
        family.add_metric(list(series), cumulative, sum_value=sums.get(series, 0.0))
    return family


def _score_family(counts: Mapping[counting.CounterKey, float]) -> Metric:
    """`ragpulse_judge_score` _sum and _count: mean = rate(_sum) / rate(_count), re-aggregable."""
    family = SummaryMetricFamily(
        catalogue.SCORE,
        catalogue.FAMILY_HELP[catalogue.SCORE],
        labels=["judge", "version", "app", "model"],
    )
    sums: dict[counting.Labels, float] = {}
    for (metric, labels), value in counts.items():
        if metric == counting.SCORE_SUM_MILLI:
            sums[labels] = value / 1000
    for (metric, labels), value in sorted(counts.items()):
        if metric == counting.SCORE_COUNT:
            lab = dict(labels)
            family.add_metric(
                [lab["judge"], lab["version"], lab["app"], lab["model"]], int(value),
                sums.get(labels, 0.0),
            )
    return family


class RagpulseCollector(Collector):
    """Yields every ragpulse metric from the snapshot `current()` returns at collect time.

    Without `event_counters` (`ragpulse exporter`, which sees verdicts only), the event
    counters that serve exports at 0 before they count anything are left out.
    """

    def __init__(
        self, current: Callable[[], MetricsSnapshot], event_counters: bool = True
    ) -> None:
        self._current = current
        self._event_counters = event_counters

    def collect(self) -> Iterator[Metric]:
        snap = self._current()
        yield from _counter_families(snap.counts, snap.exemplars, self._event_counters)
        yield _latency_family(snap.counts)
        yield _agent_latency_family(snap.counts)
        yield _score_family(snap.counts)
        yield from _window_families(snap.complete, catalogue.WINDOW_PREFIX, "latest complete")
        if snap.in_progress:
            yield from _window_families(
                snap.in_progress, catalogue.IN_PROGRESS_PREFIX, "in-progress"
            )
        if snap.calibrations:
            yield from _calibration_families(snap.calibrations)
            yield from _corrected_families(
                snap.complete, snap.calibrations, catalogue.WINDOW_PREFIX, "latest complete"
            )
            if snap.in_progress:
                yield from _corrected_families(
                    snap.in_progress, snap.calibrations, catalogue.IN_PROGRESS_PREFIX,
                    "in-progress",
                )
        if snap.agreements:
            yield from _agreement_families(snap.agreements)
        for name, value in sorted(snap.gauges.items()):
            gauge = GaugeMetricFamily(name, catalogue.GAUGE_HELP.get(name, name))
            gauge.add_metric([], value)
            yield gauge
        if snap.lag:
            yield _partition_family(catalogue.CONSUMER_LAG, snap.lag)
        if snap.cycles is not None:
            yield from _cycle_families(snap.cycles)


def _partition_family(name: str, values: Mapping[tuple[str, int], float]) -> GaugeMetricFamily:
    """A gauge with one sample per (topic, partition): a consumer lag."""
    family = GaugeMetricFamily(name, catalogue.FAMILY_HELP[name], labels=["topic", "partition"])
    for (topic, partition), value in sorted(values.items()):
        family.add_metric([topic, str(partition)], value)
    return family


def registry_for(
    current: Callable[[], MetricsSnapshot], event_counters: bool = True
) -> CollectorRegistry:
    """A private registry holding only the ragpulse collector (see `RagpulseCollector`)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RagpulseCollector(current, event_counters))
    return registry


def write_textfile(path: Path, snapshot: MetricsSnapshot) -> None:
    """Write `snapshot` in the Prometheus text format (atomically, via prometheus-client)."""
    write_to_textfile(str(path), registry_for(lambda: snapshot))
