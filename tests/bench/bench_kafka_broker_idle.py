"""CPU of the tests' Apache Kafka broker (tests/kafka_broker.py) while it idles, with the
tests' configuration and with one setting changed, side by side in one run.

Each round starts a broker, waits `--settle` seconds (start-up and JIT), then reads the
broker's CPU time (/proc/<pid>/stat, all its threads) over `--measure` seconds of doing
nothing, and stops it. The variants alternate round by round; the table gives the median share
of one core and the thread group that used the most. Needs `make kafka` (the jars).

    .venv/bin/python tests/bench/bench_kafka_broker_idle.py [--rounds 3]

Found with it (stop 39): `log.segment.delete.delay.ms=0` makes Kafka's segment-deletion task
reschedule itself with no delay for ever; the idle broker then burns ~9 % of a core in its
`kafka-scheduler` threads.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the broker

from kafka_broker import ApacheKafkaBroker

VARIANTS: dict[str, dict[str, str]] = {
    "tests' configuration": {},
    "log.segment.delete.delay.ms=0": {"log.segment.delete.delay.ms": "0"},
}
TICK = os.sysconf("SC_CLK_TCK")


def thread_ticks(pid: int) -> dict[str, tuple[str, int]]:
    """{thread id: (thread name, user + system clock ticks)} of every thread of `pid`."""
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            name = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        fields = stat.rsplit(")", 1)[1].split()
        found[tid] = (name, int(fields[11]) + int(fields[12]))
    return found


def one_round(config: dict[str, str], settle: float, measure: float) -> tuple[float, str]:
    broker = ApacheKafkaBroker(broker_config=config)
    broker.start()
    try:
        time.sleep(settle)
        before = thread_ticks(broker.pid)
        time.sleep(measure)
        after = thread_ticks(broker.pid)
    finally:
        broker.stop()
    by_name: collections.Counter[str] = collections.Counter()
    for tid, (name, ticks) in after.items():
        by_name[name] += ticks - before.get(tid, (name, 0))[1]
    share = sum(by_name.values()) / TICK / measure * 100
    top, ticks = by_name.most_common(1)[0]
    return share, f"{top} ({ticks / TICK / measure * 100:.1f} %)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle", type=float, default=20.0)
    parser.add_argument("--measure", type=float, default=30.0)
    args = parser.parse_args()
    shares: dict[str, list[float]] = {name: [] for name in VARIANTS}
    tops: dict[str, str] = {}
    for _ in range(args.rounds):
        for name, config in VARIANTS.items():
            share, tops[name] = one_round(config, args.settle, args.measure)
            shares[name].append(share)
    print(f"Idle Apache Kafka broker, {args.rounds} rounds of {args.measure:.0f} s after "
          f"{args.settle:.0f} s: median % of one core")
    print("| configuration | % of a core | busiest threads (last round) |")
    print("|---|---|---|")
    for name, values in shares.items():
        print(f"| {name} | {statistics.median(values):.1f} | {tops[name]} |")


if __name__ == "__main__":
    main()
