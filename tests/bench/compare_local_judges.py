"""Events/s per core (CPU time) of the three default local judges of this tree and of another git
revision, side by side in one run (rounds interleaved), each in its own process.

For reviewing a change anywhere in judges/ (text analysis, groundedness, safety, relevance):
the revision's whole `judges/` folder is exported next to this tree's `pipeline/`, and each
round starts one process per tree that times the three judges over the RAGTruth inputs the way
eval_local_judges.py's throughput does: one warm-up pass (word stems and pieces cached, as in a
long-running worker), then passes with every memoised chunk analysis cleared ("unseen chunks")
and passes without clearing ("repeated chunks"). The two processes take turns pass by pass (each
waits for the other's pass to end), so that a change in the machine's load hits both alike.

    .venv/bin/python tests/bench/compare_local_judges.py --ref HEAD~1 [--rounds 5] [--passes 3]

On a busy machine the time of one pass varies by more than a small change saves (the same code
on both sides: 0.94x-1.17x). `--instructions` counts instead the machine instructions of one
"unseen chunks" pass of each tree under valgrind's callgrind (counting only that pass, after the
warm-up; string hashing fixed by PYTHONHASHSEED=0): the same count to 0.01 % every run, whatever
the load (valgrind: `make bench-deps`). Instructions are not time (a cache miss costs more
than an instruction): read both.

    .venv/bin/python tests/bench/compare_local_judges.py --ref HEAD~1 --instructions
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DATA_DIR = REPO.parent / "shared" / "eval-data"
# Memoised analyses of chunks, by module: cleared before each "unseen chunks" pass (those a
# revision lacks are skipped).
_CHUNK_CACHES = (
    ("ragpulse.judges.local.text", "bag_of"),
    ("ragpulse.judges.local.groundedness", "_chunks_bag"),
    ("ragpulse.judges.local.groundedness", "_prefixes"),
    ("ragpulse.judges.local.groundedness", "_mostly_records"),
)


def _judges_and_caches(events: Path) -> tuple[list[Any], tuple[Any, ...], list[Any]]:
    """The inputs, the three judges and the chunk memos of the imported tree, warmed up."""
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
    return inputs, judges, caches


def measure_instructions(events: Path) -> None:
    """The subprocess side of --instructions, run under callgrind with instrumentation off:
    on for one "unseen chunks" pass, by callgrind_control on this process."""
    inputs, judges, caches = _judges_and_caches(events)
    for cache in caches:
        cache.cache_clear()
    gc.collect()
    pid = str(os.getpid())
    subprocess.run(["callgrind_control", "--instr=on", pid], check=True, capture_output=True)
    for item in inputs:
        for judge in judges:
            judge.grade(item)
    subprocess.run(["callgrind_control", "--instr=off", pid], check=True, capture_output=True)


_COLLECTED_RE = re.compile(r"Collected : (\d+)")


def count_instructions(root: Path, events: Path, cwd: str) -> int:
    """Instructions of one unseen-chunks pass of the three judges of the tree at `root`."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("--instructions needs valgrind's callgrind: run `make bench-deps` "
                         "(installs the Debian package valgrind)")
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--callgrind-out-file=/dev/null",
         sys.executable, __file__, "--measure-instructions", str(events)],
        capture_output=True, text=True, cwd=cwd,
        env=dict(os.environ, PYTHONPATH=str(root), PYTHONHASHSEED="0"),
    )
    found = _COLLECTED_RE.search(done.stderr)
    if done.returncode != 0 or found is None or int(found.group(1)) == 0:
        tail = done.stderr[-800:]
        raise RuntimeError(f"callgrind counted nothing (exit {done.returncode}): {tail}")
    return int(found.group(1))


