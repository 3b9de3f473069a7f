"""Graded scales (0-3, 1-5): prompt files with a rubric and one example per score, MLflow's
`score:` / `justification:` replies besides JSON, and windows that report the mean score and
the share at or above the pass score as re-aggregable counts."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from fake_openai import FakeOpenAI, read_fences
from graph_runs import run_to_files, stage_config
from prometheus_client.parser import text_string_to_metric_families

from ragpulse.judges.llm.custom import CustomJudgeError, load_custom_judge
from ragpulse.judges.llm.judge import UnparsableReply, parse_reply, parse_scored_reply
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, write_textfile
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.models import JudgeSettings

SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "samples"
COMPREHENSIVENESS = SAMPLES / "comprehensiveness.yaml"


def test_an_mlflow_score_and_justification_reply_is_read_in_either_order() -> None:
    reply = parse_scored_reply("score: 4\njustification: Mostly complete.", (1, 2, 3, 4, 5))
    assert (reply.score, reply.rationale) == (4, "Mostly complete.")
    reply = parse_scored_reply("**Justification:** Thin.\n**Score:** 2/5", (1, 2, 3, 4, 5))
    assert (reply.score, reply.rationale) == (2, "Thin.")
    reply = parse_scored_reply('{"justification": "All there.", "score": 3}', (0, 1, 2, 3))
    assert (reply.score, reply.rationale) == (3, "All there.")


@pytest.mark.parametrize(("text", "why"), [
    ("score: 7\njustification: Great.", "not on the scale"),
    ("score: 2\nscore: 3\njustification: Hm.", "2 'score:' lines"),
    ('{"rationale": "ok", "score": true}', "whole number"),
    ("justification: no number at all", "'score:' line"),
])
def test_a_score_off_the_scale_or_ambiguous_is_unparsable_not_guessed(text: str, why: str) -> None:
    with pytest.raises(UnparsableReply, match=why):
        parse_scored_reply(text, (0, 1, 2, 3))


def test_a_binary_reply_may_give_its_rationale_as_mlflows_justification() -> None:
    reply = parse_reply("justification: The answer is on topic.\nrating: yes")
    assert (reply.rating, reply.rationale) == ("yes", "The answer is on topic.")


@pytest.mark.parametrize(("edit", "says"), [
    (lambda t: t.replace("pass_score: 2\n", ""), "pass score among [0, 1, 2, 3]"),
    (lambda t: t.replace("pass_score: 2", "pass_score: 5"), "pass score among [0, 1, 2, 3]"),
    (lambda t: t.replace("  - score: 1\n", "  - score: 2\n"), "one example per score"),
    (lambda t: t.replace("  - score: 0\n", "  - rating: \"no\"\n"), "have a score, not a rating"),
])
def test_a_graded_custom_judge_needs_a_pass_score_on_its_scale_and_one_example_per_score(
    tmp_path: Path, edit: Any, says: str
) -> None:
    path = tmp_path / "judge.yaml"
    path.write_text(edit(COMPREHENSIVENESS.read_text()))
    with pytest.raises(CustomJudgeError, match=re.escape(says)):
        load_custom_judge(path)


def _score_by_answer(body: dict[str, Any]) -> str:
    """The stand-in model's MLflow-style reply: the score is the answer's first word."""
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    answer = read_fences(user).fenced["answer"][0].strip()
    return f"score: {answer.split()[0]}\njustification: The answer says so."


@pytest.mark.slow  # runs a Beam pipeline
def test_a_graded_judge_reports_its_mean_and_its_share_at_or_above_the_pass_score(
    tmp_path: Path,
) -> None:
    records = [
        SourceRecord(orjson.dumps({
            "request_id": f"req-{i}", "timestamp": "2025-11-20T10:00:00Z", "app": "faq",
            "model": "m1", "request": "How do I reset my password?",
            "response": f"{score} points worth of answer.",
        }), "mem", None, i)
        for i, score in enumerate((3, 2, 1, 0, 3))
    ]
    with FakeOpenAI(reply_for=_score_by_answer) as server:
        judges = JudgeSettings(
            backend="openai", base_url=server.base_url, names=("comprehensiveness",),
            custom_judges=(str(COMPREHENSIVENESS),),
        ).spec()
        config = dataclasses.replace(stage_config(), judges=judges)
        result = run_to_files(records, tmp_path, config)
        schemas = {r.body["response_format"]["json_schema"]["name"]
                   for r in server.requests if r.body}
    assert schemas == {"judge_score"}  # a graded judge asks for a score, not yes/no

    series = {"judge": "comprehensiveness", "version": "v1f2", "app": "faq", "model": "m1"}
    assert result.counts[counting.key(counting.SCORE_COUNT, **series)] == 5
    assert result.counts[counting.key(counting.SCORE_SUM_MILLI, **series)] == 9000
    yes = counting.key(counting.VERDICTS, rating="yes", **series)
    no = counting.key(counting.VERDICTS, rating="no", **series)
    assert (result.counts[yes], result.counts[no]) == (3, 2)  # pass score 2: 3, 2, 3 pass

    (window,) = [orjson.loads(r) for r in (tmp_path / "windows.jsonl").read_bytes().splitlines()]
    assert (window["scored"], window["score_mean"], window["percentage"]) == (5, 1.8, 0.6)
    rows = [orjson.loads(r) for r in (tmp_path / "verdicts.jsonl").read_bytes().splitlines()]
    assert sorted(r["response/llm_judged/comprehensiveness/score"] for r in rows) == [
        0.0, 1.0, 2.0, 3.0, 3.0
    ]

    prom = tmp_path / "metrics.prom"
    write_textfile(prom, MetricsSnapshot(result.counts, result.windows))
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(prom.read_text()) for s in f.samples}
    labels = tuple(sorted(series.items()))
    assert samples[("ragpulse_judge_score_sum", labels)] == 9.0
    assert samples[("ragpulse_judge_score_count", labels)] == 5
    assert samples[("ragpulse_judge_score_mean", labels)] == 1.8
    assert samples[("ragpulse_judge_pass_ratio", labels)] == 0.6
