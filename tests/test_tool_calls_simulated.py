"""`ragpulse simulate` traffic with tool calls: a share of answers carry 1-3 calls (as the
event's field and as MLflow TOOL spans), adding them changed no other field, and the "a tool
starts failing" incident shows in the tool_call_errors judge's verdicts."""

from __future__ import annotations

import json
from typing import Any

from ragpulse.judges.local.tool_calls import ToolCallErrorsJudge
from ragpulse.pipeline.commands.simulate import TOOLS, Incidents, simulate
from ragpulse.pipeline.formats.events import parse_event

T0 = 1_736_931_600.0  # 2025-01-15T09:00:00Z


def without_tools(payload: bytes) -> dict[str, Any]:
    event: dict[str, Any] = json.loads(payload)
    event.pop("tool_calls", None)
    trace = event.get("trace")
    if trace is not None:
        trace = json.loads(trace) if isinstance(trace, str) else trace
        trace["data"]["spans"] = [
            s for s in trace["data"]["spans"]
            if json.loads(s["attributes"]["mlflow.spanType"]) != "TOOL"
        ]
        event["trace"] = trace
    return event


def test_a_share_of_answers_carry_one_to_three_tool_calls_in_both_shapes() -> None:
    events = list(simulate(3, 1000, T0))
    with_tools = [e for e in events if e.tool_calls]
    assert 0.25 < len(with_tools) / len(events) < 0.35
    shapes = set()
    for event in with_tools:
        parsed = parse_event(event.payload)
        assert len(parsed.tool_calls) == event.tool_calls
        assert 1 <= len({c.name for c in parsed.tool_calls}) <= 3
        assert {c.name for c in parsed.tool_calls} <= set(TOOLS)
        shapes.add("trace" if "trace" in json.loads(event.payload) else "field")
    assert shapes == {"trace", "field"}
    assert all(parse_event(e.payload).tool_calls == () for e in events if not e.tool_calls)


def test_tool_calls_change_no_other_field_of_any_event() -> None:
    plain = [without_tools(e.payload) for e in simulate(9, 300, T0,
                                                        incidents=Incidents(tool_call_share=0))]
    with_tools = [without_tools(e.payload) for e in simulate(9, 300, T0)]
    assert plain == with_tools


def test_a_failing_tool_turns_tool_call_errors_from_mostly_yes_to_mostly_no() -> None:
    incidents = Incidents(tool_failure_at=500, tool_recover_at=1000, failing_tool="get_document")
    judge = ToolCallErrorsJudge()
    ratings: dict[str, list[str]] = {"before": [], "during": [], "after": []}
    for event in simulate(4, 1500, T0, incidents=incidents):
        if not event.tool_calls:
            continue
        offset = event.event_time - T0
        phase = "before" if offset < 500 else ("during" if offset < 1000 else "after")
        verdict = judge.grade(parse_event(event.payload).judge_input)
        # The failing tool's calls are named; healthy traffic has only transient errors.
        failing = "HTTP 503 from get_document" in (verdict.rationale or "")
        assert failing == (phase == "during" and "get_document" in event.payload.decode())
        ratings[phase].append(verdict.rating)
    share = {p: r.count("yes") / len(r) for p, r in ratings.items()}
    assert share["before"] > 0.9 and share["after"] > 0.9
    assert share["during"] < 0.5
