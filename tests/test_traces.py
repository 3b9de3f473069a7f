"""Decoding OTLP spans made by the OpenTelemetry SDK and assembling one judged answer per trace:
OpenInference and GenAI conventions, both Collector encodings, out-of-order parts, the wait,
and each way a trace or a record cannot be used."""

from __future__ import annotations

import dataclasses

import orjson
import pytest
from otlp_spans import (
    ANSWER,
    DOCS,
    QUESTION,
    genai_trace,
    openinference_trace,
    otlp_json,
    otlp_proto,
    trace_id,
)

from ragpulse.judges.base import Chunk
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event
from ragpulse.pipeline.formats.otlp import Arrival, SpanPart, assemble, decode_spans
from ragpulse.pipeline.records import AgentUsage, SourceRecord

ENCODERS = {"otlp_json": otlp_json, "otlp_proto": otlp_proto}


def arrivals(messages: list[bytes], encoding: str, seen: float = 0.0) -> list[Arrival]:
    """The parts of each message, as a reader at offsets 0, 1, ... of partition 0 finds them."""
    return [
        Arrival(part, 0, offset, seen)
        for offset, raw in enumerate(messages)
        for part in decode_spans(raw, encoding)  # type: ignore[arg-type]
    ]


def only_record(found: list[Arrival]) -> SourceRecord:
    done = assemble(found, now=100.0, wait=30.0, origin="spans")
    assert done.pending == () and len(done.records) == 1
    return done.records[0]


@pytest.mark.parametrize("encoding", ["otlp_json", "otlp_proto"])
def test_an_openinference_trace_split_over_messages_in_reverse_order_is_one_judged_answer(
    encoding: str,
) -> None:
    spans = openinference_trace()
    # Root first, then the LLM span, then the retriever: the reverse of the SDK's order.
    messages = [ENCODERS[encoding]([s]) for s in reversed(spans)]
    record = only_record(arrivals(messages, encoding))
    assert record.refused is None
    event = parse_event(record.raw)
    assert event.request_id == trace_id(spans)
    assert (event.app, event.model) == ("support-bot", "gpt-4o-mini")
    assert event.judge_input.question == QUESTION
    assert event.judge_input.answer == ANSWER
    assert event.judge_input.chunks == tuple(Chunk(content, uri) for uri, content in DOCS)
    root = next(s for s in spans if s.parent is None)
    assert event.event_time == pytest.approx((root.start_time or 0) / 1e9, abs=0.001)
    assert record.position == 0  # attributed to the root's message
    assert event.span_id == f"{root.context.span_id:016x}"  # the span that gave the answer


@pytest.mark.parametrize("encoding", ["otlp_json", "otlp_proto"])
def test_a_traces_token_counts_and_root_duration_become_the_events_usage_and_latency(
    encoding: str,
) -> None:
    spans = openinference_trace(tokens=(1200, 80))
    event = parse_event(only_record(arrivals([ENCODERS[encoding](spans)], encoding)).raw)
    assert event.usage == AgentUsage(1200, 80, 1280)
    root = next(s for s in spans if s.parent is None)
    duration = ((root.end_time or 0) - (root.start_time or 0)) / 1e9
    assert event.latency_seconds == pytest.approx(duration, abs=1e-6)

    event = parse_event(only_record(arrivals([otlp_json(genai_trace(tokens=(50, 7)))],
                                             "otlp_json")).raw)
    assert event.usage == AgentUsage(50, 7, 57)  # no total given: input + output
    untracked = parse_event(only_record(arrivals([otlp_json(genai_trace())], "otlp_json")).raw)
    assert untracked.usage is None and untracked.latency_seconds is not None


@pytest.mark.parametrize("deprecated_events", [False, True])
def test_a_genai_semantic_conventions_chat_span_gives_question_answer_and_model(
    deprecated_events: bool,
) -> None:
    spans = genai_trace(deprecated_events=deprecated_events)
    event = parse_event(only_record(arrivals([otlp_json(spans)], "otlp_json")).raw)
    assert event.judge_input.question == QUESTION
    assert event.judge_input.answer == ANSWER
    assert (event.app, event.model) == ("genai-bot", "gpt-4.1")
    assert event.judge_input.chunks == ()


