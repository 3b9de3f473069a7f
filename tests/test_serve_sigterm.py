"""SIGTERM stops `ragpulse serve` within 30 s whatever its cycle is doing (issue 31: with
100,000 open conversations it did not stop within 60 s), and the cycle it abandons is replayed
after the restart: nothing lost, nothing counted twice.

The worst moment is made, not waited for: the cycle that judges every open conversation is held
after its graph ran (verdicts published, judge calls journaled, nothing saved) by the cycle
hooks (pipeline/service/cycle_hooks.py), so it never finishes by itself; a held cycle is the
longest cycle there can be. On a real Apache Kafka broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cycle_holds import CycleHolds
from kafka_broker import ApacheKafkaBroker, for_module
from serve_process import produce_round_robin, windows_rows
from test_serve_sessions import (
    GAP_ARGS,
    SESSIONS,
    conversation_events,
    run_reference,
    session_windows,
    sessions_judged,
)

from ragpulse.pipeline.errors import EXIT_CYCLE_ABANDONED
from ragpulse.pipeline.service.state import StateStore

# A guard against hangs, not a speed bound.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

# The bound the issue sets (and Kubernetes' default terminationGracePeriodSeconds).
STOP_BOUND_S = 30.0


@pytest.fixture(scope="module")
def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    yield from for_module(apache_kafka)


def test_sigterm_during_a_held_cycle_that_judges_every_session_stops_serve_and_the_restart_counts_each_once(  # noqa: E501
    broker: ApacheKafkaBroker, serve_processes: Any, tmp_path: Path
) -> None:
    name = "sessions-sigterm"
    broker.create_topic(name, 2)
    events = conversation_events()
    talk, flush = events[:-2], events[-2:]
    args = ["--window", "10s", *GAP_ARGS, "--out-of-orderness", "0s"]
    state = tmp_path / "state.sqlite"
    holds = CycleHolds(tmp_path / "hooks")
    # The first cycle reads every turn and saves them, all 50 conversations open; it moves the
    # watermark past most of them, so the next cycle judges those: it is held once judged.
    holds.hold("saved")
    produce_round_robin(broker, name, talk, 2)
    serve = serve_processes(broker.bootstrap, name, state, args, env=holds.env).start()
    holds.wait_at("saved", serve)
    holds.hold("judged")
    holds.release("saved")
    holds.wait_at("judged", serve)
    code = serve.terminate(timeout=STOP_BOUND_S)  # raises if serve is still running then
    assert code == EXIT_CYCLE_ABANDONED, serve.log_tail()
    assert "abandoned" in serve.log_text()
    with StateStore(state) as saved:
        assert saved.open_session_count(name) == SESSIONS  # the held cycle saved nothing
    holds.release("judged")
    # The two late events move the watermark past every conversation.
    produce_round_robin(broker, name, flush, 2)
    restarted = serve_processes(broker.bootstrap, name, state, args).start()
    scrape = restarted.wait_for(sessions_judged(SESSIONS), 300, "every session judged")
    assert restarted.terminate() == 0  # between cycles a stop finishes and saves
    assert scrape.total("ragpulse_sessions_judged_total") == SESSIONS
    assert scrape.total("ragpulse_judge_verdicts_total", judge="user_frustration") == SESSIONS
    assert scrape.total("ragpulse_events_total", outcome="accepted") == len(events)
    assert session_windows(windows_rows(state)) == run_reference(tmp_path, events)
