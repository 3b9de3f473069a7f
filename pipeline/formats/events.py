"""Inference-log events: one JSON object per chatbot answer, turned into what the judges read.

For whoever writes the chatbot's logger, and for the pipeline stages that read its stream.
An event is the Databricks Agent Evaluation input schema plus a production envelope:

    request_id, request, response, retrieved_context, expected_response, expected_facts,
    guidelines, expected_retrieved_context, trace          (Agent Evaluation input schema)
    timestamp, app, model, feedback, usage, latency_seconds, session_id (envelope)

`parse_event` validates one raw line/record and returns an `InferenceRecord`, or raises
`InvalidEvent` whose `reason` says what to fix; `dead_letter` turns a rejected line into a row
for the dead-letter output. Unknown top-level fields are ignored.

Rules
-----
Size and encoding: the line is rejected before parsing when it is over `max_bytes` (1 MiB by
default); it must be UTF-8 JSON whose top level is an object.

`request` (required), giving the question and the earlier turns (`history`):
  * a string: the question; no history.
  * `{"messages": [{"role", "content"}, ...]}` (OpenAI chat): the question is the LAST message
    with role "user"; the messages before it are the history, in order. Messages after it (e.g.
    tool results) are not read. `content` is a string or a list of content parts, whose
    "text"/"input_text"/"output_text" parts are joined with newlines; a history message without
    text (an assistant tool call) is left out of the history.
  * `{"query": str, "history": [messages]}` (SplitChatMessagesRequest): question = query.
  * any other object: the question is the first string value among the keys
    "query", "question", "input", "prompt", "text", "content" (in that order); no history.
    Without one the event is rejected, naming those keys.

`response`, giving the answer: a string; a chat completion `{"choices": [{"message":
{"content": ...}}]}` (first choice); or an object with a string "content", "response" or
"output" (first of those). When `response` is absent or null, the answer is the outputs of the
`trace` root span (the first span without a parent), read by the same rule. An event with neither
`response` nor `trace` is rejected. The question and the answer must not be blank.

`retrieved_context`, giving the chunks: `[{"content": str, "doc_uri": str (optional)}]`. When
absent or null and a `trace` is given, the chunks are the documents (`[{"page_content": str,
"metadata": {"doc_uri": str}}]`) output by the trace's LAST retriever span (latest start time when
every retriever span has one, else the last listed). With neither, the event has no chunks: it is
still valid, and counted as an answer without retrieved context.

`trace` is an MLflow trace, as an object or a JSON string of one. Both the MLflow 2.x serialized
form (`{"info", "data": {"spans": [...]}}`, span type/inputs/outputs in the JSON-encoded
attributes "mlflow.spanType"/"mlflow.spanInputs"/"mlflow.spanOutputs", parent in "parent_id")
and a simpler form (`{"spans": [...]}` or `data.spans`, spans carrying "span_type", "inputs" and
"outputs" directly) are read. The trace is only read when `response`, `retrieved_context` or
`tool_calls` is missing, so a trace that is not needed is not validated.

`tool_calls`, the tools the chatbot's agent called while answering, in call order (optional):
`[{"name": str, "arguments": JSON text or object, "result": text or any JSON value, "status":
"ok" | "error", "error": str, "span_id": str, "description": str}]`; only `name` is required,
`status` defaults to "ok", `error` (why the call failed) is allowed only with status "error",
`description` says what the tool does (the tool_arguments judge reads it). Objects are kept as
JSON text. Unknown keys are rejected (a misspelt "args" would otherwise vanish). When absent or
null and a `trace` is given, the calls are the trace's TOOL spans in start order: name = the
span's name, arguments = its inputs, result = its outputs, failed when its status is ERROR
(MLflow 2.x `status_code`, MLflow 3 `status.code`, "STATUS_CODE_ERROR" too), the error being
the status message, else its "exception" event's exception.message. Bounds: at most
MAX_TOOL_CALLS (32) calls per event, else the event is rejected; a name of at most 256
characters; arguments, result, error and description are cut at MAX_TOOL_TEXT_CHARS (4000)
characters, the cut text ending "… [cut: N characters in all]". The tool judges read them
(tool_call_errors, tool_selection, tool_arguments); an event without tool calls skips them.

`timestamp`, giving the event time: an ISO 8601 string (no zone means UTC) or epoch
MILLISECONDS as a number. When absent or null, `record_time` (the source's record time, epoch
seconds, e.g. the Kafka record timestamp) is used; with neither the event is rejected. Times
before 2000 or from 2100 on are rejected: they are nearly always a unit mistake (epoch seconds
or microseconds where milliseconds are expected).

`request_id`: a string, or an integer turned into a string. When absent, null or blank it is
derived from the event itself: "sha256:" + the first 16 hex digits of the SHA-256 of the raw
bytes with surrounding whitespace removed, so the same event always gets the same id (and the
same sampling decision), whether it arrived as a file line or a Kafka record.

`span_id`: the OpenTelemetry span id (16 hex digits) of the span that gave the answer, set by
the trace assembler (pipeline/formats/otlp.py) along with the trace id as `request_id`; with it,
serve's
--evaluation-events-endpoint links each verdict to that span. Optional; a span id that is not
16 hex digits is rejected.

`app`, `model`: strings naming the chatbot and its model/version; absent, null or blank means
"unknown". They become Prometheus label values, so they are stripped and must be at most 128
characters.

`feedback`: the user's feedback on the answer as one string (e.g. "negative", "thumbs_down"),
as the chatbot recorded it; absent, null or blank means none. ragpulse judges do not read it:
stratified sampling rules match on it (pipeline/costs/sampling.py), e.g. to judge every answer a
user disliked. Stripped, at most 128 characters.

`session_id`: the conversation this turn belongs to (optional), as the chatbot names it: every
turn of one conversation carries the same id. A string, stripped; absent, null or blank means
the turn belongs to no conversation (it is judged per answer only). At most 256 characters. The
session judges group turns by it in event-time session windows (docs/sessions.md); it is never a
metric label. From an OpenTelemetry trace it is the `session.id` (OpenInference) or
`gen_ai.conversation.id` (GenAI) attribute (pipeline/formats/otlp.py).

`usage`, the chatbot's own token counts for this answer (optional): `{"input_tokens",
"output_tokens", "total_tokens"}`, or OpenAI's `{"prompt_tokens", "completion_tokens",
"total_tokens"}`, each a whole number >= 0 and any of them may be left out (a missing total is
input + output). When the event has no `usage`, the `usage` of a `response` given as a chat
completion is read. `latency_seconds`, the time the chatbot took to answer (optional), a
number >= 0. Both are exported per app and model (ragpulse_agent_*_tokens_total,
ragpulse_agent_latency_seconds) for every accepted event, sampled or not; an event from an
OpenTelemetry trace gets them from its spans (pipeline/formats/otlp.py).

`expected_response`, `expected_facts`, `guidelines`, `expected_retrieved_context`: the ground
truth of the Agent Evaluation schema, validated for type and handed to the judges that read it
(correctness, context_sufficiency, document_recall, guideline_adherence; judges/registry.py).
`guidelines` is a list of rules (one set, named "guidelines", graded as one verdict) or an
object naming lists of rules, `{"english": [...], "clarity": [...]}`, each name graded as a
verdict of its own (its name becomes the `guideline` label: letters, digits, `_ . -`, at most
64 characters, else the event is rejected); `expected_retrieved_context` items need
`doc_uri`, `content` is optional. Giving both
`expected_response` and `expected_facts` is not rejected here: the judges that read the expected
answer rate such an event `error` (the schema allows one of the two).
"""

