"""A stand-in judge model whose answers follow the few-shot examples it is shown.

For `ragpulse align` (tests/test_align.py, tests/bench/bench_align.py). Plugged into
`FakeOpenAI` as its `reply_for`: it reads the worked examples of the judge's system message
(`Example N:` with the fenced inputs of judges.llm.judge.system_prompt and `Reply: {...}`), and
grades an event like the example most like it (Jaccard similarity of the words of question and
answer), when one is at least `min_similarity` alike; otherwise it grades as `FakeOpenAI`'s
default model does ("no" iff the answer holds the marker word). So a prompt whose examples
cover an event's kind changes the verdict, and one whose examples do not leaves it: what
aligning a judge with labelled examples is meant to do, made deterministic.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fake_openai import default_decide, read_fences

_EXAMPLE = re.compile(r"^Example \d+:\n(.*?)\nReply: (\{.*?\})$", re.DOTALL | re.MULTILINE)
_EXAMPLE_FENCE = re.compile(r"<([a-z_]+)-example>\n(.*?)\n</\1-example>", re.DOTALL)
_WORD = re.compile(r"\w+")


def _words(text: str) -> frozenset[str]:
    return frozenset(_WORD.findall(text.lower()))


def _similarity(a: frozenset[str], b: frozenset[str]) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


class ExampleFollowingJudge:
    """`reply_for` of a FakeOpenAI: follows the nearest shown example (module docstring)."""

    def __init__(self, min_similarity: float = 0.5) -> None:
        self.min_similarity = min_similarity
        self.followed = 0  # replies that followed an example
        self.examples_seen: list[int] = []  # examples in each request's system message

    def __call__(self, body: dict[str, Any]) -> str | None:
        messages = body.get("messages") or []
        system = next((m["content"] for m in messages if m.get("role") == "system"), "")
        user = next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")
        if "Verdicts wanted:" in system or not isinstance(user, str):
            return None  # a combined call or another shape: the usual stand-in answers
        examples = []
        for fenced, reply in _EXAMPLE.findall(system):
            inputs = dict(_EXAMPLE_FENCE.findall(fenced))
            rating = json.loads(reply).get("rating")
            examples.append((_words(f"{inputs.get('question', '')} {inputs.get('answer', '')}"),
                             rating))
        self.examples_seen.append(len(examples))
        request = read_fences(user)
        asked = _words(" ".join(request.fenced.get("question", []) +
                                request.fenced.get("answer", [])))
        best = max(examples, key=lambda e: _similarity(asked, e[0]), default=None)
        if best is not None and _similarity(asked, best[0]) >= self.min_similarity:
            self.followed += 1
            return json.dumps({"rationale": "Like the example most like it.", "rating": best[1]})
        rating, rationale = default_decide(request)
        return json.dumps({"rationale": rationale, "rating": rating})
