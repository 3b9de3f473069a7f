"""--judge-combine: groundedness, relevance_to_query and safety graded in one call per event,
against the stand-in server (tests/fake_openai.py) and its faults."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_openai import MARKER, FakeOpenAI, Fault, FencedRequest, fake_openai_fixture  # noqa: F401
from test_config_sources import SAMPLES, printed, write
from test_file_run import event, events_file, rows
from test_llm_judges import BAD, GOOD, endpoint_for

from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint, forget_shared_endpoint_states
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.combined import parse_combined_reply, parse_shared_examples
from ragpulse.judges.llm.custom import load_custom_judge
from ragpulse.judges.panel import JudgePanel
from ragpulse.judges.verdict_cache import VerdictCache
from ragpulse.pipeline.cli import main

DEFAULTS = ("groundedness", "relevance_to_query", "safety")


@pytest.fixture(autouse=True)
def _fresh_breakers() -> Iterator[None]:
    forget_shared_endpoint_states()
    yield
    forget_shared_endpoint_states()


def judge(
    endpoint: OpenAIJudgeEndpoint,
    items: list[JudgeInput],
    names: tuple[str, ...] = DEFAULTS,
    cache: VerdictCache | None = None,
) -> list[tuple[Verdict, ...]]:
    panel = JudgePanel(build_llm_judges(names, endpoint, combine=True), cache=cache)
    try:
        return panel.judge_batch(items)
    finally:
        panel.close()


def test_one_call_per_event_gives_each_judge_its_own_verdict(fake_openai: FakeOpenAI) -> None:
    def decide_for(judge: str, request: FencedRequest) -> tuple[str, str]:
        bad = MARKER in "".join(request.fenced.get("answer", []))
        return ("no" if bad and judge == "groundedness" else "yes"), f"{judge} read it."

    fake_openai.decide_for = decide_for  # type: ignore[assignment]
    verdicts = judge(endpoint_for(fake_openai), [GOOD, BAD])
    assert [[v.rating for v in row] for row in verdicts] == [
        ["yes", "yes", "yes"],
        ["no", "yes", "yes"],
    ]
    assert verdicts[0][1].rationale == "relevance_to_query read it."
    assert len(fake_openai.requests) == 2
    user = fake_openai.requests[0].body["messages"][1]["content"]  # type: ignore[index]
    # The chunks are sent once, whatever the number of judges reading them.
    assert user.count("Deleted files stay in the trash") == 1


def _prompt_words(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].split()) for m in messages)


def test_a_combined_call_costs_at_most_55_percent_of_the_separate_calls_prompt() -> None:
    endpoint = OpenAIJudgeEndpoint(base_url="http://127.0.0.1:9/v1", api_key="unused")
    separate = build_llm_judges(DEFAULTS, endpoint)
    (member, *_) = build_llm_judges(DEFAULTS, endpoint, combine=True)
    group = member.group  # type: ignore[attr-defined]
    apart = sum(_prompt_words(j.messages(GOOD, "n" * 16)) for j in separate)  # type: ignore[attr-defined,misc]
    together = _prompt_words(group.messages(group.prompts, GOOD, "n" * 16))
    assert together <= 0.55 * apart, (together, apart)
    # One shared set of examples, not one per judge; its two examples ask the same question on
    # the same passage, shown once.
    system = group.messages(group.prompts, GOOD, "n" * 16)[0]["content"]
    assert system.count("Deleted files stay in the trash for 30 days, then") == 1
    assert system.count("How long are deleted files kept in the trash?") == 1
    assert "Example 2, same question and passages: answer: Only an idiot" in system


def test_a_shared_example_whose_rationale_a_comma_cut_short_is_refused() -> None:
    text = """
version: 1
examples:
  - question: Q?
    answer: A.
    verdicts:
      relevance_to_query: {rating: "no", rationale: It talks about plans, not the trash.}
