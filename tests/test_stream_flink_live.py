"""`ragpulse stream` on Flink as a chatbot feeds it: events produced while the job runs, into a
topic of two partitions of which one stays empty, and a backlog drained to the last window.

    producer (while the job is RUNNING) -> partition 0 of the topic; partition 1 gets nothing
    -> `ragpulse stream` (ragpulse's Kafka read, java/kafka-read: the legacy UnboundedSource read
       with PartitionWatermarkPolicy; an embedded Flink through Beam's job server)
    -> the ratings topic, read here pane by pane with the time each pane was read

What must hold (issue 30, items 2-4): early panes while a window is open; the window's on-time
pane while events keep arriving (the empty partition does not hold the watermark once it has
been idle for --partition-idle-after), with every event of the window counted; a late event
gives a late pane; and a drained backlog (twice) gives every window all its events in its
on-time pane (no late pane, nothing dropped as too late). The
delay of each on-time pane after its window's end is printed (docs/figures.md quotes it), not
asserted: it depends on the machine.

The services come from tests/flink_runner.py (`make stream-tools` builds them).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence

import pytest
from flink_runner import FlinkServices, flink  # noqa: F401
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from test_stream_flink import cancel_jobs, submit, wait_until

from ragpulse.pipeline.commands.simulate import SimulatedEvent, simulate
from ragpulse.pipeline.formats import rating_rows
from ragpulse.pipeline.formats.rating_rows import RatingPane

pytestmark = [pytest.mark.slow, pytest.mark.flink, pytest.mark.timeout(3600)]

WINDOW_S = 20
JUDGES = "groundedness,safety"
IDLE_AFTER_S = 5
# How long the producer goes on at most while waiting for the job's first pane (Flink deploys
# the job and the Python workers start: over 7 min on a 2-core machine at load 26), then for
# each pane after it (seconds once the job runs).
FIRST_PANE_WITHIN_S = 1200.0
LIVE_FOR_AT_MOST_S = 600.0


def stream_argv(bootstrap: str, topic: str, services: FlinkServices, group: str) -> list[str]:
    return [
        "stream",
        f"--kafka-bootstrap={bootstrap}",
        f"--topic={topic}",
        f"--window={WINDOW_S}s",
        "--allowed-lateness=10m",
        "--early-firing=5s",
        "--out-of-orderness=1s",
        f"--partition-idle-after={IDLE_AFTER_S}s",
        f"--kafka-consumer-config=group.id={group}",
        f"--judges={JUDGES}",
        "--judge-backend=local",
        *services.stream_args,
        "--beam-arg=--checkpointing_interval=2000",
    ]


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()


class TimedPanes:
    """Reads the ratings topic from the start; keeps each pane with the wall time it was read."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        self.consumer: KafkaConsumer | None = consumer
        self.panes: list[tuple[float, RatingPane]] = []

    def poll(self) -> list[tuple[float, RatingPane]]:
        """The panes read so far, after reading what has come (nothing once closed)."""
        if self.consumer is not None:
            for batch in self.consumer.poll(timeout_ms=200).values():
                now = time.time()
                self.panes.extend((now, rating_rows.decode(r.value)) for r in batch)
        return self.panes

    def of_window(self, start: float, timing: str) -> list[tuple[float, RatingPane]]:
        return [(at, p) for at, p in self.poll()
                if p.key.window_start == start and p.timing == timing]

    def close(self) -> None:
        """Reads what has come, then closes the consumer; the panes read stay."""
        if self.consumer is not None:
            self.poll()
            self.consumer.close(autocommit=False)
            self.consumer = None


def window_start(t: float) -> float:
    return t - t % WINDOW_S


def judged(panes: Sequence[RatingPane], judge: str) -> int:
    """Events counted for `judge` by the latest pane of each (app, model) among `panes`."""
    latest: dict[tuple[str, str], RatingPane] = {}
    for p in panes:
        label = (p.key.app, p.key.model)
        if p.key.judge == judge and (label not in latest or p.index > latest[label].index):
            latest[label] = p
    return sum(p.counts.yes + p.counts.no + p.counts.error for p in latest.values())


