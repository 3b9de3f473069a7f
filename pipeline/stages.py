"""The Beam stages that take raw inference-log records to windowed rating counts.

One composite transform per stage, in the order an event travels:

    SourceRecord --ParseEvents--> InferenceRecord --JudgeEvents--> JudgedEvent
        |                                                              |
        +--> dead letters (invalid or late)          WindowRatings --> (WindowKey, RatingCounts)

Golden-set canaries (`pipeline.canaries.CanaryEvent`) may join the events before
JudgeEvents:
they are judged with them but leave that stage only as `ragpulse_canary_verdicts_total` counts.

Counts that become Prometheus counters leave the workers as Beam counters (see `pipeline.counting`).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from concurrent.futures import Future
from typing import Any

import apache_beam as beam
import orjson
from apache_beam import coders
from apache_beam.metrics import Metrics
from apache_beam.transforms import userstate, window
from apache_beam.utils.windowed_value import WindowedValue

from judges import JudgeSpec, shared_panel
from judges.base import RATINGS, Verdict
from judges.ensemble import agreement
from pipeline import counting, sampling
from pipeline import metrics_catalogue as catalogue
from pipeline.canaries import CANARY_VERDICTS, CanaryEvent, outcome
from pipeline.cascade import CascadePanel, CascadeSettings
from pipeline.counting import COUNTER_NAMESPACE
from pipeline.events import InferenceRecord, InvalidEvent, Rejected, SourceRecord, parse_event
from pipeline.sampling import SamplingPlan, is_sampled, sampling_key
from pipeline.sessions import SessionKey, session_key
from pipeline.windows import RatingCounts, WindowKey, isoformat_utc, window_start

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class JudgedEvent:
    """An event and one verdict per judge of the panel, with each judge's prompt version."""

    record: InferenceRecord
    verdicts: tuple[Verdict, ...]
    # The `version` label of each verdict (the panel's `prompt_versions`, one shared tuple).
    versions: tuple[str, ...] = ()

    def versioned(self) -> Iterator[tuple[Verdict, str]]:
        """Each verdict with its judge's prompt version ("" when none was recorded)."""
        versions = self.versions or ("",) * len(self.verdicts)
        return zip(self.verdicts, versions, strict=True)


def with_parts(
    verdicts: tuple[Verdict, ...], versions: tuple[str, ...]
) -> tuple[tuple[Verdict, ...], tuple[str, ...]]:
    """The verdicts with each one that has `parts` (a judge graded per named guideline)
    replaced by its parts, judged "<judge>/<name>", and the versions to match: what the
    counts, windows and verdict rows hold (counting.key makes the name a `guideline` label)."""
    if not any(v.parts for v in verdicts):
        return verdicts, versions
    flat: list[Verdict] = []
    flat_versions: list[str] = []
    for v, version in zip(verdicts, versions or ("",) * len(verdicts), strict=True):
        for part in v.parts or (v,):
            flat.append(part)
            flat_versions.append(version)
    return tuple(flat), tuple(flat_versions) if versions else ()


class _Counters:
    """Beam counters created on first use, named by `pipeline.counting.encode`."""

    def __init__(self) -> None:
        self._cache: dict[counting.CounterKey, Any] = {}

    def inc(self, counter_key: counting.CounterKey, n: int = 1) -> None:
        counter = self._cache.get(counter_key)
        if counter is None:
            counter = Metrics.counter(COUNTER_NAMESPACE, counting.encode(counter_key))
            self._cache[counter_key] = counter
        counter.inc(n)


EVENTS_ACCEPTED = counting.key(catalogue.EVENTS, outcome="accepted")
EVENTS_INVALID = counting.key(catalogue.EVENTS, outcome="invalid")
EVENTS_SAMPLED = counting.key(catalogue.EVENTS_SAMPLED)
LATE_EVENTS = counting.key(catalogue.LATE_EVENTS)
DEAD_LETTERS = counting.key(catalogue.DEAD_LETTERS)
LATEST_EVENT_TIME_PREFIX = "event_time_ms:"


