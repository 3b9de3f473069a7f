"""`ragpulse exporter`: window panes on the ratings topic become serve's metrics.

The pane table is checked with a private registry (the collector serve uses); then the whole
path runs with real parts: rating rows produced to an Apache Kafka broker, `ragpulse exporter` as a
subprocess, and /usr/bin/prometheus scraping it every second and evaluating the shipped
recording rules and alerts. Later panes of a window must replace its earlier counts, never add
to them.
"""

from __future__ import annotations

import dataclasses
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli import ragpulse_command
from kafka import KafkaProducer
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from processes import free_port, ready_server
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_server import PrometheusServer, prometheus_config, running_prometheus
from serve_process import Scrape

from ragpulse.pipeline.commands.exporter import RatingsExporter
from ragpulse.pipeline.formats import rating_rows
from ragpulse.pipeline.formats.rating_rows import PaneTiming, RatingPane
from ragpulse.pipeline.metrics.collector import registry_for
from ragpulse.pipeline.metrics.labels import LabelLimits
from ragpulse.pipeline.service.panes import PaneTable
from ragpulse.pipeline.settings.models import ExporterSettings
from ragpulse.pipeline.windows import RatingCounts, WindowKey, wilson_interval

REPO = Path(__file__).resolve().parent.parent
RULE_FILES = [
    REPO / "deploy" / "prometheus" / "rules" / "ragpulse.rules.yml",
    REPO / "deploy" / "prometheus" / "rules" / "ragpulse.alerts.yml",
]
T0 = 1_700_000_400.0
SERIES = {"judge": "groundedness", "version": "v1f2", "app": "help-bot", "model": "m1"}


def pane(start: float, timing: PaneTiming, index: int, yes: int, no: int, error: int = 0,
         judge: str = "groundedness", app: str = "help-bot") -> RatingPane:
    key = WindowKey(start, start + 60, judge, app, "m1", SERIES["version"])
    return RatingPane(key, RatingCounts(yes, no, error), timing, index)


def registry(table: PaneTable) -> CollectorRegistry:
    return registry_for(table.snapshot, event_counters=False)


def verdicts(reg: CollectorRegistry, rating: str) -> float | None:
    return reg.get_sample_value("ragpulse_judge_verdicts_total", {**SERIES, "rating": rating})


def test_a_later_pane_of_a_window_replaces_its_counts_and_an_older_or_repeated_one_changes_nothing(
) -> None:
    table = PaneTable(retention_seconds=3600)
    reg = registry(table)
    assert table.apply(pane(T0, "early", 0, yes=3, no=1))
    assert table.apply(pane(T0, "on_time", 1, yes=6, no=2, error=1))
    assert not table.apply(pane(T0, "on_time", 1, yes=6, no=2, error=1))  # read twice
    assert not table.apply(pane(T0, "early", 0, yes=3, no=1))  # read after the later pane

    assert (verdicts(reg, "yes"), verdicts(reg, "no"), verdicts(reg, "error")) == (6, 2, 1)
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", SERIES) == 0.75


def test_counters_add_up_across_windows_and_only_complete_windows_set_the_pass_ratio() -> None:
    table = PaneTable(retention_seconds=3600)
    reg = registry(table)
    table.apply(pane(T0, "on_time", 1, yes=6, no=2))
    table.apply(pane(T0 + 60, "early", 0, yes=1, no=3))

    assert (verdicts(reg, "yes"), verdicts(reg, "no")) == (7, 5)
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", SERIES) == 0.75
    assert reg.get_sample_value("ragpulse_judge_in_progress_pass_ratio", SERIES) == 0.25
    assert reg.get_sample_value(
        "ragpulse_last_complete_window_end_timestamp_seconds"
    ) == T0 + 60
    low, high = wilson_interval(6, 8)
    assert reg.get_sample_value("ragpulse_judge_pass_ratio_ci_low", SERIES) == low
    assert reg.get_sample_value("ragpulse_judge_pass_ratio_ci_high", SERIES) == high


def test_the_exporter_shows_no_event_counters_it_does_not_have() -> None:
    table = PaneTable(retention_seconds=3600)
    table.apply(pane(T0, "early", 0, yes=1, no=0))
    reg = registry(table)
    assert reg.get_sample_value("ragpulse_events_total", {"outcome": "accepted"}) is None
    assert reg.get_sample_value("ragpulse_events_judged_total",
                                {"app": "help-bot", "model": "m1"}) is None
    assert reg.get_sample_value("ragpulse_judge_verdicts_total",
                                {**SERIES, "rating": "no"}) == 0