from __future__ import annotations

import hashlib
import math
import re
from datetime import UTC, datetime
from typing import Any, Literal, NotRequired, TypeVar

import orjson
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError, with_config
from typing_extensions import TypedDict

from ragpulse.judges.base import (
    GUIDELINE_NAME,
    LIST_GUIDELINES,
    Chunk,
    Guideline,
    JudgeInput,
    ToolCall,
    Turn,
)
from ragpulse.pipeline.records import AgentUsage, InferenceRecord

__all__ = [
    "MAX_TOOL_CALLS",
    "MAX_TOOL_TEXT_CHARS",
    "InvalidEvent",
    "bound_tool_text",
    "dead_letter",
    "parse_event",
]

DEFAULT_MAX_BYTES = 1_048_576
UNKNOWN = "unknown"
MAX_LABEL_CHARS = 128
MAX_SESSION_ID_CHARS = 256
QUESTION_KEYS = ("query", "question", "input", "prompt", "text", "content")
ANSWER_KEYS = ("content", "response", "output")
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})

# Plausible event times, epoch seconds: [2000-01-01, 2100-01-01).
MIN_EVENT_TIME = 946_684_800.0
MAX_EVENT_TIME = 4_102_444_800.0
# JSON nested deeper than this is refused with that reason: real events nest a few levels, and
# past 254 levels encoding a tool call's arguments again failed as "TypeError: Recursion limit
# reached" (the dead letter's reason), past 1024 the reader's own limit.
MAX_JSON_DEPTH = 64
_JSON_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_JSON_BRACKETS = re.compile(rb"[\[\]{}]")
# Values quoted back in reasons are cut so a reason stays one readable line.
_QUOTE_CHARS = 60
# Bounds on an event's tool calls (see `tool_calls` in the module docstring): an agent stuck
# in a loop must not make one event a prompt of megabytes, nor a serve state file hold it.
MAX_TOOL_CALLS = 32
MAX_TOOL_TEXT_CHARS = 4000
MAX_TOOL_NAME_CHARS = 256
_T = TypeVar("_T")


