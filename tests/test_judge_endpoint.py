"""The judge endpoint on the chatbot's worst day: every fault comes from the stand-in server
(tests/fake_openai.py) over real HTTP, and every call must still end as a verdict, in time."""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from fake_openai import FakeOpenAI, Fault, fake_openai_fixture  # noqa: F401
from pydantic import SecretStr
from test_llm_judges import BAD, GOOD, endpoint_for

from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint, forget_shared_endpoint_states
from ragpulse.judges.endpoint.quota import estimate_tokens
from ragpulse.judges.endpoint.retry import ReplyFormat
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.judge import LLMJudge, load_prompt, new_nonce
from ragpulse.judges.panel import JudgePanel
from ragpulse.pipeline.settings.models import JudgeSettings


@pytest.fixture(autouse=True)
def _fresh_breakers_and_quotas() -> Iterator[None]:
    # Breakers and quotas are process-wide by design; a test must not inherit another's state
    # (the OS may hand out the same port again).
    forget_shared_endpoint_states()
    yield
    forget_shared_endpoint_states()


def judge_batch(
    endpoint: OpenAIJudgeEndpoint,
    items: list[JudgeInput],
    names: tuple[str, ...] = ("safety",),
    deadline: float | None = None,
) -> list[Verdict]:
    """Every verdict of one panel batch, flattened."""
    panel = JudgePanel(build_llm_judges(names, endpoint), deadline)
    try:
        return [v for row in panel.judge_batch(items) for v in row]
    finally:
        panel.close()


# -- 1. malformed replies of any shape -----------------------------------------------------------

MALFORMED = {
    "an HTML page with status 200": (Fault.html(), "not JSON (Content-Type text/html"),
    "choices as a string": (Fault.raw_body({"choices": "yes"}), "choices: Input should be"),
    "message as a string": (
        Fault.raw_body({"choices": [{"message": "rating: yes", "finish_reason": "stop"}]}),
        "choices.0.message: Input should be",
    ),
    "no choices": (Fault.raw_body({"id": "chatcmpl-1"}), "choices: Field required"),
    "empty choices": (Fault.raw_body({"choices": []}), "choices: List should have at least 1"),
    "no message": (Fault.raw_body({"choices": [{"index": 0}]}), "choices.0.message: Field"),
    "no content": (
        Fault.raw_body({"choices": [{"message": {"role": "assistant"}}]}),
        "choices.0.message.content: Field required",
    ),
    "content as an object": (
        Fault.raw_body({"choices": [{"message": {"content": {"rating": "yes"}}}]}),
        "choices.0.message.content: Input should be",
    ),
    "a list for a body": (Fault.raw_body([1, 2]), "Input should be"),
    "a string for a body": (Fault.raw_body("ok"), "Input should be"),
}


