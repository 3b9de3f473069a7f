"""The watermark of a topic read in micro-batches, and which windows it closes."""

from __future__ import annotations

from pipeline.service.watermark import (
    closed_before,
    compute_watermark,
    is_late,
    is_window_complete,
    merge_latest,
)


def test_watermark_is_the_slowest_busy_partition_minus_the_bound() -> None:
    latest = {0: 1000.0, 1: 700.0, 2: 900.0}
    assert compute_watermark(latest, active_partitions={0, 1, 2}, out_of_orderness_s=60) == 640.0


def test_caught_up_partitions_do_not_hold_the_watermark_back() -> None:
    latest = {0: 1000.0, 1: 100.0}  # partition 1 has been quiet since t=100
    assert compute_watermark(latest, active_partitions={0}, out_of_orderness_s=0) == 1000.0


def test_partitions_that_never_had_data_do_not_hold_the_watermark_back() -> None:
    assert compute_watermark({0: 500.0}, active_partitions={0}, out_of_orderness_s=10) == 490.0


def test_fully_read_topic_advances_to_its_latest_event() -> None:
    latest = {0: 1000.0, 1: 400.0}
    assert compute_watermark(latest, active_partitions=set(), out_of_orderness_s=5) == 995.0


def test_watermark_never_moves_backwards() -> None:
    got = compute_watermark({0: 100.0}, active_partitions={0}, out_of_orderness_s=0, previous=500)
    assert got == 500


def test_no_events_yet_means_no_watermark() -> None:
    assert compute_watermark({}, active_partitions=set(), out_of_orderness_s=0) is None


def test_latest_event_time_per_partition_only_grows() -> None:
    assert merge_latest({0: 10.0, 1: 50.0}, {1: 20.0, 2: 5.0}) == {0: 10.0, 1: 50.0, 2: 5.0}


def test_window_completes_once_watermark_passes_end_plus_lateness() -> None:
    assert not is_window_complete(600.0, watermark=659.0, allowed_lateness_s=60)
    assert is_window_complete(600.0, watermark=660.0, allowed_lateness_s=60)
    assert not is_window_complete(600.0, watermark=None, allowed_lateness_s=0)
    assert closed_before(660.0, 60) == 600.0
    assert closed_before(None, 60) is None


def test_event_is_late_only_when_its_window_is_complete() -> None:
    # 5-minute windows; the event at t=250 belongs to [0, 300).
    assert not is_late(250.0, 300.0, watermark=359.0, allowed_lateness_s=60)
    assert is_late(250.0, 300.0, watermark=360.0, allowed_lateness_s=60)
    assert not is_late(300.0, 300.0, watermark=360.0, allowed_lateness_s=60)
    assert not is_late(250.0, 300.0, watermark=None, allowed_lateness_s=0)
