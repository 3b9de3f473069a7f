"""Offline groundedness judge: is every claim of the answer supported by the retrieved chunks?

For operators who want a free, deterministic groundedness signal on every event. The method is
lexical: the answer is split into sentences (claims); a claim is unsupported when it states a
number that no chunk states, names a capitalised name that no chunk mentions, or when too large a
share of its content words (Snowball stems) appears in neither the chunks nor the question.

Two kinds of input are handled apart, after measuring them on RAGTruth
(tests/bench/eval_local_judges.py):

* structured context (JSON records, tables: data-to-text): an answer always rewords a record
  ("OutdoorSeating": true -> "it has outdoor seating"), so the share-of-words rule said "no" to
  nearly everything (51 % balanced accuracy on RAGTruth Data2txt); there only invented numbers
  and names count (67 %);
* summaries (the request asks for a summary, or there is no request): a summary rewords its
  source far more than an answer does, and names, numbers and words of the source are picked
  up by the sentence anyway, so only the share of new content words of a sentence counts, a
  word being found when a word of the source starts with its first five letters ("concluded"
  for "conclusion": morphology the stemmer leaves apart); a sentence of at least
  `SUMMARY_MIN_WORDS` content words with more than `SUMMARY_MAX_UNSUPPORTED` of them new is
  unsupported. Both are tuned (5-fold by source document, each fold scored with the two
  picked on the other four): 69.4 % balanced accuracy on RAGTruth summaries, mean of the
  held-out folds (62-78 % per fold: a weak signal, about HHEM-2.1-open's 64.4 % there; the LLM
  judge is the better one on summaries).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import operator
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import NamedTuple

from ragpulse.judges.base import JudgeInput, Rating
from ragpulse.judges.local.judge import LocalJudge
from ragpulse.judges.local.text import (
    Bag,
    Claim,
    bag_of,
    bag_of_texts,
    claim_of,
    content_stems,
    load_lexicon,
    quote,
    split_sentences,
    stem,
)

# The judge's two tuned parameters for answers, picked on the whole RAGTruth-QA dev set (so
# figures at the defaults are in-sample); tests/bench/eval_local_judges.py reports only figures
# out of sample: k-fold by source document, each fold scored with parameters tuned on the
# others (79.2 % balanced accuracy, mean of 5 folds).
DEFAULT_MIN_WORDS = 4
DEFAULT_MAX_UNSUPPORTED = 0.45
# The summary rule's two, what that script's tuning picks on all RAGTruth summary rows (and on
# four of the five folds each time, but once 0.28).
SUMMARY_MIN_WORDS = 6
SUMMARY_MAX_UNSUPPORTED = 0.29
# A new word counts as found when a source word of at least this many letters starts with its
# first this-many letters.
_PREFIX = 5

_META_STEMS: frozenset[str] = frozenset(stem(w) for w in load_lexicon("meta_words"))

_SUMMARY_REQUEST = re.compile(r"\b(?:summar(?:y|ies|i[sz]e|i[sz]ing|i[sz]ation)|tl;?dr)\b", re.I)
# A JSON key: "name": (at least a few of them make a record even when the text is cut off).
_JSON_KEY = re.compile(r'"[^"\n]{1,80}"\s*:')
_TABLE_ROW = re.compile(r"^\s*\|.*\|.*\|\s*$|^[^\t\n]*\t[^\t\n]*\t")


def is_structured(text: str) -> bool:
    """Whether a chunk is structured data rather than prose: a JSON object or array (also one
    cut off after a few keys), or a table (most lines are `| a | b |` rows or tab-separated)."""
    body = text.strip()
    if body[:1] in ("{", "["):
        try:
            return isinstance(json.loads(body), dict | list)
        except ValueError:
            return len(_JSON_KEY.findall(body, 0, 2000)) >= 3
    if "|" not in body and "\t" not in body:
        return False  # no line can be a table row (most chunks: prose)
    lines = [line for line in body.splitlines() if line.strip()]
    return len(lines) >= 2 and 2 * sum(bool(_TABLE_ROW.match(x)) for x in lines) > len(lines)


@functools.lru_cache(maxsize=4096)
def _mostly_records(chunks: tuple[str, ...]) -> bool:
    """Whether at least half of the chunks' text is structured (`is_structured`); memoised
    because the same retrieval results recur."""
    structured = sum(len(c) for c in chunks if is_structured(c))
    return 2 * structured >= sum(len(c) for c in chunks)


def is_summary_request(question: str) -> bool:
    """Whether the request asks for a summary, or there is no request to read (the chatbot
    then rewrites the context, which the lexical method cannot judge)."""
    return not question.strip() or _SUMMARY_REQUEST.search(question) is not None


class ClaimSupport(NamedTuple):
    """How one answer sentence is supported: the pieces of it that no chunk contains (a named
    tuple, made per sentence judged: see `Claim`)."""

    claim: Claim
    unsupported_words: tuple[str, ...]
    unsupported_numbers: tuple[str, ...]
    unsupported_names: tuple[str, ...]

    @property
    def unsupported_share(self) -> float:
        n = len(self.claim.words)
        return len(self.unsupported_words) / n if n else 0.0


@functools.lru_cache(maxsize=4096)
def _chunks_bag(chunks: tuple[str, ...]) -> Bag:
    """Union of the chunks' bags; memoised because the same retrieval results recur."""
    return bag_of_texts(chunks, _META_STEMS)


