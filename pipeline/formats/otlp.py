"""OpenTelemetry traces as input: OTLP spans in, one inference-log event per trace out.

For teams whose chatbot is traced with OpenTelemetry: the Collector's Kafka exporter publishes
each batch of spans as one `ExportTraceServiceRequest` (`encoding: otlp_json` or `otlp_proto`),
and `--input-format otlp_json|otlp_proto` makes `run` and `serve` read those instead of
ragpulse's own events (pipeline/formats/events.py). Two steps, both pure:

`decode_spans` validates one request and keeps, of each span, only what a judge reads (a
`SpanPart`): trace and span ids, parent, kind, start time, service.name, and the question,
answer, model and retrieved documents it carries. Attributes read, first found wins:

    kind      openinference.span.kind (LLM, RETRIEVER, CHAIN, ...); else from
              gen_ai.operation.name (chat, text_completion, generate_content -> LLM);
              else RETRIEVER when the span lists retrieval.documents
    question  input.value (JSON when input.mime_type is application/json);
              gen_ai.input.messages; llm.input_messages.N.message.role/content;
              gen_ai.prompt (on the span or on its gen_ai.content.prompt event);
              gen_ai.prompt.N.role/content
    answer    output.value (likewise); gen_ai.output.messages;
              llm.output_messages.N.message.content; gen_ai.completion (span or event);
              gen_ai.completion.N.content
    model     llm.model_name, gen_ai.request.model, gen_ai.response.model
    tokens    gen_ai.usage.input_tokens / output_tokens (or prompt_tokens / completion_tokens),
              llm.token_count.prompt / completion / total
    documents retrieval.documents.N.document.content / .id / .metadata (the id, else the
              metadata's doc_uri or source, becomes the chunk's doc_uri)
    tool call of a TOOL span (openinference.span.kind TOOL, or gen_ai.operation.name
              execute_tool): name tool.name, gen_ai.tool.name, else the span's name;
              arguments input.value, gen_ai.tool.call.arguments; result output.value,
              gen_ai.tool.call.result; description tool.description, gen_ai.tool.description,
              with the parameter schema tool.parameters; failed when the span's status is
              ERROR or it sets error.type, the error being the status message, else
              error.type, else its "exception" event's exception.message
    session   session.id (OpenInference), gen_ai.conversation.id (GenAI): the conversation

`assemble` groups the parts that arrived (in any order, from any number of messages and
cycles) by trace id and, once a trace has waited `wait` seconds since its first span
arrived, turns it into one ragpulse event, which `parse_event` then validates like any other:
request_id = the trace id, question and answer from the root span (else the first and last
LLM span; span_id names the span that gave the answer), chunks from the latest RETRIEVER span,
model from the latest LLM span (else any span naming one), app = the root's service.name,
timestamp = the root's start, usage = the token counts summed over the LLM spans (the root's
when no LLM span has any), latency_seconds = the root span's duration, session_id = the
root's conversation id (else the first span naming one), tool_calls = the TOOL spans in start
order (texts cut at the event's bound, pipeline.formats.events). A trace that
cannot be assembled (no root span, no question or no answer, two different copies of one span,
two roots) becomes a refused record whose reason says so; identical copies of a span (a
Collector retry) count once, and spans of a trace that was already assembled or refused (a
retry after the wait, a span later than it) are refused at once: a trace is judged once.

Why a fixed wait rather than "as soon as the root arrived": nothing in a span says how many
children its trace has, and the root (which ends last, so is usually exported last) can reach
Kafka first when several Collectors or batches are involved; judging at the root would judge
without the retrieved documents still on their way. A fixed wait makes every trace's fate
depend only on what arrived within it, which is also what makes a replayed cycle decide the
same way.

Where assembly lives, and why: spans of one trace arrive in different Kafka records and
different serve cycles, so parts must outlive a cycle and a crash. `serve` keeps the pending
parts in its state store, saved in the same SQLite transaction as the cycle's counts and
offsets (pipeline/service/state.py): the offsets move past a span only when the span itself is
saved, so a crash replays the cycle and neither loses a span nor counts a trace twice. That is
why the spans are read and assembled in the serve process, at the edge, before the Beam graph
(pipeline/sources/otlp.py): the state store is deliberately not a Beam sink, and Beam metrics
carry small aggregates, not span text. The graph then judges the assembled events like any
other (its source is the list of `SourceRecord`s made here); refused traces reach the
dead-letter sink through `SourceRecord.refused`.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
from collections import defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from typing import Any, Literal, get_args

import orjson

from ragpulse.pipeline.formats.events import InvalidEvent, bound_tool_text
from ragpulse.pipeline.records import SourceRecord

__all__ = [
    "INPUT_FORMATS",
    "Arrival",
    "Assembly",
    "Document",
    "InputFormat",
    "SpanPart",
    "ToolSpan",
    "assemble",
    "decode_spans",
]

InputFormat = Literal["ragpulse", "otlp_json", "otlp_proto"]
INPUT_FORMATS: tuple[InputFormat, ...] = get_args(InputFormat)

_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
_GENAI_KINDS = {"embeddings": "EMBEDDING", "execute_tool": "TOOL", "invoke_agent": "AGENT"}
_JSON_MIME = "application/json"


@dataclasses.dataclass(frozen=True, slots=True)
class Document:
    """One retrieved document of a RETRIEVER span; `content` None when the span gave none."""

    content: str | None
    doc_uri: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class ToolSpan:
    """The tool call of a TOOL span: texts as the span gave them, cut at the event's bound."""

    name: str
    arguments: str | None
    result: str | None
    failed: bool
    error: str | None
    description: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class SpanPart:
    """What ragpulse keeps of one span: identity, place in the trace, and judge inputs.

    `question` and `answer` are a string or the decoded JSON the span carried (read later by
    `parse_event`'s request and response rules); `documents` is None for a span that lists none.
    """

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str | None
    start_ns: int
    service: str | None
    question: Any = None
    answer: Any = None
    model: str | None = None
    documents: tuple[Document, ...] | None = None
    # The span's token counts (input, output, total) where it gives them, and its end.
    tokens: tuple[int | None, int | None, int | None] | None = None
    end_ns: int | None = None
    tool: ToolSpan | None = None  # of a TOOL span
    session_id: str | None = None  # the conversation the trace belongs to, when it says

    def to_json(self) -> bytes:
        return orjson.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> SpanPart:
        data = orjson.loads(raw)
        docs = data.pop("documents")
        tokens = data.pop("tokens", None)  # parts saved before tokens were kept have none
        tool = data.pop("tool", None)  # nor tool calls
        return cls(
            **data,
            documents=None if docs is None else tuple(Document(**d) for d in docs),
            tokens=None if tokens is None else tuple(tokens),
            tool=None if tool is None else ToolSpan(**tool),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Arrival:
    """A span part and where and when it arrived: its record (partition, offset or line) and
    `seen`, the epoch time ragpulse first read it (the wait counts from the earliest)."""

    part: SpanPart
    partition: int | None
    position: int
    seen: float


@dataclasses.dataclass(frozen=True, slots=True)
class Assembly:
    """What `assemble` made of the arrived parts.

    `records`: one per finished trace, an event for `parse_event` or a refused record;
    `pending`: the parts of traces still waiting; `finished`: the trace ids that left.
    """

    records: tuple[SourceRecord, ...]
    pending: tuple[Arrival, ...]
    finished: frozenset[str]


# --- decoding (the boundary) -----------------------------------------------------------------


def decode_spans(raw: bytes, encoding: Literal["otlp_json", "otlp_proto"]) -> list[SpanPart]:
    """The span parts of one ExportTraceServiceRequest; InvalidEvent says what is wrong."""
    if encoding == "otlp_json":
        return _decode_json(raw)
    return _decode_proto(raw)


@functools.cache
def _proto_classes() -> tuple[Any, type[Exception]]:
    # Imported on first use: only otlp_proto input pays for the protobuf classes; cached, as
    # an import statement per record cost more than decoding it.
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    return ExportTraceServiceRequest, DecodeError


def _decode_proto(raw: bytes) -> list[SpanPart]:
    request_class, decode_error = _proto_classes()
    try:
        request = request_class.FromString(raw)
    except decode_error as exc:
        raise InvalidEvent(
            f"record is not an OTLP protobuf ExportTraceServiceRequest ({exc})"
        ) from None
    parts = []
    for rs in request.resource_spans:
        service = _attributes_proto(rs.resource.attributes).get("service.name")
        for ss in rs.scope_spans:
            for span in ss.spans:
                attributes = _attributes_proto(span.attributes)
                events = [(e.name, _attributes_proto(e.attributes)) for e in span.events]
                parts.append(
                    _part(
                        _hex_id(span.trace_id, 16, "trace_id"),
                        _hex_id(span.span_id, 8, "span_id"),
                        _hex_id(span.parent_span_id, 8, "parent_span_id") or None,
                        span.name,
                        span.start_time_unix_nano,
                        service,
                        attributes,
                        events,
                        span.end_time_unix_nano or None,
                        (span.status.code == _STATUS_ERROR, span.status.message or None),
                    )
                )
    if not parts:
        raise InvalidEvent("the OTLP request holds no spans")
    return parts


# OTLP's Status.StatusCode: UNSET 0, OK 1, ERROR 2 (OTLP JSON may spell it out).
_STATUS_ERROR = 2
_STATUS_NAMES = {"STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1, "STATUS_CODE_ERROR": 2}


def _status_json(status: Any) -> tuple[bool, str | None]:
    """(failed, message) of an OTLP JSON span's status."""
    if not status:
        return False, None
    if not isinstance(status, dict):
        raise InvalidEvent(f"a span's status is not an object: {status!r:.60}")
    code = status.get("code", 0)
    code = _STATUS_NAMES.get(code, code) if isinstance(code, str) else code
    if code not in (0, 1, 2) or isinstance(code, bool):
        raise InvalidEvent(f"a span's status code is not UNSET, OK or ERROR: {code!r:.60}")
    message = status.get("message")
    if message is not None and not isinstance(message, str):
        raise InvalidEvent(f"a span's status message is not a string: {message!r:.60}")
    return code == _STATUS_ERROR, message or None


def _hex_id(value: bytes, size: int, field: str) -> str:
    if not value:
        if field == "parent_span_id":
            return ""
        raise InvalidEvent(f"a span has no {field}")
    if len(value) != size:
        raise InvalidEvent(f"a span's {field} is {len(value)} bytes, not {size}")
    return value.hex()


def _attributes_proto(kvs: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: _value_proto(kv.value) for kv in kvs}


def _value_proto(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_value_proto(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return _attributes_proto(v.kvlist_value.values)
    return None if which is None else getattr(v, which)


def _decode_json(raw: bytes) -> list[SpanPart]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidEvent(f"record is not OTLP JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("resourceSpans"), list):
        raise InvalidEvent("record is not an OTLP JSON ExportTraceServiceRequest: no resourceSpans")
    parts = []
    try:
        for rs in data["resourceSpans"]:
            service = _attributes_json((rs.get("resource") or {}).get("attributes")).get(
                "service.name"
            )
            for ss in rs.get("scopeSpans") or ():
                for span in ss.get("spans") or ():
                    events = [
                        (e.get("name", ""), _attributes_json(e.get("attributes")))
                        for e in span.get("events") or ()
                    ]
                    parts.append(
                        _part(
                            _json_id(span.get("traceId"), 16, "traceId"),
                            _json_id(span.get("spanId"), 8, "spanId"),
                            _json_id(span.get("parentSpanId"), 8, "parentSpanId") or None,
                            str(span.get("name", "")),
                            _unix_nano(span.get("startTimeUnixNano")),
                            service,
                            _attributes_json(span.get("attributes")),
                            events,
                            int(span.get("endTimeUnixNano") or 0) or None,
                            _status_json(span.get("status")),
                        )
                    )
    except (AttributeError, TypeError, ValueError) as exc:
        # A list where an object belongs, a number that is not one: the shape is not OTLP.
        raise InvalidEvent(
            f"record is not a valid OTLP JSON ExportTraceServiceRequest ({exc})"
        ) from None
    if not parts:
        raise InvalidEvent("the OTLP request holds no spans")
    return parts


_UINT64 = 2**64
_INT64 = 2**63


def _unix_nano(value: Any) -> int:
    """startTimeUnixNano: a fixed64, which OTLP JSON writes as a decimal string (a JSON
    integer is taken too); InvalidEvent for anything else or out of range. Unchecked, one
    26-digit value failed every serve cycle ("Integer exceeds 64-bit range")."""
    if value in (None, ""):
        return 0
    if isinstance(value, str) and value.isascii() and value.isdigit():
        number = int(value)
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise InvalidEvent(
            f"a span's startTimeUnixNano is not a whole number of nanoseconds: {value!r:.60}"
        )
    if not 0 <= number < _UINT64:
        raise InvalidEvent(
            f"a span's startTimeUnixNano {str(value)[:40]} is beyond the 64-bit range of "
            "nanoseconds since 1970"
        )
    return number


def _json_id(value: Any, size: int, field: str) -> str:
    if value in (None, ""):
        if field == "parentSpanId":
            return ""
        raise InvalidEvent(f"a span has no {field}")
    # OTLP JSON writes ids as hex, not as protobuf JSON's base64.
    if not isinstance(value, str) or len(value) != 2 * size:
        raise InvalidEvent(f"a span's {field} is not {2 * size} hex digits: {value!r:.60}")
    try:
        bytes.fromhex(value)
    except ValueError:
        raise InvalidEvent(f"a span's {field} is not hex: {value!r:.60}") from None
    return value.lower()


def _attributes_json(kvs: Any) -> dict[str, Any]:
    return {kv["key"]: _value_json(kv.get("value") or {}) for kv in kvs or ()}


def _value_json(v: Mapping[str, Any]) -> Any:
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        number = int(v["intValue"])  # int64 is written as a string in OTLP JSON
        if not -_INT64 <= number < _INT64:
            raise InvalidEvent(f"an attribute's intValue {str(v['intValue'])[:40]} is not an int64")
        return number
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [_value_json(x) for x in (v["arrayValue"] or {}).get("values") or ()]
    if "kvlistValue" in v:
        return _attributes_json((v["kvlistValue"] or {}).get("values"))
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    return None


def _part(
    trace_id: str,
    span_id: str,
    parent: str | None,
    name: str,
    start_ns: int,
    service: Any,
    attrs: dict[str, Any],
    events: list[tuple[str, dict[str, Any]]],
    end_ns: int | None = None,
    status: tuple[bool, str | None] = (False, None),
) -> SpanPart:
    # The deprecated GenAI content events carry gen_ai.prompt / gen_ai.completion.
    for _, event_attrs in events:
        for key in ("gen_ai.prompt", "gen_ai.completion"):
            if key in event_attrs:
                attrs.setdefault(key, event_attrs[key])
    documents = _documents(attrs)
    kind = _kind(attrs, documents)
    return SpanPart(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=name,
        kind=kind,
        start_ns=start_ns,
        service=service if isinstance(service, str) and service.strip() else None,
        question=_question(attrs),
        answer=_answer(attrs),
        model=_first_text(attrs, "llm.model_name", "gen_ai.request.model", "gen_ai.response.model"),
        documents=documents,
        tokens=_tokens(attrs),
        end_ns=end_ns,
        session_id=_first_text(attrs, *_SESSION_KEYS),
        tool=_tool(name, attrs, events, status) if kind == "TOOL" else None,
    )


def _first_text(attrs: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = attrs.get(key)
        if isinstance(value, str) and value.strip():
            return value
    return None


def _tool_text(value: Any) -> str | None:
    """A tool's arguments or result: a string as it is, another value as JSON, cut."""
    if value is None:
        return None
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return bound_tool_text(text)


def _tool(
    span_name: str,
    attrs: Mapping[str, Any],
    events: list[tuple[str, dict[str, Any]]],
    status: tuple[bool, str | None],
) -> ToolSpan:
    failed, message = status
    error_type = _first_text(attrs, "error.type")
    failed = failed or error_type is not None
    if failed and not message:
        message = error_type or next(
            (
                text
                for name, event_attrs in events
                if name in ("exception", "gen_ai.execute_tool.exception")
                for text in [_first_text(event_attrs, "exception.message", "exception.type")]
                if text
            ),
            None,
        )
    description = _first_text(attrs, "tool.description", "gen_ai.tool.description")
    schema = _first_text(attrs, "tool.parameters")
    if schema is not None:
        description = f"{description or ''}\nparameters: {schema}".strip()
    name = _first_text(attrs, "tool.name", "gen_ai.tool.name")
    if name is None:  # GenAI names the span "execute_tool {gen_ai.tool.name}"
        name = span_name.removeprefix("execute_tool ").strip() or span_name
    return ToolSpan(
        name=name,
        arguments=_tool_text(
            attrs.get("input.value", attrs.get("gen_ai.tool.call.arguments"))
        ),
        result=_tool_text(attrs.get("output.value", attrs.get("gen_ai.tool.call.result"))),
        failed=failed,
        error=None if message is None else bound_tool_text(message),
        description=None if description is None else bound_tool_text(description),
    )


# The attributes naming a span's conversation: OpenInference, then OpenTelemetry GenAI.
_SESSION_KEYS = ("session.id", "gen_ai.conversation.id")


# The attributes of a span's token counts, first found wins: OpenTelemetry GenAI (current and
# older names), then OpenInference.
_TOKEN_KEYS = (
    ("gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens", "llm.token_count.prompt"),
    ("gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
     "llm.token_count.completion"),
    ("gen_ai.usage.total_tokens", "llm.token_count.total"),
)


def _tokens(attrs: Mapping[str, Any]) -> tuple[int | None, int | None, int | None] | None:
    counts: list[int | None] = []
    for keys in _TOKEN_KEYS:
        found = [attrs[k] for k in keys if _is_count(attrs.get(k))]
        counts.append(int(found[0]) if found else None)
    given, taken, total = counts
    return None if counts == [None, None, None] else (given, taken, total)


def _is_count(value: Any) -> bool:
    if isinstance(value, str):
        return value.isdigit()  # a count written as a string by a hand-rolled exporter
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _usage(root: SpanPart, llms: Sequence[SpanPart]) -> dict[str, int] | None:
    """The trace's usage: summed over its LLM spans, else the root's; None when none says."""
    counted = [p.tokens for p in llms if p.tokens is not None] or (
        [root.tokens] if root.tokens is not None else []
    )
    if not counted:
        return None
    usage = {}
    for i, name in enumerate(("input_tokens", "output_tokens", "total_tokens")):
        values = [t[i] for t in counted if t[i] is not None]
        if values:
            usage[name] = sum(v for v in values if v is not None)
    return usage


def _kind(attrs: Mapping[str, Any], documents: tuple[Document, ...] | None) -> str | None:
    kind = attrs.get("openinference.span.kind")
    if isinstance(kind, str) and kind:
        return kind.upper()
    operation = attrs.get("gen_ai.operation.name")
    if operation in _LLM_OPERATIONS:
        return "LLM"
    if isinstance(operation, str) and operation in _GENAI_KINDS:
        return _GENAI_KINDS[operation]
    return "RETRIEVER" if documents is not None else None


def _indexed(attrs: Mapping[str, Any], prefix: str) -> list[dict[str, Any]]:
    """`prefix.N.rest` flattened attributes (OpenInference, OpenLLMetry) as a list by N."""
    found: dict[int, dict[str, Any]] = defaultdict(dict)
    dot = prefix + "."
    for key, value in attrs.items():
        if key.startswith(dot):
            index, _, rest = key[len(dot) :].partition(".")
            if index.isdigit() and rest:
                found[int(index)][rest] = value
    return [found[i] for i in sorted(found)]


def _maybe_json(value: Any, mime: Any) -> Any:
    if isinstance(value, str) and mime == _JSON_MIME:
        try:
            decoded = orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
        if isinstance(decoded, list):
            return {"messages": decoded}
        return decoded if isinstance(decoded, dict) else value
    return value


def _genai_message(m: Any) -> Any:
    """A GenAI semconv message ({"role", "parts": [{"type": "text", "content"}]}) in the chat
    form parse_event reads ({"role", "content"}); other shapes are left as they are."""
    if isinstance(m, dict) and "parts" in m and "content" not in m:
        parts = m["parts"] if isinstance(m["parts"], list) else []
        text = "\n".join(
            p["content"]
            for p in parts
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("content"), str)
        )
        return {"role": m.get("role"), "content": text}
    return m


def _messages(value: Any) -> list[Any] | None:
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    return [_genai_message(m) for m in value] if isinstance(value, list) else None


def _question(attrs: Mapping[str, Any]) -> Any:
    if "input.value" in attrs:
        return _maybe_json(attrs["input.value"], attrs.get("input.mime_type"))
    if "gen_ai.input.messages" in attrs:
        messages = _messages(attrs["gen_ai.input.messages"])
        return {"messages": messages} if messages is not None else attrs["gen_ai.input.messages"]
    if flat := _indexed(attrs, "llm.input_messages"):
        return {
            "messages": [
                {"role": m.get("message.role"), "content": m.get("message.content")} for m in flat
            ]
        }
    if "gen_ai.prompt" in attrs:
        messages = _messages(attrs["gen_ai.prompt"])
        return {"messages": messages} if messages is not None else attrs["gen_ai.prompt"]
    if flat := _indexed(attrs, "gen_ai.prompt"):
        return {"messages": [{"role": m.get("role"), "content": m.get("content")} for m in flat]}
    return None


def _last_text(messages: list[Any]) -> Any:
    # The answer is the last message's text: a GenAI output lists one message per choice, and
    # a chat history ends with the reply.
    last = messages[-1] if messages else None
    return last.get("content") if isinstance(last, dict) else last


def _answer(attrs: Mapping[str, Any]) -> Any:
    if "output.value" in attrs:
        return _maybe_json(attrs["output.value"], attrs.get("output.mime_type"))
    if "gen_ai.output.messages" in attrs:
        messages = _messages(attrs["gen_ai.output.messages"])
        return _last_text(messages) if messages else attrs["gen_ai.output.messages"]
    if flat := _indexed(attrs, "llm.output_messages"):
        return flat[0].get("message.content")
    if "gen_ai.completion" in attrs:
        messages = _messages(attrs["gen_ai.completion"])
        return _last_text(messages) if messages else attrs["gen_ai.completion"]
    if flat := _indexed(attrs, "gen_ai.completion"):
        return flat[0].get("content")
    return None


def _documents(attrs: Mapping[str, Any]) -> tuple[Document, ...] | None:
    flat = _indexed(attrs, "retrieval.documents")
    if not flat:
        return None
    docs = []
    for d in flat:
        content = d.get("document.content")
        uri = d.get("document.id")
        if uri is None:
            metadata = d.get("document.metadata")
            if isinstance(metadata, str):
                try:
                    metadata = orjson.loads(metadata)
                except orjson.JSONDecodeError:
                    metadata = None
            if isinstance(metadata, dict):
                uri = metadata.get("doc_uri") or metadata.get("source")
        docs.append(
            Document(
                content if isinstance(content, str) else None,
                None if uri is None else str(uri),
            )
        )
    return tuple(docs)


# --- assembly (pure) -------------------------------------------------------------------------


def assemble(
    arrived: Iterable[Arrival],
    *,
    now: float,
    wait: float,
    origin: str,
    final: bool = False,
    done_before: Container[str] = frozenset(),
) -> Assembly:
    """Assemble every trace whose first part arrived at least `wait` seconds before `now`
    (every trace when `final`, e.g. at the end of a file); the rest stays pending.

    `origin` names the source (the topic or file) in the records made. `done_before` holds
    the traces already assembled or refused in an earlier batch: spans of theirs that arrive
    now (a Collector re-sending a batch, a span later than the wait) are refused at once, so
    that a trace is never judged twice.
    """
    by_trace: dict[str, list[Arrival]] = defaultdict(list)
    for a in arrived:
        by_trace[a.part.trace_id].append(a)
    records: list[SourceRecord] = []
    pending: list[Arrival] = []
    finished: set[str] = set()
    for trace_id, arrivals in by_trace.items():
        if trace_id in done_before:
            records.append(_refused(trace_id, arrivals, _late_reason(trace_id, arrivals), origin))
            continue
        if not final and now - min(a.seen for a in arrivals) < wait:
            pending.extend(arrivals)
            continue
        finished.add(trace_id)
        records.append(_trace_record(trace_id, arrivals, origin, wait))
    return Assembly(tuple(records), tuple(pending), frozenset(finished))


def _trace_record(
    trace_id: str, arrivals: Sequence[Arrival], origin: str, wait: float
) -> SourceRecord:
    """The event of one trace, or its refusal: whatever goes wrong with one trace refuses
    that trace, never the batch."""
    try:
        event, at = _event(trace_id, arrivals, wait)
        return SourceRecord(orjson.dumps(event), origin, at.partition, at.position)
    except InvalidEvent as exc:
        return _refused(trace_id, arrivals, exc.reason, origin)
    except Exception as exc:
        reason = f"trace {trace_id}: could not be assembled ({type(exc).__name__}: {exc})"
        return _refused(trace_id, arrivals, reason[:300], origin)


def _refused(trace_id: str, arrivals: Sequence[Arrival], reason: str, origin: str) -> SourceRecord:
    """The dead letter of a trace: its spans' ids, names and places, not their text."""
    first = min(arrivals, key=lambda a: (a.seen, a.partition or 0, a.position))
    summary = {"trace_id": trace_id, "spans": [_summary(a) for a in arrivals]}
    return SourceRecord(
        orjson.dumps(summary), origin, first.partition, first.position, refused=reason
    )


def _late_reason(trace_id: str, arrivals: Sequence[Arrival]) -> str:
    return (
        f"trace {trace_id}: {len(arrivals)} spans arrived after the trace was assembled or "
        "refused (a Collector retry, or spans later than --trace-assembly-wait); they are not "
        "judged again"
    )


def _summary(a: Arrival) -> dict[str, Any]:
    return {
        "span_id": a.part.span_id,
        "name": a.part.name,
        "kind": a.part.kind,
        "parent_span_id": a.part.parent_span_id,
        "partition": a.partition,
        "position": a.position,
    }


def _event(
    trace_id: str, arrivals: Sequence[Arrival], wait: float
) -> tuple[dict[str, Any], Arrival]:
    """The ragpulse event of one trace, and the arrival of its root (where it is attributed)."""
    by_span: dict[str, list[Arrival]] = defaultdict(list)
    for a in arrivals:
        by_span[a.part.span_id].append(a)
    spans: list[Arrival] = []
    for span_id, copies in by_span.items():
        if any(c.part != copies[0].part for c in copies[1:]):
            raise InvalidEvent(
                f"trace {trace_id}: span {span_id} arrived {len(copies)} times with different "
                "content; cannot tell which copy is right"
            )
        spans.append(copies[0])
    spans.sort(key=lambda a: (a.part.start_ns, a.part.span_id))
    roots = [a for a in spans if a.part.parent_span_id is None]
    names = ", ".join(f"{a.part.kind or '-'} {a.part.name!r:.40}" for a in spans)
    if not roots:
        raise InvalidEvent(
            f"trace {trace_id}: no root span arrived within {wait:g}s of its first span "
            f"(arrived: {names}); the rest of the trace was lost, or came earlier and was "
            "already judged without these spans"
        )
    if len(roots) > 1:
        raise InvalidEvent(f"trace {trace_id}: {len(roots)} root spans (spans without a parent)")
    root = roots[0]
    llms = [a.part for a in spans if a.part.kind == "LLM"]
    question = root.part.question
    if question is None:
        question = next((p.question for p in llms if p.question is not None), None)
    answer, answered_by = root.part.answer, root.part
    if answer is None:
        answered_by = next((p for p in reversed(llms) if p.answer is not None), root.part)
        answer = answered_by.answer
    if question is None or answer is None:
        missing = " and ".join(
            w for w, v in (("question", question), ("answer", answer)) if v is None
        )
        raise InvalidEvent(
            f"trace {trace_id}: no {missing} after waiting {wait:g}s: neither the root span "
            f"nor an LLM span carries one (arrived: {names})"
        )
    model = next((p.model for p in reversed(llms) if p.model), None) or next(
        (a.part.model for a in spans if a.part.model), None
    )
    event: dict[str, Any] = {
        "request_id": trace_id,
        "span_id": answered_by.span_id,
        "request": question,
        "response": answer,
        "timestamp": root.part.start_ns // 1_000_000,
        "app": root.part.service or next((a.part.service for a in spans if a.part.service), None),
        "model": model,
    }
    usage = _usage(root.part, llms)
    if usage:
        event["usage"] = usage
    session = root.part.session_id or next(
        (a.part.session_id for a in spans if a.part.session_id), None
    )
    if session:
        event["session_id"] = session
    if root.part.end_ns and root.part.end_ns >= root.part.start_ns:
        event["latency_seconds"] = (root.part.end_ns - root.part.start_ns) / 1e9
    tools = [a.part for a in spans if a.part.tool is not None]
    if tools:
        # Validated (and counted against the per-event limit) by parse_event.
        event["tool_calls"] = [_tool_call_field(p) for p in tools]
    retrievers = [a.part for a in spans if a.part.documents is not None]
    if retrievers:
        latest = retrievers[-1]
        for i, d in enumerate(latest.documents or ()):
            if d.content is None:
                raise InvalidEvent(
                    f"trace {trace_id}: retriever span {latest.name!r:.40} document {i} has no "
                    "retrieval.documents.N.document.content"
                )
        event["retrieved_context"] = [
            {"content": d.content, "doc_uri": d.doc_uri} for d in latest.documents or ()
        ]
    return event, root


def _tool_call_field(part: SpanPart) -> dict[str, Any]:
    """A TOOL span as an event's `tool_calls` item (pipeline.formats.events)."""
    tool = part.tool
    assert tool is not None
    field: dict[str, Any] = {
        "name": tool.name,
        "arguments": tool.arguments,
        "result": tool.result,
        "status": "error" if tool.failed else "ok",
        "span_id": part.span_id,
        "description": tool.description,
    }
    if tool.failed:
        field["error"] = tool.error
    return field
