"""Bounded app and model labels: the cap, the allowlists, the `other` bucket and its overflow
counter, stability across restarts (through the real state file) and `ragpulse run`'s textfile."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from pathlib import Path

import orjson
import pytest
from apache_beam.runners.worker import sdk_worker
from graph_runs import run_to_files, stage_config
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from prometheus_client.parser import text_string_to_metric_families
from serve_process import Scrape, ServeProcess, serve_processes_fixture  # noqa: F401
from test_serve import T0, caught_up

from ragpulse.pipeline import cli
from ragpulse.pipeline.commands.run import METRICS_FILE, VERDICTS_FILE
from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for
from ragpulse.pipeline.metrics.labels import OTHER, LabelBudget, LabelLimits
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.service.state import CycleOutcome, StateStore
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.windows import RatingCounts, WindowKey

SAMPLES = Path(__file__).resolve().parent.parent / "deploy" / "samples" / "events.jsonl"


def batch(apps: Iterable[str], model: str = "gpt") -> tuple[
    dict[WindowKey, RatingCounts], counting.Counts
]:
    """What one batch of one judged event per app yields: one window and the counters."""
    windows: dict[WindowKey, RatingCounts] = {}
    counts: counting.Counts = counting.merge()
    for app in apps:
        windows[WindowKey(0.0, 60.0, "safety", app, model)] = RatingCounts(yes=1)
        counts[counting.key("ragpulse_events_judged_total", app=app, model=model)] += 1
        counts[counting.key("ragpulse_judge_verdicts_total", judge="safety", rating="yes",
                         app=app, model=model)] += 1
    counts[counting.key("ragpulse_events_total", outcome="accepted")] += 1
    return windows, counts


def values(windows: Iterable[WindowKey], label: str = "app") -> set[str]:
    return {getattr(k, label) for k in windows}


def save(
    store: StateStore, windows: dict[WindowKey, RatingCounts], counts: counting.Counts
) -> None:
    store.apply_cycle("chat", CycleOutcome(windows=windows, counts=counts))


def test_values_beyond_the_cap_are_counted_as_other_in_sorted_order_with_their_overflow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    budget = LabelBudget(LabelLimits(max_values=3))
    with caplog.at_level(logging.WARNING, logger="ragpulse.pipeline.metrics.labels"):
        windows, counts = budget.bound(*batch(["e", "d", "c", "b", "a"]))
        # The second batch overflows again: the warning is not repeated.
        budget.bound(*batch(["f", "g"]), admitted_from=counts)
    assert values(windows) == {"a", "b", "c", OTHER}
    assert windows[WindowKey(0.0, 60.0, "safety", OTHER, "gpt")] == RatingCounts(yes=2)
    assert counts[counting.key("ragpulse_label_overflow_total", label="app")] == 2
    assert counts[counting.key("ragpulse_events_judged_total", app=OTHER, model="gpt")] == 2
    assert counting.key("ragpulse_label_overflow_total", label="model") not in counts
    assert sum(counts[k] for k in counts if k[0] == "ragpulse_events_judged_total") == 5
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "'d', 'e'" in warnings[0]


def test_values_admitted_before_a_restart_keep_their_series_and_new_ones_do_not_take_their_place(
    tmp_path: Path,
) -> None:
    limits = LabelLimits(max_values=3)
    with StateStore(tmp_path / "state.sqlite") as store:
        save(store, *LabelBudget(limits).bound(*batch(["m", "n", "o", "p"])))
    # A new process: the budget knows nothing; the saved counters say what was admitted.
    with StateStore(tmp_path / "state.sqlite") as store:
        windows, counts = LabelBudget(limits).bound(
            *batch(["a", "n", "p", "z"]), store.counters()
        )
        save(store, windows, counts)
        apps = {dict(labels).get("app") for _, labels in store.counters()} - {None}
        overflow = {dict(labels)["label"]: v for (name, labels), v in store.counters().items()
                    if name == "ragpulse_label_overflow_total"}
    # "a" sorts first but the three slots are taken by m, n, o, saved before the restart.
    assert values(windows) == {"n", OTHER}
    assert apps == {"m", "n", "o", OTHER}
    assert overflow == {"app": 1 + 3}  # p in the first batch; a, p, z in the second


def test_allowlists_admit_only_their_values_whatever_the_cap() -> None:
    budget = LabelBudget(
        LabelLimits(max_values=1, allowed={"app": frozenset({"billing", "support"}),
                                           "model": frozenset({"gpt"})})
    )
    windows, counts = budget.bound(*batch(["support", "billing", "adhoc"], model="llama"))
    assert values(windows) == {"support", "billing", OTHER}
    assert values(windows, "model") == {OTHER}
    assert counts[counting.key("ragpulse_label_overflow_total", label="app")] == 1
    assert counts[counting.key("ragpulse_label_overflow_total", label="model")] == 3


def test_ten_thousand_distinct_apps_make_as_many_series_as_the_cap_allows(
    tmp_path: Path,
) -> None:
    """Through the serve merge path: bounded batches saved, then /metrics rendered from state."""
    budget = LabelBudget(LabelLimits(max_values=100))
    with StateStore(tmp_path / "state.sqlite") as store:
        for start in range(0, 10_000, 1_000):
            apps = [f"tenant-{i:05d}" for i in range(start, start + 1_000)]
            save(store, *budget.bound(*batch(apps), store.counters()))
        counts = store.counters()
    registry = registry_for(lambda: MetricsSnapshot(counts, {}))
    apps_in_metrics = {
        s.labels["app"]
        for family in registry.collect()
        for s in family.samples
        if "app" in s.labels
    }
    assert len(apps_in_metrics) == 100 + 1  # tenant-00000..00099 and other
    assert counts[counting.key("ragpulse_label_overflow_total", label="app")] == 9_900


@pytest.mark.slow
def test_ragpulse_run_bounds_the_labels_of_its_metrics_textfile_but_not_its_verdict_rows(
    tmp_path: Path,
) -> None:
    lines = SAMPLES.read_bytes().splitlines()[:60]
    events = tmp_path / "events.jsonl"
    rewritten = []
    for i, line in enumerate(lines):
        event = orjson.loads(line)
        event["app"] = f"tenant-{i:02d}"
        rewritten.append(orjson.dumps(event))
    events.write_bytes(b"\n".join(rewritten) + b"\n")
    code = cli.main(["run", str(events), "--output", str(tmp_path / "out"),
                     "--judge-backend", "local", "--judges", "safety", "--max-label-values", "5"])
    assert code == 0

    text = (tmp_path / "out" / METRICS_FILE).read_text()
    apps = {
        s.labels["app"]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if "app" in s.labels
    }
    assert apps == {f"tenant-{i:02d}" for i in range(5)} | {OTHER}
    assert "ragpulse_label_overflow_total{label=\"app\"} 55.0" in text
    verdict_apps = {orjson.loads(r)["app"] for r in
                    (tmp_path / "out" / VERDICTS_FILE).read_bytes().splitlines()}
    assert len(verdict_apps) == 60


@pytest.mark.slow
def test_batches_with_new_label_values_leave_no_counter_names_behind_in_beams_process_cache(
    tmp_path: Path,
) -> None:
    # Beam caches every metric name in a process-wide dict that never shrinks; counter names
    # carry app and model, so serve grew ~12 MB per 1,000 new apps until this was cleared.
    samples = SAMPLES.read_bytes().splitlines()[:200]
    config = stage_config(judges=JudgeSettings(backend="local", names=("safety",)).spec())
    for batch_number in range(2):
        records = []
        for i, line in enumerate(samples):
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(event, dict):
                event["app"] = f"tenant-{batch_number}-{i}"
            records.append(SourceRecord(orjson.dumps(event), "mem", 0, i))
        result = run_to_files(records, tmp_path / str(batch_number), config)
        assert sum(1 for k in result.counts if k[0] == "ragpulse_events_judged_total") > 100
        assert len(sdk_worker.SHORT_ID_CACHE._info_key_to_short_id) == 0


def test_serve_keeps_the_cap_across_a_restart_and_admitted_apps_keep_their_own_series(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: Callable[..., ServeProcess],
    tmp_path: Path,
) -> None:
    def tenant_events(first: int, apps: list[str]) -> list[bytes]:
        out = []
        for app, e in zip(apps, simulate(5, len(apps), T0 + first, rate=10), strict=True):
            body = orjson.loads(e.payload)
            body["app"] = app
            out.append(orjson.dumps(body))
        return out

    def apps_in(scrape: Scrape) -> set[str]:
        return {lab["app"] for _, lab, _ in scrape.samples if "app" in lab}

    topic = "tenants"
    kafka_broker.create_topic(topic, 1)
    state = tmp_path / "state.sqlite"
    args = ["--window", "10s", "--max-label-values", "5"]
    kafka_broker.produce(topic, tenant_events(0, [f"t{i:02d}" for i in range(40)]), partition=0)
    serve = serve_processes(kafka_broker.bootstrap, topic, state, args).start()
    first = serve.wait_for(caught_up(40), 90, "40 events read")
    assert serve.terminate() == 0
    admitted = {f"t{i:02d}" for i in range(5)}
    assert apps_in(first) == admitted | {OTHER}
    assert first.value("ragpulse_label_overflow_total", label="app") == 35

    # After the restart "a-new" sorts before every admitted app, but their slots are taken.
    later = ["a-new", "t00", "t39", "zz-new"]
    kafka_broker.produce(topic, tenant_events(10, later), partition=0)
    serve = serve_processes(kafka_broker.bootstrap, topic, state, args).start()
    second = serve.wait_for(caught_up(44), 90, "44 events read")
    assert serve.terminate() == 0
    assert apps_in(second) == admitted | {OTHER}
    assert second.value("ragpulse_label_overflow_total", label="app") == 35 + 3
    assert second.total("ragpulse_events_judged_total", app="t00") == 2


def test_guideline_names_beyond_the_cap_are_counted_as_other_with_their_verdicts_overflow() -> None:
    windows: dict[WindowKey, RatingCounts] = {}
    counts: counting.Counts = counting.merge()
    for name in ("clarity", "english", "tone"):
        judge = f"guideline_adherence/{name}"
        windows[WindowKey(0.0, 60.0, judge, "faq", "gpt")] = RatingCounts(yes=2)
        counts[counting.key(counting.VERDICTS, judge=judge, rating="yes", app="faq",
                            model="gpt")] += 2
    bounded_windows, bounded_counts = LabelBudget(LabelLimits(max_values=2)).bound(
        windows, counts
    )
    assert {k.judge for k in bounded_windows} == {
        "guideline_adherence/clarity", "guideline_adherence/english", "guideline_adherence/other"
    }
    other = counting.key(counting.VERDICTS, judge="guideline_adherence", guideline=OTHER,
                         rating="yes", app="faq", model="gpt")
    assert bounded_counts[other] == 2
    assert bounded_counts[counting.key("ragpulse_label_overflow_total", label="guideline")] == 2
