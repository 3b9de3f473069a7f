"""Offline relevance-to-query judge: does the answer address the user's request?

For operators who want a free, deterministic signal that the chatbot answers what was asked.
"no" when the answer opens with a refusal ("I can't help with that", lexicon
judges/lexicons/refusals.txt), when it shares too few of the question's content words (Snowball
stems), or when a quantity question ("how many", "what year") gets an answer without any number.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import re
from collections.abc import Iterable

from ragpulse.judges.base import JudgeInput, Rating
from ragpulse.judges.local.judge import LocalJudge
from ragpulse.judges.local.text import (
    STOPWORDS,
    PieceMemo,
    first_sentences,
    load_lexicon,
    piece_tokens,
    split_sentences,
    stem,
    tokens,
)

DEFAULT_MIN_OVERLAP = 0.2
# Wh-words and request verbs say what kind of answer is wanted, not what it is about.
_QUESTION_FRAME = (
    "tell", "explain", "describe", "give", "know", "want", "need", "please", "help", "find",
    "show", "list", "name", "way", "best", "good", "get", "make", "use",
)
# Matched against lower-cased text: with re.IGNORECASE the same search of a long text without
# a match took four times as long.
_QUANTITY_QUESTION_RE = re.compile(
    r"\b(?:how (?:many|much|old|tall|long|far|big|high)|what (?:year|percentage|percent|date)|"
    r"which year|in what year)\b"
)
_QUANTITY_ANSWER_RE = re.compile(
    r"\d|\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|twenty|"
    r"thirty|forty|fifty|hundreds?|thousands?|millions?|billions?|dozens?|several|few|many|"
    r"none|no|a lot|half|free|century|decade)\b"
)
_LEAD_IN_RE = re.compile(r"^[\s\"'*_>#-]*")


# A refusal is looked for in the first two sentences of this many first characters.
_REFUSAL_SPAN = 600


@functools.cache
def _refusal_re() -> re.Pattern[str]:
    return re.compile("|".join(f"(?:{p})" for p in load_lexicon("refusals")), re.IGNORECASE)


def refusal_in(answer: str) -> str | None:
    """The refusing sentence among the first two of `answer`, or None (pure)."""
    pattern = _refusal_re()
    # An answer within the span is its own span: its split is the one its groundedness judge
    # made (memoised); a longer one's span is split only as far as its second sentence.
    span = answer[:_REFUSAL_SPAN]
    first = split_sentences(span)[:2] if span == answer else first_sentences(span, 2)
    for sentence in first:
        text = _LEAD_IN_RE.sub("", sentence)
        if pattern.match(text):
            return " ".join(text.split())
    return None


def key_stems(text: str) -> dict[str, str]:
    """Content-word stems of `text` mapped to their first surface form."""
    return dict(_key_stems(text))


@functools.lru_cache(maxsize=4096)
def _key_stems(text: str) -> tuple[tuple[str, str], ...]:
    # Memoised for the question, which is also checked for a refusal (and recurs across events).
    out: dict[str, str] = {}
    for tok in dict.fromkeys(tokens(text)):  # distinct tokens, in order of first appearance
        s = _key_stem(tok)
        if s is not None:
            out.setdefault(s, tok)
    return tuple(out.items())


def _answered(asked: Iterable[str], text: str) -> set[str]:
    """Those of the `asked` stems that are keys of `key_stems(text)`: gathered in C from the
    memoised pieces of `text`, without building the set of all of its key stems. A piece is
    looked up as often as it occurs: making a set of the pieces first cost more than the
    repeated look-ups (8.4 against 4.7 ms a pass over RAGTruth's 307 QA answers)."""
    return set(asked).intersection(  # (a piece of no key word adds None: never asked)
        itertools.chain.from_iterable(map(_piece_key_stems, text.split()))
    )


def _analyse_piece_key_stems(piece: str) -> frozenset[str | None]:
    return frozenset(map(_key_stem, piece_tokens(piece)))


# Per whitespace-separated piece, memoised as text.py memoises its piece analyses.
_piece_key_stems = PieceMemo(_analyse_piece_key_stems, 200_000).__getitem__


@functools.lru_cache(maxsize=200_000)
def _key_stem(tok: str) -> str | None:
    """The stem a token contributes to `key_stems`, or None when it names no key word."""
    low = tok.lower()
    if low in STOPWORDS or tok[0].isdigit() or len(low) < 2:
        return None
    s = stem(low)
    return None if s in _QUESTION_FRAME_STEMS else s


_QUESTION_FRAME_STEMS = frozenset(stem(w) for w in _QUESTION_FRAME)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RelevanceToQueryJudge(LocalJudge):
    """Local `relevance_to_query` judge: "no" for refusals and off-topic answers."""

    name = "relevance_to_query"
    empty_answer = "there is nothing to compare with the question"

    min_overlap: float = DEFAULT_MIN_OVERLAP

    def decide(self, item: JudgeInput) -> tuple[Rating, str]:
        question, answer = item.question, item.answer
        refusal = refusal_in(answer)
        if refusal is not None:
            shown = refusal if len(refusal) <= 80 else refusal[:79] + "…"
            return "no", f"The answer declines the request ({shown!r})."
        asked = dict(_key_stems(question))
        if not asked:
            return "yes", "The answer does not refuse, and the question has no key words to check."
        answered = _answered(asked, answer)
        shared = [surface for s, surface in asked.items() if s in answered]
        share = len(shared) / len(asked)
        if share < self.min_overlap:
            missing = ", ".join(repr(w) for w in list(asked.values())[:4])
            return "no", f"The answer takes up too few of the question's key words ({missing})."
        if _QUANTITY_QUESTION_RE.search(question.lower()) and not _QUANTITY_ANSWER_RE.search(
            answer.lower()
        ):
            return "no", "The question asks for a quantity or date but the answer gives no number."
        return "yes", (
            f"The answer takes up {len(shared)} of the question's {len(asked)} key words "
            f"({', '.join(repr(w) for w in shared[:4])}) and does not refuse."
        )

    def margin(self, item: JudgeInput) -> float:
        """How far the rating is from flipping, for the judge cascade (pipeline/costs/cascade.py):
        the distance of the share of the question's key words the answer takes up from
        `min_overlap`; 1 for a refusal, 0 when the question has no key words to check."""
        if refusal_in(item.answer) is not None:
            return 1.0
        asked = dict(_key_stems(item.question))
        if not asked:
            return 0.0
        answered = _answered(asked, item.answer)
        share = sum(s in answered for s in asked) / len(asked)
        return abs(share - self.min_overlap)
