"""The judge cascade: the local judges on every event, the LLM judges on a sample of them and on
the events the local judges are least sure of.

For operators who want a verdict on every event at a fraction of the LLM's cost. With
`--cascade-llm-sample-rate R` (and `--judge-backend openai`), the `JudgeEvents` stage grades
each event with the local judges of `--judges`, then sends to the LLM judges:

* a share R of the events, chosen by a hash of the question and answer (`sample`): their
  agreement counts estimate how often the local judges agree with the LLM on all traffic;
* the events on which some local judge's rating is within `--cascade-uncertainty-band` of
  flipping (`uncertain`): a judge with a `margin(item)` method (groundedness,
  relevance_to_query) says how far its rating is from its threshold; judges without one send
  events to the LLM only through the sample;
* golden-set canaries (they test the LLM judges).

With `--judge-logprobs` the LLM verdicts carry P(yes), and the same band says when the LLM is
unsure too: a verdict with P(yes) within the band of 0.5 is counted in
`ragpulse_cascade_llm_unsure_total{judge, selected}` (it stays the event's verdict), so an
operator sees how many escalated events neither tier could settle.

An event's verdicts are the LLM's where it ran (an LLM `error` included, so outages stay
visible as errors) and the local judges' otherwise: every event has a verdict, so the window
ratios are not weighted for the cascade; they mix both judges, and the agreement counts
(`ragpulse_cascade_agreement_total{judge, agree, selected}`, both ratings yes or no) say how
much that mix can differ from the LLM alone. Sampling weights (`pipeline.costs.sampling`) still
apply to which events reach the judges at all.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Sequence
from concurrent.futures import Future
from typing import Any, ClassVar, Protocol, runtime_checkable

from ragpulse.judges import JudgeSpec
from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.judges.local.judge import build_local_judges
from ragpulse.judges.panel import JudgePanel
from ragpulse.pipeline.costs.sampling import sample_point
from ragpulse.pipeline.metrics import catalogue, counting

AGREEMENT = catalogue.CASCADE_AGREEMENT
UNSURE = catalogue.CASCADE_UNSURE


@dataclasses.dataclass(frozen=True, slots=True)
class CascadeSettings:
    """The cascade's share of events sent to the LLM, and its uncertainty band.

    It judges with other judges than the settings name (the local ones on every event, the
    LLM on a share), in panels of each Beam bundle's own: as a serve cost control it changes
    which judge calls a cycle makes (`pipeline.costs.controls`), and it has no hooks."""

    llm_sample_rate: float
    uncertainty_band: float

    changes_judge_calls: ClassVar[bool] = True


@runtime_checkable
class HasMargin(Protocol):
    """A local judge that can say how far its rating of an item is from flipping."""

    def margin(self, item: JudgeInput) -> float: ...


def _hash_point(item: JudgeInput) -> float:

    return sample_point(f"{item.question}\0{item.answer}")


class CascadePanel:
    """A judge panel (the `JudgePanel` interface `JudgeEvents` uses) running the cascade."""

    def __init__(self, spec: JudgeSpec, settings: CascadeSettings) -> None:
        self._settings = settings
        self._local_judges = build_local_judges(spec.names)
        self._local = JudgePanel(self._local_judges, spec.batch_deadline_seconds)
        self._llm = spec.build()
        # The LLM verdicts' scores are P(yes) (binary judges with --judge-logprobs).
        self._probabilities = spec.logprobs
        # The `version` label of the cascade's verdicts: the LLM prompt's, marked as mixed
        # with the local judges' (which verdict an event got depends on the event).
        self.prompt_versions = tuple(f"{v}+local" for v in self._llm.prompt_versions)
        self._counters: dict[counting.CounterKey, Any] = {}
        # Imported here: the settings import this module, and must not pay Beam's import.
        from apache_beam.metrics import Metrics

        self._metrics = Metrics

    @property
    def names(self) -> tuple[str, ...]:
        return self._llm.names

    def judge_batch(
        self, items: Sequence[JudgeInput], fresh: Collection[int] = ()
    ) -> list[tuple[Verdict, ...]]:
        """One tuple of verdicts per input: the LLM's where it ran, the local judges' else."""
        local = self._local.judge_batch(items)
        chosen = {i: why for i, item in enumerate(items)
                  if (why := self._why_llm(item, i in fresh)) is not None}
        order = sorted(chosen)
        llm = self._llm.judge_batch(
            [items[i] for i in order], fresh={k for k, i in enumerate(order) if i in fresh}
        )
        verdicts = list(local)
        agreement: Counter[counting.CounterKey] = Counter()
        band = self._settings.uncertainty_band
        for i, llm_verdicts in zip(order, llm, strict=True):
            verdicts[i] = llm_verdicts
            if chosen[i] == "canary":
                continue
            for mv in llm_verdicts if self._probabilities else ():
                # P(yes) from the reply's logprobs: the same band, around 0.5.
                if mv.score is not None and abs(mv.score - 0.5) < band:
                    agreement[counting.key(UNSURE, judge=mv.judge, selected=chosen[i])] += 1
            for lv, mv in zip(local[i], llm_verdicts, strict=True):
                if lv.rating != "error" and mv.rating != "error":
                    agree = "true" if lv.rating == mv.rating else "false"
                    agreement[counting.key(AGREEMENT, judge=lv.judge, agree=agree,
                                           selected=chosen[i])] += 1
            # The tiers' disagreements stay on the verdict, for the review queue.
            verdicts[i] = tuple(
                dataclasses.replace(mv, other_tier_rating=lv.rating)
                if lv.rating in ("yes", "no") and mv.rating in ("yes", "no")
                and lv.rating != mv.rating
                else mv
                for lv, mv in zip(local[i], llm_verdicts, strict=True)
            )
        for k, n in agreement.items():
            counter = self._counters.get(k)
            if counter is None:
                counter = self._metrics.counter(counting.COUNTER_NAMESPACE, counting.encode(k))
                self._counters[k] = counter
            counter.inc(n)
        return verdicts

    def submit(
        self, items: Sequence[JudgeInput], fresh: Collection[int] = ()
    ) -> Future[list[tuple[Verdict, ...]]]:
        """`judge_batch` as a finished future: the interface the judge stage hands batches to.
        (The cascade judges each batch whole; its LLM calls run concurrently within it.)"""
        done: Future[list[tuple[Verdict, ...]]] = Future()
        done.set_result(self.judge_batch(items, fresh))
        return done

    def _why_llm(self, item: JudgeInput, canary: bool) -> str | None:
        """Why `item` goes to the LLM (canary, sample, uncertain), or None."""
        if canary:
            return "canary"
        if _hash_point(item) < self._settings.llm_sample_rate:
            return "sample"
        band = self._settings.uncertainty_band
        for judge in self._local_judges:
            if isinstance(judge, HasMargin) and judge.margin(item) < band:
                return "uncertain"
        return None

    def close(self) -> None:
        self._local.close()
        self._llm.close()
