"""Synthetic traffic: valid and varied events, incidents that show up, paced Kafka production."""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401

from ragpulse.pipeline.cli import build_parser
from ragpulse.pipeline.commands.simulate import Incidents, main, simulate
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event
from ragpulse.pipeline.settings.command_flags import SIMULATE, settings_from
from ragpulse.pipeline.sources.kafka import log_bounds

T0 = 1_736_931_600.0  # 2025-01-15T09:00:00Z
WORD = re.compile(r"[a-z0-9]+(?:[.:][0-9]+)*")


def words(text: str) -> set[str]:
    return set(WORD.findall(text.lower()))



def payloads(seed: int, n: int, start: float, **options: Any) -> list[bytes]:
    """The raw records `simulate` makes (what `ragpulse simulate` writes)."""
    return [e.payload for e in simulate(seed, n, start, **options)]


def ragpulse_simulate(*argv: str) -> int:
    """`ragpulse simulate ARGV` in this process: its flags, its settings, its main."""
    return main(settings_from(SIMULATE, build_parser().parse_args(["simulate", *argv])))

def test_same_seed_gives_the_same_bytes_and_another_seed_does_not() -> None:
    assert list(payloads(7, 50, T0)) == list(payloads(7, 50, T0))
    assert list(payloads(7, 50, T0)) != list(payloads(8, 50, T0))


def test_events_are_json_objects_covering_every_request_and_response_shape() -> None:
    shapes: Counter[str] = Counter()
    for raw in payloads(1, 400, T0):
        event = json.loads(raw)
        assert isinstance(event, dict)
        assert {"request_id", "timestamp", "app", "model", "request"} <= event.keys()
        request = event["request"]
        if isinstance(request, str):
            shapes["request:string"] += 1
        elif "messages" in request:
            assert request["messages"][-1]["role"] == "user"
            assert len(request["messages"]) > 2  # earlier turns as history
            shapes["request:messages"] += 1
        elif "query" in request:
            assert request["history"]
            shapes["request:query+history"] += 1
        else:
            assert isinstance(request["question"], str)
            shapes["request:object"] += 1
        if isinstance(event.get("response"), str):
            shapes["response:string"] += 1
        elif isinstance(event.get("response"), dict):
            assert event["response"]["choices"][0]["message"]["content"]
            shapes["response:chat"] += 1
        else:
            trace = event["trace"]
            trace = json.loads(trace) if isinstance(trace, str) else trace
            spans = trace["data"]["spans"]
            root = next(s for s in spans if s["parent_id"] is None)
            assert json.loads(root["attributes"]["mlflow.spanOutputs"])
            kinds = [json.loads(s["attributes"]["mlflow.spanType"]) for s in spans]
            assert "RETRIEVER" in kinds
            shapes["response:trace"] += 1
        shapes[f"timestamp:{type(event['timestamp']).__name__}"] += 1
    assert set(shapes) == {
        "request:string", "request:messages", "request:query+history", "request:object",
        "response:string", "response:chat", "response:trace", "timestamp:str", "timestamp:int",
    }


def test_every_well_formed_event_parses_with_its_answer_and_chunks() -> None:
    incidents = Incidents(no_context_share=0.1, late_events=5, late_by_seconds=600)
    events = list(simulate(3, 300, T0, rate=2, incidents=incidents))
    for event in events:
        record = parse_event(event.payload)
        assert record.event_time == pytest.approx(event.event_time, abs=0.001)
        item = record.judge_input
        assert item.question and item.answer
        assert (len(item.chunks) == 0) == event.without_context
        assert len(item.chunks) <= 5
    assert sum(e.late for e in events) == 5
    assert 10 <= sum(e.without_context for e in events) <= 60


def test_grounded_answers_use_only_chunk_words_and_reuse_question_words() -> None:
    for event in simulate(4, 200, T0):
        item = parse_event(event.payload).judge_input
        if event.kind != "grounded" or not item.chunks:
            continue
        chunk_words = set().union(*(words(c.content) for c in item.chunks))
        # Every number and capitalised name of the answer is in a chunk.
        numbers = {w for w in words(item.answer) if w[0].isdigit()}
        assert numbers <= chunk_words, item.answer
        assert len(words(item.answer) & words(item.question)) >= 3


