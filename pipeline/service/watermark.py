"""Event-time progress of a Kafka topic read in micro-batches, and which windows it closes.

Pure functions; `pipeline.service.state` persists the watermark and each partition's latest
event time.

The watermark is the minimum, over partitions, of the latest event time read, minus an
out-of-orderness bound: events older than that are not expected any more. Partitions that do
not hold it back:
- partitions that were *idle* in a cycle, i.e. fully caught up when the cycle started (nothing
  planned for them), including partitions that never had data. A quiet partition would
  otherwise stop every window from closing. Anything it receives later is judged against
  the watermark then and counted late if its window has already closed.
- when every partition is idle the whole topic has been read, so the watermark may move to the
  latest event time seen anywhere (minus the bound).
The watermark never moves backwards.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from pipeline.windows import window_start


def merge_latest(
    previous: Mapping[int, float], batch: Mapping[int, float]
) -> dict[int, float]:
    """Latest event time per partition after a cycle that saw `batch` (per-partition maxima)."""
    merged = dict(previous)
    for partition, event_time in batch.items():
        merged[partition] = max(event_time, merged.get(partition, event_time))
    return merged


def compute_watermark(
    latest_event_time: Mapping[int, float],
    active_partitions: Collection[int],
    out_of_orderness_s: float,
    previous: float | None = None,
) -> float | None:
    """The watermark after a cycle (None until some event has been read).

    `latest_event_time`: latest event time read so far per partition (after this cycle).
    `active_partitions`: partitions that had a backlog when the cycle started.
    """
    active = [latest_event_time[p] for p in active_partitions if p in latest_event_time]
    if active:
        candidate: float | None = min(active) - out_of_orderness_s
    elif latest_event_time and not active_partitions:
        candidate = max(latest_event_time.values()) - out_of_orderness_s
    else:
        candidate = None
    if candidate is None:
        return previous
    return candidate if previous is None else max(previous, candidate)


def closed_before(watermark: float | None, allowed_lateness_s: float) -> float | None:
    """Windows ending at or before this time are complete (None: nothing is complete yet)."""
    return None if watermark is None else watermark - allowed_lateness_s


def is_window_complete(
    window_end: float, watermark: float | None, allowed_lateness_s: float
) -> bool:
    """A window [start, end) is complete once watermark >= end + allowed lateness."""
    return watermark is not None and watermark >= window_end + allowed_lateness_s


def is_late(
    event_time: float, window_size_s: float, watermark: float | None, allowed_lateness_s: float
) -> bool:
    """True when the event's window is already complete: it is counted late and left out."""
    end = window_start(event_time, window_size_s) + window_size_s
    return is_window_complete(end, watermark, allowed_lateness_s)
