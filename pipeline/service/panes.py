"""The windows `ragpulse exporter` knows: the latest pane of each window of the ratings topic.

`ragpulse stream` publishes accumulating panes (`pipeline.formats.rating_rows`): a later pane of
a window holds everything the earlier ones did. So the table keeps only the latest pane of each
window (by pane index), and a pane read again, or read after a later one, changes nothing.
What it exports, through serve's collector (`pipeline.metrics.collector`):

- `ragpulse_judge_verdicts_total{judge,rating,app,model}`: the sum over windows of their
  latest pane's counts; a later pane of the same window replaces its earlier count, so the
  counter is what serve would have counted for the same verdicts;
- the window gauges of the latest complete window per series (`ragpulse_judge_pass_ratio`,
  `..._window_samples`, the Wilson bounds) from on-time and late panes, and the in-progress
  ones (`ragpulse_judge_in_progress_*`) from windows that have only early panes;
- `ragpulse_last_complete_window_end_timestamp_seconds`.

A pane of a window starting more than `max_future_skew` ahead of the clock is ignored and
logged: the stream refuses such events (--max-future-skew), and one pane dated 2099 would
otherwise be the newest window for good, folding every real window into the counters as it
arrives (the window gauges froze).

Windows ending `retention` before the newest window's end are folded into the counters and
forgotten (the latest complete window of each series is kept for its gauges): no pane comes
for them once the stream's allowed lateness has passed, so keep `retention` above it. A pane
of a window already folded is ignored and logged.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from collections.abc import Mapping

from ragpulse.judges.base import RATINGS
from ragpulse.pipeline.formats.rating_rows import RatingPane
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot
from ragpulse.pipeline.windows import RatingCounts, WindowKey, isoformat_utc

log = logging.getLogger(__name__)

Series = tuple[str, str, str, str]  # judge, version, app, model


def verdict_counts(key: WindowKey, counts: RatingCounts) -> Counter[counting.CounterKey]:
    """The `ragpulse_judge_verdicts_total` increments a window's counts stand for, and a graded
    scale's `ragpulse_judge_score` sum and count."""
    labels = {"judge": key.judge, "version": key.version, "app": key.app, "model": key.model}
    increments = Counter(
        {
            counting.key(counting.VERDICTS, rating=rating, **labels): n
            for rating, n in zip(RATINGS, (counts.yes, counts.no, counts.error), strict=True)
        }
    )
    if counts.scored:
        increments[counting.key(counting.SCORE_COUNT, **labels)] += counts.scored
        increments[counting.key(counting.SCORE_SUM_MILLI, **labels)] += counts.score_milli
    return increments


class PaneTable:
    """Latest pane per window, and the folded counts of windows past `retention_seconds`."""

    def __init__(
        self, retention_seconds: float, max_future_skew_seconds: float = 300.0
    ) -> None:
        self._retention = retention_seconds
        self._max_future_skew = max_future_skew_seconds
        self._panes: dict[WindowKey, RatingPane] = {}
        # Min-heap of the kept windows by end: (end, start, judge, version, app, model).
        self._ends: list[tuple[float, float, str, str, str, str]] = []
        self._folded: Counter[counting.CounterKey] = Counter()
        self._folded_latest: dict[Series, tuple[WindowKey, RatingCounts]] = {}
        self._newest_end = float("-inf")

    @property
    def horizon(self) -> float:
        """Windows ending at or before this are folded."""
        return self._newest_end - self._retention

    def apply(self, pane: RatingPane, now: float | None = None) -> bool:
        """Take one pane read from the topic at `now` (default: the clock); False when it
        changes nothing."""
        key = pane.key
        now = time.time() if now is None else now
        if key.window_start > now + self._max_future_skew:
            log.warning(
                "ignored a %s pane of the window %s..%s (%s, %s, %s): it starts more than "
                "--max-future-skew after the clock (%s); its events were dated in the future",
                pane.timing, isoformat_utc(key.window_start), isoformat_utc(key.window_end),
                key.judge, key.app, key.model, isoformat_utc(now),
            )
            return False
        if key.window_end <= self.horizon:
            log.warning(
                "ignored a %s pane of the window %s..%s (%s, %s, %s): windows ending before %s "
                "are already folded into the counters (raise --retention above the stream's "
                "--allowed-lateness)",
                pane.timing, isoformat_utc(key.window_start), isoformat_utc(key.window_end),
                key.judge, key.app, key.model, isoformat_utc(self.horizon),
            )
            return False
        current = self._panes.get(key)
        if current is not None and current.index >= pane.index:
            return False
        if current is None:
            heapq.heappush(
                self._ends,
                (key.window_end, key.window_start, key.judge, key.version, key.app, key.model),
            )
        self._panes[key] = pane
        if key.window_end > self._newest_end:
            self._newest_end = key.window_end
            self._fold()
        return True

    def _fold(self) -> None:
        horizon = self.horizon
        while self._ends and self._ends[0][0] <= horizon:
            end, start, judge, version, app, model = heapq.heappop(self._ends)
            key = WindowKey(start, end, judge, app, model, version)
            pane = self._panes.pop(key)
            self._folded.update(verdict_counts(key, pane.counts))
            series = (key.judge, key.version, key.app, key.model)
            kept = self._folded_latest.get(series)
            if pane.complete and (kept is None or kept[0].window_end < key.window_end):
                self._folded_latest[series] = (key, pane.counts)

    def __len__(self) -> int:
        return len(self._panes)

    def snapshot(self, gauges: Mapping[str, float] | None = None) -> MetricsSnapshot:
        """What /metrics shows now; `gauges` are added to the table's own."""
        counts = Counter(self._folded)
        complete: dict[WindowKey, RatingCounts] = dict(self._folded_latest.values())
        in_progress: dict[WindowKey, RatingCounts] = {}
        for key, pane in self._panes.items():
            counts.update(verdict_counts(key, pane.counts))
            (complete if pane.complete else in_progress)[key] = pane.counts
        all_gauges = dict(gauges or {})
        if complete:
            all_gauges[catalogue.LAST_COMPLETE_WINDOW_END] = max(
                k.window_end for k in complete
            )
        return MetricsSnapshot(
            counts=counts, complete=complete, in_progress=in_progress, gauges=all_gauges
        )
