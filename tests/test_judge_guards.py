"""The judge endpoint's circuit breaker and rpm/tpm quotas as state machines, on a fake clock."""

from __future__ import annotations

import pytest

from ragpulse.judges.endpoint.breaker import CircuitBreaker, Permit, Refusal
from ragpulse.judges.endpoint.quota import RateQuota, estimate_tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fail(breaker: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        permit = breaker.acquire()
        assert isinstance(permit, Permit)
        breaker.failed(permit, "HTTP 500")


def probing(threshold: int) -> tuple[CircuitBreaker, Permit]:
    """A breaker opened by `threshold` failures, once its 10 s cooldown is over, and the probe
    it then lets through (checked to be one)."""
    clock = Clock()
    breaker = CircuitBreaker(threshold, 10.0, clock=clock)
    fail(breaker, threshold)
    clock.now += 10
    probe = breaker.acquire()
    assert probe == Permit(probe=True)
    return breaker, probe


def test_the_breaker_opens_after_n_consecutive_failures_and_then_refuses_at_once() -> None:
    clock = Clock()
    breaker = CircuitBreaker(3, 30.0, clock=clock)
    fail(breaker, 2)
    ok = breaker.acquire()
    assert isinstance(ok, Permit)
    breaker.succeeded(ok)  # a success in between resets the count
    fail(breaker, 2)
    assert breaker.state == "closed"
    fail(breaker, 1)
    assert breaker.state == "open"
    refusal = breaker.acquire()
    assert isinstance(refusal, Refusal)
    assert refusal.retry_in == pytest.approx(30.0)
    assert (refusal.failures, refusal.last_failure) == (3, "HTTP 500")
    clock.now += 12
    later = breaker.acquire()
    assert isinstance(later, Refusal) and later.retry_in == pytest.approx(18.0)


def test_after_the_cooldown_one_probe_goes_through_and_its_success_closes_the_breaker() -> None:
    breaker, probe = probing(2)
    assert breaker.state == "half_open"
    waiting = breaker.acquire()  # only one probe at a time
    assert isinstance(waiting, Refusal) and waiting.retry_in == 0
    breaker.succeeded(probe)
    assert breaker.state == "closed"
    assert isinstance(breaker.acquire(), Permit)


def test_a_failed_probe_reopens_the_breaker_for_another_cooldown() -> None:
    breaker, probe = probing(1)
    breaker.failed(probe, "no answer in time")
    assert breaker.state == "open"
    refusal = breaker.acquire()
    assert isinstance(refusal, Refusal) and refusal.retry_in == pytest.approx(10.0)
    assert refusal.last_failure == "no answer in time"


def test_an_abandoned_probe_lets_the_next_call_probe_instead_of_jamming_half_open() -> None:
    breaker, probe = probing(1)
    breaker.abandoned(probe)  # e.g. cancelled by the batch deadline
    again = breaker.acquire()
    assert isinstance(again, Permit) and again.probe


def test_late_outcomes_of_calls_admitted_before_the_breaker_opened_do_not_close_it() -> None:
    clock = Clock()
    breaker = CircuitBreaker(2, 10.0, clock=clock)
    early = [breaker.acquire() for _ in range(3)]
    assert all(isinstance(p, Permit) for p in early)
    breaker.failed(early[0], "HTTP 503")  # type: ignore[arg-type]
    breaker.failed(early[1], "HTTP 503")  # type: ignore[arg-type]
    breaker.succeeded(early[2])  # type: ignore[arg-type]
    assert breaker.state == "open"


def test_a_threshold_of_zero_turns_the_breaker_off() -> None:
    breaker = CircuitBreaker(0, 10.0, clock=Clock())
    fail(breaker, 50)
    assert isinstance(breaker.acquire(), Permit)


def test_a_quota_lets_one_seconds_worth_through_then_spaces_requests_evenly() -> None:
    clock = Clock()
    quota = RateQuota(120, clock=clock)  # 2 per second, bucket of 2
    assert [quota.reserve(1) for _ in range(2)] == [0.0, 0.0]
    assert quota.reserve(1) == pytest.approx(0.5)
    assert quota.reserve(1) == pytest.approx(1.0)
    clock.now += 1.0
    assert quota.reserve(1) == pytest.approx(0.5)


def test_a_request_larger_than_the_bucket_waits_its_turn_instead_of_forever() -> None:
    clock = Clock()
    quota = RateQuota(600, clock=clock)  # 10 tokens a second, bucket of 10
    assert quota.reserve(35) == pytest.approx(2.5)  # into debt; repaid in 2.5 s
    assert quota.reserve(5) == pytest.approx(3.0)  # queued behind it, never starved
    clock.now += 3.0
    assert quota.reserve(0) == pytest.approx(0.0)


def test_unused_or_overestimated_units_come_back_and_underestimates_are_charged() -> None:
    clock = Clock()
    quota = RateQuota(60, clock=clock)  # 1 a second
    assert quota.reserve(3) == pytest.approx(2.0)
    quota.give_back(3)
    assert quota.reserve(1) == pytest.approx(0.0)
    quota.charge(4)
    assert quota.reserve(1) == pytest.approx(5.0)


def test_a_requests_tokens_are_estimated_from_its_text_and_the_reply_cap() -> None:
    messages = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "y" * 40}]
    assert estimate_tokens(messages, 256) == 100 + 10 + 8 + 256
