"""Counts gathered while judging, keyed by Prometheus metric name and labels.

Beam counters carry them out of the workers (their names encode the metric and its labels);
the driver decodes them into `Counts`, the state store persists them, and
`pipeline.metrics.collector` exposes them. Keeping one representation is what lets `serve` restore
`_total` counters after a restart without ever going backwards.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping

import orjson

from ragpulse.pipeline.metrics import catalogue

Labels = tuple[tuple[str, str], ...]
CounterKey = tuple[str, Labels]
Counts = Counter[CounterKey]

# Upper bounds of the judge latency histogram, in seconds.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
# The Beam metric namespace of counters that become Prometheus counters.
COUNTER_NAMESPACE = "ragpulse"
VERDICTS = catalogue.VERDICTS
# Judges not run on an event that lacks their required field (`missing`: the input names).
SKIPPED = catalogue.SKIPPED
# Verdicts of ensembles (judges.llm.ensemble) by their members' agreement.
ENSEMBLE_VOTES = catalogue.ENSEMBLE_VOTES
# Scores of judges on a graded scale, exported as the summary `ragpulse_judge_score`
# (_sum and _count); the sum is kept in thousandths so that it adds up as an integer.
SCORE_COUNT = catalogue.SCORE_COUNT
SCORE_SUM_MILLI = catalogue.SCORE_SUM_MILLI


def milli(score: float) -> int:
    """A score in thousandths (how score sums are counted)."""
    return round(score * 1000)
# Counters saved in millionths of a unit (weights, spend) and exported divided by MICRO.
MICRO = 1_000_000
MICRO_COUNTERS = frozenset({catalogue.WEIGHTED_VERDICTS, catalogue.WEIGHTS, catalogue.SPEND})


def exported(metric: str, value: float) -> float:
    """A saved counter's value as Prometheus shows it (millionths back to units)."""
    return value / MICRO if metric in MICRO_COUNTERS else value


# Groundedness verdicts by the context_sufficiency verdict of the same answer.
GROUNDED_BY_CONTEXT = catalogue.GROUNDED_BY_CONTEXT
# OpenMetrics caps an exemplar's label names and values at 128 characters together; Prometheus
# drops a longer one.
EXEMPLAR_LABEL = "request_id"
MAX_EXEMPLAR_REQUEST_ID_CHARS = 128 - len(EXEMPLAR_LABEL)
LATENCY_BUCKET = catalogue.LATENCY_BUCKET  # non-cumulative count per `le`
LATENCY_SUM_US = catalogue.LATENCY_SUM_US
LATENCY_COUNT = catalogue.LATENCY_COUNT


# The chatbot's own cost and latency, per app and model (pipeline.formats.events.AgentUsage), for
# every accepted event: Agent Evaluation's agent/input_token_count, output and total.
AGENT_INPUT_TOKENS = catalogue.AGENT_INPUT_TOKENS
AGENT_OUTPUT_TOKENS = catalogue.AGENT_OUTPUT_TOKENS
AGENT_TOTAL_TOKENS = catalogue.AGENT_TOTAL_TOKENS
# Events that gave token counts: the denominator of tokens per answer.
AGENT_USAGE_EVENTS = catalogue.AGENT_USAGE_EVENTS
AGENT_LATENCY_BUCKET = catalogue.AGENT_LATENCY_BUCKET  # non-cumulative count per `le`
AGENT_LATENCY_SUM_US = catalogue.AGENT_LATENCY_SUM_US
AGENT_LATENCY_COUNT = catalogue.AGENT_LATENCY_COUNT
# Upper bounds of the chatbot latency histogram, in seconds: an answer takes 0.1 s to minutes.
AGENT_LATENCY_BUCKETS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 20.0, 30.0, 60.0, 120.0,
)


def key(metric: str, **labels: str) -> CounterKey:
    """The counter key for `metric` with `labels` (label order does not matter).

    A `judge` of the form "<judge>/<name>" (a named guideline, graded on its own) becomes
    `judge` and `guideline` labels, so a judge's series still sum up by `judge`.
    """
    judge = labels.get("judge")
    if judge is not None and "/" in judge:
        labels = {**labels, **judge_labels(judge)}
    return metric, tuple(sorted(labels.items()))


def judge_labels(judge: str) -> dict[str, str]:
    """The labels of a verdict's judge: {"judge": j} or, for "j/name", also {"guideline": name}."""
    name, sep, guideline = judge.partition("/")
    return {"judge": name, "guideline": guideline} if sep else {"judge": judge}


def encode(counter_key: CounterKey) -> str:
    """A Beam counter name for the key; JSON so label values may hold any character."""
    return orjson.dumps([counter_key[0], dict(counter_key[1])]).decode()


def decode(name: str) -> CounterKey:
    """Inverse of `encode`."""
    metric, labels = orjson.loads(name)
    return metric, tuple(sorted(labels.items()))


def latency_bucket(seconds: float, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> str:
    """The `le` label of the bucket that holds `seconds` (`+Inf` past the last bound)."""
    for bound in bounds:
        if seconds <= bound:
            return repr(bound)
    return "+Inf"


def merge(*parts: Mapping[CounterKey, float] | Iterable[tuple[CounterKey, float]]) -> Counts:
    """Sum several sets of counts."""
    total: Counts = Counter()
    for part in parts:
        items = part.items() if isinstance(part, Mapping) else part
        for k, v in items:
            total[k] += int(v)
    return total


@dataclasses.dataclass(frozen=True, slots=True)
class FailingExample:
    """The exemplar of one failing verdict series: which answer, and its event time."""

    request_id: str
    timestamp: float  # epoch seconds


# Conversations (pipeline.stages.sessions): judged, and judged on their last turns only.
SESSIONS_JUDGED = catalogue.SESSIONS_JUDGED
SESSIONS_TRUNCATED = catalogue.SESSIONS_TRUNCATED