def agent_counts(event: InferenceRecord) -> list[tuple[counting.CounterKey, int]]:
    """The chatbot's own token counts and latency of one accepted event, per app and model
    (nothing when the event gives neither)."""
    labels = {"app": event.app, "model": event.model}
    out: list[tuple[counting.CounterKey, int]] = []
    usage = event.usage
    if usage is not None:
        out.append((counting.key(counting.AGENT_USAGE_EVENTS, **labels), 1))
        for metric, n in ((counting.AGENT_INPUT_TOKENS, usage.input_tokens),
                          (counting.AGENT_OUTPUT_TOKENS, usage.output_tokens),
                          (counting.AGENT_TOTAL_TOKENS, usage.total_tokens)):
            if n is not None:
                out.append((counting.key(metric, **labels), n))
    seconds = event.latency_seconds
    if seconds is not None:
        le = counting.latency_bucket(seconds, counting.AGENT_LATENCY_BUCKETS)
        out.append((counting.key(counting.AGENT_LATENCY_BUCKET, le=le, **labels), 1))
        out.append((counting.key(counting.AGENT_LATENCY_COUNT, **labels), 1))
        out.append((counting.key(counting.AGENT_LATENCY_SUM_US, **labels), round(seconds * 1e6)))
    return out


DEFAULT_MAX_FUTURE_SKEW_S = 300.0


def _ahead(seconds: float) -> str:
    return f"{seconds:.0f}s" if seconds < 86_400 else f"{seconds / 86_400:.0f} days"


def future_reason(
    event_time: float, record_time: float | None, now: float, max_future_skew_s: float
) -> str | None:
    """Why an event dated in the future is refused (None when it is not): its time is more
    than `max_future_skew_s` ahead of its source record's time (Kafka's record timestamp) or of
    the clock. Admitted, one event dated 2099 would move serve's watermark to 2099 and make
    every later event late."""
    for what, reference in (("its Kafka record time", record_time), ("the clock", now)):
        if reference is not None and event_time - reference > max_future_skew_s:
            return (
                f"future-dated event: its time {isoformat_utc(event_time)} is "
                f"{_ahead(event_time - reference)} ahead of {what} "
                f"({isoformat_utc(round(reference))}), "
                f"over --max-future-skew {_ahead(max_future_skew_s)}"
            )
    return None


def admission(
    event: InferenceRecord,
    record_time: float | None,
    *,
    now: float,
    max_future_skew_s: float,
    window_size: float,
    closed_before: float | None,
) -> tuple[str, bool] | None:
    """Why `ParseEvents` refuses a parsed event, and whether it is late (None: admitted).
    serve's lookahead (pipeline/service/lookahead.py) asks the same, to start no call for an
    event the cycle will refuse."""
    future = future_reason(event.event_time, record_time, now, max_future_skew_s)
    if future is not None:
        return future, False
    if closed_before is not None:
        end = window_start(event.event_time, window_size) + window_size
        if end <= closed_before:
            return (
                f"late event: its window ending {isoformat_utc(end)} was already closed "
                f"(windows ending at or before {isoformat_utc(closed_before)} are final)",
                True,
            )
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """What `ParseEvents` makes of one record: the parsed event (None when it was refused before
    its event time could be read: oversize, unreadable, invalid, future-dated) and why it is
    dead-lettered (None: admitted), `late` when that is because its window is final."""

    event: InferenceRecord | None
    refused: str | None = None
    late: bool = False