@pytest.mark.parametrize("fault", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_reply_that_is_not_a_chat_completion_is_a_malformed_error_saying_what_was_wrong(
    fake_openai: FakeOpenAI, fault: tuple[Fault, str]
) -> None:
    injected, problem = fault
    fake_openai.push_faults(injected)
    endpoint = endpoint_for(fake_openai, max_retries=0, concurrency=1)  # GOOD is asked first
    verdict, other = judge_batch(endpoint, [GOOD, BAD])
    assert (verdict.rating, verdict.error_cause) == ("error", "malformed")
    assert verdict.error_message is not None and problem in verdict.error_message
    assert "not a chat completion" in verdict.error_message
    assert other.rating == "no"  # the rest of the batch is graded as usual


def test_a_malformed_reply_is_retried_like_other_transient_faults(fake_openai: FakeOpenAI) -> None:
    fake_openai.push_faults(Fault.html(), Fault.raw_body({"choices": "x"}))
    (verdict,) = judge_batch(endpoint_for(fake_openai), [BAD])
    assert verdict.rating == "no"
    assert [r.outcome for r in fake_openai.requests] == ["html", "body", "ok"]


USAGE = {
    "a string": {"prompt_tokens": "12", "completion_tokens": 5},
    "negative": {"prompt_tokens": -40, "completion_tokens": 5},
    "1e30": {"prompt_tokens": 1e30, "completion_tokens": 5},
    "a fraction": {"prompt_tokens": 2.5, "completion_tokens": 5},
    "a boolean": {"prompt_tokens": True, "completion_tokens": 5},
    "more than the request's bytes": {"prompt_tokens": 5_000_000, "completion_tokens": 5},
}


@pytest.mark.parametrize("usage", USAGE.values(), ids=USAGE.keys())
def test_implausible_token_counts_are_counted_as_zero_and_logged_and_the_verdict_stands(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture, usage: dict[str, Any]
) -> None:
    caplog.set_level(logging.WARNING, logger="ragpulse.judges")
    fake_openai.push_faults(Fault.reply('{"rationale": "Fine.", "rating": "yes"}', usage=usage))
    (verdict,) = judge_batch(endpoint_for(fake_openai), [GOOD])
    assert (verdict.rating, verdict.rationale) == ("yes", "Fine.")
    assert (verdict.prompt_tokens, verdict.completion_tokens) == (0, 5)
    assert "unusable token usage" in caplog.text and "prompt_tokens" in caplog.text


@pytest.mark.parametrize("usage", ["lots", [1, 2], 7], ids=["a string", "a list", "a number"])
def test_usage_that_is_not_an_object_counts_no_tokens(
    fake_openai: FakeOpenAI, usage: object
) -> None:
    fake_openai.push_faults(Fault.reply('{"rationale": "Fine.", "rating": "yes"}', usage=usage))
    (verdict,) = judge_batch(endpoint_for(fake_openai), [GOOD])
    assert (verdict.rating, verdict.prompt_tokens, verdict.completion_tokens) == ("yes", 0, 0)


class _BrokenJudge:
    """A judge with a bug: raises on answers mentioning "crash" (a fault, not a mock)."""

    name = "broken"

    async def judge(self, item: JudgeInput) -> Verdict:
        if "crash" in item.answer:
            raise KeyError("sk-secret-in-an-exception-message")
        return Verdict(self.name, "yes", rationale="fine")


class _BrokenSyncJudge(_BrokenJudge):
    def grade(self, item: JudgeInput) -> Verdict:
        if "crash" in item.answer:
            raise ZeroDivisionError("boom")
        return Verdict(self.name, "yes", rationale="fine")


def test_a_judge_that_raises_on_one_input_gets_an_internal_error_there_and_the_batch_goes_on(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    crash = JudgeInput("q?", "please crash")
    endpoint = endpoint_for(fake_openai)
    panel = JudgePanel([_BrokenJudge(), *build_llm_judges(["safety"], endpoint)])
    try:
        rows = panel.judge_batch([GOOD, crash, BAD])
    finally:
        panel.close()
    assert [tuple(v.rating for v in row) for row in rows] == [
        ("yes", "yes"),
        ("error", "yes"),
        ("yes", "no"),
    ]
    broken = rows[1][0]
    assert broken.error_cause == "internal"
    assert broken.error_message is not None and "KeyError" in broken.error_message
    assert "sk-secret" not in broken.error_message and "sk-secret" not in caplog.text


def test_a_synchronous_judge_that_raises_fails_only_its_own_verdict() -> None:
    panel = JudgePanel([_BrokenSyncJudge()])
    try:
        rows = panel.judge_batch([JudgeInput("q", answer) for answer in ("a", "crash", "b")])
    finally:
        panel.close()
    assert [row[0].rating for row in rows] == ["yes", "error", "yes"]
    failed = rows[1][0]
    assert failed.error_cause == "internal" and "ZeroDivisionError" in str(failed.error_message)


def test_a_verdict_refuses_token_counts_that_would_make_a_counter_go_down() -> None:
    for bad in (-1, 2.5, "3"):
        with pytest.raises(ValueError, match="token counts"):
            Verdict("safety", "yes", prompt_tokens=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="latency"):
        Verdict("safety", "yes", latency_seconds=float("nan"))


# -- 2. circuit breaker and deadline -------------------------------------------------------------


def test_the_breaker_opens_after_consecutive_failures_and_later_calls_fail_fast_with_a_probe_time(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.push_faults(*[Fault.http(503)] * 3)
    endpoint = endpoint_for(
        fake_openai, concurrency=1, max_retries=0, breaker_failures=3, breaker_cooldown_seconds=30
    )
    verdicts = judge_batch(endpoint, [GOOD] * 8)
    assert [v.error_cause for v in verdicts] == ["server_error"] * 3 + ["circuit_open"] * 5
    assert len(fake_openai.requests) == 3  # the open breaker sent nothing
    message = verdicts[-1].error_message or ""
    assert "circuit breaker is open after 3 consecutive failures" in message
    assert "HTTP 503" in message and "next probe goes out in 30 s" in message


def test_a_call_that_was_made_and_failed_keeps_its_cause_when_the_breaker_stops_its_retry(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.push_faults(Fault.http(503))
    # One failure opens the breaker: the call's own first attempt, so its retry is refused.
    endpoint = endpoint_for(fake_openai, concurrency=1, max_retries=2, breaker_failures=1)
    [verdict] = judge_batch(endpoint, [GOOD])
    assert len(fake_openai.requests) == 1
    assert verdict.error_cause == "server_error"
    message = verdict.error_message or ""
    assert "503" in message and "not retried: the circuit breaker opened" in message
    assert "not called" not in message
    # A call the open breaker did stop before sending is still told apart.
    [later] = judge_batch(endpoint, [GOOD])
    assert later.error_cause == "circuit_open" and "not called" in (later.error_message or "")


def test_after_the_cooldown_a_probe_closes_the_breaker_or_a_failed_probe_reopens_it(
    fake_openai: FakeOpenAI,
) -> None:
    settings = {"concurrency": 1, "max_retries": 0, "breaker_failures": 2}
    fake_openai.push_faults(*[Fault.http(500)] * 2)
    endpoint = endpoint_for(fake_openai, breaker_cooldown_seconds=0.3, **settings)
    assert [v.error_cause for v in judge_batch(endpoint, [GOOD] * 3)] == [
        "server_error",
        "server_error",
        "circuit_open",
    ]
    time.sleep(0.35)
    fake_openai.push_faults(Fault.http(500))
    # A new endpoint object with the same identity shares the breaker (as each serve cycle's).
    again = endpoint_for(fake_openai, breaker_cooldown_seconds=0.3, **settings)
    assert [v.error_cause for v in judge_batch(again, [GOOD] * 2)] == [
        "server_error",  # the probe failed ...
        "circuit_open",  # ... so the breaker is open again at once
    ]
    time.sleep(0.35)
    assert [v.rating for v in judge_batch(again, [GOOD])] == ["yes"]  # the probe succeeds
    assert [v.rating for v in judge_batch(again, [GOOD] * 3)] == ["yes"] * 3  # closed
    assert len(fake_openai.requests) == 2 + 1 + 1 + 3


def test_calls_queued_behind_a_hung_endpoint_fail_fast_once_the_breaker_opens(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.push_faults(*[Fault.hang(10)] * 40)  # the endpoint hangs from now on
    endpoint = endpoint_for(
        fake_openai, concurrency=2, timeout_seconds=0.5, max_retries=0, breaker_failures=2
    )
    started = time.monotonic()
    verdicts = judge_batch(endpoint, [GOOD] * 40)
    assert time.monotonic() - started < 5  # 20 rounds of 0.5 s timeouts without the breaker
    causes = [v.error_cause for v in verdicts]
    # Two timeouts open it; a third call may have taken the slot the first one freed before
    # the second timed out.
    assert causes.count("timeout") in (2, 3)
    assert causes.count("circuit_open") == 40 - causes.count("timeout")


def test_calls_still_pending_at_the_batch_deadline_end_as_deadline_errors_in_time(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.push_faults(*[Fault.hang(20)] * 6)
    endpoint = endpoint_for(fake_openai, concurrency=2, timeout_seconds=30, breaker_failures=0)
    started = time.monotonic()
    verdicts = judge_batch(endpoint, [GOOD] * 6, deadline=1.0)
    elapsed = time.monotonic() - started
    assert elapsed < 4.0  # the deadline, not the 30 s timeout
    assert {v.error_cause for v in verdicts} == {"deadline"}
    assert "--judge-batch-deadline" in (verdicts[0].error_message or "")


class _StubbornJudge:
    """A judge that ignores the published deadline (a fault: blocks on slow I/O of its own)."""

    name = "stubborn"

    async def judge(self, item: JudgeInput) -> Verdict:
        await asyncio.sleep(30)
        return Verdict(self.name, "yes", rationale="late")


def test_the_panel_cancels_a_judge_that_ignores_the_deadline() -> None:
    panel = JudgePanel([_StubbornJudge()], deadline_seconds=0.5)
    started = time.monotonic()
    try:
        rows = panel.judge_batch([JudgeInput("q", "a")] * 3)
    finally:
        panel.close()
    assert time.monotonic() - started < 4.0
    assert [(r[0].rating, r[0].error_cause) for r in rows] == [("error", "deadline")] * 3


def test_a_retry_after_of_an_hour_gives_up_at_once_as_rate_limited(
    fake_openai: FakeOpenAI,
) -> None:
    fake_openai.push_faults(Fault.http(429, retry_after="3600"))
    started = time.monotonic()
    (verdict,) = judge_batch(endpoint_for(fake_openai), [GOOD], deadline=120.0)
    assert time.monotonic() - started < 3.0  # not 60 s (the Retry-After cap), not an hour
    assert verdict.error_cause == "rate_limited"
    assert "gave up instead of waiting 3600 s" in (verdict.error_message or "")
    assert len(fake_openai.requests) == 1


# -- 3. quotas ----------------------------------------------------------------------------------


def test_requests_per_minute_are_paced_under_the_quota(fake_openai: FakeOpenAI) -> None:
    endpoint = endpoint_for(fake_openai, concurrency=8, rpm=240)  # 4 a second, bucket of 4
    verdicts = judge_batch(endpoint, [GOOD] * 12)
    assert {v.rating for v in verdicts} == {"yes"}
    times = sorted(r.received_at for r in fake_openai.requests)
    # Four go at once (one second's worth), then one every 0.25 s: the k-th (from 1) not
    # before (k - 5) * 0.25 s after the first (the bucket starts filling when it is made, a
    # moment before the first send: one refill of lead). Sends can only be late, never early,
    # so only this lower bound is checked: a busy machine that delays some sends may bunch
    # them up later, which is no breach of the quota's pace (10 % margin for the clock).
    for k, at in enumerate(times, start=1):
        assert at - times[0] >= 0.9 * max(0, k - 5) * 0.25, (k, times)


def test_tokens_per_minute_pace_requests_even_when_one_request_outsizes_the_bucket(
    fake_openai: FakeOpenAI,
) -> None:
    judge = LLMJudge(load_prompt("safety"), endpoint_for(fake_openai))
    estimate = estimate_tokens(judge.messages(GOOD, new_nonce()), 256)
    # 0.75 of a request's estimate a second, so the bucket (one second's worth) is smaller
    # than one request: each must go into debt rather than wait for a bucket that never fills.
    per_second = 0.75 * estimate
    endpoint = endpoint_for(fake_openai, concurrency=3, tpm=round(per_second * 60))
    started = time.monotonic()
    verdicts = judge_batch(endpoint, [GOOD] * 3, deadline=30)
    assert [v.rating for v in verdicts] == ["yes"] * 3  # no deadlock, no give-up
    sent = sorted(r.received_at - started for r in fake_openai.requests)
    for k, at in enumerate(sent, start=1):
        # k requests' estimates may have gone out by `at` only once the quota had earned them.
        earliest = (k * estimate - per_second) / per_second
        assert at >= 0.9 * earliest, (k, at, earliest)
    assert time.monotonic() - started < 10


def test_a_quota_wait_past_the_deadline_gives_up_at_once_as_rate_limited(
    fake_openai: FakeOpenAI,
) -> None:
    endpoint = endpoint_for(fake_openai, concurrency=1, rpm=1)  # one a minute
    started = time.monotonic()
    first, second = judge_batch(endpoint, [GOOD, GOOD], deadline=5.0)
    assert time.monotonic() - started < 3.0
    assert first.rating == "yes"
    assert second.error_cause == "rate_limited"
    assert "--judge-rpm" in (second.error_message or "")
    assert len(fake_openai.requests) == 1


# -- 4. the API key never leaves ---------------------------------------------------------------

SECRET = "sk-live-ECHOED-abcdef0123456789"


def secret_forms() -> list[str]:
    return [
        SECRET,
        urllib.parse.quote(SECRET, safe=""),
        base64.b64encode(SECRET.encode()).decode().rstrip("="),
    ]


def test_an_endpoint_echoing_the_key_in_replies_and_error_bodies_never_gets_it_into_a_verdict(
    fake_openai: FakeOpenAI, caplog: pytest.LogCaptureFixture
) -> None:
    for name in (None, "openai", "httpx", "ragpulse.judges"):
        caplog.set_level(logging.DEBUG, logger=name)
    fake_openai.push_faults(
        Fault.reply('{"rationale": "You sent {authorization}.", "rating": "yes"}'),
        Fault.reply("rationale: your key is {authorization}\nrating: no"),
        Fault.reply("I will not grade this. {authorization}"),
        Fault.http(400, message="Invalid header: Authorization: {authorization}"),
        Fault.http(500, message="upstream saw {authorization}"),
    )
    endpoint = endpoint_for(fake_openai, api_key=SECRET, concurrency=1)
    verdicts = judge_batch(endpoint, [GOOD] * 6)
    assert fake_openai.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    texts = [f"{v.rationale} {v.error_message}" for v in verdicts]
    assert [v.rating for v in verdicts] == ["yes", "no", "error", "error", "yes", "yes"]
    assert texts[0].startswith("You sent Bearer [redacted].")
    assert "[redacted]" in texts[2] and "[redacted]" in texts[3]  # echoed, and scrubbed
    for form in secret_forms():
        assert all(form not in text for text in texts)
        assert form not in caplog.text


# -- 5. completion cap and reply formats --------------------------------------------------------


def test_every_request_caps_the_reply_and_a_reply_cut_off_there_is_a_truncated_error(
    fake_openai: FakeOpenAI,
) -> None:
    (verdict,) = judge_batch(endpoint_for(fake_openai, max_tokens=3), [GOOD])
    body = fake_openai.requests[0].body
    assert body is not None and body["max_tokens"] == 3
    assert (verdict.rating, verdict.error_cause) == ("error", "truncated")
    assert "--judge-max-tokens" in (verdict.error_message or "")
    assert verdict.completion_tokens == 3  # the cut reply still cost its tokens
    judge_batch(endpoint_for(fake_openai), [GOOD])
    assert fake_openai.requests[-1].body["max_tokens"] == 256  # type: ignore[index]


FORMATS: dict[ReplyFormat, tuple[dict[str, Any] | None, str]] = {
    "json_schema": ({"type": "json_schema"}, "json"),
    "json_object": ({"type": "json_object"}, "json"),
    "text": (None, "plain"),
}


@pytest.mark.parametrize("reply_format", FORMATS.keys())
def test_each_reply_format_sends_what_servers_take_and_reads_the_replies(
    reply_format: ReplyFormat,
) -> None:
    expected, reply_mode = FORMATS[reply_format]
    # A server that supports only this one format, like the many that lack json_schema.
    with FakeOpenAI(reply_mode=reply_mode, response_formats=(reply_format,)) as server:  # type: ignore[arg-type]
        verdicts = judge_batch(endpoint_for(server, reply_format=reply_format), [GOOD, BAD])
        sent = server.requests[0].body
    assert [v.rating for v in verdicts] == ["yes", "no"]
    assert sent is not None
    received = sent.get("response_format")
    if expected is None:
        assert received is None
    else:
        assert received is not None and received["type"] == expected["type"]
    if reply_format == "json_object":
        assert set(received) == {"type"}  # type: ignore[arg-type]


@pytest.mark.parametrize("status", [400, 500])
def test_a_server_refusing_json_schema_gets_an_error_naming_the_setting_to_change(
    status: int,
) -> None:
    with FakeOpenAI(
        response_formats=("json_object", "text"), format_rejection_status=status
    ) as server:
        (verdict,) = judge_batch(endpoint_for(server), [GOOD])
        assert len(server.requests) == 1  # not retried: it would fail the same way
        assert verdict.error_cause == "client_error"
        message = verdict.error_message or ""
        assert "--judge-reply-format json_object (or text)" in message
        assert "json_schema is not supported" in message
        (fixed,) = judge_batch(endpoint_for(server, reply_format="json_object"), [GOOD])
        assert fixed.rating == "yes"


def test_the_spec_carries_every_endpoint_setting_to_the_panel(fake_openai: FakeOpenAI) -> None:
    spec = JudgeSettings(
        names=("safety",),
        backend="openai",
        base_url=fake_openai.base_url,
        api_key=SecretStr("sk-spec-key-0123"),
        reply_format="text",
        max_tokens=77,
        batch_deadline_seconds=9.0,
    ).spec()
    fake_openai.reply_mode = "plain"
    panel = spec.build()
    try:
        assert panel.deadline_seconds == 9.0
        assert [row[0].rating for row in panel.judge_batch([GOOD, BAD])] == ["yes", "no"]
    finally:
        panel.close()
    body = fake_openai.requests[0].body
    assert body is not None and body["max_tokens"] == 77 and "response_format" not in body
