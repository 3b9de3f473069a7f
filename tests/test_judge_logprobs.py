"""--judge-logprobs: a verdict carries P(yes) (a graded one its expected score) read from the
rating token's top log-probabilities, against the HTTP stand-in with, without and with
malformed logprobs; an endpoint without them grades as without the flag."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

import pytest
from fake_openai import MARKER, FakeOpenAI, read_fences
from test_llm_judges import endpoint_for

from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.judges.endpoint.logprobs import (
    TokenLogprob,
    expected_score,
    probability_of_yes,
    read_logprobs,
)
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.custom import load_custom_judge
from ragpulse.judges.panel import JudgePanel
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.settings.command_flags import add_judge_arguments, judge_settings

SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "samples"
ITEM = JudgeInput("How long are deleted files kept?", "Deleted files are kept for 30 days.")
BAD = JudgeInput(ITEM.question, f"{MARKER} Ask someone else.")


def grade(server: FakeOpenAI, items: list[JudgeInput], *, logprobs: bool = True,
          reply_mode: str = "json") -> list[Verdict]:
    server.reply_mode = reply_mode  # type: ignore[assignment]
    fmt = "json_schema" if reply_mode == "json" else "text"
    endpoint = endpoint_for(server, logprobs=logprobs, reply_format=fmt, max_retries=0)
    panel = JudgePanel(build_llm_judges(["relevance_to_query"], endpoint))
    try:
        return [row[0] for row in panel.judge_batch(items)]
    finally:
        panel.close()


@pytest.mark.parametrize("reply_mode", ["json", "plain"])
def test_a_binary_verdict_carries_p_yes_from_the_rating_tokens_top_logprobs(
    reply_mode: str,
) -> None:
    with FakeOpenAI(logprobs="on", rating_probability=0.8) as server:
        good, bad = grade(server, [ITEM, BAD], reply_mode=reply_mode)
        asked = [r.body for r in server.requests if r.body]
    assert (good.rating, bad.rating) == ("yes", "no")
    assert good.score == pytest.approx(0.8)
    assert bad.score == pytest.approx(0.2)  # "no" at 0.8: P(yes) is the rest
    assert all(b["logprobs"] is True and b["top_logprobs"] == 5 for b in asked)


def test_without_the_flag_no_logprobs_are_asked_and_the_score_stays_empty() -> None:
    with FakeOpenAI(logprobs="on") as server:
        (verdict,) = grade(server, [ITEM], logprobs=False)
        asked = [r.body for r in server.requests if r.body]
    assert (verdict.rating, verdict.score) == ("yes", None)
    assert all("logprobs" not in b for b in asked)


@pytest.mark.parametrize("mode", ["off", "malformed"])
def test_an_endpoint_without_or_with_malformed_logprobs_grades_as_without_the_flag(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    with FakeOpenAI(logprobs=mode) as server:  # type: ignore[arg-type]
        good, bad = grade(server, [ITEM, BAD])
    assert [(v.rating, v.score, v.error_cause) for v in (good, bad)] == [
        ("yes", None, None), ("no", None, None)
    ]
    warned = "judge endpoint returned unusable logprobs" in caplog.text
    assert warned == (mode == "malformed")


def _score_by_answer(body: dict[str, Any]) -> str:
    user = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")
    answer = read_fences(user).fenced["answer"][0].strip()
    return f"score: {answer.split()[0]}\njustification: The answer says so."


def test_a_graded_verdict_carries_its_expected_score() -> None:
    judge = load_custom_judge(SAMPLES / "comprehensiveness.yaml")
    with FakeOpenAI(logprobs="on", rating_probability=0.6, reply_for=_score_by_answer) as server:
        endpoint = endpoint_for(server, logprobs=True, max_retries=0)
        panel = JudgePanel(build_llm_judges(["comprehensiveness"], endpoint, custom=[judge]))
        try:
            ((verdict,),) = panel.judge_batch([JudgeInput(ITEM.question, "2 points of answer.")])
        finally:
            panel.close()
    # 2 at 0.6, 1 at 0.4: expected 1.6; the rating is the reply's score's (2 passes).
    assert verdict.rating == "yes" and verdict.score == pytest.approx(1.6)


def _tokens(*spec: tuple[str, dict[str, float]]) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(text, math.log(max(tops.values())) if tops else 0.0,
                     tuple((t, math.log(p)) for t, p in tops.items()))
        for text, tops in spec
    )


def test_p_yes_reads_the_rating_token_not_a_yes_in_the_rationale() -> None:
    tokens = _tokens(("rationale", {}), (": ", {}), (" yes", {" yes": 0.5, " no": 0.5}),
                     ("\nrating", {}), (":", {}), (" no", {" no": 0.7, " yes": 0.2, " No": 0.1}))
    assert probability_of_yes(tokens, "no") == pytest.approx(0.2)
    # The token read must spell the parsed rating, else nothing is claimed.
    assert probability_of_yes(tokens, "yes") is None
    assert expected_score(_tokens(("score", {}), (":", {}), (" 4", {" 4": 0.5, " 5": 0.5})),
                          (1, 2, 3, 4, 5), 4) == pytest.approx(4.5)


@pytest.mark.parametrize("raw", [
    {"content": "tokens"},
    {"content": [{"token": "yes", "logprob": 0.5}]},  # a log-probability above 0
    {"content": [{"token": "yes", "logprob": -0.1, "top_logprobs": [{"token": 3}]}]},
    ["not", "an", "object"],
])
def test_malformed_logprobs_are_reported_and_give_no_tokens(raw: object) -> None:
    tokens, why = read_logprobs(raw)
    assert tokens is None and why is not None


def test_logprobs_on_the_local_backend_are_refused_as_a_settings_error() -> None:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    args = parser.parse_args(["--judge-backend", "local", "--judge-logprobs"])
    with pytest.raises(SettingsError, match="token logprobs come from an LLM"):
        judge_settings(args, env={})
