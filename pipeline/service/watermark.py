"""Event-time progress of a Kafka topic read in micro-batches, and which windows it closes.

Pure functions; `pipeline.service.state` persists the watermark and each partition's latest
event time.

The watermark is the minimum, over partitions, of the latest event time read, minus an
out-of-orderness bound: events older than that are not expected any more. Partitions that do
not hold it back:
- partitions that are *idle*: nothing was planned for them (they were caught up when a cycle
  started) for --partition-idle-after, counted from start-up for every partition of the
  topic. Until then a partition holds the watermark at its latest event time or, when it has
  none yet, where it is. A quiet partition
  would otherwise stop every window from closing. Anything it receives later is judged
  against the watermark then and counted late if its window has already closed. The grace
  (like Flink's `WatermarkStrategy.withIdleness`) is what keeps a partition that was merely
  caught up for a cycle, while its producer wrote to another one, from being overtaken: at
  grace 0, one such cycle let the other partition move the watermark, and the quiet one's
  next events were late.
- when every partition is idle the whole topic has been read, so the watermark may move to the
  latest event time seen anywhere (minus the bound).
The watermark never moves backwards, and never passes the clock plus the out-of-orderness
(`ceiling`): events are refused beyond --max-future-skew, and a watermark saved by an older
version from a future-dated event is pulled back to it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping


def merge_latest(
    previous: Mapping[int, float], batch: Mapping[int, float]
) -> dict[int, float]:
    """Latest event time per partition after a cycle that saw `batch` (per-partition maxima)."""
    merged = dict(previous)
    for partition, event_time in batch.items():
        merged[partition] = max(event_time, merged.get(partition, event_time))
    return merged


def holding_partitions(
    last_backlog: Mapping[int, float], now: float, idle_after_s: float
) -> set[int]:
    """Partitions that hold the watermark back at `now`: those that last had a backlog
    (`last_backlog`, in the same clock as `now`; this cycle's included) less than
    `idle_after_s` ago, and those with a backlog now (at grace 0, only those)."""
    return {p for p, at in last_backlog.items() if at >= now or now - at < idle_after_s}


def ceiling(now: float, out_of_orderness_s: float) -> float:
    """The highest watermark there may be at wall-clock time `now`."""
    return now + out_of_orderness_s


def compute_watermark(
    latest_event_time: Mapping[int, float],
    active_partitions: Collection[int],
    out_of_orderness_s: float,
    previous: float | None = None,
    now: float | None = None,
) -> float | None:
    """The watermark after a cycle (None until some event has been read).

    `latest_event_time`: latest event time read so far per partition (after this cycle).
    `active_partitions`: partitions that hold it back (`holding_partitions`).
    `now`: the wall clock; the watermark is kept at or below `ceiling(now, ...)`, a previous
    one above it included.
    """
    active = [latest_event_time.get(p) for p in active_partitions]
    if any(t is None for t in active):
        # A partition within its grace that has told no event time yet (new to this state
        # file, e.g. after --state-reset or a change of --instances): its next events may be
        # the oldest, so the watermark waits for it, as a Flink source split does.
        candidate: float | None = None
    elif active:
        candidate = min(t for t in active if t is not None) - out_of_orderness_s
    elif latest_event_time and not active_partitions:
        candidate = max(latest_event_time.values()) - out_of_orderness_s
    else:
        candidate = None
    if candidate is None:
        watermark = previous
    else:
        watermark = candidate if previous is None else max(previous, candidate)
    if watermark is not None and now is not None:
        watermark = min(watermark, ceiling(now, out_of_orderness_s))
    return watermark


def closed_before(watermark: float | None, allowed_lateness_s: float) -> float | None:
    """Windows ending at or before this time are complete (None: nothing is complete yet)."""
    return None if watermark is None else watermark - allowed_lateness_s


def final_before(
    watermark: float | None, allowed_lateness_s: float, held: float | None
) -> float | None:
    """The cut-off of final windows: `closed_before(watermark, ...)`, held back to `held`
    where open conversations hold it (`pipeline.service.conversations.hold`; None: nothing
    held)."""
    cutoff = closed_before(watermark, allowed_lateness_s)
    if cutoff is None or held is None:
        return cutoff
    return min(cutoff, held)


def starting_watermark(
    saved: float | None, now: float, out_of_orderness_s: float
) -> float | None:
    """The saved watermark a cycle starts from. One saved from a future-dated event (before
    --max-future-skew) would close every window for this cycle too: it is pulled back to the
    ceiling at once."""
    return None if saved is None else min(saved, ceiling(now, out_of_orderness_s))
