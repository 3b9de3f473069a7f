"""`ragpulse exporter`: serve the window ratings of `ragpulse stream` as /metrics.

The stream's workers publish each window pane to the ratings topic (`pipeline.graphs.unbounded` says
why a topic rather than the Pushgateway). This command reads the topic from its beginning on
every partition, keeps the latest pane of each window (`pipeline.service.panes.PaneTable`), and
serves them at /metrics with serve's collector: the metric names and labels are serve's, so
the shipped recording rules, alerts and dashboards work unchanged. Run one exporter per ratings
topic (it holds no state of its own: a restarted exporter reads the topic again and exports the
same values); Prometheus scrapes it under the job name the rules select (`ragpulse`).

With --judge-calibration FILE, as serve: the judge's pass ratio is corrected with the file's
error rates plus the reviewers' labels the stream counted (`service.labels.label_figures`,
serve's), for the judge's windows of the prompt version the file measured.

/healthz (on --health-port, and on the metrics port too) answers 503 once the broker has not
answered for --unhealthy-after.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from kafka import KafkaConsumer, TopicPartition
from prometheus_client import make_wsgi_app

from ragpulse.pipeline.calibration import by_judge
from ragpulse.pipeline.formats import label_counts, rating_rows
from ragpulse.pipeline.kafka_security import check_access, connect
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for
from ragpulse.pipeline.metrics.http import (
    WebConfig,
    exporter_app,
    load_web_config,
    start_health_server,
    start_metrics_server,
)
from ragpulse.pipeline.metrics.labels import (
    EXPORTER_BOUNDED_LABELS,
    LabelBudget,
)
from ragpulse.pipeline.service.labels import label_figures
from ragpulse.pipeline.service.panes import PaneTable
from ragpulse.pipeline.settings.models import ExporterSettings
from ragpulse.pipeline.windows import WindowKey

log = logging.getLogger(__name__)

HEARTBEAT = catalogue.HEARTBEAT
_RETRY_S = 2.0


class RatingsExporter:
    """Reads the ratings topic into a `PaneTable` in a thread; gives /metrics its snapshot."""

    def __init__(self, settings: ExporterSettings) -> None:
        self._settings = settings
        self._table = PaneTable(settings.retention_seconds, settings.max_future_skew_seconds)
        # The reviewers' label counters so far (formats/label_counts.py): the largest value
        # read of each, since each row holds the whole count and counts only grow.
        self._label_counts: dict[counting.CounterKey, int] = {}
        self._budget = LabelBudget(settings.labels, EXPORTER_BOUNDED_LABELS)
        # Counter keys exported so far: a label value admitted once keeps its own series.
        self._admitted: frozenset[counting.CounterKey] = frozenset()
        self._lock = threading.Lock()
        self._last_answer: float | None = None  # when the broker last answered, Unix time
        self._started = time.time()
        # --judge-calibration: each judge's seed, applied to its windows of the version it
        # measured (the stream's judges and versions are known here from its panes only).
        self._seeds = by_judge(settings.judge_calibrations)
        self._unused_said: set[tuple[str, str]] = set()

    def _say_unused_seeds(self, versions: Mapping[str, str]) -> None:
        """Warn once per judge and version that a seed measured another prompt version than
        the one the stream's newest windows carry (serve refuses it at start; the exporter
        learns the versions from the panes, so it says so when it sees one)."""
        for judge, seed in self._seeds.items():
            version = versions.get(judge)
            if version is None or version == seed.prompt_version:
                continue
            if (judge, version) not in self._unused_said:
                self._unused_said.add((judge, version))
                log.warning(
                    "%s measured %s with prompt version %s; the stream's windows carry %s: "
                    "its pass ratio is corrected with the reviewers' labels alone (run "
                    "`ragpulse calibrate` again with this prompt)",
                    seed.source, judge, seed.prompt_version, version,
                )

    def snapshot(self) -> MetricsSnapshot:
        """What /metrics shows now, with judge, version, app and model values bounded as serve
        bounds app and model (`pipeline.metrics.labels`)."""
        with self._lock:
            gauges = {HEARTBEAT: self._last_answer} if self._last_answer is not None else {}
            snap = self._table.snapshot(gauges)
            complete, counts = self._budget.bound(snap.complete, snap.counts, self._admitted)
            self._admitted = frozenset(counts)
            in_progress, _ = self._budget.bound(snap.in_progress, {}, self._admitted)
            labelled = dict(self._label_counts)
        if labelled:
            # Every outcome at 0 until it grows, as serve exports them (increase() would not
            # see a series' first sample).
            for outcome in catalogue.LABEL_OUTCOMES:
                labelled.setdefault(counting.key(catalogue.REVIEW_LABELS_READ, outcome=outcome), 0)
        versions = judged_versions(labelled, {**in_progress, **complete})
        self._say_unused_seeds(versions)
        figures = label_figures(labelled, versions, self._seeds, "", None)
        return dataclasses.replace(
            snap, counts={**counts, **labelled}, complete=complete, in_progress=in_progress,
            agreements=figures.agreements, calibrations=figures.calibrations,
        )

    def healthy(self) -> tuple[bool, str]:
        since = self._last_answer if self._last_answer is not None else self._started
        silent = time.time() - since
        if silent > self._settings.unhealthy_after_seconds:
            return False, f"the broker has not answered for {silent:.0f}s"
        return True, "ok"

    def run(self, stop: threading.Event) -> None:
        """Read until `stop` is set; broker trouble is logged and retried, never fatal."""
        consumer: KafkaConsumer | None = None
        while not stop.is_set():
            try:
                if consumer is None:
                    consumer = self._consumer()
                self._read_once(consumer)
            except Exception as exc:
                log.warning("reading %s: %s; retrying", self._settings.ratings_topic, exc)
                if consumer is not None:
                    consumer.close(autocommit=False)
                    consumer = None
                stop.wait(_RETRY_S)
        if consumer is not None:
            consumer.close(autocommit=False)

    def _consumer(self) -> KafkaConsumer:
        s = self._settings
        timeout_ms = int(s.kafka_timeout_seconds * 1000)
        return connect(
            KafkaConsumer,
            s.bootstrap,
            s.kafka_security,
            enable_auto_commit=False,
            request_timeout_ms=timeout_ms + 1000,
            bootstrap_timeout_ms=timeout_ms,
        )

    def _read_once(self, consumer: KafkaConsumer) -> None:
        topic = self._settings.ratings_topic
        timeout_ms = int(self._settings.kafka_timeout_seconds * 1000)
        found = consumer.partitions_for_topic(topic)
        if not found:
            raise LookupError(f"topic {topic!r} not found (yet)")
        wanted = {TopicPartition(topic, p) for p in found}
        assigned = consumer.assignment()
        if wanted != assigned:
            # Partitions added to the topic are read from their beginning; the others go on.
            kept = {tp: consumer.position(tp) for tp in assigned & wanted}
            consumer.assign(sorted(wanted))
            for tp in wanted:
                if tp in kept:
                    consumer.seek(tp, kept[tp])
                else:
                    consumer.seek_to_beginning(tp)
            log.info("reading %s, partitions %s", topic, sorted(found))
        for records in consumer.poll(timeout_ms=1000).values():
            for record in records:
                self._take(record)
        # A request that needs the broker: poll() answers empty whether or not it is there.
        consumer.end_offsets(sorted(wanted), timeout_ms=timeout_ms)
        self._last_answer = time.time()

    def _take(self, record: Any) -> None:
        if label_counts.is_label_count(record.value or b""):
            self._take_label_count(record)
            return
        try:
            pane = rating_rows.decode(record.value or b"")
        except rating_rows.InvalidRatingRow as exc:
            log.warning(
                "skipped the record at %s/%d offset %d: %s",
                record.topic, record.partition, record.offset, exc,
            )
            return
        self.apply(pane)

    def _take_label_count(self, record: Any) -> None:
        try:
            key, value = label_counts.decode(record.value)
        except label_counts.InvalidLabelCount as exc:
            log.warning(
                "skipped the record at %s/%d offset %d: %s",
                record.topic, record.partition, record.offset, exc,
            )
            return
        self.apply_label_count(key, value)

    def apply_label_count(self, key: counting.CounterKey, value: int) -> None:
        """Take one label counter's value so far (formats/label_counts.py): counts only grow,
        so the largest value read is the counter's."""
        with self._lock:
            self._label_counts[key] = max(value, self._label_counts.get(key, 0))

    def apply(self, pane: rating_rows.RatingPane) -> None:
        """Take one pane read from the ratings topic (see `PaneTable.apply`)."""
        with self._lock:
            self._table.apply(pane)


