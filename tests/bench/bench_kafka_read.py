"""Kafka read throughput of `pipeline.sources.kafka.ReadKafkaRanges` on FnApiRunner.

Starts an Apache Kafka broker, produces N records of SIZE bytes over P partitions, then reads them
back REPEAT times as one bounded Beam pipeline per run, and reports the median events/s next to a
plain kafka-python loop over the same ranges (the ceiling the Beam source can reach). Also times
`log_bounds` and a join-free group commit (`KafkaGroup.commit`).

    .venv/bin/python tests/bench/bench_kafka_read.py [--events 50000] [--size 1024]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import apache_beam as beam
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from kafka import KafkaConsumer, KafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for kafka_broker

from kafka_broker import ApacheKafkaBroker

from ragpulse.pipeline.sources.kafka import (
    KafkaGroup,
    KafkaRangeSource,
    ReadKafkaRanges,
    log_bounds,
    plan_batch,
    read_range,
)


def beam_read(bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]]) -> int:
    with beam.Pipeline(runner=FnApiRunner()) as p:
        counted = (
            p
            | ReadKafkaRanges(KafkaRangeSource(bootstrap, topic), ranges)
            | beam.combiners.Count.Globally()
        )
        counted | beam.Map(_check, sum(stop - start for start, stop in ranges.values()))
    return sum(stop - start for start, stop in ranges.values())


def _check(got: int, want: int) -> None:
    if got != want:
        raise AssertionError(f"read {got} records, planned {want}")


def plain_read(bootstrap: str, topic: str, ranges: dict[int, tuple[int, int]]) -> int:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=5000,
        max_partition_fetch_bytes=8 * 1024 * 1024, fetch_max_bytes=64 * 1024 * 1024,
    )
    n = 0
    for partition, (start, stop) in ranges.items():
        n += sum(1 for _ in read_range(consumer, topic, partition, start, stop))
    consumer.close()
    return n


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with ApacheKafkaBroker() as broker:
        broker.create_topic("bench", args.partitions)
        producer = KafkaProducer(
            bootstrap_servers=broker.bootstrap, linger_ms=20, batch_size=512 * 1024
        )
        payload = b"x" * args.size
        started = time.perf_counter()
        for i in range(args.events):
            producer.send("bench", value=payload, partition=i % args.partitions)
        producer.flush()
        produce_s = time.perf_counter() - started
        producer.close()

        timings: dict[str, list[float]] = {"end_offsets": [], "commit_offsets": []}
        for _ in range(args.repeat):
            t = time.perf_counter()
            ends = log_bounds(broker.bootstrap, "bench").ends
            timings["end_offsets"].append(time.perf_counter() - t)
            t = time.perf_counter()
            KafkaGroup(broker.bootstrap, "bench-group", "bench").commit(ends)
            timings["commit_offsets"].append(time.perf_counter() - t)
        ranges = plan_batch({}, ends, args.events)
        readers = (("beam (FnApiRunner)", beam_read), ("plain kafka-python", plain_read))
        rates: dict[str, list[float]] = {name: [] for name, _ in readers}
        for _ in range(args.repeat):
            for name, read in readers:
                t = time.perf_counter()
                n = read(broker.bootstrap, "bench", ranges)
                rates[name].append(n / (time.perf_counter() - t))
    print(f"{args.events} events x {args.size} B over {args.partitions} partitions "
          f"(produced at {args.events / produce_s:,.0f}/s)")
    for name, values in rates.items():
        print(f"  {name:22s} median {statistics.median(values):>10,.0f} events/s  "
              f"(runs: {', '.join(f'{v:,.0f}' for v in values)})")
    beam_median = statistics.median(rates["beam (FnApiRunner)"])
    plain_median = statistics.median(rates["plain kafka-python"])
    print(f"  beam / plain ratio     {beam_median / plain_median:.2f}")
    for name, values in timings.items():
        print(f"  {name:22s} median {statistics.median(values) * 1000:,.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
