"""The layout's figures that ARCHITECTURE.md quotes: import circles and upward imports (the
checks of tests/test_import_layers.py, counted instead of asserted), and Python modules and
lines per folder of pipeline/ and judges/.

    .venv/bin/python tests/bench/layout_figures.py
"""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))

from test_import_layers import _circles, _graph, _upward_imports  # noqa: E402


def main() -> int:
    graph = _graph()
    circles = _circles(graph)
    upward = _upward_imports(graph)
    print(f"import circles: {len(circles)}")
    for circle in circles:
        print("  " + " <-> ".join(circle))
    print(f"upward imports: {len(upward)}")
    for importer, imported in upward:
        print(f"  {importer} -> {imported}")
    folders: dict[str, list[int]] = defaultdict(list)
    for top in ("pipeline", "judges"):
        for path in sorted((REPO / top).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            lines = len(path.read_text("utf-8").splitlines())
            folders[path.parent.relative_to(REPO).as_posix()].append(lines)
    print("\n| folder | modules | lines |\n|---|---|---|")
    for folder, sizes in sorted(folders.items()):
        print(f"| {folder}/ | {len(sizes)} | {sum(sizes):,} |")
    every = [n for sizes in folders.values() for n in sizes]
    print(f"| all | {len(every)} | {sum(every):,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
