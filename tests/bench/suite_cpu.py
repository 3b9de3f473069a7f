"""Where the suite's CPU goes, module by module: a pytest plugin that records each test's wall
time and the CPU time of the test process and of the child processes it reaped during the test
(servers a module fixture started are counted at the module's last test, when they are
stopped; the session's Kafka broker at the session's last test), and a report of those records.

    PYTHONPATH=tests/bench PYTEST_ADDOPTS="-p suite_cpu" SUITE_CPU_OUT=/tmp/cpu.jsonl make test
    .venv/bin/python tests/bench/suite_cpu.py /tmp/cpu.jsonl      # modules by CPU-seconds

Works with pytest-xdist (each worker appends its own lines). docs/figures.md (stop 38) quotes
what it found: the suite is CPU-bound on 2 cores, so its time follows its CPU-seconds.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

OUT_ENV = "SUITE_CPU_OUT"


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    started, (own, children) = time.time(), _cpu()
    yield
    ended, (own_after, children_after) = time.time(), _cpu()
    record = {"test": item.nodeid, "worker": os.environ.get("PYTEST_XDIST_WORKER"),
              "start": started, "wall": ended - started, "own_cpu": own_after - own,
              "children_cpu": children_after - children}
    with Path(os.environ.get(OUT_ENV, "suite-cpu.jsonl")).open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def report(path: Path, top: int = 30) -> str:
    by_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for line in path.read_text(encoding="utf-8").splitlines():
        r = json.loads(line)
        totals = by_module[r["test"].split("::")[0]]
        totals[0] += 1
        totals[1] += r["wall"]
        totals[2] += r["own_cpu"] + r["children_cpu"]
    cpu = sum(t[2] for t in by_module.values())
    lines = [f"{len(by_module)} modules, {cpu:,.0f} CPU-seconds in all", "",
             f"{'module':52} {'tests':>5} {'wall s':>8} {'CPU s':>8} {'share':>6}"]
    for module, (tests, wall, used) in sorted(by_module.items(), key=lambda kv: -kv[1][2])[:top]:
        lines.append(f"{module:52} {tests:5.0f} {wall:8.1f} {used:8.1f} {used / cpu:6.1%}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(report(Path(sys.argv[1])))
