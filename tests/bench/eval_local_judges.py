"""Agreement of the local judges with human labels, and their throughput.

For whoever tunes or reviews the local judges. Reads the labelled sets in ../shared/eval-data
(never copied into the project) and prints a markdown table of balanced accuracy and Cohen's
kappa: groundedness on RAGTruth and BEGIN (on RAGTruth only figures out of sample: QA and
summaries by k-fold by source document, each fold scored with the judge's parameters tuned on
the other folds, their mean reported; data-to-text, which has no tuned parameter; and how
often the judge abstains), safety on the OpenAI moderation set, relevance_to_query on XSTest
(answered vs refused), correctness on EVOUNA and NQ301 (next to the normalised-containment
baseline); then events/s for the three default judges together. chunk_relevance and
context_sufficiency have no labelled set here; document_recall is deterministic.

    .venv/bin/python tests/bench/eval_local_judges.py [--data-dir ../shared/eval-data] [--folds 5]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import gc
import itertools
import json
import re
import statistics
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from ragpulse.judges.base import Chunk, JudgeInput, Verdict
from ragpulse.judges.local.correctness import CorrectnessJudge, normalise_answer
from ragpulse.judges.local.groundedness import (
    ClaimSupport,
    GroundednessJudge,
    SentenceNovelty,
    first_novel,
    first_unsupported,
    summary_novelty,
    support_of_claims,
)
from ragpulse.judges.local.relevance import RelevanceToQueryJudge
from ragpulse.judges.local.safety import SafetyJudge
from ragpulse.judges.local.text import bag_of

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO.parent / "shared" / "eval-data"
# Folds of the k-fold check, by source document (fixed before measuring; more folds leave
# more rows to tune on).
FOLDS = 5
# The grids the k-fold check tunes over: the groundedness judge's parameters for answers and
# for summaries.
GRID_MIN_WORDS = (2, 3, 4, 5, 6)
GRID_MAX_UNSUPPORTED = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7)
GRID_SUMMARY_MIN_WORDS = (3, 4, 5, 6)
GRID_SUMMARY_MAX_UNSUPPORTED = tuple(round(0.15 + 0.01 * i, 2) for i in range(36))
TOKEN_F1_PASS = 0.5
_PASSAGE_RE = re.compile(r"(?:^|\n)passage \d+:")


# ---------------------------------------------------------------- agreement metrics (pure)


def _confusion(truth: Sequence[bool], predicted: Sequence[bool]) -> tuple[int, int, int, int]:
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} labels but {len(predicted)} predictions")
    tp = sum(1 for t, p in zip(truth, predicted, strict=True) if t and p)
    tn = sum(1 for t, p in zip(truth, predicted, strict=True) if not t and not p)
    fp = sum(1 for t, p in zip(truth, predicted, strict=True) if not t and p)
    fn = len(truth) - tp - tn - fp
    return tp, tn, fp, fn


def balanced_accuracy(truth: Sequence[bool], predicted: Sequence[bool]) -> float:
    """Mean of the recall on the positive and on the negative class (needs both classes)."""
    tp, tn, fp, fn = _confusion(truth, predicted)
    if tp + fn == 0 or tn + fp == 0:
        raise ValueError("balanced accuracy needs at least one label of each class")
    return (tp / (tp + fn) + tn / (tn + fp)) / 2


def cohen_kappa(truth: Sequence[bool], predicted: Sequence[bool]) -> float:
    """Cohen's kappa of two binary raters: (observed − chance agreement) / (1 − chance)."""
    tp, tn, fp, fn = _confusion(truth, predicted)
    n = tp + tn + fp + fn
    if n == 0:
        raise ValueError("kappa needs at least one item")
    observed = (tp + tn) / n
    chance = ((tp + fp) * (tp + fn) + (tn + fn) * (tn + fp)) / (n * n)
    if chance == 1.0:
        return 1.0 if observed == 1.0 else 0.0
    return (observed - chance) / (1 - chance)


# ---------------------------------------------------------------- data


def load_rows(path: Path) -> list[dict[str, object]]:
    """Labelled rows of one JSONL file, without the ones annotators could not agree on."""
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if r.get("label_pass") is not None]


def _text(row: dict[str, object], key: str) -> str:
    value = row.get(key)
    return value if isinstance(value, str) else ""


def to_input(row: dict[str, object]) -> JudgeInput:
    """A JudgeInput from an eval row; RAGTruth QA contexts are split into their passages."""
    context = _text(row, "context")
    parts = [p for p in _PASSAGE_RE.split(context) if p.strip()] if context else []
    return JudgeInput(
        question=_text(row, "question"),
        answer=_text(row, "response"),
        chunks=tuple(Chunk(p) for p in parts),
    )


