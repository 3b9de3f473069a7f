"""Offline context-sufficiency judge: do the retrieved chunks hold what the answer needs?

For operators who want to tell retrieval failures ("the context lacked the facts") from
generation failures ("the context had them, the answer did not use them") without an LLM.
With an expected answer (`expected_facts`, each on its own, or `expected_response`) the chunks
must state every number of it and most of its content words (Snowball stems); without one,
they must hold most of the question's key words, a weaker check of the same thing.

No labelled set of context sufficiency is at hand, so the shares below are set by hand, not
measured (see tests/bench/eval_local_judges.py).
"""

from __future__ import annotations

import dataclasses

from ragpulse.judges.base import JudgeInput, Rating
from ragpulse.judges.local.judge import LocalJudge
from ragpulse.judges.local.relevance import key_stems
from ragpulse.judges.local.text import Bag, bag_of, coverage, quote

# Shares of the expected answer's content words, and of the question's key words, that the
# chunks must hold.
DEFAULT_MIN_EXPECTED_SHARE = 0.7
DEFAULT_MIN_QUESTION_SHARE = 0.6


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContextSufficiencyJudge(LocalJudge):
    """Local `context_sufficiency` judge: "no" when the chunks lack part of the expected answer
    (or, without one, of the question's key words)."""

    name = "context_sufficiency"

    min_expected_share: float = DEFAULT_MIN_EXPECTED_SHARE
    min_question_share: float = DEFAULT_MIN_QUESTION_SHARE

    def decide(self, item: JudgeInput) -> tuple[Rating, str]:
        context = bag_of("\n".join(c.content for c in item.chunks))
        targets = item.facts or ((item.expected_response,) if item.expected_response else ())
        if not any(t.strip() for t in targets):
            return self._question_covered(item.question, context)
        for target in targets:
            cov = coverage(target, context)
            if cov.missing_numbers:
                return "no", (
                    f"The context lacks the number {cov.missing_numbers[0]!r} of the expected "
                    f"answer {quote(target)!r}."
                )
            if cov.share < self.min_expected_share:
                shown = ", ".join(repr(w) for w in cov.missing_words[:4])
                return "no", (
                    f"The context lacks {len(cov.missing_words)} of the {cov.words} content "
                    f"words of the expected answer {quote(target)!r} ({shown})."
                )
        what = f"all {len(targets)} expected facts" if item.facts else "the expected answer"
        return "yes", f"The context states the numbers and most content words of {what}."

    def _question_covered(self, question: str, context: Bag) -> tuple[Rating, str]:
        asked = key_stems(question)
        if not asked:
            return "yes", "No expected answer, and the question has no key word to look for."
        missing = [surface for s, surface in asked.items() if s not in context.stems]
        share = 1 - len(missing) / len(asked)
        if share < self.min_question_share:
            shown = ", ".join(repr(w) for w in missing[:4])
            return "no", (
                f"No expected answer; the context lacks {len(missing)} of the question's "
                f"{len(asked)} key words ({shown})."
            )
        return "yes", (
            f"No expected answer; the context holds {len(asked) - len(missing)} of the "
            f"question's {len(asked)} key words."
        )