def support_of_claims(answer: str, chunks: Sequence[str], question: str = "") -> list[ClaimSupport]:
    """Support of each sentence of `answer` by `chunks` (pure; the judge's whole evidence).

    Words of the question count as support too: restating the question invents nothing.
    """
    return list(_supports(answer, chunks, question))


_VALUE = operator.itemgetter(1)  # of a (surface form, stem or value) pair


def _supports(answer: str, chunks: Sequence[str], question: str) -> Iterator[ClaimSupport]:
    # A generator, so that the judge stops at the first unsupported claim.
    ctx = _chunks_bag(tuple(chunks))
    q = bag_of(question)
    # Two look-ups per word rather than a union: the chunks' set is large, the question's small.
    stems, numbers, q_stems, q_numbers = ctx.stems, ctx.numbers, q.stems, q.numbers
    for sentence in split_sentences(answer):
        claim = claim_of(sentence)
        # Most claims are in the chunks word for word (and most have no number): one look-up
        # per word in C says so, before any is looked for in the question.
        words, claimed_numbers, names = claim.words, claim.numbers, claim.names
        yield ClaimSupport(
            claim,
            () if stems.issuperset(map(_VALUE, words)) else tuple(
                w for w, s in words if s not in stems and s not in q_stems
            ),
            () if numbers.issuperset(map(_VALUE, claimed_numbers)) else tuple(
                r for r, n in claimed_numbers if n not in numbers and n not in q_numbers
            ),
            () if stems.issuperset(map(_VALUE, names)) else tuple(
                n for n, s in names if s not in stems and s not in q_stems
            ),
        )


@functools.lru_cache(maxsize=1024)
def _prefixes(chunks: tuple[str, ...]) -> frozenset[str]:
    """The first `_PREFIX` letters of every stem of the chunks that has as many."""
    return frozenset(st[:_PREFIX] for st in _chunks_bag(chunks).stems if len(st) >= _PREFIX)


class SentenceNovelty(NamedTuple):
    """How much of one summary sentence is new: its content-word stems found in the source
    neither as such nor by their first `_PREFIX` letters (a named tuple, made per sentence
    measured: see `Claim`)."""

    sentence: str
    words: int  # content-word stems of the sentence (each piece's once)
    new: tuple[str, ...]

    @property
    def share(self) -> float:
        return len(self.new) / self.words if self.words else 0.0


def summary_novelty(
    answer: str, chunks: Sequence[str], min_words: int = 1
) -> list[SentenceNovelty]:
    """The novelty of each sentence of a summary with at least `min_words` content words,
    against its source (pure; the summary rule's whole evidence)."""
    return list(_novelty(answer, chunks, min_words))


def _novelty(answer: str, chunks: Sequence[str], min_words: int) -> Iterator[SentenceNovelty]:
    # A generator, so that the judge stops at the first novel sentence.
    known = _chunks_bag(tuple(chunks)).stems
    prefixes: frozenset[str] | None = None  # made only for a sentence that needs them
    for sentence in split_sentences(answer):
        stems = content_stems(sentence)
        if len(stems) < min_words:
            continue
        new = list(itertools.filterfalse(known.__contains__, stems))  # (filtered in C)
        if new:
            prefixes = _prefixes(tuple(chunks)) if prefixes is None else prefixes
            new = [st for st in new if st[:_PREFIX] not in prefixes]
        yield SentenceNovelty(sentence, len(stems), tuple(new))


def first_novel(
    novelty: Iterable[SentenceNovelty], *, min_words: int, max_unsupported: float
) -> SentenceNovelty | None:
    """The first sentence of at least `min_words` content words with more than
    `max_unsupported` of them new, or None."""
    for s in novelty:
        if s.words >= min_words and s.share > max_unsupported:
            return s
    return None


