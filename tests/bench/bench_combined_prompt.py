"""Prompt tokens of `--judge-combine` against three separate calls, without a server.

For reviewing the combined prompt (judges/llm/combined.py): builds, for each of bench_peers.py's
200 records, the chat messages the three default judges send separately and the one combined
call sends, and counts their tokens with bench_peers.py's `approx_tokens` (what its stand-in
counts), so the figures compare with that benchmark's prompt tok/record column. No HTTP, no
peer libraries: a second or two.

    .venv/bin/python tests/bench/bench_combined_prompt.py
"""

from __future__ import annotations

import statistics
import sys

from bench_peers import _ragpulse_inputs, approx_tokens, make_records

from ragpulse.judges.base import JudgeInput
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.combined import CombinedJudges, CombinedMember
from ragpulse.judges.llm.fencing import new_nonce
from ragpulse.judges.llm.judge import LLMJudge

JUDGES = ["groundedness", "relevance_to_query", "safety"]


def prompt_tokens(messages: list[dict[str, str]]) -> int:
    return sum(approx_tokens(m["content"]) for m in messages)


def main() -> int:
    endpoint = OpenAIJudgeEndpoint(base_url="http://127.0.0.1:9/v1", api_key="bench")
    separate = build_llm_judges(JUDGES, endpoint)
    combined = build_llm_judges(JUDGES, endpoint, combine=True)
    group: CombinedJudges = next(j for j in combined if isinstance(j, CombinedMember)).group
    items: list[JudgeInput] = _ragpulse_inputs(make_records())
    apart = [
        sum(prompt_tokens(j.messages(item, new_nonce())) for j in separate
            if isinstance(j, LLMJudge))
        for item in items
    ]
    together = [prompt_tokens(group.messages(group.prompts, item, new_nonce())) for item in items]
    system = approx_tokens(group.messages(group.prompts, items[0], new_nonce())[0]["content"])
    print(f"| {len(items)} records | prompt tokens per record (median) |")
    print("|---|---|")
    print(f"| three separate calls | {statistics.median(apart):,.0f} |")
    print(f"| --judge-combine (system message {system:,}) | {statistics.median(together):,.0f} |")
    print(f"| combined / separate | {statistics.median(together) / statistics.median(apart):.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
