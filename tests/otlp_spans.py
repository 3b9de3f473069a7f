"""Traces of a RAG chatbot made by the OpenTelemetry Python SDK, encoded as the Collector's
Kafka exporter publishes them (one ExportTraceServiceRequest per message).

`otlp_proto` is the SDK's own OTLP encoder (opentelemetry-exporter-otlp-proto-common), the
bytes of `encoding: otlp_proto`. `otlp_json` is the same request in OTLP JSON as the
Collector's `encoding: otlp_json` writes it: protobuf JSON with lowerCamelCase names, int64 as
strings, enums as integers, and trace and span ids as hex (where protobuf JSON would use base64).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import orjson
from google.protobuf.json_format import MessageToDict
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

QUESTION = "How long are QP-1457 quality records kept?"
ANSWER = "Quality records under QP-1457 are kept for 10 years."
DOCS = (
    ("kb/qp-1457#retention", "QP-1457: quality records are retained for ten years."),
    ("kb/qp-1457#owner", "The quality manager owns QP-1457."),
)


def _tracer(service: str) -> tuple[Any, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("ragpulse-tests"), exporter


def openinference_trace(
    question: str = QUESTION,
    answer: str | None = ANSWER,
    *,
    service: str = "support-bot",
    model: str = "gpt-4o-mini",
    docs: Sequence[tuple[str, str]] = DOCS,
    tokens: tuple[int, int] | None = None,
    session: str | None = None,
) -> list[ReadableSpan]:
    """A CHAIN root with a RETRIEVER and an LLM child, attributes as OpenInference (Phoenix)
    instrumentations set them; in the order the SDK ends them (children first, root last).
    Without `answer` the root and the LLM span carry no output; with `tokens` (prompt,
    completion) the LLM span carries llm.token_count.*; with `session` the LLM span (not the
    root: any span may carry it) names the conversation in session.id."""
    tracer, exporter = _tracer(service)
    with tracer.start_as_current_span("rag-query") as root:
        root.set_attribute("openinference.span.kind", "CHAIN")
        root.set_attribute("input.value", question)
        with tracer.start_as_current_span("retrieve") as retriever:
            retriever.set_attribute("openinference.span.kind", "RETRIEVER")
            retriever.set_attribute("input.value", question)
            for i, (doc_id, content) in enumerate(docs):
                retriever.set_attribute(f"retrieval.documents.{i}.document.id", doc_id)
                retriever.set_attribute(f"retrieval.documents.{i}.document.content", content)
                retriever.set_attribute(
                    f"retrieval.documents.{i}.document.metadata", '{"source": "kb"}'
                )
        with tracer.start_as_current_span("llm") as llm:
            llm.set_attribute("openinference.span.kind", "LLM")
            llm.set_attribute("llm.model_name", model)
            if session is not None:
                llm.set_attribute("session.id", session)
            llm.set_attribute("input.value", f"Context: ... Question: {question}")
            if tokens is not None:
                llm.set_attribute("llm.token_count.prompt", tokens[0])
                llm.set_attribute("llm.token_count.completion", tokens[1])
                llm.set_attribute("llm.token_count.total", sum(tokens))
            if answer is not None:
                llm.set_attribute("output.value", answer)
        if answer is not None:
            root.set_attribute("output.value", answer)
    return list(exporter.get_finished_spans())


def genai_trace(
    question: str = QUESTION,
    answer: str = ANSWER,
    *,
    service: str = "genai-bot",
    model: str = "gpt-4.1",
    deprecated_events: bool = False,
    tokens: tuple[int, int] | None = None,
    session: str | None = None,
) -> list[ReadableSpan]:
    """One `chat` span following the GenAI semantic conventions: gen_ai.input.messages and
    gen_ai.output.messages (JSON strings), or with `deprecated_events` the older
    gen_ai.content.prompt / gen_ai.content.completion events; with `tokens` (input, output)
    gen_ai.usage.*; with `session` gen_ai.conversation.id."""
    tracer, exporter = _tracer(service)
    with tracer.start_as_current_span(f"chat {model}") as span:
        span.set_attribute("gen_ai.operation.name", "chat")
        if session is not None:
            span.set_attribute("gen_ai.conversation.id", session)
        if tokens is not None:
            span.set_attribute("gen_ai.usage.input_tokens", tokens[0])
            span.set_attribute("gen_ai.usage.output_tokens", tokens[1])
        span.set_attribute("gen_ai.request.model", model)
        if deprecated_events:
            span.add_event(
                "gen_ai.content.prompt",
                {"gen_ai.prompt": orjson.dumps([{"role": "user", "content": question}]).decode()},
            )
            span.add_event("gen_ai.content.completion", {"gen_ai.completion": answer})
        else:
            span.set_attribute(
                "gen_ai.input.messages",
                orjson.dumps(
                    [
                        {"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
                        {"role": "user", "parts": [{"type": "text", "content": question}]},
                    ]
                ).decode(),
            )
            span.set_attribute(
                "gen_ai.output.messages",
                orjson.dumps(
                    [
                        {
                            "role": "assistant",
                            "parts": [{"type": "text", "content": answer}],
                            "finish_reason": "stop",
                        }
                    ]
                ).decode(),
            )
    return list(exporter.get_finished_spans())


def otlp_proto(spans: Sequence[ReadableSpan]) -> bytes:
    """The ExportTraceServiceRequest of `spans`, as `encoding: otlp_proto` publishes it."""
    return encode_spans(spans).SerializeToString()


def otlp_json(spans: Sequence[ReadableSpan]) -> bytes:
    """The same request as `encoding: otlp_json` publishes it (OTLP JSON)."""
    data = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    for rs in data.get("resourceSpans", ()):
        for ss in rs.get("scopeSpans", ()):
            for span in ss.get("spans", ()):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return orjson.dumps(data)


def trace_id(spans: Sequence[ReadableSpan]) -> str:
    """The trace id of `spans` as ragpulse names it (32 hex digits): the request id."""
    return f"{spans[0].context.trace_id:032x}"


# (name, arguments as JSON text, result, error message or None for a call that worked)
ToolStep = tuple[str, str, str | None, str | None]
TOOL_STEPS: tuple[ToolStep, ...] = (
    ("lookup_order", '{"order_id": "A-17"}', None, "HTTP 503 from orders-api"),
    ("lookup_order", '{"order_id": "A-17"}', '{"status": "shipped"}', None),
)


def agent_trace(
    steps: Sequence[ToolStep] = TOOL_STEPS,
    *,
    conventions: str = "openinference",
    question: str = "Where is my order A-17?",
    answer: str = "Your order A-17 has shipped.",
    service: str = "agent-bot",
) -> list[ReadableSpan]:
    """An agent's trace: a root span with one tool span per step, then an LLM span, as
    OpenInference (`conventions="openinference"`: TOOL spans with tool.name, input.value,
    output.value) or the GenAI conventions ("genai": execute_tool spans with gen_ai.tool.*
    and error.type). A failed step's span has status ERROR and records the exception, as the
    SDK does for an exception raised inside the span."""
    from opentelemetry.trace import Status, StatusCode

    tracer, exporter = _tracer(service)
    with tracer.start_as_current_span("agent") as root:
        root.set_attribute("openinference.span.kind", "AGENT")
        root.set_attribute("input.value", question)
        for name, arguments, result, error in steps:
            span_name = name if conventions == "openinference" else f"execute_tool {name}"
            with tracer.start_as_current_span(span_name, record_exception=False,
                                              set_status_on_exception=False) as tool:
                if conventions == "openinference":
                    tool.set_attribute("openinference.span.kind", "TOOL")
                    tool.set_attribute("tool.name", name)
                    tool.set_attribute("tool.description", "Looks an order up by its id.")
                    tool.set_attribute("input.value", arguments)
                    if result is not None:
                        tool.set_attribute("output.value", result)
                else:
                    tool.set_attribute("gen_ai.operation.name", "execute_tool")
                    tool.set_attribute("gen_ai.tool.name", name)
                    tool.set_attribute("gen_ai.tool.call.arguments", arguments)
                    if result is not None:
                        tool.set_attribute("gen_ai.tool.call.result", result)
                if error is not None:
                    tool.record_exception(RuntimeError(error))
                    if conventions == "genai":
                        tool.set_attribute("error.type", "RuntimeError")
                    tool.set_status(Status(StatusCode.ERROR, error))
        with tracer.start_as_current_span("llm") as llm:
            llm.set_attribute("openinference.span.kind", "LLM")
            llm.set_attribute("llm.model_name", "gpt-4o-mini")
            llm.set_attribute("output.value", answer)
        root.set_attribute("output.value", answer)
    return list(exporter.get_finished_spans())