def test_a_trace_is_held_until_the_wait_has_passed_since_its_first_span_arrived() -> None:
    spans = openinference_trace()
    first = arrivals([otlp_proto(spans[:1])], "otlp_proto", seen=100.0)
    held = assemble(first, now=110.0, wait=30.0, origin="spans")
    assert held.records == () and held.pending == tuple(first)
    rest = arrivals([otlp_proto(spans[1:])], "otlp_proto", seen=125.0)
    done = assemble([*held.pending, *rest], now=130.0, wait=30.0, origin="spans")
    assert done.pending == () and done.finished == {trace_id(spans)}
    assert parse_event(done.records[0].raw).judge_input.chunks  # the retriever came first


def test_traces_without_a_root_after_the_wait_are_refused_with_the_reason() -> None:
    spans = openinference_trace()
    children = [s for s in spans if s.parent is not None]
    record = only_record(arrivals([otlp_proto(children)], "otlp_proto"))
    assert record.refused is not None
    assert f"trace {trace_id(spans)}: no root span arrived within 30s" in record.refused
    assert b"retrieve" in record.raw  # the dead letter names the spans that did arrive


def test_a_trace_without_an_answer_is_refused_naming_what_is_missing() -> None:
    record = only_record(arrivals([otlp_json(openinference_trace(answer=None))], "otlp_json"))
    assert record.refused is not None and "no answer after waiting 30s" in record.refused


def test_two_different_copies_of_one_span_are_refused_and_identical_copies_count_once() -> None:
    spans = openinference_trace()
    twice = arrivals([otlp_proto(spans), otlp_proto(spans)], "otlp_proto")
    assert only_record(twice).refused is None  # a Collector retry sends the same bytes again
    parts = arrivals([otlp_proto(spans)], "otlp_proto")
    root = next(a.part for a in parts if a.part.parent_span_id is None)
    forged = Arrival(dataclasses.replace(root, answer="Five years."), 0, 9, 0.0)
    record = only_record([*parts, forged])
    assert record.refused is not None
    assert "arrived 2 times with different content" in record.refused


@pytest.mark.parametrize(
    ("raw", "encoding", "reason"),
    [
        (b"\xff\x00garbage", "otlp_proto", "not an OTLP protobuf ExportTraceServiceRequest"),
        (b"{not json", "otlp_json", "not OTLP JSON"),
        (b'{"resourceSpans": 3}', "otlp_json", "no resourceSpans"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}',
            "otlp_json",
            "traceId is not 32 hex digits",
        ),
        (b'{"resourceSpans": []}', "otlp_json", "holds no spans"),
    ],
)
def test_malformed_requests_are_rejected_with_a_reason(
    raw: bytes, encoding: str, reason: str
) -> None:
    with pytest.raises(InvalidEvent, match=reason):
        decode_spans(raw, encoding)  # type: ignore[arg-type]


@pytest.mark.parametrize("encoding", ["otlp_json", "otlp_proto"])
def test_the_openinference_session_id_and_the_genai_conversation_id_name_the_events_session(
    encoding: str,
) -> None:
    spans = openinference_trace(session="conv-7")
    event = parse_event(only_record(arrivals([ENCODERS[encoding](spans)], encoding)).raw)
    assert event.session_id == "conv-7"  # carried by the LLM span, not the root
    spans = genai_trace(session="  conv-8 ")
    event = parse_event(only_record(arrivals([ENCODERS[encoding](spans)], encoding)).raw)
    assert event.session_id == "conv-8"
    plain = parse_event(only_record(arrivals([ENCODERS[encoding](genai_trace())], encoding)).raw)
    assert plain.session_id is None


