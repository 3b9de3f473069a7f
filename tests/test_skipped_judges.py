"""A judge whose required field is absent from an event is skipped: counted apart, never a
`no` or an `error`, never in a window's graded count (real Beam graph on FnApiRunner)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest
from graph_runs import run_to_files, stage_config
from prometheus_client.parser import text_string_to_metric_families

from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, write_textfile
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.models import JudgeSettings

QUESTION = "When was the Eiffel Tower built?"
ANSWER = "The Eiffel Tower was built between 1887 and 1889."


def record(i: int, **truth: object) -> SourceRecord:
    event = {"request_id": f"req-{i}", "timestamp": "2025-11-20T10:00:00Z", "app": "faq",
             "model": "m1", "request": QUESTION, "response": ANSWER,
             "retrieved_context": [{"content": ANSWER, "doc_uri": "wiki/eiffel.md"}], **truth}
    return SourceRecord(orjson.dumps(event), "mem", None, i)


def rows(path: Path) -> list[dict[str, object]]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


@pytest.mark.slow  # runs a Beam pipeline
def test_a_judge_without_its_required_field_is_skipped_not_failed_and_left_out_of_windows(
    tmp_path: Path,
) -> None:
    judges = JudgeSettings(backend="local", names=("correctness", "groundedness")).spec()
    config = dataclasses.replace(stage_config(), judges=judges)
    records = [record(1, expected_response="1889"), record(2, expected_response="1920"),
               record(3), record(4)]
    result = run_to_files(records, tmp_path, config)

    verdicts = {k: v for k, v in result.counts.items() if k[0] == counting.VERDICTS}
    by_rating = {dict(k[1])["rating"]: v for k, v in verdicts.items()
                 if dict(k[1])["judge"] == "correctness"}
    assert by_rating == {"yes": 1, "no": 1}  # two skipped events are neither no nor error
    skipped = {k: v for k, v in result.counts.items() if k[0] == counting.SKIPPED}
    assert [(dict(k[1])["judge"], dict(k[1])["missing"], v) for k, v in skipped.items()] == [
        ("correctness", "expected", 2)
    ]
    (window,) = [w for w in rows(tmp_path / "windows.jsonl") if w["judge"] == "correctness"]
    assert (window["yes"], window["no"], window["error"], window["percentage"]) == (1, 1, 0, 0.5)
    row = {r["request_id"]: r for r in rows(tmp_path / "verdicts.jsonl")}["req-3"]
    assert row["response/llm_judged/correctness/rating"] == "skipped"
    assert row["response/llm_judged/correctness/error_cause"] is None
    assert row["response/llm_judged/groundedness/rating"] == "yes"

    prom = tmp_path / "metrics.prom"
    write_textfile(prom, MetricsSnapshot(result.counts, result.windows))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(prom.read_text()) for s in f.samples}
    labels = {"judge": "correctness", "version": "local", "missing": "expected", "app": "faq",
              "model": "m1"}
    assert samples[("ragpulse_judge_skipped_total", tuple(sorted(labels.items())))] == 2
    assert not any(n == "ragpulse_judge_verdicts_total" and dict(lab).get("rating") == "skipped"
                   for n, lab in samples)
