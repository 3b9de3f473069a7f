"""The trace source of `--input-format otlp_json|otlp_proto`: OTLP records in, assembled
events out, read in the calling process (see pipeline/formats/otlp.py for why not in the graph).

serve reads a cycle's offset ranges with `pipeline.sources.kafka.KafkaRangeSource.read`;
`read_file` reads the records of a file (`ragpulse run`): OTLP JSON lines, as the Collector's
file exporter writes them, or protobuf messages each behind a 4-byte big-endian length (its
`format: proto`). `collect_traces` decodes them, adds the spans still pending from earlier
cycles and assembles what is due; what it returns goes to the Beam graph as a list of
`SourceRecord`s and, in serve, to the state store.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Iterable, Iterator
from pathlib import Path

from ragpulse.pipeline.formats.events import InvalidEvent
from ragpulse.pipeline.formats.otlp import Arrival, InputFormat, assemble, decode_spans
from ragpulse.pipeline.records import HEAD_BYTES, SourceRecord
from ragpulse.pipeline.sources.files import numbered_lines

__all__ = ["TraceBatch", "collect_traces", "log_batch", "read_file"]

log = logging.getLogger(__name__)

_LENGTH_BYTES = 4


@dataclasses.dataclass(frozen=True, slots=True)
class TraceBatch:
    """One batch's outcome: `records` for the graph (assembled events, refused traces and
    records that are not OTLP), the new spans still pending (`spans_added`) and the traces
    that left (`traces_finished`), for the state store; `pending_traces` still waiting."""

    records: tuple[SourceRecord, ...]
    spans_added: tuple[Arrival, ...]
    traces_finished: frozenset[str]
    pending_traces: int
    records_read: int


def collect_traces(
    records: Iterable[SourceRecord],
    pending: Iterable[Arrival],
    *,
    encoding: InputFormat,
    now: float,
    wait: float,
    origin: str,
    final: bool = False,
    finished: Callable[[set[str]], Collection[str]] = lambda _: (),
) -> TraceBatch:
    """Decode `records` (seen at `now`), add the `pending` spans of earlier batches and
    assemble every trace whose wait is over (all of them when `final`). `finished` tells
    which of the given trace ids were assembled or refused in an earlier batch.

    `records` is consumed as it comes: only the span parts of a record are kept, not its bytes
    (a Collector batch is mostly ids, times and attributes no judge reads)."""
    if encoding == "ragpulse":
        raise ValueError("collect_traces reads OTLP records, not ragpulse events")
    passed_on: list[SourceRecord] = []
    arrived: list[Arrival] = []
    read = 0
    for r in records:
        read += 1
        if r.oversize_bytes is not None:
            passed_on.append(r)  # ParseEvents dead-letters it with its size
            continue
        try:
            parts = decode_spans(r.raw, encoding)
            for part in parts:
                part.to_json()  # what the state store saves of a pending span must encode
        except InvalidEvent as exc:
            passed_on.append(dataclasses.replace(r, refused=exc.reason))
            continue
        except Exception as exc:  # one record never fails the batch: it is refused
            reason = f"could not decode the OTLP record ({type(exc).__name__}: {exc}"[:300]
            passed_on.append(dataclasses.replace(r, refused=reason + ")"))
            continue
        arrived.extend(Arrival(p, r.partition, r.position, now) for p in parts)
    assembly = assemble(
        [*pending, *arrived],
        now=now,
        wait=wait,
        origin=origin,
        final=final,
        done_before=finished({a.part.trace_id for a in arrived}),
    )
    new = set(map(id, arrived))
    return TraceBatch(
        records=(*passed_on, *assembly.records),
        spans_added=tuple(a for a in assembly.pending if id(a) in new),
        traces_finished=assembly.finished,
        pending_traces=len({a.part.trace_id for a in assembly.pending}),
        records_read=read,
    )


def log_batch(batch: TraceBatch) -> None:
    log.info(
        "%d OTLP records read; %d traces assembled or refused, %d still pending",
        batch.records_read,
        len(batch.traces_finished),
        batch.pending_traces,
    )


def read_file(path: Path, encoding: InputFormat, max_bytes: int) -> Iterator[SourceRecord]:
    """The OTLP records of a file: JSON lines (numbered from 1) or length-prefixed protobuf
    messages (numbered from 1); a record over `max_bytes` comes as its head."""
    with open(path, "rb") as f:
        if encoding == "otlp_json":
            yield from numbered_lines(f, str(path), max_bytes)
            return
        number = 0
        while head := f.read(_LENGTH_BYTES):
            number += 1
            size = int.from_bytes(head, "big")
            if len(head) < _LENGTH_BYTES:
                yield SourceRecord(
                    head,
                    str(path),
                    None,
                    number,
                    refused=f"the file ends inside the length of message {number}",
                )
                return
            if size > max_bytes:
                kept = f.read(min(size, HEAD_BYTES))
                yield SourceRecord(kept, str(path), None, number, oversize_bytes=size)
                f.seek(size - len(kept), 1)
                continue
            raw = f.read(size)
            if len(raw) < size:
                yield SourceRecord(
                    raw,
                    str(path),
                    None,
                    number,
                    refused=f"the file ends inside message {number} ({len(raw)} of {size} bytes)",
                )
                return
            yield SourceRecord(raw, str(path), None, number)