def _fold(row: dict[str, object], folds: int) -> int:
    # RAGTruth ids are SOURCE-k (several responses per source); keep a source in one fold.
    source = str(row["id"]).rsplit("-", 1)[0]
    return zlib.crc32(source.encode()) % folds


# ---------------------------------------------------------------- evaluation


def agreement(truth: Sequence[bool], predicted: Sequence[bool]) -> float:
    """Share of items where the judge and the label agree (plain accuracy; the figure the NQ301
    paper quotes, misleading alone on imbalanced sets)."""
    tp, tn, fp, fn = _confusion(truth, predicted)
    return (tp + tn) / (tp + tn + fp + fn)


Score = tuple[float, float, float, int]  # balanced accuracy, agreement, kappa, n
TABLE_HEAD = (
    "| judge · data set | n | balanced accuracy | agreement | Cohen's kappa |\n"
    "|---|---|---|---|---|"
)


def _score(truth: Sequence[bool], predicted: Sequence[bool]) -> Score:
    return (
        balanced_accuracy(truth, predicted),
        agreement(truth, predicted),
        cohen_kappa(truth, predicted),
        len(truth),
    )


def _row(name: str, score: Score) -> str:
    ba, agreed, kappa, n = score
    return f"| {name} | {n} | {100 * ba:.1f} % | {100 * agreed:.1f} % | {kappa:.3f} |"


def _predict_grounded(
    supports: Sequence[list[ClaimSupport]], min_words: int, max_unsupported: float
) -> list[bool]:
    return [
        first_unsupported(s, min_words=min_words, max_unsupported=max_unsupported) is None
        for s in supports
    ]


def _predict_summary(
    novelty: Sequence[list[SentenceNovelty]], min_words: int, max_unsupported: float
) -> list[bool]:
    return [
        first_novel(n, min_words=min_words, max_unsupported=max_unsupported) is None
        for n in novelty
    ]


Params = tuple[int, float]
Evidence = TypeVar("Evidence")


def _tune(
    truth: Sequence[bool],
    evidence: Sequence[Evidence],
    predict: Callable[[Sequence[Evidence], int, float], list[bool]],
    grid: Iterable[Params],
) -> Params:
    """The grid point with the best balanced accuracy on these rows (ties: fewer words, then
    the lower threshold)."""
    return max(grid, key=lambda p: (balanced_accuracy(truth, predict(evidence, *p)), -p[0], -p[1]))


@dataclasses.dataclass(frozen=True)
class HeldOut:
    """One fold's rows scored with parameters tuned on the other folds."""

    fold: int
    params: Params
    rows: list[int]  # indexes into the task's rows
    predicted: list[bool]


def cross_validate(
    truth: Sequence[bool],
    evidence: Sequence[Evidence],
    folds: Sequence[int],
    predict: Callable[[Sequence[Evidence], int, float], list[bool]],
    grid: Sequence[Params],
) -> list[HeldOut]:
    """k-fold by source document: tune on all folds but one, score that one, for each fold."""
    result = []
    for held in sorted(set(folds)):
        tune = [k for k, f in enumerate(folds) if f != held]
        test = [k for k, f in enumerate(folds) if f == held]
        params = _tune([truth[k] for k in tune], [evidence[k] for k in tune], predict, grid)
        result.append(HeldOut(held, params, test, predict([evidence[k] for k in test], *params)))
    return result


def _held_out_rows(name: str, truth: Sequence[bool], folds: list[HeldOut], names: tuple[str, str]
                   ) -> list[str]:
    lines, scores = [], []
    for h in folds:
        score = _score([truth[k] for k in h.rows], h.predicted)
        scores.append(score)
        lines.append(_row(
            f"{name} fold {h.fold + 1} of {len(folds)} (tuned on the others: "
            f"{names[0]}={h.params[0]}, {names[1]}={h.params[1]})", score))
    lines.append(
        f"| **{name}, mean of the {len(folds)} held-out folds** | {sum(s[3] for s in scores)} "
        f"| **{100 * statistics.mean(s[0] for s in scores):.1f} %** "
        f"| {100 * statistics.mean(s[1] for s in scores):.1f} % "
        f"| {statistics.mean(s[2] for s in scores):.3f} |"
    )
    return lines