def measure(events: Path) -> None:
    """The subprocess side: for each line read ("pass"), one timed pass of each kind of the
    three judges of the imported tree, written as one JSON line {label: events/s}."""
    inputs, judges, caches = _judges_and_caches(events)
    print("ready", flush=True)
    for _ in sys.stdin:
        rates: dict[str, float] = {}
        for label in ("unseen chunks", "repeated chunks"):
            if label == "unseen chunks":
                for cache in caches:
                    cache.cache_clear()
            gc.collect()
            start = time.process_time()
            for item in inputs:
                for judge in judges:
                    judge.grade(item)
            rates[label] = len(inputs) / (time.process_time() - start)
        print(json.dumps(rates), flush=True)


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


def _reply(worker: subprocess.Popen[str]) -> str:
    assert worker.stdout is not None
    line = worker.stdout.readline()
    if not line:
        raise RuntimeError(f"the measuring process ended (exit code {worker.wait()})")
    return line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ref", default="HEAD~1")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--rounds", type=int, help="rounds of one process per tree (5)")
    parser.add_argument("--passes", type=int, help="timed passes per process (3)")
    parser.add_argument(
        "--instructions", action="store_true",
        help="count instructions of one unseen-chunks pass under callgrind instead of timing",
    )
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)  # the events' file
    parser.add_argument("--measure-instructions", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.measure)
        return 0
    if args.measure_instructions:
        measure_instructions(args.measure_instructions)
        return 0
    if args.instructions and (args.rounds is not None or args.passes is not None):
        print("--instructions counts one pass: --rounds and --passes do not apply", file=sys.stderr)
        return 2
    args.rounds = 5 if args.rounds is None else args.rounds
    args.passes = 3 if args.passes is None else args.passes
    if args.instructions and shutil.which("valgrind") is None:
        print("--instructions needs valgrind (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
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
        if args.instructions:
            counts = {name: count_instructions(root, events, tmp) for name, root in trees.items()}
            print("| judges of | instructions per event, 3 judges (one unseen-chunks pass) |")
            print("|---|---|")
            for name, count in counts.items():
                print(f"| {name} | {count / len(inputs):,.0f} |")
            print(f"- unseen chunks: {args.ref} / this tree = "
                  f"{counts[args.ref] / counts['this tree']:.3f}x the instructions")
            return 0
        for round_number in range(args.rounds):
            # Which tree goes first matters on a loaded machine (measured: about 10 % in favour
            # of the first, with the same code on both sides): the order flips every round
            # and every pass.
            order = list(trees.items())[:: -1 if round_number % 2 else 1]
            workers = {
                name: subprocess.Popen(
                    [sys.executable, __file__, "--measure", str(events)],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=tmp,
                    env=dict(os.environ, PYTHONPATH=str(root)),
                )
                for name, root in order
            }
            try:
                for worker in workers.values():
                    _reply(worker)  # "ready": warmed up
                for pass_number in range(args.passes):
                    turns = list(workers.items())[:: -1 if pass_number % 2 else 1]
                    for name, worker in turns:  # one pass each, in turn
                        assert worker.stdin is not None
                        worker.stdin.write("pass\n")
                        worker.stdin.flush()
                        for label, value in json.loads(_reply(worker)).items():
                            rates.setdefault((name, label), []).append(value)
            finally:
                for worker in workers.values():
                    if worker.stdin is not None:
                        worker.stdin.close()
                    worker.wait()
    n = args.rounds * args.passes
    print(f"| judges of | chunks | events/s per core, 3 judges (median of {n} passes) |")
    print("|---|---|---|")
    for (name, label), values in sorted(rates.items(), key=lambda kv: kv[0][1]):
        print(f"| {name} | {label} | {statistics.median(values):,.0f} |")
    for label in ("unseen chunks", "repeated chunks"):
        ours, theirs = rates[("this tree", label)], rates[(args.ref, label)]
        ratio = statistics.median(ours) / statistics.median(theirs)
        # Pass i of one tree ran right before or after pass i of the other: the ratio of each
        # such pair (their geometric mean, as each tree went first in half of them).
        paired = statistics.geometric_mean([a / b for a, b in zip(ours, theirs, strict=True)])
        print(f"- {label}: this tree / {args.ref} = {ratio:.2f}x "
              f"(geometric mean of the {n} passes' ratios, pass by pass: {paired:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
