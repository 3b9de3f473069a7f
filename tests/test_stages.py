"""Each composite stage of the Beam graph, in the configuration `run` and `serve` use.

Every test runs a real pipeline on Beam's FnApiRunner (the runner both commands use) with the
local judges, and reads back what the stage emits, or what reaches the caller through Beam's
metrics (`pipeline.graphs.bounded.decode_metrics`), exactly as `run_graph` does.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import apache_beam as beam
import orjson
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms.window import FixedWindows
from graph_runs import stage_config

from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.pipeline.costs.sampling import is_sampled
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.graphs.bounded import (
    GraphResult,
    Sinks,
    decode_metrics,
    own_temp_dir,
    pipeline_options,
    run_graph,
)
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import InferenceRecord, JudgedEvent, Rejected, SourceRecord
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.sinks.files import WriteDeadLetters
from ragpulse.pipeline.stages.judge import JudgeEvents
from ragpulse.pipeline.stages.parse import AdmissionRules, ParseEvents
from ragpulse.pipeline.stages.report import ReportWindows
from ragpulse.pipeline.stages.windows import WindowRatings
from ragpulse.pipeline.windows import RatingCounts, WindowKey, isoformat_utc

pytestmark = pytest.mark.slow  # each runs a Beam pipeline

SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "samples" / "events.jsonl"
T0 = 1_700_000_400.0  # a multiple of 60: the start of a one-minute window


def event(request_id: str, at: float, app: str = "help-bot") -> bytes:
    return orjson.dumps(
        {
            "request_id": request_id,
            "timestamp": isoformat_utc(at),
            "app": app,
            "model": "m1",
            "request": "When does the office open?",
            "response": "The office opens at 8.",
            "retrieved_context": [{"content": "The office opens at 8 and closes at 6."}],
        }
    )


def record(raw: bytes, offset: int, partition: int | None = 0) -> SourceRecord:
    return SourceRecord(raw, "events", partition, offset)


def judged(request_id: str, at: float, rating: str) -> JudgedEvent:
    rec = InferenceRecord(
        request_id=request_id,
        event_time=at,
        app="help-bot",
        model="m1",
        judge_input=JudgeInput(question="q", answer="a"),
    )
    verdict = Verdict(
        "groundedness",
        rating,  # type: ignore[arg-type]
        error_message="boom" if rating == "error" else None,
    )
    return JudgedEvent(rec, (verdict,))


def parse(
    records: list[SourceRecord],
    want_events: list[str],
    want_rejected: list[tuple[int | None, int, str]],
    **config: Any,
) -> GraphResult:
    """Run ParseEvents over `records`; check the request ids of its events, and the partition,
    position and reason (its start) of its rejected records; return what reached the caller."""

    def check_rejected(got: list[Rejected]) -> None:
        found = sorted((r.record.partition, r.record.position, r.reason) for r in got)
        assert len(found) == len(want_rejected), found
        for (partition, position, reason), want in zip(found, sorted(want_rejected), strict=True):
            assert (partition, position) == want[:2] and reason.startswith(want[2]), found

    with beam.Pipeline(runner=FnApiRunner()) as p:
        parsed = p | beam.Create(records) | ParseEvents(AdmissionRules(**config))
        assert_that(
            parsed.events | "Ids" >> beam.Map(lambda e: e.request_id),
            equal_to(want_events),
            label="CheckEvents",
        )
        assert_that(parsed[ParseEvents.DEAD_LETTER], check_rejected, label="CheckRejected")
    return decode_metrics(p.result.metrics())


# --- ParseEvents ---------------------------------------------------------------------------------


def test_parse_events_keeps_valid_sampled_events_and_rejects_the_rest_with_reasons() -> None:
    records = [record(event(f"r{i}", T0 + i), i) for i in range(40)]
    records.append(record(b"{not json", 40))
    records.append(SourceRecord(b"x" * 10, "events", 1, 7, oversize_bytes=5_000_000))
    sampled = [f"r{i}" for i in range(40) if is_sampled(f"r{i}", 0.5)]
    assert 0 < len(sampled) < 40
    result = parse(
        records,
        sampled,
        [(0, 40, "line is not valid JSON"), (1, 7, "record is 5000000 bytes")],
        sample_rate=0.5,
        window_size=60.0,
    )
    c = result.counts
    assert c[counting.key("ragpulse_events_total", outcome="accepted")] == 40
    assert c[counting.key("ragpulse_events_total", outcome="invalid")] == 2
    assert c[counting.key("ragpulse_events_sampled_total")] == len(sampled)
    assert result.dead_letters == 2


def test_parse_events_rejects_events_of_closed_windows_as_late_as_serve_configures_it() -> None:
    # serve passes closed_before = watermark - allowed lateness: windows ending at or before it
    # are final, so their events are dead-lettered and counted late, never judged.
    records = [
        record(event("in-closed-window", T0 + 59), 0),
        record(event("on-the-boundary", T0 + 60), 1),
        record(event("later", T0 + 200), 2),
    ]
    result = parse(
        records,
        ["on-the-boundary", "later"],
        [(0, 0, "late event: its window ending")],
        sample_rate=1.0,
        window_size=60.0,
        closed_before=T0 + 60,
    )
    assert result.counts[counting.key("ragpulse_late_events_total")] == 1
    assert result.counts[counting.key("ragpulse_events_total", outcome="accepted")] == 3


def test_parse_events_reports_the_latest_event_time_per_partition_for_the_watermark() -> None:
    records = [
        record(event("a", T0 + 10), 0, partition=0),
        record(event("b", T0 + 30), 1, partition=0),
        record(event("c", T0 + 5), 0, partition=3),
        record(event("from-a-file", T0 + 999), 1, partition=None),  # files have no watermark
    ]
    result = parse(records, ["a", "b", "c", "from-a-file"], [], sample_rate=1.0, window_size=60.0)
    assert result.latest_event_time == {0: T0 + 30, 3: T0 + 5}


def test_parse_events_refuses_events_dated_beyond_the_future_skew_and_keeps_their_time_out(
) -> None:
    # Ahead of the clock (2099), or ahead of its Kafka record time though the clock is later
    # still (a backlog read long after): refused, not accepted, and no partition's latest
    # event time moves, so serve's watermark cannot jump.
    year_2099 = 4_070_908_800.0
    records = [
        record(event("ok", T0 + 10), 0),
        record(event("in-2099", year_2099), 1),
        SourceRecord(event("ahead-of-its-record", T0 + 3600), "events", 1, 2, T0),
        SourceRecord(event("within-the-skew", T0 + 200), "events", 1, 3, T0),
    ]
    result = parse(
        records,
        ["ok", "within-the-skew"],
        [
            (0, 1, "future-dated event: its time 2099-01-01T00:00:00Z is"),
            (1, 2, "future-dated event: its time 2023-11-14T23:20:00Z is 3600s ahead of its "
             "Kafka record time (2023-11-14T22:20:00Z), over --max-future-skew 300s"),
        ],
        sample_rate=1.0,
        window_size=60.0,
        max_future_skew_s=300.0,
    )
    assert result.counts[counting.key("ragpulse_events_total", outcome="accepted")] == 2
    assert result.counts[counting.key("ragpulse_events_total", outcome="invalid")] == 2
    assert result.latest_event_time == {0: T0 + 10, 1: T0 + 200}


class Hostile(bytes):
    """Record bytes that raise when parsed: a stand-in for any bug one record can reach."""

    def __len__(self) -> int:
        raise RuntimeError("boom")


def test_parse_events_refuses_a_record_whose_reading_raises_instead_of_failing_the_bundle(
) -> None:
    # Any bug one record reaches (here: bytes that fail when read) refuses that record.
    records = [record(event("ok", T0), 0), record(Hostile(b"{}"), 1)]
    result = parse(
        records, ["ok"], [(0, 1, "could not read the event (RuntimeError: boom)")],
        sample_rate=1.0, window_size=60.0,
    )
    assert result.dead_letters == 1


# --- JudgeEvents ---------------------------------------------------------------------------------


def test_judge_events_gives_one_verdict_per_judge_and_counts_them() -> None:
    records = [parse_record(i) for i in range(30)]
    config = stage_config(judge_batch_size=8)  # several batches per bundle
    with beam.Pipeline(runner=FnApiRunner()) as p:
        judged = (
            p
            | beam.Create(records)
            | JudgeEvents(config.judges, batch_size=config.judge_batch_size)
        )
        assert_that(
            judged
            | beam.Map(lambda j: (j.record.request_id, tuple(v.judge for v in j.verdicts))),
            equal_to([(f"r{i}", config.judges.names) for i in range(30)]),
        )
    result = decode_metrics(p.result.metrics())
    per_judge: Counter[str] = Counter()
    for (name, labels), v in result.counts.items():
        if name == counting.VERDICTS:
            per_judge[dict(labels)["judge"]] += v
    assert per_judge == {j: 30 for j in config.judges.names}
    judged_key = counting.key("ragpulse_events_judged_total", app="help-bot", model="m1")
    assert result.counts[judged_key] == 30


def parse_record(i: int) -> InferenceRecord:
    return parse_event(event(f"r{i}", T0 + i))


def test_judge_events_refuses_windowed_input() -> None:
    pipeline = own_temp_dir(beam.Pipeline(runner=FnApiRunner()))
    with pytest.raises(ValueError, match="before they are windowed"), pipeline as p, p:
        _ = (
            p
            | beam.Create([parse_record(0)])
            | beam.WindowInto(FixedWindows(60))
            | JudgeEvents(stage_config().judges, batch_size=1)
        )


# --- WindowRatings and ReportWindows -----------------------------------------------------------


def test_window_ratings_gives_one_total_per_window_and_reports_it_to_the_caller() -> None:
    events = [judged(str(i), T0 + i * 7, "yes" if i % 3 else "no") for i in range(20)]
    events.append(judged("err", T0 + 61, "error"))
    # i*7 < 60 for i <= 8: window 1 holds i=0..8 (no at 0, 3, 6),
    # window 2 holds i=9..17 and the error, window 3 holds i=18, 19.
    want = {
        T0: RatingCounts(6, 3, 0),
        T0 + 60: RatingCounts(6, 3, 1),
        T0 + 120: RatingCounts(1, 1, 0),
    }
    with beam.Pipeline(runner=FnApiRunner()) as p:
        windows = p | beam.Create(events) | WindowRatings(window_size=60)
        _ = windows | ReportWindows()
        assert_that(
            windows | beam.MapTuple(lambda k, c: (k.window_start, c)),
            equal_to(list(want.items())),
        )
    reported = decode_metrics(p.result.metrics()).windows
    assert reported == {
        WindowKey(start, start + 60, "groundedness", "help-bot", "m1"): c
        for start, c in want.items()
    }


# --- the whole graph, and the runner as a parameter -------------------------------------------


def whole_graph(tmp_path: Path, beam_args: list[str]) -> GraphResult:
    lines = SAMPLES.read_bytes().splitlines()[:300]
    records = [SourceRecord(line, "events", i % 2, i) for i, line in enumerate(lines)]
    sinks = Sinks(dead_letters=WriteDeadLetters(tmp_path), exemplars=True)
    return run_graph(
        beam.Create(records),
        stage_config(window_seconds=300.0),
        sinks,
        options=pipeline_options(beam_args),
    )


def test_the_graph_gives_the_same_result_on_two_worker_processes_as_in_process(
    tmp_path: Path,
) -> None:
    """--beam-arg reaches the runner: Beam's FnApiRunner in multi-processing mode gathers the
    workers' metrics, so the caller sees the same counts, windows and watermark inputs."""
    one = whole_graph(tmp_path / "one", [])
    two = whole_graph(
        tmp_path / "two", ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    )
    timings = {counting.LATENCY_BUCKET, counting.LATENCY_SUM_US}

    def counts(r: GraphResult) -> dict[counting.CounterKey, int]:
        return {k: v for k, v in r.counts.items() if k[0] not in timings}

    assert counts(one) == counts(two)
    assert one.windows == two.windows and sum(c.graded for c in one.windows.values()) > 500
    assert one.latest_event_time == two.latest_event_time and set(one.latest_event_time) == {0, 1}
    assert one.exemplars == two.exemplars