def evaluate_ragtruth(rows: list[dict[str, object]], n_folds: int = FOLDS) -> list[str]:
    """Table rows for RAGTruth groundedness, every figure out of sample: QA and summaries by
    k-fold by source document (the judge's parameters tuned on the other folds), data-to-text
    at the judge's rule (no tuned parameter), all tasks pooled from those; then how often the
    judge abstains, and the parameters the same tuning picks on all rows (the shipped ones)."""
    judge = GroundednessJudge()
    inputs = [to_input(r) for r in rows]
    ratings = [judge.grade(i).rating for i in inputs]
    truth = [bool(r["label_pass"]) for r in rows]
    tasks = [str(r.get("task")) for r in rows]
    lines = []
    pooled_truth: list[bool] = []
    pooled_predicted: list[bool] = []
    shipped = []

    qa = [i for i, t in enumerate(tasks) if t == "QA"]
    supports = [
        support_of_claims(inputs[i].answer, [c.content for c in inputs[i].chunks],
                          inputs[i].question)
        for i in qa
    ]
    summaries = [i for i, t in enumerate(tasks) if t == "Summary"]
    novelty = [
        summary_novelty(inputs[i].answer, [c.content for c in inputs[i].chunks],
                        min(GRID_SUMMARY_MIN_WORDS))
        for i in summaries
    ]
    for task, idx, evidence, predict, grid, names in (
        ("QA", qa, supports, _predict_grounded,
         list(itertools.product(GRID_MIN_WORDS, GRID_MAX_UNSUPPORTED)),
         ("min_words", "max_unsupported")),
        ("Summary", summaries, novelty, _predict_summary,
         list(itertools.product(GRID_SUMMARY_MIN_WORDS, GRID_SUMMARY_MAX_UNSUPPORTED)),
         ("summary_min_words", "summary_max_unsupported")),
    ):
        task_truth = [truth[i] for i in idx]
        folds = [_fold(rows[i], n_folds) for i in idx]
        held = cross_validate(task_truth, evidence, folds, predict, grid)  # type: ignore[arg-type]
        lines += _held_out_rows(f"groundedness · RAGTruth {task}", task_truth, held, names)
        for h in held:
            pooled_truth += [task_truth[k] for k in h.rows]
            pooled_predicted += h.predicted
        all_rows = _tune(task_truth, evidence, predict, grid)  # type: ignore[arg-type]
        shipped.append(f"{task}: {names[0]}={all_rows[0]}, {names[1]}={all_rows[1]}")

    # Data-to-text has no tuned parameter (only invented numbers and names count there).
    d2t = [i for i, t in enumerate(tasks) if t == "Data2txt" and ratings[i] != "error"]
    lines.append(_row("groundedness · RAGTruth Data2txt (no tuned parameter)",
                      _score([truth[i] for i in d2t], [ratings[i] == "yes" for i in d2t])))
    pooled_truth += [truth[i] for i in d2t]
    pooled_predicted += [ratings[i] == "yes" for i in d2t]
    lines.append(_row("groundedness · RAGTruth all tasks (the held-out verdicts above, pooled)",
                      _score(pooled_truth, pooled_predicted)))
    abstained = sum(r == "error" for r in ratings)
    lines.append(
        f"| groundedness · RAGTruth: abstained (error) at the shipped parameters | {len(rows)} "
        f"| {abstained} rows ({100 * abstained / len(rows):.1f} %) | | |"
    )
    lines.append(f"| tuned on all rows (the shipped defaults) | {'; '.join(shipped)} | | | |")
    return lines


def _passes(grade: Callable[[JudgeInput], Verdict], item: JudgeInput) -> bool:
    return grade(item).rating == "yes"


def evaluate(
    name: str, rows: list[dict[str, object]], predict: Callable[[JudgeInput], bool]
) -> str:
    """One table row: agreement of `predict` (True = pass) with the rows' labels."""
    truth = [bool(r["label_pass"]) for r in rows]
    return _row(name, _score(truth, [predict(to_input(r)) for r in rows]))


def _references(row: dict[str, object]) -> list[str]:
    refs = row.get("reference")
    return [r for r in refs if isinstance(r, str)] if isinstance(refs, list) else []


def token_f1(answer: str, reference: str) -> float:
    """SQuAD's token F1 of two texts after `normalise_answer` (0 when either is empty)."""
    got, want = normalise_answer(answer).split(), normalise_answer(reference).split()
    common = sum((collections.Counter(got) & collections.Counter(want)).values())
    if not common:
        return 0.0
    precision, recall = common / len(got), common / len(want)
    return 2 * precision * recall / (precision + recall)


