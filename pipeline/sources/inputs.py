"""What each --input-format needs of serve's cycles and of `ragpulse run`, declared in one place.

For whoever adds an input format. serve (pipeline/service/loop.py) and run
(pipeline/commands/run.py) name no format: they ask the one `input_for` gives them.

- `reads_here`: the cycle reads its ranges in serve's process before its graph (the records
  are assembled with state kept between cycles), instead of letting the graph read them;
- `records_are_events`: each record is one event as `ParseEvents` reads it (serve's
  lookahead can judge records ahead of a cycle only then);
- `collect`: a cycle's records turned into the graph's records, with what the state file
  saves for the format (spans still pending, traces finished);
- `gauges`: what the format exports of the state it keeps;
- `file_source` and `counted_as`: the source of `ragpulse run` and what its summary counts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from ragpulse.pipeline.formats.otlp import Arrival, InputFormat
from ragpulse.pipeline.metrics import catalogue
from ragpulse.pipeline.records import SourceRecord

__all__ = ["EventInput", "InputBatch", "SpanStore", "TraceInput", "input_for"]


class SpanStore(Protocol):
    """Where the spans of traces still being assembled are kept between cycles (serve's
    state store)."""

    def pending_spans(self, topic: str) -> list[Arrival]: ...

    def finished_traces(self, topic: str, trace_ids: Iterable[str]) -> set[str]: ...

    def pending_trace_count(self, topic: str) -> int: ...


@dataclasses.dataclass(frozen=True, slots=True)
class InputBatch:
    """A cycle's records for the graph, and what the state file saves for the format in the
    cycle's transaction: spans still pending (`spans_added`) and traces that left
    (`traces_finished`)."""

    records: list[SourceRecord]
    spans_added: tuple[Arrival, ...] = ()
    traces_finished: frozenset[str] = frozenset()


class EventInput:
    """--input-format ragpulse: one inference-log event per record (pipeline/formats/events.py)."""

    reads_here = False
    records_are_events = True
    counted_as = "lines"

    def collect(
        self, records: Iterable[SourceRecord], *, now: float, store: SpanStore, topic: str
    ) -> InputBatch:
        return InputBatch(list(records))

    def gauges(self, store: SpanStore, topic: str) -> dict[str, float]:
        return {}

    def file_source(self, path: Path, max_bytes: int) -> Any:
        from ragpulse.pipeline.sources.files import ReadLines

        return ReadLines(path, max_bytes)


@dataclasses.dataclass(frozen=True, slots=True)
class TraceInput:
    """--input-format otlp_json|otlp_proto: OTLP span batches, assembled into one event per
    trace once its --trace-assembly-wait is over (pipeline/sources/otlp.py)."""

    encoding: InputFormat
    wait_seconds: float

    reads_here = True
    records_are_events = False
    counted_as = "traces and unreadable records"

    def collect(
        self, records: Iterable[SourceRecord], *, now: float, store: SpanStore, topic: str
    ) -> InputBatch:
        from ragpulse.pipeline.sources.otlp import collect_traces, log_batch

        batch = collect_traces(
            records,
            store.pending_spans(topic),
            encoding=self.encoding,
            now=now,
            wait=self.wait_seconds,
            origin=topic,
            finished=lambda ids: store.finished_traces(topic, ids),
        )
        log_batch(batch)
        return InputBatch(list(batch.records), batch.spans_added, batch.traces_finished)

    def gauges(self, store: SpanStore, topic: str) -> dict[str, float]:
        return {catalogue.TRACES_PENDING: store.pending_trace_count(topic)}

    def file_source(self, path: Path, max_bytes: int) -> Any:
        import time

        import apache_beam as beam

        from ragpulse.pipeline.sources.otlp import collect_traces, read_file

        # Every trace of a file is complete once the whole file is read.
        traces = collect_traces(
            read_file(path, self.encoding, max_bytes),
            (),
            encoding=self.encoding,
            now=time.time(),
            wait=0.0,
            origin=str(path),
            final=True,
        )
        return beam.Create(traces.records)


def input_for(name: InputFormat, trace_wait_seconds: float = 0.0) -> EventInput | TraceInput:
    """The input format called `name` (--input-format)."""
    return EventInput() if name == "ragpulse" else TraceInput(name, trace_wait_seconds)

