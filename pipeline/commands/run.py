"""`ragpulse run`: judge a file of inference-log events end to end.

Reads one JSON event per line, judges a deterministic sample, and writes verdicts, windowed
ratings, dead letters and a Prometheus textfile into the output directory.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import apache_beam as beam

from pipeline import counting
from pipeline.graph import (
    DEAD_LETTER_FILE,
    VERDICTS_FILE,
    WINDOWS_FILE,
    BatchConfig,
    BatchResult,
    run_batch,
)
from pipeline.service.labels import LabelBudget, LabelLimits, add_label_arguments, label_limits
from pipeline.settings import add_judge_arguments, judge_settings, positive_duration, sample_rate
from pipeline.sinks.prometheus import MetricsSnapshot, write_textfile
from pipeline.stages import SourceRecord
from pipeline.windows import isoformat_utc

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.prom"
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
            yield SourceRecord(line[:4096], path, number, oversize_bytes=size)
            continue
        yield SourceRecord(line.rstrip(b"\r\n"), path, number)


class ReadNumberedLines(beam.DoFn):
    """Reads a file path into numbered `SourceRecord`s (see `numbered_lines`)."""

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes

    def process(self, path: str) -> Iterator[SourceRecord]:
        with open(path, "rb") as f:
            yield from numbered_lines(f, path, self._max_bytes)


def run_file(
    input_path: Path, out_dir: Path, config: BatchConfig, labels: LabelLimits | None = None
) -> BatchResult:
    """Judge every line of `input_path`; write the four outputs into `out_dir`.

    The metrics textfile has its app and model labels bounded by `labels`; the verdict and window
    rows keep the real values.
    """

    def read(p: beam.Pipeline) -> Any:
        return (
            p
            | "InputPath" >> beam.Create([str(input_path)])
            | "ReadNumberedLines" >> beam.ParDo(ReadNumberedLines(config.max_event_bytes))
        )

    result = run_batch(read, config, out_dir)
    windows, counts = LabelBudget(labels or LabelLimits()).bound(result.windows, result.counts)
    # In a bounded file every window is complete once the whole file is read.
    write_textfile(out_dir / METRICS_FILE, MetricsSnapshot(counts, windows))
    return result


def configure_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", type=Path, help="JSON Lines file, one inference-log event per line")
    p.add_argument(
        "--output",
        type=Path,
        default=Path("out"),
        help=f"directory for {VERDICTS_FILE}, {WINDOWS_FILE}, {DEAD_LETTER_FILE} and "
        f"{METRICS_FILE} (default: out/)",
    )
    p.add_argument(
        "--sample-rate",
        type=sample_rate,
        default=1.0,
        help="share of events to judge, chosen by a hash of request_id (default: 1.0)",
    )
    p.add_argument(
        "--window",
        type=positive_duration,
        default=300.0,
        metavar="DURATION",
        help="event-time window size, e.g. 60s, 5m, 1h (default: 5m)",
    )
    p.add_argument(
        "--max-event-bytes",
        type=int,
        default=1_048_576,
        help="longest accepted line; longer ones are dead-lettered (default: 1 MiB)",
    )
    add_label_arguments(p)
    add_judge_arguments(p)


def main(args: argparse.Namespace) -> int:
    if not args.input.is_file():
        raise SystemExit(f"ragpulse run: input file not found: {args.input}")
    judges = judge_settings(args)
    config = BatchConfig(
        judges=judges.spec(),
        sample_rate=args.sample_rate,
        window_seconds=args.window,
        max_event_bytes=args.max_event_bytes,
        judge_batch_size=max(256, judges.concurrency * 16),
    )
    log.info(
        "judging %s with %s (backend %s), sample rate %g, %gs windows",
        args.input,
        ",".join(judges.names),
        judges.backend,
        config.sample_rate,
        config.window_seconds,
    )
    started = time.perf_counter()
    result = run_file(args.input, args.output, config, label_limits(args))
    elapsed = time.perf_counter() - started
    print(summary(result, args.output, elapsed))
    return 0


def summary(result: BatchResult, out_dir: Path, elapsed: float) -> str:
    """The table `ragpulse run` prints: events, then pass ratios per window, app and model.

    Each judge column shows yes / (yes + no) and, in brackets, the graded sample size and the
    errors, so a ratio is never read without its sample.
    """
    c = result.counts
    accepted = c[counting.key("ragpulse_events_total", outcome="accepted")]
    invalid = c[counting.key("ragpulse_events_total", outcome="invalid")]
    sampled = c[counting.key("ragpulse_events_sampled_total")]
    judges = sorted({k.judge for k in result.windows})
    rows: dict[tuple[float, str, str], dict[str, str]] = {}
    for key, counts in result.windows.items():
        pct = f"{counts.yes / counts.graded:.0%}" if counts.graded else "-"
        cell = f"{pct} (n={counts.graded}" + (f", err={counts.error})" if counts.error else ")")
        rows.setdefault((key.window_start, key.app, key.model), {})[key.judge] = cell
    head = f"{'window_start':<21} {'app':<16} {'model':<16}" + "".join(
        f" {j:<22}" for j in judges
    )
    lines = [
        f"read {accepted + invalid} lines in {elapsed:.1f}s: {accepted} accepted, "
        f"{invalid} rejected (see {out_dir / DEAD_LETTER_FILE}), {sampled} sampled and judged",
        "",
        "pass ratio per window: yes / (yes + no), n = yes + no, errors left out",
        head,
    ]
    for (start, app, model), cells in sorted(rows.items()):
        lines.append(
            f"{isoformat_utc(start):<21} {app[:16]:<16} {model[:16]:<16}"
            + "".join(f" {cells.get(j, '-'):<22}" for j in judges)
        )
    lines.append("")
    lines.append(
        f"outputs in {out_dir}/: {VERDICTS_FILE}, {WINDOWS_FILE}, {DEAD_LETTER_FILE}, "
        f"{METRICS_FILE}"
    )
    return "\n".join(lines)
