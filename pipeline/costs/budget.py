"""The judge budget governor: an hourly token or cost budget for the LLM judges of `serve`.

For operators paying per token: with `--judge-budget-per-hour N`, before each serve cycle the
governor picks a factor in [0, 1] that scales every sampling stratum's rate
(`pipeline.costs.sampling.SamplingPlan.governed`) so that the cycle's expected spend fits what is
left of the clock hour's budget, paced over the rest of the hour: the records still expected this
hour (the arrival rate seen between cycles times the seconds left) are budgeted for at the same
factor, so the budget is not spent in the first minutes, leaving the rest of the hour to a
thin sample. No stratum goes below `--judge-min-sample-rate` (so a budget that is spent still
leaves a weighted sample). The budget is tokens (prompt + completion), or,
with `--judge-price-table FILE`, money: the table gives each judge model's prices per million
prompt, cached prompt and completion tokens:

    gpt-4o-mini: {prompt: 0.15, cached_prompt: 0.075, completion: 0.60}

The spend is read from the token counters of each cycle's result (`ragpulse_judge_tokens_total`
increments), so it covers every judge, retry and canary; the expected cost of a cycle is its
records times the stratum shares seen so far times their rates times the spend per judged event
so far, plus three standard deviations. Before any spend is known a cycle judges a small probe
(`PROBE_EVENTS`). Once the hour's budget is spent, the floor's sample is all that is judged: its
spend is the one thing that can take the hour over the budget (a floor of 0 never does).

Every event judged carries weight 1 / the rate it was sampled at, whatever the factor of its
cycle, so window counts stay unbiased estimates (`ragpulse_judge_verdicts_weighted_total`):
spending less makes the estimate noisier, not wrong.

The spend of the current hour is saved in serve's state file with each cycle's counters, and a
restart within the same clock hour goes on from it (a deployment restarted every 12 s in the
last 6 minutes of an hour once spent 2.94 times the hour's budget, each process starting from
zero); so is its pace, the arrival rate the rest of the hour is budgeted for (restarted every
12 s without it, each process's first cycle was budgeted as if no record would come after it,
and 2 minutes spent 0.72 times the hour's budget); the spend per judged event and the strata's
shares are read back from the saved counters, so a restarted process does not probe again. The
spend of calls answered by a cycle that did not commit (a crash, a failed cycle) is counted by
the next cycle that does (`pipeline.service.journal`), probes included.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ragpulse.pipeline.costs.controls import Charge, CostControl
from ragpulse.pipeline.costs.sampling import SAMPLED, SEEN, SPEND, SamplingPlan, to_micros
from ragpulse.pipeline.errors import SettingsError, kind_of, load_settings_file
from ragpulse.pipeline.metrics import catalogue, counting

log = logging.getLogger(__name__)

__all__ = [
    "BudgetGovernor",
    "BudgetSettings",
    "HourSpend",
    "Prices",
    "load_prices",
    "spend_of",
]

TOKENS = catalogue.TOKENS
# Judged events of the first cycle of a process, before any spend per event is known.
PROBE_EVENTS = 32


@dataclasses.dataclass(frozen=True, slots=True)
class Prices:
    """One judge model's prices per million tokens."""

    prompt: float
    cached_prompt: float
    completion: float


@dataclasses.dataclass(frozen=True, slots=True)
class BudgetSettings:
    """The governor's settings (`serve` only); `prices` None: the budget is in tokens."""

    per_hour: float
    min_sample_rate: float
    prices: Prices | None = None

    @property
    def unit(self) -> str:
        return "tokens" if self.prices is None else "cost"


def spend_of(counts: Mapping[counting.CounterKey, float], prices: Prices | None) -> float:
    """The spend the token counters in `counts` stand for: tokens, or their cost at `prices`
    (prompt tokens include the cached ones, which are billed at the cached price)."""
    tokens: Counter[str] = Counter()
    for (metric, labels), n in counts.items():
        if metric == TOKENS:
            tokens[dict(labels)["kind"]] += int(n)
    if prices is None:
        return float(tokens["prompt"] + tokens["completion"])
    cached = tokens["cached_prompt"]
    return (
        (tokens["prompt"] - cached) * prices.prompt
        + cached * prices.cached_prompt
        + tokens["completion"] * prices.completion
    ) / 1e6


@dataclasses.dataclass(frozen=True, slots=True)
class HourSpend:
    """The judge budget's spend in clock hour `hour` (epoch seconds // 3600), in `unit`: what
    serve's state file saves with each cycle."""

    hour: int
    unit: str
    spent: float
    # The pace: the arrival rate (records per second) the rest of the hour is budgeted for,
    # and when (epoch seconds) and over how many records the last cycle was planned. None:
    # not known (a file from before, or no cycle planned twice yet).
    arrivals: float | None = None
    planned_at: float | None = None
    planned_records: int | None = None