def judged_versions(
    counts: Mapping[counting.CounterKey, float], windows: Iterable[WindowKey]
) -> dict[str, str]:
    """The prompt version each judge's labels are shown for: the version of its newest window
    (the one its corrected pass ratio applies to), else the last of its labels' versions."""
    versions: dict[str, str] = {}
    for (name, labels), _ in sorted(counts.items()):
        if name == catalogue.REVIEW_LABELS:
            lab = dict(labels)
            versions[lab["judge"]] = max(lab["version"], versions.get(lab["judge"], ""))
    newest: dict[str, float] = {}
    for key in windows:
        if key.window_start >= newest.get(key.judge, float("-inf")):
            newest[key.judge] = key.window_start
            versions[key.judge] = key.version
    return versions


def main(settings: ExporterSettings) -> int:
    web = load_web_config(settings.web_config_file) if settings.web_config_file else WebConfig()
    check_access(
        settings.bootstrap, settings.kafka_security, timeout_s=settings.kafka_timeout_seconds
    )
    exporter = RatingsExporter(settings)
    app = exporter_app(
        make_wsgi_app(registry_for(exporter.snapshot, event_counters=False)),
        exporter.healthy,
        web.users,
    )
    health = start_health_server(exporter.healthy, settings.metrics_host, settings.health_port)
    try:
        server = start_metrics_server(
            app, settings.metrics_host, settings.metrics_port, web.tls
        )
    except BaseException:
        health.shutdown()
        raise
    log.info(
        "serving %s, /healthz alone on port %d; reading %s on %s (%s)",
        web.describe(settings.metrics_host, server.server_port),
        health.server_port,
        settings.ratings_topic,
        settings.bootstrap,
        settings.kafka_security.describe(),
    )
    stop = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        exporter.run(stop)
    finally:
        server.shutdown()
        health.shutdown()
    log.info("stopped")
    return 0
