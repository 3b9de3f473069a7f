"""The one retry layer of the LLM judges: what is retried, how long we wait, what we say."""

from __future__ import annotations

import argparse
import email.utils
import re

import pytest

from ragpulse.judges.endpoint.retry import (
    CallFailure,
    RetryPolicy,
    backoff_delay,
    decide_retry,
    failure_message,
    is_retryable,
    over_budget_note,
    parse_retry_after,
)
from ragpulse.pipeline.settings.command_flags import add_judge_arguments
from ragpulse.pipeline.settings.models import JudgeSettings

POLICY = RetryPolicy(max_retries=4, base_delay=0.5, max_delay=8.0, max_retry_after=30.0)


@pytest.mark.parametrize(
    "failure",
    [
        CallFailure("status", 429),
        CallFailure("status", 500),
        CallFailure("status", 502),
        CallFailure("status", 503),
        CallFailure("status", 408),
        CallFailure("timeout"),
        CallFailure("connection"),
        CallFailure("malformed"),
    ],
)
def test_rate_limits_server_errors_timeouts_and_connection_failures_are_retried(
    failure: CallFailure,
) -> None:
    assert is_retryable(failure)
    decision = decide_retry(failure, attempt=1, policy=POLICY, jitter=0.5)
    assert decision.retry
    assert decision.delay > 0


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 422])
def test_client_errors_are_not_retried(status: int) -> None:
    failure = CallFailure("status", status)
    assert not is_retryable(failure)
    assert not decide_retry(failure, attempt=1, policy=POLICY, jitter=0.5).retry
    assert failure.cause == "client_error"


def test_retrying_stops_once_max_retries_have_been_spent() -> None:
    failure = CallFailure("status", 500)
    assert decide_retry(failure, attempt=4, policy=POLICY, jitter=0.0).retry
    assert not decide_retry(failure, attempt=5, policy=POLICY, jitter=0.0).retry
    no_retries = RetryPolicy(max_retries=0)
    assert not decide_retry(failure, attempt=1, policy=no_retries, jitter=0.0).retry


def test_backoff_doubles_per_attempt_with_equal_jitter_and_never_exceeds_the_cap() -> None:
    # Attempt n waits between half and all of min(max_delay, base * 2^(n-1)).
    assert backoff_delay(1, POLICY, 0.0, None) == pytest.approx(0.25)
    assert backoff_delay(1, POLICY, 1.0, None) == pytest.approx(0.5)
    assert backoff_delay(3, POLICY, 0.0, None) == pytest.approx(1.0)
    assert backoff_delay(3, POLICY, 1.0, None) == pytest.approx(2.0)
    assert backoff_delay(10, POLICY, 1.0, None) == pytest.approx(8.0)
    assert backoff_delay(10, POLICY, 0.0, None) == pytest.approx(4.0)


def test_retry_after_is_honoured_with_a_little_jitter_and_capped() -> None:
    assert backoff_delay(1, POLICY, 0.0, 3.0) == pytest.approx(3.0)
    assert 3.0 <= backoff_delay(1, POLICY, 0.99, 3.0) <= 3.0 + POLICY.base_delay
    assert backoff_delay(1, POLICY, 0.0, 3600.0) == pytest.approx(30.0)
    decision = decide_retry(CallFailure("status", 429, retry_after=2.0), 1, POLICY, 0.0)
    assert decision.retry
    assert decision.delay == pytest.approx(2.0)


def test_retry_after_is_read_as_seconds_milliseconds_or_http_date() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after({"Retry-After": "7"}, now) == 7.0
    assert parse_retry_after({"retry-after": "0.25"}, now) == 0.25
    assert parse_retry_after({"retry-after-ms": "1500", "Retry-After": "9"}, now) == 1.5
    date = email.utils.formatdate(now + 12, usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now) == pytest.approx(12.0)
    past = email.utils.formatdate(now - 60, usegmt=True)
    assert parse_retry_after({"Retry-After": past}, now) == 0.0


@pytest.mark.parametrize(
    "headers", [{}, {"Retry-After": "soon"}, {"Retry-After": "-3"}, {"Retry-After": "nan"}]
)
def test_missing_or_unreadable_retry_after_means_no_server_hint(headers: dict[str, str]) -> None:
    assert parse_retry_after(headers, 0.0) is None