class InvalidEvent(Exception):
    """An event that cannot be judged; `reason` is a sentence a person can act on."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# --- boundary shapes (pydantic, validated strictly by `_validated`) --------------------------


class _ContextChunk(TypedDict):
    content: str
    doc_uri: NotRequired[str | None]


class _ExpectedChunk(TypedDict):
    content: NotRequired[str | None]
    doc_uri: str


class _Envelope(BaseModel):
    model_config = ConfigDict(frozen=True)

    request_id: str | int | None = None
    request: str | dict[str, Any]
    response: str | dict[str, Any] | None = None
    retrieved_context: list[_ContextChunk] | None = None
    expected_response: str | None = None
    expected_facts: list[str] | None = None
    guidelines: list[str] | dict[str, list[str]] | None = None
    expected_retrieved_context: list[_ExpectedChunk] | None = None
    trace: str | dict[str, Any] | None = None
    timestamp: str | int | float | None = None
    app: str | None = None
    model: str | None = None
    feedback: str | None = None
    span_id: str | None = None
    usage: _Usage | None = None
    latency_seconds: int | float | None = None
    tool_calls: list[_ToolCallField] | None = None
    session_id: str | None = None


# Unknown keys are refused: a misspelt "args" or "output" would otherwise vanish.
@with_config(ConfigDict(extra="forbid"))
class _ToolCallField(TypedDict):
    name: str
    arguments: NotRequired[str | dict[str, Any] | None]
    result: NotRequired[Any]  # text, or any JSON value (kept as JSON text)
    status: NotRequired[Literal["ok", "error"] | None]
    error: NotRequired[str | None]
    span_id: NotRequired[str | None]
    description: NotRequired[str | None]


class _Usage(TypedDict, total=False):
    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None
    prompt_tokens: int | None
    completion_tokens: int | None


class _ContentPart(TypedDict):
    type: str
    text: NotRequired[str]


class _Message(TypedDict):
    role: str
    content: NotRequired[str | list[_ContentPart] | None]


class _ChatMessage(TypedDict):
    content: NotRequired[str | list[_ContentPart] | None]


class _Choice(TypedDict):
    message: _ChatMessage


class _ChatCompletion(TypedDict):
    choices: list[_Choice]


class _SpanContext(TypedDict, total=False):
    span_id: str
    trace_id: str


class _Span(TypedDict, total=False):
    name: str
    context: _SpanContext
    span_id: str
    parent_id: str | None
    parent_span_id: str | None
    # Integers kept as integers: nanosecond times do not fit a float exactly.
    start_time: int | float
    start_time_ns: int | float
    start_time_unix_nano: int | float
    span_type: str
    attributes: dict[str, Any]
    inputs: Any
    outputs: Any
    # Read of TOOL spans only (so a span of another type is not held to them): MLflow 2.x
    # "status_code"/"status_message", MLflow 3 "status": {"code", "message"}, and "events"
    # (an "exception" event says why a call failed).
    status_code: Any
    status_message: Any
    status: Any
    events: Any


class _TraceData(TypedDict):
    spans: list[_Span]


class _Trace(TypedDict, total=False):
    info: dict[str, Any]
    data: _TraceData
    spans: list[_Span]


class _DocMetadata(TypedDict, total=False):
    doc_uri: str | None


class _Document(TypedDict):
    page_content: str
    metadata: NotRequired[_DocMetadata | None]


_ENVELOPE = TypeAdapter(_Envelope)
_MESSAGES = TypeAdapter(list[_Message])
_CHAT_COMPLETION = TypeAdapter(_ChatCompletion)
_USAGE = TypeAdapter(_Usage | None)
_TRACE = TypeAdapter(_Trace)
_DOCUMENTS = TypeAdapter(list[_Document] | None)


# --- public API ------------------------------------------------------------------------------


def parse_event(
    raw: bytes, *, record_time: float | None = None, max_bytes: int = DEFAULT_MAX_BYTES
) -> InferenceRecord:
    """Validate one inference-log event and extract what the judges read.

    `record_time` is the source's own time for the record (epoch seconds), used when the event
    has no `timestamp`. Raises `InvalidEvent` with a reason; see the module docstring for rules.
    """
    if len(raw) > max_bytes:
        raise InvalidEvent(f"line is {len(raw)} bytes, over the {max_bytes}-byte limit")
    data = _load_json_object(raw)
    env = _validated(_ENVELOPE, data)

    question, history = _question_and_history(env.request)
    # The trace is read only for what the event's own fields leave out.
    from_trace = None in (env.response, env.retrieved_context, env.tool_calls)
    trace = _trace_spans(env.trace) if env.trace is not None and from_trace else None
    if env.response is not None:
        answer = _answer_from(env.response, "response")
    elif trace is not None:
        answer = _answer_from_trace(trace)
    else:
        raise InvalidEvent("the event has neither 'response' nor 'trace'; one of them is required")
    if not answer.strip():
        raise InvalidEvent("the answer is empty")

    if env.retrieved_context is not None:
        chunks = tuple(Chunk(c["content"], c.get("doc_uri")) for c in env.retrieved_context)
    else:
        chunks = _chunks_from_trace(trace) if trace is not None else ()

    if env.tool_calls is not None:
        tool_calls = _tool_calls(env.tool_calls)
    else:
        tool_calls = _tool_calls_from_trace(trace) if trace is not None else ()

    return InferenceRecord(
        request_id=_request_id(env.request_id, raw),
        event_time=_event_time(env.timestamp, record_time),
        app=_label(env.app, "app"),
        model=_label(env.model, "model"),
        judge_input=JudgeInput(
            question=question,
            answer=answer,
            chunks=chunks,
            history=history,
            expected_response=env.expected_response,
            expected_facts=tuple(env.expected_facts or ()),
            expected_chunks=tuple(
                Chunk(c.get("content") or "", c["doc_uri"])
                for c in env.expected_retrieved_context or ()
            ),
            guidelines=_guidelines(env.guidelines),
            tool_calls=tool_calls,
        ),
        feedback=_feedback(env.feedback),
        span_id=_span_id(env.span_id),
        usage=_usage(env.usage, env.response),
        latency_seconds=_latency(env.latency_seconds),
        session_id=_session_id(env.session_id),
    )


def dead_letter(
    raw: bytes, *, source: str, position: int, reason: str, max_raw_chars: int = 2000
) -> dict[str, Any]:
    """A dead-letter row for a rejected line: where it came from, why, and (the start of) it.

    `raw` is decoded with backslash escapes for bytes that are not UTF-8, so the row is always
    valid JSON text; it is cut to `max_raw_chars` characters (`raw_truncated`, `raw_bytes` tell).
    """
    # A character takes at most 4 bytes (an escaped byte takes 1), so this prefix holds the first
    # max_raw_chars characters; decoding it alone keeps a 10 MB line cheap.
    prefix = raw[: 4 * max_raw_chars]
    text = prefix.decode("utf-8", errors="backslashreplace")
    truncated = len(text) > max_raw_chars or len(prefix) < len(raw)
    return {
        "source": source,
        "position": position,
        "reason": reason,
        "raw": text[:max_raw_chars],
        "raw_truncated": truncated,
        "raw_bytes": len(raw),
    }


# --- parsing steps (pure functions) ----------------------------------------------------------


def _load_json_object(raw: bytes) -> dict[str, Any]:
    try:
        data = _bounded_json(raw, "line")
    except orjson.JSONDecodeError as exc:
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as uexc:
            raise InvalidEvent(
                f"line is not valid UTF-8 ({uexc.reason} at position {uexc.start})"
            ) from None
        if not raw.strip():
            raise InvalidEvent("line is empty") from None
        raise InvalidEvent(f"line is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise InvalidEvent(f"event must be a JSON object, not {_json_type(data)}")
    return data


def _guidelines(value: list[str] | dict[str, list[str]] | None) -> tuple[Guideline, ...]:
    if value is None:
        return ()
    if isinstance(value, list):
        return (Guideline(LIST_GUIDELINES, tuple(value)),)
    for name in value:
        if not GUIDELINE_NAME.fullmatch(name):
            raise InvalidEvent(
                f"guideline name {name[:40]!r} is not 1-64 letters, digits, _ . - "
                "(it becomes a metric label)"
            )
    return tuple(Guideline(name, tuple(rules)) for name, rules in value.items())


def _question_and_history(request: str | dict[str, Any]) -> tuple[str, tuple[Turn, ...]]:
    history: tuple[Turn, ...] = ()
    if isinstance(request, str):
        question, where = request, "'request'"
    elif "messages" in request:
        messages = _messages(request["messages"], "request.messages")
        last_user = next(
            (i for i in range(len(messages) - 1, -1, -1) if messages[i]["role"] == "user"), None
        )
        if last_user is None:
            raise InvalidEvent("'request.messages' has no message with role 'user'")
        question = _text(messages[last_user].get("content"))
        history = _turns(messages[:last_user])
        where = f"the last user message, 'request.messages[{last_user}]'"
    elif "query" in request and "history" in request:
        query = request["query"]
        if not isinstance(query, str):
            raise InvalidEvent(f"field 'request.query' must be a string, not {_json_type(query)}")
        question, where = query, "'request.query'"
        history = _turns(_messages(request["history"], "request.history"))
    else:
        key = next((k for k in QUESTION_KEYS if isinstance(request.get(k), str)), None)
        if key is None:
            keys = ", ".join(f"'{k}'" for k in QUESTION_KEYS)
            raise InvalidEvent(
                "cannot find the question in 'request': it has no 'messages' list and no string"
                f" value under any of the keys {keys}"
            )
        question, where = request[key], f"'request.{key}'"
    if not question.strip():
        raise InvalidEvent(f"the question is empty ({where})")
    return question, history


def _messages(value: Any, where: str) -> list[_Message]:
    return _validated(_MESSAGES, value, where)


def _turns(messages: list[_Message]) -> tuple[Turn, ...]:
    turns = (Turn(m["role"], _text(m.get("content"))) for m in messages)
    # An assistant message that only calls tools has no text for a judge to read.
    return tuple(t for t in turns if t.content)


def _text(content: str | list[_ContentPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n".join(p["text"] for p in content if p["type"] in TEXT_PART_TYPES and "text" in p)


def _answer_from(value: Any, where: str) -> str:
    """The answer in a response or a root span's outputs (string, chat completion, or object)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        if "choices" in value:
            completion = _validated(_CHAT_COMPLETION, value, where)
            if not completion["choices"]:
                raise InvalidEvent(f"'{where}.choices' is empty")
            return _text(completion["choices"][0]["message"].get("content"))
        for key in ANSWER_KEYS:
            if isinstance(value.get(key), str):
                return str(value[key])
        keys = ", ".join(f"'{k}'" for k in ANSWER_KEYS)
        raise InvalidEvent(
            f"cannot find the answer in '{where}': it has no 'choices' list and no string value"
            f" under any of the keys {keys}"
        )
    raise InvalidEvent(f"'{where}' must be a string or a JSON object, not {_json_type(value)}")


