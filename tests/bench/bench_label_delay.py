"""The labels-to-metric delay: a reviewer's label published -> its count on /metrics.

For whoever sets serve's --trigger-interval, or the stream's --early-firing, and wonders how
soon a label shows. A real Apache Kafka broker (tests/kafka_broker.py) and real `ragpulse serve`
subprocesses (local judges, one per --trigger-interval given, run side by side on the same
broker, each with its own topics): each repeat publishes a review item, then one label of it,
to every serve's review and labels topics at once and polls each /metrics every 10 ms until
`ragpulse_review_labels_total` shows it. Prints the median and the largest delay per serve,
and the median as a multiple of its trigger interval.

With --stream, side by side with the serves in the same run: `ragpulse stream` on Beam's Flink
runner (the services of tests/flink_runner.py, flags as tests/test_stream_flink_labels.py runs
it: --review-rate 1, --early-firing 2s, the default --out-of-orderness and
--partition-idle-after; --stream-flag adds more) while live events are produced (event times
now, 2 a second), and a `ragpulse exporter` subprocess on its ratings topic. Each repeat also
labels the next item the job queued on its review topic (a stream counts a label only of an
item it queued itself), published at the same instant as the serves' labels, and polls the
exporter's /metrics until the count shows it.

    RAGPULSE_CACHE=/var/cache/ragpulse .venv/bin/python tests/bench/bench_label_delay.py \\
        [--labels 20] [--trigger-interval 0.5 --trigger-interval 2] [--stream]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli import ragpulse, ragpulse_command
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka_broker import ApacheKafkaBroker
from processes import free_port, ready_server
from queued_items import queued_item
from serve_process import T0, Scrape, ServeProcess

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.formats.review import (
    LabelRecord,
    ReviewItem,
    decode_item,
    encode_label,
    label_id,
)

COUNTER = "ragpulse_review_labels_total"
JUDGE = "groundedness"
# The stream's flags besides its topics, as tests/test_stream_flink_labels.py submits it.
STREAM_FLAGS = [
    "--window=60s", "--allowed-lateness=10m", "--early-firing=2s", f"--judges={JUDGE}",
    "--judge-backend=local", "--review-rate=1", "--review-max-per-hour=100000",
    "--beam-arg=--checkpointing_interval=2000",
]


def label(event: str, version: str = "local", rating: str = "yes") -> LabelRecord:
    return LabelRecord(
        label_id=label_id(event, JUDGE, version, "bench"), event_id=event,
        judge=JUDGE, prompt_version=version, judge_rating=rating, verdict="right",
        reviewer="bench", labelled_at=datetime.now(UTC), reason="random",
    )


class StreamUnderTest:
    """`ragpulse stream` on Flink with live events, its review topic read as the job queues
    items, and `ragpulse exporter` on its ratings topic."""

    topic = "delay-stream"

    def __init__(self, broker: ApacheKafkaBroker, work: Path, flags: list[str]) -> None:
        self.broker = broker
        self.work = work
        self.flags = flags
        self.metrics_port = free_port()
        self._stop = threading.Event()
        self._items: list[ReviewItem] = []
        self._taken = 0

    @contextmanager
    def running(self) -> Iterator[StreamUnderTest]:
        from flink_runner import flink_services

        for suffix in ("", ".ratings", ".dlq", ".review", ".labels"):
            self.broker.create_topic(self.topic + suffix, 1)
        with ExitStack() as stack:
            log_dir = self.work / "flink"
            log_dir.mkdir()
            services = stack.enter_context(flink_services(log_dir))
            producer = threading.Thread(target=self._produce_events, daemon=True)
            producer.start()
            stack.callback(producer.join, 30)
            argv = ["stream", f"--kafka-bootstrap={self.broker.bootstrap}",
                    f"--topic={self.topic}", *STREAM_FLAGS, *self.flags, *services.stream_args]
            done = ragpulse(*argv, timeout=900)
            if done.returncode != 0 or "(job state RUNNING)" not in done.stderr:
                raise RuntimeError(f"the stream job did not start:\n{done.stderr[-4000:]}\n"
                                   f"{services.logs()}")
            health = free_port()
            stack.enter_context(ready_server(
                "exporter",
                [*ragpulse_command(), "exporter", "--kafka-bootstrap", self.broker.bootstrap,
                 "--ratings-topic", f"{self.topic}.ratings", "--metrics-port",
                 str(self.metrics_port), "--health-port", str(health), "--kafka-timeout", "5s"],
                self.work / "exporter.log", f"http://127.0.0.1:{health}/healthz", 60,
            ))
            reader = threading.Thread(target=self._read_items, daemon=True)
            reader.start()
            stack.callback(reader.join, 30)
            stack.callback(self._stop.set)  # first, when the block ends
            yield self

    def _produce_events(self) -> None:
        """Live events, 2 a second with event times now: the job's watermark moves on."""
        producer = KafkaProducer(bootstrap_servers=self.broker.bootstrap, linger_ms=5)
        try:
            seed = 0
            while not self._stop.wait(1.0):
                seed += 1
                for e in simulate(seed, 2, time.time(), rate=2):
                    producer.send(self.topic, value=e.payload, partition=0,
                                  timestamp_ms=int(time.time() * 1000))
                producer.flush(timeout=30)
        finally:
            producer.close()

    def _read_items(self) -> None:
        consumer = KafkaConsumer(bootstrap_servers=self.broker.bootstrap,
                                 enable_auto_commit=False)
        tp = TopicPartition(f"{self.topic}.review", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        try:
            while not self._stop.is_set():
                for batch in consumer.poll(timeout_ms=200).values():
                    self._items += [decode_item(r.value) for r in batch]
        finally:
            consumer.close(autocommit=False)

    def next_label(self, timeout: float = 600) -> bytes:
        """A label of the next item the job queued with a yes/no verdict (waits for one)."""
        deadline = time.monotonic() + timeout
        while True:
            while self._taken >= len(self._items):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the stream queued no item for review in {timeout}s")
                time.sleep(0.1)
            item = self._items[self._taken]
            self._taken += 1
            verdict = next(v for v in item.verdicts if v.judge == JUDGE)
            if verdict.rating in ("yes", "no"):  # another is not_binary, in no table
                return encode_label(
                    label(item.event_id, verdict.prompt_version, verdict.rating)
                )[1]

    def publish(self, value: bytes) -> None:
        self.broker.produce(f"{self.topic}.labels", [value], partition=0)

    def counted(self) -> float:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return Scrape.parse(response.read().decode()).total(COUNTER)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--labels", type=int, default=20)
    parser.add_argument("--trigger-interval", type=float, action="append", dest="intervals")
    parser.add_argument("--stream", action="store_true",
                        help="also `ragpulse stream` on Flink and its exporter, side by side")
    parser.add_argument("--stream-flag", action="append", default=[], dest="stream_flags",
                        help="a flag added to the stream's (repeatable), e.g. "
                        "--stream-flag=--early-firing=5s")
    args = parser.parse_args()
    intervals = args.intervals or [0.5, 2.0]
    broker = ApacheKafkaBroker()
    broker.start()
    serves: list[ServeProcess] = []
    work = Path(tempfile.mkdtemp(prefix="bench-label-delay-"))
    try:
        with contextlib.ExitStack() as stack:
            for i, interval in enumerate(intervals):
                topic = f"delay{i}"
                broker.create_topic(topic, 1)
                broker.create_topic(f"{topic}.labels", 1)
                broker.create_topic(f"{topic}.review", 1)
                broker.produce(topic, [e.payload for e in simulate(1, 20, T0, rate=2)],
                               partition=0)
                serve = ServeProcess(
                    broker.bootstrap, topic, work / f"state{i}.sqlite",
                    ["--trigger-interval", f"{interval}s", "--window", "10s"],
                )
                serves.append(serve.start())
            stream = (
                stack.enter_context(StreamUnderTest(broker, work, args.stream_flags).running())
                if args.stream else None
            )
            names = [f"serve --trigger-interval {i:g}s" for i in intervals]
            if stream is not None:
                names.append("stream (Flink) + exporter, "
                             + " ".join(["--early-firing=2s", *args.stream_flags]))
            delays = measure(broker, serves, stream, args.labels)
        for name, d in zip(names, delays, strict=True):
            print(f"{name}: labels {len(d)}, median delay {statistics.median(d):.3f}s, "
                  f"max {max(d):.3f}s")
        for interval, d in zip(intervals, delays, strict=False):
            print(f"serve --trigger-interval {interval:g}s: median / trigger interval "
                  f"{statistics.median(d) / interval:.2f}")
        base = statistics.median(delays[0])
        for name, d in zip(names[1:], delays[1:], strict=True):
            print(f"median delay of {name} / of {names[0]}: {statistics.median(d) / base:.2f}x")
    finally:
        for serve in serves:
            serve.stop()
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)


