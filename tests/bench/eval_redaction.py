"""How often PII redaction changes a local judge's verdict, on the labelled dev sets.

For whoever decides whether to redact what judges read. Every row is judged twice by the local
judge of its set (offline), once on the raw text and once with question, answer and chunks
redacted by `judges.redaction.Redactor`; prints per set the rows, the rows whose text redaction
changed, the verdict flips and the flip rate, the balanced accuracy against the human labels
both ways, and which placeholders were inserted. Reads ../shared/eval-data (never copied).

    .venv/bin/python tests/bench/eval_redaction.py [--data-dir ../shared/eval-data]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from eval_local_judges import DEFAULT_DATA_DIR, balanced_accuracy, load_rows, to_input

from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.judges.local.groundedness import GroundednessJudge
from ragpulse.judges.local.relevance import RelevanceToQueryJudge
from ragpulse.judges.local.safety import SafetyJudge
from ragpulse.judges.redaction import Redactor

SETS: list[tuple[str, str, Callable[[JudgeInput], Verdict]]] = [
    ("ragtruth.dev.jsonl", "groundedness", GroundednessJudge().grade),
    ("begin.dev.jsonl", "groundedness", GroundednessJudge().grade),
    ("openai_moderation.dev.jsonl", "safety", SafetyJudge().grade),
    ("xstest.dev.jsonl", "relevance_to_query", RelevanceToQueryJudge().grade),
]
_PLACEHOLDER = re.compile(r"\[(EMAIL|PHONE|CARD|IBAN|IP|API_KEY|TOKEN)\]")


def _texts(item: JudgeInput) -> list[str]:
    return [item.question, item.answer, *(c.content for c in item.chunks)]


def evaluate(path: Path, judge: str, grade: Callable[[JudgeInput], Verdict]) -> str:
    """One table row for one data set."""
    redactor = Redactor()
    rows = load_rows(path)
    changed = flips = 0
    truth, raw_pass, red_pass = [], [], []
    kinds: collections.Counter[str] = collections.Counter()
    for row in rows:
        item = to_input(row)
        redacted = redactor.judge_input(item)
        if _texts(redacted) != _texts(item):
            changed += 1
            for text in _texts(redacted):
                kinds.update(_PLACEHOLDER.findall(text))
        raw, red = grade(item).rating, grade(redacted).rating
        flips += raw != red
        truth.append(bool(row["label_pass"]))
        raw_pass.append(raw == "yes")
        red_pass.append(red == "yes")
    n = len(rows)
    shown = ", ".join(f"{k} {v}" for k, v in kinds.most_common()) or "none"
    return (
        f"| {path.stem.removesuffix('.dev')} | {judge} | {n} | {changed} ({changed / n:.1%}) | "
        f"{flips} | {flips / n:.2%} | {balanced_accuracy(truth, raw_pass):.3f} | "
        f"{balanced_accuracy(truth, red_pass):.3f} | {shown} |"
    )


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    args = parser.parse_args(list(argv) if argv is not None else None)
    data: Path = args.data_dir
    missing = [f for f, _, _ in SETS if not (data / f).is_file()]
    if missing:
        print(
            f"eval data not found in {data}: {', '.join(missing)}. Pass --data-dir with the "
            "folder of labelled JSONL sets (shared/eval-data beside the repository).",
            file=sys.stderr,
        )
        return 2
    print(
        "| set | judge | rows | rows changed by redaction | verdict flips | flip rate | "
        "balanced acc. raw | balanced acc. redacted | placeholders inserted |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for file, judge, grade in SETS:
        print(evaluate(data / file, judge, grade), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
