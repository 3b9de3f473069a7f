"""What the review queue costs per judged event, beside what judging it costs.

For whoever turns on --review-rate. Per judged event (simulated traffic, three local judges),
median of R runs over N events, measured side by side in one process:

    judge      the three local judges' grading (the work every judged event gets anyway)
    decide     `queue_reason` alone: what every judged event pays with the queue on
    queue      `review_item` + `encode_item` (redacted): what a queued event pays on top

    .venv/bin/python tests/bench/bench_review_queue.py [--events N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ragpulse.judges import TextPolicy
from ragpulse.judges.base import SyncJudge
from ragpulse.judges.local.judge import build_local_judges
from ragpulse.pipeline.commands.simulate import Incidents, simulate
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.formats.review import encode_item
from ragpulse.pipeline.kafka_security import PLAINTEXT
from ragpulse.pipeline.records import JudgedEvent
from ragpulse.pipeline.sinks.kafka import KafkaTopic
from ragpulse.pipeline.stages.review import ReviewQueueConfig, queue_reason, review_item

T0 = 1_763_632_800.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    judges = [j for j in build_local_judges(("groundedness", "safety", "relevance_to_query"))
              if isinstance(j, SyncJudge)]
    records = [
        parse_event(e.payload)
        for e in simulate(3, args.events, T0, rate=10, incidents=Incidents(
            groundedness_drop_at=0.0, drop_to=0.5))
        if e.kind != "malformed"
    ]
    config = ReviewQueueConfig(
        target=KafkaTopic("127.0.0.1:9", PLAINTEXT, "chat.review", 5.0), rate=0.05,
        targets=("disagreement", "unsure", "failing"), unsure_band=0.1, max_per_hour=200,
        window_seconds=300.0, policy=TextPolicy("on"),
    )
    timings: dict[str, list[float]] = {"judge": [], "decide": [], "queue": []}
    for _ in range(args.repeats):
        start = time.perf_counter()
        judged = [
            JudgedEvent(r, tuple(j.grade(r.judge_input) for j in judges), ("local",) * 3)
            for r in records
        ]
        timings["judge"].append((time.perf_counter() - start) / len(records))
        start = time.perf_counter()
        reasons = [queue_reason(j, config) for j in judged]
        timings["decide"].append((time.perf_counter() - start) / len(records))
        start = time.perf_counter()
        for j in judged:
            encode_item(review_item(j, "failing", ("groundedness",), config, T0))
        timings["queue"].append((time.perf_counter() - start) / len(records))
    queued = sum(r is not None for r in reasons)
    print(f"{len(records)} judged events, {queued} would be queued (before the hourly bound)")
    judge = statistics.median(timings["judge"])
    for name, values in timings.items():
        median = statistics.median(values)
        print(f"{name:7s} {median * 1e6:9.1f} us/event  ({median / judge:.3f}x the judging)")


if __name__ == "__main__":
    main()
