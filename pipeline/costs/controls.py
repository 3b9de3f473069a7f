"""What a cost control declares to serve's cycles, and the hooks a cycle calls on it.

For whoever adds a cost control. The serve loop (pipeline/service/loop.py) names no control:
it holds a list of them (`ragpulse serve` builds it, pipeline/commands/serve.py) and calls the
same hooks on each, in the order a cycle runs: `cycle_started` before the graph,
`sampling` for the graph's sampling plan, `charge` in the cycle's transaction, `committed` once
it is, `gauges` and `zero_counters` for /metrics, `close` at the end. What a control
changes is declared, not branched on: `changes_judge_calls` (it makes a cycle judge other
events or with other judges than the settings' sampling does, so calls started ahead by those
rules would not be the cycle's) and `counts_tokens` (it counts the tokens of paid calls
itself, so the graph's token counters are left out of the cycle's counts).

`CostControl` is the base with every hook doing nothing; a control overrides what it needs.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Iterable, Mapping

from ragpulse.pipeline.costs.sampling import SamplingPlan
from ragpulse.pipeline.metrics import counting

__all__ = ["Charge", "CostControl", "CycleStart"]


@dataclasses.dataclass(frozen=True, slots=True)
class CycleStart:
    """The cycle about to run: it reads [starts[p], stops[p]) (stops only where it reads
    anything), drops events of windows ending at or before `closed_before`, and the partitions
    in `reset` start where an offset reset put them."""

    starts: Mapping[int, int]
    stops: Mapping[int, int]
    closed_before: float | None
    reset: Collection[int] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Charge:
    """A control's part of a cycle's commit: `paid`, the cycle's counts as paid for (handed on
    to the next control: the journal adds the tokens of calls it settles, the budget spends
    them); `counts`, counter increments it adds; `saves`, what the state file saves for it in
    the cycle's transaction (fields of `pipeline.service.state.CycleOutcome`)."""

    paid: counting.Counts
    counts: counting.Counts = dataclasses.field(default_factory=Counter)
    saves: Mapping[str, object] = dataclasses.field(default_factory=dict)


class CostControl:
    """A cost control's part in serve's cycles; every hook does nothing here."""

    # It changes which judge calls a cycle makes (rates set per cycle, other judges).
    changes_judge_calls: bool = False
    # It counts the tokens of paid calls itself: the graph's token counters are left out.
    counts_tokens: bool = False

    def cycle_started(self, cycle: CycleStart) -> None:
        """A cycle (or its retry) is about to run its graph."""

    def sampling(
        self, plan: SamplingPlan | None, sample_rate: float, records: int
    ) -> SamplingPlan | None:
        """The sampling plan of a cycle over `records` records (None: `sample_rate` alone)."""
        return plan

    def charge(self, paid: counting.Counts) -> Charge:
        """Its part of the cycle's commit, given the cycle's counts as paid so far."""
        return Charge(paid)

    def committed(self) -> None:
        """The cycle's transaction, with what `charge` gave, is committed."""

    def gauges(self) -> Mapping[str, float]:
        return {}

    def zero_counters(self) -> Iterable[counting.CounterKey]:
        """Counters exported at 0 from start-up (so that increase() sees their first step)."""
        return ()

    def close(self) -> None:
        """serve stops."""
