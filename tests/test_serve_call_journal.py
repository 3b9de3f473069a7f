"""Money across crashes: `ragpulse serve` SIGKILLed while a cycle's judge calls are answered
neither pays for an answered call again nor loses its tokens, and the judge budget's spend of
the hour survives restarts (pipeline/service/journal.py, pipeline/costs/budget.py).

The crash is built, not timed: the stand-in LLM endpoint answers a set number of calls and holds
the rest (`FakeOpenAI.hold_after`), so the cycle cannot commit; the test waits until the answers
are in the state file's journal, kills serve, ends the held calls unanswered (as a real endpoint
would for a dead client), and restarts serve.
"""

from __future__ import annotations

import collections
import math
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from fake_openai import FakeOpenAI, request_identity
from kafka_broker import ApacheKafkaBroker
from serve_process import (
    Scrape,
    ServeProcess,
    caught_up,
    saved_offsets,
    serve_processes_fixture,  # noqa: F401
    wait_until,
)

from ragpulse.pipeline.windows import isoformat_utc

T0 = 1_763_632_800.0


def distinct_events(n: int) -> list[bytes]:
    """`n` events each judge sees differently (question, answer and passage of their own), so
    that every (judge, event) is one distinct input, paid for once."""
    return [
        orjson.dumps({
            "request_id": f"req-{i}",
            "timestamp": isoformat_utc(T0 + i),
            "app": "hr-assistant",
            "model": "gpt-4o-mini",
            "request": f"How many vacation days does grade {i} get?",
            "response": f"Grade {i} gets {i + 20} vacation days.",
            "retrieved_context": [{"content": f"Grade {i}: {i + 20} days of vacation."}],
        })
        for i in range(n)
    ]
ServeFactory = Callable[..., ServeProcess]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def serve_args(endpoint: FakeOpenAI, *extra: str) -> list[str]:
    return [
        "--window", "1h",
        "--judges", "safety,groundedness",
        "--judge-backend", "openai",
        "--judge-base-url", endpoint.base_url,
        "--judge-max-retries", "0",
        "--judge-concurrency", "4",
        # Held calls must wait for the kill, not time out into a committed cycle.
        "--judge-timeout", "10m",
        "--judge-batch-deadline", "10m",
        "--max-batch-events", "1000",
        *extra,
    ]  # fmt: skip


def journaled(state: Path) -> int:
    """Rows in the state file's journal of answered calls (0 before serve made the table)."""
    if not state.exists():
        return 0
    db = sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=30)
    try:
        return int(db.execute("SELECT COUNT(*) FROM answered_calls").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        db.close()



def paid_inputs(endpoint: FakeOpenAI) -> collections.Counter[str]:
    """How many answered ("ok") requests the stand-in served per distinct request (judge and
    event: the request's messages)."""
    return collections.Counter(
        request_identity(r.body) for r in endpoint.requests if r.outcome == "ok"
    )


def tokens_served(endpoint: FakeOpenAI) -> int:
    ok = [r for r in endpoint.requests if r.outcome == "ok"]
    return sum(r.prompt_tokens + r.completion_tokens for r in ok)


def tokens_counted(scrape: Scrape) -> float:
    return scrape.total("ragpulse_judge_tokens_total", kind="prompt") + scrape.total(
        "ragpulse_judge_tokens_total", kind="completion"
    )


def crash_after_answers(
    serve: ServeProcess, endpoint: FakeOpenAI, state: Path, topic: str, answers: int
) -> None:
    """With the endpoint holding every call after the first `answers`: wait until those are
    journaled and a call is held (the cycle cannot commit), SIGKILL serve, and end the held
    calls unanswered."""
    wait_until(
        lambda: journaled(state) >= answers and endpoint.held >= 1,
        f"{answers} answers journaled and a call held",
    )
    assert saved_offsets(state, topic) == {}  # the cycle did not commit
    assert serve.kill() != 0
    endpoint.release(answer=False)


def test_a_crash_mid_cycle_pays_no_answered_call_twice_and_counts_every_paid_token(
    serve_processes: ServeFactory, kafka_broker: ApacheKafkaBroker, tmp_path: Path
) -> None:
    topic, events = "journal", 40
    state = tmp_path / "state.sqlite"
    broker = kafka_broker
    with FakeOpenAI() as endpoint:
        broker.create_topic(topic, 1)
        broker.produce(topic, distinct_events(events), partition=0)
        endpoint.hold_after(15)
        first = serve_processes(broker.bootstrap, topic, state, serve_args(endpoint)).start()
        crash_after_answers(first, endpoint, state, topic, 15)
        answered_before_crash = sum(paid_inputs(endpoint).values())

        second = serve_processes(broker.bootstrap, topic, state, serve_args(endpoint)).start()
        scrape = second.wait_for(
            lambda m: caught_up(events)(m)
            and m.total("ragpulse_judge_verdicts_total") == 2 * events,
            120,
            "every event judged",
        )
        # Each (judge, event) input was paid for exactly once, across the crash.
        paid = paid_inputs(endpoint)
        assert answered_before_crash >= 15
        assert len(paid) == 2 * events and set(paid.values()) == {1}
        assert scrape.total("ragpulse_judge_calls_total") == 2 * events
        # Every paid token is counted, once: the crashed process's too.
        assert tokens_counted(scrape) == tokens_served(endpoint) > 0
        # The journal empties once the cycles that used its calls have committed.
        wait_until(lambda: journaled(state) == 0, "the journal to be settled")
        assert second.terminate() == 0


def clock_at(start: float) -> dict[str, str]:
    """The environment of a process whose clock (CLOCK_REALTIME) reads `start` now and runs on
    from there, through libfaketime (Debian package faketime, which `make test` installs); the
    processes started with it later share its clock. (libfaketime shifts the monotonic clock
    by the same offset: with FAKETIME_DONT_FAKE_MONOTONIC, its time.sleep fails with EINVAL.)"""
    libraries = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))
    if not libraries:
        pytest.fail("libfaketime.so.1 not found: install the Debian package faketime (make test)")
    return {
        **os.environ,
        "LD_PRELOAD": str(libraries[0]),
        "FAKETIME": f"{start - time.time():+.3f}",
    }


