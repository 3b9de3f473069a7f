"""Conversations in `ragpulse run`: turns of one session_id grouped by Beam session windows in
event time (in any order in the file), judged once per session, counted and windowed by the
session's end like the answers, and sampled whole."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli import one_line_error, ragpulse
from prometheus_client.parser import text_string_to_metric_families
from test_file_run import events_file, judged, rows

pytestmark = pytest.mark.slow  # each runs a Beam pipeline

T0 = 1_763_632_800  # 2025-11-20T10:00:00Z, a multiple of 300


QUESTIONS = (
    "How do I export a report as a spreadsheet?",
    "Can I schedule that export every Monday?",
    "Who receives the scheduled file by email?",
    "Where do I change the time zone of the schedule?",
    "Is there a limit on the number of rows?",
)


def turn(session: str | None, i: int, seconds: float, question: str = "",
         feedback: str | None = None, answer: str = "") -> bytes:
    data: dict[str, Any] = {
        "request_id": f"{session}-{i}",
        "timestamp": round((T0 + seconds) * 1000),
        "app": "help-bot",
        "model": "m1",
        "request": question or QUESTIONS[i % len(QUESTIONS)],
        "response": answer or f"Open report {i}, then choose Export and Spreadsheet.",
    }
    if session is not None:
        data["session_id"] = session
    if feedback is not None:
        data["feedback"] = feedback
    return orjson.dumps(data)


def conversations() -> list[bytes]:
    """calm: 3 calm turns; upset: a complaint and negative feedback; calm again 20 minutes
    after calm's last turn (a new session with a 5-minute gap); one turn of no conversation."""
    return [
        turn("calm", 1, 0), turn("calm", 2, 40), turn("calm", 3, 90),
        turn("upset", 1, 10),
        turn("upset", 2, 50, "That's not what I asked, how do I export it?", "negative"),
        turn("upset", 3, 100),
        turn("calm", 4, 90 + 20 * 60), turn("calm", 5, 90 + 20 * 60 + 30),
        turn(None, 1, 20),
    ]


def shuffled(lines: list[bytes], seed: int) -> list[bytes]:
    out = list(lines)
    random.Random(seed).shuffle(out)
    return out


