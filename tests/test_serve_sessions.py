"""Conversations in `ragpulse serve` against a real Apache Kafka broker: turns shuffled across
partitions and cycles give the sessions `ragpulse run` gives; SIGKILLs while sessions are open
neither lose a session nor judge one twice; a late turn re-opens its session within the
allowed lateness (counted once in the windows) and is counted as late beyond it; a huge session
keeps only the text it is judged on (pipeline/service/conversations.py)."""

from __future__ import annotations

import contextlib
import random
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
from cycle_holds import CycleHolds
from kafka_broker import ApacheKafkaBroker, for_module
from serve_process import (  # noqa: F401
    T0,
    Scrape,
    ServeProcess,
    TopicFactory,
    produce_round_robin,
    serve_processes_fixture,
    windows_rows,
)
from test_file_run import events_file, judged, rows
from test_sessions_run import turn

from ragpulse.pipeline.commands.simulate import SimulatedEvent, simulate
from ragpulse.pipeline.service.state import StateStore

# A guard against hangs, not a speed bound.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SESSIONS = 50
TURNS = 4
GAP_ARGS = ["--session-judges", "user_frustration", "--session-gap", "30s",
            "--judges", "relevance_to_query"]


@pytest.fixture(scope="module")
def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    yield from for_module(apache_kafka)


def conversation_events() -> list[SimulatedEvent]:
    """50 conversations of 4 turns, a turn a second; then one event without a session on each
    of two partitions, far later, that moves the watermark past every session."""
    talk = list(simulate(5, SESSIONS * TURNS, T0, rate=1, conversation_turns=TURNS))
    return talk + list(simulate(9, 2, T0 + 3_000, rate=1))


def session_windows(rows_: Sequence[dict[str, Any]]) -> Counter[tuple[str, str, str, str]]:
    """user_frustration's verdicts per (window, app, model, rating)."""
    out: Counter[tuple[str, str, str, str]] = Counter()
    for r in rows_:
        if r["judge"] == "user_frustration":
            for rating in ("yes", "no", "error"):
                out[r["window_start"], r["app"], r["model"], rating] += r[rating]
    return +out


def run_reference(tmp_path: Path, events: Sequence[SimulatedEvent]) -> Counter[Any]:
    """What `ragpulse run` makes of the same events: the windows of the session judge."""
    folder = tmp_path / "run"
    folder.mkdir()
    out = judged(events_file(folder, [e.payload for e in events]), folder / "out",
                 "--window", "10s", *GAP_ARGS)
    found = session_windows(rows(out / "windows.jsonl"))
    assert sum(found.values()) == SESSIONS
    return found


def sessions_judged(n: int) -> Any:
    return lambda m: m.total("ragpulse_sessions_judged_total") >= n


def test_turns_shuffled_across_partitions_and_cycles_make_the_sessions_run_makes(
    served_topic: TopicFactory, tmp_path: Path
) -> None:
    events = conversation_events()
    talk, flush = events[:-2], events[-2:]
    shuffled = list(talk)
    random.Random(3).shuffle(shuffled)
    # Shuffled within each partition too: an out-of-orderness over the whole span keeps every
    # turn on time; 40 records a cycle spread each conversation over several cycles.
    topic = served_topic("shuffled", 2, [*shuffled, *flush])
    serve = topic.serve(*GAP_ARGS, "--out-of-orderness", "400s", "--max-batch-events", "40")
    scrape = serve.wait_for(sessions_judged(SESSIONS), 600, "every session judged")
    # Then the judged sessions are forgotten, once no admissible turn could join them.
    deadline = time.monotonic() + 600  # a hang guard: forgetting comes a cycle or two later
    while saved_sessions(topic.state, topic.name) != (0, 0):
        assert time.monotonic() < deadline, saved_sessions(topic.state, topic.name)
        time.sleep(0.5)
    assert serve.terminate() == 0
    assert scrape.total("ragpulse_sessions_judged_total") == SESSIONS
    assert scrape.total("ragpulse_session_rejudged_total") == 0
    assert scrape.total("ragpulse_events_total", outcome="accepted") == len(events)
    assert session_windows(windows_rows(topic.state)) == run_reference(tmp_path, events)


def saved_sessions(state: Path, topic: str) -> tuple[int, int]:
    """(turns, judged sessions) the state file still holds."""
    with contextlib.closing(sqlite3.connect(state)) as db:
        return tuple(
            db.execute(f"SELECT count(*) FROM {table} WHERE topic = ?", (topic,)).fetchone()[0]
            for table in ("session_turns", "judged_sessions")
        )


