"""Conversations in `ragpulse stream` (`pipeline.graphs.unbounded.build_stream` with session judges)
under TestStream: turns arriving out of order are judged once per session when the watermark
passes the session's last turn + the gap, counted in the window of the last turn (a late pane
of it); a late turn re-opens its session, whose new verdict replaces the earlier one in the
window counts, until --allowed-lateness minus the gap; a turn later than that is dropped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import apache_beam as beam
import orjson
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_stream import TestStream
from cli import one_line_error, ragpulse
from graph_runs import run_to_files, stage_config
from test_stream import SCHEDULE, DeadLetterTopic, RatingsTopic, _Published, kafka_record

from ragpulse.judges.base import Rating, Verdict
from ragpulse.judges.sessions import SessionTurn, make_session
from ragpulse.pipeline.graphs.bounded import StageConfig
from ragpulse.pipeline.graphs.unbounded import StreamSinks, build_stream
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.catalogue import SESSIONS_REJUDGED
from ragpulse.pipeline.records import JudgedEvent
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.stages.sessions import SessionConfig, session_record
from ragpulse.pipeline.stages.windows import ReplaceRejudged, Retraction
from ragpulse.pipeline.windows import isoformat_utc

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
    # Its Beam counters are not read here: this runner reports those of the first bundles
    # only (ReplaceRejudged's counter is tested on the FnApiRunner below).
    _Published.rows.clear()
    _Published.dead_letters.clear()
    config = session_config()
    options = PipelineOptions(["--streaming", "--runner=BundleBasedDirectRunner"])
    with beam.Pipeline(options=options) as p:
        build_stream(p, script, config, SCHEDULE, StreamSinks(DeadLetterTopic(), RatingsTopic()))


def frustration_panes() -> list[tuple[str, int, int, str]]:
    return [
        (row["pane"], row["yes"], row["no"], row["window_start"])
        for _, row in _Published.rows if row["judge"] == "user_frustration"
    ]


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
        .advance_watermark_to_infinity()
    )

    run_stream(script)

    frustration = frustration_panes()
    # calm passes, upset fails (negative feedback, "not what I asked"); each once, in the
    # window of its last turn, which the answers' on-time pane had already closed.
    assert frustration[-1] == ("late", 1, 1, isoformat_utc(T0))
    assert all(yes + no <= 2 for _, yes, no, _ in frustration)
    safety = [(row["pane"], row["yes"]) for _, row in _Published.rows if row["judge"] == "safety"]
    assert ("on_time", 5) in safety and safety[-1] == ("on_time", 5)


# Re-opened until the watermark passes its end + the gap + (allowed lateness - gap).
REOPEN = SCHEDULE.allowed_lateness_seconds - GAP
WRONG = turn("calm", 3, T0 + 30, "That's wrong, I asked about invoices.", "negative")
THANKS = turn("upset", 4, T0 + 35, "Thanks, that worked!")


def test_a_late_turn_re_opens_its_session_and_the_new_verdict_replaces_the_old_one() -> None:
    script = (
        TestStream()
        .advance_watermark_to(T0)
        .add_elements([kafka_record(i, raw, at) for i, (raw, at) in enumerate(LINES)])
        .advance_watermark_to(T0 + 25 + GAP + 1)  # both sessions judged: calm yes, upset no
        .advance_watermark_to(T0 + 30 + GAP + 1)
        # calm's late turn: behind the watermark by more than the gap, but within the lateness
        # of its session window: calm is judged again, and fails now; its pass is taken back
        # out of the window.
        .add_elements([kafka_record(5, WRONG, T0 + 30)])
        .advance_watermark_to(T0 + 35 + GAP + REOPEN + 1)
        # Past the lateness of its own session window: dropped by the runner, as late answers
        # are (the runner's dropped-due-to-lateness counter), not judged again.
        .add_elements([kafka_record(6, THANKS, T0 + 35)])
        .advance_watermark_to_infinity()
    )

    run_stream(script)

    frustration = frustration_panes()
    assert ("late", 1, 1, isoformat_utc(T0)) in frustration  # before the late turn
    assert frustration[-1] == ("late", 0, 2, isoformat_utc(T0))
    # No pane ever counts a session twice: the retraction comes before the new verdict.
    assert all(yes + no <= 2 for _, yes, no, _ in frustration)


def test_run_agrees_with_the_stream_on_sessions_that_a_late_turn_re_opened(
    tmp_path: Path,
) -> None:
    """`run` reads the late turn with the others (a file has no watermark): its counts are the
    stream's last pane after the re-judging above."""
    records = [kafka_record(i, raw, at).value for i, (raw, at) in enumerate(LINES)]
    late = kafka_record(5, WRONG, T0 + 30).value
    result = run_to_files([*records, late], tmp_path, session_config())
    by_judge = {(k.judge, k.window_start): (c.yes, c.no) for k, c in result.windows.items()}
    assert by_judge[("user_frustration", T0)] == (0, 2)


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


# What reached the end of the pipeline, in order (the FnApiRunner runs it in this process).
_SEEN: list[tuple[str, float, tuple[str, ...]]] = []


def _see(item: tuple[str, float, tuple[str, ...]]) -> None:
    _SEEN.append(item)


def judged_session(session_id: str, times: list[float], rating: Rating) -> JudgedEvent:
    turns = [SessionTurn(f"{session_id}-{i}", t, "q", "a") for i, t in enumerate(times)]
    session = make_session(session_id, "help-bot", "m1", turns)
    return JudgedEvent(session_record(session), (Verdict("user_frustration", rating),), ("v1",))


def test_a_later_pane_of_a_session_retracts_the_earlier_and_an_overtaken_one_is_not_counted(
) -> None:
    """ReplaceRejudged alone, on the FnApiRunner: what it lets through, in order, and its
    ragpulse_session_rejudged_total."""
    panes = [
        judged_session("calm", [T0 + 5, T0 + 15], "yes"),  # the on-time pane
        judged_session("other", [T0 + 7], "no"),
        judged_session("calm", [T0 + 5, T0 + 15, T0 + 30], "no"),  # a late turn: re-judged
        judged_session("calm", [T0 + 5, T0 + 15], "yes"),  # the first pane, overtaken
        judged_session("calm", [T0 + 500], "yes"),  # the same id after a pause: new session
    ]
    seen = _SEEN
    seen.clear()

    def describe(item: JudgedEvent | Retraction) -> tuple[str, float, tuple[str, ...]]:
        if isinstance(item, Retraction):
            return ("retracted", item.event_time, tuple(r for _, (r, _) in item.ratings))
        assert item.record.session is not None
        return (item.record.session.session_id, item.record.event_time,
                tuple(v.rating for v in item.verdicts))

    p = beam.Pipeline(runner=FnApiRunner())
    _ = (
        p
        | beam.Create(panes, reshuffle=False)
        | ReplaceRejudged(GAP, 60.0)
        | beam.Map(describe)
        | beam.Map(_see)
    )
    result = p.run()
    result.wait_until_finish()
    assert seen == [
        ("calm", T0 + 15, ("yes",)),
        ("other", T0 + 7, ("no",)),
        ("retracted", T0 + 15, ("yes",)),
        ("calm", T0 + 30, ("no",)),
        ("calm", T0 + 500, ("yes",)),
    ]
    counters = {
        counting.decode(c.key.metric.name): c.committed
        for c in result.metrics().query()["counters"]
        if c.key.metric.namespace == counting.COUNTER_NAMESPACE
    }
    assert counters == {counting.key(SESSIONS_REJUDGED, app="help-bot"): 1}
