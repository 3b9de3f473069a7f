"""Agreement of the local judges with human labels, and their throughput.

For whoever tunes or reviews the local judges. Reads the labelled sets in ../shared/eval-data
(never copied into the project) and prints a markdown table of balanced accuracy and Cohen's
kappa: groundedness on RAGTruth (QA, all tasks, per task, plus a 2-fold tune/test check) and
BEGIN, safety on the OpenAI moderation set, relevance_to_query on XSTest (answered vs refused),
correctness on EVOUNA and NQ301 (next to the normalised-containment baseline); then events/s
for the three default judges together. chunk_relevance and context_sufficiency have no labelled
set here; document_recall is deterministic.

    .venv/bin/python tests/bench/eval_local_judges.py [--data-dir ../shared/eval-data]
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

from ragpulse.judges.base import Chunk, JudgeInput, Verdict
from ragpulse.judges.local.correctness import CorrectnessJudge, normalise_answer
from ragpulse.judges.local.groundedness import (
    DEFAULT_MAX_UNSUPPORTED,
    DEFAULT_MIN_WORDS,
    SUMMARY_MAX_UNSUPPORTED,
    ClaimSupport,
    GroundednessJudge,
    first_unsupported,
    summary_shares,
    support_of_claims,
)
from ragpulse.judges.local.relevance import RelevanceToQueryJudge
from ragpulse.judges.local.safety import SafetyJudge
from ragpulse.judges.local.text import bag_of

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO.parent / "shared" / "eval-data"
# The small grid the 2-fold check tunes over: the groundedness judge's only two parameters.
GRID_MIN_WORDS = (2, 3, 4, 5, 6)
GRID_MAX_UNSUPPORTED = (0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.7)
GRID_SUMMARY_MAX_UNSUPPORTED = (0.2, 0.22, 0.24, 0.26, 0.28, 0.3, 0.32, 0.34, 0.36, 0.4)
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


def _fold(row: dict[str, object]) -> int:
    # RAGTruth ids are SOURCE-k (several responses per source); keep a source in one fold.
    source = str(row["id"]).rsplit("-", 1)[0]
    return zlib.crc32(source.encode()) % 2


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


def _tune(truth: Sequence[bool], supports: Sequence[list[ClaimSupport]]) -> tuple[int, float]:
    best = max(
        itertools.product(GRID_MIN_WORDS, GRID_MAX_UNSUPPORTED),
        key=lambda p: (balanced_accuracy(truth, _predict_grounded(supports, *p)), -p[0], -p[1]),
    )
    return best


def evaluate_ragtruth(rows: list[dict[str, object]]) -> list[str]:
    """Table rows for RAGTruth: QA, all, per task at the defaults; then the 2-fold check."""
    judge = GroundednessJudge()
    lines = []
    inputs = [to_input(r) for r in rows]
    ratings = [judge.grade(i).rating for i in inputs]
    predicted = [rating == "yes" for rating in ratings]
    truth = [bool(r["label_pass"]) for r in rows]
    tasks = [str(r.get("task")) for r in rows]

    def subset(task: str | None) -> str:
        # Rows the judge could not grade (error) are left out, and counted.
        idx = [i for i, t in enumerate(tasks) if task is None or t == task]
        graded = [i for i in idx if ratings[i] != "error"]
        name = f"groundedness · RAGTruth {task or 'all tasks'}"
        if len(graded) < len(idx):
            name += f" (abstained on {len(idx) - len(graded)} of {len(idx)})"
        if len({truth[i] for i in graded}) < 2:
            return f"| {name} | {len(graded)} | | | |"
        return _row(name, _score([truth[i] for i in graded], [predicted[i] for i in graded]))

    lines.append(subset("QA"))
    lines.append(subset(None))
    for task in sorted(set(tasks) - {"QA"}):
        lines.append(subset(task))

    # 2-fold: tune (min_words, max_unsupported) on one half of the QA sources, score the other.
    qa = [i for i, t in enumerate(tasks) if t == "QA"]
    supports = [
        support_of_claims(x.answer, [c.content for c in x.chunks], x.question)
        for x in (inputs[i] for i in qa)
    ]
    folds = [_fold(rows[i]) for i in qa]
    for tune_fold in (0, 1):
        tune = [k for k, f in enumerate(folds) if f == tune_fold]
        test = [k for k, f in enumerate(folds) if f != tune_fold]
        params = _tune([truth[qa[k]] for k in tune], [supports[k] for k in tune])
        test_truth = [truth[qa[k]] for k in test]
        tuned = _predict_grounded([supports[k] for k in test], *params)
        lines.append(
            _row(
                f"groundedness · RAGTruth QA fold {2 - tune_fold} "
                f"(tuned on fold {tune_fold + 1}: min_words={params[0]}, "
                f"max_unsupported={params[1]})",
                _score(test_truth, tuned),
            )
        )
        default = _predict_grounded(
            [supports[k] for k in test], DEFAULT_MIN_WORDS, DEFAULT_MAX_UNSUPPORTED
        )
        lines.append(
            _row(f"groundedness · RAGTruth QA fold {2 - tune_fold} (defaults)",
                 _score(test_truth, default))
        )
    # 2-fold for the summary rule: tune its threshold on one half of the summary sources,
    # score the other half (the shipped threshold was picked on all of them).
    summaries = [i for i, t in enumerate(tasks) if t == "Summary"]
    top_share = [
        max((share for _, share, _ in summary_shares(inputs[i].answer,
                                                     [c.content for c in inputs[i].chunks])),
            default=0.0)
        for i in summaries
    ]
    folds = [_fold(rows[i]) for i in summaries]
    for tune_fold in (0, 1):
        tune = [k for k, f in enumerate(folds) if f == tune_fold]
        test = [k for k, f in enumerate(folds) if f != tune_fold]
        best = max(GRID_SUMMARY_MAX_UNSUPPORTED, key=lambda t: (balanced_accuracy(
            [truth[summaries[k]] for k in tune], [top_share[k] <= t for k in tune]), -t))
        test_truth = [truth[summaries[k]] for k in test]
        for label, threshold in ((f"tuned on fold {tune_fold + 1}: max_unsupported={best}",
                                  best), ("defaults", SUMMARY_MAX_UNSUPPORTED)):
            lines.append(_row(
                f"groundedness · RAGTruth Summary fold {2 - tune_fold} ({label})",
                _score(test_truth, [top_share[k] <= threshold for k in test]),
            ))
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


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(list(argv) if argv is not None else None)
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
    lines += evaluate_ragtruth(ragtruth)
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