@pytest.mark.parametrize(
    ("failure", "cause"),
    [
        (CallFailure("status", 429), "rate_limited"),
        (CallFailure("status", 500), "server_error"),
        (CallFailure("status", 408), "timeout"),
        (CallFailure("timeout"), "timeout"),
        (CallFailure("connection"), "connection"),
        (CallFailure("malformed"), "malformed"),
        (CallFailure("status", 401), "client_error"),
        (CallFailure("status", 500, detail="response_format not supported"), "client_error"),
    ],
)
def test_each_failure_is_counted_under_its_error_cause(failure: CallFailure, cause: str) -> None:
    assert failure.cause == cause


def test_failure_messages_say_what_failed_and_how_many_attempts_were_made() -> None:
    assert (
        failure_message(CallFailure("status", 500), 5, 30.0)
        == "HTTP 500 from judge endpoint after 5 attempts"
    )
    assert "429 (rate limited)" in failure_message(CallFailure("status", 429), 3, 30.0)
    assert "within 0.5 s, 2 attempts" in failure_message(CallFailure("timeout"), 2, 0.5)
    unauthorised = failure_message(CallFailure("status", 401), 1, 30.0)
    assert "not retried" in unauthorised and "API key" in unauthorised


def test_a_negative_retry_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="max_retries"):
        RetryPolicy(max_retries=-1)


def test_a_retry_after_beyond_the_time_left_of_the_batch_gives_up_at_once() -> None:
    throttled = CallFailure("status", 429, retry_after=3600.0)
    decision = decide_retry(throttled, attempt=1, policy=POLICY, jitter=0.0, remaining=100.0)
    assert (decision.retry, decision.over_budget) == (False, True)
    assert decision.delay == pytest.approx(3600.0)  # what the server asked, not our cap
    assert throttled.cause == "rate_limited"
    note = over_budget_note(decision, 100.0)
    assert "3600 s" in note and "100 s left" in note and "--judge-batch-deadline" in note
    # Within the budget the same failure is retried, after the capped wait.
    assert decide_retry(CallFailure("status", 429, retry_after=2.0), 1, POLICY, 0.0, 100.0).retry


def test_a_backoff_that_would_end_past_the_deadline_is_not_slept() -> None:
    failure = CallFailure("status", 503)
    assert decide_retry(failure, attempt=3, policy=POLICY, jitter=0.0, remaining=5.0).retry
    decision = decide_retry(failure, attempt=3, policy=POLICY, jitter=0.0, remaining=0.5)
    assert (decision.retry, decision.over_budget) == (False, True)


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (400, "response_format type json_schema is not supported"),
        (500, "Internal error: failed to parse json_schema"),
        (422, "Unsupported value for response_format"),
    ],
)
def test_a_server_refusing_the_response_format_is_not_retried_and_told_what_to_set(
    status: int, body: str
) -> None:
    failure = CallFailure("status", status, detail=body)
    assert failure.rejects_reply_format and not is_retryable(failure)
    message = failure_message(failure, 1, 30.0, "json_schema")
    assert "--judge-reply-format json_object" in message and body in message
    assert "--judge-reply-format text" in failure_message(failure, 1, 30.0, "json_object")
    # A plain server error that does not mention the format is still retried.
    assert is_retryable(CallFailure("status", 500, detail="upstream overloaded"))


def test_a_malformed_reply_says_what_was_wrong_with_it() -> None:
    failure = CallFailure("malformed", detail="choices: Input should be a valid list")
    assert is_retryable(failure)
    assert failure_message(failure, 2, 30.0) == (
        "judge endpoint sent a reply that is not a chat completion, 2 attempts: "
        "choices: Input should be a valid list"
    )


def test_failure_hints_name_only_flags_and_variables_an_operator_can_set() -> None:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    flags = set(re.findall(r"--[a-z][a-z0-9-]*", parser.format_help()))
    # A setting's field name is what the code calls it; the operator only sees the flags.
    fields = [f for f in JudgeSettings.model_fields if "_" in f]
    messages = [failure_message(CallFailure("status", s), 3, 30.0) for s in range(400, 600)]
    refused = CallFailure("status", 400, detail="response_format json_schema is not supported")
    assert refused.rejects_reply_format
    messages += [failure_message(refused, 1, 30.0, f) for f in ("json_schema", "json_object")]
    messages += [failure_message(CallFailure(k), 2, 30.0) for k in ("timeout", "connection")]
    waited = decide_retry(CallFailure("status", 429, 600.0), 1, POLICY, 0.0, 9.0)
    messages.append(over_budget_note(waited, 9.0))
    for message in messages:
        assert set(re.findall(r"--[a-z][a-z0-9-]*", message)) <= flags, message
        assert not [f for f in fields if re.search(rf"\b{f}\b", message)], message
