"""The prompt version of each judge labels its series (verdicts, scores, windows), so that a
prompt change starts new series and the rates of two prompts are never added up."""

from __future__ import annotations

import dataclasses
import shutil
import sqlite3
from pathlib import Path

import orjson
import pytest
from fake_openai import FakeOpenAI, fake_openai_fixture  # noqa: F401
from graph_runs import run_to_files, stage_config

from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.service.state import CycleOutcome, StateStore
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.windows import RatingCounts, WindowKey

PROMPTS = Path(__file__).resolve().parents[1] / "judges" / "prompts"
START, END = 1_763_632_800.0, 1_763_633_100.0


def record(i: int) -> SourceRecord:
    event = {"request_id": f"req-{i}", "timestamp": "2025-11-20T10:00:00Z", "app": "faq",
             "model": "m1", "request": "Is it safe?", "response": "Yes, it is."}
    return SourceRecord(orjson.dumps(event), "mem", None, i)


def prompts_with_safety_version(folder: Path, version: int) -> Path:
    shutil.copytree(PROMPTS, folder)
    path = folder / "safety.yaml"
    text = path.read_text()
    path.write_text(text.replace("\nversion: 1\n", f"\nversion: {version}\n", 1))
    return folder


@pytest.mark.slow  # runs a Beam pipeline
def test_an_llm_judges_prompt_version_labels_its_verdicts_and_its_windows(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    prompts = prompts_with_safety_version(tmp_path / "prompts", 7)
    judges = JudgeSettings(backend="openai", base_url=fake_openai.base_url, names=("safety",),
                           prompts_dir=prompts).spec()
    config = dataclasses.replace(stage_config(), judges=judges)
    result = run_to_files([record(1), record(2)], tmp_path / "out", config)
    key = counting.key(counting.VERDICTS, judge="safety", version="v7f2", rating="yes",
                       app="faq", model="m1")
    assert result.counts[key] == 2
    (window,) = [orjson.loads(r) for r in (tmp_path / "out" / "windows.jsonl").read_bytes()
                 .splitlines()]
    assert (window["judge"], window["version"], window["yes"]) == ("safety", "v7f2", 2)
    (row,) = {orjson.loads(r)["request_id"]: orjson.loads(r) for r in
              (tmp_path / "out" / "verdicts.jsonl").read_bytes().splitlines()
              if b"req-1" in r}.values()
    assert row["response/llm_judged/safety/version"] == "v7f2"


def _schema_1_file(path: Path) -> None:
    """A state file as ragpulse wrote it before windows had a version."""
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE windows (window_start REAL NOT NULL, window_end REAL NOT NULL,
            judge TEXT NOT NULL, app TEXT NOT NULL, model TEXT NOT NULL,
            yes INTEGER NOT NULL DEFAULT 0, no INTEGER NOT NULL DEFAULT 0,
            error INTEGER NOT NULL DEFAULT 0, complete INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (window_start, window_end, judge, app, model));
        CREATE INDEX windows_open ON windows (complete, window_end);
        CREATE INDEX windows_series ON windows (complete, judge, app, model, window_end);
        CREATE TABLE offsets (topic TEXT NOT NULL, partition INTEGER NOT NULL,
            next_offset INTEGER NOT NULL, PRIMARY KEY (topic, partition));
        CREATE TABLE counters (name TEXT NOT NULL, labels TEXT NOT NULL, value REAL NOT NULL,
            PRIMARY KEY (name, labels));
        CREATE TABLE watermarks (topic TEXT PRIMARY KEY, watermark REAL);
        CREATE TABLE partition_event_times (topic TEXT NOT NULL, partition INTEGER NOT NULL,
            latest_event_time REAL NOT NULL, PRIMARY KEY (topic, partition));
        PRAGMA user_version=1;
    """)
    db.execute("INSERT INTO windows VALUES (?, ?, 'safety', 'faq', 'm1', 3, 1, 0, 0)",
               (START, END))
    db.execute("INSERT INTO counters VALUES (?, ?, 4)", (
        counting.VERDICTS, '{"app":"faq","judge":"safety","model":"m1","rating":"yes"}'))
    db.commit()
    db.close()


def test_a_schema_1_state_file_is_migrated_and_a_new_prompt_version_gets_a_window_of_its_own(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite"
    _schema_1_file(path)
    with StateStore(path) as state:
        assert state.schema_version == 2
        new = WindowKey(START, END, "safety", "faq", "m1", "v2f2")
        new_count = counting.key(counting.VERDICTS, judge="safety", version="v2f2",
                                 rating="yes", app="faq", model="m1")
        state.apply_cycle(
            "t",
            CycleOutcome(
                windows={new: RatingCounts(yes=1, no=1)},
                offsets={0: 5},
                counts={new_count: 1},
                closed_before=END,
            ),
        )
        complete, _ = state.current_windows()
        counts = state.counters()
    old = WindowKey(START, END, "safety", "faq", "m1", "")
    assert complete == {old: RatingCounts(yes=3, no=1), new: RatingCounts(yes=1, no=1)}
    reg = registry_for(lambda: MetricsSnapshot(counts, complete))
    series = {"judge": "safety", "app": "faq", "model": "m1"}
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", {**series, "version": ""}) == 0.75
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", {**series, "version": "v2f2"}) == 0.5
    # The counter saved before versions existed is exported with the label empty (absent to
    # Prometheus), beside the new version's.
    yes = {**series, "rating": "yes"}
    assert reg.get_sample_value("ragpulse_judge_verdicts_total", {**yes, "version": ""}) == 4
    assert reg.get_sample_value("ragpulse_judge_verdicts_total", {**yes, "version": "v2f2"}) == 1


def test_once_a_prompt_changes_only_the_new_versions_window_gauges_are_exported() -> None:
    old = WindowKey(START, END, "safety", "faq", "m1", "v1f2")
    new = WindowKey(END, END + 300, "safety", "faq", "m1", "v2f2")
    reg = registry_for(lambda: MetricsSnapshot({}, {old: RatingCounts(yes=1),
                                                   new: RatingCounts(no=1)}))
    series = {"judge": "safety", "app": "faq", "model": "m1"}
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", {**series, "version": "v2f2"}) == 0
    assert reg.get_sample_value("ragpulse_judge_pass_ratio", {**series, "version": "v1f2"}) is None


def test_the_label_budget_bounds_app_and_model_but_keeps_each_windows_prompt_version() -> None:
    from ragpulse.pipeline.metrics.labels import LabelBudget, LabelLimits

    windows = {WindowKey(START, END, "safety", app, "m1", "v3f2"): RatingCounts(yes=1)
               for app in ("a", "b")}
    bounded, _ = LabelBudget(LabelLimits(max_values=1)).bound(windows, {})
    assert set(bounded) == {WindowKey(START, END, "safety", "a", "m1", "v3f2"),
                            WindowKey(START, END, "safety", "other", "m1", "v3f2")}
