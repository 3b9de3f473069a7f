"""From the page to the cause, with a real `ragpulse serve` on a real Apache Kafka broker:
exemplars on /metrics and in a real Prometheus, `ragpulse explain` on the verdicts topic, and
golden-set canaries kept out of every production count.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cli import one_line_error, ragpulse
from kafka import KafkaConsumer, TopicPartition
from kafka_broker import ApacheKafkaBroker, for_module
from prometheus_server import prometheus_config, running_prometheus
from serve_process import T0, TopicFactory, caught_up

from ragpulse.judges import DEFAULT_JUDGES, JUDGE_NAMES
from ragpulse.pipeline.canaries import load_golden_set, outcome
from ragpulse.pipeline.commands.simulate import Incidents, simulate
from ragpulse.pipeline.settings.models import JudgeSettings

# Each test waits for serve to judge all events, and some for Prometheus too.
pytestmark = pytest.mark.timeout(180)

ROOT = Path(__file__).resolve().parents[1]
CANARIES = ROOT / "deploy" / "samples" / "canaries.jsonl"
DROP = Incidents(groundedness_drop_at=0.0, drop_to=0.5)


@pytest.fixture(scope="module")
def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    yield from for_module(apache_kafka)


def topic_rows(bootstrap: str, topic: str, timeout: float = 20.0) -> list[dict[str, Any]]:
    """Every verdict row of `topic`, all partitions (serve's producer creates the topic, with
    the broker's default partition count), up to the end offsets listed after the cycle."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        deadline = time.monotonic() + timeout
        while not consumer.partitions_for_topic(topic):
            assert time.monotonic() < deadline, f"topic {topic} never appeared"
            time.sleep(0.1)
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        ends = consumer.end_offsets(tps)
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        rows: list[dict[str, Any]] = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for batch in consumer.poll(timeout_ms=200).values():
                rows.extend(json.loads(r.value) for r in batch)
            assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout}s"
        return rows
    finally:
        consumer.close(autocommit=False)


def failing(rows: list[dict[str, Any]]) -> Iterator[tuple[tuple[str, str, str, str], dict]]:
    """((judge, rating, app, model), row) for every no/error verdict of the rows."""
    for row in rows:
        for field, rating in row.items():
            if field.endswith("/rating") and rating != "yes":
                judge = field.split("/")[2]
                yield (judge, rating, row["app"], row["model"]), row


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


# --- 1. exemplars --------------------------------------------------------------------------------


def test_failing_verdict_counters_carry_the_latest_failing_request_id_kept_across_restarts(
    served_topic: TopicFactory,
) -> None:
    # Recent event times, so that Prometheus' exemplar query over the last minutes covers them.
    start = math.floor(time.time()) - 150
    topic = served_topic("exemplars", records=simulate(11, 140, start, rate=1, incidents=DROP))
    serve = topic.serve()
    serve.wait_for(caught_up(140), 60, "all events judged")

    rows = topic_rows(topic.broker.bootstrap, f"{topic.name}.verdicts")
    latest: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for series, row in failing(rows):
        if series not in latest or (epoch(row["event_time"]), row["request_id"]) > (
            epoch(latest[series]["event_time"]), latest[series]["request_id"]
        ):
            latest[series] = row
    assert len(latest) >= 4  # groundedness `no` for each (app, model) at least
    exemplars = serve.exemplars()
    found = {
        (lab["judge"], lab["rating"], lab["app"], lab["model"]): ex
        for (name, labels), ex in exemplars.items()
        for lab in [dict(labels)]
        if name == "ragpulse_judge_verdicts_total"
    }
    assert set(found) == set(latest)  # every failing series, and no passing one
    for series, row in latest.items():
        assert found[series].labels == {"request_id": row["request_id"]}
        assert found[series].value == 1
        stamp = found[series].timestamp
        assert stamp is not None and float(stamp) == epoch(row["event_time"])
    # The plain text format (what `metrics()` asks for) has no exemplars.
    assert serve.metrics().total("ragpulse_judge_verdicts_total") > 0

    # Prometheus with exemplar storage keeps them, and its query API returns them.
    with running_prometheus(
        prometheus_config([f"127.0.0.1:{serve.port}"], scrape_interval="1s"),
        extra_args=["--enable-feature=exemplar-storage"],
    ) as prom:
        query = 'ragpulse_judge_verdicts_total{judge="groundedness", rating="no"}'

        def stored() -> list[dict[str, Any]]:
            body = prom.api(
                "query_exemplars",
                {"query": query, "start": str(start - 60), "end": str(time.time() + 60)},
            )
            assert body["status"] == "success", body
            return list(body["data"])

        series_list = prom.wait_for(stored, timeout=30)
    for series in series_list:
        lab = series["seriesLabels"]
        row = latest[("groundedness", "no", lab["app"], lab["model"])]
        assert [e["labels"] for e in series["exemplars"]] == [{"request_id": row["request_id"]}]
    assert len(series_list) == sum(1 for k in latest if k[:2] == ("groundedness", "no"))

    # A restart serves the same exemplars before any new failing answer comes in.
    assert serve.terminate() == 0
    restarted = topic.serve()
    assert restarted.exemplars() == exemplars