def _trace_spans(trace: str | dict[str, Any]) -> list[_Span]:
    if isinstance(trace, str):
        try:
            trace = _bounded_json(trace, "field 'trace'")
        except orjson.JSONDecodeError as exc:
            raise InvalidEvent(f"field 'trace' is a string but not valid JSON ({exc})") from None
        if not isinstance(trace, dict):
            raise InvalidEvent(f"field 'trace' must hold a JSON object, not {_json_type(trace)}")
    parsed = _validated(_TRACE, trace, "trace")
    if "data" in parsed:
        return parsed["data"]["spans"]
    if "spans" in parsed:
        return parsed["spans"]
    raise InvalidEvent("field 'trace' has no spans (looked for 'data.spans' and 'spans')")


def _span_type(span: _Span) -> str | None:
    if "span_type" in span:
        return span["span_type"]
    kind = _attribute(span, "mlflow.spanType")
    return kind if isinstance(kind, str) else None


def _span_outputs(span: _Span) -> Any:
    if "outputs" in span:
        return span["outputs"]
    return _attribute(span, "mlflow.spanOutputs")


def _attribute(span: _Span, key: str) -> Any:
    """An MLflow span attribute; MLflow stores each as a JSON-encoded string."""
    value = span.get("attributes", {}).get(key)
    if isinstance(value, str):
        try:
            return _bounded_json(value, f"span attribute '{key}'")
        except orjson.JSONDecodeError:
            return value  # written unencoded by a hand-rolled logger: take it as it is
    return value


