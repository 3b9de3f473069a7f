"""JudgeEvents: each sampled event judged by the panel (judges/panel.py) in batches, its
verdicts counted per judge, rating and label (Beam counters), golden-set canaries judged with them
(`pipeline.canaries.CanaryEvent`), which leave the stage only as canary counts."""

from __future__ import annotations

import collections
import logging
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import apache_beam as beam
from apache_beam.transforms import window
from apache_beam.utils.windowed_value import WindowedValue

from ragpulse.judges import JudgeSpec, shared_panel
from ragpulse.judges.base import Verdict
from ragpulse.judges.llm.ensemble import agreement
from ragpulse.pipeline.canaries import CANARY_VERDICTS, CanaryEvent, outcome
from ragpulse.pipeline.costs import sampling
from ragpulse.pipeline.costs.cascade import CascadePanel, CascadeSettings
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import (
    InferenceRecord,
    JudgedEvent,
    with_parts,
)
from ragpulse.pipeline.stages.counters import Counters

log = logging.getLogger(__name__)


_GLOBAL_WINDOWS = (window.GlobalWindow(),)
_END_OF_GLOBAL_WINDOW = window.GlobalWindow().max_timestamp()


class _JudgeInBatches(beam.DoFn):
    """Collects events into batches of `batch_size`, judges each batch, counts the verdicts.

    Batching inside the DoFn, rather than `BatchElements` and a PCollection of lists: Beam's
    size sampling pickles every event of a sampled list, and with few, large batches it samples
    most of them. Events are judged before they are windowed, so they are in the global window.

    A full batch is handed to the panel and the next one is collected and handed over before
    the first is waited for, so the endpoint always has the next batch's calls queued when a
    batch's last calls end: waiting for each batch whole left its slots draining at every
    boundary. The panel is the process's (`judges.shared_panel`), kept across bundles and
    serve's cycles.
    """

    def __init__(self, spec: JudgeSpec, batch_size: int, cascade: CascadeSettings | None) -> None:
        self._spec = spec
        self._batch_size = batch_size
        self._cascade = cascade

    def setup(self) -> None:
        # The cascade's panel is the bundle's own; the plain panel is the process's, kept
        # across bundles and cycles (and taking over calls serve's lookahead started).
        self._panel: Any = (
            CascadePanel(self._spec, self._cascade) if self._cascade else shared_panel(self._spec)
        )
        self._counters = Counters()

    def start_bundle(self) -> None:
        self._batch: list[InferenceRecord | CanaryEvent] = []
        self._judging: collections.deque[tuple[list[Any], Future[list[tuple[Verdict, ...]]]]] = (
            collections.deque()
        )

    def process(self, event: InferenceRecord | CanaryEvent) -> Iterator[Any]:
        self._batch.append(event)
        if len(self._batch) >= self._batch_size:
            self._submit()
            if len(self._judging) > 1:
                yield from self._emit()

    def finish_bundle(self) -> Iterator[Any]:
        if self._batch:
            self._submit()
        while self._judging:
            yield from self._emit()

    def _submit(self) -> None:
        batch, self._batch = self._batch, []
        # Canaries are judged afresh every time: they test the judges, not the cache.
        verdicts = self._panel.submit(
            [(e.record if isinstance(e, CanaryEvent) else e).judge_input for e in batch],
            fresh={i for i, e in enumerate(batch) if isinstance(e, CanaryEvent)},
        )
        self._judging.append((batch, verdicts))

    def _emit(self) -> Iterator[Any]:
        """The judged events of the oldest batch handed over, once it is judged."""
        batch, verdicts = self._judging.popleft()
        for judged in self._judge(batch, verdicts.result()):
            # What `GlobalWindows.windowed_value_at_end_of_window` builds, with the window and
            # timestamp made once (Beam re-reads them from a proto constant on every call).
            yield WindowedValue(judged, _END_OF_GLOBAL_WINDOW, _GLOBAL_WINDOWS)

    def _judge(
        self,
        batch: list[InferenceRecord | CanaryEvent],
        all_verdicts: list[tuple[Verdict, ...]],
    ) -> list[JudgedEvent]:
        """Counts the verdicts of events and canaries judged together; returns only the events'
        results.

        A canary's verdicts are compared with its labels and counted in
        `ragpulse_canary_verdicts_total` alone, so no production count or window sees them.
        """
        # Tally the batch with cheap tuple keys first and touch each Beam counter once per
        # batch: building a sorted counter key and looking it up 19 times per event cost a
        # tenth of a local judge's time.
        tally: Counter[tuple[Any, ...]] = Counter()
        judged = []
        versions = self._panel.prompt_versions
        for event, verdicts in zip(batch, all_verdicts, strict=True):
            if isinstance(event, CanaryEvent):
                _tally_canary(tally, event, verdicts)
                continue
            flat, flat_versions = with_parts(verdicts, versions)
            _tally(tally, event, flat, flat_versions)
            judged.append(JudgedEvent(event, flat, flat_versions))
        inc = self._counters.inc
        backend = self._spec.backend
        for k, n in tally.items():
            inc(_counter_key(k, backend), n)
        return judged

    def teardown(self) -> None:
        # Only the cascade's panel is this DoFn's to close; the shared one lives on.
        panel = getattr(self, "_panel", None)
        if isinstance(panel, CascadePanel):
            panel.close()