def admit(
    record: SourceRecord,
    *,
    now: float,
    max_bytes: int,
    max_future_skew_s: float,
    window_size: float,
    closed_before: float | None,
) -> Admission:
    """Parse and check one record (pure): `ParseEvents` and serve's conversations
    (pipeline/service/conversations.py) decide alike. Any exception while reading it refuses
    the record, with the exception as reason."""
    if record.oversize_bytes is not None:
        return Admission(
            None, f"record is {record.oversize_bytes} bytes, over the {max_bytes}-byte limit"
        )
    if record.refused is not None:
        return Admission(None, record.refused)
    try:
        event = parse_event(record.raw, record_time=record.record_time, max_bytes=max_bytes)
    except InvalidEvent as exc:
        return Admission(None, exc.reason)
    except Exception as exc:  # one record never fails the bundle
        return Admission(None, f"could not read the event ({type(exc).__name__}: {exc}"[:300] + ")")
    refused = admission(
        event,
        record.record_time,
        now=now,
        max_future_skew_s=max_future_skew_s,
        window_size=window_size,
        closed_before=closed_before,
    )
    if refused is None:
        return Admission(event)
    reason, late = refused
    # A future-dated event is refused before its time is noted (the watermark's input).
    return Admission(event if late else None, reason, late)


def sample_event(
    event: InferenceRecord, sample_rate: float, plan: SamplingPlan | None
) -> tuple[InferenceRecord | None, str | None]:
    """(the event as judged, or None when sampling leaves it out; its stratum under a plan).

    Sampling is by `sample_rate`, or by the rate of the event's stratum of `plan`, a kept event
    then carrying its weight 1 / rate; an event naming a conversation is sampled by its
    session id (`sampling_key`), so a conversation is kept or left out whole."""
    key = sampling_key(event.request_id, event.session_id)
    if plan is None:
        return (event if is_sampled(key, sample_rate) else None), None
    stratum, rate = plan.stratum_of(event)
    if not is_sampled(key, rate):
        return None, stratum
    return dataclasses.replace(event, stratum=stratum, weight=1.0 / rate), stratum


class _ParseAndSample(beam.DoFn):
    def __init__(
        self,
        sample_rate: float,
        window_size: float,
        closed_before: float | None,
        max_bytes: int,
        plan: SamplingPlan | None,
        max_future_skew_s: float,
        now: float | None,
    ) -> None:
        self._sample_rate = sample_rate
        self._plan = plan
        self._window_size = window_size
        self._closed_before = closed_before
        self._max_bytes = max_bytes
        self._max_future_skew_s = max_future_skew_s
        self._now = now

    def setup(self) -> None:
        self._counters = _Counters()
        self._latest_by_partition: dict[int, Any] = {}

    def _note_event_time(self, partition: int | None, event_time: float) -> None:
        """A distribution of event times per Kafka partition; its max feeds serve's watermark."""
        if partition is None:
            return
        dist = self._latest_by_partition.get(partition)
        if dist is None:
            name = f"{LATEST_EVENT_TIME_PREFIX}{partition}"
            dist = Metrics.distribution(COUNTER_NAMESPACE, name)
            self._latest_by_partition[partition] = dist
        dist.update(round(event_time * 1000))

    def _reject(self, record: SourceRecord, reason: str, *, late: bool = False) -> Any:
        self._counters.inc(LATE_EVENTS if late else EVENTS_INVALID)
        self._counters.inc(DEAD_LETTERS)
        return beam.pvalue.TaggedOutput(ParseEvents.DEAD_LETTER, Rejected(record, reason))

    def process(self, record: SourceRecord) -> Iterator[Any]:
        admitted = admit(
            record,
            now=time.time() if self._now is None else self._now,
            max_bytes=self._max_bytes,
            max_future_skew_s=self._max_future_skew_s,
            window_size=self._window_size,
            closed_before=self._closed_before,
        )
        event = admitted.event
        if event is None:
            yield self._reject(record, admitted.refused or "refused")
            return
        self._counters.inc(EVENTS_ACCEPTED)
        self._note_event_time(record.partition, event.event_time)
        if admitted.refused is not None:
            yield self._reject(record, admitted.refused, late=True)
            return
        for counter_key, n in agent_counts(event):
            self._counters.inc(counter_key, n)
        kept, stratum = sample_event(event, self._sample_rate, self._plan)
        if stratum is not None:
            self._counters.inc(counting.key(sampling.SEEN, stratum=stratum))
        if kept is None:
            return
        self._counters.inc(EVENTS_SAMPLED)
        if stratum is not None:
            self._counters.inc(counting.key(sampling.SAMPLED, stratum=stratum))
            self._counters.inc(
                counting.key(sampling.WEIGHTS, stratum=stratum), sampling.to_micros(kept.weight)
            )
        yield kept