def _span_name(span: _Span, index: int) -> str:
    # Quoted and cut by _quote: the name is the logger's text and the reason lands in log lines.
    return _quote(str(span["name"])) if "name" in span else f"#{index}"


def _is_root(span: _Span) -> bool:
    return span.get("parent_id") is None and span.get("parent_span_id") is None


def _start_time(span: _Span) -> float | None:
    for key in ("start_time_ns", "start_time_unix_nano", "start_time"):
        if key in span:
            return span[key]
    return None


def _answer_from_trace(spans: list[_Span]) -> str:
    root = next(((i, s) for i, s in enumerate(spans) if _is_root(s)), None)
    if root is None:
        raise InvalidEvent(
            "no 'response' and the trace has no root span (a span without 'parent_id')"
        )
    index, span = root
    outputs = _span_outputs(span)
    if outputs is None:
        raise InvalidEvent(
            f"no 'response' and the trace root span {_span_name(span, index)} has no outputs"
        )
    return _answer_from(outputs, f"trace root span {_span_name(span, index)} outputs")


def _chunks_from_trace(spans: list[_Span]) -> tuple[Chunk, ...]:
    retrievers = [(i, s) for i, s in enumerate(spans) if _span_type(s) == "RETRIEVER"]
    if not retrievers:
        return ()
    starts = [_start_time(s) for _, s in retrievers]
    if all(t is not None for t in starts):
        # Latest start wins; ties keep the listed order (max returns the first maximum).
        pick = max(range(len(retrievers)), key=lambda k: (starts[k], k))
    else:
        pick = len(retrievers) - 1
    index, span = retrievers[pick]
    outputs = _span_outputs(span)
    where = f"trace retriever span {_span_name(span, index)} outputs"
    documents = _validated(_DOCUMENTS, outputs, where)
    if documents is None:  # the retriever failed before returning anything
        return ()
    return tuple(
        Chunk(d["page_content"], (d.get("metadata") or {}).get("doc_uri")) for d in documents
    )


