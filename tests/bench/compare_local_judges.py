"""Events/s per core (CPU time) of the three default local judges of this tree and of another git
revision, side by side in one run (rounds interleaved), each in its own process.

For reviewing a change anywhere in judges/ (text analysis, groundedness, safety, relevance):
the revision's whole `judges/` folder is exported next to this tree's `pipeline/`, and each
round runs one process per tree that times the three judges over the RAGTruth inputs the way
eval_local_judges.py's throughput does: one warm-up pass (word stems and pieces cached, as in a
long-running worker), then passes with every memoised chunk analysis cleared ("unseen chunks")
and passes without clearing ("repeated chunks").

    .venv/bin/python tests/bench/compare_local_judges.py --ref HEAD~1 [--rounds 5]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO.parent / "shared" / "eval-data"
# Memoised analyses of chunks, by module: cleared before each "unseen chunks" pass (those a
# revision lacks are skipped).
_CHUNK_CACHES = (
    ("ragpulse.judges.local.text", "bag_of"),
    ("ragpulse.judges.local.groundedness", "_chunks_bag"),
    ("ragpulse.judges.local.groundedness", "_prefixes"),
)


def measure(events: Path, passes: int) -> dict[str, list[float]]:
    """The subprocess side: events/s per pass of the three judges of the imported tree."""
    import importlib

    from ragpulse.judges.base import Chunk, JudgeInput
    from ragpulse.judges.local.groundedness import GroundednessJudge
    from ragpulse.judges.local.relevance import RelevanceToQueryJudge
    from ragpulse.judges.local.safety import SafetyJudge

    inputs = [
        JudgeInput(question=q, answer=a, chunks=tuple(Chunk(c) for c in chunks))
        for q, a, chunks in json.loads(events.read_text(encoding="utf-8"))
    ]
    judges = (GroundednessJudge(), SafetyJudge(), RelevanceToQueryJudge())
    caches = [
        getattr(importlib.import_module(module), name)
        for module, name in _CHUNK_CACHES
        if hasattr(importlib.import_module(module), name)
    ]
    for item in inputs:  # warm-up
        for judge in judges:
            judge.grade(item)
    rates: dict[str, list[float]] = {"unseen chunks": [], "repeated chunks": []}
    for _ in range(passes):
        for label, values in rates.items():
            if label == "unseen chunks":
                for cache in caches:
                    cache.cache_clear()
            gc.collect()
            start = time.process_time()
            for item in inputs:
                for judge in judges:
                    judge.grade(item)
            values.append(len(inputs) / (time.process_time() - start))
    return rates


def export_revision(ref: str, folder: Path) -> Path:
    """A `ragpulse` package of `ref`'s judges/ and this tree's pipeline/, under `folder`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", ref, "judges", "ragpulse/__init__.py"],
        capture_output=True, check=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    package = folder / "ragpulse"
    (package / "judges").symlink_to(folder / "judges")
    (package / "pipeline").symlink_to(REPO / "pipeline")
    return folder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ref", default="HEAD~1")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3, help="timed passes per process")
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the events' file
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure(args.measure, args.passes)))
        return 0
    if not (args.data_dir / "ragtruth.dev.jsonl").is_file():
        print(f"eval data not found: {args.data_dir}/ragtruth.dev.jsonl", file=sys.stderr)
        return 2
    # The inputs as eval_local_judges.py reads them (this tree's reader, for both trees).
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from eval_local_judges import load_rows, to_input

    inputs = [to_input(r) for r in load_rows(args.data_dir / "ragtruth.dev.jsonl")]
    rates: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.json"
        events.write_text(json.dumps(
            [(i.question, i.answer, [c.content for c in i.chunks]) for i in inputs]))
        trees = {args.ref: export_revision(args.ref, Path(tmp) / "ref"), "this tree": REPO}
        for _ in range(args.rounds):
            for name, root in trees.items():
                done = subprocess.run(
                    [sys.executable, __file__, "--measure", str(events),
                     "--passes", str(args.passes)],
                    capture_output=True, text=True, check=True, cwd=tmp,
                    env=dict(os.environ, PYTHONPATH=str(root)),
                )
                for label, values in json.loads(done.stdout).items():
                    rates.setdefault((name, label), []).extend(values)
    n = args.rounds * args.passes
    print(f"| judges of | chunks | events/s per core, 3 judges (median of {n} passes) |")
    print("|---|---|---|")
    for (name, label), values in sorted(rates.items(), key=lambda kv: kv[0][1]):
        print(f"| {name} | {label} | {statistics.median(values):,.0f} |")
    for label in ("unseen chunks", "repeated chunks"):
        ratio = statistics.median(rates[("this tree", label)]) / statistics.median(
            rates[(args.ref, label)])
        print(f"- {label}: this tree / {args.ref} = {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
