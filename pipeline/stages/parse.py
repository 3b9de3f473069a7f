"""ParseEvents: the one admission decision. A raw record becomes an InferenceRecord (parsed,
not from the future, not late, sampled) or a Rejected record with its reason, by one value of
`AdmissionRules`; serve's lookahead and conversations ask the same rules
(pipeline/service/lookahead.py, conversations.py)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics

from ragpulse.pipeline.costs import sampling
from ragpulse.pipeline.costs.sampling import SamplingPlan, is_sampled, sampling_key
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.counting import COUNTER_NAMESPACE
from ragpulse.pipeline.records import (
    InferenceRecord,
    Rejected,
    SourceRecord,
)
from ragpulse.pipeline.stages.counters import Counters
from ragpulse.pipeline.windows import isoformat_utc, window_start

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


@dataclasses.dataclass(frozen=True, slots=True)
class AdmissionRules:
    """The seven inputs of the one admission decision, as one value: the clock of the
    future-skew check (`now`; None reads the clock per record), the size limit, the future
    skew, the window size and the cut-off of final windows (`closed_before`; None: no window
    is final), the sample rate and the sampling plan (None: `sample_rate` alone).

    Built once per serve cycle (`StageConfig.admission`) and handed whole to `ParseEvents`,
    serve's conversations and its lookahead, so that all three decide alike."""

    sample_rate: float
    window_size: float
    max_bytes: int = 1_048_576
    max_future_skew_s: float = DEFAULT_MAX_FUTURE_SKEW_S
    closed_before: float | None = None
    sampling: SamplingPlan | None = None
    now: float | None = None

    def admit(self, record: SourceRecord) -> Admission:
        """Parse and check one record (pure but for the clock when `now` is None). Any
        exception while reading it refuses the record, with the exception as reason."""
        max_bytes = self.max_bytes
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
            why = f"could not read the event ({type(exc).__name__}: {exc}"[:300] + ")"
            return Admission(None, why)
        refused = admission(
            event,
            record.record_time,
            now=time.time() if self.now is None else self.now,
            max_future_skew_s=self.max_future_skew_s,
            window_size=self.window_size,
            closed_before=self.closed_before,
        )
        if refused is None:
            return Admission(event)
        reason, late = refused
        # A future-dated event is refused before its time is noted (the watermark's input).
        return Admission(event if late else None, reason, late)

    def sample(self, event: InferenceRecord) -> tuple[InferenceRecord | None, str | None]:
        """(the event as judged, or None when sampling leaves it out; its stratum under a
        plan).

        Sampling is by `sample_rate`, or by the rate of the event's stratum of `sampling`, a
        kept event then carrying its weight 1 / rate; an event naming a conversation is sampled
        by its session id (`sampling_key`), so a conversation is kept or left out whole."""
        key = sampling_key(event.request_id, event.session_id)
        if self.sampling is None:
            return (event if is_sampled(key, self.sample_rate) else None), None
        stratum, rate = self.sampling.stratum_of(event)
        if not is_sampled(key, rate):
            return None, stratum
        return dataclasses.replace(event, stratum=stratum, weight=1.0 / rate), stratum

    def judged(self, record: SourceRecord) -> InferenceRecord | None:
        """The event `ParseEvents` judges of `record` (admitted, not late, sampled), or None
        where it judges none: what serve's lookahead and conversations ask."""
        admitted = self.admit(record)
        if admitted.event is None or admitted.refused is not None:
            return None
        return self.sample(admitted.event)[0]


class _ParseAndSample(beam.DoFn):
    def __init__(self, rules: AdmissionRules) -> None:
        self._rules = rules

    def setup(self) -> None:
        self._counters = Counters()
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
        admitted = self._rules.admit(record)
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
        kept, stratum = self._rules.sample(event)
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

    By `rules` (`AdmissionRules`): sampling is by their `sample_rate`, or, with a `sampling`
    plan (`--sampling-rules`, a judge budget), by the rate of each event's stratum, kept events
    carrying their weight (`pipeline.costs.sampling`). The main output holds sampled
    `InferenceRecord`s; the `dead_letter` output holds a `Rejected` for every record that was
    invalid, dated more than `max_future_skew_s` ahead of its record time or the clock
    (`future_reason`), or late for a window already closed (`closed_before`, set by `serve`; a
    file run has no closed windows). Any exception while reading one record refuses that
    record, with the exception as reason (`AdmissionRules.admit`, `.sample`). `now` is the
    clock the future-skew check reads (serve: the cycle's start, so that its conversations
    decide alike); None reads the clock per record.
    """

    DEAD_LETTER = "dead_letter"

    def __init__(self, rules: AdmissionRules) -> None:
        super().__init__()
        self._fn = _ParseAndSample(rules)

    def expand(self, records: Any) -> Any:
        return records | "ParseAndSample" >> beam.ParDo(self._fn).with_outputs(
            self.DEAD_LETTER, main="events"
        )