def test_windows_past_retention_are_folded_into_the_counters_and_take_no_more_panes() -> None:
    table = PaneTable(retention_seconds=120)
    reg = registry(table)
    table.apply(pane(T0, "on_time", 1, yes=2, no=2))
    table.apply(pane(T0 + 300, "on_time", 1, yes=1, no=0))  # T0's window ends 240 s earlier

    assert len(table) == 1
    assert (verdicts(reg, "yes"), verdicts(reg, "no")) == (3, 2)
    assert not table.apply(pane(T0, "late", 2, yes=9, no=9))
    assert (verdicts(reg, "yes"), verdicts(reg, "no")) == (3, 2)
    # The folded window's series keeps its latest complete window for the gauges.
    table.apply(pane(T0 + 300, "on_time", 1, yes=1, no=0, judge="safety"))
    table.apply(pane(T0 + 600, "early", 0, yes=1, no=0, judge="safety"))
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", SERIES) == 1.0


def test_a_pane_dated_in_2099_is_ignored_and_the_real_windows_keep_counting() -> None:
    # Before --max-future-skew in the exporter, the 2099 pane became the newest window for
    # good: every real pane after it was folded on arrival and ignored, the gauges froze.
    year_2099 = 4_070_908_800.0
    table = PaneTable(retention_seconds=3600, max_future_skew_seconds=300)
    reg = registry(table)
    assert not table.apply(pane(year_2099, "on_time", 1, yes=1, no=0), now=T0 + 120)
    assert table.apply(pane(T0, "on_time", 1, yes=6, no=2), now=T0 + 120)
    assert table.apply(pane(T0 + 60, "on_time", 1, yes=3, no=1), now=T0 + 180)
    # Within the skew a window ahead of the clock is taken.
    assert table.apply(pane(T0 + 480, "early", 0, yes=1, no=0), now=T0 + 180)

    assert (verdicts(reg, "yes"), verdicts(reg, "no")) == (10, 3)
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", SERIES) == 0.75
    assert reg.get_sample_value(
        "ragpulse_last_complete_window_end_timestamp_seconds"
    ) == T0 + 120


def test_the_exporter_bounds_app_values_as_serve_does() -> None:
    settings = ExporterSettings(
        bootstrap="127.0.0.1:9092", ratings_topic="r", labels=LabelLimits(max_values=1)
    )
    exporter = RatingsExporter(settings)
    exporter.apply(pane(T0, "on_time", 1, yes=2, no=0, app="help-bot"))
    reg = registry_for(exporter.snapshot, event_counters=False)
    assert verdicts(reg, "yes") == 2
    exporter.apply(pane(T0, "on_time", 1, yes=1, no=1, app="user-4711"))
    exporter.apply(pane(T0, "on_time", 1, yes=0, no=3, app="user-4712"))

    assert verdicts(reg, "yes") == 2  # admitted first, keeps its own series
    other = {**SERIES, "app": "other"}
    assert reg.get_sample_value("ragpulse_judge_verdicts_total", {**other, "rating": "no"}) == 4
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", other) == 0.2
    assert reg.get_sample_value(
        "ragpulse_judge_verdicts_total", {**SERIES, "app": "user-4711", "rating": "no"}
    ) is None


def exporter_reading(*panes: RatingPane, labels: LabelLimits | None = None) -> RatingsExporter:
    """A RatingsExporter that took `panes` as records of the ratings topic (encoded, decoded)."""
    settings = ExporterSettings(
        bootstrap="127.0.0.1:9092", ratings_topic="r", labels=labels or LabelLimits(max_values=100)
    )
    exporter = RatingsExporter(settings)
    for offset, p in enumerate(panes):
        exporter._take(TopicRecord(rating_rows.encode(p)[1], offset))
    return exporter


@dataclasses.dataclass
class TopicRecord:
    """What the exporter reads of a Kafka consumer record."""

    value: bytes
    offset: int
    topic: str = "r"
    partition: int = 0


