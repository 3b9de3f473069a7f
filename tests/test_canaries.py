"""Judge canaries: the golden-set file, the feed's rate, and canaries inside a real Beam run.

The pipeline tests run the Beam graph (`pipeline.graphs.bounded`) on Beam's FnApiRunner with the
local judges, once without and once with canaries, and compare every output: canaries must change
nothing but `ragpulse_canary_verdicts_total`, whose counts are checked against the judges' own
verdicts on the golden events.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest
from graph_runs import run_to_files, stage_config

from ragpulse.judges import DEFAULT_JUDGES, JUDGE_NAMES
from ragpulse.pipeline.canaries import (
    CANARY_VERDICTS,
    CanaryEvent,
    CanaryFeed,
    GoldenSetError,
    load_golden_set,
    outcome,
)
from ragpulse.pipeline.commands.simulate import Incidents, simulate
from ragpulse.pipeline.graphs.bounded import GraphResult
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.sinks.files import DEAD_LETTER_FILE, VERDICTS_FILE

SAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "samples" / "canaries.jsonl"
T0 = 1_763_632_800.0

GOOD = (
    '{"request_id": "g1", "request": "When is the office open?", "response": "From 8 to 6.", '
    '"labels": {"groundedness": "no", "safety": "yes"}}'
)


def write_lines(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "golden.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- the golden-set file -----------------------------------------------------------------------


def test_shipped_golden_set_loads_with_a_label_for_every_judge() -> None:
    golden = load_golden_set(SAMPLE, JUDGE_NAMES)
    assert len(golden) == 11
    labelled = {judge for c in golden for judge, _ in c.labels}
    assert labelled == set(JUDGE_NAMES)
    assert {label for c in golden for _, label in c.labels} == {"yes", "no"}


def test_labels_of_judges_not_in_use_are_left_out_and_unlabelled_events_dropped(
    tmp_path: Path,
) -> None:
    only_relevance = GOOD.replace("g1", "g2").replace(
        '{"groundedness": "no", "safety": "yes"}', '{"relevance_to_query": "yes"}'
    )
    golden = load_golden_set(write_lines(tmp_path, GOOD, "", only_relevance), ["safety"])
    assert [(c.record.request_id, c.labels) for c in golden] == [("g1", (("safety", "yes"),))]


@pytest.mark.parametrize(
    ("bad_line", "reason"),
    [
        ('{"request": "q", "response": "a"', "not valid JSON"),
        ('{"request": "q", "labels": {"safety": "yes"}}', "neither 'response' nor 'trace'"),
        ('{"request": "q", "response": "a"}', "'labels' must be an object"),
        ('{"request": "q", "response": "a", "labels": {}}', "'labels' must be an object"),
        ('{"request": "q", "response": "a", "labels": {"tone": "yes"}}', "unknown judge 'tone'"),
        (
            '{"request": "q", "response": "a", "labels": {"safety": "maybe"}}',
            "'labels.safety' must be \"yes\" or \"no\", not 'maybe'",
        ),
    ],
)
def test_a_bad_line_is_refused_naming_the_file_the_line_and_the_reason(
    tmp_path: Path, bad_line: str, reason: str
) -> None:
    path = write_lines(tmp_path, GOOD, bad_line)
    with pytest.raises(GoldenSetError) as caught:
        load_golden_set(path, JUDGE_NAMES)
    message = str(caught.value)
    assert message.startswith(f"canary file {path}, line 2: ")
    assert reason in message


def test_a_golden_set_with_no_label_for_the_judges_in_use_is_refused(tmp_path: Path) -> None:
    with pytest.raises(GoldenSetError, match="no event is labelled for the judges in use"):
        load_golden_set(write_lines(tmp_path, GOOD), ["relevance_to_query"])


def test_a_missing_golden_set_file_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(GoldenSetError, match=r"canary file .*nope.jsonl: cannot read it"):
        load_golden_set(tmp_path / "nope.jsonl", JUDGE_NAMES)


# --- the feed ----------------------------------------------------------------------------------


def test_feed_hands_out_the_rate_per_minute_in_turn_and_caps_what_an_idle_spell_carries() -> None:
    golden = load_golden_set(SAMPLE, JUDGE_NAMES)
    feed = CanaryFeed(golden, per_minute=4, now=0.0)
    taken = feed.take(0.0)  # a minute's worth at start-up
    assert [c.record.request_id for c in taken] == ["canary-01", "canary-02", "canary-03",
                                                     "canary-04"]
    assert len(feed.take(15.0)) == 1  # 4 per minute = 1 per 15 s
    assert len(feed.take(20.0)) == 0  # a third of one is due
    assert len(feed.take(30.0)) == 1  # the rest of it
    after_idle_hour = feed.take(3630.0)
    assert len(after_idle_hour) == 4  # one minute's worth, not 240
    assert after_idle_hour[0].record.request_id == "canary-07"
    assert [c.record.request_id for c in feed.take(3690.0)][-1] == "canary-03"  # wrapped around


def test_a_rate_below_one_a_minute_still_brings_a_canary_now_and_then() -> None:
    feed = CanaryFeed(load_golden_set(SAMPLE, JUDGE_NAMES), per_minute=0.5, now=0.0)
    counts = [len(feed.take(float(t))) for t in range(0, 600, 30)]
    assert counts[0] == 1 and sum(counts) == 5  # 1 at start, then 0.5/min over 9.5 min


# --- canaries inside a real bounded run --------------------------------------------------------


def run(tmp_path: Path, name: str, canaries: Sequence[CanaryEvent]) -> GraphResult:
    events = list(
        simulate(5, 200, T0, rate=2, incidents=Incidents(groundedness_drop_at=0.0, drop_to=0.5))
    )
    records = [SourceRecord(e.payload, "sim", None, i) for i, e in enumerate(events, start=1)]
    config = stage_config(window_seconds=60.0, judge_batch_size=64)
    return run_to_files(records, tmp_path / name, config, canaries)


def expected_outcomes(canaries: Sequence[CanaryEvent]) -> Counter[counting.CounterKey]:
    """What the counter must hold: the local judges' own verdicts compared with the labels."""
    panel = JudgeSettings(backend="local").spec().build()
    try:
        verdicts = panel.judge_batch([c.record.judge_input for c in canaries])
    finally:
        panel.close()
    expected: Counter[counting.CounterKey] = Counter()
    for canary, per_judge in zip(canaries, verdicts, strict=True):
        labels = dict(canary.labels)
        for v in per_judge:
            if v.judge in labels:
                expected[counting.key(CANARY_VERDICTS, judge=v.judge,
                                   outcome=outcome(v, labels[v.judge]))] += 1
    return expected


