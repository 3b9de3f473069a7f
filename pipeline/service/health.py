"""What serve's /healthz answers and the snapshot its /metrics serves, owned in one place.

For whoever changes what serve exports. `Health` keeps the state of the cycles as the HTTP
threads see it: the heartbeat (the end of the last good cycle), since when cycles have failed,
when the cycle in flight began, the cycle statistics, and the `MetricsSnapshot` the collector
reads at each scrape. The serve loop tells it when a cycle begins and ends and hands it a new
snapshot after each saved cycle (`publish`); the HTTP threads only read (`snapshot`,
`healthy`), under its lock.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Collection, Iterable, Mapping

from ragpulse.pipeline.calibration import Confusion, JudgeCalibration
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.collector import CycleStats, MetricsSnapshot
from ragpulse.pipeline.service.state import StateStore

Lag = Mapping[tuple[str, int], int]


class Health:
    """Cycles' health and the exported snapshot (module docstring)."""

    def __init__(self, unhealthy_after_seconds: float) -> None:
        self._unhealthy_after = unhealthy_after_seconds
        self._lock = threading.Lock()
        self._cycles = CycleStats()
        self.heartbeat = time.time()  # start-up counts as alive until the first cycle fails
        self.first_failure: float | None = None
        self._cycle_started: float | None = None
        self._snapshot = MetricsSnapshot({}, {})

    def publish(
        self,
        state: StateStore,
        topic: str,
        *,
        gauges: Mapping[str, float],
        zero_counters: Iterable[counting.CounterKey],
        lag: Lag,
        calibrations: Mapping[str, JudgeCalibration],
        agreements: Mapping[tuple[str, str, str], Confusion] | None = None,
        counting_stopped: bool = False,
        hidden: Collection[str] = (),
    ) -> None:
        """A new snapshot from what `state` holds now, with `gauges` (the heartbeat and the
        last complete window's end added here), the counters exported at 0 until they grow,
        and the lag of every partition; `calibrations` and `agreements`, the judges against
        people (pipeline.service.labels). `counting_stopped`: another owner of this instance's
        partitions was found, so what it counted may be counted there too: its counters and
        windows are no longer exported, nor its lag (it no longer reads, so its lag would stay
        as it was while the topic moves on); its gauges and cycles are. `hidden`: counters
        kept in the state but exported by another instance (pipeline.service.labels)."""
        counts = state.counters()
        for key in [k for k in counts if k[0] in hidden]:
            del counts[key]
        for zero in zero_counters:
            counts.setdefault(zero, 0)
        complete, in_progress = state.current_windows()
        exported = {catalogue.HEARTBEAT: self.heartbeat, **gauges}
        if complete:
            exported[catalogue.LAST_COMPLETE_WINDOW_END] = max(k.window_end for k in complete)
        exemplars = state.exemplars()
        if counting_stopped:
            counts, complete, in_progress, exemplars, lag = counting.Counts(), {}, {}, {}, {}
        with self._lock:
            self._snapshot = MetricsSnapshot(
                counts, complete, in_progress, exported, lag, exemplars, self._cycles,
                calibrations=calibrations, agreements=agreements or {},
            )

    def snapshot(self) -> MetricsSnapshot:
        with self._lock:
            return self._snapshot

    def cycle_began(self) -> None:
        self._cycle_started = time.time()

    def cycle_ended(self, ok: bool, took: float | None = None) -> None:
        """Count a finished cycle; after a good one move the heartbeat, after a failed one note
        since when cycles fail. The snapshot is updated in place (only these are new)."""
        now = time.time()
        self._cycle_started = None
        if ok:
            self.first_failure = None
            self.heartbeat = now
        elif self.first_failure is None:
            self.first_failure = now
        with self._lock:
            self._cycles = self._cycles.with_cycle(ok, took)
            gauges = dict(self._snapshot.gauges)
            if ok:
                gauges[catalogue.HEARTBEAT] = self.heartbeat
            self._snapshot = dataclasses.replace(
                self._snapshot, gauges=gauges, cycles=self._cycles
            )

    def healthy(self) -> tuple[bool, str]:
        """Healthy while cycles complete; unhealthy once they have failed, or one cycle has
        run, for longer than --unhealthy-after (a hung cycle never fails)."""
        now = time.time()
        started = self._cycle_started
        if started is not None and now - started > self._unhealthy_after:
            return False, f"the cycle in flight has run for {now - started:.0f}s"
        if self.first_failure is None:
            return True, "ok"
        failing_for = now - self.first_failure
        if failing_for > self._unhealthy_after:
            return False, f"cycles have failed for {failing_for:.0f}s"
        return True, f"cycles failing for {failing_for:.0f}s"