# --- 2. ragpulse explain on the verdicts topic --------------------------------------------------


def test_explain_lists_each_windows_failing_answers_from_the_topic_serve_published(
    served_topic: TopicFactory,
) -> None:
    events = simulate(12, 150, T0, rate=5, incidents=DROP)  # 30 s: three 10 s windows
    topic = served_topic("explained", records=events)
    serve = topic.serve()
    serve.wait_for(caught_up(150), 60, "all events judged")
    windows = serve.windows()

    source = ["--kafka-bootstrap", topic.broker.bootstrap, "--topic", topic.name]
    everything = ragpulse("explain", *source, "--json", "--limit", "0")
    assert everything.returncode == 0, everything.stderr
    shown = [json.loads(line) for line in everything.stdout.splitlines()]
    expected: Counter[tuple[str, str, str]] = Counter()
    for w in windows:  # one row per (window, judge, app, model)
        for rating in ("no", "error"):
            expected[(w["window_start"], w["judge"], rating)] += w[rating]
    per_window = Counter(
        (time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(_window(r["event_time"]))),
         r["judge"], r["rating"])
        for r in shown
    )
    assert +per_window == +expected
    assert all(r["rationale"] for r in shown if r["rating"] == "no")

    # One window, one judge, as the dashboard link asks for it; the table shows the same ids.
    window = ragpulse(
        "explain", *source, "--window-start", "2025-11-20T10:00:10Z", "--window", "10s",
        "--judge", "groundedness", "--limit", "0",
    )
    assert window.returncode == 0, window.stderr
    ids = {
        r["request_id"] for r in shown
        if r["judge"] == "groundedness" and _window(r["event_time"]) == T0 + 10
    }
    table_ids = {line.split()[1] for line in window.stdout.splitlines()[1:-1]}
    assert table_ids == ids and ids
    n_no = sum(w["no"] + w["error"] for w in windows
               if w["window_start"] == "2025-11-20T10:00:10Z" and w["judge"] == "groundedness")
    assert window.stdout.splitlines()[-1].startswith(f"{n_no} failing verdicts")


def _window(iso: str, size: float = 10.0) -> float:
    return epoch(iso) - epoch(iso) % size


@pytest.mark.slow
def test_explain_names_a_missing_topic_and_an_unreachable_broker(broker: ApacheKafkaBroker) -> None:
    missing = ragpulse(
        "explain", "--kafka-bootstrap", broker.bootstrap, "--topic", "nothing-here",
        "--kafka-timeout", "2s",
    )
    assert missing.returncode == 1
    assert missing.stderr.startswith("ragpulse explain: topic 'nothing-here.verdicts' not found")
    down = ragpulse(
        "explain", "--kafka-bootstrap", "127.0.0.1:1", "--verdicts-topic", "v",
        "--kafka-timeout", "2s",
    )
    line = one_line_error(down.returncode, down.stderr, exit_code=1)
    assert line.startswith("ragpulse explain: cannot reach Kafka at 127.0.0.1:1")


# --- 3. canaries in serve ------------------------------------------------------------------------


