"""Exactly once under repeated crashes: `ragpulse serve` SIGKILLed 50 times at random moments
while events flow into a real Apache Kafka broker, restarted after each kill, counts every event
once.

Each round produces a slice of the events (half before serve starts, half while it runs), then
kills serve after a random delay: one round in five during start-up, the others at a random
moment after the restarted process has saved its first cycle (mid-cycle, mid-save, while idle).
Small batches and a short trigger interval keep cycles short, so the kills land in every phase.
The final serve reads the rest; its windows and counters must equal what was produced, exactly.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import Scrape, ServeProcess, serve_processes_fixture  # noqa: F401
from test_serve import (
    JUDGES,
    T0,
    ServeFactory,
    caught_up,
    expected_sizes,
    judged_sizes,
    produce_round_robin,
    saved_offsets,
    windows_rows,
)

from pipeline.commands.simulate import simulate

KILLS = 50
EVENTS = 5_000  # 100 s of event time at 50 events/s: ten 10 s windows
ARGS = [
    "--window", "10s",
    "--allowed-lateness", "5s",
    "--out-of-orderness", "0s",
    "--trigger-interval", "0.2s",
    "--max-batch-events", "150",
    "--judges", ",".join(JUDGES),
]

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def saved_a_cycle(scrape: Scrape) -> bool:
    # Not persisted: counts this process's cycles only.
    return scrape.total("ragpulse_cycles_total", outcome="ok") >= 1


def test_fifty_sigkills_at_random_moments_while_events_flow_lose_and_double_count_nothing(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    broker = kafka_broker
    topic = "kill-loop"
    broker.create_topic(topic, 2)
    events = list(simulate(11, EVENTS, T0, rate=50))
    payloads = [e.payload for e in events]
    slices = [payloads[i * len(payloads) // KILLS : (i + 1) * len(payloads) // KILLS]
              for i in range(KILLS)]
    state = tmp_path / "state.sqlite"
    rnd = random.Random(20251123)
    started = time.monotonic()
    saved_at_kill = []
    for round_events in slices:
        half = len(round_events) // 2
        produce_round_robin(broker, topic, round_events[:half], 2)
        serve = serve_processes(broker.bootstrap, topic, state, ARGS).start()
        produce_round_robin(broker, topic, round_events[half:], 2)
        if rnd.random() < 0.8:
            serve.wait_for(saved_a_cycle, 60, "a cycle saved", interval=0.05)
        time.sleep(rnd.uniform(0.0, 1.0))
        assert serve.kill() != 0
        saved_at_kill.append(sum(saved_offsets(state, topic).values()) if state.exists() else 0)
    loop_seconds = time.monotonic() - started
    print(f"{KILLS} kills in {loop_seconds:.0f}s; records saved at each kill: {saved_at_kill}")
    # The kills hit serve with work in flight, and saved progress never went backwards.
    produced_by_then = [len(payloads) * (i + 1) // KILLS for i in range(KILLS)]
    assert sum(s < p for s, p in zip(saved_at_kill, produced_by_then, strict=True)) >= KILLS // 2
    assert saved_at_kill == sorted(saved_at_kill) and saved_at_kill[-1] > 0

    final: ServeProcess = serve_processes(broker.bootstrap, topic, state, ARGS).start()
    last = max(e.event_time for e in events)
    scrape = final.wait_for(caught_up(EVENTS, last), 240, "every event read")
    assert final.terminate() == 0

    assert scrape.value("ragpulse_events_total", outcome="accepted") == EVENTS
    assert scrape.value("ragpulse_events_total", outcome="invalid") == 0
    rows = windows_rows(state)
    expected = expected_sizes(events)
    for judge in JUDGES:
        assert judged_sizes(rows, judge) == expected
        assert scrape.total("ragpulse_judge_verdicts_total", judge=judge) == EVENTS
    complete = {r["window_start"] for r in rows if r["complete"]}
    assert len(complete) >= 9  # all but the window the watermark has not passed
