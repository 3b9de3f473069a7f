"""Conversations in `ragpulse stream` (`pipeline.streaming.build_stream` with session judges)
under TestStream: turns arriving out of order are judged once per session when the watermark
passes the session's last turn + the gap, counted in the window of the last turn (a late pane
of it), and a turn behind its session window's watermark does not judge the session again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apache_beam as beam
import orjson
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from cli import one_line_error, ragpulse
from graph_runs import run_to_files, stage_config
from test_stream import SCHEDULE, DeadLetterTopic, RatingsTopic, _Published, kafka_record

from pipeline.graph import StageConfig
from pipeline.sessions import SessionConfig
from pipeline.settings import JudgeSettings
from pipeline.streaming import StreamSinks, build_stream
from pipeline.windows import isoformat_utc

pytestmark = pytest.mark.slow  # each runs a Beam streaming pipeline

T0 = 1_700_000_400.0  # a multiple of 60: the start of a one-minute window
GAP = 60.0


def turn(session: str, i: int, at: float, question: str, feedback: str | None = None) -> bytes:
    data: dict[str, Any] = {
        "request_id": f"{session}-{i}", "timestamp": isoformat_utc(at), "app": "help-bot",
        "model": "m1", "session_id": session, "request": question,
        "response": "Open Settings, then Export.",
    }
    if feedback is not None:
        data["feedback"] = feedback
    return orjson.dumps(data)


def session_config() -> StageConfig:
    judges = JudgeSettings(backend="local", names=("safety",)).spec()
    return stage_config(
        judges=judges,
        window_seconds=60.0,
        sessions=SessionConfig(judges.for_sessions(("user_frustration",)), gap_seconds=GAP),
    )


def run_stream(script: TestStream) -> None:
    _Published.rows.clear()
    _Published.dead_letters.clear()
    config = session_config()
    options = PipelineOptions(["--streaming", "--runner=BundleBasedDirectRunner"])
    with beam.Pipeline(options=options) as p:
        build_stream(p, script, config, SCHEDULE, StreamSinks(DeadLetterTopic(), RatingsTopic()))


LINES = [
    (turn("upset", 2, T0 + 20, "That's not what I asked, how do I export?", "negative"),
     T0 + 20),
    (turn("calm", 1, T0 + 5, "How do I export my data?"), T0 + 5),
    (turn("upset", 1, T0 + 10, "How do I export my invoices?"), T0 + 10),
    (turn("calm", 2, T0 + 15, "Thanks, and can I pick a date range?"), T0 + 15),
    (turn("upset", 3, T0 + 25, "Where is the export button?"), T0 + 25),
]


def test_out_of_order_turns_are_judged_once_per_session_in_the_window_of_its_last_turn() -> None:

    script = (
        TestStream()
        .advance_watermark_to(T0)
        .add_elements([kafka_record(i, raw, at) for i, (raw, at) in enumerate(LINES)])
        .advance_watermark_to(T0 + 61)  # the answers' window is on time
        .advance_watermark_to(T0 + 25 + GAP + 1)  # both sessions are over
        # A turn of "upset" behind the watermark of its session window: not judged again.
        .add_elements([kafka_record(9, turn("upset", 4, T0 + 30, "Hello?"), T0 + 30)])
        .advance_watermark_to_infinity()
    )

    run_stream(script)

    frustration = [
        (row["pane"], row["yes"], row["no"], row["window_start"])
        for _, row in _Published.rows if row["judge"] == "user_frustration"
    ]
    # calm passes, upset fails (negative feedback, "not what I asked"); each once, in the
    # window of its last turn, which the answers' on-time pane had already closed.
    assert frustration[-1] == ("late", 1, 1, isoformat_utc(T0))
    assert all(yes + no <= 2 for _, yes, no, _ in frustration)
    safety = [(row["pane"], row["yes"]) for _, row in _Published.rows if row["judge"] == "safety"]
    assert ("on_time", 5) in safety and safety[-1] == ("late", 6)  # the late turn's answer


def test_stream_refuses_a_session_gap_longer_than_its_allowed_lateness() -> None:
    done = ragpulse(
        "stream", "--kafka-bootstrap", "127.0.0.1:9", "--topic", "logs", "--runner",
        "FlinkRunner", "--judge-backend", "local", "--session-judges", "user_frustration",
        "--session-gap", "30m", "--allowed-lateness", "10m", "--print-config",
    )
    line = one_line_error(done.returncode, done.stderr, allow_info=True)
    assert "--session-gap (30m) must not exceed --allowed-lateness (10m)" in line


def test_run_counts_the_same_sessions_as_the_streams_last_pane(tmp_path: Path) -> None:
    records = [kafka_record(i, raw, at).value for i, (raw, at) in enumerate(LINES)]
    result = run_to_files(records, tmp_path, session_config())
    by_judge = {
        (k.judge, k.window_start): (c.yes, c.no) for k, c in result.windows.items()
    }
    assert by_judge[("user_frustration", T0)] == (1, 1)  # the stream's last pane, above
    assert by_judge[("safety", T0)] == (5, 0)