def test_groundedness_drop_lowers_the_grounded_share_after_its_start() -> None:
    incidents = Incidents(groundedness_drop_at=300, drop_to=0.6)
    events = list(simulate(5, 1200, T0, rate=2, incidents=incidents))
    before = [e.kind == "grounded" for e in events if e.event_time < T0 + 300]
    after = [e.kind == "grounded" for e in events if e.event_time >= T0 + 300]
    assert all(before)
    assert 0.5 < sum(after) / len(after) < 0.7
    for event in events:
        if event.kind == "ungrounded":
            item = parse_event(event.payload).judge_input
            chunk_words = set().union(*(words(c.content) for c in item.chunks))
            assert words(item.answer) - chunk_words, "an ungrounded answer invents something"


def test_bursts_replace_the_events_right_after_their_start() -> None:
    incidents = Incidents(
        unsafe_burst_at=100, unsafe_burst_count=6, malformed_burst_at=200, malformed_burst_count=9
    )
    events = list(simulate(6, 400, T0, incidents=incidents))
    kinds = Counter(e.kind for e in events)
    assert kinds["unsafe"] == 6 and kinds["malformed"] == 9
    assert all(e.event_time >= T0 + 100 for e in events if e.kind == "unsafe")
    for event in events:
        if event.kind == "malformed":
            with pytest.raises(InvalidEvent):
                parse_event(event.payload)


def test_output_file_holds_one_record_per_line(tmp_path: Path) -> None:
    out = tmp_path / "events.jsonl"
    assert ragpulse_simulate(
        "--output", str(out), "--rate", "2", "--duration", "1m", "--seed", "9",
        "--start-time", "2025-01-15T09:00:00Z", "--malformed-burst-at", "30s",
    ) == 0
    lines = out.read_bytes().splitlines()
    assert len(lines) == 120
    assert lines == list(payloads(9, 120, T0, rate=2, incidents=Incidents(
        malformed_burst_at=30, malformed_burst_count=10)))


def test_production_delivers_every_event_at_about_the_requested_rate(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    started = time.monotonic()
    assert ragpulse_simulate(
        "--kafka-bootstrap", kafka_broker.bootstrap, "--topic", "logs", "--partitions", "3",
        "--rate", "100", "--duration", "3s", "--seed", "1",
    ) == 0
    elapsed = time.monotonic() - started
    assert sum(log_bounds(kafka_broker.bootstrap, "logs").ends.values()) == 300
    assert 2.5 < elapsed < 6, f"300 events at 100/s took {elapsed:.1f}s"


def test_conversations_are_consecutive_turns_sharing_a_session_id_and_an_app() -> None:
    plain = [json.loads(p) for p in payloads(5, 60, T0)]
    talks = [json.loads(p) for p in payloads(5, 60, T0, conversation_turns=3)]
    assert all("session_id" not in e for e in plain)
    sessions: dict[str, set[str]] = {}
    for e in talks:
        sessions.setdefault(e["session_id"], set()).add(e["app"])
    assert len(sessions) == 20 and all(len(apps) == 1 for apps in sessions.values())
    # Turns of one conversation are consecutive and ask about different passages.
    assert [e["session_id"] for e in talks[:6]] == ["conv-5-0"] * 3 + ["conv-5-1"] * 3
    for c in range(20):
        questions = [parse_event(json.dumps(e).encode()).judge_input.question
                     for e in talks[3 * c: 3 * c + 3]]
        assert len(set(questions)) == 3


@pytest.mark.slow  # runs `ragpulse run`, a Beam pipeline
def test_a_model_that_starts_forgetting_fails_the_local_user_frustration_of_later_sessions(
    tmp_path: Path,
) -> None:
    from ragpulse.pipeline.cli import main as ragpulse_main

    incidents = Incidents(forgetting_at=30.0)
    events = list(simulate(7, 60, T0, incidents=incidents, conversation_turns=3))
    assert {e.kind for e in events[:30]} <= {"grounded"}
    assert sum(e.kind == "forgetting" for e in events[30:]) == 20  # turns 2 and 3 of each
    src = tmp_path / "talks.jsonl"
    src.write_bytes(b"".join(e.payload + b"\n" for e in events))
    out = tmp_path / "out"
    assert ragpulse_main(["run", str(src), "--output", str(out), "--judge-backend", "local",
                          "--judges", "safety", "--session-judges", "user_frustration"]) == 0
    rows = [json.loads(line) for line in (out / "verdicts.jsonl").read_text().splitlines()]
    rating = {
        r["session_id"]: r["response/llm_judged/user_frustration/rating"]
        for r in rows if "turns" in r
    }
    before = {f"conv-7-{c}" for c in range(10)}
    assert {rating[s] for s in before} == {"yes"}
    assert {rating[s] for s in set(rating) - before} == {"no"} and len(rating) == 20
