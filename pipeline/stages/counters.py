"""Beam counters created on first use, one per counter key (metric name and labels): how the
stages' counts leave the workers (decoded by pipeline.graphs.bounded.decode_metrics)."""

from __future__ import annotations

from typing import Any

from apache_beam.metrics import Metrics

from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.counting import COUNTER_NAMESPACE


class Counters:
    """Beam counters created on first use, named by `pipeline.metrics.counting.encode`."""

    def __init__(self) -> None:
        self._cache: dict[counting.CounterKey, Any] = {}

    def inc(self, counter_key: counting.CounterKey, n: int = 1) -> None:
        counter = self._cache.get(counter_key)
        if counter is None:
            counter = Metrics.counter(COUNTER_NAMESPACE, counting.encode(counter_key))
            self._cache[counter_key] = counter
        counter.inc(n)