def bound_tool_text(text: str) -> str:
    """`text` cut to at most MAX_TOOL_TEXT_CHARS characters, the cut said at its end with the
    full length (so two texts cut alike but of different lengths stay different); a text
    within the bound, or cut already, comes back unchanged."""
    if len(text) <= MAX_TOOL_TEXT_CHARS:
        return text
    marker = f"… [cut: {len(text)} characters in all]"
    return text[: MAX_TOOL_TEXT_CHARS - len(marker)] + marker


def _json_text(value: Any) -> str | None:
    """A tool's arguments or result as text: a string as it is, other JSON values encoded."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _tool_call(
    name: str,
    arguments: Any,
    result: Any,
    failed: bool,
    error: str | None,
    span_id: str | None,
    description: str | None,
    where: str,
) -> ToolCall:
    name = name.strip()
    if not name:
        raise InvalidEvent(f"{where} has no tool name")
    if len(name) > MAX_TOOL_NAME_CHARS:
        raise InvalidEvent(
            f"{where} tool name is {len(name)} characters, over the {MAX_TOOL_NAME_CHARS}-"
            "character limit"
        )
    if span_id is not None and len(span_id) > 64:
        raise InvalidEvent(f"{where} span_id is over 64 characters: {_quote(span_id)}")
    args, output = _json_text(arguments), _json_text(result)
    return ToolCall(
        name=name,
        arguments=None if args is None else bound_tool_text(args),
        result=None if output is None else bound_tool_text(output),
        status="error" if failed else "ok",
        error=bound_tool_text(error) if failed and error and error.strip() else None,
        span_id=span_id,
        description=bound_tool_text(description) if description and description.strip() else None,
    )


def _too_many_tool_calls(count: int, where: str) -> InvalidEvent:
    return InvalidEvent(
        f"{where} holds {count} tool calls, over the {MAX_TOOL_CALLS}-call limit per event"
    )


def _tool_calls(fields: list[_ToolCallField]) -> tuple[ToolCall, ...]:
    if len(fields) > MAX_TOOL_CALLS:
        raise _too_many_tool_calls(len(fields), "field 'tool_calls'")
    calls = []
    for i, f in enumerate(fields):
        where = f"'tool_calls[{i}]'"
        failed = f.get("status") == "error"
        if f.get("error") is not None and not failed:
            raise InvalidEvent(
                f"{where} gives an 'error' but its status is not \"error\" (set \"status\": "
                "\"error\" for a failed call)"
            )
        calls.append(
            _tool_call(
                f["name"], f.get("arguments"), f.get("result"), failed, f.get("error"),
                f.get("span_id"), f.get("description"), where,
            )
        )
    return tuple(calls)


def _span_inputs(span: _Span) -> Any:
    if "inputs" in span:
        return span["inputs"]
    return _attribute(span, "mlflow.spanInputs")


_MLFLOW_STATUSES = frozenset({"OK", "ERROR", "UNSET"})


def _mlflow_status(span: _Span, where: str) -> tuple[bool, str | None]:
    """Whether an MLflow span failed, and its message: MLflow 2.x `status_code` and
    `status_message`, or MLflow 3 `status` {"code", "message"} (or a bare code)."""
    status = span.get("status")
    code: Any
    message: Any
    if "status_code" in span:
        code, message = span["status_code"], span.get("status_message")
    elif isinstance(status, dict):
        code, message = status.get("code"), status.get("message")
    else:
        code, message = status, None
    if code is None:
        return False, None
    plain = code.upper().removeprefix("STATUS_CODE_") if isinstance(code, str) else None
    if plain not in _MLFLOW_STATUSES:
        raise InvalidEvent(f"{where} status {code!r:.40} is not OK, ERROR or UNSET")
    if message is not None and not isinstance(message, str):
        raise InvalidEvent(f"{where} status message must be a string, not {_json_type(message)}")
    failed = plain == "ERROR"
    if failed and not (message and message.strip()):
        message = _exception_message(span.get("events"))
    return failed, message


def _exception_message(events: Any) -> str | None:
    """The message of a span's first "exception" event (its type when it has none)."""
    for event in events if isinstance(events, list) else ():
        if isinstance(event, dict) and event.get("name") == "exception":
            attrs = event.get("attributes")
            attrs = attrs if isinstance(attrs, dict) else {}
            for key in ("exception.message", "exception.type"):
                text = attrs.get(key)
                if isinstance(text, str) and text.strip():
                    return text
    return None


