"""`ragpulse stream`'s whole unbounded graph (`pipeline.graphs.unbounded.build_stream`) under
TestStream.

The source is Beam's TestStream instead of ReadFromKafka (its Java expansion service is not
available here); everything after it is the real graph: ParseEvents, the local judges,
PaneRatings and the rating-row encoding the ratings topic gets. The runner is Beam's
BundleBasedDirectRunner in streaming mode, which runs TestStream's watermark and processing-time
steps (FnApiRunner runs no processing-time triggers; Prism would be downloaded at run time).

The script plays one window's life: an early pane, the on-time pane, a late event within the
allowed lateness, and an event after it, which the runner drops. Each pane is checked as the
row published to the ratings topic.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, ClassVar

import apache_beam as beam
import orjson
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue
from cli import one_line_error, ragpulse
from graph_runs import stage_config
from processes import free_port
from pydantic import SecretStr

from ragpulse.pipeline.commands.stream import stream_sinks
from ragpulse.pipeline.formats import rating_rows
from ragpulse.pipeline.graphs.unbounded import PaneSchedule, StreamSinks, build_stream
from ragpulse.pipeline.kafka_security import KafkaSecurity
from ragpulse.pipeline.records import Rejected, SourceRecord
from ragpulse.pipeline.settings.models import JudgeSettings, StreamSettings
from ragpulse.pipeline.windows import isoformat_utc

pytestmark = pytest.mark.slow  # each runs a Beam streaming pipeline

T0 = 1_700_000_400.0  # a multiple of 60: the start of a one-minute window
GROUNDED = "The office opens at 8."
UNGROUNDED = "Bananas are purple and grow on Mars in winter."
SCHEDULE = PaneSchedule(allowed_lateness_seconds=120.0, early_firing_seconds=30.0)


def event(request_id: str, at: float, response: str) -> bytes:
    return orjson.dumps(
        {
            "request_id": request_id,
            "timestamp": isoformat_utc(at),
            "app": "help-bot",
            "model": "m1",
            "request": "When does the office open?",
            "response": response,
            "retrieved_context": [{"content": "The office opens at 8 and closes at 6."}],
        }
    )


def kafka_record(offset: int, raw: bytes, at: float) -> TimestampedValue:
    """A record as ReadKafkaStream yields it: stamped with its Kafka record time."""
    return TimestampedValue(SourceRecord(raw, "inference-logs", 0, offset, record_time=at), at)


class _Published:
    """What reached the sinks, in order (the DirectRunner runs DoFns in this process)."""

    rows: ClassVar[list[tuple[bytes, dict[str, Any]]]] = []
    dead_letters: ClassVar[list[tuple[int, str]]] = []


class _RecordRow(beam.DoFn):
    def process(self, record: tuple[bytes, bytes]) -> None:
        key, value = record
        _Published.rows.append((key, orjson.loads(value)))


class _RecordDeadLetter(beam.DoFn):
    def process(self, rejected: Rejected) -> None:
        _Published.dead_letters.append((rejected.record.position, rejected.reason))


class RatingsTopic(beam.PTransform):
    """The ratings sink minus the broker: the (key, value) each pane would be published as."""

    def expand(self, panes: Any) -> Any:
        return panes | beam.Map(rating_rows.encode) | beam.ParDo(_RecordRow())


class DeadLetterTopic(beam.PTransform):
    def expand(self, rejected: Any) -> Any:
        return rejected | beam.ParDo(_RecordDeadLetter())


def run_stream(script: TestStream) -> None:
    _Published.rows.clear()
    _Published.dead_letters.clear()
    config = stage_config(
        judges=JudgeSettings(backend="local", names=("groundedness",)).spec(),
        window_seconds=60.0,
    )
    options = PipelineOptions(["--streaming", "--runner=BundleBasedDirectRunner"])
    with beam.Pipeline(options=options) as p:
        build_stream(p, script, config, SCHEDULE, StreamSinks(DeadLetterTopic(), RatingsTopic()))


def pane(row: dict[str, Any]) -> tuple[str, int, int, int]:
    return row["pane"], row["pane_index"], row["yes"], row["no"]


def test_a_window_gets_early_on_time_and_late_panes_and_events_past_lateness_are_dropped() -> None:
    lateness = SCHEDULE.allowed_lateness_seconds
    script = (
        TestStream()
        .advance_watermark_to(T0)
        .add_elements([
            kafka_record(0, event("r0", T0 + 5, GROUNDED), T0 + 5),
            kafka_record(1, event("r1", T0 + 10, UNGROUNDED), T0 + 10),
            kafka_record(2, b"{not json", T0 + 11),
        ])
        # Processing time passes the early firing delay while the window is open.
        .advance_processing_time(SCHEDULE.early_firing_seconds + 1)
        .add_elements([kafka_record(3, event("r3", T0 + 20, GROUNDED), T0 + 20)])
        # The watermark passes the window's end: the on-time pane.
        .advance_watermark_to(T0 + 61)
        # Late, but within the allowed lateness: a late pane.
        .add_elements([kafka_record(4, event("r4", T0 + 30, UNGROUNDED), T0 + 30)])
        .advance_watermark_to(T0 + 60 + lateness + 1)
        # Later than the allowed lateness: the runner drops it; no pane changes.
        .add_elements([kafka_record(5, event("r5", T0 + 40, GROUNDED), T0 + 40)])
        .advance_watermark_to_infinity()
    )

    run_stream(script)

    assert [pane(row) for _, row in _Published.rows] == [
        ("early", 0, 1, 1),
        ("on_time", 1, 2, 1),
        ("late", 2, 2, 2),
    ]
    keys = {key for key, _ in _Published.rows}
    assert keys == {orjson.dumps([T0, "groundedness", "local", "help-bot", "m1"])}
    late = _Published.rows[-1][1]
    assert late == {
        "window_start": isoformat_utc(T0),
        "window_end": isoformat_utc(T0 + 60),
        "judge": "groundedness",
        "version": "local",
        "app": "help-bot",
        "model": "m1",
        "yes": 2,
        "no": 2,
        "error": 0,
        "percentage": 0.5,
        "ci_low": late["ci_low"],
        "ci_high": late["ci_high"],
        "scored": 0,
        "score_mean": None,
        "score_milli": 0,
        "pane": "late",
        "pane_index": 2,
    }
    assert 0.0 < late["ci_low"] < 0.5 < late["ci_high"] < 1.0
    assert [(offset, "not valid JSON" in why) for offset, why in _Published.dead_letters] == [
        (2, True)
    ]


def test_a_window_without_events_after_its_early_pane_still_gets_an_on_time_pane() -> None:
    """The exporter counts a window complete from its on-time pane: it must come even when
    nothing arrived since the early pane."""
    script = (
        TestStream()
        .advance_watermark_to(T0)
        .add_elements([kafka_record(0, event("r0", T0 + 5, GROUNDED), T0 + 5)])
        .advance_processing_time(SCHEDULE.early_firing_seconds + 1)
        .advance_watermark_to(T0 + 61)
        .advance_watermark_to_infinity()
    )

    run_stream(script)

    assert [pane(row) for _, row in _Published.rows] == [("early", 0, 1, 0), ("on_time", 1, 1, 0)]


def stream_settings(**changes: Any) -> StreamSettings:
    """Settings of a stream from topic t on Flink with the local judges, with `changes`."""
    fields: dict[str, Any] = {
        "judges": JudgeSettings(backend="local"),
        "bootstrap": "127.0.0.1:9092",
        "topic": "t",
        "dead_letter_topic": "t.dlq",
        "ratings_topic": "t.ratings",
        "runner": "FlinkRunner",
    }
    return StreamSettings(**{**fields, **changes})


def test_the_stream_graph_keeps_its_step_labels_which_job_updates_match_state_by() -> None:
    # A Flink savepoint or a Dataflow update finds each step's state by its full label: a step
    # renamed, or applied without its label, would start its windows and sessions afresh.
    settings = stream_settings(session_judges=("user_frustration",))
    p = beam.Pipeline()
    build_stream(p, TestStream(), settings.stage_config(), SCHEDULE, stream_sinks(settings))
    labels: list[str] = []

    class _Steps(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node: Any) -> None:
            if not node.full_label.startswith("Read"):  # the source's own steps
                labels.append(node.full_label)

    p.visit(_Steps())
    assert labels == [
        "ParseEvents/ParseAndSample/ParDo(_ParseAndSample)",
        "WriteDeadLetters/ToRecord",
        "WriteDeadLetters/Publish",
        "JudgeEvents/Judge",
        "GroupSessions/KeyTurnsBySession",
        "GroupSessions/SessionWindows",
        "GroupSessions/GroupTurns",
        "GroupSessions/MakeSessions",
        "GroupSessions/BackToGlobal",
        "JudgeSessions/Judge",
        "ReplaceRejudged/KeyBySession",
        "ReplaceRejudged/Replace",
        "WithSessions",
        "PaneRatings/WindowByEventTime/StampEventTime",
        "PaneRatings/WindowByEventTime/FixedWindows",
        "PaneRatings/RatingPerJudge",
        "PaneRatings/CountRatings/GroupByKey",
        "PaneRatings/CountRatings/Combine/ParDo(CombineValuesDoFn)",
        "PaneRatings/ToPane",
        "WriteRatings/ToRecord",
        "WriteRatings/Publish",
    ]


def test_no_step_of_the_stream_shows_a_kafka_password_in_its_display_data() -> None:
    # Runners show each step's display data in their UI (Flink's, Dataflow's console); the
    # sinks built as functions (pipeline/composite.py) show their arguments there.
    password, key_password = "sasl-secret-8c1f", "key-secret-52a9"
    settings = stream_settings(
        bootstrap="broker.example:9093",
        kafka_security=KafkaSecurity(
            protocol="SASL_SSL",
            sasl_mechanism="PLAIN",
            sasl_username="ragpulse",
            sasl_password=SecretStr(password),
            ssl_key_password=SecretStr(key_password),
        ),
    )
    p = beam.Pipeline()
    build_stream(p, TestStream(), settings.stage_config(), SCHEDULE, stream_sinks(settings))
    shown = str([
        t.display_data for t in p.to_runner_api().components.transforms.values()
    ])
    assert "broker.example:9093" in shown  # the sinks' targets are shown,
    assert password not in shown and key_password not in shown  # their secrets are not


def test_every_published_pane_reads_back_as_the_pane_it_was() -> None:
    key = rating_rows.RatingPane(
        rating_rows.WindowKey(T0, T0 + 60, "groundedness", "help-bot", "m1"),
        rating_rows.RatingCounts(3, 1, 2),
        "late",
        4,
    )
    _, value = rating_rows.encode(key)
    assert rating_rows.decode(value) == key


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (b"{", "not JSON"),
        (b'{"judge": "groundedness"}', "missing or mistyped"),
        (
            orjson.dumps({**orjson.loads(rating_rows.encode(rating_rows.RatingPane(
                rating_rows.WindowKey(T0, T0 + 60, "g", "a", "m"),
                rating_rows.RatingCounts(1, 0, 0), "early", 0))[1]), "pane": "final"}),
            "pane must be one of",
        ),
        (
            orjson.dumps({**orjson.loads(rating_rows.encode(rating_rows.RatingPane(
                rating_rows.WindowKey(T0, T0 + 60, "g", "a", "m"),
                rating_rows.RatingCounts(1, 0, 0), "early", 0))[1]), "yes": -1}),
            "count -1",
        ),
    ],
)
def test_a_record_that_is_not_a_rating_row_is_refused_with_the_reason(
    value: bytes, problem: str
) -> None:
    with pytest.raises(rating_rows.InvalidRatingRow, match=problem):
        rating_rows.decode(value)


def test_stream_refuses_runners_that_do_not_run_unbounded_pipelines() -> None:
    with pytest.raises(ValueError, match="FnApiRunner does not run unbounded pipelines"):
        stream_settings(runner="FnApiRunner")


def test_a_consumer_group_on_flink_without_checkpoints_is_refused_before_submission() -> None:
    # Found on Flink: the job was reported RUNNING, then failed at invocation ("No
    # checkpointing configured but pipeline uses @RequiresStableInput").
    grouped = ["--kafka-consumer-config", "group.id=ragpulse-stream"]
    base = ["stream", "--kafka-bootstrap", "127.0.0.1:9092", "--topic", "logs",
            "--runner", "PortableRunner", "--print-config"]
    done = ragpulse(*base, *grouped)
    line = one_line_error(done.returncode, done.stderr, allow_info=True)
    assert "add --beam-arg=--checkpointing_interval=MS" in line
    assert ragpulse(*base, *grouped, "--beam-arg=--checkpointing_interval=60000").returncode == 0
    assert ragpulse(*base).returncode == 0  # no group, no commits: nothing to checkpoint


def test_stream_without_an_expansion_service_says_how_to_start_one_in_one_line(
    tmp_path: Path,
) -> None:
    port = free_port()  # nothing listens there
    done = ragpulse(
        "stream", "--kafka-bootstrap", "127.0.0.1:9092", "--topic", "logs",
        "--runner", "PortableRunner", "--expansion-service", f"127.0.0.1:{port}",
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    # Beam's temp folder of the pipeline that was never run is gone with the command.
    assert [p.name for p in tmp_path.iterdir()] == []
    line = one_line_error(done.returncode, done.stderr, allow_info=True)
    assert line.startswith(
        f"ragpulse stream: cannot expand the Kafka reader with 127.0.0.1:{port}:"
    )
    assert "--expansion-service HOST:PORT" in line
    assert "ragpulse-kafka-read.jar" in line


def test_stream_without_expansion_service_names_the_jar_it_needs_in_one_line() -> None:
    done = ragpulse(
        "stream", "--kafka-bootstrap", "127.0.0.1:9092", "--topic", "logs",
        "--runner", "PortableRunner",
    )
    line = one_line_error(done.returncode, done.stderr, allow_info=True)
    assert line.startswith("ragpulse stream: --expansion-service HOST:PORT is needed: ")
    assert "ragpulse-kafka-read.jar" in line and "--experiments=use_deprecated_read" in line


def test_the_exporter_refuses_bad_settings_in_one_line() -> None:
    done = ragpulse("exporter", "--kafka-bootstrap", "k:9092", "--ratings-topic", "")
    line = one_line_error(done.returncode, done.stderr)
    assert line.startswith("ragpulse exporter: invalid settings: --ratings-topic: ")


def test_a_consumer_auto_commit_is_refused_because_offsets_commit_only_at_checkpoints() -> None:
    # Found on Flink: with the consumer's auto-commit the group's offset reached 248 while
    # nothing had left the read stage, so a restart from the group would have skipped them.
    base = ["stream", "--kafka-bootstrap", "127.0.0.1:9092", "--topic", "logs",
            "--runner", "PortableRunner", "--print-config",
            "--kafka-consumer-config", "group.id=ragpulse-stream",
            "--beam-arg=--checkpointing_interval=60000"]
    done = ragpulse(*base, "--kafka-consumer-config", "enable.auto.commit=true")
    line = one_line_error(done.returncode, done.stderr, allow_info=True)
    assert "enable.auto.commit must stay false" in line
    assert ragpulse(*base, "--kafka-consumer-config", "enable.auto.commit=false").returncode == 0
