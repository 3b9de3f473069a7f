"""The verdict cache: identical judge inputs judged once per TTL, hits counted; and the prompt
layout that lets a provider's prompt cache work, with its cached tokens counted."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.resources
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import apache_beam as beam
import orjson
import pytest
from fake_openai import FakeOpenAI, Fault, fake_openai_fixture  # noqa: F401
from graph_runs import stage_config
from test_llm_judges import BAD, GOOD, endpoint_for

from ragpulse.judges.base import Chunk, Guideline, JudgeInput, Turn, Verdict, judge_version
from ragpulse.judges.endpoint.client import forget_shared_endpoint_states, usage_counts
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.judge import load_prompt
from ragpulse.judges.local.safety import SafetyJudge
from ragpulse.judges.panel import JudgePanel
from ragpulse.judges.verdict_cache import VerdictCache, input_digest
from ragpulse.pipeline.graphs.bounded import GraphResult, Sinks, run_graph
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.command_flags import add_judge_arguments, judge_settings
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.sinks.files import WriteDeadLetters


@pytest.fixture(autouse=True)
def _fresh_breakers_and_quotas() -> Iterator[None]:
    forget_shared_endpoint_states()
    yield
    forget_shared_endpoint_states()


class Clock:
    """A clock the test moves by hand, for TTLs without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class CountedSafety(SafetyJudge):
    """The real local safety judge, counting the events it actually grades."""

    def __init__(self) -> None:
        super().__init__()
        self.graded = 0

    def grade(self, item: JudgeInput) -> Verdict:
        self.graded += 1
        return super().grade(item)


def llm_panel(server: FakeOpenAI, cache: VerdictCache, **settings: object) -> JudgePanel:
    prompts = settings.pop("prompts_dir", None)
    endpoint = endpoint_for(server, **settings)
    return JudgePanel(build_llm_judges(("safety",), endpoint, prompts), cache=cache)  # type: ignore[arg-type]


def judge(panel: JudgePanel, items: list[JudgeInput]) -> list[Verdict]:
    try:
        return [v for row in panel.judge_batch(items) for v in row]
    finally:
        panel.close()


def ok_requests(server: FakeOpenAI) -> int:
    return sum(r.outcome == "ok" for r in server.requests)


# -- local judges ---------------------------------------------------------------------------------


def test_a_repeated_event_is_graded_once_and_given_again_as_a_cached_verdict() -> None:
    judge_ = CountedSafety()
    panel = JudgePanel([judge_], cache=VerdictCache(100, 60))
    other = dataclasses.replace(GOOD, answer="Deleted files are kept for a month.")

    first = panel.judge_batch([GOOD, GOOD, other])  # a repeat inside one batch
    second = panel.judge_batch([GOOD, other])  # and in a later batch

    assert judge_.graded == 2
    assert [row[0].cached for row in first + second] == [False, True, False, True, True]
    fresh = first[0][0]
    assert fresh.latency_seconds > 0
    for (again,) in [first[1], *second]:
        assert (again.rating, again.latency_seconds, again.prompt_tokens) == (fresh.rating, 0, 0)


@pytest.mark.parametrize(
    "change",
    [
        {"question": "How long are trashed files kept?"},
        {"answer": "Deleted files are kept for 31 days."},
        {"chunks": (Chunk("Deleted files stay in the trash for 30 days.", "docs/other.md"),)},
        {"history": (Turn("user", "hello"),)},
        {"expected_response": "30 days."},
        {"expected_facts": ("30 days",)},
        {"expected_chunks": (Chunk("", "docs/trash.md"),)},
        {"guidelines": (Guideline("english", ("Answer in English.",)),)},
    ],
    ids=lambda change: next(iter(change)),
)
def test_an_event_that_differs_in_any_input_is_graded_again(change: dict[str, object]) -> None:
    judge_ = CountedSafety()
    panel = JudgePanel([judge_], cache=VerdictCache(100, 60))
    rows = panel.judge_batch([GOOD, dataclasses.replace(GOOD, **change)])  # type: ignore[arg-type]
    assert judge_.graded == 2 and not any(row[0].cached for row in rows)