def test_sigkills_while_sessions_are_open_neither_lose_a_session_nor_judge_one_twice(
    broker: ApacheKafkaBroker, serve_processes: Any, tmp_path: Path
) -> None:
    name = "sessions-killed"
    broker.create_topic(name, 2)
    events = conversation_events()
    talk, flush = events[:-2], events[-2:]
    args = ["--window", "10s", *GAP_ARGS, "--out-of-orderness", "0s",
            "--max-batch-events", "23"]
    state = tmp_path / "state.sqlite"
    rounds = 8
    rnd = random.Random(20261127)
    open_at_kill = []
    for n in range(rounds):
        holds = CycleHolds(tmp_path / f"hooks-{n}")
        where = rnd.choice(("planned", "judged", "saved"))
        holds.hold(where)
        produce_round_robin(broker, name, talk[n * len(talk) // rounds:
                                               (n + 1) * len(talk) // rounds], 2)
        serve = serve_processes(broker.bootstrap, name, state, args, env=holds.env).start()
        holds.wait_at(where, serve)
        assert serve.kill() != 0
        with StateStore(state) as saved:
            open_at_kill.append(len({t.session_id for t in saved.session_turns(name)
                                     if t.judged is None}))
    print(f"open sessions saved at each kill: {open_at_kill}")
    assert max(open_at_kill) > 0  # kills landed while sessions were open
    produce_round_robin(broker, name, flush, 2)
    final: ServeProcess = serve_processes(broker.bootstrap, name, state, args).start()
    scrape = final.wait_for(sessions_judged(SESSIONS), 600, "every session judged")
    assert final.terminate() == 0
    assert scrape.total("ragpulse_sessions_judged_total") == SESSIONS
    assert scrape.total("ragpulse_judge_verdicts_total", judge="user_frustration") == SESSIONS
    assert session_windows(windows_rows(state)) == run_reference(tmp_path, events)


LATE_ARGS = ["--session-judges", "user_frustration", "--session-gap", "30s",
             "--judges", "relevance_to_query", "--allowed-lateness", "120s",
             "--out-of-orderness", "0s", "--publish-verdicts", "all"]


def frustration_totals(state: Path) -> tuple[int, int]:
    found = session_windows(windows_rows(state))
    return (sum(v for k, v in found.items() if k[3] == "yes"),
            sum(v for k, v in found.items() if k[3] == "no"))


def test_a_late_turn_reopens_its_session_within_the_lateness_and_is_counted_late_beyond(
    served_topic: TopicFactory,
) -> None:
    topic = served_topic("late-turns", 1, [turn("s", 1, 0), turn("s", 2, 5), turn(None, 9, 100)])
    serve = topic.serve(*LATE_ARGS)
    serve.wait_for(sessions_judged(1), 300, "session s judged")
    assert frustration_totals(topic.state) == (1, 0)
    # A frustrated turn within the gap of s, on time for the windows: s is judged again, and
    # its first verdict is taken back out (the windows count s once).
    topic.produce([turn("s", 3, 20, "That's not what I asked!", "negative")])
    scrape = serve.wait_for(sessions_judged(2), 300, "session s judged again")
    assert scrape.total("ragpulse_session_rejudged_total") == 1
    assert frustration_totals(topic.state) == (0, 1)
    # Session u is judged once the watermark passes 190 s; at 300 s the window of its last
    # turn (160 s) is final (120 s lateness): a turn at 185 s is on time for its own window
    # but late for u; a turn at 100 s is late for its window too (a dead letter).
    topic.produce([turn("u", 1, 150), turn("u", 2, 160), turn(None, 10, 300)])
    serve.wait_for(sessions_judged(3), 300, "session u judged")
    topic.produce([turn("u", 3, 185, "That's wrong, I already told you."), turn("u", 4, 100)])
    scrape = serve.wait_for(
        lambda m: m.total("ragpulse_session_turns_late_total") >= 1
        and m.total("ragpulse_late_events_total") >= 1, 300, "the late turns counted")
    assert serve.terminate() == 0
    assert scrape.total("ragpulse_sessions_judged_total") == 3
    assert scrape.total("ragpulse_session_rejudged_total") == 1
    assert scrape.total("ragpulse_session_turns_late_total") == 1
    assert scrape.total("ragpulse_late_events_total") == 1
    assert frustration_totals(topic.state) == (1, 1)  # s (frustrated) and u, once each
    verdicts = [orjson.loads(r.value) for r in topic.read("verdicts", 11)]
    judged_turns = sorted(v["turns"] for v in verdicts if "turns" in v)
    assert judged_turns == [["s-1", "s-2"], ["s-1", "s-2", "s-3"], ["u-1", "u-2"]]


def test_a_huge_session_keeps_only_the_text_it_is_judged_on(served_topic: TopicFactory) -> None:
    answer = "Open the report, choose Export, then Spreadsheet. " * 20  # 1,000 bytes a turn
    talk = [turn("h", i, i * 0.5, answer=answer) for i in range(120)]
    topic = served_topic("huge", 1, talk)
    serve = topic.serve(*LATE_ARGS, "--session-max-turns", "50")
    serve.wait_for(lambda m: m.total("ragpulse_events_total") >= 120, 300, "every turn read")
    with StateStore(topic.state) as state:
        saved = state.session_turns(topic.name)
    assert len(saved) == 120 and sum(t.kept for t in saved) == 50
    topic.produce([turn(None, 1, 500)])
    scrape = serve.wait_for(sessions_judged(1), 300, "session h judged")
    assert serve.terminate() == 0
    assert scrape.total("ragpulse_sessions_truncated_total") == 1
    (row,) = [v for v in map(orjson.loads, (r.value for r in topic.read("verdicts", 122)))
              if "turns" in v]
    assert row["turns"] == [f"h-{i}" for i in range(70, 120)] and row["turns_dropped"] == 70
