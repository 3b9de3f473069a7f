"""Exemplars on the failing verdict counters: which answer they name, how they are exposed, and
how the state file keeps them. (The serve-level and Prometheus tests are in test_explain_serve.)
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import apache_beam as beam
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.pipeline.formats.verdict_rows import InvalidVerdictRow, failing_verdicts
from ragpulse.pipeline.graphs.bounded import decode_metrics
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for
from ragpulse.pipeline.metrics.counting import FailingExample
from ragpulse.pipeline.records import InferenceRecord, JudgedEvent
from ragpulse.pipeline.service.state import StateStore
from ragpulse.pipeline.stages.report import ReportLatestFailing

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
        "ragpulse_judge_verdicts_total", judge=judge, version="", rating=rating, app="bot",
        model="m1",
    )


def judged(request_id: str, event_time: str, grounded: str, safe: str = "yes") -> JudgedEvent:
    record = InferenceRecord(
        request_id=request_id,
        event_time=datetime.fromisoformat(event_time).timestamp(),
        app="bot",
        model="m1",
        judge_input=JudgeInput(question="q", answer="a"),
    )
    verdicts = tuple(
        Verdict(
            judge,
            rating,  # type: ignore[arg-type]
            error_message="timed out" if rating == "error" else None,
        )
        for judge, rating in (("groundedness", grounded), ("safety", safe))
    )
    return JudgedEvent(record, verdicts)


def latest_failing(events: list[JudgedEvent]) -> dict[counting.CounterKey, FailingExample]:
    """The exemplars the graph's ReportLatestFailing stage hands back, on Beam's FnApiRunner
    with two events per bundle, so that several bundles report for one series."""
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = p | beam.Create(events, reshuffle=False) | ReportLatestFailing()
    return decode_metrics(p.result.metrics()).exemplars


@pytest.mark.slow
def test_each_failing_series_points_at_its_latest_answer_by_event_time() -> None:
    events = [
        judged("late-in-file-but-older", "2025-11-20T10:00:01Z", "no"),
        judged("newest-no", "2025-11-20T10:00:09Z", "no", safe="no"),
        judged("older-no", "2025-11-20T10:00:05Z", "no"),
        judged("an-error", "2025-11-20T10:00:02Z", "error"),
        judged("passing", "2025-11-20T10:00:30Z", "yes"),
    ]
    assert latest_failing(events) == {
        verdicts_key("groundedness", "no"): FailingExample("newest-no", 1763632809.0),
        verdicts_key("safety", "no"): FailingExample("newest-no", 1763632809.0),
        verdicts_key("groundedness", "error"): FailingExample("an-error", 1763632802.0),
    }


@pytest.mark.slow
def test_ties_in_event_time_are_broken_by_request_id_whatever_the_row_order() -> None:
    events = [judged("b", "2025-11-20T10:00:00Z", "no"), judged("a", "2025-11-20T10:00:00Z", "no")]
    forward = latest_failing(events)
    assert forward == latest_failing(events[::-1])
    assert forward[verdicts_key("groundedness", "no")].request_id == "b"


@pytest.mark.slow
def test_a_request_id_too_long_for_an_exemplar_is_passed_over_for_the_next_latest() -> None:
    long_id = "x" * (counting.MAX_EXEMPLAR_REQUEST_ID_CHARS + 1)
    events = [
        judged(long_id, "2025-11-20T10:00:09Z", "no"),
        judged("short", "2025-11-20T10:00:01Z", "no"),
    ]
    assert latest_failing(events)[verdicts_key("groundedness", "no")].request_id == "short"


def test_a_row_that_is_not_a_verdict_row_is_refused_with_the_reason() -> None:
    with pytest.raises(InvalidVerdictRow, match="event_time"):
        list(failing_verdicts({"request_id": "r", "app": "a", "model": "m"}))
    with pytest.raises(InvalidVerdictRow, match="not yes, no, error or skipped"):
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
    series = (
        'ragpulse_judge_verdicts_total{app="bot",judge="groundedness",model="m1",rating="no",'
        'version=""}'
    )
    assert f"{series} 3.0\n" in text


def test_state_file_keeps_the_latest_pointer_per_series_across_reopen(tmp_path: Path) -> None:
    k = verdicts_key("groundedness", "no")
    with StateStore(tmp_path / "state.sqlite") as state:
        state.save_exemplars({k: FailingExample("first", 100.0)})
        state.save_exemplars({k: FailingExample("older-replay", 50.0)})
        state.save_exemplars({})
    with StateStore(tmp_path / "state.sqlite") as state:
        assert state.exemplars() == {k: FailingExample("first", 100.0)}
        state.save_exemplars({k: FailingExample("second", 150.0)})
        assert state.exemplars() == {k: FailingExample("second", 150.0)}
