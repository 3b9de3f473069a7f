"""Tool call errors: did every tool the agent called work, and did the agent stop repeating one
that failed?

Deterministic (no model), from the status of each call (the event's `tool_calls`, or its
trace's tool spans: pipeline.formats.events). "no" when a call failed; the rationale names each
failed call and each call the agent repeated with the same name and arguments after it had failed
(the loop MLflow's ToolCallEfficiency and Datadog's tool error checks look for), so that a
reader sees which tool broke without opening the trace. "yes" when every call worked. An event
without tool calls is skipped (judges.registry).
"""

from __future__ import annotations

import orjson

from ragpulse.judges.base import JudgeInput, Rating, ToolCall
from ragpulse.judges.local.judge import LocalJudge

# Calls named in a rationale, at most; the rest are counted.
_NAMED = 3
_SHOWN_ARGUMENTS = 80


def same_arguments_key(call: ToolCall) -> tuple[str, str | None]:
    """What makes two calls "the same call": the tool name and the arguments, compared as JSON
    values when they parse (key order and spacing do not matter), else as text."""
    if call.arguments is None:
        return call.name, None
    try:
        value = orjson.loads(call.arguments)
    except orjson.JSONDecodeError:
        return call.name, call.arguments.strip()
    return call.name, orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def _described(number: int, call: ToolCall) -> str:
    arguments = (call.arguments or "").replace("\n", " ")
    if len(arguments) > _SHOWN_ARGUMENTS:
        arguments = arguments[:_SHOWN_ARGUMENTS] + "…"
    return f"call {number} {call.name}({arguments})"


def _listed(items: list[str]) -> str:
    more = f" and {len(items) - _NAMED} more" if len(items) > _NAMED else ""
    return "; ".join(items[:_NAMED]) + more


class ToolCallErrorsJudge(LocalJudge):
    """`tool_call_errors`: "yes" when every tool call worked, else "no" naming the calls."""

    name = "tool_call_errors"

    def decide(self, item: JudgeInput) -> tuple[Rating, str]:
        calls = item.tool_calls
        failed: list[str] = []
        repeated: list[str] = []
        failed_keys: dict[tuple[str, str | None], int] = {}
        for number, call in enumerate(calls, start=1):
            key = same_arguments_key(call)
            if key in failed_keys:
                repeated.append(
                    f"{_described(number, call)} repeats call {failed_keys[key]}, which failed"
                )
            if call.status == "error":
                reason = f": {call.error.strip()[:120]}" if call.error else ""
                failed.append(f"{_described(number, call)} failed{reason}")
                failed_keys.setdefault(key, number)
        if not failed:
            return "yes", f"all {len(calls)} tool call(s) worked."
        rationale = f"{len(failed)} of {len(calls)} tool call(s) failed: {_listed(failed)}."
        if repeated:
            rationale += (
                f" Repeated with the same arguments after failing: {_listed(repeated)}."
            )
        return "no", rationale
