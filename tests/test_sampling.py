import pytest

from ragpulse.pipeline.costs.sampling import is_sampled, sample_point


def test_the_same_request_id_is_always_in_or_always_out() -> None:
    ids = [f"req-{i}" for i in range(1000)]
    first = [is_sampled(i, 0.3) for i in ids]
    assert first == [is_sampled(i, 0.3) for i in reversed(ids)][::-1]


def test_the_sampled_share_is_close_to_the_rate() -> None:
    ids = [f"req-{i}" for i in range(20_000)]
    share = sum(is_sampled(i, 0.25) for i in ids) / len(ids)
    assert 0.24 < share < 0.26


def test_a_higher_rate_keeps_every_event_a_lower_rate_kept() -> None:
    ids = [f"req-{i}" for i in range(2000)]
    low = {i for i in ids if is_sampled(i, 0.1)}
    high = {i for i in ids if is_sampled(i, 0.5)}
    assert low <= high


def test_rate_one_keeps_all_and_rate_zero_keeps_none() -> None:
    assert all(is_sampled(f"r{i}", 1.0) for i in range(500))
    assert not any(is_sampled(f"r{i}", 0.0) for i in range(500))


def test_sample_point_is_pinned_to_blake2b_so_streams_never_resample() -> None:
    # A change of hash would re-sample every stream on upgrade; this pins the function.
    assert sample_point("abc") == int("d8bb14d833d59559", 16) / 2**64


def test_a_rate_outside_zero_one_is_refused() -> None:
    with pytest.raises(ValueError, match="within"):
        is_sampled("x", 1.5)
