"""Behaviour of the inference-log event model: every request/response/context/trace variant the
Agent Evaluation input schema allows, the production envelope, and each way a line can be bad."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from ragpulse.judges.base import Chunk, Guideline, Turn
from ragpulse.pipeline.formats.events import InvalidEvent, dead_letter, parse_event
from ragpulse.pipeline.records import AgentUsage, InferenceRecord

T0_ISO = "2024-05-01T12:00:00Z"
T0 = datetime(2024, 5, 1, 12, tzinfo=UTC).timestamp()
T0_MS = int(T0 * 1000)

_DROP = object()


def line(**fields: Any) -> bytes:
    """A valid event (string request and response, ISO timestamp) with fields replaced or
    dropped (`field=_DROP`)."""
    event: dict[str, Any] = {
        "request_id": "req-1",
        "timestamp": T0_ISO,
        "app": "helpdesk",
        "model": "rag-v3",
        "request": "How long are QP-1457 quality records kept?",
        "response": "They are kept for 10 years.",
    }
    for key, value in fields.items():
        if value is _DROP:
            event.pop(key, None)
        else:
            event[key] = value
    return orjson.dumps(event)


def reason_for(raw: bytes, **kwargs: Any) -> str:
    with pytest.raises(InvalidEvent) as caught:
        parse_event(raw, **kwargs)
    return caught.value.reason


MLFLOW2_TRACE = Path(__file__).parent / "samples" / "mlflow2_trace.json"
QUESTION = "How long are QP-1457 quality records kept?"
TRACE_ANSWER = "Per QP-1457, quality records are kept for 10 years after product release."


def mlflow2_trace() -> dict[str, Any]:
    """A RAG chain traced by MLflow 2.x (`Trace.to_dict()`, span attributes JSON-encoded as
    strings): a root chain answering QUESTION with TRACE_ANSWER, a first retrieval on the raw
    question, a second retrieval on a rewritten query, and the chat model call. The spans are
    listed out of chronological order (llm, second retrieval, root, first retrieval), as
    exporters may write them."""
    trace: dict[str, Any] = orjson.loads(MLFLOW2_TRACE.read_bytes())
    return trace


EXPECTED_TRACE_CHUNKS = (
    Chunk(
        "QP-1457: quality records are retained 10 years.",
        "https://docs.example/qp-1457#retention",
    ),
    Chunk("Retention starts at product release.", None),
)


def simple_trace(*spans: dict[str, Any]) -> dict[str, Any]:
    return {"spans": list(spans)}


# --- request ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_obj", "question", "history"),
    [
        pytest.param("What is RAG?", "What is RAG?", (), id="a plain string, no history"),
        pytest.param(
            {
                "messages": [
                    {"role": "system", "content": "Answer from the quality manual only."},
                    {"role": "user", "content": "Which procedure covers records?"},
                    {"role": "assistant", "content": "QP-1457."},
                    {"role": "user", "content": "How long does it keep them?"},
                    {"role": "tool", "content": "lookup result that comes after the question"},
                ]
            },
            "How long does it keep them?",
            (
                Turn("system", "Answer from the quality manual only."),
                Turn("user", "Which procedure covers records?"),
                Turn("assistant", "QP-1457."),
            ),
            id="chat: the last user message, earlier messages the history",
        ),
        pytest.param(
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "Look at this label."},
                            {"type": "image_url", "image_url": {"url": "https://img.example/1.png"}},
                            {"type": "text", "text": "Which procedure applies?"},
                        ],
                    }
                ]
            },
            "Look at this label.\nWhich procedure applies?",
            (),
            id="chat: text content parts joined",
        ),
        pytest.param(
            {
                "messages": [
                    {"role": "user", "content": "Find QP-1457."},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
                    {"role": "user", "content": "And its retention?"},
                ]
            },
            "And its retention?",
            (Turn("user", "Find QP-1457."),),
            id="chat: an assistant tool call without text left out of the history",
        ),
        pytest.param(
            {
                "query": "Explain broadcast variables in Spark.",
                "history": [
                    {"role": "user", "content": "What are broadcast variables?"},
                    {"role": "assistant", "content": "Read-only variables cached on each machine."},
                ],
            },
            "Explain broadcast variables in Spark.",
            (
                Turn("user", "What are broadcast variables?"),
                Turn("assistant", "Read-only variables cached on each machine."),
            ),
            id="query and history: the query, the history in order",
        ),
    ],
)
def test_each_request_shape_gives_its_question_and_the_history_before_it(
    request_obj: Any, question: str, history: tuple[Turn, ...]
) -> None:
    item = parse_event(line(request=request_obj)).judge_input
    assert item.question == question
    assert item.history == history


@pytest.mark.parametrize(
    ("request_obj", "question"),
    [
        (
            {"last_user_request": "ignored", "prompt": "from prompt", "input": "from input"},
            "from input",
        ),
        ({"content": "from content", "question": "from question"}, "from question"),
        ({"query": 12, "text": "from text"}, "from text"),
        ({"session": {"id": 4}, "content": "from content"}, "from content"),
    ],
)
def test_arbitrary_request_object_question_is_first_string_among_documented_keys(
    request_obj: dict[str, Any], question: str
) -> None:
    item = parse_event(line(request=request_obj)).judge_input
    assert item.question == question
    assert item.history == ()


def test_arbitrary_request_object_without_question_key_is_rejected_naming_the_keys() -> None:
    request = {"message_history": [], "last_user_request": "How can I minimize shuffling?"}
    reason = reason_for(line(request=request))
    for key in ("query", "question", "input", "prompt", "text", "content"):
        assert f"'{key}'" in reason
    assert "'request'" in reason


def test_chat_request_without_user_message_is_rejected() -> None:
    request = {"messages": [{"role": "system", "content": "Be brief."}]}
    assert reason_for(line(request=request)) == (
        "'request.messages' has no message with role 'user'"
    )


def test_chat_request_whose_messages_is_not_a_list_is_rejected() -> None:
    reason = reason_for(line(request={"messages": "hi"}))
    assert reason == "field 'request.messages' must be a list, not a string"


def test_chat_message_with_numeric_content_is_rejected_naming_the_message() -> None:
    request = {"messages": [{"role": "user", "content": "ok"}, {"role": "user", "content": 7}]}
    reason = reason_for(line(request=request))
    assert reason.startswith("field 'request.messages[1].content' must be a string or a list")
    assert reason.endswith("not a number")


def test_chat_message_without_role_is_rejected() -> None:
    request = {"messages": [{"content": "hello"}]}
    assert reason_for(line(request=request)) == "field 'request.messages[0].role' is missing"


def test_query_history_request_with_non_string_query_is_rejected() -> None:
    request = {"query": ["a"], "history": []}
    assert reason_for(line(request=request)) == (
        "field 'request.query' must be a string, not an array"
    )


def test_history_that_is_not_a_list_of_messages_is_rejected() -> None:
    request = {"query": "q", "history": [{"role": "user"}, "plain text"]}
    reason = reason_for(line(request=request))
    assert reason == "field 'request.history[1]' must be a JSON object, not a string"


@pytest.mark.parametrize("value", [42, 4.2, True, None, ["What is RAG?"]])
def test_request_of_wrong_type_is_rejected(value: Any) -> None:
    reason = reason_for(line(request=value))
    assert reason.startswith("field 'request' must be a string or a JSON object, not")


def test_missing_request_is_rejected() -> None:
    assert reason_for(line(request=_DROP)) == "field 'request' is missing"


@pytest.mark.parametrize(
    "request_obj",
    [
        "   ",
        {"messages": [{"role": "user", "content": ""}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        {"query": "\n", "history": []},
        {"question": ""},
    ],
)
def test_blank_question_is_rejected(request_obj: Any) -> None:
    assert reason_for(line(request=request_obj)).startswith("the question is empty")


# --- response --------------------------------------------------------------------------------


def test_plain_string_response_is_the_answer() -> None:
    assert parse_event(line(response="Ten years.")).judge_input.answer == "Ten years."


def test_chat_completion_response_answer_is_first_choice_content() -> None:
    response = {
        "id": "chatcmpl-1",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "First choice."}},
            {"index": 1, "message": {"role": "assistant", "content": "Second choice."}},
        ],
    }
    assert parse_event(line(response=response)).judge_input.answer == "First choice."


def test_chat_completion_response_with_content_parts_joins_text() -> None:
    response = {
        "choices": [
            {
                "message": {
                    "content": [{"type": "text", "text": "Ten"}, {"type": "text", "text": "years."}]
                }
            }
        ]
    }
    assert parse_event(line(response=response)).judge_input.answer == "Ten\nyears."


@pytest.mark.parametrize(
    ("response", "answer"),
    [
        ({"content": "from content", "output": "from output"}, "from content"),
        ({"response": "from response", "output": "from output"}, "from response"),
        ({"output": "from output", "metadata": {"latency_ms": 5}}, "from output"),
    ],
)
def test_response_object_answer_is_first_string_among_content_response_output(
    response: dict[str, Any], answer: str
) -> None:
    assert parse_event(line(response=response)).judge_input.answer == answer


def test_response_object_without_answer_is_rejected() -> None:
    reason = reason_for(line(response={"result": "Ten years."}))
    assert "'response'" in reason
    assert "'choices'" in reason and "'content'" in reason and "'output'" in reason


def test_chat_completion_with_no_choices_is_rejected() -> None:
    assert reason_for(line(response={"choices": []})) == "'response.choices' is empty"


def test_chat_completion_choice_without_message_is_rejected() -> None:
    reason = reason_for(line(response={"choices": [{"text": "legacy completion"}]}))
    assert reason == "field 'response.choices[0].message' is missing"


@pytest.mark.parametrize(
    "response",
    ["", "  \n", {"choices": [{"message": {"role": "assistant", "content": None}}]}],
)
def test_blank_answer_is_rejected(response: Any) -> None:
    assert reason_for(line(response=response)) == "the answer is empty"


@pytest.mark.parametrize("value", [3, ["Ten years."], False])
def test_response_of_wrong_type_is_rejected(value: Any) -> None:
    reason = reason_for(line(response=value))
    assert reason.startswith("field 'response' must be a string or a JSON object, not")


def test_event_without_response_or_trace_is_rejected() -> None:
    assert reason_for(line(response=_DROP)) == (
        "the event has neither 'response' nor 'trace'; one of them is required"
    )


def test_response_field_wins_over_trace_root_outputs() -> None:
    raw = line(response="Logged answer.", trace=mlflow2_trace())
    assert parse_event(raw).judge_input.answer == "Logged answer."


# --- retrieved context -----------------------------------------------------------------------


def test_retrieved_context_becomes_chunks_in_order_with_optional_doc_uri() -> None:
    context = [
        {"content": "QP-1457 section 4.", "doc_uri": "https://docs.example/qp-1457"},
        {"content": "Appendix B.", "score": 0.4},
        {"content": "Glossary.", "doc_uri": None},
    ]
    chunks = parse_event(line(retrieved_context=context)).judge_input.chunks
    assert chunks == (
        Chunk("QP-1457 section 4.", "https://docs.example/qp-1457"),
        Chunk("Appendix B.", None),
        Chunk("Glossary.", None),
    )


def test_event_without_retrieved_context_or_trace_is_valid_with_no_chunks() -> None:
    record = parse_event(line(retrieved_context=_DROP))
    assert record.judge_input.chunks == ()
    assert record.judge_input.answer == "They are kept for 10 years."


def test_retrieved_context_field_wins_over_trace_retriever() -> None:
    raw = line(retrieved_context=[{"content": "Logged chunk."}], trace=mlflow2_trace())
    assert parse_event(raw).judge_input.chunks == (Chunk("Logged chunk.", None),)


@pytest.mark.parametrize(
    ("context", "reason"),
    [
        ("QP-1457 section 4.", "field 'retrieved_context' must be a list, not a string"),
        (
            [{"doc_uri": "https://docs.example/x"}],
            "field 'retrieved_context[0].content' is missing",
        ),
        (
            [{"content": "ok"}, {"content": 5}],
            "field 'retrieved_context[1].content' must be a string, not a number",
        ),
        (
            [{"content": "ok", "doc_uri": 9}],
            "field 'retrieved_context[0].doc_uri' must be a string, not a number",
        ),
        (["plain chunk"], "field 'retrieved_context[0]' must be a JSON object, not a string"),
    ],
)
def test_malformed_retrieved_context_is_rejected_naming_the_field(
    context: Any, reason: str
) -> None:
    assert reason_for(line(retrieved_context=context)) == reason


# --- MLflow trace ----------------------------------------------------------------------------


def test_mlflow2_trace_gives_root_answer_and_chunks_of_latest_retriever() -> None:
    item = parse_event(line(response=_DROP, trace=mlflow2_trace())).judge_input
    assert item.answer == TRACE_ANSWER
    assert item.chunks == EXPECTED_TRACE_CHUNKS
    assert item.question == "How long are QP-1457 quality records kept?"


def test_mlflow2_trace_given_as_json_string_reads_the_same() -> None:
    as_string = orjson.dumps(mlflow2_trace()).decode()
    item = parse_event(line(response=_DROP, trace=as_string)).judge_input
    assert item.answer == TRACE_ANSWER
    assert item.chunks == EXPECTED_TRACE_CHUNKS


def test_trace_fills_only_the_missing_retrieved_context_when_response_is_given() -> None:
    item = parse_event(line(response="Logged answer.", trace=mlflow2_trace())).judge_input
    assert item.answer == "Logged answer."
    assert item.chunks == EXPECTED_TRACE_CHUNKS


def test_simple_trace_without_start_times_uses_last_listed_retriever() -> None:
    trace = simple_trace(
        {
            "name": "agent",
            "span_id": "a",
            "span_type": "AGENT",
            "inputs": {"q": "x"},
            "outputs": "Ten years, per QP-1457.",
        },
        {
            "name": "search_1",
            "span_id": "b",
            "parent_id": "a",
            "span_type": "RETRIEVER",
            "outputs": [{"page_content": "older hit", "metadata": {"doc_uri": "u1"}}],
        },
        {
            "name": "search_2",
            "span_id": "c",
            "parent_id": "a",
            "span_type": "RETRIEVER",
            "outputs": [{"page_content": "newer hit", "metadata": {"doc_uri": "u2"}}],
        },
    )
    item = parse_event(line(response=_DROP, trace=trace)).judge_input
    assert item.answer == "Ten years, per QP-1457."
    assert item.chunks == (Chunk("newer hit", "u2"),)


def test_simple_trace_under_data_spans_with_ns_start_times_picks_latest_retriever() -> None:
    trace = {
        "data": {
            "spans": [
                {
                    "name": "late",
                    "span_id": "c",
                    "parent_id": "a",
                    "span_type": "RETRIEVER",
                    "start_time_ns": 1_714_564_800_000_000_900,
                    "outputs": [{"page_content": "late hit"}],
                },
                {
                    "name": "early",
                    "span_id": "b",
                    "parent_id": "a",
                    "span_type": "RETRIEVER",
                    "start_time_ns": 1_714_564_800_000_000_100,
                    "outputs": [{"page_content": "early hit"}],
                },
                {
                    "name": "root",
                    "span_id": "a",
                    "parent_id": None,
                    "outputs": {"output": "Ten years."},
                },
            ]
        }
    }
    item = parse_event(line(response=_DROP, trace=trace)).judge_input
    assert item.answer == "Ten years."
    assert item.chunks == (Chunk("late hit", None),)


@pytest.mark.parametrize(
    ("outputs", "answer"),
    [
        ({"response": "From response key."}, "From response key."),
        ({"content": "From content key."}, "From content key."),
        ({"choices": [{"message": {"content": "From completion."}}]}, "From completion."),
    ],
)
def test_trace_root_outputs_shapes_give_the_answer(outputs: Any, answer: str) -> None:
    trace = simple_trace({"name": "root", "span_type": "CHAIN", "outputs": outputs})
    assert parse_event(line(response=_DROP, trace=trace)).judge_input.answer == answer


def test_trace_without_retriever_span_gives_no_chunks() -> None:
    trace = simple_trace({"name": "root", "span_type": "CHAIN", "outputs": "Ten years."})
    assert parse_event(line(response=_DROP, trace=trace)).judge_input.chunks == ()


def test_retriever_span_with_null_outputs_gives_no_chunks() -> None:
    trace = simple_trace(
        {"name": "root", "span_id": "a", "outputs": "Ten years."},
        {
            "name": "search",
            "span_id": "b",
            "parent_id": "a",
            "span_type": "RETRIEVER",
            "outputs": None,
        },
    )
    assert parse_event(line(response=_DROP, trace=trace)).judge_input.chunks == ()


def test_trace_without_root_span_is_rejected() -> None:
    trace = simple_trace({"name": "orphan", "span_id": "b", "parent_id": "a", "outputs": "x"})
    reason = reason_for(line(response=_DROP, trace=trace))
    assert reason == "no 'response' and the trace has no root span (a span without 'parent_id')"


def test_trace_root_span_without_outputs_is_rejected() -> None:
    trace = simple_trace({"name": "rag_chain", "span_type": "CHAIN"})
    reason = reason_for(line(response=_DROP, trace=trace))
    assert reason == "no 'response' and the trace root span 'rag_chain' has no outputs"


def test_retriever_documents_without_page_content_are_rejected_naming_the_span() -> None:
    trace = mlflow2_trace()
    second = trace["data"]["spans"][1]
    second["attributes"]["mlflow.spanOutputs"] = orjson.dumps([{"text": "x"}]).decode()
    reason = reason_for(line(response=_DROP, trace=trace))
    assert reason == (
        "field 'trace retriever span 'retrieve_docs_rewritten' outputs[0].page_content' is missing"
    )


@pytest.mark.parametrize(
    ("trace", "reason_start"),
    [
        ("{not json", "field 'trace' is a string but not valid JSON"),
        ("[1, 2]", "field 'trace' must hold a JSON object, not an array"),
        ({"info": {}}, "field 'trace' has no spans"),
        ({"data": {"spans": "none"}}, "field 'trace.data.spans' must be a list, not a string"),
        ({"spans": [{"name": 5}]}, "field 'trace.spans[0].name' must be a string, not a number"),
        (7, "field 'trace' must be a string or a JSON object, not a number"),
    ],
)
def test_malformed_trace_is_rejected_when_it_is_needed(trace: Any, reason_start: str) -> None:
    assert reason_for(line(response=_DROP, trace=trace)).startswith(reason_start)


def test_unneeded_trace_is_not_read_when_response_context_and_tool_calls_are_given() -> None:
    raw = line(retrieved_context=[], tool_calls=[], trace="{not json")
    item = parse_event(raw).judge_input
    assert item.answer == "They are kept for 10 years."
    assert item.chunks == ()
    # Without `tool_calls` the trace is read for its tool spans, so a broken one is refused.
    reason = reason_for(line(retrieved_context=[], trace="{not json"))
    assert reason.startswith("field 'trace' is a string but not valid JSON")


# --- event time ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("timestamp", "expected"),
    [
        ("2024-05-01T12:00:00Z", T0),
        ("2024-05-01T14:00:00+02:00", T0),
        ("2024-05-01T12:00:00", T0),
        ("2024-05-01 12:00:00.250", T0 + 0.25),
        (T0_MS, T0),
        (T0_MS + 1500.0, T0 + 1.5),
    ],
)
def test_timestamp_iso_or_epoch_ms_gives_event_time_in_utc_seconds(
    timestamp: Any, expected: float
) -> None:
    assert parse_event(line(timestamp=timestamp)).event_time == pytest.approx(expected, abs=1e-6)


def test_timestamp_without_zone_is_utc_whatever_the_local_zone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert parse_event(line(timestamp="2024-05-01T12:00:00")).event_time == T0
    finally:
        monkeypatch.undo()
        time.tzset()


def test_missing_timestamp_uses_the_source_record_time() -> None:
    assert parse_event(line(timestamp=_DROP), record_time=T0 + 7).event_time == T0 + 7
    assert parse_event(line(timestamp=None), record_time=T0 + 8).event_time == T0 + 8


def test_event_timestamp_wins_over_record_time() -> None:
    assert parse_event(line(timestamp=T0_ISO), record_time=T0 + 99).event_time == T0


def test_missing_timestamp_without_record_time_is_rejected() -> None:
    assert reason_for(line(timestamp=_DROP)) == (
        "no event time: the event has no 'timestamp' and its source gives no record time"
    )


def test_implausible_record_time_is_rejected() -> None:
    reason = reason_for(line(timestamp=_DROP), record_time=-0.001)
    assert reason.startswith("no event time:")
    assert "2000" in reason


def test_unparsable_timestamp_string_is_rejected_quoting_it() -> None:
    assert reason_for(line(timestamp="yesterday")) == (
        "'timestamp' is not ISO 8601 or epoch milliseconds: 'yesterday'"
    )


@pytest.mark.parametrize(
    ("timestamp", "when"), [(int(T0), "before 2000"), (T0_MS * 1000, "after 2100")]
)
def test_epoch_seconds_or_microseconds_are_rejected_as_unit_mistakes(
    timestamp: int, when: str
) -> None:
    reason = reason_for(line(timestamp=timestamp))
    assert when in reason
    assert "milliseconds" in reason


def test_iso_timestamp_before_2000_is_rejected() -> None:
    reason = reason_for(line(timestamp="1970-01-20T00:00:00Z"))
    assert reason == "'timestamp' '1970-01-20T00:00:00Z' is not between 2000 and 2100"


def test_boolean_timestamp_is_rejected() -> None:
    reason = reason_for(line(timestamp=True))
    assert reason.startswith("field 'timestamp' must be a string or")
    assert reason.endswith("not a boolean")


# --- request_id ------------------------------------------------------------------------------


def test_request_id_string_is_kept_and_integer_is_converted() -> None:
    assert parse_event(line(request_id="abc-9")).request_id == "abc-9"
    assert parse_event(line(request_id=12345678901234)).request_id == "12345678901234"


@pytest.mark.parametrize("value", [_DROP, None, "  "])
def test_missing_request_id_is_sha256_prefix_of_the_stripped_line(value: Any) -> None:
    raw = line(request_id=value)
    expected = "sha256:" + hashlib.sha256(raw).hexdigest()[:16]
    assert parse_event(raw).request_id == expected
    # The same event read as a file line (with newline) gets the same id.
    assert parse_event(raw + b"\n").request_id == expected


def test_derived_request_ids_differ_between_events() -> None:
    a = parse_event(line(request_id=_DROP, response="Ten years.")).request_id
    b = parse_event(line(request_id=_DROP, response="Eleven years.")).request_id
    assert a != b


@pytest.mark.parametrize("value", [1.5, True, ["id"], {"id": 1}])
def test_request_id_of_wrong_type_is_rejected(value: Any) -> None:
    assert reason_for(line(request_id=value)).startswith("field 'request_id' must be a string or")


# --- app / model -----------------------------------------------------------------------------


def test_app_and_model_are_stripped_labels() -> None:
    record = parse_event(line(app="  helpdesk ", model="rag-v3\n"))
    assert (record.app, record.model) == ("helpdesk", "rag-v3")


@pytest.mark.parametrize("value", [_DROP, None, "   "])
def test_absent_null_or_blank_app_and_model_are_unknown(value: Any) -> None:
    record = parse_event(line(app=value, model=value))
    assert (record.app, record.model) == ("unknown", "unknown")


def test_label_of_128_characters_is_accepted_and_129_rejected() -> None:
    assert parse_event(line(model="m" * 128)).model == "m" * 128
    assert reason_for(line(model="m" * 129)) == (
        "field 'model' is 129 characters, over the 128-character limit (it becomes a metric label)"
    )
    assert reason_for(line(app="a" * 300)).startswith("field 'app' is 300 characters")


def test_non_string_app_is_rejected() -> None:
    assert reason_for(line(app=3)) == "field 'app' must be a string, not a number"


# --- session_id ------------------------------------------------------------------------------


def test_session_id_is_stripped_and_absent_null_or_blank_means_no_conversation() -> None:
    assert parse_event(line(session_id=" conv-42\n")).session_id == "conv-42"
    for value in (_DROP, None, "  "):
        assert parse_event(line(session_id=value)).session_id is None


def test_session_id_of_256_characters_is_accepted_and_257_rejected() -> None:
    assert parse_event(line(session_id="s" * 256)).session_id == "s" * 256
    assert reason_for(line(session_id="s" * 257)) == (
        "field 'session_id' is 257 characters, over the 256-character limit (it names a"
        " conversation)"
    )
    assert reason_for(line(session_id=7)) == "field 'session_id' must be a string, not a number"


# --- expected_* and guidelines ---------------------------------------------------------------


def test_expected_fields_and_guidelines_of_schema_types_are_accepted() -> None:
    record = parse_event(
        line(
            expected_response="Ten years.",
            expected_facts=["10 years", "QP-1457"],
            guidelines={"english": ["The response must be in English"]},
            expected_retrieved_context=[{"doc_uri": "https://docs.example/qp-1457"}],
        )
    )
    assert record.judge_input.answer == "They are kept for 10 years."
    assert parse_event(line(guidelines=["The response must be concise"])).request_id == "req-1"


def test_the_ground_truth_of_the_schema_reaches_the_judges() -> None:
    item = parse_event(
        line(
            expected_response="Ten years.",
            expected_facts=["10 years", "QP-1457"],
            guidelines={"english": ["The response must be in English"], "tone": ["Be calm"]},
            expected_retrieved_context=[
                {"doc_uri": "https://docs.example/qp-1457"},
                {"doc_uri": "docs/b.md", "content": "Records: 10 years."},
            ],
        )
    ).judge_input
    assert item.expected_response == "Ten years."
    assert item.expected_facts == ("10 years", "QP-1457")
    assert item.expected_chunks == (
        Chunk("", "https://docs.example/qp-1457"),
        Chunk("Records: 10 years.", "docs/b.md"),
    )
    assert item.guidelines == (
        Guideline("english", ("The response must be in English",)),
        Guideline("tone", ("Be calm",)),
    )
    listed = parse_event(line(guidelines=["Be concise"])).judge_input.guidelines
    assert listed == (Guideline("guidelines", ("Be concise",)),)
    bare = parse_event(line()).judge_input
    assert (bare.expected_response, bare.expected_facts, bare.expected_chunks, bare.guidelines) == (
        None, (), (), ()
    )


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"expected_response": 10}, "field 'expected_response' must be a string, not a number"),
        ({"expected_facts": "10 years"}, "field 'expected_facts' must be a list, not a string"),
        ({"expected_facts": ["ok", 3]}, "field 'expected_facts[1]' must be a string, not a number"),
        (
            {"guidelines": {"tone": "formal"}},
            "field 'guidelines.tone' must be a list, not a string",
        ),
        ({"guidelines": 5}, "field 'guidelines' must be a list or a JSON object, not a number"),
        (
            {"guidelines": {"user 42/tone": ["Be calm"]}},
            "guideline name 'user 42/tone' is not 1-64 letters, digits, _ . - (it becomes a "
            "metric label)",
        ),
        (
            {"expected_retrieved_context": [{"content": "c"}]},
            "field 'expected_retrieved_context[0].doc_uri' is missing",
        ),
    ],
)
def test_expected_fields_of_wrong_type_are_rejected(fields: dict[str, Any], reason: str) -> None:
    assert reason_for(line(**fields)) == reason


# --- malformed lines -------------------------------------------------------------------------


def test_non_utf8_line_is_rejected_with_byte_position() -> None:
    raw = b'{"request": "caf\xe9", "response": "a"}'
    assert reason_for(raw) == "line is not valid UTF-8 (invalid continuation byte at position 16)"


def test_invalid_json_is_rejected() -> None:
    assert reason_for(b'{"request": "q", "response": ').startswith("line is not valid JSON (")


@pytest.mark.parametrize("raw", [b"", b"  \n"])
def test_empty_line_is_rejected(raw: bytes) -> None:
    assert reason_for(raw) == "line is empty"


@pytest.mark.parametrize(
    ("raw", "kind"),
    [
        (b'[{"request": "q"}]', "an array"),
        (b"42", "a number"),
        (b'"q"', "a string"),
        (b"null", "null"),
    ],
)
def test_json_that_is_not_an_object_is_rejected(raw: bytes, kind: str) -> None:
    assert reason_for(raw) == f"event must be a JSON object, not {kind}"


def test_ten_megabyte_line_is_rejected_before_parsing() -> None:
    # Valid JSON, so only the size check can reject it.
    padding = "x" * (10 * 1024 * 1024)
    raw = line(response=padding)
    assert reason_for(raw) == f"line is {len(raw)} bytes, over the 1048576-byte limit"


def test_size_limit_is_inclusive_and_configurable() -> None:
    raw = line()
    assert parse_event(raw, max_bytes=len(raw)).request_id == "req-1"
    assert reason_for(raw, max_bytes=len(raw) - 1) == (
        f"line is {len(raw)} bytes, over the {len(raw) - 1}-byte limit"
    )


def test_validation_reason_is_one_short_sentence_not_a_pydantic_report() -> None:
    reason = reason_for(line(request=5, response=6, timestamp=[1], app={}))
    assert "\n" not in reason
    assert len(reason) < 120
    assert "pydantic" not in reason and "errors.pydantic.dev" not in reason
    assert reason.startswith("field '")


def test_unknown_top_level_fields_are_ignored() -> None:
    record = parse_event(line(status_code=200, databricks_request_id="x"))
    assert record.request_id == "req-1"


def test_record_is_frozen() -> None:
    record = parse_event(line())
    assert isinstance(record, InferenceRecord)
    with pytest.raises(dataclasses.FrozenInstanceError):
        record.app = "other"  # type: ignore[misc]


# --- dead letters ----------------------------------------------------------------------------


def test_dead_letter_truncates_raw_text_and_keeps_reason_and_origin() -> None:
    raw = b"x" * 10_000
    row = dead_letter(raw, source="events.jsonl", position=41, reason="line is not valid JSON")
    assert row == {
        "source": "events.jsonl",
        "position": 41,
        "reason": "line is not valid JSON",
        "raw": "x" * 2000,
        "raw_truncated": True,
        "raw_bytes": 10_000,
    }


def test_dead_letter_keeps_short_line_whole_and_escapes_bytes_that_are_not_utf8() -> None:
    raw = b'{"request": "caf\xe9 \xc3\xa9"}'
    row = dead_letter(raw, source="kafka:events/0", position=7, reason="bad", max_raw_chars=100)
    assert row["raw"] == '{"request": "caf\\xe9 é"}'
    assert row["raw_truncated"] is False
    assert row["raw_bytes"] == len(raw)
    assert orjson.loads(orjson.dumps(row)) == row


def test_dead_letter_of_rejected_ten_megabyte_line_carries_parse_reason() -> None:
    raw = line(response="é" * (5 * 1024 * 1024))
    with pytest.raises(InvalidEvent) as caught:
        parse_event(raw)
    row = dead_letter(raw, source="s", position=0, reason=caught.value.reason, max_raw_chars=50)
    assert row["reason"] == caught.value.reason
    assert row["raw"] == raw[:50].decode()
    assert row["raw_truncated"] is True
    assert row["raw_bytes"] == len(raw) > 10_000_000


def test_a_span_name_with_line_breaks_gives_a_one_line_reason_cut_to_a_readable_length() -> None:
    # Found by tests/test_fuzz_events.py: the root span's name went into the reason verbatim.
    name = "root\nFAKE LOG LINE " + "x" * 10_000
    raw = orjson.dumps({"request": "q", "timestamp": 1_736_931_600_000,
                        "trace": {"spans": [{"name": name, "span_type": "CHAIN"}]}})
    with pytest.raises(InvalidEvent) as caught:
        parse_event(raw)
    assert "\n" not in caught.value.reason
    assert "has no outputs" in caught.value.reason and len(caught.value.reason) < 300


# --- the chatbot's own usage and latency ---------------------------------------------------


def test_usage_and_latency_are_read_from_the_event_or_its_chat_completion() -> None:
    event = parse_event(line(usage={"input_tokens": 900, "output_tokens": 60},
                             latency_seconds=1.5))
    assert (event.usage, event.latency_seconds) == (AgentUsage(900, 60, 960), 1.5)
    completion = {"choices": [{"message": {"role": "assistant", "content": "Paris."}}],
                  "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}}
    event = parse_event(line(response=completion))
    assert (event.usage, event.latency_seconds) == (AgentUsage(12, 3, 15), None)
    assert parse_event(line()).usage is None


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"usage": {"input_tokens": -1}}, "field 'usage.input_tokens' must be >= 0, not -1"),
        ({"usage": {"input_tokens": "12"}},
         "field 'usage.input_tokens' must be an integer, not a string"),
        ({"latency_seconds": -0.5}, "field 'latency_seconds' must be a number >= 0, not -0.5"),
        ({"response": {"choices": [{"message": {"content": "a"}}], "usage": {"total_tokens": 1.5}}},
         "field 'response.usage.total_tokens' must be an integer, not a number"),
    ],
)
def test_malformed_usage_or_latency_is_rejected_naming_the_field(
    fields: dict[str, Any], reason: str
) -> None:
    assert reason_for(line(**fields)) == reason


@pytest.mark.parametrize(
    "digits", ["18446744073709551616", "-18446744073709551616", "1" + "0" * 30]
)
def test_a_timestamp_of_2_to_the_64_or_more_is_refused_without_quoting_a_float(
    digits: str,
) -> None:
    raw = b'{"request": "q", "response": "a", "timestamp": ' + digits.encode() + b"}"
    with pytest.raises(InvalidEvent, match=r"20 or more digits \(at least 2\^64\)") as caught:
        parse_event(raw)
    assert "e+" not in str(caught.value)


def nested(depth: int) -> str:
    return '{"a": ' * depth + "1" + "}" * depth


@pytest.mark.parametrize(
    "where",
    [
        '"tool_calls": [{"name": "f", "arguments": %s}]',
        '"trace": {"spans": [{"name": "s", "attributes": {"k": %s}}]}',
        '"metadata": %s',
    ],
    ids=["tool-arguments", "trace", "metadata"],
)
def test_valid_json_nested_500_deep_is_refused_naming_the_depth_limit(where: str) -> None:
    raw = ('{"request": "q", "response": "a", "timestamp": 1700000000000, ' + where + "}") % (
        nested(500),
    )
    with pytest.raises(InvalidEvent) as caught:
        parse_event(raw.encode())
    assert str(caught.value) == "line is nested deeper than 64 levels of JSON arrays and objects"


def test_a_deep_json_document_inside_a_trace_string_is_refused_naming_the_trace() -> None:
    trace = '{"spans": [{"name": "s", "inputs": ' + nested(500) + "}]}"  # orjson cannot write it
    event = {"request": "q", "trace": trace, "timestamp": 1700000000000}
    with pytest.raises(InvalidEvent, match="field 'trace' is nested deeper than 64 levels"):
        parse_event(orjson.dumps(event))


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = "[" * 200 + '\\"{' * 100
    raw = b'{"request": "q", "response": "' + text.encode() + b'", "timestamp": 1700000000000}'
    assert parse_event(raw).judge_input.answer.startswith("[[[")