class ParseEvents(beam.PTransform):
    """Parses, validates and samples records.

    Sampling is by `sample_rate`, or, with a `sampling` plan (`--sampling-rules`, a judge
    budget), by the rate of each event's stratum, kept events carrying their weight
    (`pipeline.sampling`). The main output holds sampled `InferenceRecord`s; the `dead_letter`
    output holds a `Rejected` for every record that was invalid, dated more than
    `max_future_skew_s` ahead of its record time or the clock (`future_reason`), or late for a
    window already closed (`closed_before`, set by `serve`; a file run has no closed windows).
    Any exception while reading one record refuses that record, with the exception as reason
    (`admit`, `sample_event`). `now` is the clock the future-skew check reads (serve: the
    cycle's start, so that its conversations decide alike); None reads the clock per record.
    """

    DEAD_LETTER = "dead_letter"

    def __init__(
        self,
        *,
        sample_rate: float,
        window_size: float,
        closed_before: float | None = None,
        max_bytes: int = 1_048_576,
        sampling: SamplingPlan | None = None,
        max_future_skew_s: float = DEFAULT_MAX_FUTURE_SKEW_S,
        now: float | None = None,
    ) -> None:
        super().__init__()
        self._fn = _ParseAndSample(
            sample_rate, window_size, closed_before, max_bytes, sampling, max_future_skew_s, now
        )

    def expand(self, records: Any) -> Any:
        return records | "ParseAndSample" >> beam.ParDo(self._fn).with_outputs(
            self.DEAD_LETTER, main="events"
        )


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
        self._counters = _Counters()

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
    if event.session is None:  # a session's record is counted by pipeline.sessions
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
    counts leave as Beam counters (`pipeline.counting`).
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


Rated = tuple[tuple[str, str, str, str], tuple[str, int | None]]


def ratings_by_judge(judged: JudgedEvent) -> list[Rated]:
    """((judge, version, app, model), (rating, score in thousandths or None)) for each verdict
    of a judged event (skipped judges have none: they stay out of the window's counts)."""
    app, model = judged.record.app, judged.record.model
    return [
        ((v.judge, version, app, model),
         (v.rating, None if v.score is None else counting.milli(v.score)))
        for v, version in judged.versioned()
        if not v.missing
    ]


@dataclasses.dataclass(frozen=True)
class Retraction:
    """Verdicts taken back out of the windows they were counted in (`ragpulse stream`: the
    earlier verdicts of a session a late turn re-opened, `ReplaceRejudged` below):
    their event time and their `ratings_by_judge`, no text."""

    event_time: float
    ratings: tuple[Rated, ...]


def weighted_ratings(
    item: JudgedEvent | Retraction,
) -> Iterable[tuple[tuple[str, str, str, str], tuple[str, int | None, int]]]:
    """`ratings_by_judge` with a weight, what `CountRatings` adds up: +1 for a judged event's
    verdicts, -1 for retracted ones (stream)."""
    if isinstance(item, Retraction):
        return [(k, (rating, score, -1)) for k, (rating, score) in item.ratings]
    return [(k, (rating, score, 1)) for k, (rating, score) in ratings_by_judge(item)]


@dataclasses.dataclass(frozen=True)
class _JudgedSession:
    """What `ReplaceRejudged` keeps of a session it let through: its span, turns and ratings."""

    began: float
    end: float
    turns: int
    ratings: tuple[Rated, ...]


