"""`bench_pipeline.py` of two (or more) checkouts, side by side in one run.

For whoever changes the graph or the stages and must show a cycle got no slower. Each repeat
runs every checkout's own `tests/bench/bench_pipeline.py` once (a subprocess with that
checkout first on PYTHONPATH, the same events, the same seed), interleaved so that drift on a
shared machine hits each alike, and prints the medians of its rows (c) and (d): the whole Beam
run with the three local judges, and with the safety judge alone (Beam and I/O overhead).

    .venv/bin/python tests/bench/compare_pipeline.py --code OLD_CHECKOUT --code NEW_CHECKOUT \
        [--events 20000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROWS = {"(c)": "run, 3 local judges", "(d)": "run, safety only"}
_ROW = re.compile(r"^\| (\([cd]\)) [^|]*\| ([\d.]+) \| ([\d.]+) \| ([\d,]+) \|")


def once(code: Path, events: int) -> dict[str, tuple[float, float, float]]:
    """(wall s, CPU s, events/s) of rows (c) and (d) from one run of the checkout's bench."""
    out = subprocess.run(
        [sys.executable, str(code / "tests" / "bench" / "bench_pipeline.py"),
         "--events", str(events), "--repeats", "1"],
        cwd=code, env={**os.environ, "PYTHONPATH": str(code)},
        capture_output=True, text=True, check=True,
    ).stdout
    found = {}
    for line in out.splitlines():
        m = _ROW.match(line)
        if m:
            found[m.group(1)] = (float(m.group(2)), float(m.group(3)),
                                 float(m.group(4).replace(",", "")))
    if set(found) != set(ROWS):
        raise RuntimeError(f"rows (c) and (d) not found in the output of {code}:\n{out}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code", action="append", required=True, type=Path, metavar="DIR")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    codes = [c.resolve() for c in args.code]
    runs: dict[Path, list[dict[str, tuple[float, float, float]]]] = {c: [] for c in codes}
    for r in range(args.repeats):
        for code in codes:
            runs[code].append(once(code, args.events))
            wall, _, rate = runs[code][-1]["(c)"]
            print(f"repeat {r + 1} {code}: (c) {wall:.2f} s wall, {rate:,.0f} events/s",
                  flush=True)
    print(f"\n### bench_pipeline.py side by side: {args.events:,} events, medians of "
          f"{args.repeats} interleaved runs, {os.cpu_count()} CPUs\n")
    print("| checkout | row | wall s | CPU s | events/s |")
    print("|---|---|---:|---:|---:|")
    for code in codes:
        for name, what in ROWS.items():
            wall, cpu, rate = (statistics.median(run[name][i] for run in runs[code])
                               for i in range(3))
            print(f"| {code} | {name} {what} | {wall:.2f} | {cpu:.2f} | {rate:,.0f} |")
    if len(codes) == 2:
        a, b = codes
        for name in ROWS:
            ratio = statistics.median(x[name][0] for x in runs[b]) / statistics.median(
                x[name][0] for x in runs[a])
            print(f"\n{name}: wall time of {b.name} / {a.name} = {ratio:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
