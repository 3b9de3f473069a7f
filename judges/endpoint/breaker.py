"""A circuit breaker for one judge endpoint: stop calling it while it is down.

When the endpoint fails `failure_threshold` attempts in a row (timeouts, connection errors,
5xx, 429, malformed replies: the failures `judges.endpoint.retry` would retry), the breaker opens:
every call then fails at once with cause `circuit_open` instead of waiting out timeouts and retries
(a call whose earlier attempt was sent, and whose retry the breaker stops, keeps the cause of
that attempt: it was called).
After `cooldown_seconds` it lets exactly one call through as a probe (half-open); the probe's
success closes the breaker, its failure opens it for another cool-down. Outcomes that say
nothing about the endpoint's health (a call cancelled by the batch deadline, a bug) only give
the probe slot back.

Thread-safe and free of any event loop, because one breaker outlives the panels that use it
(see `judges.llm.judge.shared_endpoint_state`). The clock is injectable for tests.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

log = logging.getLogger(__name__)

BreakerState = Literal["closed", "open", "half_open"]


@dataclasses.dataclass(frozen=True, slots=True)
class Permit:
    """Leave to make one attempt; `probe` is set for the single half-open trial."""

    probe: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """The breaker is open: no attempt now; the next probe is due in `retry_in` seconds."""

    retry_in: float
    failures: int
    last_failure: str | None


class CircuitBreaker:
    """Counts consecutive failed attempts of one endpoint and fails calls fast while it is down.

    `failure_threshold` 0 switches the breaker off (every attempt is permitted). Both numbers
    come from `--judge-breaker-*` flags, whose bounds `pipeline.settings.models.JudgeSettings`
    checks.
    """

    def __init__(
        self,
        failure_threshold: int = 5,
        cooldown_seconds: float = 30.0,
        *,
        name: str = "judge endpoint",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_seconds = cooldown_seconds
        self.name = name
        self._clock = clock
        self._lock = threading.Lock()
        self._state: BreakerState = "closed"
        self._failures = 0
        self._opened_at = 0.0
        self._last_failure: str | None = None

    @property
    def state(self) -> BreakerState:
        with self._lock:
            return self._state

    def acquire(self) -> Permit | Refusal:
        """A permit for one attempt, or a refusal while the breaker is open."""
        with self._lock:
            if self.failure_threshold == 0 or self._state == "closed":
                return Permit()
            wait = self._opened_at + self.cooldown_seconds - self._clock()
            if self._state == "open" and wait <= 0:
                self._state = "half_open"
                log.info("%s: circuit half-open, sending one probe", self.name)
                return Permit(probe=True)
            # Half-open with the probe still out: the next chance comes with its outcome.
            return Refusal(max(wait, 0.0), self._failures, self._last_failure)

    def succeeded(self, permit: Permit) -> None:
        """The endpoint answered (any answer that is not a retryable failure)."""
        with self._lock:
            if permit.probe or self._state == "closed":
                if self._state != "closed":
                    log.info("%s: probe succeeded, circuit closed", self.name)
                self._state = "closed"
                self._failures = 0

    def failed(self, permit: Permit, description: str) -> None:
        """The attempt failed in a way that says the endpoint is unwell; `description` is a
        secret-free sentence kept for the refusals' messages."""
        with self._lock:
            self._last_failure = description
            if permit.probe:
                self._open(f"probe failed ({description})")
            elif self._state == "closed":
                self._failures += 1
                if self.failure_threshold and self._failures >= self.failure_threshold:
                    self._open(f"{self._failures} consecutive failures, the last: {description}")

    def abandoned(self, permit: Permit) -> None:
        """The attempt ended without telling anything about the endpoint (cancelled, a bug)."""
        with self._lock:
            if permit.probe and self._state == "half_open":
                self._state = "open"  # its cool-down is over, so the next call probes

    def _open(self, why: str) -> None:
        self._state = "open"
        self._opened_at = self._clock()
        log.warning(
            "%s: circuit opened after %s; calls fail fast (circuit_open) and one probe goes "
            "out in %g s",
            self.name,
            why,
            self.cooldown_seconds,
        )
