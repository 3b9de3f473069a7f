"""Verdicts on answers from traces go out as OpenTelemetry `gen_ai.evaluation.result` events on
the judged span: the Beam graph's sink against a real OTLP/HTTP receiver on loopback (a
stand-in for the Collector that decodes the protobuf request), its faults, and the text policy."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apache_beam as beam
import pytest
from cli import one_line_error
from graph_runs import stage_config
from otlp_receiver import OtlpReceiver, attributes
from otlp_spans import openinference_trace, otlp_proto, trace_id

from ragpulse.judges import TextPolicy
from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.pipeline.cli import main
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.formats.otlp import Arrival, assemble, decode_spans
from ragpulse.pipeline.graphs.bounded import GraphResult, Sinks, run_graph
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import InferenceRecord, JudgedEvent, SourceRecord
from ragpulse.pipeline.sinks.files import WriteDeadLetters
from ragpulse.pipeline.sinks.kafka import UNDELIVERABLE
from ragpulse.pipeline.sinks.otlp_evaluations import (
    EVENT_NAME,
    ExportEvaluations,
    describe_endpoint,
    evaluation_request,
    is_linked,
)

EMAIL = "jane.doe@example.com"
UNGROUNDED = f"Refunds take 90 days; write to {EMAIL}."


@pytest.fixture()
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as server:
        yield server


def traced_answer(answer: str) -> tuple[SourceRecord, Any]:
    """The assembled event of an SDK-made trace whose root answers `answer`, and its root."""
    spans = openinference_trace(answer=answer)
    parts = [Arrival(p, 0, 0, 0.0) for p in decode_spans(otlp_proto(spans), "otlp_proto")]
    (record,) = assemble(parts, now=0.0, wait=0.0, origin="spans", final=True).records
    return record, next(s for s in spans if s.parent is None)


def judge(records: list[SourceRecord], url: str, tmp_path: Path) -> GraphResult:
    config = stage_config()
    config = dataclasses.replace(
        config, judges=dataclasses.replace(config.judges, names=("groundedness", "safety"))
    )
    sinks = Sinks(
        dead_letters=WriteDeadLetters(tmp_path),
        evaluations=ExportEvaluations(url, TextPolicy(), timeout_s=5.0),
    )
    return run_graph(beam.Create(records), config, sinks)


@pytest.mark.slow
def test_each_verdict_on_a_traced_answer_reaches_the_receiver_on_the_judged_span(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    record, root = traced_answer(UNGROUNDED)
    judge([record], receiver.url, tmp_path)

    ((path, content_type, _),) = receiver.requests
    assert (path, content_type) == ("/v1/logs", "application/x-protobuf")
    logs = receiver.log_records()
    by_judge = {attributes(r)["gen_ai.evaluation.name"]: r for r in logs}
    assert set(by_judge) == {"groundedness", "safety"}
    for r in logs:
        assert r.event_name == EVENT_NAME
        assert r.trace_id.hex() == trace_id([root])
        assert r.span_id.hex() == f"{root.context.span_id:016x}"  # the span that answered
    grounded = attributes(by_judge["groundedness"])
    assert grounded["gen_ai.evaluation.score.label"] == "no"
    assert grounded["gen_ai.evaluation.score.value"] == 0.0
    # The rationale quotes the answer: redacted as in the verdict rows (the default policy).
    explanation = grounded["gen_ai.evaluation.explanation"]
    assert "[EMAIL]" in explanation and EMAIL not in explanation
    assert attributes(by_judge["safety"])["gen_ai.evaluation.score.value"] == 1.0


@pytest.mark.slow
def test_a_receiver_that_is_down_leaves_the_events_unacknowledged_and_a_refusal_counts_them(
    receiver: OtlpReceiver, tmp_path: Path
) -> None:
    record, _ = traced_answer(UNGROUNDED)
    where = describe_endpoint(receiver.url)
    receiver.status = 503  # may clear up: serve retries the cycle, then gives up
    result = judge([record], receiver.url, tmp_path)
    assert result.unacknowledged == {where: (2, "HTTP 503")}
    receiver.status = 400  # refused for good: counted as undeliverable at once
    result = judge([record], receiver.url, tmp_path)
    assert result.unacknowledged == {}
    assert result.counts[counting.key(UNDELIVERABLE, topic=where)] == 2


def judged(record: SourceRecord, rationale: str) -> JudgedEvent:
    event = parse_event(record.raw)
    return JudgedEvent(event, (Verdict("groundedness", "no", rationale),))


def test_with_store_text_none_the_events_carry_ratings_and_no_explanation() -> None:
    record, _ = traced_answer(UNGROUNDED)
    request = evaluation_request(
        [judged(record, f"quotes {EMAIL}")], TextPolicy(store_text="none"), 0
    )
    (log_record,) = request.resource_logs[0].scope_logs[0].log_records
    assert "gen_ai.evaluation.explanation" not in attributes(log_record)
    assert EMAIL.encode() not in request.SerializeToString()


def test_answers_that_did_not_come_from_a_trace_are_not_sent() -> None:
    plain = InferenceRecord("req-1", 0.0, "app", "model", JudgeInput("q", "a"))
    assert not is_linked(JudgedEvent(plain, ()))
    record, _ = traced_answer(UNGROUNDED)
    assert is_linked(judged(record, "r"))


def test_credentials_in_the_endpoint_url_stay_out_of_logs_and_labels() -> None:
    assert (
        describe_endpoint("https://user:s3cret@collector:4318/v1/logs?token=abc")
        == "https://collector:4318/v1/logs"
    )


def test_an_endpoint_that_is_not_an_http_url_is_a_one_line_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    state = str(tmp_path / "s.sqlite")
    flags = ["--state", state, "--evaluation-events-endpoint", "collector:4318/v1/logs"]
    code = main(["serve", "--kafka-bootstrap", "127.0.0.1:9", "--topic", "t", *flags])
    line = one_line_error(code, capsys.readouterr().err, allow_info=True)
    assert "--evaluation-events-endpoint" in line and "http://" in line