def measure(
    broker: ApacheKafkaBroker, serves: list[ServeProcess], stream: StreamUnderTest | None,
    labels: int,
) -> list[list[float]]:
    """Per serve (and the stream last): the delay of each label, published to all at once."""
    delays: list[list[float]] = [[] for _ in range(len(serves) + (stream is not None))]
    for n in range(labels):
        # Its item first, as the review queue publishes it before anyone can label it: a
        # label of no queued item is unknown_event and never counted.
        queued = queued_item(f"bench-{n}")
        for i in range(len(serves)):
            broker.produce(f"delay{i}.review", [queued], partition=0)
        _, value = encode_label(label(f"bench-{n}"))
        streamed = stream.next_label() if stream is not None else b""
        published = time.time()
        for i in range(len(serves)):
            broker.produce(f"delay{i}.labels", [value], partition=0)
        if stream is not None:
            stream.publish(streamed)
        waiting = set(range(len(delays)))
        while waiting:
            for i in list(waiting):
                shown = serves[i].metrics().total(COUNTER) if i < len(serves) else (
                    stream.counted() if stream is not None else 0)
                if shown >= n + 1:
                    delays[i].append(time.time() - published)
                    waiting.discard(i)
            time.sleep(0.01)
        print(f"label {n}: " + ", ".join(f"{d[-1]:.3f}s" for d in delays), flush=True)
    return delays


if __name__ == "__main__":
    main()
