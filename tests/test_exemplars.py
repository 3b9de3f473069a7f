"""Exemplars on the failing verdict counters: which answer they name, how they are exposed, and
how the state file keeps them. (The serve-level and Prometheus tests are in test_explain_serve.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from pipeline import counting
from pipeline.service.state import ExemplarPointer, StateStore
from pipeline.sinks.prometheus import (
    MAX_EXEMPLAR_REQUEST_ID_CHARS,
    FailingExample,
    MetricsSnapshot,
    latest_failing_examples,
    registry_for,
)
from pipeline.sinks.verdict_rows import InvalidVerdictRow, failing_verdicts

G = "response/llm_judged/groundedness"
S = "response/llm_judged/safety"


def row(request_id: str, event_time: str, grounded: str, safe: str = "yes") -> dict[str, object]:
    return {
        "request_id": request_id,
        "event_time": event_time,
        "app": "bot",
        "model": "m1",
        f"{G}/rating": grounded,
        f"{G}/rationale": f"rationale of {request_id}",
        f"{G}/error_message": "timed out" if grounded == "error" else None,
        f"{S}/rating": safe,
        f"{S}/rationale": None,
        f"{S}/error_message": None,
    }


def verdicts_key(judge: str, rating: str) -> counting.CounterKey:
    return counting.key(
        "ragpulse_judge_verdicts_total", judge=judge, rating=rating, app="bot", model="m1"
    )


def test_each_failing_series_points_at_its_latest_answer_by_event_time() -> None:
    rows = [
        row("late-in-file-but-older", "2025-11-20T10:00:01Z", "no"),
        row("newest-no", "2025-11-20T10:00:09Z", "no", safe="no"),
        row("older-no", "2025-11-20T10:00:05Z", "no"),
        row("an-error", "2025-11-20T10:00:02Z", "error"),
        row("passing", "2025-11-20T10:00:30Z", "yes"),
    ]
    latest = latest_failing_examples(v for r in rows for v in failing_verdicts(r))
    assert latest == {
        verdicts_key("groundedness", "no"): FailingExample("newest-no", 1763632809.0),
        verdicts_key("safety", "no"): FailingExample("newest-no", 1763632809.0),
        verdicts_key("groundedness", "error"): FailingExample("an-error", 1763632802.0),
    }


def test_ties_in_event_time_are_broken_by_request_id_whatever_the_row_order() -> None:
    rows = [row("b", "2025-11-20T10:00:00Z", "no"), row("a", "2025-11-20T10:00:00Z", "no")]
    forward = latest_failing_examples(v for r in rows for v in failing_verdicts(r))
    backward = latest_failing_examples(v for r in rows[::-1] for v in failing_verdicts(r))
    assert forward == backward
    assert forward[verdicts_key("groundedness", "no")].request_id == "b"


def test_a_request_id_too_long_for_an_exemplar_is_passed_over_for_the_next_latest() -> None:
    long_id = "x" * (MAX_EXEMPLAR_REQUEST_ID_CHARS + 1)
    rows = [row(long_id, "2025-11-20T10:00:09Z", "no"), row("short", "2025-11-20T10:00:01Z", "no")]
    latest = latest_failing_examples(v for r in rows for v in failing_verdicts(r))
    assert latest[verdicts_key("groundedness", "no")].request_id == "short"


def test_a_row_that_is_not_a_verdict_row_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidVerdictRow, match="event_time"):
        list(failing_verdicts({"request_id": "r", "app": "a", "model": "m"}))
    with pytest.raises(InvalidVerdictRow, match="not yes, no or error"):
        list(failing_verdicts({**row("r", "2025-11-20T10:00:00Z", "no"), f"{S}/rating": "meh"}))


def snapshot_with_exemplar() -> MetricsSnapshot:
    counts = counting.merge(
        {
            verdicts_key("groundedness", "yes"): 7,
            verdicts_key("groundedness", "no"): 3,
        }
    )
    exemplars = {
        verdicts_key("groundedness", "no"): FailingExample("req-42", 1763632809.5),
        # A pointer for a series at 0 (e.g. a state file from before a counter reset) is not
        # shown: an exemplar on a counter that never counted would point at nothing.
        verdicts_key("groundedness", "error"): FailingExample("req-0", 1763632800.0),
    }
    return MetricsSnapshot(counts, {}, exemplars=exemplars)


def test_openmetrics_exposition_carries_the_exemplar_on_the_failing_series_only() -> None:
    text = generate_openmetrics(registry_for(snapshot_with_exemplar)).decode()
    samples = {
        (s.name, s.labels["rating"]): s
        for family in text_string_to_metric_families(text)
        if family.name == "ragpulse_judge_verdicts"
        for s in family.samples
    }
    no = samples[("ragpulse_judge_verdicts_total", "no")]
    assert no.value == 3
    assert no.exemplar is not None
    assert no.exemplar.labels == {"request_id": "req-42"}
    assert no.exemplar.value == 1
    assert float(no.exemplar.timestamp) == pytest.approx(1763632809.5)
    assert samples[("ragpulse_judge_verdicts_total", "yes")].exemplar is None
    assert samples[("ragpulse_judge_verdicts_total", "error")].exemplar is None


def test_prometheus_text_format_leaves_exemplars_out() -> None:
    text = generate_latest(registry_for(snapshot_with_exemplar)).decode()
    assert "req-42" not in text
    series = 'ragpulse_judge_verdicts_total{app="bot",judge="groundedness",model="m1",rating="no"}'
    assert f"{series} 3.0\n" in text


def test_state_file_keeps_the_latest_pointer_per_series_across_reopen(tmp_path: Path) -> None:
    labels = {"judge": "groundedness", "rating": "no", "app": "bot", "model": "m1"}
    name = "ragpulse_judge_verdicts_total"
    with StateStore(tmp_path / "state.sqlite") as state:
        state.save_exemplars([ExemplarPointer(name, labels, "first", 100.0)])
        state.save_exemplars([ExemplarPointer(name, labels, "older-replay", 50.0)])
        state.save_exemplars([])
    with StateStore(tmp_path / "state.sqlite") as state:
        assert state.exemplars() == [ExemplarPointer(name, labels, "first", 100.0)]
        state.save_exemplars([ExemplarPointer(name, labels, "second", 150.0)])
        assert [e.request_id for e in state.exemplars()] == ["second"]