def test_a_forged_pane_index_is_refused_and_cannot_lock_its_window_against_real_panes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    exporter = exporter_reading(
        pane(T0, "early", 0, yes=1, no=0),
        pane(T0, "early", 2**62, yes=0, no=99),  # would outrank every real pane
        pane(T0, "on_time", 1, yes=5, no=1),
    )
    reg = registry_for(exporter.snapshot, event_counters=False)
    assert (verdicts(reg, "yes"), verdicts(reg, "no")) == (5, 1)
    assert "pane_index 4611686018427387904 is over 1,000,000" in caplog.text
    with pytest.raises(rating_rows.InvalidRatingRow):
        rating_rows.decode(rating_rows.encode(pane(T0, "early", 1_000_001, yes=1, no=0))[1])
    assert rating_rows.decode(
        rating_rows.encode(pane(T0, "early", 1_000_000, yes=1, no=0))[1]
    ).index == 1_000_000


def test_a_900_kb_judge_name_is_refused_and_adds_nothing_to_the_scrape(
    caplog: pytest.LogCaptureFixture,
) -> None:
    huge = "j" * 900_000
    exporter = exporter_reading(
        pane(T0, "on_time", 1, yes=2, no=0), pane(T0, "on_time", 1, yes=1, no=0, judge=huge)
    )
    scrape = generate_latest(registry_for(exporter.snapshot, event_counters=False))
    assert len(scrape) < 20_000 and huge not in scrape.decode()
    assert "judge is 900,000 characters, over the 128-character limit" in caplog.text
    assert huge not in caplog.text  # the reason names the length, not the value


def test_the_exporter_bounds_judge_and_version_values_as_it_bounds_apps() -> None:
    def versioned(judge: str, version: str, no: int) -> RatingPane:
        key = WindowKey(T0, T0 + 60, judge, "help-bot", "m1", version)
        return RatingPane(key, RatingCounts(1, no), "on_time", 1)

    exporter = exporter_reading(versioned("groundedness", "v1f2", 0), labels=LabelLimits(1))
    reg = registry_for(exporter.snapshot, event_counters=False)
    assert verdicts(reg, "yes") == 1  # admitted first: keeps its own series
    for offset, later in enumerate((
        versioned("groundedness", "v9", 1),
        versioned("forged-1", "v1f2", 2),
        versioned("forged-2", "v1f2", 3),
    )):
        exporter._take(TopicRecord(rating_rows.encode(later)[1], offset + 1))
    samples = {
        (s.labels["judge"], s.labels["version"]): s.value
        for family in reg.collect() if family.name == "ragpulse_judge_verdicts"
        for s in family.samples if s.labels["rating"] == "no"
    }
    assert samples == {
        ("groundedness", "v1f2"): 0, ("groundedness", "other"): 1, ("other", "v1f2"): 5
    }


# ----- the whole path: Apache Kafka -> ragpulse exporter -> Prometheus and the shipped rules ---


def produce(broker: ApacheKafkaBroker, topic: str, panes: list[RatingPane]) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=5)
    try:
        for p in panes:
            key, value = rating_rows.encode(p)
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=10)
    finally:
        producer.close()


@contextmanager
def running_exporter(
    broker: ApacheKafkaBroker, topic: str, port: int, log: Path, *extra: str
) -> Iterator[int]:
    """The exporter, /metrics on `port`; yields the port of its health listener, whose
    /healthz says when it is up."""
    health_port = free_port()
    argv = [
        *ragpulse_command(), "exporter",
        "--kafka-bootstrap", broker.bootstrap,
        "--ratings-topic", topic,
        "--metrics-port", str(port),
        "--health-port", str(health_port),
        "--kafka-timeout", "5s",
        *extra,
    ]
    with ready_server("exporter", argv, log, f"http://127.0.0.1:{health_port}/healthz", 60):
        yield health_port


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return Scrape.parse(response.read().decode())


def value(prom: PrometheusServer, expr: str) -> float | None:
    result = prom.query(expr)["result"]
    return float(result[0]["value"][1]) if result else None