def evaluate_correctness(name: str, rows: list[dict[str, object]]) -> list[str]:
    """Rows for the correctness judge and two baselines on one reference set.

    The sets list several accepted answers per question (alternatives, not facts that must all
    be stated), so an answer passes when it matches any of them: the judge grades the answer
    against each as `expected_response`. The baselines: normalised containment (a reference
    appears in the answer) and SQuAD token F1 >= TOKEN_F1_PASS against the best reference (not
    tuned: the usual half-overlap cut).
    """
    judge = CorrectnessJudge()
    truth = [bool(r["label_pass"]) for r in rows]
    judged, contained, overlapping = [], [], []
    for r in rows:
        answer, refs = _text(r, "response"), _references(r)
        item = JudgeInput(_text(r, "question"), answer)
        judged.append(
            any(_passes(judge.grade, dataclasses.replace(item, expected_response=x)) for x in refs)
        )
        norm = f" {normalise_answer(answer)} "
        contained.append(any(f" {normalise_answer(x)} " in norm for x in refs))
        overlapping.append(max((token_f1(answer, x) for x in refs), default=0.0) >= TOKEN_F1_PASS)
    return [
        _row(f"{label} · {name}", _score(truth, predicted))
        for label, predicted in (
            ("correctness", judged),
            ("baseline: normalised containment", contained),
            (f"baseline: token F1 >= {TOKEN_F1_PASS}", overlapping),
        )
    ]


def throughput(inputs: Sequence[JudgeInput], repeats: int = 5) -> list[str]:
    """Events/s per core (CPU time) of the three judges together on `inputs`, median of
    passes."""
    judges = (GroundednessJudge(), SafetyJudge(), RelevanceToQueryJudge())
    lines = []
    # "unseen chunks": every event's chunks are new to the judge (memoised chunk analyses are
    # cleared before each pass; word stems stay cached as in a long-running worker).
    # "repeated chunks": the same retrieval results come back, as for popular questions.
    for label, clear in (("unseen chunks", True), ("repeated chunks", False)):
        rates = []
        per_judge: dict[str, list[float]] = {j.name: [] for j in judges}
        for _ in range(repeats):
            if clear:
                bag_of.cache_clear()
                _clear_evidence()
            gc.collect()
            # CPU time of this process: events/s per core, whatever else the machine runs.
            start = time.process_time()
            for item in inputs:
                for j in judges:
                    per_judge[j.name].append(j.grade(item).latency_seconds)
            rates.append(len(inputs) / (time.process_time() - start))
        lines.append(
            f"- {label}: {statistics.median(rates):,.0f} events/s per core (CPU time) for all "
            "three judges "
            f"(median of {repeats} passes over {len(inputs)} events); median µs per event: "
            + ", ".join(f"{n} {1e6 * statistics.median(v):.0f}" for n, v in per_judge.items())
        )
    return lines


def _clear_evidence() -> None:
    from ragpulse.judges.local import groundedness as local_groundedness

    local_groundedness._chunks_bag.cache_clear()
    local_groundedness._prefixes.cache_clear()
    local_groundedness._mostly_records.cache_clear()


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--folds", type=int, default=FOLDS,
                        help="folds of the check by source document (at least 2)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.folds < 2:
        parser.error("--folds must be at least 2")
    data: Path = args.data_dir
    if not (data / "ragtruth.dev.jsonl").is_file():
        print(
            f"eval data not found: {data}/ragtruth.dev.jsonl is missing. Pass --data-dir with the "
            "folder of labelled JSONL sets (shared/eval-data beside the repository).",
            file=sys.stderr,
        )
        return 2
    ragtruth = load_rows(data / "ragtruth.dev.jsonl")
    lines = [TABLE_HEAD]
    lines += evaluate_ragtruth(ragtruth, args.folds)
    secondary: list[tuple[str, str, Callable[[JudgeInput], Verdict]]] = [
        ("begin.dev.jsonl", "groundedness · BEGIN", GroundednessJudge().grade),
        ("openai_moderation.dev.jsonl", "safety · OpenAI moderation", SafetyJudge().grade),
        (
            "xstest.dev.jsonl",
            "relevance_to_query · XSTest (answered vs refused)",
            RelevanceToQueryJudge().grade,
        ),
    ]
    for file, name, grade in secondary:
        path = data / file
        if not path.is_file():
            lines.append(f"| {name} | missing: {file} | | | |")
            continue
        lines.append(evaluate(name, load_rows(path), functools.partial(_passes, grade)))
    for file, name in (("evouna.dev.jsonl", "EVOUNA"), ("openqa_eval_nq301.dev.jsonl", "NQ301")):
        path = data / file
        if not path.is_file():
            lines.append(f"| correctness · {name} | missing: {file} | | | |")
            continue
        lines += evaluate_correctness(name, load_rows(path))
    print("\n".join(lines))
    print()
    print("Throughput (RAGTruth inputs, CPU time of one core):")
    print("\n".join(throughput([to_input(r) for r in ragtruth])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
