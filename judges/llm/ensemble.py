"""Ensembles: one LLM judge asked by several models, or several times, with a majority vote.

For operators (`--ensemble JUDGE=MODEL,MODEL,MODEL` or `--ensemble JUDGE=N`, repeatable) and
for `build_llm_judges`, which wraps the judge's `LLMJudge` in an `EnsembleJudge`. As in Ragas'
aspect critique, an odd number of members (at least 3) each grade the event; the verdict is the
strict majority of their ratings (on a graded scale: the median score of the majority's members).
A member that cannot grade does not vote: without a strict majority of all members the verdict
is `error` with that member's cause, never a guess. The members' ratings are kept on the verdict
(`votes`) and counted as `ragpulse_judge_ensemble_votes_total{judge,version,agreement}`:
unanimous, split, or incomplete (some member could not grade), so a judge whose models often
disagree shows it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import re
import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal

from ragpulse.judges.base import JudgeInput, Rating, Verdict

if TYPE_CHECKING:
    from ragpulse.judges.llm.judge import LLMJudge

Agreement = Literal["unanimous", "split", "incomplete"]
_MODEL = re.compile(r"^[A-Za-z0-9._:/@-]+$")


@dataclasses.dataclass(frozen=True, slots=True)
class Ensemble:
    """Judge `judge` graded by each of `models` (None: the --judge-model, sampled again)."""

    judge: str
    models: tuple[str | None, ...]


def parse_ensemble(flag: str) -> Ensemble:
    """One `--ensemble` value; ValueError (one line) says what is wrong with it."""
    judge, sep, members = flag.partition("=")
    judge, members = judge.strip(), members.strip()
    example = "e.g. safety=gpt-4o-mini,claude-3-5-haiku,llama-3.1-70b or safety=3"
    if not sep or not judge or not members:
        raise ValueError(f"{flag!r} is not JUDGE=MODEL,MODEL,... or JUDGE=N, {example}")
    models: tuple[str | None, ...]
    if members.isdigit():
        models = (None,) * int(members)
    else:
        models = tuple(m.strip() for m in members.split(","))
        bad = [m for m in models if not _MODEL.match(m or "")]
        if bad:
            raise ValueError(f"{flag!r}: {bad[0]!r} is not a model name, {example}")
    if len(models) < 3 or len(models) % 2 == 0:
        raise ValueError(
            f"{flag!r}: an ensemble needs an odd number of members, at least 3 (a majority "
            f"always exists), got {len(models)}"
        )
    return Ensemble(judge, models)


def agreement(votes: Sequence[Rating]) -> Agreement:
    """How an ensemble's members agreed: all alike, not, or some could not grade."""
    if "error" in votes:
        return "incomplete"
    return "unanimous" if len(set(votes)) == 1 else "split"


class EnsembleJudge:
    """An LLM judge asked once per member; the verdict is the members' majority."""

    def __init__(self, judge: LLMJudge, models: tuple[str | None, ...]) -> None:
        self.name = judge.name
        self.prompt = judge.prompt  # its scale, for composites (judges.composite)
        self.entry = judge.entry
        self._judge = judge
        self._models = models
        digest = hashlib.blake2b(repr(models).encode(), digest_size=3).hexdigest()
        self.version = f"{judge.version} ensemble {models!r}"
        # A change of the members is a change of the judge: new series.
        self.prompt_version = f"{judge.prompt_version}e{digest}"

    async def aclose(self) -> None:
        await self._judge.aclose()

    async def judge(self, item: JudgeInput) -> Verdict:
        """The members' majority on one event (see the module docstring)."""
        if self._judge.guidelines:
            item = dataclasses.replace(
                item, guidelines=item.guidelines + self._judge.guidelines
            )
        missing = self.entry.verdict_if_missing(item)
        if missing is not None:
            return missing
        members = await asyncio.gather(*(self._judge.judge(item, m) for m in self._models))
        return vote(self.name, members)


def vote(name: str, members: Sequence[Verdict]) -> Verdict:
    """The strict-majority verdict of an ensemble's member verdicts, costs added up."""
    votes = tuple(v.rating for v in members)
    tally = {r: votes.count(r) for r in ("yes", "no")}
    winner: Rating | None = next(
        (r for r in ("yes", "no") if tally[r] * 2 > len(votes)), None
    )
    if winner is None:
        failed = next(v for v in members if v.rating == "error")
        verdict = Verdict(
            name, "error",
            error_message=f"no majority of {len(votes)} members ({tally['yes']} yes, "
            f"{tally['no']} no, {votes.count('error')} could not grade: "
            f"{failed.error_message})",
            error_cause=failed.error_cause, votes=votes,
        )
    else:
        majority = [v for v in members if v.rating == winner]
        scores = [v.score for v in majority if v.score is not None]
        verdict = Verdict(
            name, winner, f"{len(majority)} of {len(votes)} members: {majority[0].rationale}",
            score=statistics.median_low(scores) if scores else None, votes=votes,
        )
    return dataclasses.replace(
        verdict,
        latency_seconds=max(v.latency_seconds for v in members),  # asked concurrently
        prompt_tokens=sum(v.prompt_tokens for v in members),
        completion_tokens=sum(v.completion_tokens for v in members),
        cached_prompt_tokens=sum(v.cached_prompt_tokens for v in members),
    )
