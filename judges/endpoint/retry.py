"""When to call the judge endpoint again, and how long to wait first.

This is ragpulse's only retry layer for LLM judges (the `openai` client's own retries are
switched off, so attempts are neither multiplied nor hidden). Everything here is pure: the
caller turns a client exception into a `CallFailure` at the I/O edge, asks `decide_retry`, and
sleeps itself. Rules: rate limits (429), server errors (5xx), request timeouts (408 and
client-side timeouts), connection failures and malformed reply bodies are worth another try;
any other 4xx (400, 401, 403, 404, 422, ...) means the request itself is wrong and will fail
the same way again, and so does a 5xx that blames our `response_format`. No wait is taken that
would end past the batch's deadline (`remaining`): a Retry-After of an hour gives up at once.
"""

from __future__ import annotations

import dataclasses
import email.utils
import math
import re
from collections.abc import Mapping
from typing import Literal

from ragpulse.judges.base import ErrorCause

FailureKind = Literal["status", "timeout", "connection", "malformed"]
ReplyFormat = Literal["json_schema", "json_object", "text"]

# An error body that names these is the endpoint refusing our `response_format` (vLLM, llama.cpp,
# Ollama and older Azure deployments answer 400 or 500 to a format they do not support).
_REPLY_FORMAT_WORDS = re.compile(r"response_format|json_schema|json_object", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, slots=True)
class CallFailure:
    """One failed call to the judge endpoint, independent of the HTTP client library.

    `status` is set for kind "status"; `retry_after` is the server's Retry-After in seconds;
    `detail` is what the server said (an excerpt of the error body, or what is wrong with a
    malformed reply), already cleared of secrets by the caller.
    """

    kind: FailureKind
    status: int | None = None
    retry_after: float | None = None
    detail: str | None = None

    @property
    def rejects_reply_format(self) -> bool:
        """True when the endpoint refused the request because of its `response_format`."""
        status = self.status or 0
        return (
            self.kind == "status"
            and (status in (400, 422) or status >= 500)
            and bool(self.detail and _REPLY_FORMAT_WORDS.search(self.detail))
        )

    @property
    def cause(self) -> ErrorCause:
        """The `Verdict.error_cause` this failure is counted under."""
        if self.kind == "timeout" or self.status == 408:
            return "timeout"
        if self.kind == "connection":
            return "connection"
        if self.kind == "malformed":
            return "malformed"
        if self.rejects_reply_format:
            return "client_error"  # our setting is wrong, whatever status the server chose
        if self.status == 429:
            return "rate_limited"
        if self.status is not None and self.status >= 500:
            return "server_error"
        return "client_error"


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times to retry and how to space the attempts (seconds)."""

    max_retries: int = 4
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        if self.base_delay < 0 or self.max_delay < 0 or self.max_retry_after < 0:
            raise ValueError("retry delays must be >= 0 seconds")

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1


@dataclasses.dataclass(frozen=True, slots=True)
class RetryDecision:
    """Whether to try again, and after how many seconds.

    `over_budget` is set when a retry was worth it but its wait (`delay`) would end past the
    batch deadline, so the caller gives up now instead.
    """

    retry: bool
    delay: float = 0.0
    over_budget: bool = False


def is_retryable(failure: CallFailure) -> bool:
    """True when the same request may well succeed if sent again."""
    if failure.kind != "status":
        return True
    if failure.rejects_reply_format:
        return False
    status = failure.status or 0
    return status in (408, 429) or status >= 500


def backoff_delay(
    attempt: int, policy: RetryPolicy, jitter: float, retry_after: float | None
) -> float:
    """Seconds to wait after failed attempt number `attempt` (1-based); `jitter` is in [0, 1).

    A server's Retry-After is honoured (capped at `max_retry_after`) plus up to one base delay of
    jitter, so that callers throttled together do not come back together. Without it, the wait
    doubles each attempt up to `max_delay`, half fixed and half random ("equal jitter").
    """
    jitter = min(max(jitter, 0.0), 1.0)
    if retry_after is not None:
        return min(max(retry_after, 0.0), policy.max_retry_after) + jitter * policy.base_delay
    ceiling = min(policy.max_delay, policy.base_delay * math.pow(2, max(attempt, 1) - 1))
    return ceiling / 2 + jitter * ceiling / 2


def decide_retry(
    failure: CallFailure,
    attempt: int,
    policy: RetryPolicy,
    jitter: float,
    remaining: float = math.inf,
) -> RetryDecision:
    """Retry or give up after failed attempt number `attempt` (1-based).

    `remaining` is the time left of the batch deadline: a wait that would use it up, or a
    Retry-After beyond it (the server told us not to come back sooner), gives up at once.
    """
    if not is_retryable(failure) or attempt >= policy.max_attempts:
        return RetryDecision(retry=False)
    delay = backoff_delay(attempt, policy, jitter, failure.retry_after)
    wanted = max(delay, failure.retry_after or 0.0)
    if wanted >= remaining:
        return RetryDecision(False, wanted, over_budget=True)
    return RetryDecision(True, delay)


def parse_retry_after(headers: Mapping[str, str], now: float) -> float | None:
    """Seconds the server asked us to wait, from `retry-after-ms` or `Retry-After`.

    Retry-After may be delta-seconds (fractions accepted, as some servers send them) or an
    HTTP date; `now` is the current epoch time, used for the date form. Unreadable → None.
    """
    lowered = {k.lower(): v for k, v in headers.items()}
    millis = lowered.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000
        except ValueError:
            value = math.nan
        if math.isfinite(value) and value >= 0:
            return value
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            return None
        return max(when.timestamp() - now, 0.0)
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


_STATUS_HINTS = {
    400: "the endpoint rejected the request",
    401: "authentication failed; check the API key (OPENAI_API_KEY)",
    403: "permission denied; check that the API key (OPENAI_API_KEY) may use --judge-model",
    404: "not found; check --judge-base-url (or OPENAI_BASE_URL) and --judge-model",
    422: "the endpoint could not process the request",
}


_FORMAT_ALTERNATIVES: dict[str, str] = {
    "json_schema": "--judge-reply-format json_object (or text)",
    "json_object": "--judge-reply-format text",
    "text": "--judge-reply-format text (already set: check the server's own settings)",
}


def failure_message(
    failure: CallFailure,
    attempts: int,
    timeout_seconds: float,
    reply_format: ReplyFormat = "json_schema",
) -> str:
    """A sentence for `Verdict.error_message`: what failed, how often, and what to check."""
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    said = f": {failure.detail}" if failure.detail else ""
    if failure.kind == "timeout":
        return f"judge endpoint did not answer within {timeout_seconds:g} s, {tries}"
    if failure.kind == "connection":
        return f"could not connect to the judge endpoint after {tries}"
    if failure.kind == "malformed":
        return f"judge endpoint sent a reply that is not a chat completion, {tries}{said}"
    status = failure.status
    if failure.rejects_reply_format:
        return (
            f"HTTP {status} from judge endpoint, not retried: it does not accept "
            f"response_format {reply_format}; set {_FORMAT_ALTERNATIVES[reply_format]}{said}"
        )
    if status is not None and not is_retryable(failure):
        hint = _STATUS_HINTS.get(status, "a client error")
        return f"HTTP {status} from judge endpoint, not retried: {hint}{said}"
    label = " (rate limited)" if status == 429 else ""
    return f"HTTP {status}{label} from judge endpoint after {tries}"


def over_budget_note(decision: RetryDecision, remaining: float) -> str:
    """The clause added to a failure message when the retry's wait would pass the deadline."""
    return (
        f"; gave up instead of waiting {decision.delay:.0f} s, past the batch deadline "
        f"({max(remaining, 0.0):.0f} s left, --judge-batch-deadline)"
    )