def test_a_span_part_saved_before_sessions_were_kept_reads_back_without_one() -> None:
    part = decode_spans(otlp_proto(openinference_trace(session="c1")), "otlp_proto")[0]
    saved = orjson.loads(part.to_json())
    del saved["session_id"]
    assert SpanPart.from_json(orjson.dumps(saved)) == dataclasses.replace(part, session_id=None)


def test_a_span_part_survives_its_json_round_trip_through_the_state_store() -> None:
    for part in decode_spans(otlp_proto(openinference_trace()), "otlp_proto"):
        assert SpanPart.from_json(part.to_json()) == part


def test_an_event_with_a_span_id_that_is_not_16_hex_digits_is_rejected() -> None:
    spans = openinference_trace()
    event = orjson.loads(only_record(arrivals([otlp_json(spans)], "otlp_json")).raw)
    with pytest.raises(InvalidEvent, match="'span_id' must be 16 hex digits"):
        parse_event(orjson.dumps({**event, "span_id": "not-a-span"}))


def _one_span(attributes: dict[str, str]) -> list[Arrival]:
    """A trace of one root span with `attributes`, made by the SDK, as it arrives."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    # An explicit resource: the SDK's default service.name depends on how Python was started
    # (sys.executable's name) and on OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES.
    provider = TracerProvider(resource=Resource({"service.name": "support-bot"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span("answer", attributes=attributes):
        pass
    return arrivals([otlp_proto(exporter.get_finished_spans())], "otlp_proto")


@pytest.mark.parametrize(
    "attributes",
    [
        {  # OpenInference, JSON input and output
            "openinference.span.kind": "CHAIN",
            "input.value": orjson.dumps({"question": QUESTION}).decode(),
            "input.mime_type": "application/json",
            "output.value": orjson.dumps({"output": ANSWER}).decode(),
            "output.mime_type": "application/json",
        },
        {  # OpenInference flattened messages on an LLM span
            "openinference.span.kind": "LLM",
            "llm.input_messages.0.message.role": "system",
            "llm.input_messages.0.message.content": "Be brief.",
            "llm.input_messages.1.message.role": "user",
            "llm.input_messages.1.message.content": QUESTION,
            "llm.output_messages.0.message.role": "assistant",
            "llm.output_messages.0.message.content": ANSWER,
        },
        {  # flattened gen_ai.prompt.N / gen_ai.completion.N (OpenLLMetry)
            "gen_ai.operation.name": "chat",
            "gen_ai.prompt.0.role": "user",
            "gen_ai.prompt.0.content": QUESTION,
            "gen_ai.completion.0.role": "assistant",
            "gen_ai.completion.0.content": ANSWER,
        },
    ],
    ids=["openinference-json", "openinference-messages", "genai-flattened"],
)
def test_other_attribute_shapes_give_the_same_question_and_answer(
    attributes: dict[str, str],
) -> None:
    event = parse_event(only_record(_one_span(attributes)).raw)
    assert (event.judge_input.question, event.judge_input.answer) == (QUESTION, ANSWER)
    assert event.app == "support-bot"  # the resource's service.name


def test_a_trace_with_two_root_spans_is_refused() -> None:
    parts = arrivals([otlp_proto(openinference_trace())], "otlp_proto")
    root = next(a for a in parts if a.part.parent_span_id is None)
    second = Arrival(dataclasses.replace(root.part, span_id="00000000000000ff"), 0, 1, 0.0)
    record = only_record([*parts, second])
    assert record.refused is not None and "2 root spans" in record.refused


def test_spans_of_a_trace_already_assembled_are_refused_at_once_not_judged_again() -> None:
    spans = openinference_trace()
    again = arrivals([otlp_proto(spans)], "otlp_proto", seen=100.0)
    done = assemble(again, now=100.0, wait=30.0, origin="spans", done_before={trace_id(spans)})
    assert done.pending == () and done.finished == frozenset()
    (record,) = done.records
    assert record.refused is not None
    assert record.refused.startswith(
        f"trace {trace_id(spans)}: 3 spans arrived after the trace was assembled or refused"
    )
