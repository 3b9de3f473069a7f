"""/metrics size and serve's memory while 30,000 distinct `app` values flow through serve.

For whoever sets --max-label-values. An Apache Kafka broker and `ragpulse serve` (local judges)
run on 127.0.0.1; simulated events, each rewritten to carry an app label of its own, are produced in
steps; after each step, once serve has read everything, the bench prints the samples in one
scrape, the scrape's size, the distinct app values in it, and serve's resident memory (VmRSS).
Each --max-label-values given is measured on a fresh topic and state; a huge value shows what
an unbounded label costs.

    .venv/bin/python tests/bench/bench_cardinality.py [--steps 1000,10000,30000]
                                                      [--max-label-values 100,1000000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the helpers

from kafka_broker import ApacheKafkaBroker
from serve_process import Scrape, ServeProcess

from ragpulse.pipeline.commands.simulate import simulate

T0 = 1_763_632_800.0


def payloads(n: int) -> list[bytes]:
    """`n` valid simulated events, event i with app `tenant-i` (60 events/s of event time)."""
    out = []
    for i, event in enumerate(simulate(7, n, T0, rate=60)):
        body = orjson.loads(event.payload)
        body["app"] = f"tenant-{i:05d}"
        out.append(orjson.dumps(body))
    return out


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def read_all(n: int) -> Callable[[Scrape], bool]:
    return lambda m: m.total("ragpulse_events_total") >= n


def measure(broker: ApacheKafkaBroker, cap: int, steps: list[int], events: list[bytes]) -> None:
    topic = f"cardinality-{cap}"
    broker.create_topic(topic, 1)
    with tempfile.TemporaryDirectory() as tmp:
        serve = ServeProcess(
            broker.bootstrap,
            topic,
            Path(tmp) / "state.sqlite",
            ["--window", "60s", "--max-label-values", str(cap), "--max-batch-events", "5000"],
        ).start()
        try:
            produced = 0
            for step in steps:
                broker.produce(topic, events[produced:step], partition=0)
                produced = step
                started = time.monotonic()
                serve.wait_for(read_all(step), 900, f"{step} events read")
                drained = time.monotonic() - started
                time.sleep(1.0)  # the heartbeat-only refresh after the cycle
                with urllib.request.urlopen(serve.url + "/metrics", timeout=30) as response:
                    body = response.read()
                scrape = serve.metrics(timeout=30)
                samples = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
                apps = {lab["app"] for _, lab, _ in scrape.samples if "app" in lab}
                overflow = scrape.value("ragpulse_label_overflow_total", label="app") or 0
                assert serve.process is not None
                print(
                    f"| {cap} | {step:,} | {samples:,} | {len(body) / 1024:,.0f} | {len(apps):,} "
                    f"| {overflow:,.0f} | {rss_mib(serve.process.pid):,.0f} | {drained:.0f} |",
                    flush=True,
                )
        finally:
            serve.stop()
            print(serve.log_tail(3), file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="1000,10000,30000")
    parser.add_argument("--max-label-values", default="100,1000000")
    args = parser.parse_args()
    steps = [int(s) for s in args.steps.split(",")]
    events = payloads(max(steps))
    print("| --max-label-values | distinct apps sent | samples in /metrics | scrape KiB "
          "| apps in /metrics | overflow_total{app} | serve RSS MiB | drain s |")
    print("|---|---|---|---|---|---|---|---|")
    with ApacheKafkaBroker() as broker:
        for cap in (int(c) for c in args.max_label_values.split(",")):
            measure(broker, cap, steps, events)


if __name__ == "__main__":
    main()
