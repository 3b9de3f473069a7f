"""Ensembles (--ensemble): one judge graded by several models with a majority vote, and the
members' agreement counted (stand-in LLM server answering per model; real Beam graph)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from fake_openai import FakeOpenAI, read_fences
from graph_runs import run_to_files, stage_config

from ragpulse.judges.base import Verdict
from ragpulse.judges.llm.ensemble import parse_ensemble, vote
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.models import JudgeSettings

MODELS = ("m0", "m1", "m2")


@pytest.mark.parametrize(("flag", "says"), [
    ("safety=a,b", "odd number of members, at least 3"),
    ("safety=4", "odd number of members, at least 3"),
    ("safety", "is not JUDGE=MODEL"),
    ("safety=a,b c,d", "is not a model name"),
])
def test_a_malformed_ensemble_is_refused_in_one_line(flag: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_ensemble(flag)


def test_an_ensemble_needs_the_openai_backend_and_a_judge_in_use() -> None:
    with pytest.raises(ValueError, match="use it with --judge-backend openai"):
        JudgeSettings(backend="local", names=("safety",), ensembles=("safety=3",))
    with pytest.raises(ValueError, match="judge groundedness is not among --judges"):
        JudgeSettings(backend="openai", base_url="http://127.0.0.1:9/v1", names=("safety",),
                      ensembles=("groundedness=3",))


def test_the_majority_of_a_graded_scale_gives_the_median_score_of_its_members() -> None:
    members = [Verdict("c", "yes", "good", score=3.0), Verdict("c", "yes", "fine", score=2.0),
               Verdict("c", "no", "poor", score=1.0)]
    v = vote("c", members)
    assert (v.rating, v.score, v.votes) == ("yes", 2.0, ("yes", "yes", "no"))


def _per_model(body: dict[str, Any]) -> str:
    """Member i of the ensemble answers the i-th letter of the answer's first word: y(es),
    n(o), or x (prose without a verdict)."""
    user = body["messages"][-1]["content"]
    letters = read_fences(user).fenced["answer"][0].strip().split()[0]
    letter = letters[MODELS.index(body["model"])]
    if letter == "x":
        return "I would rather not say."
    return json.dumps({"rationale": f"{body['model']} says {letter}.",
                       "rating": "yes" if letter == "y" else "no"})


@pytest.mark.slow  # runs a Beam pipeline
def test_an_ensemble_takes_the_majority_of_its_models_and_counts_how_they_agreed(
    tmp_path: Path,
) -> None:
    records = [
        SourceRecord(orjson.dumps({
            "request_id": f"req-{i}", "timestamp": "2025-11-20T10:00:00Z", "app": "faq",
            "model": "bot", "request": "Is it safe?", "response": f"{letters} is the answer.",
        }), "mem", None, i)
        for i, letters in enumerate(("yyy", "yyn", "ynx", "nnx"))
    ]
    with FakeOpenAI(reply_for=_per_model) as server:
        judges = JudgeSettings(
            backend="openai", base_url=server.base_url, names=("safety",), max_retries=0,
            ensembles=(f"safety={','.join(MODELS)}",),
        ).spec()
        config = dataclasses.replace(stage_config(), judges=judges)
        result = run_to_files(records, tmp_path, config)
        asked = sorted(r.body["model"] for r in server.requests if r.body)
    assert asked == sorted(MODELS * 4)  # every member asked about every event

    def by(metric: str, label: str) -> dict[str, float]:
        return {dict(k[1])[label]: v for k, v in result.counts.items() if k[0] == metric}

    assert by(counting.ENSEMBLE_VOTES, "agreement") == {
        "unanimous": 1, "split": 1, "incomplete": 2
    }
    # yyy and yyn pass; nnx fails by 2 of 3 although a member could not grade; ynx has no
    # majority: an error with the member's cause, not a guess.
    assert by(counting.VERDICTS, "rating") == {"yes": 2, "no": 1, "error": 1}
    assert by("ragpulse_judge_errors_total", "cause") == {"unparsable": 1}
    (version,) = {dict(k[1])["version"] for k in result.counts if k[0] == counting.VERDICTS}
    assert version.startswith("v1f2e")  # the members are part of the judge's version
    rows = {r["request_id"]: r for r in map(orjson.loads,
                                             (tmp_path / "verdicts.jsonl").read_bytes()
                                             .splitlines())}
    assert rows["req-1"]["response/llm_judged/safety/rationale"].startswith("2 of 3 members")
