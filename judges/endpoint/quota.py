"""Requests-per-minute and tokens-per-minute limits for one judge endpoint (`--judge-rpm/-tpm`).

Paid endpoints enforce quotas per minute; going over earns 429s, retries and wasted budget. A
`RateQuota` is a token bucket that refills at `per_minute / 60` per second and holds at most
one second's worth, so requests go out evenly rather than in a burst at the top of the minute.
A request may take more than the bucket holds (a long prompt under a small tpm): the bucket
then goes into debt and later requests wait until it is repaid, so no request waits forever
and the order is first come, first served. `reserve` never sleeps; it says how long the caller
must wait before sending, so that the caller can compare that with its deadline first.

Thread-safe and free of any event loop, like the circuit breaker, because one quota outlives
the panels that share it (see `judges.llm.judge.shared_endpoint_state`). The clock is injectable.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence


class RateQuota:
    """A token bucket of `per_minute` units (requests or tokens) per minute."""

    def __init__(self, per_minute: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        if per_minute < 1:
            raise ValueError(f"per_minute must be at least 1, got {per_minute}")
        self.per_minute = per_minute
        self._rate = per_minute / 60.0
        self._capacity = max(self._rate, 1.0)  # one second's worth, and at least one unit
        self._clock = clock
        self._lock = threading.Lock()
        self._level = self._capacity
        self._updated = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._level = min(self._capacity, self._level + (now - self._updated) * self._rate)
        self._updated = now

    def reserve(self, units: float) -> float:
        """Take `units` now; returns the seconds to wait before using them (0: go ahead)."""
        with self._lock:
            self._refill()
            self._level -= units
            return max(0.0, -self._level / self._rate)

    def give_back(self, units: float) -> None:
        """Return units reserved but not used (a call given up), or over-estimated."""
        with self._lock:
            self._refill()
            self._level = min(self._capacity, self._level + units)

    def charge(self, units: float) -> None:
        """Take units used beyond the reservation (an under-estimate), without waiting."""
        with self._lock:
            self._refill()
            self._level -= units


# Tokens per character of English text for the estimate before sending; corrected by the
# usage the endpoint reports.
CHARS_PER_TOKEN = 4


def estimate_tokens(messages: Sequence[Mapping[str, str]], max_tokens: int) -> int:
    """Tokens a chat request may use: its text at four characters a token, plus the reply cap."""
    chars = sum(len(m.get("content") or "") for m in messages)
    return chars // CHARS_PER_TOKEN + len(messages) * 4 + max_tokens
