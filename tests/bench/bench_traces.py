"""What OTLP trace input costs per span, before any judging.

For whoever sizes serve with --input-format otlp_json|otlp_proto. N traces made by the
OpenTelemetry SDK (tests/otlp_spans.py: a CHAIN root, a RETRIEVER with two documents and an LLM
span), shuffled, M spans per Kafka message (1: the worst case; a Collector batch holds up to
its send_batch_size); medians of R runs, in microseconds per span:

    decode      `decode_spans` of every message (otlp_json, otlp_proto)
    assemble    `assemble` over all the parts, every trace due (pipeline/formats/otlp.py)
    parse       `parse_event` of the assembled events (per span, for comparison)
    state       one pending span's round trip through the state store's form
                (`SpanPart.to_json` + `from_json`), as a trace held over cycles pays it

    .venv/bin/python tests/bench/bench_traces.py [--traces N] [--per-message M] [--repeats R]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from otlp_spans import openinference_trace, otlp_json, otlp_proto

from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.formats.otlp import Arrival, SpanPart, assemble, decode_spans


def median_us_per_span(run: Callable[[], object], spans: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / spans * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=int, default=2000)
    ap.add_argument("--per-message", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    spans = [s for _ in range(args.traces) for s in openinference_trace()]
    random.Random(1).shuffle(spans)
    n = len(spans)
    per = args.per_message
    print(f"{args.traces} traces, {n} spans, {per} per message; median of {args.repeats}")
    for name, encode in (("otlp_json", otlp_json), ("otlp_proto", otlp_proto)):
        messages = [encode(spans[i : i + per]) for i in range(0, n, per)]
        size = statistics.median(len(m) for m in messages)
        us = median_us_per_span(
            lambda m=messages, e=name: [decode_spans(x, e) for x in m],  # type: ignore[misc]
            n,
            args.repeats,
        )
        print(f"decode {name:<10} {us:7.1f} us/span   (median message {size:.0f} bytes)")

    parts = [
        Arrival(p, 0, i, 0.0)
        for i, s in enumerate(spans)
        for p in decode_spans(otlp_proto([s]), "otlp_proto")
    ]
    us = median_us_per_span(
        lambda: assemble(parts, now=1.0, wait=0.0, origin="spans"), n, args.repeats
    )
    print(f"assemble          {us:7.1f} us/span")
    records = assemble(parts, now=1.0, wait=0.0, origin="spans").records
    us = median_us_per_span(lambda: [parse_event(r.raw) for r in records], n, args.repeats)
    print(f"parse             {us:7.1f} us/span   ({len(records)} events)")
    us = median_us_per_span(
        lambda: [SpanPart.from_json(a.part.to_json()) for a in parts], n, args.repeats
    )
    print(f"state round trip  {us:7.1f} us/span")


if __name__ == "__main__":
    main()