def test_serve_judges_canaries_without_counting_them_as_traffic(
    served_topic: TopicFactory,
) -> None:
    topic = served_topic("canaried", records=simulate(13, 100, T0, rate=5, incidents=DROP))
    serve = topic.serve("--canary-file", str(CANARIES), "--canary-rate", "60")
    m = serve.wait_for(
        lambda s: caught_up(100)(s) and s.total("ragpulse_canary_verdicts_total") > 0,
        60, "events and canaries judged",
    )
    assert m.value("ragpulse_events_total", outcome="accepted") == 100
    assert m.total("ragpulse_events_judged_total") == 100
    for judge in DEFAULT_JUDGES:
        assert m.total("ragpulse_judge_verdicts_total", judge=judge) == 100
        assert m.total("ragpulse_judge_calls_total", judge=judge) == 100
    assert "canary" not in {lab["app"] for lab, _ in m.select("ragpulse_judge_verdicts_total")}
    rows = serve.windows()
    assert "canary" not in {r["app"] for r in rows}
    for judge in DEFAULT_JUDGES:
        assert sum(r["yes"] + r["no"] + r["error"] for r in rows if r["judge"] == judge) == 100
    published = topic_rows(topic.broker.bootstrap, f"{topic.name}.verdicts")
    assert published and not [r for r in published if r["request_id"].startswith("canary-")]

    # What the counter holds is what the local judges say about the golden events.
    golden = load_golden_set(CANARIES, JUDGE_NAMES)
    panel = JudgeSettings(backend="local").spec().build()
    possible = {
        (v.judge, outcome(v, dict(c.labels)[v.judge]))
        for c, verdicts in zip(golden, panel.judge_batch([c.record.judge_input for c in golden]),
                               strict=True)
        for v in verdicts
        if v.judge in dict(c.labels)
    }
    panel.close()
    counted = {
        (lab["judge"], lab["outcome"]): v for lab, v in m.select("ragpulse_canary_verdicts_total")
    }
    assert {k for k, v in counted.items() if v > 0} <= possible
    assert counted[("safety", "disagree")] > 0  # canary-09, a known miss of the lexical judge
    assert counted[("groundedness", "agree")] > 0
    assert counted[("groundedness", "error")] == 0  # exported at 0, for increase()
    assert serve.terminate() == 0


@pytest.mark.slow
def test_serve_refuses_a_bad_canary_file_naming_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "golden.jsonl"
    bad.write_text(CANARIES.read_text().splitlines()[0] + "\n" + '{"request": "q"}\n')
    done = ragpulse(
        "serve", "--kafka-bootstrap", "127.0.0.1:1", "--topic", "t", "--state",
        str(tmp_path / "s.sqlite"), "--judge-backend", "local", "--canary-file", str(bad),
    )
    assert one_line_error(done.returncode, done.stderr, allow_info=True) == (
        f"ragpulse serve: canary file {bad}, line 2: the event has neither 'response' nor "
        "'trace'; one of them is required"
    )
    assert not (tmp_path / "s.sqlite").exists()  # refused before anything was opened


@pytest.mark.slow
def test_explain_with_a_window_reads_no_row_published_long_before_it(
    broker: ApacheKafkaBroker,
) -> None:
    topic = "seek.verdicts"
    broker.create_topic(topic, 1)
    now = time.time()
    # Rows published two days ago; made unreadable on purpose, so that reading them would
    # show as a warning.
    broker.produce(topic, [b"old and not a verdict row"] * 3, partition=0,
                   timestamp_ms=int((now - 2 * 86400) * 1000))
    recent = {
        "request_id": "recent-1",
        "event_time": datetime.fromtimestamp(now - 60, tz=UTC).isoformat(),
        "app": "bot",
        "model": "m",
        "response/llm_judged/groundedness/rating": "no",
        "response/llm_judged/groundedness/rationale": "the claim '42' is in no chunk",
        "response/llm_judged/groundedness/error_message": None,
    }
    broker.produce(topic, [json.dumps(recent).encode()], partition=0)
    source = ["--kafka-bootstrap", broker.bootstrap, "--verdicts-topic", topic, "--json"]

    windowed = ragpulse("explain", *source, "--window", "10m")
    assert windowed.returncode == 0, windowed.stderr
    assert [json.loads(line)["request_id"] for line in windowed.stdout.splitlines()] == [
        "recent-1"
    ]
    assert "skipped" not in windowed.stderr
    # Without a window every row is read, and the bad ones are named.
    everything = ragpulse("explain", *source)
    assert everything.returncode == 0
    assert everything.stderr.count(f"skipped {topic}/0@") == 3
