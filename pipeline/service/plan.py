"""The plan of one serve cycle: which offsets it reads, from the broker's bounds and the saved
offsets, decided before anything is read. Pure: the loop (`pipeline.service.loop`) asks the
broker and the state store, hands their answers to `plan_cycle`, and logs, counts and reads
what the `CyclePlan` says.

A partition goes on from its saved offset; one the state has never seen, from the consumer
group's commit where the loop passes one (after --state-reset, or a sharded instance's new
partition), else from its log start. A start the partition can no longer continue from (the
topic was recreated, truncated or emptied, or retention deleted records before they were
read) is an `OffsetReset`, which --on-offset-reset settles: `earliest` or `latest` say where
the partition goes on and how many records that skips; `fail` refuses the plan.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter
from collections.abc import Mapping

from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.sources.kafka import (
    RECORDS_LOST,
    LogBounds,
    OffsetReset,
    OffsetResetPolicy,
    offset_resets,
    plan_batch,
    reset_starts,
)

__all__ = ["CyclePlan", "OffsetResetRefused", "check_resets", "plan_cycle"]

log = logging.getLogger(__name__)


class OffsetResetRefused(RuntimeError):
    """A saved offset is outside its partition and --on-offset-reset is `fail`."""


@dataclasses.dataclass(frozen=True, slots=True)
class CyclePlan:
    """One cycle's offsets, per partition of this instance.

    `ends`: the partitions' log ends the plan was made against; `starts`: where each partition
    goes on from (resets applied); `ranges`: the [start, stop) ranges the cycle reads,
    partitions with nothing to read left out; `resets`: the starts the partitions could not
    continue from, `reset_to` where they go on (saved before the cycle's offsets: they may move
    back) and `lost` the records that skips, by reason (`retention`, `topic_reset`).
    `refused`: there are resets and --on-offset-reset is `fail`; such a plan reads nothing.
    """

    ends: Mapping[int, int]
    starts: Mapping[int, int]
    ranges: Mapping[int, tuple[int, int]]
    resets: tuple[OffsetReset, ...] = ()
    reset_to: Mapping[int, int] = dataclasses.field(default_factory=dict)
    lost: Mapping[str, int] = dataclasses.field(default_factory=dict)
    refused: bool = False

    @property
    def stops(self) -> dict[int, int]:
        """The offset each read partition goes on from after the cycle."""
        return {p: stop for p, (_, stop) in self.ranges.items()}

    @property
    def covered(self) -> int:
        """How many offsets the cycle reads."""
        return sum(stop - start for start, stop in self.ranges.values())

    def counts(self, topic: str) -> counting.Counts:
        """The resets' counter increments: resets by kind, records skipped by reason."""
        counts: counting.Counts = Counter()
        for r in self.resets:
            counts[counting.key(catalogue.OFFSET_RESETS, topic=topic, kind=r.kind)] += 1
        for why, n in self.lost.items():
            counts[counting.key(RECORDS_LOST, topic=topic, reason=why)] += n
        return counts


def plan_cycle(
    bounds: LogBounds,
    saved: Mapping[int, int],
    *,
    max_records: int,
    on_offset_reset: OffsetResetPolicy,
    group_offsets: Mapping[int, int] | None = None,
) -> CyclePlan:
    """The plan of a cycle over `bounds` (this instance's partitions), going on from the
    `saved` offsets, reading at most `max_records` offsets (split between the partitions as
    `plan_batch` does).

    `group_offsets`: the consumer group's committed offsets, used for partitions missing from
    `saved` (the others go on from their log start).
    """
    group = group_offsets or {}
    fresh = {
        p: group.get(p, bounds.beginnings.get(p, 0)) for p in bounds.ends if p not in saved
    }
    starts = {**fresh, **saved}
    resets = tuple(
        offset_resets(starts, bounds.beginnings, bounds.ends, bounds.unconfirmed_ends)
    )
    if resets and on_offset_reset == "fail":
        return CyclePlan(bounds.ends, starts, {}, resets, refused=True)
    reset_to, lost = reset_starts(resets, on_offset_reset) if resets else ({}, {})
    starts.update(reset_to)
    ranges = plan_batch(starts, bounds.ends, max_records, bounds.beginnings)
    return CyclePlan(bounds.ends, starts, ranges, resets, reset_to, lost)


def check_resets(
    plan: CyclePlan, topic: str, state: str, on_offset_reset: OffsetResetPolicy
) -> None:
    """Log each reset of `plan` as an error and where it goes on from; raise
    OffsetResetRefused when --on-offset-reset is fail (`state`: the state file, named)."""
    if not plan.resets:
        return
    for r in plan.resets:
        log.error(
            "%s/%d: saved offset %d is %s the partition (log start %d, end %d): %s",
            topic,
            r.partition,
            r.saved,
            "beyond the end of" if r.kind == "beyond_end" else "below the log start of",
            r.log_start,
            r.log_end,
            "the topic was recreated, truncated or emptied"
            if r.kind == "beyond_end"
            else "retention deleted records before ragpulse read them",
        )
    if plan.refused:
        raise OffsetResetRefused(
            f"offsets saved in {state} are outside topic {topic!r} (partitions "
            f"{', '.join(str(r.partition) for r in plan.resets)}) and --on-offset-reset is "
            "fail: check the topic, then restart with --on-offset-reset earliest (read what "
            "the partition holds) or latest (skip to its end)"
        )
    log.error(
        "going on from offsets %s (--on-offset-reset %s); records skipped: %s",
        dict(plan.reset_to),
        on_offset_reset,
        dict(plan.lost) or "none",
    )
