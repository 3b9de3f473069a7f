"""`ragpulse align` on the human-labelled dev sets: agreement before and after alignment, by the
command's own cross-validation, with the stand-in judge that follows the examples it is shown.

For whoever changes the choice of examples (pipeline/review/alignment.py). Reads
../shared/eval-data (never copied into the project) and, for each set whose judge ragpulse has,
takes up to --rows labelled rows (half passing, half failing, picked by a hash of their id),
writes them as review items and labels (the human verdict as the label, as a reviewer would give
it), and runs the real `ragpulse align` against tests/fake_openai.py's server answering with
tests/example_judge.py's model. It prints one markdown table row per set: balanced accuracy and
kappa before and after with their intervals, the judge's mistakes before and after, and how
many replies followed an example; and, where a local judge grades the same question, that
judge's agreement on the same rows (a local judge has no prompt: alignment does not apply to
it; the figure is the reference a prompt must beat).

The stand-in is no model: without an example like the event it fails an answer only when it
holds the marker word (so on real data it passes everything: balanced accuracy 0.5), and with
one it copies that example's rating. Its figures show what the examples chosen from labelled
mistakes do to a judge that copies near neighbours, not how a real model improves.

    .venv/bin/python tests/bench/bench_align.py [--data-dir ../shared/eval-data] [--rows 200]
        [--similarity 0.5]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))

from example_judge import ExampleFollowingJudge  # noqa: E402
from fake_openai import FakeOpenAI  # noqa: E402

from ragpulse.judges.base import Chunk, JudgeInput  # noqa: E402
from ragpulse.judges.local.judge import build_local_judges  # noqa: E402
from ragpulse.pipeline.calibration import (  # noqa: E402
    Interval,
    balanced_accuracy,
    bootstrap_interval,
    cohen_kappa,
    verdict_value,
)
from ragpulse.pipeline.formats.review import (  # noqa: E402
    JudgeView,
    LabelRecord,
    ReviewChunk,
    ReviewItem,
    label_id,
)

REPO = TESTS.parent
DEFAULT_DATA_DIR = REPO.parent / "shared" / "eval-data"
T0 = datetime(2025, 11, 20, 10, 0, tzinfo=UTC)
# Dev set -> the ragpulse judge that asks its question (xstest: answered or refused, the nearest
# is relevance to the query).
SETS = {
    "ragtruth.dev.jsonl": "groundedness",
    "begin.dev.jsonl": "groundedness",
    "openai_moderation.dev.jsonl": "safety",
    "xstest.dev.jsonl": "relevance_to_query",
}
MAX_CHARS = 6000  # a review item's text, as a queue would hold a long answer whole; bounded here


def rows_of(path: Path, n: int) -> list[dict[str, Any]]:
    """Up to n labelled rows, half passing and half failing, in the order of a hash of their
    id (so reruns take the same rows)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("label_pass") is not None and r.get("response")]
    rows.sort(key=lambda r: zlib.crc32(str(r["id"]).encode()))
    passing = [r for r in rows if r["label_pass"]][: n // 2]
    failing = [r for r in rows if not r["label_pass"]][: n - len(passing)]
    return passing + failing


def item_and_label(row: dict[str, Any], judge: str) -> tuple[ReviewItem, LabelRecord]:
    truth = "yes" if row["label_pass"] else "no"
    context = row.get("context") or ""
    item = ReviewItem(
        event_id=str(row["id"]), app="eval", model="dev-set", event_time=T0, window_start=T0,
        window_end=T0.replace(minute=5), reason="random",
        request=(row.get("question") or "")[:MAX_CHARS] or "(no request)",
        response=row["response"][:MAX_CHARS],
        chunks=(ReviewChunk(content=context[:MAX_CHARS]),) if context else (),
        verdicts=(JudgeView(judge=judge, rating=truth, prompt_version="v1f2"),),
        redacted=False, queued_at=T0,
    )
    label = LabelRecord(
        label_id=label_id(item.event_id, judge, "v1f2", "dev-set"), event_id=item.event_id,
        judge=judge, prompt_version="v1f2", judge_rating=truth, verdict="right",
        reviewer="dev-set", labelled_at=T0, reason="random",
    )
    return item, label


def local_reference(rows: list[dict[str, Any]], judge: str) -> tuple[Interval, Interval]:
    """The local judge's balanced accuracy and kappa on the rows (errors left out)."""
    (local,) = build_local_judges((judge,))
    pairs = []
    for row in rows:
        item = JudgeInput(question=row.get("question") or "", answer=row["response"],
                          chunks=(Chunk(row["context"]),) if row.get("context") else ())
        value = verdict_value(local.grade(item))  # type: ignore[attr-defined]
        if value is not None:
            pairs.append(("yes" if row["label_pass"] else "no", value))
    return bootstrap_interval(pairs, balanced_accuracy), bootstrap_interval(pairs, cohen_kappa)


def fmt(i: dict[str, Any] | Interval) -> str:
    d = i if isinstance(i, dict) else {"value": i.value, "low": i.low, "high": i.high}
    if d["value"] is None:
        return "-"
    if d["low"] is None:
        return f"{d['value']:.3f}"
    return f"{d['value']:.3f} [{d['low']:.3f}, {d['high']:.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--similarity", type=float, default=0.5,
                        help="the stand-in follows an example at least this alike (Jaccard)")
    parser.add_argument("--examples", type=int, default=6)
    args = parser.parse_args()
    print("| set (judge) | rows | balanced accuracy before | after | kappa before | after | "
          "change in kappa | mistakes before -> after | replies following an example | "
          "local judge: balanced accuracy, kappa |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, judge in SETS.items():
        path = args.data_dir / name
        if not path.exists():
            print(f"| {name} | missing | | | | | | | | |")
            continue
        rows = rows_of(path, args.rows)
        model = ExampleFollowingJudge(args.similarity)
        with tempfile.TemporaryDirectory() as tmp, FakeOpenAI(reply_for=model) as server:
            items, labels = zip(*(item_and_label(r, judge) for r in rows), strict=True)
            (Path(tmp) / "items.jsonl").write_text(
                "".join(i.model_dump_json() + "\n" for i in items))
            (Path(tmp) / "labels.jsonl").write_text(
                "".join(x.model_dump_json() + "\n" for x in labels))
            done = subprocess.run(
                [sys.executable, "-m", "ragpulse.pipeline.cli", "--log-level", "WARNING",
                 "align", "--judge", judge, "--labels", f"{tmp}/labels.jsonl", "--items",
                 f"{tmp}/items.jsonl", "--output", f"{tmp}/out", "--examples",
                 str(args.examples), "--judge-backend", "openai", "--judge-base-url",
                 server.base_url, "--judge-model", "stand-in", "--judge-cache-size", "0",
                 "--redact-pii", "off"],
                capture_output=True, text=True, check=False,
            )
            if done.returncode != 0:
                print(f"| {name} ({judge}) | align failed: {done.stderr.strip()[-300:]} |")
                continue
            report = json.loads((Path(tmp) / "out" / "align-report.json").read_text())
        cv = report["cross_validation"]
        try:
            local_ba, local_kappa = local_reference(rows, judge)
            local = f"{fmt(local_ba)}, {fmt(local_kappa)}"
        except ValueError as exc:
            local = f"- ({exc})"
        calls = len(model.examples_seen)
        print(f"| {name.removesuffix('.dev.jsonl')} ({judge}) | {cv['graded']} | "
              f"{fmt(cv['before_balanced_accuracy'])} | {fmt(cv['after_balanced_accuracy'])} | "
              f"{fmt(cv['before_kappa'])} | {fmt(cv['after_kappa'])} | "
              f"{fmt(cv['change_kappa'])} | {cv['mistakes_before']} -> {cv['mistakes_after']} | "
              f"{model.followed} of {calls} | {local} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