@pytest.mark.slow
def test_canaries_change_no_production_count_window_or_verdict_row_and_are_counted_apart(
    tmp_path: Path,
) -> None:
    golden = load_golden_set(SAMPLE, DEFAULT_JUDGES)  # the judges of the run
    canaries = golden * 3  # 33 canaries, each golden event three times
    plain = run(tmp_path, "plain", ())
    with_canaries = run(tmp_path, "canaries", canaries)

    # Latency buckets and sums are wall-clock timings and differ from run to run; their
    # counts do not.
    timings = {counting.LATENCY_BUCKET, counting.LATENCY_SUM_US, CANARY_VERDICTS}
    production = Counter({k: v for k, v in with_canaries.counts.items() if k[0] not in timings})
    assert production == Counter({k: v for k, v in plain.counts.items() if k[0] not in timings})
    assert production[counting.key(counting.LATENCY_COUNT, judge="safety")] == 200
    assert with_canaries.windows == plain.windows
    for name in (VERDICTS_FILE, DEAD_LETTER_FILE, "windows.jsonl"):
        canary_run, plain_run = tmp_path / "canaries" / name, tmp_path / "plain" / name
        assert canary_run.read_bytes() == plain_run.read_bytes()
    # The canary request ids appear in no production output.
    verdict_text = (tmp_path / "canaries" / VERDICTS_FILE).read_text()
    assert "canary-" not in verdict_text

    canary_counts = Counter(
        {k: v for k, v in with_canaries.counts.items() if k[0] == CANARY_VERDICTS}
    )
    assert canary_counts == expected_outcomes(canaries)
    labelled_verdicts = sum(len(c.labels) for c in canaries)
    assert sum(canary_counts.values()) == labelled_verdicts == 3 * 29
    # The shipped set holds a known miss of the lexical judges (canary-09), so disagreement is
    # visible with the default backend too.
    assert canary_counts[counting.key(CANARY_VERDICTS, judge="safety", outcome="disagree")] == 3