def test_the_hours_budget_spend_survives_a_crash_and_a_restart_within_the_hour(
    serve_processes: ServeFactory, kafka_broker: ApacheKafkaBroker, tmp_path: Path
) -> None:
    topic, events = "budget-restart", 100
    state = tmp_path / "state.sqlite"
    # Every serve of this test starts a minute into the same clock hour (the budget's unit of
    # time) and stays in it however long the test takes: built, not hoped for. The hour before
    # the real one, so that the saved hour shows the serves ran on this clock.
    hour = math.floor(time.time() / 3600) - 1
    clock = clock_at(hour * 3600 + 60)
    broker = kafka_broker
    with FakeOpenAI() as endpoint:
        broker.create_topic(topic, 1)
        broker.produce(topic, distinct_events(events), partition=0)
        args = serve_args(endpoint, "--judge-budget-per-hour", "1000000")
        # A crash in the first cycle, the budget's probe, after 10 answers.
        endpoint.hold_after(10)
        first = serve_processes(broker.bootstrap, topic, state, args, env=clock).start()
        crash_after_answers(first, endpoint, state, topic, 10)

        second = serve_processes(broker.bootstrap, topic, state, args, env=clock).start()
        scrape = second.wait_for(caught_up(events), 120, "every event read")
        served = tokens_served(endpoint)
        # The probe's calls answered before the crash are in the hour's spend, once.
        assert scrape.value("ragpulse_judge_budget_spent_this_hour") == served > 0
        assert scrape.value("ragpulse_judge_spend_total", unit="tokens") == served
        assert second.terminate() == 0
        db = sqlite3.connect(state)
        assert db.execute("SELECT hour, unit, spent FROM judge_spend").fetchall() == [
            (hour, "tokens", served)
        ]
        db.close()

        # A restart within the hour goes on from the saved spend, before any cycle judges.
        asked = len(endpoint.requests)
        third = serve_processes(broker.bootstrap, topic, state, args, env=clock).start()
        scrape = third.wait_for(
            lambda m: m.total("ragpulse_cycles_total", outcome="ok") >= 1, 60, "a cycle"
        )
        assert scrape.value("ragpulse_judge_budget_spent_this_hour") == served
        assert len(endpoint.requests) == asked
        assert set(paid_inputs(endpoint).values()) == {1}
        assert third.terminate() == 0