def test_rejected_records_reach_the_dead_letter_sink_with_their_source(tmp_path: Path) -> None:
    records = [record(b"[1, 2]", 5, partition=2), record(event("ok", T0), 6, partition=2)]
    result = run_graph(
        beam.Create(records), stage_config(), Sinks(dead_letters=WriteDeadLetters(tmp_path))
    )
    text = (tmp_path / "dead_letter.jsonl").read_bytes()
    rows = [orjson.loads(line) for line in text.splitlines()]
    assert [(r["source"], r["position"], r["raw"]) for r in rows] == [("events/2", 5, "[1, 2]")]
    assert result.dead_letters == 1


def test_groundedness_is_counted_by_the_sufficiency_of_the_context_when_both_judges_run() -> None:
    """The root-cause split of a groundedness drop: each answer's groundedness verdict, counted
    under its context_sufficiency verdict (the panel's own verdicts say what to expect)."""
    judges = ("groundedness", "context_sufficiency")
    records = [parse_record(i) for i in range(6)]
    records += [
        parse_event(orjson.dumps({
            "request_id": f"off-{i}", "timestamp": isoformat_utc(T0 + i), "app": "help-bot",
            "model": "m1", "request": "How much is the Team plan?",
            "response": "It costs 18 euros per user.",
            "retrieved_context": [{"content": "Routers restart when the reset button is held."}],
        }))
        for i in range(4)
    ]
    spec = JudgeSettings(backend="local", names=judges).spec()
    panel = spec.build()
    try:
        verdicts = panel.judge_batch([r.judge_input for r in records])
    finally:
        panel.close()
    expected: Counter[tuple[str, str]] = Counter()
    for grounded, sufficient in verdicts:
        if sufficient.rating in ("yes", "no"):
            context = "sufficient" if sufficient.rating == "yes" else "insufficient"
            expected[context, grounded.rating] += 1
    assert len(expected) >= 2  # both kinds of context occur in this sample

    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = p | beam.Create(records) | JudgeEvents(spec, batch_size=4)
    counts = decode_metrics(p.result.metrics()).counts
    got = Counter({
        (dict(labels)["context"], dict(labels)["rating"]): v
        for (name, labels), v in counts.items() if name == counting.GROUNDED_BY_CONTEXT
    })
    assert got == expected


def test_groundedness_is_not_split_without_the_context_sufficiency_judge() -> None:
    with beam.Pipeline(runner=FnApiRunner()) as p:
        _ = p | beam.Create([parse_record(0)]) | JudgeEvents(stage_config().judges, batch_size=1)
    counts = decode_metrics(p.result.metrics()).counts
    assert not [k for k in counts if k[0] == counting.GROUNDED_BY_CONTEXT]


class _FailsToBuild(beam.PTransform):
    def expand(self, pbegin: Any) -> Any:
        raise RuntimeError("no source here")


def test_a_graph_that_fails_to_build_leaves_no_beam_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Beam makes a beam-pipeline-temp* folder for every Pipeline and removes it only when
    run() ends: a failed build (of a serve cycle, say) must not leave it in /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with pytest.raises(RuntimeError, match="no source here"):
        run_graph(_FailsToBuild(), stage_config(), Sinks(dead_letters=WriteDeadLetters(tmp_path)))
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("beam-pipeline-temp")] == []