def app_and_model(event: SimulatedEvent) -> tuple[str, str]:
    """The app and model a simulated event's payload names (its pane row's labels)."""
    fields = json.loads(event.payload)
    return fields["app"], fields["model"]


def event_at(seed: int, event_time: float) -> SimulatedEvent:
    """One simulated chatbot event whose own timestamp is `event_time`."""
    (event,) = simulate(seed, 1, event_time)
    return event


def send(producer: KafkaProducer, topic: str, event: SimulatedEvent, stamp: float) -> None:
    producer.send(topic, value=event.payload, partition=0, timestamp_ms=int(stamp * 1000))


def test_live_events_give_early_on_time_and_late_panes_while_one_partition_stays_empty(
    kafka_broker: ApacheKafkaBroker, flink: FlinkServices  # noqa: F811
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = "live-logs"
    create_topic(bootstrap, topic, 2)
    create_topic(bootstrap, f"{topic}.ratings", 1)
    create_topic(bootstrap, f"{topic}.dlq", 1)
    panes = TimedPanes(bootstrap, f"{topic}.ratings")
    sent: Counter[float] = Counter()  # events produced per window start
    sent_lock = threading.Lock()
    stop = threading.Event()
    # One event a second into partition 0, made when it is produced: its event time and its
    # Kafka record time are the chatbot's clock then; a window's events all come before its end.

    def produce() -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=0)
        try:
            for seed in itertools.count():
                if stop.is_set():
                    break
                now = time.time()
                send(producer, topic, event_at(seed, now), now)
                producer.flush(timeout=30)
                with sent_lock:
                    sent[window_start(now)] += 1
                stop.wait(1.0)
        finally:
            producer.close()

    try:
        submit(stream_argv(bootstrap, topic, flink, "ragpulse-live"), flink)
        producer = threading.Thread(target=produce, name="chatbot", daemon=True)
        producer.start()
        # The job is "RUNNING" for Beam's job service before Flink has deployed its tasks: the
        # first pane says it reads. The next window to open is the first one whose events all
        # come while the job runs.
        wait_until(lambda: panes.poll(), "the job's first pane", timeout=FIRST_PANE_WITHIN_S,
                   logs=flink.logs)
        first = window_start(time.time()) + WINDOW_S
        # Its early pane, then its on-time pane, while the producer keeps producing.
        wait_until(lambda: panes.of_window(first, "early"), "an early pane of the first window",
                   timeout=LIVE_FOR_AT_MOST_S, logs=flink.logs)
        (on_time_at, _), *_ = wait_until(
            lambda: panes.of_window(first, "on_time"),
            "the first window's on-time pane while events keep arriving",
            timeout=LIVE_FOR_AT_MOST_S, logs=flink.logs)
        assert producer.is_alive()  # events were still arriving when the pane came out
        # Two more windows on time, live, then a late event for the first window.
        second, third = first + WINDOW_S, first + 2 * WINDOW_S
        wait_until(lambda: panes.of_window(third, "on_time"), "the third window's on-time pane",
                   timeout=LIVE_FOR_AT_MOST_S, logs=flink.logs)
        stop.set()
        producer.join(timeout=60)
        late_producer = KafkaProducer(bootstrap_servers=bootstrap)
        try:
            send(late_producer, topic, event_at(10**6, first + 1), first + 1)
            late_producer.flush(timeout=30)
        finally:
            late_producer.close()
        # Each judge's late pane (one read alone is not the window's latest state).
        wait_until(lambda: {p.key.judge for _, p in panes.of_window(first, "late")}
                   == set(JUDGES.split(",")), "the first window's late panes",
                   timeout=LIVE_FOR_AT_MOST_S, logs=flink.logs)
    finally:
        stop.set()
        cancel_jobs(flink)
        panes.close()

    for start in (first, second, third):
        on_time = [p for _, p in panes.of_window(start, "on_time")]
        early = [p for _, p in panes.of_window(start, "early")]
        delays = [round(at - (start + WINDOW_S), 1) for at, _ in panes.of_window(start, "on_time")]
        print(f"window {start:.0f}: {len(early)} early panes, on-time pane read {delays} s "
              f"after the window's end, {sent[start]} events")
        for judge in JUDGES.split(","):
            # Every event of the window, and nothing else, is in its on-time pane.
            assert judged(on_time, judge) == sent[start], (start, judge)
    # The late event's pane (of its own app and model) on top of the on-time ones: the
    # window's latest panes count it too.
    late = panes.of_window(first, "late")
    after_late = [p for _, p in panes.of_window(first, "on_time") + late]
    assert all(judged(after_late, j) == sent[first] + 1 for j in JUDGES.split(","))
    print(f"first on-time pane read {on_time_at - (first + WINDOW_S):.1f} s after its window's end")