def _key_by_session(judged: JudgedEvent) -> tuple[tuple[str, str], JudgedEvent]:
    session = judged.record.session
    assert session is not None  # only the session judges' records come here
    return (session.app, session.session_id), judged


_JUDGED_SESSIONS = userstate.BagStateSpec("judged", coders.PickleCoder())
_FORGET_SESSIONS = userstate.TimerSpec("forget", userstate.TimeDomain.WATERMARK)
_JUDGED_SESSIONS_PARAM = beam.DoFn.StateParam(_JUDGED_SESSIONS)
_FORGET_SESSIONS_PARAM = beam.DoFn.TimerParam(_FORGET_SESSIONS)


class _ReplaceRejudged(beam.DoFn):

    def __init__(self, gap_seconds: float, lateness_seconds: float) -> None:
        self._gap = gap_seconds
        self._lateness = lateness_seconds

    def setup(self) -> None:
        self._counters = _Counters()

    def process(
        self,
        element: tuple[tuple[str, str], JudgedEvent],
        judged_state: Any = _JUDGED_SESSIONS_PARAM,
        forget: Any = _FORGET_SESSIONS_PARAM,
    ) -> Iterator[JudgedEvent | Retraction]:
        (app, session_id), judged = element
        session = judged.record.session
        assert session is not None
        gap = self._gap
        new = _JudgedSession(
            session.began if session.began is not None else session.start,
            judged.record.event_time,
            session.turn_count,
            tuple(ratings_by_judge(judged)),
        )
        kept: list[_JudgedSession] = []
        replaced: list[_JudgedSession] = []
        for old in judged_state.read():
            if not (old.began < new.end + gap and new.began < old.end + gap):
                kept.append(old)  # another session of the same id
            elif old.turns > new.turns:
                # An earlier pane of a session whose later pane came first: superseded.
                log.debug(
                    "session %s of %s: a pane of %d turns after one of %d, not counted",
                    session_id, app, new.turns, old.turns,
                )
                return
            else:
                replaced.append(old)
        for old in replaced:
            yield Retraction(old.end, old.ratings)
            self._counters.inc(counting.key(catalogue.SESSIONS_REJUDGED, app=app))
        judged_state.clear()
        for entry in [*kept, new]:
            judged_state.add(entry)
        # A turn re-opens a session until its end + gap + lateness passes.
        forget.set(max(e.end for e in [*kept, new]) + gap + self._lateness)
        yield judged

    @userstate.on_timer(_FORGET_SESSIONS)
    def _forget(self, judged_state: Any = _JUDGED_SESSIONS_PARAM) -> None:
        judged_state.clear()


class ReplaceRejudged(beam.PTransform):
    """The session judges' verdicts of `ragpulse stream`, where a late turn re-opens a judged
    session (accumulating session-window panes, `GroupSessions(lateness_seconds=...)`) and it
    is judged again: each verdict after the first of one session comes with a `Retraction` of
    the earlier one (counted in ragpulse_session_rejudged_total), so the windowed counts never
    count a session twice. Kept per (app, session id) in the runner's state until no turn can
    re-open the session (its end + gap + `lateness_seconds`); a pane overtaken by a later one
    of the same session is not counted."""

    def __init__(self, gap_seconds: float, lateness_seconds: float) -> None:
        super().__init__()
        self._gap = gap_seconds
        self._lateness = lateness_seconds

    def expand(self, judged: Any) -> Any:
        return (
            judged
            # Typed, so that the state's key coder is a deterministic one (strings).
            | "KeyBySession"
            >> beam.Map(_key_by_session).with_output_types(
                beam.typehints.Tuple[beam.typehints.Tuple[str, str], beam.typehints.Any]
            )
            | "Replace" >> beam.ParDo(_ReplaceRejudged(self._gap, self._lateness))
        )


