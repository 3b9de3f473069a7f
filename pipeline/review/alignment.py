"""Aligning an LLM judge to its labels: few-shot examples chosen from the labelled items, and
the agreement before and after measured on labels the choice did not see.

For `ragpulse align` (pipeline/commands/align.py). The judge's prompt (judges/prompts/*.yaml or
a custom judge's file) keeps its task, rubric and examples; the aligned prompt adds up to N
labelled items as examples and bumps `version`, so its verdicts are new series and no
calibration of the old version applies to it.

Which items (`choose_examples`): both human ratings, about half each; within a rating the
judge's mistakes first (the items where the current prompt disagrees with the reviewers), then
the others; within each group the most different from those already chosen (farthest-first on
the words of request and response), so that N examples cover N kinds of answer rather than one
kind N times. A reviewer's note becomes the example's rationale.

How well (`cross_validate`): the labelled items are split into K folds, stratified by rating.
Every item is judged once with the current prompt ("before"); for each fold, examples are
chosen from the other folds only (the judge's mistakes there measured with the current
prompt) and the fold is judged with that prompt ("after"). So every "after" verdict is on an
item whose label the examples did not use, and before and after are paired on the same items:
balanced accuracy and Cohen's kappa each, with a bootstrap interval, and the change with a
paired bootstrap interval (pipeline/calibration.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable, Sequence
from typing import Any

from ragpulse.judges.base import JudgeInput
from ragpulse.judges.llm.judge import FewShotExample, JudgePrompt
from ragpulse.pipeline.calibration import (
    Interval,
    Value,
    balanced_accuracy,
    bootstrap_interval,
    cohen_kappa,
    paired_difference_interval,
)
from ragpulse.pipeline.review.labelled import LabelledItem

# MLflow's judge.align asks for at least 10 labelled traces with both ratings; so does this.
MIN_LABELS = 10
MIN_PER_RATING = 2  # each fold's training part needs one of each rating to choose from
DEFAULT_EXAMPLES = 6
DEFAULT_FOLDS = 5
# An example's text is a prompt's fixed part, paid on every call: each field is cut to this.
EXAMPLE_FIELD_CHARS = 1200
EXAMPLE_CHUNKS = 4
# The inputs a review item holds (history: none, a single turn is reviewed); a judge that
# reads others cannot be shown labelled examples.
ALIGNABLE_INPUTS = frozenset({"question", "answer", "chunks", "history"})
_WORD = re.compile(r"\w+")

# Judges a list of inputs with a prompt: each verdict's value ("yes"/"no"), or None when the
# judge could not grade.
JudgeWith = Callable[[JudgePrompt, Sequence[JudgeInput]], list[Value | None]]


class AlignmentError(ValueError):
    """Labels that cannot align a judge (too few, one rating, an unsuitable judge)."""


def check_alignable(prompt: JudgePrompt, items: Sequence[LabelledItem]) -> None:
    """AlignmentError, in one line, unless the judge and its labelled items can be aligned."""
    if prompt.scale != "binary":
        raise AlignmentError(
            f"{prompt.name} grades on a {prompt.scale} scale; align takes yes/no judges"
        )
    if prompt.subject != "answer":
        raise AlignmentError(f"{prompt.name} grades each {prompt.subject}; align takes judges "
                             "of the whole answer")
    unknown = [i for i in prompt.inputs if i not in ALIGNABLE_INPUTS]
    if unknown:
        raise AlignmentError(f"{prompt.name} reads {', '.join(unknown)}, which review items do "
                             "not hold")
    ratings = {i.truth: 0 for i in items}
    for i in items:
        ratings[i.truth] += 1
    if len(items) < MIN_LABELS:
        raise AlignmentError(f"{len(items)} usable labelled items of {prompt.name}; align "
                             f"needs at least {MIN_LABELS}")
    if len(ratings) < 2:
        only = next(iter(ratings))
        raise AlignmentError(f"every labelled item of {prompt.name} is rated {only!r}; align "
                             f"needs both ratings (at least {MIN_PER_RATING} of each)")
    few = [r for r, n in ratings.items() if n < MIN_PER_RATING]
    if few:
        raise AlignmentError(f"only {ratings[few[0]]} labelled item(s) of {prompt.name} rated "
                             f"{few[0]!r}; align needs at least {MIN_PER_RATING} of each rating")


# -- choosing examples (pure) -----------------------------------------------------------------


def _words(item: LabelledItem) -> frozenset[str]:
    text = f"{item.judge_input.question} {item.judge_input.answer}".lower()
    return frozenset(_WORD.findall(text))


def _distance(a: frozenset[str], b: frozenset[str]) -> float:
    union = len(a | b)
    return 1.0 - len(a & b) / union if union else 0.0


def _order(event_id: str) -> str:
    # A fixed order independent of arrival: the same labels choose the same examples.
    return hashlib.blake2b(event_id.encode(), digest_size=8).hexdigest()


def choose_examples(
    items: Sequence[LabelledItem], judged: Sequence[Value | None], n: int
) -> list[LabelledItem]:
    """Up to `n` items to show as examples: both ratings, the judge's mistakes first
    (`judged[i]` is the current prompt's value for `items[i]`; None, could not grade, counts as
    a mistake), then the most different from those chosen (see the module's docstring)."""
    by_rating: dict[str, list[tuple[bool, LabelledItem]]] = {}
    for item, value in zip(items, judged, strict=True):
        by_rating.setdefault(item.truth, []).append((value != item.truth, item))
    ratings = sorted(by_rating)
    quota = {r: n // len(ratings) + (1 if k < n % len(ratings) else 0)
             for k, r in enumerate(ratings)}
    # A rating with too few items leaves its places to the other.
    spare = sum(max(0, quota[r] - len(by_rating[r])) for r in ratings)
    for r in ratings:
        room = len(by_rating[r]) - quota[r]
        take = min(spare, max(0, room))
        quota[r] += take
        spare -= take
    chosen: list[LabelledItem] = []
    words: list[frozenset[str]] = []
    for r in ratings:
        mistakes = sorted((i for m, i in by_rating[r] if m), key=lambda i: _order(i.event_id))
        others = sorted((i for m, i in by_rating[r] if not m), key=lambda i: _order(i.event_id))
        picked = 0
        for group in (mistakes, others):
            pool = list(group)
            while pool and picked < quota[r]:
                best = max(
                    range(len(pool)),
                    key=lambda k: min((_distance(_words(pool[k]), w) for w in words),
                                      default=1.0),
                )
                item = pool.pop(best)
                chosen.append(item)
                words.append(_words(item))
                picked += 1
    return chosen


def _cut(text: str) -> str:
    if len(text) <= EXAMPLE_FIELD_CHARS:
        return text
    return text[:EXAMPLE_FIELD_CHARS] + " [...]"


def example_of(item: LabelledItem) -> FewShotExample:
    """A labelled item as a few-shot example; its rationale is a reviewer's note when one was
    given."""
    note = " ".join(" ".join(item.notes).split())
    rationale = _cut(note) if note else f"A reviewer rated this answer {item.truth!r}."
    return FewShotExample(
        rating=item.truth,
        rationale=rationale,
        question=_cut(item.judge_input.question),
        answer=_cut(item.judge_input.answer),
        chunks=tuple(_cut(c.content) for c in item.judge_input.chunks[:EXAMPLE_CHUNKS]),
    )


def aligned_prompt(prompt: JudgePrompt, examples: Sequence[LabelledItem],
                   version: int | None = None) -> JudgePrompt:
    """The prompt with the examples added after its own, as a new version (the next one, or
    `version`)."""
    return prompt.model_copy(update={
        "version": prompt.version + 1 if version is None else version,
        "examples": prompt.examples + tuple(example_of(i) for i in examples),
    })


# -- cross-validation ---------------------------------------------------------------------------


def folds_of(items: Sequence[LabelledItem], k: int) -> list[list[int]]:
    """K folds of item indices, stratified by rating (each rating dealt round the folds in a
    fixed order), none empty; fewer folds when there are fewer items of a rating than K."""
    by_rating: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        by_rating.setdefault(item.truth, []).append(index)
    k = max(2, min(k, *(len(v) for v in by_rating.values())))
    folds: list[list[int]] = [[] for _ in range(k)]
    dealt = 0
    for rating in sorted(by_rating):
        for index in sorted(by_rating[rating], key=lambda i: _order(items[i].event_id)):
            folds[dealt % k].append(index)
            dealt += 1
    return folds


@dataclasses.dataclass(frozen=True)
class AgreementChange:
    """Balanced accuracy and kappa before and after, on the same held-out items."""

    graded: int  # items both prompts could grade
    left_out: int  # items one of them could not grade (an error), left out of both
    before_balanced_accuracy: Interval
    after_balanced_accuracy: Interval
    change_balanced_accuracy: Interval
    before_kappa: Interval
    after_kappa: Interval
    change_kappa: Interval
    mistakes_before: int
    mistakes_after: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CrossValidation:
    """What `cross_validate` measured: the change, the folds, and each item's verdicts."""

    change: AgreementChange
    folds: int
    examples_per_fold: int
    before: list[Value | None]
    after: list[Value | None]


def cross_validate(
    prompt: JudgePrompt, items: Sequence[LabelledItem], judge_with: JudgeWith,
    examples: int, k: int,
) -> CrossValidation:
    """Before and after agreement by K-fold cross-validation (see the module's docstring)."""
    inputs = [i.judge_input for i in items]
    before = judge_with(prompt, inputs)
    after: list[Value | None] = [None] * len(items)
    folds = folds_of(items, k)
    for fold in folds:
        held = set(fold)
        train = [i for i in range(len(items)) if i not in held]
        chosen = choose_examples([items[i] for i in train], [before[i] for i in train], examples)
        judged = judge_with(aligned_prompt(prompt, chosen), [inputs[i] for i in fold])
        for index, value in zip(fold, judged, strict=True):
            after[index] = value
    return CrossValidation(agreement_change(items, before, after), len(folds), examples,
                           before, after)


def agreement_change(
    items: Sequence[LabelledItem], before: Sequence[Value | None],
    after: Sequence[Value | None],
) -> AgreementChange:
    """The agreement figures of paired verdicts; an item either prompt could not grade is left
    out of both (so the two are measured on the same items)."""
    triples: list[tuple[Value, Value, Value]] = [
        (item.truth, b, a) for item, b, a in zip(items, before, after, strict=True)
        if b is not None and a is not None
    ]
    pairs_before = [(t, b) for t, b, _ in triples]
    pairs_after = [(t, a) for t, _, a in triples]
    return AgreementChange(
        graded=len(triples),
        left_out=len(items) - len(triples),
        before_balanced_accuracy=bootstrap_interval(pairs_before, balanced_accuracy),
        after_balanced_accuracy=bootstrap_interval(pairs_after, balanced_accuracy),
        change_balanced_accuracy=paired_difference_interval(triples, balanced_accuracy),
        before_kappa=bootstrap_interval(pairs_before, cohen_kappa),
        after_kappa=bootstrap_interval(pairs_after, cohen_kappa),
        change_kappa=paired_difference_interval(triples, cohen_kappa),
        mistakes_before=sum(t != b for t, b, _ in triples),
        mistakes_after=sum(t != a for t, _, a in triples),
    )
