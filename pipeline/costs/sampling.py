"""Stratified sampling: which share of each kind of event is judged, and the weight that undoes it.

For operators who judge with a paid LLM and cannot judge every event: a rules file
(`--sampling-rules FILE`, or `sampling-rules: FILE` in the `--config` file) names strata, e.g.
every event with negative user feedback, half of a new model's answers, 5 % of the rest:

    rules:                                  # the first rule that matches an event wins
      - name: negative_feedback             # the `stratum` label value: [a-z0-9_], unique
        when: {feedback: [negative, thumbs_down]}
        rate: 1.0
      - name: new_model
        when: {model: gpt-4o-2026-05, app: support-bot}   # every field listed must match
        rate: 0.5
    default_rate: 0.05                      # the `default` stratum; without it, --sample-rate

`when` reads the event's `app`, `model` and `feedback` fields (pipeline/formats/events.py), each
matched against one string or a list of strings. Which events are kept is decided by the same hash
of request_id as plain sampling (`is_sampled` below), at the stratum's rate.

A judged event of a stratum sampled at rate p stands for 1/p events (inverse-probability, or
Horvitz-Thompson, weighting): summed weights estimate population counts without bias, so
weighted yes / (yes + no) estimates the population's pass ratio even though negative-feedback
events, which fail more often, are judged 20 times as often as the rest. The unweighted counts
(`ragpulse_judge_verdicts_total`) stay as they were: they describe what was judged.

Weights are not integers and Beam counters and the state store hold integers, so weighted
counts travel and are saved in millionths (`to_micros`) and exported divided back
(`pipeline.metrics.counting.MICRO_COUNTERS`): the rounding is at most half a millionth per event.

Where the weighted counts go: `ragpulse_judge_verdicts_weighted_total` (both commands; the
recording rule `judge_app_model:ragpulse_judge_weighted_pass_ratio:ratio_rate<w>` sums it over
strata into the pass ratio of all traffic), and per event-time window
(`pipeline.stages.weighted`), which `ragpulse run` prints beside each window's ratio; `serve`
does not save weighted windows in its state file.

The budget governor (`pipeline.costs.budget`) scales every stratum's rate for a serve cycle
(`SamplingPlan.governed`); an event's weight is 1 over the rate it was sampled at, so windows
whose cycles ran at different rates still add up to unbiased estimates.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ragpulse.pipeline.errors import kind_of, load_settings_file
from ragpulse.pipeline.metrics import catalogue, counting

_SCALE = float(2**64)


def sample_point(request_id: str) -> float:
    """A stable number in [0, 1) derived from the request id (BLAKE2b, 64 bits)."""
    digest = hashlib.blake2b(request_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / _SCALE


def sampling_key(request_id: str, session_id: str | None) -> str:
    """What an event's sampling decision hashes: its conversation's id when it names one (a
    conversation is sampled whole, so the per-answer and the session judges see the same
    conversations), else its request id."""
    return f"session:{session_id}" if session_id is not None else request_id


def is_sampled(request_id: str, rate: float) -> bool:
    """True when the event belongs to the sample at `rate` (0 keeps none, 1 keeps all).

    The decision depends on the request id alone, so the same event gets the same decision on
    every runner, in every order and after every restart: a replayed partition never samples
    differently and counts stay exactly-once.
    """
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"sample rate must be within [0, 1], got {rate}")
    return sample_point(request_id) < rate


__all__ = [
    "DEFAULT_STRATUM",
    "MATCH_FIELDS",
    "SamplingPlan",
    "SamplingRule",
    "is_sampled",
    "load_plan",
    "plan_from_data",
    "sample_point",
    "sampling_key",
]

# The event fields a rule may match (InferenceRecord attributes of the same names).
MATCH_FIELDS = ("app", "model", "feedback")
DEFAULT_STRATUM = "default"
_NAME = re.compile(r"^[a-z0-9_]{1,64}$")
_RULE_KEYS = {"name", "when", "rate"}
_FILE_KEYS = {"rules", "default_rate"}

WEIGHTED_VERDICTS = catalogue.WEIGHTED_VERDICTS
SEEN = catalogue.SEEN
SAMPLED = catalogue.SAMPLED
WEIGHTS = catalogue.WEIGHTS
SPEND = catalogue.SPEND  # the budget governor's (pipeline.costs.budget)
# Counters saved in millionths of a unit (their unit is the metrics' concern: counting.py).
MICRO = counting.MICRO



class SamplingRulesError(ValueError):
    """A rules file that cannot be used; the message names the file and the rule."""


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingRule:
    """One stratum: the events whose fields all hold one of the listed values, and its rate."""

    name: str
    rate: float
    when: tuple[tuple[str, frozenset[str]], ...]

    def matches(self, event: Any) -> bool:
        # A loop, not all(...) over a generator: this runs for every event and rule.
        for field, values in self.when:  # noqa: SIM110
            if getattr(event, field) not in values:
                return False
        return True


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingPlan:
    """The strata and their rates, scaled by the budget governor's factor for one cycle.

    `factor` multiplies every rate, never taking one below `floor` (nor raising one that was
    already below it): the governor's `--judge-min-sample-rate`.
    """

    rules: tuple[SamplingRule, ...]
    default_rate: float
    factor: float = 1.0
    floor: float = 0.0

    def stratum_of(self, event: Any) -> tuple[str, float]:
        """(stratum, effective sample rate) of an event: the first matching rule, else default."""
        for rule in self.rules:
            if rule.matches(event):
                return rule.name, self.effective(rule.rate)
        return DEFAULT_STRATUM, self.effective(self.default_rate)

    def effective(self, rate: float) -> float:
        if self.factor >= 1.0:
            return rate
        return min(rate, max(self.floor, rate * self.factor))

    def governed(self, factor: float, floor: float) -> SamplingPlan:
        """This plan with every rate scaled by `factor` (within [0, 1]) down to `floor`."""
        return dataclasses.replace(self, factor=min(1.0, max(0.0, factor)), floor=floor)

    @property
    def strata(self) -> tuple[str, ...]:
        return (*(r.name for r in self.rules), DEFAULT_STRATUM)


def to_micros(weight: float) -> int:
    """A weight in the integer millionths that counters carry."""
    return round(weight * MICRO)


def load_plan(path: Path, default_rate: float) -> SamplingPlan:
    """The plan of the rules file at `path`; `default_rate` (--sample-rate) unless it sets one.

    Raises SamplingRulesError naming the file and, for a bad rule, its number and name.
    """
    where = f"sampling rules {path}"
    data = load_settings_file(path, where, SamplingRulesError)
    try:
        return plan_from_data(data, default_rate)
    except SamplingRulesError as exc:
        raise SamplingRulesError(f"{where}: {exc}") from None


def plan_from_data(data: Any, default_rate: float) -> SamplingPlan:
    """The plan of already-loaded rules (`load_plan` reads the file)."""
    if not isinstance(data, dict):
        raise SamplingRulesError("the top level must be a mapping with 'rules'")
    unknown = set(data) - _FILE_KEYS
    if unknown:
        raise SamplingRulesError(
            f"unknown key {sorted(map(str, unknown))[0]!r} (known: default_rate, rules)"
        )
    raw_rules = data.get("rules")
    if not isinstance(raw_rules, list) or not raw_rules:
        raise SamplingRulesError("'rules' must be a non-empty list of rules")
    if "default_rate" in data:
        default_rate = _rate(data["default_rate"], "default_rate")
    rules: list[SamplingRule] = []
    taken = {DEFAULT_STRATUM}  # a set: the names checked in linear time (100,000 rules)
    for i, raw in enumerate(raw_rules, start=1):
        rule = _rule(raw, i)
        if rule.name in taken:
            raise SamplingRulesError(
                f"rule {i} ({rule.name}): the name is already taken"
                + (" by the stratum of unmatched events" if rule.name == DEFAULT_STRATUM else "")
            )
        rules.append(rule)
        taken.add(rule.name)
    return SamplingPlan(tuple(rules), default_rate)


def _rule(raw: Any, i: int) -> SamplingRule:
    name = raw.get("name") if isinstance(raw, dict) else None
    where = f"rule {i}" + (f" ({name})" if isinstance(name, str) else "")
    if not isinstance(raw, dict):
        raise SamplingRulesError(f"{where}: must be a mapping with name, when and rate")
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise SamplingRulesError(
            f"{where}: unknown key {sorted(map(str, unknown))[0]!r} (known: name, when, rate)"
        )
    if not isinstance(name, str) or not _NAME.match(name):
        raise SamplingRulesError(
            f"{where}: 'name' must be 1-64 characters of a-z, 0-9 and _ (it is a label value)"
        )
    if "rate" not in raw:
        raise SamplingRulesError(f"{where}: 'rate' is missing")
    rate = _rate(raw["rate"], f"{where}: 'rate'")
    when = raw.get("when")
    if not isinstance(when, dict) or not when:
        raise SamplingRulesError(
            f"{where}: 'when' must map one or more of {', '.join(MATCH_FIELDS)} to a value "
            "or a list of values"
        )
    conditions = []
    for field, value in when.items():
        if field not in MATCH_FIELDS:
            raise SamplingRulesError(
                f"{where}: cannot match on {field!r}; rules read {', '.join(MATCH_FIELDS)}"
            )
        values = value if isinstance(value, list) else [value]
        if not values or not all(isinstance(v, str) and v.strip() for v in values):
            raise SamplingRulesError(
                f"{where}: {field} must be a non-blank string or a list of them"
            )
        # Event labels are stripped when parsed (pipeline/formats/events.py): match them the same
        # way.
        conditions.append((field, frozenset(v.strip() for v in values)))
    return SamplingRule(name, rate, tuple(conditions))


def _rate(value: Any, where: str) -> float:
    # `not 0 <= value <= 1` is also true of NaN.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise SamplingRulesError(f"{where} must be a number within [0, 1], got {kind_of(value)}")
    return float(value)


# --- counting ---------------------------------------------------------------------------------


def tally_weighted(
    tally: Counter[tuple[Any, ...]], stratum: str, weight: float,
    versioned: Iterable[tuple[Any, str]], app: str, model: str,
) -> None:
    """Adds one judged event's weighted verdicts, each with its judge's prompt version, to a
    `pipeline.stages.judge._tally` counter (skipped judges have no verdict to weigh)."""
    micros = to_micros(weight)
    for v, version in versioned:
        if v.rating != "skipped":
            tally["weighted_verdict", v.judge, version, v.rating, stratum, app, model] += micros


def counter_key(k: tuple[Any, ...]) -> counting.CounterKey | None:
    """The counter key of a `tally_weighted` entry, None for any other entry."""
    match k:
        case ("weighted_verdict", judge, version, rating, stratum, app, model):
            return counting.key(
                WEIGHTED_VERDICTS, judge=judge, version=version, rating=rating, stratum=stratum,
                app=app, model=model,
            )
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class WeightedCounts:
    """Summed weights of each rating in one window: estimated verdicts in all traffic."""

    yes: float = 0.0
    no: float = 0.0
    error: float = 0.0

    def __add__(self, other: WeightedCounts) -> WeightedCounts:
        return WeightedCounts(self.yes + other.yes, self.no + other.no, self.error + other.error)

    @property
    def pass_ratio(self) -> float | None:
        """Weighted yes / (yes + no), errors excluded as in the unweighted ratio."""
        graded = self.yes + self.no
        return self.yes / graded if graded else None