class CountRatings(beam.CombineFn):
    """Counts yes / no / error ratings, and scored verdicts with their score sum; partial
    counts add up (`RatingCounts.__add__`). Each rating comes with its weight
    (`weighted_ratings`): -1 takes a retracted verdict back out."""

    def create_accumulator(self) -> list[int]:
        return [0, 0, 0, 0, 0]

    def add_input(self, acc: list[int], rated: tuple[str, int | None, int]) -> list[int]:
        rating, score, weight = rated
        acc[RATINGS.index(rating)] += weight
        if score is not None:
            acc[3] += weight
            acc[4] += weight * score
        return acc

    def merge_accumulators(self, accs: Iterable[list[int]]) -> list[int]:
        total = [0, 0, 0, 0, 0]
        for acc in accs:
            for i in range(5):
                total[i] += acc[i]
        return total

    def extract_output(self, acc: list[int]) -> RatingCounts:
        return RatingCounts(*acc)


class _KeyByWindow(beam.DoFn):
    def process(
        self,
        element: tuple[tuple[str, str, str, str], RatingCounts],
        win: Any = beam.DoFn.WindowParam,
    ) -> Iterator[tuple[WindowKey, RatingCounts]]:
        (judge, version, app, model), counts = element
        yield WindowKey(float(win.start), float(win.end), judge, app, model, version), counts


def at_event_time(judged: JudgedEvent | Retraction) -> window.TimestampedValue:
    """The judged event (or retraction) stamped with its event time, for event-time windows."""
    at = judged.event_time if isinstance(judged, Retraction) else judged.record.event_time
    return window.TimestampedValue(judged, at)


class WindowRatings(beam.PTransform):
    """Counts ratings per (event-time fixed window, judge, app, model) of a bounded batch.

    Every batch is bounded (a file, or one micro-batch of Kafka offset ranges), so each window
    gets one pane holding the batch's counts; `serve` adds up the partial counts of the same
    window across cycles (`RatingCounts.__add__`), and decides lateness itself, before judging
    (`ParseEvents(closed_before=...)`), which is why no late-pane trigger is needed here.
    """

    def __init__(self, *, window_size: float) -> None:
        super().__init__()
        self._size = window_size

    def expand(self, judged: Any) -> Any:
        return (
            judged
            | "StampEventTime" >> beam.Map(at_event_time)
            | "FixedWindows" >> beam.WindowInto(window.FixedWindows(self._size))
            | "RatingPerJudge" >> beam.FlatMap(weighted_ratings)
            | "CountRatings" >> beam.CombinePerKey(CountRatings())
            | "KeyByWindow" >> beam.ParDo(_KeyByWindow())
            # Back to the global window, so sinks and the result see plain (key, counts) rows.
            | "Unwindow" >> beam.WindowInto(window.GlobalWindows())
        )


WINDOW_NAMESPACE = "ragpulse.windows"


class _ReportWindow(beam.DoFn):
    """Hands each window's counts to the caller as Beam counters (yes, no, error, scored,
    score_milli: the fields of `RatingCounts`).

    Beam's metric results are how small aggregates get from the workers (in this process or
    others) back to the program that ran the pipeline, without a file in between.
    """

    def process(self, element: tuple[WindowKey, RatingCounts]) -> None:
        key, counts = element
        for field in _WINDOW_FIELDS:
            n = getattr(counts, field)
            if n:
                Metrics.counter(WINDOW_NAMESPACE, encode_window(key, field)).inc(n)


_WINDOW_FIELDS = tuple(f.name for f in dataclasses.fields(RatingCounts))


def encode_window(key: WindowKey, rating: str) -> str:
    """The Beam counter name of one window's count of `rating` (a `RatingCounts` field)."""
    return orjson.dumps(
        [key.window_start, key.window_end, key.judge, key.app, key.model, key.version, rating]
    ).decode()