def metrics(out: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families((out / "metrics.prom").read_text()):
        for s in family.samples:
            found[s.name, tuple(sorted(s.labels.items()))] = s.value
    return found


def value(found: dict, name: str, **labels: str) -> float:
    return sum(v for (n, ls), v in found.items() if n == name and set(labels.items()) <= set(ls))


def session_rows(out: Path) -> list[dict]:
    return sorted(
        (r for r in rows(out / "verdicts.jsonl") if "session_id" in r),
        key=lambda r: (r["session_id"], r["event_time"]),
    )


FLAGS = ("--judges", "relevance_to_query", "--session-judges", "user_frustration",
         "--window", "5m")


def test_turns_in_any_order_make_one_judged_session_per_conversation_and_gap(
    tmp_path: Path,
) -> None:
    outs = []
    for seed in (1, 2):
        (tmp_path / f"s{seed}").mkdir()
        src = events_file(tmp_path / f"s{seed}", shuffled(conversations(), seed))
        outs.append(judged(src, tmp_path / f"out{seed}", *FLAGS))
    first, second = (session_rows(o) for o in outs)
    assert first == second  # the order of the lines changes nothing
    summary = [
        (r["session_id"], r["turns"], r["response/llm_judged/user_frustration/rating"])
        for r in first
    ]
    assert summary == [
        ("calm", ["calm-1", "calm-2", "calm-3"], "yes"),
        ("calm", ["calm-4", "calm-5"], "yes"),  # 20 minutes later: a conversation of its own
        ("upset", ["upset-1", "upset-2", "upset-3"], "no"),
    ]
    rationale = first[2]["response/llm_judged/user_frustration/rationale"]
    assert "negative feedback on turn 2" in rationale
    # Each session is dated by its last turn, so counted in the window holding its end.
    assert [r["event_time"] for r in first] == [
        "2025-11-20T10:01:30Z", "2025-11-20T10:22:00Z", "2025-11-20T10:01:40Z"
    ]
    windows = [
        (w["window_start"], w["yes"], w["no"])
        for w in rows(outs[0] / "windows.jsonl") if w["judge"] == "user_frustration"
    ]
    assert sorted(windows) == [("2025-11-20T10:00:00Z", 1, 1), ("2025-11-20T10:20:00Z", 1, 0)]
    found = metrics(outs[0])
    # The same metric and labels as a per-answer judge, so the shipped rules apply.
    assert value(found, "ragpulse_judge_verdicts_total", judge="user_frustration",
                 rating="no", app="help-bot", model="m1") == 1
    assert value(found, "ragpulse_judge_verdicts_total", judge="user_frustration") == 3
    assert value(found, "ragpulse_sessions_judged_total", app="help-bot") == 3
    assert value(found, "ragpulse_sessions_truncated_total") == 0
    # Answers are still counted once each; the sessions are not events.
    assert value(found, "ragpulse_events_judged_total") == 9
    assert value(found, "ragpulse_judge_verdicts_total", judge="relevance_to_query") == 9


def test_a_longer_gap_joins_the_turns_and_an_oversize_session_keeps_its_last_turns(
    tmp_path: Path,
) -> None:
    out = judged(events_file(tmp_path, conversations()), tmp_path / "out", *FLAGS,
                 "--session-gap", "30m", "--session-max-turns", "3")
    calm = next(r for r in session_rows(out) if r["session_id"] == "calm")
    assert calm["turns"] == ["calm-3", "calm-4", "calm-5"] and calm["turns_dropped"] == 2
    found = metrics(out)
    assert value(found, "ragpulse_sessions_judged_total") == 2
    assert value(found, "ragpulse_sessions_truncated_total") == 1


def test_sampling_keeps_or_drops_each_conversation_whole(tmp_path: Path) -> None:
    lines = [turn(f"c{c}", i, 60 * c + 10 * i) for c in range(40) for i in range(3)]
    out = judged(events_file(tmp_path, shuffled(lines, 3)), tmp_path / "out", *FLAGS,
                 "--sample-rate", "0.5")
    answers = [r for r in rows(out / "verdicts.jsonl") if "session_id" not in r]
    by_conversation: dict[str, int] = {}
    for r in answers:
        by_conversation[r["request_id"].rsplit("-", 1)[0]] = (
            by_conversation.get(r["request_id"].rsplit("-", 1)[0], 0) + 1
        )
    assert set(by_conversation.values()) == {3}  # every judged conversation has all its turns
    assert 5 < len(by_conversation) < 35
    assert sorted(r["session_id"] for r in session_rows(out)) == sorted(by_conversation)


def test_session_flags_are_refused_where_they_cannot_run(tmp_path: Path) -> None:
    src = events_file(tmp_path, conversations())
    for flags, message in (
        (("--session-judges", "knowledge_retention"),
         "session judge knowledge_retention has no local implementation"),
        (("--session-judges", "safety"), "unknown session judge 'safety'"),
        (("--judges", "user_frustration"), "name them in --session-judges"),
    ):
        done = ragpulse("run", str(src), "--judge-backend", "local", *flags)
        assert message in one_line_error(done.returncode, done.stderr, allow_info=True), flags
    done = ragpulse("run", str(src), "--judge-backend", "local", "--session-gap", "0s")
    assert done.returncode == 2 and "--session-gap" in done.stderr.splitlines()[-1]
    # serve takes the session flags (tests/test_serve_sessions.py) and checks them the same
    # way, before it connects to anything.
    done = ragpulse("serve", "--kafka-bootstrap", "127.0.0.1:9", "--topic", "t",
                    "--judge-backend", "local", "--session-judges", "safety")
    assert "unknown session judge 'safety'" in one_line_error(
        done.returncode, done.stderr, allow_info=True
    )


def test_two_apps_sharing_a_session_id_get_two_rows_with_their_own_keys(tmp_path: Path) -> None:
    lines = [orjson.loads(line) for line in conversations()[:3]]
    for data in [dict(d, app="shop-bot", request_id="shop-" + d["request_id"]) for d in lines]:
        lines.append(data)
    out = judged(events_file(tmp_path, [orjson.dumps(d) for d in lines]), tmp_path / "out",
                 *FLAGS)
    keys = sorted((r["app"], r["request_id"]) for r in session_rows(out))
    assert keys == [
        ("help-bot", 'session:["help-bot","calm"]'),
        ("shop-bot", 'session:["shop-bot","calm"]'),
    ]