def _tool_calls_from_trace(spans: list[_Span]) -> tuple[ToolCall, ...]:
    """The TOOL spans of an MLflow trace as tool calls, in start order (listed order when a
    span has no start time)."""
    tools = [(i, s) for i, s in enumerate(spans) if _span_type(s) == "TOOL"]
    if len(tools) > MAX_TOOL_CALLS:
        raise _too_many_tool_calls(len(tools), "field 'trace'")
    starts = [_start_time(s) for _, s in tools]
    if all(t is not None for t in starts):
        tools = [tools[k] for k in sorted(range(len(tools)), key=lambda k: (starts[k], k))]
    calls = []
    for index, span in tools:
        where = f"trace tool span {_span_name(span, index)}"
        failed, message = _mlflow_status(span, where)
        context = span.get("context") or {}
        span_id = span.get("span_id") or context.get("span_id")
        calls.append(
            _tool_call(
                span.get("name", ""), _span_inputs(span), _span_outputs(span), failed, message,
                span_id, None, where,
            )
        )
    return tuple(calls)


def _event_time(timestamp: str | int | float | None, record_time: float | None) -> float:
    if timestamp is None:
        if record_time is None:
            raise InvalidEvent(
                "no event time: the event has no 'timestamp' and its source gives no record time"
            )
        if not MIN_EVENT_TIME <= record_time < MAX_EVENT_TIME:
            raise InvalidEvent(
                "no event time: the event has no 'timestamp' and its source record time"
                f" {record_time!r} is not between 2000 and 2100"
            )
        return float(record_time)
    if isinstance(timestamp, str):
        try:
            moment = datetime.fromisoformat(timestamp)
        except ValueError:
            raise InvalidEvent(
                f"'timestamp' is not ISO 8601 or epoch milliseconds: {_quote(timestamp)}"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        seconds = moment.timestamp()
        if not MIN_EVENT_TIME <= seconds < MAX_EVENT_TIME:
            raise InvalidEvent(f"'timestamp' {_quote(timestamp)} is not between 2000 and 2100")
        return seconds
    if isinstance(timestamp, float) and abs(timestamp) >= 2.0**64:
        # The JSON reader gives an integer beyond 64 bits as a float: quoting that float
        # (1.8446744073709552e+19) would misquote the event, so say what it is instead.
        raise InvalidEvent(
            "'timestamp' is a number of 20 or more digits (at least 2^64), far beyond any epoch"
            " milliseconds: a numeric timestamp must be epoch milliseconds"
        )
    seconds = timestamp / 1000.0
    if not MIN_EVENT_TIME <= seconds < MAX_EVENT_TIME:
        year = "before 2000" if seconds < MIN_EVENT_TIME else "after 2100"
        raise InvalidEvent(
            f"'timestamp' {timestamp!r} read as epoch milliseconds is {year}: a numeric"
            " timestamp must be epoch milliseconds (not seconds or microseconds)"
        )
    return seconds


def _request_id(value: str | int | None, raw: bytes) -> str:
    if isinstance(value, int):
        return str(value)
    if value is not None and value.strip():
        return value
    return "sha256:" + hashlib.sha256(raw.strip()).hexdigest()[:16]


def _feedback(value: str | None) -> str | None:
    feedback = (value or "").strip()
    if len(feedback) > MAX_LABEL_CHARS:
        raise InvalidEvent(
            f"field 'feedback' is {len(feedback)} characters, over the {MAX_LABEL_CHARS}-character"
            " limit (it is a short label such as 'negative', matched by sampling rules)"
        )
    return feedback or None
def _usage(value: _Usage | None, response: Any) -> AgentUsage | None:
    """The event's `usage`, else its chat-completion response's; None when neither says."""
    where = "usage"
    if value is None and isinstance(response, dict) and "choices" in response:
        value = _validated(_USAGE, response.get("usage"), "response.usage")
        where = "response.usage"
    if value is None:
        return None
    counts: list[int | None] = []
    for names in (("input_tokens", "prompt_tokens"), ("output_tokens", "completion_tokens"),
                  ("total_tokens",)):
        n = next((value[k] for k in names if value.get(k) is not None), None)
        if n is not None and n < 0:
            raise InvalidEvent(f"field '{where}.{names[0]}' must be >= 0, not {n}")
        counts.append(n)
    given, taken, total = counts
    if total is None and given is not None and taken is not None:
        total = given + taken
    if given is None and taken is None and total is None:
        return None
    return AgentUsage(given, taken, total)


def _latency(value: float | None) -> float | None:
    if value is None:
        return None
    if not 0 <= value < math.inf:
        raise InvalidEvent(f"field 'latency_seconds' must be a number >= 0, not {value!r}")
    return float(value)


def _session_id(value: str | None) -> str | None:
    session = (value or "").strip()
    if len(session) > MAX_SESSION_ID_CHARS:
        raise InvalidEvent(
            f"field 'session_id' is {len(session)} characters, over the"
            f" {MAX_SESSION_ID_CHARS}-character limit (it names a conversation)"
        )
    return session or None


def _span_id(value: str | None) -> str | None:
    if value is None:
        return None
    if len(value) != 16 or any(c not in "0123456789abcdef" for c in value.lower()):
        raise InvalidEvent(f"field 'span_id' must be 16 hex digits, not {_quote(value)}")
    return value.lower()


def _label(value: str | None, field: str) -> str:
    if value is None:
        return UNKNOWN
    label = value.strip()
    if not label:
        return UNKNOWN
    if len(label) > MAX_LABEL_CHARS:
        raise InvalidEvent(
            f"field '{field}' is {len(label)} characters, over the {MAX_LABEL_CHARS}-character"
            " limit (it becomes a metric label)"
        )
    return label


# --- reasons ---------------------------------------------------------------------------------

_EXPECTED = {
    "string_type": "a string",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "list_type": "a list",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
    "none_required": "null",
}


def _validated(adapter: TypeAdapter[_T], data: Any, prefix: str = "") -> _T:
    """`data` in `adapter`'s shape, validated strictly (a number is not silently a string);
    InvalidEvent names the field at fault, under `prefix`."""
    try:
        return adapter.validate_python(data, strict=True)
    except ValidationError as exc:
        raise InvalidEvent(_validation_reason(exc, data, prefix)) from None


def _validation_reason(exc: ValidationError, data: Any, prefix: str = "") -> str:
    """One short sentence naming the field at fault, instead of pydantic's full report."""
    errors = exc.errors(include_url=False, include_context=False)
    located = [(_concrete_path(data, e["loc"], e["type"] == "missing"), e) for e in errors]
    # The deepest path is the most specific problem; union members failing at the same path
    # are merged into one "must be X or Y".
    path, first = max(located, key=lambda pe: len(pe[0]))
    name = _format_path(prefix, path)
    if first["type"] == "missing":
        return f"field '{name}' is missing"
    expected: list[str] = []
    for p, e in located:
        if p == path and e["type"] in _EXPECTED and _EXPECTED[e["type"]] not in expected:
            expected.append(_EXPECTED[e["type"]])
    if expected:
        return f"field '{name}' must be {' or '.join(expected)}, not {_json_type(first['input'])}"
    return f"field '{name}' is invalid: {first['msg']}"


def _concrete_path(data: Any, loc: tuple[int | str, ...], missing: bool) -> tuple[int | str, ...]:
    """The part of a pydantic error location that names real keys and indexes in `data`.

    Pydantic puts the name of each union member it tried into the location ('str',
    'dict[str,any]', ...); those are not in the data, so walking the data drops them.
    """
    path: list[int | str] = []
    current = data
    for i, step in enumerate(loc):
        in_dict = isinstance(current, dict) and step in current
        if in_dict or (isinstance(current, list) and isinstance(step, int) and step < len(current)):
            current = current[step]
            path.append(step)
        elif missing and i == len(loc) - 1:
            path.append(step)  # the missing key itself
    return tuple(path)


def _format_path(prefix: str, path: tuple[int | str, ...]) -> str:
    out = prefix
    for step in path:
        out += f"[{step}]" if isinstance(step, int) else (f".{step}" if out else step)
    return out or "event"


def _bounded_json(text: bytes | str, where: str) -> Any:
    """`text` read as JSON (orjson.JSONDecodeError when it is not), refused with InvalidEvent
    when nested deeper than MAX_JSON_DEPTH: two regular-expression passes over the valid JSON,
    then one step per bracket."""
    data = orjson.loads(text)
    raw = text.encode() if isinstance(text, str) else text
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH:
        depth = 0
        for bracket in _JSON_BRACKETS.findall(_JSON_STRINGS.sub(b"", raw)):
            depth += 1 if bracket in b"[{" else -1
            if depth > MAX_JSON_DEPTH:
                raise InvalidEvent(
                    f"{where} is nested deeper than {MAX_JSON_DEPTH} levels of JSON arrays and"
                    " objects"
                )
    return data


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _quote(text: str) -> str:
    if len(text) > _QUOTE_CHARS:
        text = text[:_QUOTE_CHARS] + "…"
    return repr(text)