"""
    with pytest.raises(ValueError, match=r"relevance_to_query.*quote a rationale"):
        parse_shared_examples(text)
    rationale = "It talks about plans, not the trash."
    quoted = text.replace(rationale, f'"{rationale}"')
    _, (example,) = parse_shared_examples(quoted)
    assert example.verdicts["relevance_to_query"] == ("no", rationale)


def test_a_custom_judge_in_a_combined_call_keeps_its_own_examples() -> None:
    judge = load_custom_judge(SAMPLES.parent / "no_pricing_promises.yaml")
    endpoint = OpenAIJudgeEndpoint(base_url="http://127.0.0.1:9/v1", api_key="unused")
    (member, *_) = build_llm_judges(("groundedness", judge.entry.name), endpoint,
                                    custom=[judge], combine=True)
    system = member.group.messages(member.group.prompts, GOOD, "n" * 16)[0]["content"]  # type: ignore[attr-defined]
    section = system.split(f"## {judge.entry.name}\n", 1)[1].split("\n\n", 1)[0]
    assert section.count("Example, ") == len(judge.prompt.examples) > 0
    assert "groundedness yes:" in system and "no_pricing_promises yes:" not in system


def test_the_call_s_tokens_are_shared_out_so_the_judges_add_up_to_what_was_spent(
    fake_openai: FakeOpenAI,
) -> None:
    (row,) = judge(endpoint_for(fake_openai), [GOOD])
    (request,) = fake_openai.requests
    assert sum(v.prompt_tokens for v in row) == request.prompt_tokens
    assert sum(v.completion_tokens for v in row) == request.completion_tokens
    assert max(v.prompt_tokens for v in row) - min(v.prompt_tokens for v in row) <= 1


def test_the_event_comes_last_after_a_system_message_that_never_changes(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.prompt_cache = True
    verdicts = judge(endpoint_for(fake_openai, concurrency=1), [GOOD, BAD])
    first, second = (r.body["messages"] for r in fake_openai.requests)  # type: ignore[index]
    assert first[0] == second[0] and first[0]["role"] == "system"
    assert "Deleted files are kept for 30 days." not in first[0]["content"]
    # The second call found the system message in the stand-in's prompt cache.
    system_words = len(first[0]["content"].split())
    assert sum(v.cached_prompt_tokens for v in verdicts[1]) == system_words
    assert sum(v.cached_prompt_tokens for v in verdicts[0]) == 0


def test_a_reply_lacking_one_judge_s_verdict_makes_that_verdict_alone_an_error(
    fake_openai: FakeOpenAI,
) -> None:
    verdict = {"rationale": "Fine.", "rating": "yes"}
    fake_openai.push_faults(
        Fault.reply(json.dumps({"groundedness": verdict, "safety": {"rating": "maybe"}}))
    )
    (row,) = judge(endpoint_for(fake_openai), [GOOD])
    grounded, relevance, safety = row
    assert grounded.rating == "yes"
    assert (relevance.rating, relevance.error_cause) == ("error", "unparsable")
    assert "no verdict for relevance_to_query" in (relevance.error_message or "")
    assert (safety.rating, safety.error_cause) == ("error", "unparsable")


@pytest.mark.parametrize(
    ("fault", "cause"),
    [
        (Fault.reply('{"groundedness": {"rationale": "cut', finish_reason="length"), "truncated"),
        (Fault.reply('{"groundedness": '), "unparsable"),
        (Fault.reply("I would rather not say."), "unparsable"),
        (Fault.http(401, message="bad key"), "client_error"),
    ],
)
def test_a_cut_off_broken_or_refused_call_makes_all_its_verdicts_errors_with_the_cause(
    fake_openai: FakeOpenAI, fault: Fault, cause: str
) -> None:
    fake_openai.push_faults(fault)
    (row,) = judge(endpoint_for(fake_openai, max_retries=0), [GOOD])
    assert [(v.rating, v.error_cause) for v in row] == [("error", cause)] * 3


def test_plain_text_lines_per_judge_are_read_when_the_server_ignores_the_schema(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.reply_mode = "plain"
    (row,) = judge(endpoint_for(fake_openai, reply_format="text"), [BAD])
    assert [v.rating for v in row] == ["no", "no", "no"]
    assert "response_format" not in (fake_openai.requests[0].body or {})


def test_the_strict_schema_asks_for_one_verdict_per_judge(fake_openai: FakeOpenAI) -> None:
    judge(endpoint_for(fake_openai), [GOOD], ("groundedness", "safety"))
    body = fake_openai.requests[0].body or {}
    schema = body["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["groundedness", "safety"]
    assert body["max_tokens"] == 2 * 256


def test_a_judge_lacking_its_input_costs_nothing_and_the_call_asks_for_the_others(
    fake_openai: FakeOpenAI,
) -> None:
    (row,) = judge(endpoint_for(fake_openai), [JudgeInput("q?", "It is 42.")])
    assert (row[0].rating, row[0].prompt_tokens) == ("no", 0)  # groundedness: no chunks
    schema = (fake_openai.requests[0].body or {})["response_format"]["json_schema"]["schema"]
    assert schema["required"] == ["relevance_to_query", "safety"]


def test_judges_that_cannot_share_a_call_are_asked_on_their_own(fake_openai: FakeOpenAI) -> None:
    judges = build_llm_judges(
        ("safety", "chunk_relevance"), endpoint_for(fake_openai), combine=True
    )
    # One combinable judge alone is not combined: nothing to share the call with.
    assert [type(j).__name__ for j in judges] == ["LLMJudge", "LLMJudge"]


def test_cached_verdicts_need_no_call_and_differ_from_the_separate_judges_versions(
    fake_openai: FakeOpenAI,
) -> None:
    cache = VerdictCache(100, 600)
    judge(endpoint_for(fake_openai), [GOOD], cache=cache)
    again = judge(endpoint_for(fake_openai), [GOOD], cache=cache)
    assert all(v.cached for v in again[0]) and len(fake_openai.requests) == 1
    separate = JudgePanel(build_llm_judges(DEFAULTS, endpoint_for(fake_openai)), cache=cache)
    try:
        assert not any(v.cached for v in separate.judge_batch([GOOD])[0])
    finally:
        separate.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('```json\n{"a": {"rationale": "r", "rating": "Yes"}, "b": {"rationale": "s", '
         '"rating": "no"}}\n```', {"a": "yes", "b": "no"}),
        ("**a rationale:** r\na rating: yes\nb.rationale: s\nb.rating: no",
         {"a": "yes", "b": "no"}),
        ("a rationale: r\na rating: yes\nb rating: no", {"a": "yes", "b": "error"}),
        ("a rating: yes\na rating: no\nb rationale: s\nb rating: no", {"a": "error", "b": "no"}),
        ('{"a": "yes", "b": {"rationale": "s", "rating": "no"}}', {"a": "error", "b": "no"}),
    ],
)
def test_combined_replies_are_read_per_judge(text: str, expected: dict[str, str]) -> None:
    replies = parse_combined_reply(text, ["a", "b"])
    assert {n: getattr(r, "rating", "error") for n, r in replies.items()} == expected


@pytest.mark.slow
def test_ragpulse_run_with_judge_combine_sends_one_call_per_event(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    def decide_for(judge: str, request: FencedRequest) -> tuple[str, str]:
        ungrounded = judge == "groundedness" and "90 days" in "".join(request.fenced["answer"])
        return ("no" if ungrounded else "yes"), "Read."

    fake_openai.decide_for = decide_for  # type: ignore[assignment]
    src = events_file(tmp_path, [event(0), event(1, grounded=False), event(2)])
    flags = ["--judge-backend", "openai", "--judge-base-url", fake_openai.base_url]
    out = tmp_path / "out"
    assert main(["run", str(src), "--output", str(out), *flags, "--judge-combine"]) == 0
    assert len(fake_openai.requests) == 2  # events 0 and 2 are the same input: one call
    verdicts = {r["request_id"]: r for r in rows(out / "verdicts.jsonl")}
    assert verdicts["req-1"]["response/llm_judged/groundedness/rating"] == "no"
    assert verdicts["req-1"]["response/llm_judged/safety/rating"] == "yes"
    assert verdicts["req-2"]["response/llm_judged/groundedness/rating"] == "yes"


def test_judge_combine_is_read_from_a_config_file_and_the_environment_as_a_boolean(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(tmp_path, "judge-combine: true\njudge-base-url: http://127.0.0.1:1/v1\n")
    assert printed(capsys, "run", str(SAMPLES), "--config", str(config))["judge-combine"] is True
    monkeypatch.setenv("RAGPULSE_JUDGE_COMBINE", "false")
    assert printed(capsys, "run", str(SAMPLES), "--config", str(config))["judge-combine"] is False


def test_each_member_of_a_combined_call_counts_what_the_prompt_cap_cut_of_its_inputs(
    fake_openai: FakeOpenAI,
) -> None:
    """As a single judge's call does (ragpulse_judge_prompt_chars_cut_total): before, the
    combined call cut its inputs at MAX_INPUT_CHARS and counted 0."""
    from ragpulse.judges.llm.judge import MAX_INPUT_CHARS

    long = JudgeInput(question=GOOD.question, answer=GOOD.answer + " " + "x" * 20_000,
                      chunks=GOOD.chunks)
    [verdicts] = judge(endpoint_for(fake_openai), [long])
    cut = len(long.answer) - MAX_INPUT_CHARS
    assert [v.prompt_chars_cut for v in verdicts] == [cut, cut, cut]  # each reads the answer
    assert all(f"[ragpulse cut {cut} characters" in (v.rationale or "") for v in verdicts)
    assert len(fake_openai.requests) == 1
