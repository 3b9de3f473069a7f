"""Several `ragpulse serve` instances split one topic's partitions (--instance I --instances N),
against a real Apache Kafka broker, each a real subprocess with its own state file.

Together the instances count what one instance counts over the same data (nothing twice,
nothing lost), also when one of them is SIGKILLed mid-way and restarted; no instance reads,
saves or commits to the consumer group another's partitions. Bad assignments stop serve at
start with one line and exit code 2.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from cli import ragpulse_command, ragpulse_in_process
from cycle_holds import CycleHolds
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import Scrape, serve_processes_fixture, windows_rows  # noqa: F401
from test_serve import (
    JUDGES,
    T0,
    ServeFactory,
    caught_up,
    durable_counters,
    expected_sizes,
    judged_sizes,
    produce_round_robin,
    saved_offsets,
)

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.service.state import CycleOutcome, StateStore
from ragpulse.pipeline.sources.kafka import KafkaGroup, log_bounds

PARTITIONS = 4
EVENTS = 4_000  # 80 s of event time at 50 events/s: eight 10 s windows, 1,000 per partition
ARGS = [
    "--window", "10s",
    "--allowed-lateness", "5s",
    "--out-of-orderness", "0s",
    # A partition caught up for a moment while the producer writes another is not idle. The
    # tests that wait for a watermark at the last event need the grace to end: all partitions
    # idle, the watermark moves to the latest event time.
    "--partition-idle-after", "30s",
    "--max-batch-events", "200",
    "--judges", ",".join(JUDGES),
]
# For a test that waits for no watermark: a grace no stall of a loaded machine outlasts (at
# 30s, one instance's first cycle on one partition outlasted it, and the other partition's
# events went late: 375 verdicts for 400 events).
LONG_GRACE_ARGS = [*ARGS[: ARGS.index("--partition-idle-after")], "--partition-idle-after", "10m",
                   *ARGS[ARGS.index("--partition-idle-after") + 2 :]]

CounterKey = tuple[str, tuple[tuple[str, str], ...]]


def window_counts(rows: Iterable[Mapping[str, Any]]) -> Counter[tuple[str, str, str, str, str]]:
    """yes / no / error per (window, judge, app, model) and rating, summed over `rows`."""
    counts: Counter[tuple[str, str, str, str, str]] = Counter()
    for r in rows:
        for rating in ("yes", "no", "error"):
            key = (str(r["window_start"]), str(r["judge"]), str(r["app"]), str(r["model"]))
            counts[(*key, rating)] += int(r[rating])
    return counts


def added_up(scrapes: Sequence[Scrape]) -> dict[CounterKey, float]:
    """The durable counters of several instances, added up series by series."""
    total: Counter[CounterKey] = Counter()
    for scrape in scrapes:
        total.update(durable_counters(scrape))
    return dict(total)


def produce_interleaved(
    broker: ApacheKafkaBroker,
    topic: str,
    payloads: Sequence[bytes],
    partitions: int,
    chunk: int = 10,
) -> None:
    """Record i to partition i % partitions, as produce_round_robin places them, but written
    `chunk` records per partition in turn, so that every partition moves on together in
    event time, as a live producer's partitions do."""
    for at in range(0, len(payloads), chunk * partitions):
        block = payloads[at : at + chunk * partitions]
        for p in range(partitions):
            broker.produce(topic, list(block[p::partitions]), partition=(at + p) % partitions)


def lags_by_partition(scrape: Scrape) -> dict[int, float]:
    return {int(labels["partition"]): v for labels, v in scrape.select("ragpulse_consumer_lag")}


def lag_partitions(scrape: Scrape) -> set[int]:
    return set(lags_by_partition(scrape))


