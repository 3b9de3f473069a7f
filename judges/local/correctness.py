"""Offline correctness judge: does the answer state the expected answer?

For evaluation sets and golden canaries that carry ground truth (`expected_response`, or
`expected_facts`, each of which the answer must state). A target is stated when, after SQuAD's
normalisation (lower case, no punctuation, no articles), it appears in the answer as it is, or
when the answer holds every number of it and at least `min_share` of its content words
(Snowball stems). Lexical: it cannot see a contradiction that repeats the expected words
("not 30 days"). Agreement with people on EVOUNA and NQ301: tests/bench/eval_local_judges.py.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import string

from ragpulse.judges.base import JudgeInput, Rating
from ragpulse.judges.local.judge import LocalJudge
from ragpulse.judges.local.text import bag_of, coverage, quote

# Tuned on EVOUNA and checked on NQ301 (tests/bench/eval_local_judges.py).
DEFAULT_MIN_SHARE = 0.5

_ARTICLES_RE = re.compile(r"\b(?:a|an|the)\b")
_PUNCTUATION = str.maketrans(dict.fromkeys(string.punctuation + "‘’“”", " "))


@functools.lru_cache(maxsize=4096)
def normalise_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, punctuation and articles removed, one space."""
    return " ".join(_ARTICLES_RE.sub(" ", text.lower().translate(_PUNCTUATION)).split())


@dataclasses.dataclass(frozen=True, kw_only=True)
class CorrectnessJudge(LocalJudge):
    """Local `correctness` judge: "yes" when the answer states every expected fact."""

    name = "correctness"
    empty_answer = "there is nothing to compare with the expected answer"

    min_share: float = DEFAULT_MIN_SHARE

    def decide(self, item: JudgeInput) -> tuple[Rating, str]:
        targets = item.facts or (item.expected_response or "",)
        answer = f" {normalise_answer(item.answer)} "
        evidence = bag_of(item.answer)
        for target in targets:
            norm = normalise_answer(target)
            if norm and f" {norm} " in answer:
                continue
            cov = coverage(target, evidence)
            if cov.missing_numbers:
                return "no", (
                    f"The answer lacks the number {cov.missing_numbers[0]!r} of the expected "
                    f"answer {quote(target)!r}."
                )
            if not cov.words and (cov.numbers or not norm):
                continue  # only numbers, all stated; or punctuation only, nothing to state
            if not cov.words or cov.share < self.min_share:
                # (A target of common words only, "yes", must appear as it is.)
                shown = ", ".join(repr(w) for w in cov.missing_words[:4]) or repr(quote(target))
                return "no", (
                    f"The answer does not state the expected answer {quote(target)!r} "
                    f"(missing {shown})."
                )
        what = f"all {len(targets)} expected facts" if item.facts else "the expected answer"
        return "yes", f"The answer states {what}."