def _tally(
    tally: Counter[tuple[Any, ...]],
    event: InferenceRecord,
    verdicts: tuple[Verdict, ...],
    versions: tuple[str, ...],
) -> None:
    """Adds one judged event's counts to `tally`, keyed as `_counter_key` reads them."""
    app, model = event.app, event.model
    if event.session is None:  # a session's record is counted by pipeline.stages.sessions
        tally["judged", app, model] += 1
        chunks = len(event.judge_input.chunks)
        if chunks:
            tally["chunks", app, model] += chunks
        else:
            tally["without_context", app, model] += 1
    grounded = sufficient = None
    for v, version in zip(verdicts, versions, strict=True):
        judge = v.judge
        if judge == "groundedness":
            grounded = v.rating
        elif judge == "context_sufficiency":
            sufficient = v.rating
        if v.missing:
            # Skipped: the event lacks the judge's required field. No verdict counted, and
            # nothing was called.
            tally["skipped", judge, version, "+".join(v.missing), app, model] += 1
            continue
        tally["verdict", judge, version, v.rating, app, model] += 1
        if v.votes:
            tally["ensemble", judge, version, agreement(v.votes)] += 1
        if v.score is not None:
            tally["score_count", judge, version, app, model] += 1
            tally["score_sum", judge, version, app, model] += counting.milli(v.score)
        if v.error_cause is not None:
            tally["error", judge, v.error_cause] += 1
        if v.cached:
            # Given again from the verdict cache: no call, no tokens, no latency to count.
            tally["cache_hit", judge] += 1
            continue
        if v.derived:
            continue  # a composite of the other verdicts: no call either
        tally["calls", judge] += 1
        if v.prompt_tokens:
            tally["prompt_tokens", judge] += v.prompt_tokens
        if v.cached_prompt_tokens:
            tally["cached_prompt_tokens", judge] += v.cached_prompt_tokens
        if v.completion_tokens:
            tally["completion_tokens", judge] += v.completion_tokens
        if v.prompt_chars_cut:
            tally["prompt_chars_cut", judge] += v.prompt_chars_cut
        tally["latency_bucket", judge, counting.latency_bucket(v.latency_seconds)] += 1
        tally["latency_count", judge] += 1
        tally["latency_sum_us", judge] += round(v.latency_seconds * 1e6)
    if event.stratum is not None:
        sampling.tally_weighted(
            tally, event.stratum, event.weight, zip(verdicts, versions, strict=True), app, model
        )
    # Groundedness split by whether the retrieved context was sufficient, when both judges
    # ran: ungrounded answers with sufficient context point at generation, not retrieval.
    if grounded is not None and sufficient in ("yes", "no"):
        context = "sufficient" if sufficient == "yes" else "insufficient"
        tally["grounded_by_context", context, grounded, app, model] += 1


