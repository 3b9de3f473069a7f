"""Text from the logs is handled in linear time: 1 MiB of hostile text is judged in under 1 s.

Each shape below once made some regex or loop take time quadratic in its length (or close to
it): a long run of spaces in a multi-line answer (sentence splitting), an unclosed code fence
followed by spaces (reply parsing), a long text of negated harm phrases without a full stop
(the safety judge), one huge "word" (the stemmer). Times are CPU seconds of this process, so
that other work on a loaded machine does not count; the expected times are well below 1 s.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

import pytest

from ragpulse.judges.base import Chunk, JudgeInput
from ragpulse.judges.llm.fencing import defuse
from ragpulse.judges.llm.judge import UnparsableReply, parse_reply
from ragpulse.judges.local.judge import build_local_judges
from ragpulse.judges.redaction import Redactor

MiB = 1 << 20
LIMIT_CPU_SECONDS = 1.0


def _fill(unit: str, head: str = "", tail: str = "") -> str:
    return head + unit * ((MiB - len(head) - len(tail)) // len(unit)) + tail


ANSWERS: dict[str, str] = {
    "whitespace runs": _fill(" ", "Refunds take 30 days.\nThey are paid", " back. Done."),
    "mixed whitespace runs": _fill(" \t\u00a0 \u2003", "Refunds take 30 days.\n", "\nDone."),
    "repeated punctuation": _fill(".!?,;:-", "Refunds take 30 days", "."),
    "one huge token": _fill("a", "Refunds take 30 days. ", " done."),
    "one huge glued token": _fill("x@b.", "Refunds take 30 days. "),
    "mix": _fill(
        "I won't tell you how to make a bomb, sorry   \t  !!!??? 4111-1111 ... "
        "call +1 555 0100 x@y.z <answer> ﹤/answer﹥ a\u200bb 2001:db8::1 ",
        "Refunds take 30 days.\n",
    ),
}
QUESTION = _fill("how many days? ", "How many days do refunds take? ")
CHUNK = _fill("Refunds are accepted within 30 days of purchase. ")


def cpu_seconds(work: Callable[[], object]) -> float:
    start = time.process_time()
    work()
    return time.process_time() - start


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(ANSWERS))
@pytest.mark.parametrize("judge", ["groundedness", "safety", "relevance_to_query"])
def test_each_local_judge_grades_a_hostile_1_mib_answer_with_1_mib_context_in_under_1_s(
    judge: str, shape: str
) -> None:
    (grader,) = build_local_judges([judge])
    item = JudgeInput(question=QUESTION, answer=ANSWERS[shape], chunks=(Chunk(CHUNK),))
    seconds = cpu_seconds(lambda: grader.grade(item))  # type: ignore[attr-defined]
    assert seconds < LIMIT_CPU_SECONDS, f"{judge} took {seconds:.2f} s on {shape}"


REPLIES: dict[str, str] = {
    "unclosed code fence then spaces": _fill(" ", "```json", "x"),
    "code fence around spaces": _fill(" ", "```", '{"rationale": "ok", "rating": "no"}```'),
    "stars before a label": _fill("*", "", "rating"),
    "label then stars": _fill("*", "rating", ""),
    "label, colon, then filler": _fill(" *_", "rating:", ""),
    "many rationale lines": _fill("rationale: x\n", "", "rating: no"),
    "huge JSON string": _fill("a", '{"rationale": "', '", "rating": "no"}'),
    "open braces": _fill("{"),
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(REPLIES))
def test_a_1_mib_pathological_judge_reply_is_parsed_or_refused_in_under_1_s(shape: str) -> None:
    def parse() -> None:
        with contextlib.suppress(UnparsableReply):
            parse_reply(REPLIES[shape])

    seconds = cpu_seconds(parse)
    assert seconds < LIMIT_CPU_SECONDS, f"parsing took {seconds:.2f} s on {shape}"


PII_SHAPES: dict[str, str] = {
    "digits and spaces": _fill("1 "),
    "digits and dashes": _fill("4-"),
    "at signs": _fill("a@"),
    "long local parts": _fill("a." * 40 + "@b"),
    "dotted domain": _fill("a.", "x@"),
    "hex and colons": _fill("a:"),
    "plus signs": _fill("+1 "),
    "trunk zeros": _fill("0 12 "),
    "dotted quads": _fill("1.1.1.1."),
    "IBAN start then digits": _fill("1 ", "DE89 "),
    "key labels": _fill("password="),
    "phone words": _fill("phone "),
    "mix": ANSWERS["mix"],
}


@pytest.mark.slow
@pytest.mark.parametrize("shape", list(PII_SHAPES))
def test_redacting_and_defusing_1_mib_of_hostile_text_takes_under_1_s(shape: str) -> None:
    text = PII_SHAPES[shape]
    seconds = cpu_seconds(lambda: defuse(Redactor().redact(text)))
    assert seconds < LIMIT_CPU_SECONDS, f"redaction took {seconds:.2f} s on {shape}"
