"""`ragpulse serve` as a subprocess against a real Apache Kafka broker, with the local judges.

Input comes from `pipeline.commands.simulate` with fixed seeds and start times, so what each
window must
hold is known before serve runs. Results are read the way operators read them: /metrics (parsed
with prometheus-client), /healthz, `ragpulse windows` on the state file, and the dead-letter topic.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from cycle_holds import CycleHolds
from kafka_broker import ApacheKafkaBroker, for_module, kafka_broker  # noqa: F401
from serve_process import (
    T0,
    WINDOW_ARGS,
    Scrape,
    ServeProcess,
    TopicFactory,
    caught_up,
    produce_round_robin,
    saved_offsets,
    windows_rows,
)

from ragpulse.pipeline.commands.simulate import Incidents, SimulatedEvent, simulate
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.service.state import StateStore
from ragpulse.pipeline.sources.kafka import log_bounds

JUDGES = ("groundedness", "safety", "relevance_to_query")

ServeFactory = Callable[..., ServeProcess]
# A guard against hangs, not a speed bound: a serve test takes minutes at load 20 on 2 cores.
pytestmark = pytest.mark.timeout(300)


# --- helpers -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    """One broker for the tests that never stop it; each test uses its own topics."""
    yield from for_module(apache_kafka)


def window_of(event_time: float, size: float = 10.0) -> str:
    start = event_time - event_time % size
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))


def expected_sizes(events: Sequence[SimulatedEvent]) -> Counter[tuple[str, str, str]]:
    """Valid events per (window_start, app, model): what each judge's yes+no+error must be."""
    sizes: Counter[tuple[str, str, str]] = Counter()
    for e in events:
        if e.kind != "malformed":
            body = json.loads(e.payload)
            sizes[(window_of(e.event_time), body["app"], body["model"])] += 1
    return sizes


def judged_sizes(rows: Sequence[dict[str, Any]], judge: str) -> Counter[tuple[str, str, str]]:
    return Counter(
        {
            (str(r["window_start"]), str(r["app"]), str(r["model"])): int(r["yes"])
            + int(r["no"])
            + int(r["error"])
            for r in rows
            if r["judge"] == judge
        }
    )


