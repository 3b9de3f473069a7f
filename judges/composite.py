"""Weighted composites: one score per event computed from other judges' verdicts.

For operators (`--composite NAME=JUDGE:WEIGHT,...[,pass:SCORE]`, repeatable) and for
`JudgePanel`, which appends a composite's verdict to each event's verdicts, so that it is
counted, windowed and exported like a judge on a graded scale (ratings, score sum and count,
pass ratio = share at or above its pass score). The Databricks study's example is
`quality=correctness:0.6,comprehensiveness:0.2,readability:0.2` (the two last as custom judges
on the 0-3 scale, deploy/samples/).

Each member's grade is put on 0..1 first (binary: yes 1, no 0; a graded scale: (score - lowest)
/ (highest - lowest)), so judges of different scales mix; the composite score is the weighted
mean, in 0..1, and its pass score (default 0.5) is on that range too. A composite asks no model:
an event some member skipped is skipped by the composite too, and an event some member could
not grade is an `error` with that member's cause, never a score of the members that did.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence

from ragpulse.judges.base import InputName, Judge, Rating, Verdict, prompt_version

_NAME = re.compile(r"^[a-z0-9_]+$")
DEFAULT_PASS_SCORE = 0.5


@dataclasses.dataclass(frozen=True, slots=True)
class Composite:
    """A named weighted mean of member judges' grades, and the score at which it passes."""

    name: str
    weights: tuple[tuple[str, float], ...]
    pass_score: float = DEFAULT_PASS_SCORE

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.weights)


def parse_composite(flag: str) -> Composite:
    """One `--composite` value; ValueError (one line) says what is wrong with it."""
    example = "e.g. quality=correctness:0.6,comprehensiveness:0.2,readability:0.2,pass:0.5"
    name, sep, members = flag.partition("=")
    name = name.strip()
    if not sep or not _NAME.match(name):
        raise ValueError(f"{flag!r} is not NAME=JUDGE:WEIGHT,... (NAME of a-z 0-9 _), {example}")
    weights: list[tuple[str, float]] = []
    pass_score = DEFAULT_PASS_SCORE
    for part in members.split(","):
        judge, colon, number = part.strip().partition(":")
        try:
            value = float(number)
        except ValueError:
            value = float("nan")
        if not colon or not value == value:  # NaN: not a number
            raise ValueError(f"{flag!r}: {part.strip()!r} is not JUDGE:WEIGHT, {example}")
        if judge == "pass":
            if not 0 <= value <= 1:
                raise ValueError(f"{flag!r}: the pass score is on 0..1, got {value:g}")
            pass_score = value
        elif value <= 0:
            raise ValueError(f"{flag!r}: the weight of {judge} must be positive, got {value:g}")
        else:
            weights.append((judge, value))
    names = [j for j, _ in weights]
    if not names:
        raise ValueError(f"{flag!r} names no member judge, {example}")
    if len(set(names)) != len(names):
        raise ValueError(f"{flag!r} names a member judge more than once")
    return Composite(name, tuple(weights), pass_score)


def check_composites(composites: Sequence[Composite], judges: Sequence[str]) -> None:
    """ValueError unless every member is among `judges` and no composite takes a judge's name
    (or another composite's)."""
    taken = set(judges)
    for c in composites:
        if c.name in taken:
            raise ValueError(f"composite {c.name!r}: the name is taken by a judge or composite")
        taken.add(c.name)
        absent = [m for m in c.members if m not in judges]
        if absent:
            raise ValueError(
                f"composite {c.name!r}: {', '.join(absent)} not among --judges; add them"
            )


def score_range(judge: Judge) -> tuple[float, float] | None:
    """The lowest and highest score of a judge on a graded scale, None for a binary judge."""
    scores = getattr(getattr(judge, "prompt", None), "scores", None)
    return (float(scores[0]), float(scores[-1])) if scores else None


class CompositeGrader:
    """A composite bound to the panel's judges: their positions, scales and versions."""

    def __init__(self, composite: Composite, judges: Sequence[Judge]) -> None:
        names = [j.name for j in judges]
        self.name = composite.name
        self.composite = composite
        self._members = tuple(
            (names.index(member), weight, score_range(judges[names.index(member)]))
            for member, weight in composite.weights
        )
        self._total = sum(weight for _, weight in composite.weights)
        versions = [(member, prompt_version(judges[names.index(member)]))
                    for member in composite.members]
        digest = hashlib.blake2b(
            repr((composite.weights, composite.pass_score, versions)).encode(), digest_size=3
        ).hexdigest()
        # Changes with a weight, the pass score or a member's prompt: a new series.
        self.prompt_version = f"c{digest}"

    def grade(self, verdicts: Sequence[Verdict]) -> Verdict:
        """The composite's verdict from the panel's verdicts of one event."""
        missing: list[InputName] = []
        for i, _, _ in self._members:
            missing.extend(m for m in verdicts[i].missing if m not in missing)
        if missing:
            members = ", ".join(verdicts[i].judge for i, _, _ in self._members
                                if verdicts[i].missing)
            return Verdict(self.name, "skipped", f"skipped: member {members} skipped",
                           missing=tuple(missing), derived=True)
        for i, _, _ in self._members:
            v = verdicts[i]
            if v.rating == "error":
                return Verdict(
                    self.name, "error",
                    error_message=f"member {v.judge} could not grade: {v.error_message}",
                    error_cause=v.error_cause or "internal", derived=True,
                )
        total = 0.0
        parts = []
        for i, weight, bounds in self._members:
            v = verdicts[i]
            grade = _unit_grade(v, bounds)
            total += weight * grade
            parts.append(f"{v.judge} {grade:.2f}x{weight:g}")
        score = total / self._total
        rating: Rating = "yes" if score >= self.composite.pass_score else "no"
        rationale = f"{score:.3f} = weighted mean of {', '.join(parts)} (pass at " \
                    f"{self.composite.pass_score:g})"
        return Verdict(self.name, rating, rationale, score=round(score, 3), derived=True)


def _unit_grade(verdict: Verdict, bounds: tuple[float, float] | None) -> float:
    if bounds is None or verdict.score is None:
        return 1.0 if verdict.rating == "yes" else 0.0
    low, high = bounds
    return (verdict.score - low) / (high - low)


def composite_graders(
    composites: Sequence[Composite], judges: Sequence[Judge]
) -> tuple[CompositeGrader, ...]:
    """The panel's graders (ValueError when a member is not among `judges`)."""
    check_composites(composites, [j.name for j in judges])
    return tuple(CompositeGrader(c, judges) for c in composites)