def unsupported_reason(s: ClaimSupport, *, min_words: int, max_unsupported: float) -> str | None:
    """Why claim `s` is unsupported (a reason phrase), or None when it is supported."""
    if s.unsupported_numbers:
        return f"the number {s.unsupported_numbers[0]!r} does not appear in the context"
    if s.unsupported_names:
        return f"the name {s.unsupported_names[0]!r} does not appear in the context"
    if len(s.claim.words) >= min_words and s.unsupported_share > max_unsupported:
        shown = ", ".join(repr(w) for w in s.unsupported_words[:4])
        return (
            f"{len(s.unsupported_words)} of its {len(s.claim.words)} content words "
            f"are not in the context ({shown})"
        )
    return None


def first_unsupported(
    supports: Iterable[ClaimSupport], *, min_words: int, max_unsupported: float
) -> tuple[ClaimSupport, str] | None:
    """The first unsupported claim and a reason phrase, or None when every claim is supported."""
    for s in supports:
        reason = unsupported_reason(s, min_words=min_words, max_unsupported=max_unsupported)
        if reason is not None:
            return s, reason
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class GroundednessJudge(LocalJudge):
    """Local `groundedness` judge: "no" when some claim of the answer is not in the chunks."""

    name = "groundedness"
    empty_answer = "there is no claim to check against the context"

    min_words: int = DEFAULT_MIN_WORDS
    max_unsupported: float = DEFAULT_MAX_UNSUPPORTED
    summary_min_words: int = SUMMARY_MIN_WORDS
    summary_max_unsupported: float = SUMMARY_MAX_UNSUPPORTED

    def decide(self, item: JudgeInput) -> tuple[Rating, str]:
        chunks = [c.content for c in item.chunks if c.content and not c.content.isspace()]
        records = _mostly_records(tuple(chunks))
        if not records and is_summary_request(item.question):
            return self._decide_summary(item, chunks)
        # Records are always reworded: only invented numbers and names count there.
        max_unsupported = 1.0 if records else self.max_unsupported
        n = 0
        for claim in _supports(item.answer, chunks, item.question):
            n += 1
            reason = unsupported_reason(
                claim, min_words=self.min_words, max_unsupported=max_unsupported
            )
            if reason is not None:
                return "no", f"The claim {quote(claim.claim.text, 80)!r} is unsupported: {reason}."
        if n == 1:
            return "yes", "The answer's one claim is supported by the context."
        return "yes", f"All {n} claims of the answer are supported by the context."

    def _decide_summary(self, item: JudgeInput, chunks: list[str]) -> tuple[Rating, str]:
        measured = 0

        def counted(novelty: Iterable[SentenceNovelty]) -> Iterator[SentenceNovelty]:
            nonlocal measured
            for sentence in novelty:
                measured += 1
                yield sentence

        found = first_novel(
            counted(_novelty(item.answer, chunks, self.summary_min_words)),
            min_words=self.summary_min_words,
            max_unsupported=self.summary_max_unsupported,
        )
        if found is not None:
            shown = ", ".join(repr(w) for w in found.new[:4])
            return "no", (
                f"The summary's sentence {quote(found.sentence, 80)!r} is unsupported: "
                f"{found.share:.0%} of its content words are not in the source (stems {shown})."
            )
        return "yes", (
            f"Each of the summary's {measured} measured sentences keeps to the source."
        )

    def margin(self, item: JudgeInput) -> float:
        """How far the rating is from flipping, for the judge cascade (pipeline/costs/cascade.py):
        the distance of the deciding claim's unsupported share from `max_unsupported` (for
        "yes", of the closest claim); 1 when a number or a name decided, or no claim had
        enough words to be measured."""
        chunks = [c.content for c in item.chunks if c.content and not c.content.isspace()]
        if is_summary_request(item.question) and not any(is_structured(c) for c in chunks):
            top = max(
                (s.share for s in summary_novelty(item.answer, chunks, self.summary_min_words)),
                default=0.0,
            )
            return abs(top - self.summary_max_unsupported)
        supports = support_of_claims(item.answer, chunks, item.question)
        found = first_unsupported(
            supports, min_words=self.min_words, max_unsupported=self.max_unsupported
        )
        if found is not None:
            claim = found[0]
            if claim.unsupported_numbers or claim.unsupported_names:
                return 1.0
            return claim.unsupported_share - self.max_unsupported
        return min(
            (self.max_unsupported - s.unsupported_share
             for s in supports if len(s.claim.words) >= self.min_words),
            default=1.0,
        )
