"""The local (offline, deterministic, model-free) judge backend.

For deployments without an LLM endpoint, or as a cheap always-on screen: lexical judges that
keep up with thousands of events per second on one core (their agreement with human labels is
measured by tests/bench/eval_local_judges.py). Each is a `LocalJudge`: this module holds the
frame they share (timing, the input checks, the async wrapper); each judge's module holds only
its decision. The registry (`judges.registry`) names them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import ClassVar

from ragpulse.judges.base import Judge, JudgeInput, Rating, Verdict
from ragpulse.judges.registry import SESSION_JUDGES, JudgeEntry, judge_entry

__all__ = ["CannotGrade", "LocalJudge", "build_local_judges"]


class CannotGrade(Exception):
    """Raised by a judge's `decide` when the event holds what the registry requires, but not in
    a form the method can read; the verdict is `error` with cause `input` and this message."""


class LocalJudge:
    """Base of the local judges: grades synchronously, timing the subclass's `decide`.

    Before deciding, an event lacking what the registry says the judge requires gets that
    verdict, and, when `empty_answer` says why the method cannot grade one, an empty answer is
    an `error` with cause `input`. A judge with thresholds declares them as the fields of a
    keyword-only frozen dataclass, with their defaults: the registry builds it without
    arguments (`JudgeEntry.build_local`).
    """

    name: str
    # Why the method cannot grade an empty answer; None grades it like any other.
    empty_answer: ClassVar[str | None] = None
    # The judge's registry entry (a session judge's is among the session judges').
    _entry: ClassVar[JudgeEntry]

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._entry = SESSION_JUDGES.get(cls.name) or judge_entry(cls.name)

    def decide(self, item: JudgeInput) -> tuple[Rating, str] | tuple[Rating, str, float]:
        """The rating and its rationale for an event that holds what the judge needs (and a
        score, for a judge that has one: chunk_relevance's precision)."""
        raise NotImplementedError

    def grade(self, item: JudgeInput) -> Verdict:
        """Synchronous grading (the async `judge` only wraps it)."""
        start = time.perf_counter()
        if self.empty_answer is not None and not item.answer.strip():
            return Verdict(
                self.name,
                "error",
                error_message=f"the answer is empty; {self.empty_answer}",
                error_cause="input",
                latency_seconds=time.perf_counter() - start,
            )
        missing = self._entry.verdict_if_missing(item)
        if missing is not None:
            return dataclasses.replace(missing, latency_seconds=time.perf_counter() - start)
        try:
            rating, rationale, *score = self.decide(item)
        except CannotGrade as exc:
            return Verdict(
                self.name,
                "error",
                error_message=str(exc),
                error_cause="input",
                latency_seconds=time.perf_counter() - start,
            )
        return Verdict(
            self.name,
            rating,
            rationale,
            latency_seconds=time.perf_counter() - start,
            score=score[0] if score else None,
        )

    async def judge(self, item: JudgeInput) -> Verdict:
        return self.grade(item)


def build_local_judges(names: Sequence[str]) -> list[Judge]:
    """One local judge per name, in the order given (used by `JudgeSpec.build`)."""
    entries = [judge_entry(n) for n in names]
    unavailable = [e.name for e in entries if "local" not in e.backends]
    if unavailable:
        raise ValueError(f"no local implementation of judge(s) {', '.join(unavailable)}")
    return [e.build_local() for e in entries]
