"""The file source of `ragpulse run`: one inference-log event per line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import apache_beam as beam

from ragpulse.pipeline.composite import composite_transform
from ragpulse.pipeline.records import HEAD_BYTES, SourceRecord

_READ_CHUNK = 1 << 16


def numbered_lines(f: IO[bytes], path: str, max_bytes: int) -> Iterator[SourceRecord]:
    """`SourceRecord`s for each line of `f`, numbered from 1, without line terminators.

    A line longer than `max_bytes` is never held whole in memory: its head is kept for the
    dead-letter row and the rest is skipped up to the next newline.
    """
    number = 0
    while True:
        line = f.readline(max_bytes + 1)
        if not line:
            return
        number += 1
        if len(line) > max_bytes and not line.endswith(b"\n"):
            size = len(line)
            while True:
                rest = f.readline(_READ_CHUNK)
                size += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break
            yield SourceRecord(line[:HEAD_BYTES], path, None, number, oversize_bytes=size)
            continue
        yield SourceRecord(line.rstrip(b"\r\n"), path, None, number)


class _ReadNumberedLines(beam.DoFn):
    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes

    def process(self, path: str) -> Iterator[SourceRecord]:
        with open(path, "rb") as f:
            yield from numbered_lines(f, path, self._max_bytes)


@composite_transform
def ReadLines(pbegin: Any, path: Path, max_bytes: int) -> Any:
    """Bounded source: the lines of `path` as numbered `SourceRecord`s (see `numbered_lines`)."""
    return (
        pbegin
        | "InputPath" >> beam.Create([str(path)])
        | "ReadNumberedLines" >> beam.ParDo(_ReadNumberedLines(max_bytes))
    )
