"""`ragpulse explain`: the failing answers of a time window, with the judges' rationales.

For the person an alert or a dashboard sent here: which answers did the judges rate `no` (or
could not grade), and why. Reads verdict rows (see `pipeline.formats.verdict_rows`) from the
verdicts topic `ragpulse serve` publishes (`--kafka-bootstrap` with `--topic` or `--verdicts-topic`)
or from a file run's output directory (`--run-output`), keeps the failing verdicts whose event
time falls in the window, and prints them newest first as a table, or as JSON lines (`--json`).

A verdict row read twice (serve publishes at least once) is shown once. Rows that are not
verdict rows are skipped with a warning naming where they are. Imports neither Beam nor the
judges, so it starts in well under a second.
"""

from __future__ import annotations

import dataclasses
import shutil
import sys
import time
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

import orjson
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from ragpulse.pipeline.formats.verdict_rows import (
    FailingVerdict,
    InvalidVerdictRow,
    failing_verdicts,
)
from ragpulse.pipeline.settings.models import ExplainSettings
from ragpulse.pipeline.sinks import VERDICTS_FILE
from ragpulse.pipeline.windows import isoformat_utc

# Serve publishes a row after judging its event, so the row's record time is later than its
# event time, unless the chatbot's clock runs ahead of serve's. Seeking by record time this far
# before the window covers that skew.
_CLOCK_SKEW_MARGIN_S = 3600.0


class SourceError(Exception):
    """The verdict rows cannot be read (no such file or topic, broker unreachable)."""


@dataclasses.dataclass(frozen=True)
class Selection:
    """Which failing verdicts to show: event time in [start, end), and label filters."""

    start: float | None = None
    end: float | None = None
    judge: str | None = None
    app: str | None = None
    model: str | None = None
    rating: str | None = None  # "no" or "error"; None for both

    def keeps(self, v: FailingVerdict) -> bool:
        return (
            (self.start is None or v.event_time >= self.start)
            and (self.end is None or v.event_time < self.end)
            and self.judge in (None, v.judge)
            and self.app in (None, v.app)
            and self.model in (None, v.model)
            and self.rating in (None, v.rating)
        )

    def describe(self) -> str:
        start = "the beginning" if self.start is None else isoformat_utc(self.start)
        end = "now" if self.end is None else isoformat_utc(self.end)
        return f"event time {start} .. {end}"


def select(
    rows: Iterable[tuple[str, bytes]], selection: Selection, warn: IO[str]
) -> list[FailingVerdict]:
    """The failing verdicts of `rows` ((where, raw row)) that `selection` keeps, newest first.

    A (request_id, judge) pair read more than once is kept once (its last reading).
    """
    kept: dict[tuple[str, str], FailingVerdict] = {}
    for where, raw in rows:
        try:
            row = orjson.loads(raw)
            if not isinstance(row, dict):
                raise InvalidVerdictRow("not a JSON object")
            verdicts = list(failing_verdicts(row))
        except (orjson.JSONDecodeError, InvalidVerdictRow) as exc:
            print(f"ragpulse explain: skipped {where}: not a verdict row ({exc})", file=warn)
            continue
        for v in verdicts:
            if selection.keeps(v):
                kept[(v.request_id, v.judge)] = v
    return sorted(kept.values(), key=lambda v: (-v.event_time, v.request_id, v.judge))


# --- sources -----------------------------------------------------------------------------------


def run_output_rows(out_dir: Path) -> Iterator[tuple[str, bytes]]:
    """The rows of `out_dir`/verdicts.jsonl, each with its file:line."""
    path = out_dir / VERDICTS_FILE
    if not out_dir.is_dir():
        raise SourceError(f"--run-output {out_dir} is not a directory")
    if not path.is_file():
        raise SourceError(
            f"no {VERDICTS_FILE} in {out_dir}: is it the --output directory of `ragpulse run`?"
        )
    with path.open("rb") as f:
        for number, line in enumerate(f, start=1):
            if line.strip():
                yield f"{path}:{number}", line


def topic_rows(
    bootstrap: str, topic: str, since: float | None, timeout_s: float
) -> Iterator[tuple[str, bytes]]:
    """Every row of `topic` up to its end as of now, each with its topic/partition@offset.

    With `since`, only records published at or after `since` minus the clock-skew margin are
    read (rows are published after their event time), each partition from the first of them.
    """
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=bootstrap,
            enable_auto_commit=False,
            request_timeout_ms=int(timeout_s * 1000) + 1000,
            bootstrap_timeout_ms=int(timeout_s * 1000),
        )
    except KafkaError as exc:
        raise SourceError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    try:
        yield from _read_to_end(consumer, topic, since, timeout_s)
    except KafkaError as exc:
        raise SourceError(f"reading {topic} from {bootstrap} failed: {exc}") from None
    finally:
        consumer.close(autocommit=False)


