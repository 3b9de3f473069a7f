import math

import pytest

from ragpulse.pipeline.windows import (
    RatingCounts,
    WindowKey,
    parse_duration,
    wilson_interval,
    window_row,
    window_start,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("60s", 60.0), ("5m", 300.0), ("1.5h", 5400.0), ("250ms", 0.25), ("2d", 172800.0)],
)
def test_durations_are_read_with_their_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["5", "five minutes", "-5m", "5 weeks", ""])
def test_a_duration_without_a_known_unit_is_refused_with_an_example(text: str) -> None:
    with pytest.raises(ValueError, match=r"e\.g\. 60s or 5m"):
        parse_duration(text)


def test_windows_are_aligned_to_the_epoch_like_beam_fixed_windows() -> None:
    assert window_start(1_700_000_123.5, 60) == 1_700_000_100.0
    assert window_start(1_700_000_100.0, 60) == 1_700_000_100.0


def test_wilson_interval_matches_the_textbook_value() -> None:
    # 8 of 10: Wilson 95 % interval is [0.4902, 0.9433] (Agresti & Coull, 1998, formula).
    low, high = wilson_interval(8, 10)
    assert low is not None and high is not None
    assert math.isclose(low, 0.4902, abs_tol=1e-4)
    assert math.isclose(high, 0.9433, abs_tol=1e-4)


def test_wilson_interval_stays_inside_zero_one_at_the_extremes() -> None:
    low, high = wilson_interval(5, 5)
    assert high == 1.0 and low is not None and 0.4 < low < 0.6
    assert wilson_interval(0, 0) == (None, None)


def test_window_row_leaves_errors_out_of_the_percentage() -> None:
    key = WindowKey(0.0, 300.0, "groundedness", "help-bot", "m1")
    row = window_row(key, RatingCounts(yes=3, no=1, error=6))
    assert row["percentage"] == 0.75
    assert row["window_start"] == "1970-01-01T00:00:00Z"
    assert row["window_end"] == "1970-01-01T00:05:00Z"
    assert (row["yes"], row["no"], row["error"]) == (3, 1, 6)


def test_window_with_only_errors_has_no_percentage() -> None:
    row = window_row(WindowKey(0.0, 60.0, "safety", "a", "m"), RatingCounts(error=4))
    assert row["percentage"] is None and row["ci_low"] is None and row["ci_high"] is None


def test_partial_counts_of_a_window_add_up() -> None:
    assert RatingCounts(1, 2, 3) + RatingCounts(4, 5, 6) == RatingCounts(5, 7, 9)