def durable_counters(scrape: Scrape) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every ragpulse counter that the state file carries (not cycles, not latency sums)."""
    return {
        (name, tuple(sorted(labels.items()))): value
        for name, labels, value in scrape.samples
        if name.startswith("ragpulse_")
        and name.endswith("_total")
        and name != "ragpulse_cycles_total"
    }


# --- 1. the happy path -------------------------------------------------------------------------


def test_events_produced_while_serving_are_judged_into_metrics_and_saved_windows(
    served_topic: TopicFactory,
) -> None:
    # One partition: with no allowed lateness, a second partition that the producer fills a
    # moment later would not hold the watermark back (it is idle) and its events would be late.
    topic = served_topic("live")
    events = list(simulate(1, 250, T0, rate=10))  # 25 s: windows :00 and :10 close, :20 stays open
    serve = topic.serve("--allowed-lateness", "0s", "--out-of-orderness", "0s")
    serve.wait_for(lambda m: m.total("ragpulse_cycles_total", outcome="ok") >= 1, 30)

    topic.produce(events)
    last_time = max(e.event_time for e in events)
    m = serve.wait_for(caught_up(250, last_time), 60, "all 250 events read")

    assert m.value("ragpulse_events_total", outcome="accepted") == 250
    assert m.value("ragpulse_events_total", outcome="invalid") == 0
    assert m.total("ragpulse_events_judged_total") == 250
    for judge in JUDGES:
        assert m.total("ragpulse_judge_verdicts_total", judge=judge) == 250
        assert m.total("ragpulse_judge_calls_total", judge=judge, backend="local") == 250
    rows = serve.windows()
    expected = expected_sizes(events)
    for judge in JUDGES:
        assert judged_sizes(rows, judge) == expected
    # The gauges show the latest complete window (10:00:10) and the open one (10:00:20).
    for row in rows:
        labels = {"judge": str(row["judge"]), "version": str(row["version"]),
                  "app": str(row["app"]), "model": str(row["model"])}
        graded = int(row["yes"]) + int(row["no"])
        if row["window_start"] == "2025-11-20T10:00:10Z":
            assert row["complete"] is True
            assert m.value("ragpulse_judge_window_samples", **labels) == graded
            assert m.value("ragpulse_judge_pass_ratio", **labels) == pytest.approx(
                row["percentage"]
            )
        elif row["window_start"] == "2025-11-20T10:00:20Z":
            assert row["complete"] is False
            assert m.value("ragpulse_judge_in_progress_window_samples", **labels) == graded
    verdicts_by_rating: Counter[tuple[str, str]] = Counter()
    for lab, value in m.select("ragpulse_judge_verdicts_total"):
        verdicts_by_rating[(lab["judge"], lab["rating"])] += int(value)
    saved_by_rating: Counter[tuple[str, str]] = Counter()
    for row in rows:
        for rating in ("yes", "no", "error"):
            saved_by_rating[(str(row["judge"]), rating)] += int(row[rating])
    assert +saved_by_rating == +verdicts_by_rating
    assert serve.terminate() == 0


# --- 2. exactly once under SIGKILL -------------------------------------------------------------

BACKLOG_EVENTS = 20_000
BACKLOG_ARGS = [
    "--max-batch-events",
    "2000",  # ten cycles for the backlog
    "--allowed-lateness",
    "30s",  # windows complete while the backlog is read
    "--out-of-orderness",
    "0s",
]


@pytest.mark.timeout(600)
def test_sigkill_at_several_points_of_a_backlog_then_restart_counts_what_an_uncrashed_run_counts(
    served_topic: TopicFactory, serve_processes: ServeFactory, tmp_path: Path
) -> None:
    events = list(simulate(2, BACKLOG_EVENTS, T0, rate=50))  # 400 s of event time, 40 windows
    backlog = served_topic("backlog", 2, events)
    last = max(e.event_time for e in events)
    # The reference reads the same backlog with the same settings, side by side, never killed,
    # in a consumer group of its own: two live serves committing one group's partitions are
    # the mistake serve stops on (pipeline/service/owners.py).
    reference_state = tmp_path / "reference.sqlite"
    reference = backlog.serve(*BACKLOG_ARGS, "--group-id", "reference", state=reference_state)

    state = backlog.state  # the crashed run's
    saved_at_kill: list[int] = []
    # Kill 1 lands in the first cycle, its ranges planned and nothing read; kills 2 and 3 land
    # after a cycle of theirs was saved, in the next one, judged and not saved: held there by
    # the cycle hooks, so the kills land mid-backlog however fast the machine reads it.
    for n, after_a_saved_cycle in enumerate((False, True, True)):
        holds = CycleHolds(tmp_path / f"hooks-{n}")
        holds.hold("saved" if after_a_saved_cycle else "planned")
        crashing = serve_processes(
            backlog.broker.bootstrap, backlog.name, state, [*WINDOW_ARGS, *BACKLOG_ARGS],
            env=holds.env,
        ).start()
        if after_a_saved_cycle:
            holds.wait_at("saved", crashing)
            holds.hold("judged")
            holds.release("saved")
            holds.wait_at("judged", crashing)
        else:
            holds.wait_at("planned", crashing)
        assert crashing.kill() != 0
        saved_at_kill.append(sum(saved_offsets(state, backlog.name).values()))
    print(f"records saved at each kill: {saved_at_kill}")
    # Each restart went on from the saved offsets (one more cycle each), and the last kill
    # still hit the backlog.
    assert saved_at_kill[0] == 0 and saved_at_kill == sorted(saved_at_kill)
    assert 0 < saved_at_kill[1] < saved_at_kill[2] < BACKLOG_EVENTS
    restarted = backlog.serve(*BACKLOG_ARGS)

    reference_scrape = reference.wait_for(caught_up(BACKLOG_EVENTS, last), 180, "reference")
    assert reference.terminate() == 0
    scrape = restarted.wait_for(caught_up(BACKLOG_EVENTS, last), 180, "restarted run")
    assert restarted.terminate() == 0

    # The reference itself is right: every event once, in its window, for every judge ...
    reference_rows = windows_rows(reference_state)
    expected = expected_sizes(events)
    assert len(expected) == 40 * 4  # 40 windows x 4 (app, model) pairs
    for judge in JUDGES:
        assert judged_sizes(reference_rows, judge) == expected
    # ... and windows ending over 30 s (the lateness) before the last event are complete.
    open_windows = {r["window_start"] for r in reference_rows if not r["complete"]}
    assert open_windows == {f"2025-11-20T10:06:{s}0Z" for s in range(4)}
    # The crashed run matches it row for row, and counter for counter.
    assert windows_rows(state) == reference_rows
    assert durable_counters(scrape) == durable_counters(reference_scrape)
    assert scrape.value("ragpulse_events_total", outcome="accepted") == BACKLOG_EVENTS


# --- 3. broker outage ----------------------------------------------------------------------------


@pytest.fixture
def outage_broker(kafka_broker: ApacheKafkaBroker) -> ApacheKafkaBroker:  # noqa: F811
    """The session broker for a test that stops it (its teardown starts it again)."""
    return kafka_broker


@pytest.mark.timeout(150)
def test_broker_outage_freezes_heartbeat_fails_health_then_recovers_without_loss_or_doubles(
    outage_broker: ApacheKafkaBroker, serve_processes: ServeFactory, tmp_path: Path
) -> None:
    topic = "outage"
    outage_broker.create_topic(topic, 2)
    events = list(simulate(3, 300, T0, rate=10))
    before_outage, after_outage = events[:200], events[200:]
    produce_round_robin(outage_broker, topic, before_outage, 2)
    serve = serve_processes(
        outage_broker.bootstrap,
        topic,
        tmp_path / "state.sqlite",
        [*WINDOW_ARGS, "--unhealthy-after", "5s", "--kafka-timeout", "2s"],
    ).start()
    serve.wait_for(caught_up(200), 60, "the first 200 events")
    assert serve.healthz()[0] == 200

    outage_broker.stop()
    outage_ends = time.monotonic() + 20
    first_failure = serve.wait_for(
        lambda m: m.total("ragpulse_cycles_total", outcome="failed") >= 1, 20, "a failed cycle"
    )
    failed_by = time.time()
    heartbeat = first_failure.value("ragpulse_heartbeat_timestamp_seconds")
    # The last cycle that completed: it may end after the stop (a cycle in flight under load
    # finishes its save), never after the failure; from then on it must not move.
    assert heartbeat is not None and heartbeat < failed_by
    health: list[int] = []
    while time.monotonic() < outage_ends:
        scrape = serve.metrics()  # /metrics answers all along
        assert scrape.value("ragpulse_heartbeat_timestamp_seconds") == heartbeat
        health.append(serve.healthz()[0])
        time.sleep(0.5)
    assert scrape.total("ragpulse_cycles_total", outcome="failed") > first_failure.total(
        "ragpulse_cycles_total", outcome="failed"
    )
    assert scrape.value("ragpulse_events_total", outcome="accepted") == 200
    # Healthy at first (failing for less than --unhealthy-after), then 503 to the end.
    assert health[0] == 200 and health[-1] == 503, health
    assert health == sorted(health), health

    # Apache Kafka comes back with its log: the topic and its 200 records are still there.
    outage_broker.start()
    produce_round_robin(outage_broker, topic, after_outage, 2)
    m = serve.wait_for(caught_up(300), 90, "recovery after the outage")
    m = serve.wait_for(
        lambda s: (s.value("ragpulse_heartbeat_timestamp_seconds") or 0) > heartbeat, 30
    )
    assert serve.healthz()[0] == 200
    assert m.value("ragpulse_events_total", outcome="accepted") == 300
    rows = serve.windows()
    for judge in JUDGES:
        assert m.total("ragpulse_judge_verdicts_total", judge=judge) == 300
        assert judged_sizes(rows, judge) == expected_sizes(events)
    assert serve.terminate() == 0


# --- 4. late events ------------------------------------------------------------------------------


def test_events_beyond_allowed_lateness_are_dead_lettered_and_kept_out_of_closed_windows(
    served_topic: TopicFactory,
) -> None:
    on_time = list(simulate(4, 400, T0, rate=10))  # 10:00:00.0 .. 10:00:39.9
    topic = served_topic("late", records=on_time)
    serve = topic.serve("--allowed-lateness", "5s", "--out-of-orderness", "0s")
    serve.wait_for(caught_up(400, T0 + 39.9), 60, "the on-time events")
    # Watermark 10:00:39.9, lateness 5 s: windows ending by 10:00:34.9 are complete.
    before = serve.windows()
    complete_before = [r for r in before if r["complete"]]
    assert {r["window_start"] for r in complete_before} == {
        "2025-11-20T10:00:00Z",
        "2025-11-20T10:00:10Z",
        "2025-11-20T10:00:20Z",
    }

    too_late = list(simulate(5, 20, T0 + 2, rate=10))  # window 10:00:00, complete
    within = list(simulate(6, 30, T0 + 31, rate=10))  # window 10:00:30, ends 10:00:40: open
    late_offsets = topic.produce(too_late)
    topic.produce(within)
    m = serve.wait_for(caught_up(450), 60, "the late events")

    assert m.value("ragpulse_late_events_total") == 20
    assert m.value("ragpulse_dead_letters_total") == 20
    assert m.value("ragpulse_events_total", outcome="accepted") == 450
    for judge in JUDGES:
        assert m.total("ragpulse_judge_verdicts_total", judge=judge) == 430
    after = serve.windows()
    assert [
        r for r in after if r["window_start"] in {r["window_start"] for r in complete_before}
    ] == complete_before
    for judge in JUDGES:
        assert judged_sizes(after, judge) == expected_sizes(on_time + within)

    letters = topic.read("dlq", 20)
    assert sorted(r.value for r in letters) == sorted(e.payload for e in too_late)
    for letter in letters:
        headers = {k: v.decode() for k, v in letter.headers}
        assert headers["reason"].startswith("late event"), headers
        assert (int(headers["source-partition"]), int(headers["source-offset"])) in late_offsets
    assert serve.terminate() == 0


# --- 5. malformed records ------------------------------------------------------------------------


def test_malformed_records_reach_the_dead_letter_topic_with_reason_and_source_and_none_is_lost(
    served_topic: TopicFactory,
) -> None:
    topic = served_topic("malformed", 2)
    incidents = Incidents(malformed_burst_at=5.0, malformed_burst_count=30)
    events = list(simulate(7, 300, T0, rate=10, incidents=incidents))
    placed = topic.produce(events)
    malformed = {placed[i]: e.payload for i, e in enumerate(events) if e.kind == "malformed"}
    assert len(malformed) == 30
    serve = topic.serve()
    m = serve.wait_for(caught_up(300), 60, "all 300 records read")

    assert m.value("ragpulse_events_total", outcome="invalid") == 30
    assert m.value("ragpulse_events_total", outcome="accepted") == 270
    assert m.value("ragpulse_dead_letters_total") == 30
    rows = serve.windows()
    for judge in JUDGES:
        assert judged_sizes(rows, judge) == expected_sizes(events)

    letters = topic.read("dlq", 30)
    by_source = {}
    for letter in letters:
        headers = {k: v.decode() for k, v in letter.headers}
        source = (int(headers["source-partition"]), int(headers["source-offset"]))
        by_source[source] = (letter.value, headers["reason"])
    assert len(letters) == 30
    assert {source: value for source, (value, _) in by_source.items()} == malformed
    for raw, reason in by_source.values():
        with pytest.raises(InvalidEvent) as rejected:  # the reason is the parser's own
            parse_event(raw, record_time=T0)
        assert reason == rejected.value.reason
    assert len({reason for _, reason in by_source.values()}) >= 4  # the reason is specific
    assert serve.terminate() == 0


# --- 6. SIGTERM ----------------------------------------------------------------------------------


def saved_counter(state: Path, name: str, **labels: str) -> float:
    with StateStore(state) as store:
        return store.counters()[counting.key(name, **labels)]


def test_sigterm_mid_backlog_saves_the_cycle_in_flight_exits_0_and_a_restart_does_not_recount(
    served_topic: TopicFactory,
) -> None:
    events = list(simulate(8, 1500, T0, rate=50))
    topic = served_topic("sigterm", 2, events)
    batch = ("--max-batch-events", "300")  # five cycles

    serve = topic.serve(*batch)
    serve.wait_for(lambda m: m.total("ragpulse_events_total") > 0, 60, "the first cycle")
    assert serve.terminate() == 0
    read = sum(saved_offsets(topic.state, topic.name).values())
    assert 0 < read < 1500  # stopped mid-backlog ...
    # ... with counts and offsets of the same cycles: nothing half-saved.
    assert saved_counter(topic.state, "ragpulse_events_total", outcome="accepted") == read

    serve = topic.serve(*batch)
    serve.wait_for(caught_up(1500), 90, "the rest of the backlog")
    assert serve.terminate() == 0
    ends = log_bounds(topic.broker.bootstrap, topic.name).ends
    assert saved_offsets(topic.state, topic.name) == ends
    rows = windows_rows(topic.state)
    assert rows
    for judge in JUDGES:
        assert judged_sizes(rows, judge) == expected_sizes(events)

    serve = topic.serve(*batch)
    m = serve.wait_for(
        lambda s: s.total("ragpulse_cycles_total", outcome="ok") >= 3, 60, "three idle cycles"
    )
    assert m.value("ragpulse_events_total", outcome="accepted") == 1500
    assert serve.terminate() == 0
    assert windows_rows(topic.state) == rows


# --- 7. a topic grown by recreation --------------------------------------------------------------


def test_a_topic_recreated_with_more_partitions_is_read_on_every_partition(
    broker: ApacheKafkaBroker, served_topic: TopicFactory
) -> None:
    first = list(simulate(9, 100, T0, rate=10))
    topic = served_topic("grow", 2)
    placed = topic.produce(first)
    serve = topic.serve()
    serve.wait_for(caught_up(100), 60, "the events of the 2-partition topic")

    # Tansu cannot add partitions: recreate the topic with 4, holding the same first records.
    # Serve is paused meanwhile: the empty topic in between would be a topic reset to it.
    with serve.paused():
        broker.delete_topic(topic.name)
        broker.create_topic(topic.name, 4)
        assert produce_round_robin(broker, topic.name, first, 2) == placed
    second = list(simulate(10, 100, T0 + 10, rate=10))
    produce_round_robin(broker, topic.name, second, 4)
    m = serve.wait_for(caught_up(200), 90, "the events of the 4-partition topic")

    assert m.value("ragpulse_events_total", outcome="accepted") == 200
    assert saved_offsets(topic.state, topic.name) == {0: 75, 1: 75, 2: 25, 3: 25}
    lag = m.select("ragpulse_consumer_lag", topic=topic.name)
    assert {lab["partition"]: v for lab, v in lag} == {
        "0": 0,
        "1": 0,
        "2": 0,
        "3": 0,
    }
    rows = serve.windows()
    for judge in JUDGES:
        assert judged_sizes(rows, judge) == expected_sizes(first + second)
    assert serve.terminate() == 0


# --- 8. counters across restarts -----------------------------------------------------------------


def test_verdict_counters_restart_at_their_saved_values_and_never_go_backwards(
    served_topic: TopicFactory,
) -> None:
    topic = served_topic("restore", records=simulate(11, 200, T0, rate=10))
    serve = topic.serve()
    saved = serve.wait_for(caught_up(200), 60, "the first events").by_labels(
        "ragpulse_judge_verdicts_total"
    )
    assert sum(saved.values()) == 600
    assert serve.terminate() == 0

    serve = topic.serve()
    assert serve.metrics().by_labels("ragpulse_judge_verdicts_total") == saved
    topic.produce(list(simulate(12, 200, T0 + 20, rate=10)))
    previous = saved
    deadline = time.monotonic() + 60
    while sum(previous.values()) < 1200 and time.monotonic() < deadline:
        current = serve.metrics().by_labels("ragpulse_judge_verdicts_total")
        assert all(current.get(k, 0) >= v for k, v in previous.items()), (previous, current)
        previous = current
        time.sleep(0.1)
    assert sum(previous.values()) == 1200
    assert serve.terminate() == 0


# --- 9. a hung cycle is unhealthy ----------------------------------------------------------------


def test_a_cycle_stuck_on_a_slow_judge_endpoint_turns_healthz_503_until_it_completes(
    served_topic: TopicFactory,
) -> None:
    from fake_openai import FakeOpenAI

    topic = served_topic("hung", records=simulate(9, 32, T0, rate=10))
    with FakeOpenAI(latency=6.0) as judge_server:  # every judge call takes 6 s
        serve = topic.serve(
            "--judges",
            "groundedness",
            "--judge-backend",
            "openai",
            "--judge-base-url",
            judge_server.base_url,
            "--judge-timeout",
            "30s",
            "--judge-concurrency",
            "32",
            "--unhealthy-after",
            "2s",
        )
        # The cycle never fails, it just does not finish: /healthz must say so.
        status, body = _wait_for_health(serve, 503, timeout=20)
        assert status == 503 and "cycle in flight" in body
        serve.wait_for(lambda m: m.total("ragpulse_events_judged_total") == 32, 60, "the cycle")
        assert _wait_for_health(serve, 200, timeout=20)[0] == 200
        assert serve.terminate() == 0


def _wait_for_health(serve: ServeProcess, want: int, timeout: float) -> tuple[int, str]:
    deadline = time.monotonic() + timeout
    while True:
        status, body = serve.healthz()
        if status == want or time.monotonic() > deadline:
            return status, body
        time.sleep(0.2)


# --- 10. failing verdicts are published ----------------------------------------------------------


def test_failing_verdicts_are_published_with_their_rationale_and_passing_ones_are_not(
    served_topic: TopicFactory,
) -> None:
    drop = Incidents(groundedness_drop_at=0.0, drop_to=0.5)
    events = list(simulate(10, 120, T0, rate=10, incidents=drop))
    topic = served_topic("verdicts", records=events)
    serve = topic.serve()
    m = serve.wait_for(caught_up(120), 60, "all events judged")
    ungrounded = int(m.total("ragpulse_judge_verdicts_total", judge="groundedness", rating="no"))
    failing = sum(
        int(v) for lab, v in m.select("ragpulse_judge_verdicts_total") if lab["rating"] != "yes"
    )
    assert ungrounded > 10  # the drop produced answers the judge caught

    rows = [json.loads(r.value) for r in topic.read("verdicts", 1)]
    ratings = [{k: v for k, v in row.items() if k.endswith("/rating")} for row in rows]
    assert all(any(v != "yes" for v in r.values()) for r in ratings)  # only failing rows
    assert len(rows) <= failing
    not_grounded = [row for row in rows if row["response/llm_judged/groundedness/rating"] == "no"]
    assert len(not_grounded) == ungrounded  # every ungrounded answer, once
    assert all(row["response/llm_judged/groundedness/rationale"] for row in not_grounded)
    assert len({row["request_id"] for row in rows}) == len(rows)
    assert serve.terminate() == 0