class BudgetGovernor(CostControl):
    """Chooses each cycle's sampling factor from the hour's spend, and counts the spend.

    `clock` gives epoch seconds (a parameter for tests). As a serve cost control
    (`pipeline.costs.controls`) it sets each cycle's sampling rates (so it changes which judge
    calls a cycle makes) and saves the hour's spend with the cycle.
    """

    changes_judge_calls = True

    def __init__(self, settings: BudgetSettings, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self._clock = clock
        self._hour = math.floor(clock() / 3600)
        self.spent_this_hour = 0.0
        self.factor = 1.0
        # What past cycles showed: events seen per stratum, events judged, and their spend.
        self._seen: Counter[str] = Counter()
        self._judged = 0
        self._spend = 0.0
        # Pacing: when and over how many records the last cycle was planned, and the
        # smoothed arrival rate of records per second they give.
        self._last_plan: tuple[float, int] | None = None
        self._arrivals: float | None = None
        self._charged: counting.Counts = Counter()  # the cycle in flight's, once charged

    def plan_for(self, plan: SamplingPlan, records: int) -> SamplingPlan:
        """`plan` governed for a cycle over `records` records; sets `factor`."""
        self._roll_hour()
        now = self._clock()
        to_come = self._records_to_come(now, records)
        left = self.settings.per_hour - self.spent_this_hour
        floor = self.settings.min_sample_rate
        if left <= 0:
            self.factor = 0.0
        elif not self._judged or not self._spend:
            # Nothing known yet: a probe of about PROBE_EVENTS events.
            self.factor = min(1.0, PROBE_EVENTS / max(1, records))
        else:
            per_event = self._spend / self._judged
            shares = self._shares(plan)

            def expected(factor: float) -> float:
                """The cycle's expected spend plus three standard deviations: which events
                the hash keeps varies (binomially), and the last cycle before the budget
                runs out must not overshoot it."""
                governed = plan.governed(factor, floor)
                rates = {s: governed.effective(rate) for s, rate in _rates(plan).items()}
                per_record = per_event * sum(shares[s] * rates[s] for s in shares)
                cycle = records * per_record
                return cycle + 3 * math.sqrt(cycle * per_event) + to_come * per_record

            self.factor = _largest_within(expected, left)
        if self.factor < 1:
            log.info(
                "judge budget: sample rates x %.4g (not below %g) for %d records (%.0f more "
                "expected this hour); %.6g of %.6g %s spent this hour",
                self.factor, floor, records, to_come, self.spent_this_hour,
                self.settings.per_hour, self.settings.unit,
            )
        return plan.governed(self.factor, floor)

    def restore(
        self,
        hour: int,
        unit: str,
        spent: float,
        counts: Mapping[counting.CounterKey, float],
        pace: HourSpend | None = None,
    ) -> None:
        """Go on from a saved state: the spend of clock hour `hour` (kept if it is this hour
        and in this budget's unit), the saved cumulative counters (events seen per stratum,
        judged, their tokens), which stand in for a probe, and the saved `pace` (the arrival
        rate and the last plan), so that a restarted process paces its first cycle over the
        rest of the hour instead of budgeting that cycle alone for all that is left."""
        if pace is not None:
            if pace.arrivals is not None:
                self._arrivals = pace.arrivals
            if pace.planned_at is not None and pace.planned_records is not None:
                self._last_plan = (pace.planned_at, pace.planned_records)
        if hour == self._hour and unit == self.settings.unit:
            self.spent_this_hour = spent
            log.info(
                "judge budget: %.6g of %.6g %s already spent this hour (saved state)",
                spent, self.settings.per_hour, unit,
            )
        elif hour == self._hour:
            log.warning(
                "judge budget: the saved spend of this hour is in %s, the budget now in %s; "
                "this hour's spend starts from 0", unit, self.settings.unit,
            )
        self._learn(counts, spend_of(counts, self.settings.prices))

    def this_hour_with(self, spend: float) -> tuple[int, float]:
        """(clock hour, its spend) once a cycle's `spend` is added: what the cycle saves."""
        hour = math.floor(self._clock() / 3600)
        return hour, (self.spent_this_hour if hour == self._hour else 0.0) + spend

    def spend(self, counts: Mapping[counting.CounterKey, float]) -> float:
        """The spend the token counters of a cycle's `counts` stand for."""
        return spend_of(counts, self.settings.prices)

    def spend_counter(self, spend: float) -> counting.Counts:
        """The spend counter's increment for a cycle's `spend`."""
        key = counting.key(SPEND, unit=self.settings.unit)
        return Counter({key: to_micros(spend)}) if spend else Counter()

    def record(self, counts: Mapping[counting.CounterKey, float]) -> counting.Counts:
        """Takes in a committed cycle's counts; returns the spend counter's increment."""
        self._roll_hour()
        spend = spend_of(counts, self.settings.prices)
        self.spent_this_hour += spend
        self._learn(counts, spend)
        return self.spend_counter(spend)

    # ----- a serve cost control (pipeline.costs.controls) ----------------------------------
    def sampling(
        self, plan: SamplingPlan | None, sample_rate: float, records: int
    ) -> SamplingPlan:
        return self.plan_for(plan or SamplingPlan((), sample_rate), records)

    def charge(self, paid: counting.Counts) -> Charge:
        spend = self.spend(paid)
        hour, spent = self.this_hour_with(spend)
        self._charged = paid
        planned_at, planned_records = self._last_plan or (None, None)
        saved = HourSpend(
            hour, self.settings.unit, spent,
            arrivals=self._arrivals, planned_at=planned_at, planned_records=planned_records,
        )
        return Charge(paid, self.spend_counter(spend), {"hour_spend": saved})

    def committed(self) -> None:
        self.record(self._charged)
        self._charged = Counter()

    def zero_counters(self) -> list[counting.CounterKey]:
        return [counting.key(SPEND, unit=self.settings.unit)]

    def _learn(self, counts: Mapping[counting.CounterKey, float], spend: float) -> None:
        self._spend += spend
        for (metric, labels), n in counts.items():
            if metric == SEEN:
                self._seen[dict(labels)["stratum"]] += int(n)
            elif metric == SAMPLED:
                self._judged += int(n)

    def _records_to_come(self, now: float, records: int) -> float:
        """Records expected in the rest of the clock hour after this cycle's: the arrival rate
        (records per second between the starts of the last cycles, smoothed) times the
        seconds left. 0 until two cycles have been planned."""
        if self._last_plan is not None:
            then, n = self._last_plan
            if now > then:
                rate = n / (now - then)
                self._arrivals = rate if self._arrivals is None else (self._arrivals + rate) / 2
        self._last_plan = (now, records)
        seconds_left = max(0.0, (self._hour + 1) * 3600 - now)
        return (self._arrivals or 0.0) * seconds_left

    def gauges(self) -> dict[str, float]:
        self._roll_hour()
        return {
            catalogue.BUDGET_PER_HOUR: self.settings.per_hour,
            catalogue.BUDGET_SPENT_THIS_HOUR: self.spent_this_hour,
            catalogue.SAMPLE_FACTOR: self.factor,
        }

    def _roll_hour(self) -> None:
        hour = math.floor(self._clock() / 3600)
        if hour != self._hour:
            self._hour, self.spent_this_hour = hour, 0.0

    def _shares(self, plan: SamplingPlan) -> dict[str, float]:
        """Each stratum's share of the events seen so far (all in `default` before any)."""
        total = sum(self._seen[s] for s in plan.strata)
        if not total:
            return {s: float(s == plan.strata[-1]) for s in plan.strata}
        return {s: self._seen[s] / total for s in plan.strata}


def _rates(plan: SamplingPlan) -> dict[str, float]:
    return {**{r.name: r.rate for r in plan.rules}, plan.strata[-1]: plan.default_rate}


def _largest_within(expected: Callable[[float], float], limit: float) -> float:
    """The largest factor in [0, 1] whose `expected` spend is within `limit` (`expected` grows
    with the factor; bisection to 1e-4), 0 when even the floors exceed it."""
    if expected(1.0) <= limit:
        return 1.0
    low, high = 0.0, 1.0
    while high - low > 1e-4:
        mid = (low + high) / 2
        low, high = (mid, high) if expected(mid) <= limit else (low, mid)
    return low


def load_prices(path: Path, model: str) -> Prices:
    """`model`'s prices in the price table at `path`; SettingsError naming what is wrong."""
    where = f"--judge-price-table {path}"
    table = load_settings_file(path, where)
    if not isinstance(table, dict):
        raise SettingsError(f"{where}: must map judge models to their prices")
    entry: Any = table.get(model)
    if entry is None:
        raise SettingsError(
            f"{where}: no prices for the judge model {model!r} (--judge-model); it lists "
            f"{', '.join(sorted(map(str, table))) or 'nothing'}"
        )
    kinds = ("prompt", "cached_prompt", "completion")
    if not isinstance(entry, dict) or set(entry) - set(kinds):
        raise SettingsError(f"{where}: {model}: give prices for {', '.join(kinds)} only")
    for kind in ("prompt", "completion"):
        if kind not in entry:
            raise SettingsError(f"{where}: {model}: the {kind} price is missing")
    # The cached price is the prompt price when the table gives none.
    values: dict[str, Any] = {k: entry.get(k, entry["prompt"]) for k in kinds}
    for kind, value in values.items():
        # NaN was accepted, then failed every cycle after its judge calls were paid.
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise SettingsError(
                f"{where}: {model}: the {kind} price must be a finite number >= 0, got "
                f"{kind_of(value)}"
            )
    return Prices(**{k: float(v) for k, v in values.items()})
