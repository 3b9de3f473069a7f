"""When to call the judge endpoint again, and how long to wait first.

This is ragpulse's only retry layer for LLM judges (the `openai` client's own retries are
switched off, so attempts are neither multiplied nor hidden). Everything here is pure: the
caller turns a client exception into a `CallFailure` at the I/O edge, asks `decide_retry`, and
sleeps itself. Rules: rate limits (429), server errors (5xx), request timeouts (408 and
client-side timeouts), connection failures and malformed reply bodies are worth another try;
any other 4xx (400, 401, 403, 404, 422, ...) means the request itself is wrong and will fail
the same way again.
"""

from __future__ import annotations

import dataclasses
import email.utils
import math
from collections.abc import Mapping
from typing import Literal

from judges.base import ErrorCause

FailureKind = Literal["status", "timeout", "connection", "malformed"]


@dataclasses.dataclass(frozen=True, slots=True)
class CallFailure:
    """One failed call to the judge endpoint, independent of the HTTP client library.

    `status` is set for kind "status"; `retry_after` is the server's Retry-After in seconds.
    """

    kind: FailureKind
    status: int | None = None
    retry_after: float | None = None

    @property
    def cause(self) -> ErrorCause:
        """The `Verdict.error_cause` this failure is counted under."""
        if self.kind == "timeout" or self.status == 408:
            return "timeout"
        if self.kind == "connection":
            return "connection"
        if self.kind == "malformed":
            return "server_error"
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
    """Whether to try again, and after how many seconds."""

    retry: bool
    delay: float = 0.0


def is_retryable(failure: CallFailure) -> bool:
    """True when the same request may well succeed if sent again."""
    if failure.kind != "status":
        return True
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
    failure: CallFailure, attempt: int, policy: RetryPolicy, jitter: float
) -> RetryDecision:
    """Retry or give up after failed attempt number `attempt` (1-based)."""
    if not is_retryable(failure) or attempt >= policy.max_attempts:
        return RetryDecision(retry=False)
    return RetryDecision(True, backoff_delay(attempt, policy, jitter, failure.retry_after))


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
    400: "the endpoint rejected the request (if it does not support response_format "
    "json_schema, turn structured output off)",
    401: "authentication failed; check the API key",
    403: "permission denied; check the API key's access to this model",
    404: "not found; check base_url and the model name",
    422: "the endpoint could not process the request",
}


def failure_message(failure: CallFailure, attempts: int, timeout_seconds: float) -> str:
    """A sentence for `Verdict.error_message`: what failed, how often, and what to check."""
    tries = f"{attempts} attempt{'s' if attempts != 1 else ''}"
    if failure.kind == "timeout":
        return f"judge endpoint did not answer within {timeout_seconds:g} s, {tries}"
    if failure.kind == "connection":
        return f"could not connect to the judge endpoint after {tries}"
    if failure.kind == "malformed":
        return f"judge endpoint sent a reply body that is not valid JSON, {tries}"
    status = failure.status
    if status is not None and not is_retryable(failure):
        hint = _STATUS_HINTS.get(status, "a client error")
        return f"HTTP {status} from judge endpoint, not retried: {hint}"
    label = " (rate limited)" if status == 429 else ""
    return f"HTTP {status}{label} from judge endpoint after {tries}"