@pytest.mark.slow
@pytest.mark.timeout(1200)  # three serves over 4,000 events: minutes on a loaded machine
def test_two_instances_one_killed_and_restarted_count_together_what_one_instance_counts(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    broker = kafka_broker
    topic = "split"
    broker.create_topic(topic, PARTITIONS)
    events = list(simulate(5, EVENTS, T0, rate=50))
    payloads = [e.payload for e in events]
    last = max(e.event_time for e in events)
    # Half is a backlog when the instances start; the rest arrives while they run.
    produce_round_robin(broker, topic, payloads[: EVENTS // 2], PARTITIONS)
    # One instance over the same data, never killed, in a consumer group of its own. It runs
    # alongside the two (it reads every record they read, whenever it arrives), so that its
    # judging and its wait for the idle partitions overlap theirs instead of following them.
    reference_state = tmp_path / "reference.sqlite"
    reference = serve_processes(
        broker.bootstrap, topic, reference_state, [*ARGS, "--group-id", "reference"]
    ).start()

    def instance(i: int) -> list[str]:
        return [*ARGS, "--group-id", "split", "--instances", "2", "--instance", str(i)]

    states = [tmp_path / "instance-0.sqlite", tmp_path / "instance-1.sqlite"]
    first = serve_processes(broker.bootstrap, topic, states[0], instance(0)).start()
    holds = CycleHolds(tmp_path / "hooks")
    second = serve_processes(
        broker.bootstrap, topic, states[1], instance(1), env=holds.env
    ).start()
    second.wait_for(caught_up(200), 60, "a saved cycle of instance 1")
    # Killed mid-cycle: held after judging a batch of which nothing is saved.
    holds.hold("judged")
    produce_interleaved(broker, topic, payloads[EVENTS // 2 :], PARTITIONS)
    holds.wait_at("judged", second)
    assert second.kill() != 0
    killed_at = saved_offsets(states[1], topic)
    print(f"instance 1 killed with offsets {killed_at} saved")
    assert set(killed_at) == {1, 3} and sum(killed_at.values()) < EVENTS // 2

    # While instance 1 is down, instance 0 reads its own partitions to the end and leaves
    # partitions 1 and 3, in its state and in the consumer group, where instance 1 left them.
    mine = EVENTS // 2  # round robin: partitions 0 and 2 hold half of the events
    scrape = first.wait_for(caught_up(mine), 600, "instance 0 caught up")
    ends = log_bounds(broker.bootstrap, topic).ends
    assert saved_offsets(states[0], topic) == {0: ends[0], 2: ends[2]}
    group = KafkaGroup(broker.bootstrap, "split", topic).committed()
    assert {p: group.get(p) for p in (0, 2)} == {0: ends[0], 2: ends[2]}
    assert {p: group.get(p) for p in (1, 3)} == {p: killed_at.get(p) for p in (1, 3)}
    # The lag of every partition of the topic, the ones instance 1 left from the group's commits.
    # Waited for: the scrape that showed instance 0 caught up may come from a cycle that read
    # the log's ends before the producer's last records reached partitions 1 and 3.
    left = {p: ends[p] - killed_at[p] for p in (1, 3)}
    scrape = first.wait_for(
        lambda m: {p: lags_by_partition(m).get(p) for p in (1, 3)} == left, 60,
        "instance 0's lag of the partitions instance 1 left",
    )
    assert lag_partitions(scrape) == {0, 1, 2, 3}

    restarted = serve_processes(broker.bootstrap, topic, states[1], instance(1)).start()
    scrapes = [
        first.wait_for(caught_up(mine), 60, "instance 0"),
        restarted.wait_for(caught_up(EVENTS - mine), 600, "instance 1 restarted"),
    ]
    assert lag_partitions(scrapes[1]) == {0, 1, 2, 3}
    assert KafkaGroup(broker.bootstrap, "split", topic).committed() == ends

    reference_scrape = reference.wait_for(caught_up(EVENTS, last), 600, "reference")
    # Each instance's watermark follows its own partitions: caught up, it is the latest event
    # time of those partitions (--out-of-orderness 0s).
    for i, serve in enumerate((first, restarted)):
        own_last = max(e.event_time for n, e in enumerate(events) if n % PARTITIONS % 2 == i)
        scrapes[i] = serve.wait_for(caught_up(0, own_last), 60, f"instance {i}'s watermark")
        assert scrapes[i].value("ragpulse_watermark_timestamp_seconds") == own_last
    for serve in (first, restarted, reference):
        assert serve.terminate() == 0

    reference_rows = windows_rows(reference_state)
    for judge in JUDGES:
        assert judged_sizes(reference_rows, judge) == expected_sizes(events)
    split_rows = [row for state in states for row in windows_rows(state)]
    assert window_counts(split_rows) == window_counts(reference_rows)
    assert added_up(scrapes) == durable_counters(reference_scrape)
    assert reference_scrape.value("ragpulse_events_total", outcome="accepted") == EVENTS
    for scrape in (*scrapes, reference_scrape):
        assert scrape.total("ragpulse_late_events_total") == 0


def read_to_the_end(scrape: Scrape) -> bool:
    """At least the 200 records produced on the instance's partitions read, and no lag left
    (a recount from the log start would go on to 400 before its lag reached 0)."""
    lag = scrape.select("ragpulse_consumer_lag")
    return (
        bool(lag)
        and all(v == 0 for _, v in lag)
        and scrape.total("ragpulse_events_total") >= 200
    )


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_going_from_one_instance_to_two_with_state_reset_counts_nothing_twice(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    broker = kafka_broker
    topic = "rescale"
    broker.create_topic(topic, PARTITIONS)
    events = list(simulate(8, 800, T0, rate=50))
    payloads = [e.payload for e in events]
    produce_round_robin(broker, topic, payloads[:400], PARTITIONS)
    group = ["--group-id", "rescale"]
    one = serve_processes(
        broker.bootstrap, topic, tmp_path / "a.sqlite", [*LONG_GRACE_ARGS, *group]
    ).start()
    before = one.wait_for(caught_up(400), 300, "one instance caught up")
    assert one.terminate() == 0

    # The old file becomes instance 0's: it holds partitions 1 and 3 too, so it is moved aside
    # and instance 0 goes on from the group's offsets; instance 1 starts with no file at all.
    def instance(i: int) -> list[str]:
        return [*LONG_GRACE_ARGS, *group, "--instances", "2", "--instance", str(i),
                "--state-reset"]

    states = [tmp_path / "a.sqlite", tmp_path / "b.sqlite"]
    serves = [serve_processes(broker.bootstrap, topic, states[i], instance(i)).start()
              for i in range(2)]
    assert list(tmp_path.glob("a.sqlite.corrupt-*"))
    produce_round_robin(broker, topic, payloads[400:], PARTITIONS)
    after = [serve.wait_for(read_to_the_end, 300, f"instance {i}") for i, serve in
             enumerate(serves)]
    for serve in serves:
        assert serve.terminate() == 0
    ends = log_bounds(broker.bootstrap, topic).ends
    assert saved_offsets(states[0], topic) == {0: ends[0], 2: ends[2]}
    assert saved_offsets(states[1], topic) == {1: ends[1], 3: ends[3]}
    # Each event counted once: 400 by the one instance, the 400 after the change by the two.
    events_read = [s.total("ragpulse_events_total") for s in (before, *after)]
    assert events_read == [400, 200, 200]
    for judge in JUDGES:
        verdicts = sum(s.total("ragpulse_judge_verdicts_total", judge=judge) for s in after)
        accepted = sum(s.total("ragpulse_events_total", outcome="accepted") for s in after)
        assert verdicts == accepted


# `ragpulse serve` against a broker that is not there: it must stop before it asks.
SERVE_EXIT = (
    "--log-level", "WARNING", "serve", "--kafka-bootstrap", "127.0.0.1:9", "--topic", "split",
    "--kafka-timeout", "1s", "--judge-backend", "local",
)  # fmt: skip


def serve_exit(*args: str, state: Path) -> subprocess.CompletedProcess[str]:
    """`ragpulse serve` with `args` as a process (it opens the state file: a process of its
    own holds and lets go of the file's lock as a user's would)."""
    return subprocess.run(
        [*ragpulse_command(), *SERVE_EXIT, "--state", str(state), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--instances", "0"], "--instances: Input should be greater than or equal to 1"),
        (["--instance", "2", "--instances", "2"], "--instance: must be below --instances (2)"),
        (["--instance", "1"], "--instance: must be below --instances (1)"),
        (["--instance", "-1", "--instances", "2"], "--instance: Input should be greater"),
    ],
)
def test_an_assignment_outside_the_instances_is_a_one_line_error_with_exit_code_2(
    tmp_path: Path, args: list[str], said: str
) -> None:
    # The settings are refused before serve opens anything: main() in this process says it.
    done = ragpulse_in_process(*SERVE_EXIT, "--state", str(tmp_path / "state.sqlite"), *args)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("ragpulse serve: ") and said in line
    assert not (tmp_path / "state.sqlite").exists()


def test_a_state_file_of_another_assignment_is_refused_with_one_line_and_exit_code_2(
    tmp_path: Path,
) -> None:
    # The state file of instance 1 of 2 (partitions 1 and 3), started as instance 0 of 2: going
    # on would read partitions 0 and 2 from the start and never again 1 and 3. Also what two
    # instances given one state file, or an instance restarted with another --instances, meet.
    state = tmp_path / "instance-1.sqlite"
    with StateStore(state) as store:
        store.apply_cycle("split", CycleOutcome(offsets={1: 120, 3: 118}))
    done = serve_exit("--instance", "0", "--instances", "2", state=state)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "holds offsets of partitions 1,3 of 'split'" in line
    assert "--instance 0 --instances 2 does not read" in line
    # The file is left as it was, for the instance it belongs to (which the test above runs).
    with StateStore(state) as store:
        assert store.offsets("split") == {1: 120, 3: 118}
