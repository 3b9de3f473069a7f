"""The watermark of a topic read in micro-batches, and which windows it closes."""

from __future__ import annotations

from ragpulse.judges.base import JudgeInput
from ragpulse.pipeline.records import InferenceRecord
from ragpulse.pipeline.service.watermark import (
    ceiling,
    closed_before,
    compute_watermark,
    holding_partitions,
    merge_latest,
)
from ragpulse.pipeline.stages.parse import admission


def is_late(
    event_time: float, window_size: float, watermark: float | None, allowed_lateness_s: float
) -> bool:
    """What ParseEvents decides for an event at `event_time`, given the watermark: late (its
    window is final), asked of the product's own admission rule."""
    event = InferenceRecord("r", event_time, "app", "model", JudgeInput("q", "a"))
    refused = admission(
        event, None, now=event_time, max_future_skew_s=300.0, window_size=window_size,
        closed_before=closed_before(watermark, allowed_lateness_s),
    )
    return refused is not None and refused[1]


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


def test_windows_close_once_the_watermark_passes_their_end_plus_lateness() -> None:
    assert closed_before(660.0, 60) == 600.0
    assert closed_before(None, 60) is None


def test_event_is_late_only_when_its_window_is_complete() -> None:
    # 5-minute windows; the event at t=250 belongs to [0, 300).
    assert not is_late(250.0, 300.0, watermark=359.0, allowed_lateness_s=60)
    assert is_late(250.0, 300.0, watermark=360.0, allowed_lateness_s=60)
    assert not is_late(300.0, 300.0, watermark=360.0, allowed_lateness_s=60)
    assert not is_late(250.0, 300.0, watermark=None, allowed_lateness_s=0)


def _late_in_a_paused_partition(idle_after_s: float) -> int:
    """Cycles every 1 s over two partitions, 0 s out-of-orderness, 5 s lateness, 10 s windows:
    partition 1's producer pauses for one cycle while partition 0's runs 20 s ahead in event
    time, then partition 1 goes on from where it was. Returns its events counted late."""
    latest: dict[int, float] = {}
    last_backlog: dict[int, float] = {}
    watermark = None
    late = 0
    # (cycle clock, {partition: event times read in that cycle})
    cycles = [
        (0.0, {0: [1.0, 2.0], 1: [1.0, 2.0]}),
        (1.0, {0: [3.0, 10.0, 22.0]}),  # partition 1 caught up for this one cycle
        (2.0, {0: [23.0], 1: [3.0, 4.0, 5.0]}),
    ]
    for clock, read in cycles:
        for partition, times in read.items():
            late += sum(is_late(t, 10.0, watermark, 5.0) for t in times)
            latest = merge_latest(latest, {partition: max(times)})
        last_backlog.update(dict.fromkeys(read, clock))
        holding = holding_partitions(last_backlog, clock, idle_after_s)
        watermark = compute_watermark(latest, holding, 0.0, previous=watermark)
    return late


def test_a_partition_caught_up_for_one_cycle_is_not_idle_within_the_grace() -> None:
    # Grace 0 (the behaviour before --partition-idle-after): the one quiet cycle let
    # partition 0 move the watermark to 22 s, closing [0, 10) for partition 1's next events.
    assert _late_in_a_paused_partition(idle_after_s=0.0) == 3
    assert _late_in_a_paused_partition(idle_after_s=60.0) == 0


def test_a_partition_idle_for_longer_than_the_grace_stops_holding_the_watermark() -> None:
    last_backlog = {0: 100.0, 1: 30.0}
    assert holding_partitions(last_backlog, now=100.0, idle_after_s=60.0) == {0}
    assert holding_partitions(last_backlog, now=89.0, idle_after_s=60.0) == {0, 1}
    assert holding_partitions(last_backlog, now=100.0, idle_after_s=70.5) == {0, 1}
    assert holding_partitions(last_backlog, now=100.0, idle_after_s=70.0) == {0}
    assert holding_partitions(last_backlog, now=100.0, idle_after_s=0.0) == {0}


def test_watermark_never_passes_the_clock_plus_the_out_of_orderness() -> None:
    now = 1_000_000.0
    year_2099 = 4_070_908_800.0
    got = compute_watermark({0: year_2099}, {0}, out_of_orderness_s=30, now=now)
    assert got == ceiling(now, 30) == now + 30
    # A watermark saved from a future-dated event by an older version is pulled back.
    assert compute_watermark({0: now - 100}, {0}, 30, previous=year_2099, now=now) == now + 30


def test_a_partition_within_its_grace_with_no_event_time_yet_holds_the_watermark() -> None:
    # After --state-reset, a partition caught up by the group's offsets has no event time in
    # the new file: until its grace passes, the other partition's events cannot pass it.
    got = compute_watermark({0: 500.0}, {0, 1}, out_of_orderness_s=0, previous=100.0)
    assert got == 100.0
    assert compute_watermark({0: 500.0}, {0}, out_of_orderness_s=0, previous=100.0) == 500.0
