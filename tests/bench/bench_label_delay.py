"""The labels-to-metric delay: a reviewer's label published -> its count on serve's /metrics.

For whoever sets serve's --trigger-interval and wonders how soon a label shows. A real Apache
Kafka broker (tests/kafka_broker.py) and real `ragpulse serve` subprocesses (local judges, one
per --trigger-interval given, run side by side on the same broker, each with its own topics):
each repeat publishes a review item, then one label of it, to every serve's review and labels
topics at once and polls each /metrics
every 10 ms until `ragpulse_review_labels_total` shows it. Prints the median and the largest
delay per serve, and the median as a multiple of its trigger interval.

    RAGPULSE_CACHE=/var/cache/ragpulse .venv/bin/python tests/bench/bench_label_delay.py \\
        [--labels 20] [--trigger-interval 0.5 --trigger-interval 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kafka_broker import ApacheKafkaBroker
from queued_items import queued_item
from serve_process import T0, ServeProcess

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.formats.review import LabelRecord, encode_label, label_id

COUNTER = "ragpulse_review_labels_total"


def label(n: int) -> LabelRecord:
    event = f"bench-{n}"
    return LabelRecord(
        label_id=label_id(event, "groundedness", "local", "bench"), event_id=event,
        judge="groundedness", prompt_version="local", judge_rating="yes", verdict="right",
        reviewer="bench", labelled_at=datetime.now(UTC), reason="random",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--labels", type=int, default=20)
    parser.add_argument("--trigger-interval", type=float, action="append", dest="intervals")
    args = parser.parse_args()
    intervals = args.intervals or [0.5, 2.0]
    broker = ApacheKafkaBroker()
    broker.start()
    serves: list[ServeProcess] = []
    work = Path(tempfile.mkdtemp(prefix="bench-label-delay-"))
    try:
        for i, interval in enumerate(intervals):
            topic = f"delay{i}"
            broker.create_topic(topic, 1)
            broker.create_topic(f"{topic}.labels", 1)
            broker.create_topic(f"{topic}.review", 1)
            broker.produce(topic, [e.payload for e in simulate(1, 20, T0, rate=2)], partition=0)
            serve = ServeProcess(
                broker.bootstrap, topic, work / f"state{i}.sqlite",
                ["--trigger-interval", f"{interval}s", "--window", "10s"],
            )
            serves.append(serve.start())
        delays: list[list[float]] = [[] for _ in serves]
        for n in range(args.labels):
            # Its item first, as the review queue publishes it before anyone can label it: a
            # label of no queued item is unknown_event and never counted.
            queued = queued_item(f"bench-{n}")
            for i in range(len(serves)):
                broker.produce(f"delay{i}.review", [queued], partition=0)
            _, value = encode_label(label(n))
            published = time.time()
            for i in range(len(serves)):
                broker.produce(f"delay{i}.labels", [value], partition=0)
            waiting = set(range(len(serves)))
            while waiting:
                for i in list(waiting):
                    if serves[i].metrics().total(COUNTER) >= n + 1:
                        delays[i].append(time.time() - published)
                        waiting.discard(i)
                time.sleep(0.01)
        for interval, d in zip(intervals, delays, strict=True):
            median = statistics.median(d)
            print(f"--trigger-interval {interval:g}s: labels {len(d)}, median delay "
                  f"{median:.3f}s, max {max(d):.3f}s, median / trigger interval "
                  f"{median / interval:.2f}")
        if len(delays) > 1:
            base = statistics.median(delays[0])
            for interval, d in zip(intervals[1:], delays[1:], strict=True):
                print(f"median delay at {interval:g}s / at {intervals[0]:g}s: "
                      f"{statistics.median(d) / base:.2f}x")
    finally:
        for serve in serves:
            serve.stop()
        broker.stop()


if __name__ == "__main__":
    main()
