"""Exactly once under repeated crashes: `ragpulse serve` SIGKILLed 17 times while events flow into
a real Apache Kafka broker, restarted after each kill, counts every event once.

Each round produces a slice of the events (half before serve starts, half while it runs), then
kills serve at a point observed, not guessed: as soon as /metrics answers (start-up), or while
serve is held by its cycle hooks (pipeline/service/cycle_hooks.py) at `planned` (ranges
planned, nothing read), `judged` (the graph has run and published; nothing saved) or `saved`
(the transaction committed, the consumer group not told). The kill points follow a fixed plan
in which every ordered pair of kill points occurs once in a row (a de Bruijn sequence), so
each restart recovers from every kind of crash into every kind of next crash: 17 kills that
each land where it matters (until stop 36: 50 kills at random points, which covered no pair
for certain). The final serve reads the rest; its windows and counters must equal what was
produced, exactly.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter
from pathlib import Path

import pytest
from cycle_holds import CycleHolds
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

from ragpulse.pipeline.commands.simulate import simulate

EVENTS = 5_000  # 100 s of event time at 50 events/s: ten 10 s windows
ARGS = [
    "--window", "10s",
    "--allowed-lateness", "5s",
    "--out-of-orderness", "0s",
    "--trigger-interval", "0.2s",
    "--max-batch-events", "150",
    "--judges", ",".join(JUDGES),
]

# 18 starts of serve (Python and Beam each time): minutes on a busy machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


# Where a round's kill lands: start-up, or held at one of these cycle phases.
PHASES = ("planned", "judged", "saved")
KILL_POINTS = ("start-up", *PHASES)
# Round n kills at KILL_PLAN[n]: a de Bruijn sequence of order 2 over the kill points, so each
# of the 16 ordered pairs (the crash a restart recovers from, the crash that then hits it)
# occurs exactly once.
KILL_PLAN = (
    "start-up", "start-up", "planned", "start-up", "judged", "start-up", "saved", "planned",
    "planned", "judged", "planned", "saved", "judged", "judged", "saved", "saved", "start-up",
)
KILLS = len(KILL_PLAN)


def test_sigkills_at_every_pair_of_start_up_and_held_cycle_phases_lose_and_double_count_nothing(
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
    started = time.monotonic()
    saved_at_kill = []
    kills: Counter[str] = Counter()
    pending_at_kill: Counter[str] = Counter()
    for n, (where, round_events) in enumerate(zip(KILL_PLAN, slices, strict=True)):
        holds = CycleHolds(tmp_path / f"hooks-{n}")
        if where != "start-up":
            holds.hold(where)
        half = len(round_events) // 2
        produce_round_robin(broker, topic, round_events[:half], 2)
        serve = serve_processes(broker.bootstrap, topic, state, ARGS, env=holds.env).start()
        produce_round_robin(broker, topic, round_events[half:], 2)
        if where != "start-up":
            holds.wait_at(where, serve)
        assert serve.kill() != 0
        saved = sum(saved_offsets(state, topic).values()) if state.exists() else 0
        saved_at_kill.append(saved)
        kills[where] += 1
        pending_at_kill[where] += saved < len(payloads) * (n + 1) // KILLS
    loop_seconds = time.monotonic() - started
    print(f"{KILLS} kills in {loop_seconds:.0f}s: {dict(kills)}; with records produced and not "
          f"saved: {dict(pending_at_kill)}; records saved at each kill: {saved_at_kill}")
    # Every kill point followed every kill point (the plan's own check); a kill held before the
    # save always had work in flight (the cycle held had planned records); saved progress never
    # went backwards.
    assert set(itertools.pairwise(KILL_PLAN)) == set(itertools.product(KILL_POINTS, repeat=2))
    assert pending_at_kill["planned"] == kills["planned"]
    assert pending_at_kill["judged"] == kills["judged"]
    assert saved_at_kill == sorted(saved_at_kill) and saved_at_kill[-1] > 0

    final: ServeProcess = serve_processes(broker.bootstrap, topic, state, ARGS).start()
    last = max(e.event_time for e in events)
    scrape = final.wait_for(caught_up(EVENTS, last), 600, "every event read")
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