def wait_value(prom: PrometheusServer, expr: str, expected: float) -> None:
    def holds() -> bool:
        got = value(prom, expr)
        return got is not None and math.isclose(got, expected, rel_tol=1e-9)

    prom.wait_for(holds, timeout=45)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_panes_on_the_ratings_topic_reach_the_recording_rules_and_later_panes_replace_earlier(
    kafka_broker: ApacheKafkaBroker, tmp_path: Path  # noqa: F811
) -> None:
    topic = "inference-logs.ratings"
    kafka_broker.create_topic(topic, partitions=2)
    port = free_port()
    config = prometheus_config(
        [f"127.0.0.1:{port}"], RULE_FILES, scrape_interval="1s", evaluation_interval="1s"
    )
    labels = 'judge="groundedness", app="help-bot", model="m1"'
    ratio = f"judge_app_model:ragpulse_judge_pass_ratio:ratio_rate5m{{{labels}}}"
    with running_exporter(kafka_broker, topic, port, tmp_path / "exporter.log"), running_prometheus(
        config
    ) as prom:
        # An early pane with one judge error: every rating's series exists, yes and no at 0
        # (so that rate() extrapolates them alike and the rule's ratio is exact).
        produce(kafka_broker, topic, [pane(T0, "early", 0, yes=0, no=0, error=1)])
        wait_value(prom, f'ragpulse_judge_verdicts_total{{{labels}, rating="error"}}', 1)
        assert value(prom, f'ragpulse_judge_verdicts_total{{{labels}, rating="yes"}}') == 0
        assert value(prom, f"ragpulse_judge_in_progress_window_samples{{{labels}}}") == 0
        assert value(prom, f"ragpulse_judge_pass_ratio{{{labels}}}") is None

        # The on-time pane replaces it: 3 yes, 1 no and the error in all.
        produce(kafka_broker, topic, [pane(T0, "on_time", 1, yes=3, no=1, error=1)])
        wait_value(prom, f"ragpulse_judge_pass_ratio{{{labels}}}", 3 / 4)
        wait_value(prom, ratio, 3 / 4)

        # A late pane: 3 yes and 4 no in all. Added to the earlier panes instead, the counters
        # would read 6 yes, 5 no and 3 errors, and the rule 6 / 11.
        produce(kafka_broker, topic, [pane(T0, "late", 2, yes=3, no=4, error=1)])
        wait_value(prom, ratio, 3 / 7)
        for rating, n in (("yes", 3), ("no", 4), ("error", 1)):
            assert value(prom, f'ragpulse_judge_verdicts_total{{{labels}, rating="{rating}"}}') == n
        assert value(prom, f"ragpulse_judge_pass_ratio{{{labels}}}") == 3 / 7
        # The shipped rules and alerts all evaluate against the exporter's series.
        groups = prom.api("rules")["data"]["groups"]
        failing = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
                   if r["health"] == "err"]
        assert groups and failing == []
        before = scrape(port).by_labels("ragpulse_judge_verdicts_total")

    # A restarted exporter reads the topic again and exports the same counts, not twice them.
    with running_exporter(kafka_broker, topic, port, tmp_path / "exporter-again.log"):
        deadline = time.monotonic() + 30
        while scrape(port).by_labels("ragpulse_judge_verdicts_total") != before:
            assert time.monotonic() < deadline, scrape(port).by_labels(
                "ragpulse_judge_verdicts_total"
            )
            time.sleep(0.2)


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_the_exporter_turns_unhealthy_while_the_broker_is_away_and_keeps_its_values(
    kafka_broker: ApacheKafkaBroker, tmp_path: Path  # noqa: F811
) -> None:
    topic = "logs.ratings"
    kafka_broker.create_topic(topic)
    port = free_port()
    with running_exporter(kafka_broker, topic, port, tmp_path / "exporter.log",
                          "--unhealthy-after", "3s", "--kafka-timeout", "1s") as health_port:
        produce(kafka_broker, topic, [pane(T0, "on_time", 1, yes=2, no=1)])
        deadline = time.monotonic() + 30
        while scrape(port).value("ragpulse_judge_verdicts_total", **SERIES, rating="yes") != 2:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert healthz(health_port) == healthz(port) == 200
        kafka_broker.stop()
        deadline = time.monotonic() + 30
        while healthz(health_port) != 503:
            assert time.monotonic() < deadline, "still healthy with the broker away"
            time.sleep(0.5)
        assert healthz(port) == 503  # the metrics port's /healthz says the same
        # What it read stays exported while it waits for the broker.
        assert scrape(port).value("ragpulse_judge_verdicts_total", **SERIES, rating="yes") == 2