def _read_to_end(
    consumer: KafkaConsumer, topic: str, since: float | None, timeout_s: float
) -> Iterator[tuple[str, bytes]]:
    deadline = time.monotonic() + timeout_s
    parts = consumer.partitions_for_topic(topic)
    while not parts and time.monotonic() < deadline:
        time.sleep(0.1)
        parts = consumer.partitions_for_topic(topic)
    if not parts:
        raise SourceError(
            f"topic {topic!r} not found: serve publishes failing verdict rows to TOPIC.verdicts "
            "unless --publish-verdicts none (or --verdicts-topic names another)"
        )
    tps = [TopicPartition(topic, p) for p in sorted(parts)]
    timeout_ms = int(timeout_s * 1000)
    begins = consumer.beginning_offsets(tps, timeout_ms=timeout_ms)
    ends = consumer.end_offsets(tps, timeout_ms=timeout_ms)
    consumer.assign(tps)
    starts = dict(begins)
    target = -1 if since is None else int((since - _CLOCK_SKEW_MARGIN_S) * 1000)
    if since is not None:
        found = consumer.offsets_for_times({tp: target for tp in tps}, timeout_ms=timeout_ms)
        # No record at or after the target: nothing of the window there, read from the end.
        starts = {tp: found[tp].offset if found.get(tp) else ends[tp] for tp in tps}
    for tp in tps:
        consumer.seek(tp, starts[tp])
    pending = set(tps)
    last_progress = time.monotonic()
    while pending:
        for tp, records in consumer.poll(timeout_ms=200).items():
            for r in records:
                # Also skipped here: some brokers (Tansu) answer a search by time with offset 0.
                if r.value is not None and r.timestamp >= target:
                    yield f"{tp.topic}/{tp.partition}@{r.offset}", r.value
            last_progress = time.monotonic()
        # Some brokers (Tansu) list a partition's end at its last batch's first offset + 1;
        # reaching that means the whole last batch was read, as batches are fetched whole.
        pending = {tp for tp in pending if consumer.position(tp, timeout_ms=timeout_ms) < ends[tp]}
        if pending and time.monotonic() - last_progress > timeout_s:
            stuck = ", ".join(f"{tp.topic}/{tp.partition}" for tp in sorted(pending))
            raise SourceError(f"no progress reading {stuck} for {timeout_s:.0f}s")


# --- output ------------------------------------------------------------------------------------


def _one_line(text: str | None) -> str:
    """`text` on one line without control characters: rationales quote the chatbot's answer,
    which must not move the cursor or recolour the terminal."""
    if not text:
        return "-"
    cleaned = "".join(" " if unicodedata.category(c)[0] == "C" else c for c in text)
    return " ".join(cleaned.split())


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


# Column name and widest cell; a request_id is what the reader copies, so it is cut last.
_COLUMNS = (("event_time", 20), ("request_id", 64), ("app", 20), ("model", 20),
            ("judge", 18), ("rating", 6))


def table(verdicts: Sequence[FailingVerdict], width: int) -> str:
    """A table, one failing verdict per line, columns as wide as their cells (up to a cap) and
    the rationale (or error message) cut to fit `width` characters."""
    rows = [
        [_one_line(c) for c in (isoformat_utc(v.event_time), v.request_id, v.app, v.model,
                                v.judge, v.rating)]
        + [_one_line(v.error_message if v.rating == "error" else v.rationale)]
        for v in verdicts
    ]
    widths = [
        min(cap, max([len(name), *(len(r[i]) for r in rows)]))
        for i, (name, cap) in enumerate(_COLUMNS)
    ]
    reason_width = max(30, width - sum(w + 1 for w in widths))
    lines = []
    for cells in [[name for name, _ in _COLUMNS] + ["rationale"], *rows]:
        fixed = (f"{_cut(c, w):<{w}}" for c, w in zip(cells, widths, strict=False))
        lines.append(" ".join(fixed) + " " + _cut(cells[-1], reason_width))
    return "\n".join(lines)


def json_line(v: FailingVerdict) -> str:
    return orjson.dumps(
        {
            "request_id": v.request_id,
            "event_time": isoformat_utc(v.event_time),
            "app": v.app,
            "model": v.model,
            "judge": v.judge,
            "rating": v.rating,
            "rationale": v.rationale,
            "error_message": v.error_message,
        }
    ).decode()


# --- command -----------------------------------------------------------------------------------


def _source(settings: ExplainSettings, since: float | None) -> Iterator[tuple[str, bytes]]:
    if settings.run_output is not None:
        return run_output_rows(settings.run_output)
    assert settings.kafka_bootstrap is not None and settings.topic_to_read is not None
    return topic_rows(
        settings.kafka_bootstrap, settings.topic_to_read, since, settings.kafka_timeout_seconds
    )


def main(settings: ExplainSettings) -> int:
    start, end = settings.window(time.time())
    selection = Selection(
        start, end, settings.judge, settings.app, settings.model, settings.rating
    )
    rows = _source(settings, start)
    try:
        found = select(rows, selection, sys.stderr)
    except SourceError as exc:
        print(f"ragpulse explain: {exc}", file=sys.stderr)
        return 1
    shown = found[: settings.limit] if settings.limit else found
    if settings.as_json:
        for v in shown:
            sys.stdout.write(json_line(v) + "\n")
    elif shown:
        print(table(shown, shutil.get_terminal_size((160, 24)).columns))
    more = f"; the {len(shown)} most recent shown (--limit 0 for all)" if len(shown) < len(
        found
    ) else ""
    print(
        f"{len(found)} failing verdicts, {selection.describe()}{more}",
        file=sys.stderr if settings.as_json else sys.stdout,
    )
    return 0