def decode_window(name: str) -> tuple[WindowKey, str]:
    """Inverse of `encode_window`."""
    start, end, judge, app, model, version, rating = orjson.loads(name)
    return WindowKey(float(start), float(end), judge, app, model, version), rating


class ReportWindows(beam.PTransform):
    """The sink of window counts: Beam counters the caller reads (`pipeline.graph`)."""

    def expand(self, windows: Any) -> Any:
        return windows | "CountersPerWindow" >> beam.ParDo(_ReportWindow())


SESSION_WINDOW_NAMESPACE = "ragpulse.session_windows"


class _ReportSessionWindow(beam.DoFn):
    """Each judged session's own counts per window, as Beam counters (serve keeps them with the
    session, to take them back out of the windows if a late turn re-opens it)."""

    def __init__(self, window_size: float) -> None:
        self._size = window_size

    def process(self, judged: JudgedEvent) -> None:
        session = judged.record.session
        if session is None:
            return
        start = window_start(judged.record.event_time, self._size)
        for (judge, version, app, model), (rating, score) in ratings_by_judge(judged):
            key = WindowKey(start, start + self._size, judge, app, model, version)
            fields = [(rating, 1)] if score is None else [
                (rating, 1), ("scored", 1), ("score_milli", score)
            ]
            for field, n in fields:
                Metrics.counter(
                    SESSION_WINDOW_NAMESPACE,
                    encode_session_window(session_key(session), key, field),
                ).inc(n)


def encode_session_window(session: SessionKey, key: WindowKey, rating: str) -> str:
    """The Beam counter name of one judged session's count of `rating` in one window."""
    return orjson.dumps([list(session), encode_window(key, rating)]).decode()


def decode_session_window(name: str) -> tuple[SessionKey, WindowKey, str]:
    """Inverse of `encode_session_window`."""
    (app, session_id, end), window = orjson.loads(name)
    key, rating = decode_window(window)
    return (app, session_id, float(end)), key, rating


class ReportSessionWindows(beam.PTransform):
    """serve: the judged sessions' counts per window, each session apart (Beam counters)."""

    def __init__(self, window_size: float) -> None:
        super().__init__()
        self._size = window_size

    def expand(self, judged: Any) -> Any:
        return judged | "CountersPerSession" >> beam.ParDo(_ReportSessionWindow(self._size))


EXEMPLAR_NAMESPACE = "ragpulse.exemplars"


def _failing_series(
    judged: JudgedEvent,
) -> Iterator[tuple[counting.CounterKey, tuple[float, str]]]:
    """(verdict counter key, (event time, request_id)) for each `no` or `error` verdict."""
    record = judged.record
    if len(record.request_id) > counting.MAX_EXEMPLAR_REQUEST_ID_CHARS:
        return
    for v, version in judged.versioned():
        if v.rating in ("no", "error"):
            k = counting.key(
                counting.VERDICTS,
                judge=v.judge,
                version=version,
                rating=v.rating,
                app=record.app,
                model=record.model,
            )
            yield k, (record.event_time, record.request_id)


def _report_exemplar(element: tuple[counting.CounterKey, tuple[float, str]]) -> None:
    k, (event_time, request_id) = element
    Metrics.string_set(EXEMPLAR_NAMESPACE, counting.encode(k)).add(
        orjson.dumps([event_time, request_id]).decode()
    )


class ReportLatestFailing(beam.PTransform):
    """The latest failing answer (by event time; ties to the greater request_id) of each
    `ragpulse_judge_verdicts_total` series, for its exemplar; handed to the caller as one
    Beam string-set entry per series."""

    def expand(self, judged: Any) -> Any:
        return (
            judged
            | "FailingSeries" >> beam.FlatMap(_failing_series)
            # Beam 2.62's stubs type CombinePerKey's argument as a CombineFn; a callable works.
            | "LatestPerSeries" >> beam.CombinePerKey(max)  # type: ignore[arg-type]
            | "Report" >> beam.Map(_report_exemplar)
        )
