"""The judge cascade (pipeline/costs/cascade.py): local judges on every event, the LLM on a sample
and
on the uncertain ones, through the real graph against the stand-in LLM endpoint."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import apache_beam as beam
import orjson
import pytest
from fake_openai import FakeOpenAI, FakeRating, FencedRequest
from graph_runs import stage_config

from ragpulse.judges.base import Chunk, JudgeInput
from ragpulse.judges.local.groundedness import GroundednessJudge
from ragpulse.judges.local.relevance import RelevanceToQueryJudge
from ragpulse.pipeline.costs.cascade import (
    AGREEMENT,
    UNSURE,
    CascadeSettings,
    _hash_point,
)
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.graphs.bounded import Sinks, run_graph
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.blocks import CASCADE
from ragpulse.pipeline.settings.flags import FlagTable, add_flags, values_of
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.sinks.files import WriteDeadLetters

CHUNK = "The Eiffel Tower in Paris is 330 metres tall and opened in 1889."
# Local groundedness: clearly yes (margin 0.45), clearly no (an unsupported number: margin 1),
# and yes by a hair (3 of 7 content words unsupported, 0.43 against the 0.45 threshold).
ANSWERS = {
    "supported": "The Eiffel Tower in Paris is 330 metres tall.",
    "wrong_number": "The Eiffel Tower in Paris is 512 metres tall.",
    "borderline": "The Eiffel Tower in Paris looks wonderful and beautiful and tall.",
}


def item(answer: str, question: str = "How tall is the Eiffel Tower?") -> JudgeInput:
    return JudgeInput(question=question, answer=answer, chunks=(Chunk(CHUNK, "doc"),))


def test_local_judges_say_how_far_their_rating_is_from_flipping() -> None:
    grounded = GroundednessJudge()
    assert grounded.margin(item(ANSWERS["supported"])) == pytest.approx(0.45)
    assert grounded.margin(item(ANSWERS["wrong_number"])) == 1.0
    assert grounded.margin(item(ANSWERS["borderline"])) == pytest.approx(0.45 - 3 / 7)
    relevance = RelevanceToQueryJudge()
    assert relevance.margin(item("I can't help with that.")) == 1.0
    on_topic = relevance.margin(item("The Eiffel Tower is 330 metres tall."))
    off_topic = relevance.margin(item("Paris has many museums."))
    assert on_topic > 0.5 and off_topic == pytest.approx(0.2)  # no key word: 0 vs 0.2


def llm_decides(request: FencedRequest) -> tuple[FakeRating, str]:
    """The stand-in "LLM": an answer calling the tower wonderful is not grounded; else yes."""
    answer = "\n".join(request.fenced.get("answer", []))
    return ("no", "Embellished.") if "wonderful" in answer else ("yes", "Supported.")


def events(n: int) -> list[SourceRecord]:
    kinds = list(ANSWERS)
    return [
        SourceRecord(orjson.dumps({
            "request_id": f"req-{i}", "request": f"How tall is the Eiffel Tower? Ticket {i}.",
            "response": ANSWERS[kinds[i % 3]],
            "retrieved_context": [{"content": CHUNK, "doc_uri": "doc"}],
            "timestamp": 1_767_225_600_000 + i, "app": "help-bot", "model": "m1",
        }), "events", 0, i)
        for i in range(n)
    ]


@pytest.mark.slow
def test_the_llm_judges_the_sample_and_the_uncertain_events_and_agreement_is_counted(
    tmp_path: Path,
) -> None:
    records = events(90)
    rate = 0.3
    sampled = {r.position for r in records
               if _hash_point(parse_event(r.raw).judge_input) < rate}
    with FakeOpenAI(decide=llm_decides) as server:
        judges = JudgeSettings(backend="openai", names=("groundedness",),
                               base_url=server.base_url, max_retries=0, cache_size=0)
        config = stage_config(judges=judges.spec(), cascade=CascadeSettings(rate, 0.1))
        result = run_graph(beam.Create(records), config, Sinks(WriteDeadLetters(tmp_path)))
        llm_calls = len(server.requests)
    kind = {r.position: list(ANSWERS)[r.position % 3] for r in records}
    borderline = {i for i, k in kind.items() if k == "borderline"}
    # Every borderline event, and the sample of the others, went to the LLM.
    assert llm_calls == len(borderline | sampled)
    assert 10 <= len(sampled - borderline) <= 30

    def verdicts(rating: str) -> int:
        # Labelled with the LLM prompt's version marked as mixed with the local judge's.
        return result.counts[counting.key(counting.VERDICTS, judge="groundedness",
                                          version="v1f2+local", rating=rating, app="help-bot",
                                          model="m1")]

    # The LLM's verdict where it ran (borderline: no; a wrong number it was sent: yes), the
    # local one elsewhere (wrong number: no): one verdict per event.
    wrong_sampled = len({i for i in sampled if kind[i] == "wrong_number"})
    assert verdicts("no") == 30 + 30 - wrong_sampled
    assert verdicts("yes") + verdicts("no") == 90

    def agreement(agree: str, selected: str) -> int:
        return result.counts[counting.key(AGREEMENT, judge="groundedness", agree=agree,
                                          selected=selected)]

    borderline_sampled = len(borderline & sampled)
    assert agreement("false", "uncertain") == 30 - borderline_sampled
    assert agreement("false", "sample") == wrong_sampled + borderline_sampled
    assert agreement("true", "sample") == len({i for i in sampled if kind[i] == "supported"})


@pytest.mark.slow
def test_with_logprobs_llm_verdicts_near_even_odds_are_counted_as_unsure(tmp_path: Path) -> None:
    records = events(12)
    with FakeOpenAI(decide=llm_decides, logprobs="on", rating_probability=0.55) as server:
        judges = JudgeSettings(backend="openai", names=("groundedness",), logprobs=True,
                               base_url=server.base_url, max_retries=0, cache_size=0)
        config = stage_config(judges=judges.spec(), cascade=CascadeSettings(0.0, 0.1))
        result = run_graph(beam.Create(records), config, Sinks(WriteDeadLetters(tmp_path)))
        llm_calls = len(server.requests)
    # Only the borderline answers went (no sample); the LLM gave each P 0.55 on its rating.
    assert llm_calls == 4
    unsure = counting.key(UNSURE, judge="groundedness", selected="uncertain")
    assert result.counts[unsure] == 4


def cascade_flags(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p, FlagTable(None, (CASCADE,)))
    return p.parse_args(list(argv))


def cascade_settings(
    args: argparse.Namespace, names: tuple[str, ...], backend: Literal["local", "openai"]
) -> CascadeSettings | None:
    judges = JudgeSettings(names=names, backend=backend)
    built: CascadeSettings | None = CASCADE.build(
        values_of(CASCADE.flags, args), {"judges": judges}
    )
    return built


def test_a_cascade_needs_the_llm_backend_and_local_versions_of_its_judges() -> None:
    args = cascade_flags("--cascade-llm-sample-rate", "0.1")
    assert cascade_settings(args, ("groundedness",), "openai") == CascadeSettings(0.1, 0.1)
    with pytest.raises(SettingsError, match="needs --judge-backend openai"):
        cascade_settings(args, ("groundedness",), "local")
    with pytest.raises(SettingsError, match=r"no local implementation of judge.*guideline"):
        cascade_settings(args, ("groundedness", "guideline_adherence"), "openai")
    assert cascade_settings(cascade_flags(), ("groundedness",), "local") is None