def _tally_canary(
    tally: Counter[tuple[Any, ...]], canary: CanaryEvent, verdicts: tuple[Verdict, ...]
) -> None:
    """Counts each labelled judge's agreement with the human label; logs disagreements."""
    labels = dict(canary.labels)
    for v in verdicts:
        label = labels.get(v.judge)
        if label is None or v.rating == "skipped":
            continue
        result = outcome(v, label)
        tally["canary", v.judge, result] += 1
        if result != "agree":
            log.warning(
                "canary %s: %s rated %s where the golden label is %s (%s)",
                canary.record.request_id,
                v.judge,
                v.rating,
                label,
                (v.error_message or v.rationale or "no rationale")[:200],
            )


def _counter_key(k: tuple[Any, ...], backend: str) -> counting.CounterKey:
    """The Prometheus counter key of one `_tally` entry."""
    match k:
        case ("judged", app, model):
            return counting.key(catalogue.EVENTS_JUDGED, app=app, model=model)
        case ("chunks", app, model):
            return counting.key(catalogue.RETRIEVED_CHUNKS, app=app, model=model)
        case ("without_context", app, model):
            return counting.key(catalogue.WITHOUT_CONTEXT, app=app, model=model)
        case ("verdict", judge, version, rating, app, model):
            return counting.key(counting.VERDICTS, judge=judge, version=version, rating=rating,
                                app=app, model=model)
        case ("skipped", judge, version, missing, app, model):
            return counting.key(counting.SKIPPED, judge=judge, version=version, missing=missing,
                                app=app, model=model)
        case ("score_count", judge, version, app, model):
            return counting.key(counting.SCORE_COUNT, judge=judge, version=version, app=app,
                                model=model)
        case ("score_sum", judge, version, app, model):
            return counting.key(counting.SCORE_SUM_MILLI, judge=judge, version=version, app=app,
                                model=model)
        case ("ensemble", judge, version, agreed):
            return counting.key(counting.ENSEMBLE_VOTES, judge=judge, version=version,
                                agreement=agreed)
        case ("calls", judge):
            return counting.key(catalogue.JUDGE_CALLS, judge=judge, backend=backend)
        case ("error", judge, cause):
            return counting.key(catalogue.JUDGE_ERRORS, judge=judge, cause=cause)
        case ("prompt_tokens", judge):
            return counting.key(catalogue.TOKENS, judge=judge, kind="prompt")
        case ("completion_tokens", judge):
            return counting.key(catalogue.TOKENS, judge=judge, kind="completion")
        case ("cached_prompt_tokens", judge):
            return counting.key(catalogue.TOKENS, judge=judge, kind="cached_prompt")
        case ("prompt_chars_cut", judge):
            return counting.key(catalogue.PROMPT_CHARS_CUT, judge=judge)
        case ("cache_hit", judge):
            return counting.key(catalogue.CACHE_HITS, judge=judge)
        case ("latency_bucket", judge, le):
            return counting.key(counting.LATENCY_BUCKET, judge=judge, le=le)
        case ("latency_count", judge):
            return counting.key(counting.LATENCY_COUNT, judge=judge)
        case ("latency_sum_us", judge):
            return counting.key(counting.LATENCY_SUM_US, judge=judge)
        case ("grounded_by_context", context, rating, app, model):
            return counting.key(counting.GROUNDED_BY_CONTEXT, context=context, rating=rating,
                                app=app, model=model)
        case ("canary", judge, result):
            return counting.key(CANARY_VERDICTS, judge=judge, outcome=result)
    weighted = sampling.counter_key(k)
    if weighted is not None:
        return weighted
    raise ValueError(f"unknown tally key {k!r}")


class JudgeEvents(beam.PTransform):
    """Runs the judge panel over sampled events (and canaries), in batches so LLM calls overlap.

    The output holds one `JudgedEvent` per event; the verdict, call, token, error and latency
    counts leave as Beam counters (`pipeline.metrics.counting`).
    """

    def __init__(
        self, spec: JudgeSpec, *, batch_size: int, cascade: CascadeSettings | None = None
    ) -> None:
        super().__init__()
        self._spec = spec
        self._batch_size = batch_size
        self._cascade = cascade

    def expand(self, events: Any) -> Any:
        if not events.windowing.is_default():
            raise ValueError("JudgeEvents judges events before they are windowed")
        return events | "Judge" >> beam.ParDo(
            _JudgeInBatches(self._spec, self._batch_size, self._cascade)
        )
