"""Tool calls as input: the event's `tool_calls`, the TOOL spans of an MLflow trace, and OTLP
tool spans made by the OpenTelemetry SDK (OpenInference and GenAI conventions, both Collector
encodings) all become the same typed `ToolCall`s; bad shapes are refused with a reason, and
sizes are bounded."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from otlp_spans import TOOL_STEPS, agent_trace, otlp_json, otlp_proto
from test_events import mlflow2_trace

from ragpulse.judges.base import ToolCall
from ragpulse.pipeline.formats.events import (
    MAX_TOOL_CALLS,
    MAX_TOOL_TEXT_CHARS,
    InvalidEvent,
    bound_tool_text,
    parse_event,
)
from ragpulse.pipeline.formats.otlp import Arrival, SpanPart, assemble, decode_spans

ENCODERS = {"otlp_json": otlp_json, "otlp_proto": otlp_proto}


def line(**fields: Any) -> bytes:
    event = {"request": "Where is my order A-17?", "response": "It has shipped.",
             "timestamp": 1_714_564_800_000}
    return orjson.dumps({**event, **fields})


def reason_for(raw: bytes) -> str:
    with pytest.raises(InvalidEvent) as caught:
        parse_event(raw)
    return caught.value.reason


# --- the event's own field ------------------------------------------------------------------


def test_tool_calls_field_gives_typed_calls_with_objects_kept_as_json_text() -> None:
    event = parse_event(line(tool_calls=[
        {"name": "lookup_order", "arguments": {"order_id": "A-17"}, "status": "error",
         "error": "HTTP 503", "span_id": "0x0a"},
        {"name": "lookup_order", "arguments": '{"order_id": "A-17"}',
         "result": {"status": "shipped"}, "description": "Looks an order up."},
    ]))
    assert event.tool_calls == (
        ToolCall("lookup_order", '{"order_id":"A-17"}', None, "error", "HTTP 503", "0x0a"),
        ToolCall("lookup_order", '{"order_id": "A-17"}', '{"status":"shipped"}', "ok",
                 description="Looks an order up."),
    )
    assert event.judge_input.tool_calls == event.tool_calls


def test_an_event_without_tool_calls_has_none() -> None:
    assert parse_event(line()).tool_calls == ()
    assert parse_event(line(tool_calls=[])).tool_calls == ()


@pytest.mark.parametrize(
    ("calls", "reason"),
    [
        pytest.param([{"name": "x", "args": "{}"}],
                     "field 'tool_calls[0].args' is invalid: Extra inputs are not permitted",
                     id="a misspelt key"),
        pytest.param([{"arguments": "{}"}], "field 'tool_calls[0].name' is missing",
                     id="no name"),
        pytest.param([{"name": "  "}], "'tool_calls[0]' has no tool name", id="blank name"),
        pytest.param([{"name": 7}], "field 'tool_calls[0].name' must be a string, not a number",
                     id="a number for a name"),
        pytest.param([{"name": "x", "status": "failed"}],
                     "field 'tool_calls[0].status' is invalid: Input should be 'ok' or 'error'",
                     id="a status outside ok/error"),
        pytest.param([{"name": "x", "error": "boom"}],
                     "'tool_calls[0]' gives an 'error' but its status is not \"error\" (set "
                     "\"status\": \"error\" for a failed call)", id="an error on an ok call"),
        pytest.param([{"name": "x", "arguments": [1, 2]}],
                     "field 'tool_calls[0].arguments' must be a string or a JSON object, "
                     "not an array", id="arguments neither text nor object"),
        pytest.param({"name": "x"}, "field 'tool_calls' must be a list, not an object",
                     id="an object, not a list"),
        pytest.param([{"name": "x" * 300}],
                     "'tool_calls[0]' tool name is 300 characters, over the 256-character limit",
                     id="a name over the limit"),
    ],
)
def test_bad_tool_call_shapes_reject_the_event_with_a_reason(calls: Any, reason: str) -> None:
    assert reason_for(line(tool_calls=calls)) == reason


def test_more_tool_calls_than_the_limit_reject_the_event() -> None:
    calls = [{"name": f"t{i}"} for i in range(MAX_TOOL_CALLS + 1)]
    assert reason_for(line(tool_calls=calls)) == (
        f"field 'tool_calls' holds {MAX_TOOL_CALLS + 1} tool calls, over the "
        f"{MAX_TOOL_CALLS}-call limit per event"
    )
    assert len(parse_event(line(tool_calls=calls[:-1])).tool_calls) == MAX_TOOL_CALLS


def test_long_arguments_and_results_are_cut_at_the_bound_saying_their_length() -> None:
    big = "y" * (3 * MAX_TOOL_TEXT_CHARS)
    (call,) = parse_event(line(tool_calls=[{"name": "fetch", "arguments": big,
                                            "result": big + "z"}])).tool_calls
    assert call.arguments is not None and call.result is not None
    assert len(call.arguments) == len(call.result) == MAX_TOOL_TEXT_CHARS
    assert call.arguments.endswith(f"[cut: {len(big)} characters in all]")
    assert call.result.endswith(f"[cut: {len(big) + 1} characters in all]")
    assert bound_tool_text(call.result) == call.result  # cutting twice changes nothing


# --- MLflow traces (Agent Evaluation schema) ----------------------------------------------


def mlflow2_tool_span(name: str, span_id: str, start: int, inputs: Any, outputs: Any,
                      status: str = "OK", message: str = "") -> dict[str, Any]:
    """A TOOL span as MLflow 2.x `Span.to_dict()` writes it (attributes JSON-encoded)."""
    return {
        "name": name,
        "context": {"span_id": span_id, "trace_id": "0x7d3e9d1bb0a7c3f54f3e1c9a2b6d8e01"},
        "parent_id": "0x01a1",
        "start_time": start,
        "end_time": start + 1000,
        "status_code": status,
        "status_message": message,
        "attributes": {
            "mlflow.spanType": '"TOOL"',
            "mlflow.spanInputs": orjson.dumps(inputs).decode(),
            "mlflow.spanOutputs": orjson.dumps(outputs).decode(),
        },
        "events": [],
    }


def test_mlflow2_trace_tool_spans_become_tool_calls_in_start_order() -> None:
    trace = mlflow2_trace()
    spans = trace["data"]["spans"]
    # Listed out of order: the later call first.
    spans.append(mlflow2_tool_span("lookup_order", "0x0b02", 1714564800050000000,
                                   {"order_id": "A-17"}, {"status": "shipped"}))
    spans.append(mlflow2_tool_span("lookup_order", "0x0b01", 1714564800030000000,
                                   {"order_id": "A-17"}, None, "ERROR", "HTTP 503"))
    event = parse_event(line(response=None, trace=trace))
    assert event.tool_calls == (
        ToolCall("lookup_order", '{"order_id":"A-17"}', None, "error", "HTTP 503", "0x0b01"),
        ToolCall("lookup_order", '{"order_id":"A-17"}', '{"status":"shipped"}', "ok",
                 span_id="0x0b02"),
    )
    # The trace also gave the answer and the chunks, as before.
    assert event.judge_input.answer.startswith("Per QP-1457")
    assert event.judge_input.chunks


def test_mlflow3_status_and_exception_event_give_the_error() -> None:
    span = {
        "name": "search_web", "span_id": "c0ffee", "parent_id": "r", "span_type": "TOOL",
        "inputs": {"query": "A-17"}, "outputs": None,
        "status": {"code": "STATUS_CODE_ERROR", "message": ""},
        "events": [{"name": "exception", "attributes": {"exception.message": "timed out"}}],
    }
    trace = {"spans": [{"name": "root", "span_type": "CHAIN", "outputs": "Shipped."}, span]}
    (call,) = parse_event(line(trace=trace)).tool_calls
    assert (call.status, call.error, call.span_id) == ("error", "timed out", "c0ffee")


def test_the_tool_calls_field_wins_over_the_trace() -> None:
    trace = {"spans": [{"name": "root", "span_type": "CHAIN", "outputs": "x"},
                       {"name": "t", "parent_id": "r", "span_type": "TOOL", "inputs": {}}]}
    event = parse_event(line(trace=trace, tool_calls=[{"name": "logged"}]))
    assert [c.name for c in event.tool_calls] == ["logged"]


def test_a_trace_tool_span_with_an_unknown_status_rejects_the_event() -> None:
    span = {"name": "t", "parent_id": "r", "span_type": "TOOL", "status_code": "BROKEN"}
    trace = {"spans": [{"name": "root", "span_type": "CHAIN", "outputs": "x"}, span]}
    assert reason_for(line(trace=trace)) == (
        "trace tool span 't' status 'BROKEN' is not OK, ERROR or UNSET"
    )


# --- OTLP spans made by the OpenTelemetry SDK ------------------------------------------------


def assembled(messages: list[bytes], encoding: str) -> Any:
    found = [
        Arrival(part, 0, offset, 0.0)
        for offset, raw in enumerate(messages)
        for part in decode_spans(raw, encoding)  # type: ignore[arg-type]
    ]
    done = assemble(found, now=100.0, wait=30.0, origin="spans")
    assert done.pending == () and len(done.records) == 1
    return done.records[0]


@pytest.mark.parametrize("encoding", ["otlp_json", "otlp_proto"])
@pytest.mark.parametrize("conventions", ["openinference", "genai"])
def test_sdk_tool_spans_become_the_events_tool_calls(encoding: str, conventions: str) -> None:
    spans = agent_trace(conventions=conventions)
    # One span per message, in reverse: the tool spans still come out in start order.
    record = assembled([ENCODERS[encoding]([s]) for s in reversed(spans)], encoding)
    assert record.refused is None
    event = parse_event(record.raw)
    tools = sorted((s for s in spans if s.parent is not None and s.name != "llm"),
                   key=lambda s: s.start_time or 0)
    described = "Looks an order up by its id." if conventions == "openinference" else None
    assert event.tool_calls == tuple(
        ToolCall(name, arguments, result, "error" if error else "ok", error,
                 f"{span.context.span_id:016x}", described)
        for (name, arguments, result, error), span in zip(TOOL_STEPS, tools, strict=True)
    )
    assert event.judge_input.answer == "Your order A-17 has shipped."


def test_a_genai_span_with_only_error_type_is_a_failed_call() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("chat") as root:
        root.set_attribute("input.value", "q")
        root.set_attribute("output.value", "a")
        with tracer.start_as_current_span("execute_tool get_weather") as tool:
            tool.set_attribute("gen_ai.operation.name", "execute_tool")
            tool.set_attribute("error.type", "timeout")
    event = parse_event(assembled([otlp_json(exporter.get_finished_spans())], "otlp_json").raw)
    (call,) = event.tool_calls
    assert (call.name, call.status, call.error, call.arguments) == (
        "get_weather", "error", "timeout", None
    )


def test_a_tool_span_without_a_name_refuses_its_trace_with_the_reason() -> None:
    spans = agent_trace(steps=[("", "{}", "ok", None)])
    record = assembled([otlp_json(spans)], "otlp_json")
    # The assembled event is refused by parse_event, like any other bad field.
    assert record.refused is None
    assert reason_for(record.raw) == "'tool_calls[0]' has no tool name"


def test_a_tool_span_part_survives_its_json_round_trip_through_the_state_store() -> None:
    parts = decode_spans(otlp_json(agent_trace()), "otlp_json")
    tools = [p for p in parts if p.tool is not None]
    assert len(tools) == 2 and tools[0].tool is not None and tools[0].tool.failed
    for part in parts:
        assert SpanPart.from_json(part.to_json()) == part
    # A part saved before tool calls were kept reads back without one.
    old = orjson.loads(parts[0].to_json())
    del old["tool"]
    assert SpanPart.from_json(orjson.dumps(old)).tool is None


def test_a_huge_tool_result_is_cut_in_the_span_part_so_the_state_stays_bounded() -> None:
    spans = agent_trace(steps=[("fetch_page", "{}", "z" * 100_000, None)])
    (tool,) = [p.tool for p in decode_spans(otlp_proto(spans), "otlp_proto") if p.tool]
    assert tool.result is not None and len(tool.result) == MAX_TOOL_TEXT_CHARS


def test_an_otlp_status_that_is_not_an_object_is_refused() -> None:
    data = orjson.loads(otlp_json(agent_trace()))
    bad = copy.deepcopy(data)
    bad["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["status"] = "ERROR"
    with pytest.raises(InvalidEvent, match="a span's status is not an object"):
        decode_spans(orjson.dumps(bad), "otlp_json")


def test_32_tool_calls_of_15_kb_build_a_capped_prompt_and_say_what_was_cut() -> None:
    from fake_openai import FakeOpenAI

    from ragpulse.judges.llm.build import build_llm_judges
    from ragpulse.judges.llm.judge import MAX_INPUT_CHARS, OpenAIJudgeEndpoint
    from ragpulse.judges.panel import JudgePanel

    calls = [
        {"name": f"search_{i}", "arguments": {"q": "x" * 15_000}, "result": "y" * 15_000}
        for i in range(32)
    ]
    raw = orjson.dumps({"request": "Find my invoice", "response": "Here it is.",
                        "timestamp": 1_700_000_000_000, "tool_calls": calls})
    item = parse_event(raw).judge_input
    with FakeOpenAI() as server:
        endpoint = OpenAIJudgeEndpoint(base_url=server.base_url, timeout_seconds=5.0)
        panel = JudgePanel(build_llm_judges(["tool_selection"], endpoint))
        try:
            [[verdict]] = panel.judge_batch([item])
        finally:
            panel.close()
        [request] = server.requests
    assert request.body is not None
    prompt = "".join(m["content"] for m in request.body["messages"])
    # Was 262 KB: now each of the judge's three inputs is at most MAX_INPUT_CHARS.
    assert len(prompt) < 3 * MAX_INPUT_CHARS + 10_000
    assert verdict.prompt_chars_cut > 200_000
    assert f"[ragpulse cut {verdict.prompt_chars_cut} characters" in (verdict.rationale or "")
    assert "left out]" in prompt