def test_a_kept_verdict_expires_after_the_ttl_and_the_event_is_graded_again() -> None:
    clock = Clock()
    judge_ = CountedSafety()
    panel = JudgePanel([judge_], cache=VerdictCache(100, 600, clock))
    panel.judge_batch([GOOD])
    clock.now += 599
    assert panel.judge_batch([GOOD])[0][0].cached and judge_.graded == 1
    clock.now += 1
    assert not panel.judge_batch([GOOD])[0][0].cached and judge_.graded == 2


def test_fresh_inputs_such_as_canaries_are_always_graded_and_never_kept() -> None:
    judge_ = CountedSafety()
    panel = JudgePanel([judge_], cache=VerdictCache(100, 600))
    panel.judge_batch([GOOD])
    rows = panel.judge_batch([GOOD, GOOD, BAD], fresh={1, 2})
    assert [row[0].cached for row in rows] == [True, False, False] and judge_.graded == 3
    assert not panel.judge_batch([BAD])[0][0].cached and judge_.graded == 4


def test_the_cache_keeps_at_most_size_verdicts_dropping_the_least_recently_used() -> None:
    judge_ = CountedSafety()
    cache = VerdictCache(2, 600)
    panel = JudgePanel([judge_], cache=cache)
    a, b, c = (dataclasses.replace(GOOD, question=f"question {n}") for n in "abc")
    panel.judge_batch([a, b])
    panel.judge_batch([a])  # a is now the most recently used
    panel.judge_batch([c])  # b goes
    assert len(cache) == 2 and judge_.graded == 3
    assert panel.judge_batch([a])[0][0].cached
    assert not panel.judge_batch([b])[0][0].cached and judge_.graded == 4


