"""`plan_cycle`, the serve cycle's plan, on plain values: where each partition goes on from,
the resets --on-offset-reset settles and the records they skip, and the cycle's cap split
between the partitions."""

from __future__ import annotations

from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.service.plan import CyclePlan, plan_cycle
from ragpulse.pipeline.sources.kafka import LogBounds, OffsetReset


def bounds(*parts: tuple[int, int, int], unconfirmed: frozenset[int] = frozenset()) -> LogBounds:
    """LogBounds from (partition, log start, log end) triples."""
    return LogBounds({p: b for p, b, _ in parts}, {p: e for p, _, e in parts}, unconfirmed)


def test_a_partition_goes_on_from_its_saved_offset_up_to_its_end() -> None:
    plan = plan_cycle(bounds((0, 0, 30)), {0: 12}, max_records=100, on_offset_reset="earliest")
    assert plan == CyclePlan(ends={0: 30}, starts={0: 12}, ranges={0: (12, 30)})
    assert plan.stops == {0: 30}
    assert plan.covered == 18


def test_a_new_partition_starts_at_its_log_start() -> None:
    plan = plan_cycle(
        bounds((0, 0, 10), (1, 25, 40)), {0: 10}, max_records=100, on_offset_reset="earliest"
    )
    assert plan.starts == {0: 10, 1: 25}
    assert plan.ranges == {1: (25, 40)}
    assert plan.resets == ()


def test_a_new_partition_goes_on_from_the_groups_commit_where_there_is_one() -> None:
    plan = plan_cycle(
        bounds((0, 0, 50), (1, 0, 50)),
        {},
        max_records=100,
        on_offset_reset="earliest",
        group_offsets={0: 44, 2: 9},
    )
    assert plan.ranges == {0: (44, 50), 1: (0, 50)}


def test_the_groups_commit_does_not_override_a_saved_offset() -> None:
    plan = plan_cycle(
        bounds((0, 0, 50)), {0: 20}, max_records=100, on_offset_reset="earliest",
        group_offsets={0: 44},
    )
    assert plan.ranges == {0: (20, 50)}


def test_empty_and_caught_up_partitions_have_no_range() -> None:
    plan = plan_cycle(
        bounds((0, 0, 0), (1, 7, 7), (2, 0, 5)), {2: 5}, max_records=100,
        on_offset_reset="earliest",
    )
    assert plan == CyclePlan(ends={0: 0, 1: 7, 2: 5}, starts={0: 0, 1: 7, 2: 5}, ranges={})
    assert plan.covered == 0


def test_the_cap_is_split_between_the_partitions_with_a_backlog() -> None:
    plan = plan_cycle(
        bounds((0, 0, 2), (1, 0, 1000), (2, 0, 1000)), {}, max_records=100,
        on_offset_reset="earliest",
    )
    assert plan.ranges == {0: (0, 2), 1: (0, 49), 2: (0, 49)}
    assert plan.covered == 100


def test_a_saved_offset_below_the_log_start_is_reset_and_counts_what_retention_deleted() -> None:
    plan = plan_cycle(bounds((0, 20, 50)), {0: 5}, max_records=100, on_offset_reset="earliest")
    assert plan.resets == (OffsetReset(0, 5, 20, 50, "below_start"),)
    assert plan.reset_to == {0: 20}
    assert plan.lost == {"retention": 15}
    assert plan.ranges == {0: (20, 50)}
    assert plan.counts("t") == {
        counting.key("ragpulse_offset_resets_total", topic="t", kind="below_start"): 1,
        counting.key("ragpulse_records_lost_total", topic="t", reason="retention"): 15,
    }


def test_a_saved_offset_beyond_the_end_goes_on_from_the_log_start_with_earliest() -> None:
    plan = plan_cycle(bounds((0, 0, 30)), {0: 100}, max_records=100, on_offset_reset="earliest")
    assert plan.resets == (OffsetReset(0, 100, 0, 30, "beyond_end"),)
    assert plan.reset_to == {0: 0}
    assert plan.lost == {}  # the recreated partition is read whole
    assert plan.ranges == {0: (0, 30)}


def test_latest_skips_to_the_end_and_counts_what_the_partition_still_held() -> None:
    plan = plan_cycle(
        bounds((0, 0, 30), (1, 20, 50)), {0: 100, 1: 5}, max_records=100,
        on_offset_reset="latest",
    )
    assert plan.reset_to == {0: 30, 1: 50}
    assert plan.starts == {0: 30, 1: 50}
    assert plan.lost == {"retention": 15, "topic_reset": 30 + 30}
    assert plan.ranges == {}


def test_fail_refuses_the_plan_and_reads_nothing() -> None:
    plan = plan_cycle(
        bounds((0, 0, 30), (1, 0, 10)), {0: 100}, max_records=100, on_offset_reset="fail"
    )
    assert plan.refused
    assert plan.resets == (OffsetReset(0, 100, 0, 30, "beyond_end"),)
    assert plan.ranges == {}
    assert plan.reset_to == {}


def test_fail_plans_as_usual_when_no_offset_needs_a_reset() -> None:
    plan = plan_cycle(bounds((0, 0, 30)), {0: 10}, max_records=100, on_offset_reset="fail")
    assert not plan.refused
    assert plan.ranges == {0: (10, 30)}


def test_an_end_no_fetch_confirmed_is_not_a_reset() -> None:
    plan = plan_cycle(
        bounds((0, 0, 1), unconfirmed=frozenset({0})), {0: 100}, max_records=100,
        on_offset_reset="fail",
    )
    assert plan == CyclePlan(ends={0: 1}, starts={0: 100}, ranges={})


def test_a_groups_commit_outside_the_partition_is_reset_too() -> None:
    plan = plan_cycle(
        bounds((0, 40, 60)), {}, max_records=100, on_offset_reset="earliest",
        group_offsets={0: 10},
    )
    assert plan.resets == (OffsetReset(0, 10, 40, 60, "below_start"),)
    assert plan.ranges == {0: (40, 60)}


def test_the_bounds_of_one_instance_keep_only_its_partitions() -> None:
    every = bounds((0, 0, 5), (1, 0, 6), (2, 0, 7), (3, 1, 8), unconfirmed=frozenset({1, 2}))
    assert every.only(lambda p: p % 2 == 0) == bounds(
        (0, 0, 5), (2, 0, 7), unconfirmed=frozenset({2})
    )
