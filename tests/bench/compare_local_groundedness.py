"""Events/s per core (CPU time) of the local judges with this tree's groundedness judge and
with the one of another git revision, side by side in one run (passes interleaved).

For reviewing a change to judges/local/groundedness.py: the revision's file is loaded as a
module next to this tree's (its imports resolve against this tree, so it must still import).

    .venv/bin/python tests/bench/compare_local_groundedness.py --ref HEAD~1
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from eval_local_judges import DEFAULT_DATA_DIR, REPO, load_rows, to_input

import ragpulse.judges.local.groundedness as current
from ragpulse.judges.local.relevance import RelevanceToQueryJudge
from ragpulse.judges.local.safety import SafetyJudge
from ragpulse.judges.local.text import bag_of

# Revisions before the ragpulse.* layout kept the judge at judges/local_groundedness.py and
# imported its neighbours by their old names.
_OLD_IMPORTS = (
    ("from judges.local import LocalJudge, UnsupportedInput",  # abstained with a removed error
     "from ragpulse.judges.local.judge import CannotGrade as UnsupportedInput, LocalJudge"),
    ("from judges.local import ", "from ragpulse.judges.local.judge import "),
    ("from judges.local_", "from ragpulse.judges.local."),
    ("from judges.", "from ragpulse.judges."),
    ("from judges import ", "from ragpulse.judges import "),
)


def load_revision(ref: str, folder: Path) -> ModuleType:
    for old_path in ("judges/local/groundedness.py", "judges/local_groundedness.py"):
        shown = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{ref}:{old_path}"], capture_output=True, text=True
        )
        if shown.returncode == 0:
            break
    shown.check_returncode()
    source = shown.stdout
    for old, new in _OLD_IMPORTS:
        source = source.replace(old, new)
    path = folder / "revision_groundedness.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("ragpulse.judges.revision_groundedness", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--ref", default="HEAD~1")
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR)
    parser.add_argument("--passes", type=int, default=7)
    args = parser.parse_args()
    inputs = [to_input(r) for r in load_rows(args.data_dir / "ragtruth.dev.jsonl")]
    others = (SafetyJudge(), RelevanceToQueryJudge())
    with tempfile.TemporaryDirectory() as tmp:
        modules = {args.ref: load_revision(args.ref, Path(tmp)), "this tree": current}
        rates: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.passes):
            for name, module in modules.items():
                judge = module.GroundednessJudge()
                for label in ("unseen chunks", "repeated chunks"):
                    if label == "unseen chunks":
                        bag_of.cache_clear()
                        for cached in ("_chunks_bag", "_prefixes"):
                            if hasattr(module, cached):
                                getattr(module, cached).cache_clear()
                    gc.collect()
                    start = time.process_time()
                    for item in inputs:
                        judge.grade(item)
                        for other in others:
                            other.grade(item)
                    rates.setdefault((name, label), []).append(
                        len(inputs) / (time.process_time() - start))
    print(f"| groundedness of | chunks | events/s per core, 3 judges (median of {args.passes}) |")
    print("|---|---|---|")
    for (name, label), values in rates.items():
        print(f"| {name} | {label} | {statistics.median(values):,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
