"""What the tool judges add to the judge bill, on `ragpulse simulate` traffic, without a server.

For docs/judges.md (cost of the tool judges): simulates N events (default seed 0, 30 % of
answers with 1-3 tool calls), parses them like `ragpulse run` does, and for each event builds
the chat messages every LLM judge would send (the panel skips a judge whose required input is
missing, so the tool judges send nothing for an answer without tool calls). Counts the calls
per answer and the prompt tokens per call with bench_peers.py's `approx_tokens` (close to
cl100k for English). tool_call_errors is deterministic: no call. A second or two.

    .venv/bin/python tests/bench/bench_tool_judges_cost.py [N]
"""

from __future__ import annotations

import statistics
import sys

from bench_peers import approx_tokens

from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.fencing import new_nonce
from ragpulse.judges.llm.judge import LLMJudge
from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event
from ragpulse.pipeline.records import InferenceRecord

DEFAULT = ["groundedness", "safety", "relevance_to_query"]
TOOLS = ["tool_call_errors", "tool_selection", "tool_arguments"]


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    events: list[InferenceRecord] = []
    for simulated in simulate(0, n, 1_736_931_600.0):
        try:
            events.append(parse_event(simulated.payload))
        except InvalidEvent:
            continue
    endpoint = OpenAIJudgeEndpoint(base_url="http://127.0.0.1:9/v1", api_key="bench")
    judges = build_llm_judges(DEFAULT + TOOLS, endpoint)
    calls: dict[str, int] = dict.fromkeys(DEFAULT + TOOLS, 0)
    tokens: dict[str, list[int]] = {name: [] for name in DEFAULT + TOOLS}
    for event in events:
        for judge in judges:
            if not isinstance(judge, LLMJudge):
                continue  # tool_call_errors: deterministic, no call
            if judge.entry.verdict_if_missing(event.judge_input) is not None:
                continue  # skipped: no call
            calls[judge.name] += 1
            messages = judge.messages(event.judge_input, new_nonce())
            tokens[judge.name].append(sum(approx_tokens(m["content"]) for m in messages))
    with_tools = sum(1 for e in events if e.tool_calls)
    base = sum(calls[j] for j in DEFAULT) / len(events)
    added = sum(calls[j] for j in TOOLS) / len(events)
    print(f"{len(events)} simulated answers, {with_tools} ({with_tools / len(events):.0%}) "
          "with tool calls")
    print("| judge | calls per answer | prompt tokens per call (median) |")
    print("|---|---|---|")
    for name in DEFAULT + TOOLS:
        median = f"{statistics.median(tokens[name]):,.0f}" if tokens[name] else "-"
        print(f"| {name} | {calls[name] / len(events):.2f} | {median} |")
    print(f"| default judges | {base:.2f} | |")
    print(f"| default + tool judges | {base + added:.2f} (+{added / base:.0%}) | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