BACKLOG_WINDOWS = 8
BACKLOG_PER_WINDOW = 250


# Twice: whether an event reaches the windowing after the watermark depends on where Flink's
# checkpoints fall in the drain (every 2 s); each run is a new job, topic and group.
@pytest.mark.parametrize("run", [1, 2])
def test_a_drained_backlog_gives_every_window_all_its_events_in_its_on_time_pane(
    kafka_broker: ApacheKafkaBroker, flink: FlinkServices, run: int  # noqa: F811
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = f"backlog-logs-{run}"
    create_topic(bootstrap, topic, 2)
    create_topic(bootstrap, f"{topic}.ratings", 1)
    create_topic(bootstrap, f"{topic}.dlq", 1)
    # A backlog of whole windows in the recent past, produced before the job is submitted, into
    # both partitions (in turn), each record stamped with its event time.
    t0 = window_start(time.time()) - (BACKLOG_WINDOWS + 2) * WINDOW_S
    backlog = list(simulate(31, BACKLOG_WINDOWS * BACKLOG_PER_WINDOW, t0,
                            rate=BACKLOG_PER_WINDOW / WINDOW_S))
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for i, e in enumerate(backlog):
            producer.send(topic, value=e.payload, partition=i % 2,
                          timestamp_ms=int(e.event_time * 1000))
        producer.flush(timeout=60)
    finally:
        producer.close()
    expected = Counter(window_start(e.event_time) for e in backlog)
    assert len(expected) == BACKLOG_WINDOWS
    judges = JUDGES.split(",")
    # A window's on-time pane is one row per (judge, app, model) of its events; the rows come
    # from two GroupByKey subtasks and through the ratings topic at their own moments, so the
    # test waits for every row, not the first one of each window.
    rows = {(window_start(e.event_time), judge, *app_and_model(e))
            for e in backlog for judge in judges}
    panes = TimedPanes(bootstrap, f"{topic}.ratings")
    try:
        submit(stream_argv(bootstrap, topic, flink, f"ragpulse-backlog-{run}"), flink)
        wait_until(lambda: rows <= {(p.key.window_start, p.key.judge, p.key.app, p.key.model)
                                    for _, p in panes.poll() if p.timing == "on_time"},
                   "the on-time pane of every window of the backlog, each (judge, app, model)",
                   timeout=FIRST_PANE_WITHIN_S, logs=flink.logs)
    finally:
        cancel_jobs(flink)
        panes.close()

    def counted(w: float, *timings: str) -> dict[str, int]:
        return {j: judged([p for t in timings for _, p in panes.of_window(w, t)], j)
                for j in judges}

    print(f"backlog run {run}: events per window", [expected[w] for w in sorted(expected)],
          "counted in the on-time panes", [counted(w, "on_time") for w in sorted(expected)],
          "late panes", [len(panes.of_window(w, "late")) for w in sorted(expected)])
    # Every event of the backlog is in its window's on-time pane: none reached the windowing
    # after the watermark had passed its window (no late pane, nothing dropped as too late).
    assert {w: counted(w, "on_time") for w in expected} == {
        w: dict.fromkeys(judges, expected[w]) for w in expected}
    assert [p for _, p in panes.poll() if p.timing == "late"] == []
