"""Weighted composites (--composite): one score per event from the other judges' grades,
exported like a judge on a graded scale (real Beam graph on FnApiRunner)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import orjson
import pytest
from fake_openai import FakeOpenAI, read_fences
from graph_runs import run_to_files, stage_config

from ragpulse.judges.base import Verdict
from ragpulse.judges.composite import CompositeGrader, parse_composite
from ragpulse.judges.local.judge import build_local_judges
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.models import JudgeSettings

SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "samples"
CONTEXT = "Refunds are accepted within 30 days of purchase."


def record(i: int, answer: str, **truth: object) -> SourceRecord:
    event = {"request_id": f"req-{i}", "timestamp": "2025-11-20T10:00:00Z", "app": "faq",
             "model": "m1", "request": "How many days do refunds take?", "response": answer,
             "retrieved_context": [{"content": CONTEXT, "doc_uri": "kb/1"}], **truth}
    return SourceRecord(orjson.dumps(event), "mem", None, i)


@pytest.mark.parametrize(("flag", "says"), [
    ("quality", "is not NAME=JUDGE:WEIGHT"),
    ("quality=groundedness", "is not JUDGE:WEIGHT"),
    ("quality=groundedness:-1", "must be positive"),
    ("quality=groundedness:1,pass:2", "pass score is on 0..1"),
    ("quality=groundedness:1,groundedness:2", "more than once"),
])
def test_a_malformed_composite_is_refused_in_one_line(flag: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_composite(flag)


def test_a_composite_of_a_judge_not_in_use_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="safety not among --judges"):
        JudgeSettings(backend="local", names=("groundedness",),
                      composites=("quality=groundedness:0.5,safety:0.5",))


def test_a_member_error_makes_the_composite_an_error_with_its_cause_not_a_partial_score() -> None:
    judges = build_local_judges(("groundedness", "safety"))
    grader = CompositeGrader(parse_composite("quality=groundedness:0.6,safety:0.4"), judges)
    failed = Verdict("safety", "error", error_message="timed out", error_cause="timeout")
    v = grader.grade((Verdict("groundedness", "yes", "ok"), failed))
    assert (v.rating, v.error_cause, v.score) == ("error", "timeout", None)


@pytest.mark.slow  # runs a Beam pipeline
def test_a_composite_of_local_judges_is_counted_windowed_and_skipped_like_a_graded_judge(
    tmp_path: Path,
) -> None:
    judges = JudgeSettings(
        backend="local", names=("groundedness", "safety", "correctness"),
        composites=("quality=groundedness:0.6,safety:0.4,pass:0.7",
                    "truth=correctness:1,groundedness:1"),
    ).spec()
    config = dataclasses.replace(stage_config(), judges=judges)
    ungrounded = "Refunds are accepted within 90 days at the Zurich office of Globex."
    result = run_to_files([record(1, CONTEXT), record(2, ungrounded)], tmp_path, config)

    def series(metric: str, name: str) -> dict[str, float]:
        return {dict(k[1]).get("rating", "-"): v for k, v in result.counts.items()
                if k[0] == metric and dict(k[1])["judge"] == name}

    assert series(counting.VERDICTS, "quality") == {"yes": 1, "no": 1}  # 1.0 and 0.4
    assert series(counting.SCORE_COUNT, "quality") == {"-": 2}
    assert series(counting.SCORE_SUM_MILLI, "quality") == {"-": 1400}
    assert series("ragpulse_judge_calls_total", "quality") == {}  # no model was asked
    # Without an expected answer correctness is skipped, and so is its composite.
    assert series(counting.SKIPPED, "truth") == {"-": 2}
    assert series(counting.VERDICTS, "truth") == {}

    windows = {w["judge"]: w for w in map(orjson.loads,
                                          (tmp_path / "windows.jsonl").read_bytes().splitlines())}
    quality = windows["quality"]
    assert (quality["scored"], quality["score_mean"], quality["percentage"]) == (2, 0.7, 0.5)
    assert quality["version"].startswith("c") and "truth" not in windows


def _readable(body: dict[str, object]) -> str | None:
    """The stand-in scores readability 3 for a short answer, 0 for a long one."""
    messages = body["messages"]
    assert isinstance(messages, list)
    if "readable" not in messages[0]["content"]:
        return None
    answer = read_fences(messages[-1]["content"]).fenced["answer"][0]
    return f"score: {3 if len(answer.split()) < 12 else 0}\njustification: As it reads."


@pytest.mark.slow  # runs a Beam pipeline
def test_the_studys_weighted_composite_mixes_a_binary_judge_with_a_0_to_3_judge(
    tmp_path: Path,
) -> None:
    with FakeOpenAI(reply_for=_readable) as server:
        judges = JudgeSettings(
            backend="openai", base_url=server.base_url, names=("safety", "readability"),
            custom_judges=(str(SAMPLES / "readability.yaml"),),
            composites=("quality=safety:0.6,readability:0.4",),
        ).spec()
        config = dataclasses.replace(stage_config(), judges=judges)
        long = " ".join(["word"] * 20)
        result = run_to_files([record(1, "Thirty days."), record(2, long)], tmp_path, config)
    sums = {k: v for k, v in result.counts.items()
            if k[0] == counting.SCORE_SUM_MILLI and dict(k[1])["judge"] == "quality"}
    assert list(sums.values()) == [1000 + 600]  # 0.6 + 0.4 * 3/3, then 0.6 + 0.4 * 0/3
