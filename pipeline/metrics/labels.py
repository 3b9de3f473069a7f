"""Bounded `app`, `model` and `guideline` label values, so /metrics cannot grow without end.

For operators (the flags) and for the drivers of `serve` and `run`, which call `LabelBudget.bound`
where a batch's window counts and counter increments are merged, before they are saved or
exported. A chatbot that logs a request id or a user name as its `app` would otherwise create a
new series per event, in /metrics, in Prometheus and in the state file.

Each label keeps the values it has already admitted; a new value is admitted while fewer than
`--max-label-values` are, or, with `--allowed-apps` / `--allowed-models`, when it is in the list
(the list is then the bound). Any other value is counted under `other`, and each event judged
under `other` adds one to `ragpulse_label_overflow_total{label=...}`; the first overflow of each
label is logged once (a `guideline` beyond its bound adds its verdicts to the overflow
counter instead: a guideline has no events of its own). New values of one batch are admitted
in sorted order, so the choice does not depend on the order events arrived in.

The other labels of judge series are bounded by construction in `serve` and `run`: `judge` by
--judges, --custom-judge and --composite; `version` by the prompt versions deployed (one value
per judge per prompt edit: each edit adds one set of series, which stays in the saved counters);
`ragpulse exporter`, which reads them from the ratings topic, bounds `judge` and `version` here
too (`EXPORTER_BOUNDED_LABELS`), and the topic's decoder refuses values over 128 characters;
`missing` (ragpulse_judge_skipped_total) by the input names; `agreement` by three values.

`serve` passes the label values of its saved counters as the admitted set: a value admitted once
keeps its own series across cycles and restarts, and a cycle replayed after a crash decides the
same way. Verdict rows and `windows.jsonl` of `ragpulse run` keep the real values.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Mapping

from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.windows import RatingCounts, WindowKey

log = logging.getLogger(__name__)

OTHER = "other"
BOUNDED_LABELS = ("app", "model", "guideline")
# `ragpulse exporter` reads every label from the ratings topic, where nothing bounds judge and
# version by construction: it bounds them too.
EXPORTER_BOUNDED_LABELS = ("judge", "version", *BOUNDED_LABELS)
OVERFLOW_METRIC = catalogue.LABEL_OVERFLOW
# Each judged event adds 1 to this counter, under its (app, model): it is what overflow counts.
_EVENTS_JUDGED = catalogue.EVENTS_JUDGED
# A guideline has no events of its own: its overflow counts its verdicts.
_VERDICTS = counting.VERDICTS


@dataclasses.dataclass(frozen=True)
class LabelLimits:
    """How many values each bounded label may take, or which ones (an allowlist per label)."""

    max_values: int
    allowed: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)


class LabelBudget:
    """Maps label values of a batch to admitted ones or `other` (see the module docstring)."""

    def __init__(self, limits: LabelLimits, labels: tuple[str, ...] = BOUNDED_LABELS) -> None:
        self.limits = limits
        self.labels = labels
        self._warned: set[str] = set()

    def bound(
        self,
        windows: Mapping[WindowKey, RatingCounts],
        counts: Mapping[counting.CounterKey, float],
        admitted_from: Iterable[counting.CounterKey] = (),
    ) -> tuple[dict[WindowKey, RatingCounts], counting.Counts]:
        """`windows` and `counts` with every bounded label value admitted or `other`, plus the
        overflow counts. `admitted_from`: counter keys already saved, whose values stay."""
        mapping = {label: self._mapping(label, windows, counts, admitted_from)
                   for label in self.labels}

        def bound(label: str, value: str) -> str:
            return mapping[label][value] if label in mapping else value

        bounded_windows: dict[WindowKey, RatingCounts] = {}
        for key, rating_counts in windows.items():
            judge = bound("judge", key.judge)
            if key.guideline and judge != OTHER:
                judge = f"{judge.partition('/')[0]}/{bound('guideline', key.guideline)}"
            bounded = dataclasses.replace(
                key,
                judge=judge,
                version=bound("version", key.version),
                app=bound("app", key.app),
                model=bound("model", key.model),
            )
            bounded_windows[bounded] = bounded_windows.get(bounded, RatingCounts()) + rating_counts
        bounded_counts: counting.Counts = counting.merge()
        for (metric, labels), value in counts.items():
            named = dict(labels)
            for label in self.labels:
                if label in named:
                    real = named[label]
                    named[label] = mapping[label][real]
                    overflows = _VERDICTS if label == "guideline" else _EVENTS_JUDGED
                    if metric == overflows and named[label] != real:
                        bounded_counts[counting.key(OVERFLOW_METRIC, label=label)] += int(value)
            bounded_counts[counting.key(metric, **named)] += int(value)
        return bounded_windows, bounded_counts

    def _mapping(
        self,
        label: str,
        windows: Mapping[WindowKey, RatingCounts],
        counts: Mapping[counting.CounterKey, float],
        admitted_from: Iterable[counting.CounterKey],
    ) -> dict[str, str]:
        seen = {value for key in windows if (value := getattr(key, label))}
        seen.update(dict(labels)[label] for _, labels in counts if _has(labels, label))
        admitted = {dict(labels)[label] for _, labels in admitted_from if _has(labels, label)}
        allowed = self.limits.allowed.get(label)
        mapping = {OTHER: OTHER}
        refused: list[str] = []
        room = self.limits.max_values - len(admitted - {OTHER})
        for value in sorted(seen - {OTHER}):
            if allowed is not None:
                ok = value in allowed
            elif value in admitted:
                ok = True
            else:
                ok = room > 0
                room -= 1 if ok else 0
            mapping[value] = value if ok else OTHER
            if not ok:
                refused.append(value)
        if refused and label not in self._warned:
            self._warned.add(label)
            why = (
                f"not in --allowed-{label}s"
                if allowed is not None
                else f"beyond --max-label-values {self.limits.max_values}"
            )
            examples = ", ".join(repr(v[:40]) for v in refused[:3])
            log.warning(
                "%s label values %s%s are %s: they and later ones are counted as %r (see %s); "
                "this is logged once",
                label,
                examples,
                ", ..." if len(refused) > 3 else "",
                why,
                OTHER,
                OVERFLOW_METRIC,
            )
        return mapping


def _has(labels: counting.Labels, label: str) -> bool:
    return any(name == label for name, _ in labels)