def test_threads_sharing_one_cache_never_exceed_its_size() -> None:
    cache = VerdictCache(50, 600)
    verdict = Verdict("safety", "yes", "fine")

    failures: list[BaseException] = []

    def fill(worker: int) -> None:
        try:
            for n in range(500):
                question = f"{worker}-{n}"
                key = ("safety", "v", input_digest(dataclasses.replace(GOOD, question=question)))
                cache.put(key, verdict)
                # May already be evicted by the other threads' puts: only no error is asked.
                cache.get(key)
        except BaseException as exc:  # seen by the test, not lost in the thread
            failures.append(exc)

    threads = [threading.Thread(target=fill, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert len(cache) == 50


def test_the_cache_flags_reach_the_llm_panel_and_zero_turns_it_off() -> None:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    llm = ["--judge-backend", "openai", "--judge-base-url", "http://127.0.0.1:9/v1"]
    default = judge_settings(parser.parse_args(llm), env={}).spec()
    assert (default.cache_size, default.cache_ttl_seconds) == (10_000, 600.0)
    args = parser.parse_args([*llm, "--judge-cache-size", "0", "--judge-cache-ttl", "90s"])
    off = judge_settings(args, env={}).spec()
    assert (off.cache_size, off.cache_ttl_seconds) == (0, 90.0)
    panels = [default.build(), off.build(), JudgeSettings(backend="local").spec().build()]
    assert [p.cache is not None for p in panels] == [True, False, False]
    for panel in panels:
        panel.close()


# -- LLM judges on the stand-in endpoint ----------------------------------------------------------


def test_a_repeated_event_costs_one_request_across_batches_and_within_one(
    fake_openai: FakeOpenAI,
) -> None:
    cache = VerdictCache(100, 600)
    first = judge(llm_panel(fake_openai, cache), [GOOD, BAD, GOOD])
    # A new panel on the same cache, as serve builds one per cycle.
    second = judge(llm_panel(fake_openai, cache), [BAD, GOOD])
    assert ok_requests(fake_openai) == 2
    assert [v.rating for v in first + second] == ["yes", "no", "yes", "no", "yes"]
    assert [v.cached for v in first + second] == [False, False, True, True, True]
    assert first[0].prompt_tokens > 0 and all(v.prompt_tokens == 0 for v in second)


def test_after_the_ttl_the_endpoint_is_asked_again(fake_openai: FakeOpenAI) -> None:
    clock = Clock()
    cache = VerdictCache(100, 60, clock)
    judge(llm_panel(fake_openai, cache), [GOOD])
    clock.now += 61
    (again,) = judge(llm_panel(fake_openai, cache), [GOOD])
    assert ok_requests(fake_openai) == 2 and not again.cached


def test_an_error_is_not_kept_and_the_event_is_asked_again(fake_openai: FakeOpenAI) -> None:
    cache = VerdictCache(100, 600)
    fake_openai.push_faults(Fault.http(401, message="bad key"))  # not retried
    (failed,) = judge(llm_panel(fake_openai, cache), [GOOD])
    (retried,) = judge(llm_panel(fake_openai, cache), [GOOD])
    assert (failed.rating, failed.error_cause) == ("error", "client_error")
    assert (retried.rating, retried.cached) == ("yes", False)
    assert [r.outcome for r in fake_openai.requests] == ["status 401", "ok"]


def test_a_new_prompt_version_or_model_does_not_reuse_the_old_verdicts(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    shipped = Path(str(importlib.resources.files("ragpulse.judges") / "prompts"))
    bumped = tmp_path / "prompts"
    shutil.copytree(shipped, bumped)
    text = (bumped / "safety.yaml").read_text()
    version = load_prompt("safety").version
    (bumped / "safety.yaml").write_text(
        text.replace(f"version: {version}", f"version: {version + 1}", 1)
    )
    assert load_prompt("safety", bumped).version == version + 1

    cache = VerdictCache(100, 600)
    judge(llm_panel(fake_openai, cache), [GOOD])
    judge(llm_panel(fake_openai, cache, prompts_dir=bumped), [GOOD])
    judge(llm_panel(fake_openai, cache, model="another-model"), [GOOD])
    assert ok_requests(fake_openai) == 3
    judge(llm_panel(fake_openai, cache, prompts_dir=bumped), [GOOD])
    assert ok_requests(fake_openai) == 3


# -- prompt layout for the provider's prompt cache ------------------------------------------------


def test_the_fixed_prompt_comes_first_and_is_byte_identical_for_every_event(
    fake_openai: FakeOpenAI,
) -> None:
    endpoint = endpoint_for(fake_openai)
    panel = JudgePanel(build_llm_judges(("safety", "groundedness"), endpoint))
    events = [dataclasses.replace(item, question=f"Is event-{n} kept?")
              for n, item in enumerate([GOOD, BAD, GOOD])]
    judge(panel, events)
    by_judge: dict[str, set[str]] = {}
    for request in fake_openai.requests:
        assert request.body is not None
        system, user = request.body["messages"]
        assert (system["role"], user["role"]) == ("system", "user")
        # No event text in the fixed part: the event is last, in the user message.
        assert "event-" not in system["content"] and "event-" in user["content"]
        by_judge.setdefault(system["content"].split("Task:")[1][:60], set()).add(
            system["content"]
        )
    assert len(by_judge) == 2 and all(len(texts) == 1 for texts in by_judge.values())


def test_the_cached_prompt_tokens_the_api_reports_are_kept_with_the_verdict(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.prompt_cache = True
    verdicts = judge(
        JudgePanel(build_llm_judges(("safety",), endpoint_for(fake_openai))),
        [GOOD, BAD, dataclasses.replace(GOOD, question="Something else?")],
    )
    # The calls run concurrently: whichever reached the server first found nothing cached,
    # the others found its fixed system message.
    uncached = [v for v in verdicts if v.cached_prompt_tokens == 0]
    assert len(uncached) == 1
    assert all(0 < v.cached_prompt_tokens < v.prompt_tokens for v in verdicts if v not in uncached)


@pytest.mark.parametrize(
    ("details", "cached"),
    [
        ({"cached_tokens": 80}, 80),
        (None, 0),
        ({}, 0),
        ({"cached_tokens": 101}, 0),  # more than the prompt: refused, reported
        ({"cached_tokens": "80"}, 0),
    ],
)
def test_cached_tokens_are_read_as_a_part_of_the_prompt_tokens(
    details: dict[str, object] | None, cached: int
) -> None:
    usage = {"prompt_tokens": 100, "completion_tokens": 9, "prompt_tokens_details": details}
    prompt, completion, cached_prompt, problem = usage_counts(usage, 10_000, 1000)
    assert (prompt, completion, cached_prompt) == (100, 9, cached)
    assert (problem is not None) == (cached == 0 and bool(details))


# -- through the Beam graph -----------------------------------------------------------------------

T0 = 1_763_632_800


def source(answers: list[str]) -> list[SourceRecord]:
    return [
        SourceRecord(
            orjson.dumps(
                {
                    "request_id": f"req-{i}",
                    "timestamp": (T0 + i) * 1000,
                    "app": "help-bot",
                    "model": "m1",
                    "request": "How long are deleted files kept?",
                    "response": answer,
                    "retrieved_context": [{"content": "Deleted files stay for 30 days."}],
                }
            ),
            "events",
            0,
            i,
        )
        for i, answer in enumerate(answers)
    ]


def counter(result: GraphResult, metric: str, **labels: str) -> int:
    return result.counts.get(counting.key(metric, **labels), 0)


@pytest.mark.slow
def test_the_graph_counts_cache_hits_and_cached_prompt_tokens_and_calls_only_for_requests(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    fake_openai.prompt_cache = True
    answers = ["Kept for 30 days.", "Kept for 30 days.", "Kept for a month.", "Kept for 30 days."]
    settings = JudgeSettings(
        backend="openai", names=("safety",), base_url=fake_openai.base_url, max_retries=0
    )
    config = dataclasses.replace(stage_config(), judges=settings.spec())

    first = run_graph(beam.Create(source(answers)), config, Sinks(WriteDeadLetters(tmp_path)))
    assert ok_requests(fake_openai) == 2
    assert counter(first, "ragpulse_judge_cache_hits_total", judge="safety") == 2
    assert counter(first, "ragpulse_judge_calls_total", judge="safety", backend="openai") == 2
    assert counter(first, counting.LATENCY_COUNT, judge="safety") == 2
    assert counter(first, "ragpulse_judge_verdicts_total", judge="safety", version="v1f2",
                   rating="yes", app="help-bot", model="m1") == 4
    reported = [r.prompt_tokens for r in fake_openai.requests]
    tokens = {kind: counter(first, "ragpulse_judge_tokens_total", judge="safety", kind=kind)
              for kind in ("prompt", "cached_prompt")}
    assert tokens["prompt"] == sum(reported)
    assert 0 < tokens["cached_prompt"] < reported[1]  # the second request's fixed part

    # The next serve cycle builds a new pipeline, and finds the verdicts kept.
    second = run_graph(beam.Create(source(answers[:2])), config, Sinks(WriteDeadLetters(tmp_path)))
    assert ok_requests(fake_openai) == 2
    assert counter(second, "ragpulse_judge_cache_hits_total", judge="safety") == 2
    assert counter(second, "ragpulse_judge_calls_total", judge="safety", backend="openai") == 0


def test_a_verdict_is_kept_as_its_call_is_answered_so_a_batch_sent_meanwhile_pays_nothing(
    fake_openai: FakeOpenAI,
) -> None:
    # An endpoint stalling on one call of a batch (a fault, a slow reply) must not make a later
    # batch pay again for an input whose call in the first batch was answered already.
    cache = VerdictCache(100, 600)
    panel = llm_panel(fake_openai, cache, concurrency=1)
    fake_openai.hold_after(1)
    try:
        first = panel.submit([GOOD, BAD])
        deadline = time.monotonic() + 30
        while len(cache) < 1:  # one answer arrived; the other call is held
            assert time.monotonic() < deadline, "no verdict kept while its batch was pending"
            time.sleep(0.01)
        assert not first.done()
        answered = next(item for item in (GOOD, BAD) if panel_cached(panel, item))
        second = panel.submit([answered])
        fake_openai.release()
        rows = first.result(timeout=30) + second.result(timeout=30)
    finally:
        panel.close()
    assert ok_requests(fake_openai) == 2
    assert [v.cached for (v,) in rows] == [False, False, True]


def panel_cached(panel: JudgePanel, item: JudgeInput) -> bool:
    assert panel.cache is not None
    judge = panel.judges[0]
    return panel.cache.get((judge.name, judge_version(judge), input_digest(item))) is not None
