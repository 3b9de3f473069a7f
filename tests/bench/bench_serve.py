"""End-to-end benchmark of `ragpulse serve` against a real Apache Kafka broker.

For whoever sizes or tunes `ragpulse serve`. Everything runs on 127.0.0.1: an Apache Kafka
broker (`tests/kafka_broker.ApacheKafkaBroker`), `ragpulse serve` as a subprocess scraped over
/metrics, and for the LLM scenario the local OpenAI stand-in (`tests/fake_openai.FakeOpenAI`).
Every scenario is bounded in time and stops what it started. Each prints a markdown table.

    drain      pre-load a backlog (default 100k events, 4 partitions), then time how fast
               `serve --judge-backend local --sample-rate 1` drains it, per --max-batch-events,
               median over --repeats; `--profile S` also samples the serve process with py-spy
               (`.venv/bin/pip install py-spy`) for S seconds and splits the time by stage.
    scale      the same backlog drained by 1 and by 2 instances (`--instances 2`, one
               partition half each, each its own state file), interleaved, median over
               --repeats: events/s of the instances together and the ratio 2 / 1.
    paced      `ragpulse simulate` at fixed rates (default 3000 and 5000 events/s for 60 s) while
               serve runs; backlog (end offsets - ragpulse_events_total) and the
               ragpulse_consumer_lag gauge over time.
    llm        LLM judges on the fake server (300 ms replies), traffic at 200 events/s; per
               sample rate the judged events/s, backlog growth and the server's peak concurrency,
               against the bound concurrency / latency.
    llm-drain  LLM judges on the fake server (fixed --latency per reply) drain a pre-loaded
               backlog in cycles of --max-batch events: the calls/s the server saw from
               serve's first call to its last, against the bound --concurrency / --latency,
               the mean number of calls in flight and the longest stretch with none;
               `--code A --code B` measures checkouts side by side, interleaved.
    freshness  paced traffic (500 events/s), --trigger-interval 1s, /metrics scraped every
               0.2 s: seconds from an event's production to the first scrape whose counters
               (and in-progress window) include it; median and p95.
    memory     serve's resident memory (VmRSS) while it drains 1.8 M events (one hour at
               500 events/s, event times spread over that hour) as fast as it can, or with
               --realtime S, while `ragpulse simulate` sends 500 events/s for S seconds.

    .venv/bin/python tests/bench/bench_serve.py drain [--events 100000] [--max-batch 5000,20000]
    .venv/bin/python tests/bench/bench_serve.py scale [--events 100000] [--repeats 3]
    .venv/bin/python tests/bench/bench_serve.py paced [--rates 3000,5000] [--duration 60]
    .venv/bin/python tests/bench/bench_serve.py llm [--sample-rates 0.1,0.25,0.5,0.75]
    .venv/bin/python tests/bench/bench_serve.py llm-drain [--events 2000] [--code DIR --code DIR]
    .venv/bin/python tests/bench/bench_serve.py freshness [--rate 500] [--duration 60]
    .venv/bin/python tests/bench/bench_serve.py memory [--events 1800000] [--realtime 600]

The machine has 2 cores: the broker, the traffic generator and serve share them, so the paced
figures are lower bounds of what serve does on a machine of its own.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for the helpers

from fake_openai import FakeOpenAI
from kafka_broker import ApacheKafkaBroker
from processes import free_port, health_port_args

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.sources.kafka import log_bounds

RAGPULSE = Path(sys.executable).with_name("ragpulse")
PY_SPY = Path(sys.executable).with_name("py-spy")


# --------------------------------------------------------------------------------------------
# helpers: traffic, the serve process, /metrics
# --------------------------------------------------------------------------------------------


def preload(
    bootstrap: str, topic: str, n: int, partitions: int, *, event_rate: float, start: float
) -> float:
    """Produce `n` simulated events round-robin over `partitions`; returns events/s produced."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=50, batch_size=1024 * 1024, acks=1,
        max_request_size=8 * 1024 * 1024,
    )
    failures: list[Exception] = []
    began = time.perf_counter()
    try:
        for i, event in enumerate(simulate(7, n, start, rate=event_rate)):
            producer.send(
                topic, value=event.payload, partition=i % partitions,
                timestamp_ms=round(event.event_time * 1000),
            ).add_errback(failures.append)
        producer.flush(timeout=300)
    finally:
        producer.close(timeout=10)
    if failures:
        raise RuntimeError(f"{len(failures)} records not acknowledged: {failures[0]!r}")
    return n / (time.perf_counter() - began)


class PacedProducer(threading.Thread):
    """`ragpulse simulate`'s paced send loop, in a thread that knows when each event left.

    Event i is sent at `t0 + i / rate` (wall clock) and carries that time as its event time,
    so production time and event time agree to the producer's pacing jitter.
    """

    def __init__(self, bootstrap: str, topic: str, rate: float, duration: float) -> None:
        super().__init__(name="paced-producer", daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.n = round(rate * duration)
        self.t0 = 0.0
        self.sent = 0
        self.ready = threading.Event()
        self.stop_flag = threading.Event()

    def run(self) -> None:
        producer = KafkaProducer(  # the settings of pipeline.commands.simulate.produce_paced
            bootstrap_servers=self.bootstrap, linger_ms=20, batch_size=256 * 1024, acks=1,
            retries=5,
        )
        try:
            self.t0 = time.time() + 0.2
            self.ready.set()
            for i, event in enumerate(simulate(11, self.n, self.t0, rate=self.rate)):
                if self.stop_flag.is_set():
                    break
                wait = event.event_time - time.time()
                if wait > 0:
                    time.sleep(wait)
                producer.send(
                    self.topic, value=event.payload, timestamp_ms=round(event.event_time * 1000)
                )
                self.sent = i + 1
            producer.flush(timeout=60)
        finally:
            producer.close(timeout=10)


def start_simulate(
    bootstrap: str, topic: str, rate: float, duration: float, log: Path
) -> subprocess.Popen[bytes]:
    """`ragpulse simulate` as a subprocess (the topic must already exist)."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(RAGPULSE), "simulate", "--kafka-bootstrap", bootstrap, "--topic", topic,
             "--rate", str(rate), "--duration", f"{duration}s", "--seed", "3"],
            stdout=out, stderr=subprocess.STDOUT,
        )


def ragpulse_command(code: Path | None) -> list[str]:
    """How to start `ragpulse` from this checkout (its console script) or from another checkout
    `code` (on PYTHONPATH): `python -m` its CLI module, `ragpulse.pipeline.cli` since the
    ragpulse.* layout and `pipeline.cli` in checkouts from before it."""
    if code is None:
        return [str(RAGPULSE)]
    new_layout = (code / "ragpulse" / "__init__.py").exists()
    return [sys.executable, "-m", "ragpulse.pipeline.cli" if new_layout else "pipeline.cli"]


@dataclass
class Serve:
    """`ragpulse serve` as a subprocess with its own state file and metrics port."""

    bootstrap: str
    topic: str
    workdir: Path
    extra: Sequence[str] = ()
    code: Path | None = None  # a checkout of ragpulse to run instead of this one
    port: int = 0
    process: subprocess.Popen[bytes] | None = None
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.port = free_port()
        self.log_path = self.workdir / f"serve-{self.port}.log"

    def start(self, timeout_s: float = 60.0) -> float:
        """Start and wait until /metrics answers; returns that moment (time.time())."""
        cmd = [
            *ragpulse_command(self.code), "serve", "--kafka-bootstrap", self.bootstrap,
            "--topic", self.topic,
            "--state", str(self.workdir / f"state-{self.port}.sqlite"),
            "--metrics-host", "127.0.0.1", "--metrics-port", str(self.port),
            *health_port_args(self.code),
            "--group-id", f"bench-{self.port}", *self.extra,
        ]
        env = None if self.code is None else {**os.environ, "PYTHONPATH": str(self.code)}
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve exited early:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                self.scrape()
                return time.time()
            time.sleep(0.05)
        raise RuntimeError(f"serve did not answer /metrics in {timeout_s}s:\n{self.log_tail()}")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def scrape(self) -> dict[str, list[tuple[dict[str, str], float]]]:
        """Samples of /metrics by sample name."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            text = r.read().decode()
        out: dict[str, list[tuple[dict[str, str], float]]] = collections.defaultdict(list)
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[s.name].append((s.labels, s.value))
        return out

    def stop(self) -> None:
        """SIGTERM (the cycle in flight finishes), then SIGKILL after 60 s."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def total(metrics: dict[str, list[tuple[dict[str, str], float]]], name: str, **want: str) -> float:
    """Sum of the samples of `name` whose labels include `want`."""
    return sum(
        v for labels, v in metrics.get(name, []) if all(labels.get(k) == x for k, x in want.items())
    )


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` plus its children's (Beam may start workers), in KiB."""
    pids = [pid]
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                pids += [int(c) for c in f.read().split()]
    kib = 0
    for p in pids:
        with contextlib.suppress(OSError), open(f"/proc/{p}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    kib += int(line.split()[1])
    return kib


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far: other work on the 2 cores does not change it."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_elsewhere() -> str:
    """Load average now, to judge how much the shared 2 cores were used by others."""
    return "load average {:.1f} {:.1f} {:.1f}".format(*os.getloadavg())


def backlog(bootstrap: str, topic: str) -> int:
    """Records in the topic (sum of end offsets; the topics here start at offset 0)."""
    return sum(log_bounds(bootstrap, topic, timeout_s=10).ends.values())


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(x: object) -> str:
        if isinstance(x, float):
            return f"{x:,.2f}" if abs(x) < 100 else f"{x:,.0f}"
        if isinstance(x, int):
            return f"{x:,}"
        return str(x)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(x) for x in row) + " |" for row in rows]
    return "\n".join(lines)


def wait_until(pred: Callable[[], bool], timeout_s: float, every: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(every)
    return pred()


def percentile(xs: Sequence[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


@contextlib.contextmanager
def broker_and_dir() -> Iterator[tuple[ApacheKafkaBroker, Path]]:
    with ApacheKafkaBroker() as broker, tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        yield broker, Path(tmp)


# --------------------------------------------------------------------------------------------
# drain: sustained throughput on a backlog, per --max-batch-events, with an optional profile
# --------------------------------------------------------------------------------------------

CATEGORIES = (  # (label, path fragment); a stack goes to the first match from its leaf up
    ("parse (pipeline/formats/events.py)", "pipeline/formats/events.py"),
    ("judges (judges/)", "/judges/"),
    ("kafka read (kafka-python)", "/kafka/"),
    ("sqlite state (pipeline/service/state.py)", "pipeline/service/state.py"),
    ("ragpulse glue (transforms, batch, serve)", "/pipeline/"),
    ("orjson/json", "json"),
    ("Beam runner + coders", "apache_beam"),
)


def classify_profile(raw: Path) -> list[tuple[str, int]]:
    """Samples per category from py-spy's raw (collapsed) output: `frame;frame;... count`."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        label = "other"
        for frame in reversed(frames):
            hit = next((lab for lab, frag in CATEGORIES if frag in frame), None)
            if hit is not None:
                label = hit
                break
        counts[label] += int(n)
    return counts.most_common()


def top_functions(raw: Path, k: int = 12) -> list[tuple[str, int]]:
    """Leaf-most ragpulse/judges frames by samples (self + callees outside our code)."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        ours = [f for f in frames if "/pipeline/" in f or "/judges/" in f]
        key = ours[-1] if ours else frames[-1]
        counts[key.split(" (")[0] + " (" + key.rsplit("/", 1)[-1]] += int(n)
    return counts.most_common(k)


def drain_once(
    broker: ApacheKafkaBroker, topic: str, n: int, workdir: Path, max_batch: int,
    profile_s: float, extra: Sequence[str], code: Path | None = None,
) -> dict[str, float]:
    serve = Serve(broker.bootstrap, topic, workdir, [
        "--judge-backend", "local", "--sample-rate", "1", "--max-batch-events", str(max_batch),
        "--trigger-interval", "1s", *extra,
    ], code)
    ready = serve.start()
    cpu0 = cpu_seconds(serve.pid)
    spy: subprocess.Popen[bytes] | None = None
    raw = workdir / f"profile-{max_batch}.txt"
    if profile_s > 0:
        spy = subprocess.Popen(
            [str(PY_SPY), "record", "--pid", str(serve.pid), "--duration", str(int(profile_s)),
             "--format", "raw", "--output", str(raw), "--rate", "50", "--nonblocking",
             "--full-filenames"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    series: list[tuple[float, float]] = []
    peak_rss = 0
    try:
        deadline = time.monotonic() + max(120.0, n / 200)
        done = 0.0
        while done < n and time.monotonic() < deadline:
            m = serve.scrape()
            done = total(m, "ragpulse_events_total")
            series.append((time.time(), done))
            peak_rss = max(peak_rss, rss_kib(serve.pid))
            time.sleep(0.5)  # a faster scrape costs serve CPU (seen in py-spy at 0.1 s)
        cpu = cpu_seconds(serve.pid) - cpu0
        m = serve.scrape()
        if done < n:
            raise RuntimeError(f"drained only {done:.0f} of {n} in time:\n{serve.log_tail()}")
        cycles = total(m, "ragpulse_cycle_duration_seconds_count")
        cycle_s = total(m, "ragpulse_cycle_duration_seconds_sum") / max(cycles, 1)
        judged = total(m, "ragpulse_events_judged_total")
    finally:
        if spy is not None:
            spy.wait(timeout=profile_s + 60)
        serve.stop()
    end = next(t for t, d in series if d >= n)
    first = next((t, d) for t, d in series if d > 0)
    steady = (n - first[1]) / (end - first[0]) if end > first[0] else float("nan")
    if spy is not None and raw.exists():
        print(f"\n### py-spy profile of serve, --max-batch-events {max_batch}, first "
              f"{profile_s:.0f} s of the drain (share of samples, by leaf-most matching frame)\n")
        prof = classify_profile(raw)
        all_n = sum(c for _, c in prof)
        print(table(["stage", "samples", "share"],
                    [(lab, c, f"{c / all_n:.0%}") for lab, c in prof]))
        print("\nTop ragpulse/judges frames (inclusive of the library calls below them):\n")
        print(table(["frame", "share"],
                    [(f, f"{c / all_n:.1%}") for f, c in top_functions(raw)]))
    return {
        "overall": n / (end - ready), "steady": steady, "cycles": cycles, "cycle_s": cycle_s,
        "judged": judged, "rss_mib": peak_rss / 1024, "per_cpu_s": n / cpu,
        "cpu_share": cpu / (end - ready),
    }


def cmd_drain(args: argparse.Namespace) -> None:
    batches = [int(x) for x in args.max_batch.split(",")]
    with broker_and_dir() as (broker, tmp):
        broker.create_topic("backlog", args.partitions)
        rate = preload(broker.bootstrap, "backlog", args.events, args.partitions,
                       event_rate=5000, start=time.time() - args.events / 5000)
        print(f"pre-loaded {args.events:,} events in {args.partitions} partitions "
              f"({rate:,.0f} events/s produced); serve --judge-backend local --sample-rate 1")
        codes: list[Path | None] = [c.resolve() for c in args.code] or [None]
        results: dict[tuple[str, int], list[dict[str, float]]] = collections.defaultdict(list)
        for r in range(args.repeats):
            for code in codes:  # interleaved, so drift hits every checkout and setting alike
                for mb in batches:
                    prof = args.profile if (r == 0 and mb == batches[-1]) else 0.0
                    res = drain_once(broker, "backlog", args.events, tmp, mb, prof, [], code)
                    name = "this checkout" if code is None else str(code)
                    results[name, mb].append(res)
                    print(f"  repeat {r + 1} {name} max-batch {mb}: {res['overall']:,.0f} "
                          f"events/s overall, {res['steady']:,.0f} after the first cycle, "
                          f"{res['per_cpu_s']:,.0f} per serve CPU-second; {busy_elsewhere()}",
                          flush=True)
        rows = []
        for (name, mb), rs in results.items():

            def med(key: str, rs: list[dict[str, float]] = rs) -> float:
                return statistics.median(x[key] for x in rs)

            rows.append((name, mb, med("overall"), med("steady"), med("per_cpu_s"),
                         f"{med('cpu_share'):.0%}", int(med("cycles")), med("cycle_s"),
                         med("rss_mib"), int(med("judged"))))
        print(f"\n### Drain of a {args.events:,}-event backlog, medians of {args.repeats} runs\n")
        print(table(["code", "--max-batch-events", "events/s (from /metrics up)",
                     "events/s (after 1st cycle)", "events per serve CPU-s", "serve CPU use",
                     "cycles", "s/cycle", "peak RSS MiB",
                     "events judged"], rows))


# --------------------------------------------------------------------------------------------
# scale: one backlog drained by 1, then by N instances that split its partitions
# --------------------------------------------------------------------------------------------


def scale_once(
    broker: ApacheKafkaBroker, topic: str, n: int, workdir: Path, instances: int, max_batch: int
) -> dict[str, float]:
    """Drain the `n`-event backlog of `topic` with `instances` serve processes, each with a
    fresh state file; events/s of them together, from the moment all answer /metrics."""
    serves = [
        Serve(broker.bootstrap, topic, workdir, [
            "--judge-backend", "local", "--sample-rate", "1", "--max-batch-events",
            str(max_batch), "--trigger-interval", "1s",
            "--instances", str(instances), "--instance", str(i),
        ])
        for i in range(instances)
    ]
    try:
        ready = max(serve.start() for serve in serves)
        cpu0 = [cpu_seconds(serve.pid) for serve in serves]
        broker_cpu0 = cpu_seconds(broker.pid)
        deadline = time.monotonic() + max(120.0, n / 200)
        done = 0.0
        while done < n and time.monotonic() < deadline:
            time.sleep(0.5)
            done = sum(total(serve.scrape(), "ragpulse_events_total") for serve in serves)
        end = time.time()
        if done < n:
            raise RuntimeError(f"drained only {done:.0f} of {n} in time:\n{serves[0].log_tail()}")
        cpu = sum(cpu_seconds(serve.pid) - c for serve, c in zip(serves, cpu0, strict=True))
        broker_cpu = cpu_seconds(broker.pid) - broker_cpu0
    finally:
        for serve in serves:
            serve.stop()
    return {"rate": n / (end - ready), "seconds": end - ready, "cpu_share": cpu / (end - ready),
            "per_cpu_s": n / cpu, "broker_share": broker_cpu / (end - ready),
            "load": os.getloadavg()[0]}


def cmd_scale(args: argparse.Namespace) -> None:
    counts = [1, args.instances]
    with broker_and_dir() as (broker, tmp):
        broker.create_topic("backlog", args.partitions)
        rate = preload(broker.bootstrap, "backlog", args.events, args.partitions,
                       event_rate=5000, start=time.time() - args.events / 5000)
        print(f"pre-loaded {args.events:,} events in {args.partitions} partitions "
              f"({rate:,.0f} events/s produced); serve --judge-backend local --sample-rate 1 "
              f"--max-batch-events {args.max_batch}; {busy_elsewhere()}")
        results: dict[int, list[dict[str, float]]] = collections.defaultdict(list)
        for r in range(args.repeats):
            for k in counts:  # interleaved, so drift in the machine's load hits both alike
                res = scale_once(broker, "backlog", args.events, tmp, k, args.max_batch)
                results[k].append(res)
                print(f"  repeat {r + 1}, {k} instance(s): {res['rate']:,.0f} events/s "
                      f"({res['seconds']:.1f} s, serve CPU use {res['cpu_share']:.0%}, "
                      f"{res['per_cpu_s']:,.0f} events per serve CPU-s, broker CPU use "
                      f"{res['broker_share']:.0%}); {busy_elsewhere()}",
                      flush=True)

        def med(k: int, key: str) -> float:
            return statistics.median(x[key] for x in results[k])

        # CPU use summed over the instances: 200% is both cores. Events per serve CPU-second
        # do not depend on what else runs on the machine; events/s do.
        rows = [(k, med(k, "rate"), f"{med(k, 'rate') / med(1, 'rate'):.2f}x",
                 f"{med(k, 'cpu_share'):.0%}", med(k, "per_cpu_s"),
                 f"{med(k, 'broker_share'):.0%}", f"{med(k, 'load'):.1f}")
                for k in counts]
        print(f"\n### Drain of a {args.events:,}-event backlog by 1 and {args.instances} "
              f"instances, medians of {args.repeats} interleaved runs\n")
        print(table(["instances", "events/s (together)", "vs 1 instance", "serve CPU use (sum)",
                     "events per serve CPU-s", "broker CPU use",
                     "load average (1 min) at the end"], rows))


# --------------------------------------------------------------------------------------------
# paced: ragpulse simulate at fixed rates, lag over time
# --------------------------------------------------------------------------------------------


def cmd_paced(args: argparse.Namespace) -> None:
    rates = [float(x) for x in args.rates.split(",")]
    summary = []
    with broker_and_dir() as (broker, tmp):
        for rate in rates:
            topic = f"paced-{int(rate)}"
            broker.create_topic(topic, args.partitions)
            serve = Serve(broker.bootstrap, topic, tmp, [
                "--judge-backend", "local", "--sample-rate", "1",
                "--max-batch-events", str(args.max_batch),
                "--trigger-interval", f"{args.trigger_interval}s",
            ])
            serve.start()
            sim = start_simulate(broker.bootstrap, topic, rate, args.duration, tmp / "sim.log")
            t0 = time.time()
            rows: list[tuple[float, int, float, float]] = []
            cpu: list[float] = []
            try:
                while time.time() - t0 < args.duration + args.drain_wait:
                    produced = backlog(broker.bootstrap, topic)
                    m = serve.scrape()
                    done = total(m, "ragpulse_events_total")
                    rows.append((time.time() - t0, produced, done,
                                 total(m, "ragpulse_consumer_lag")))
                    cpu.append(cpu_seconds(serve.pid))
                    if sim.poll() is not None and produced and done >= produced:
                        break
                    time.sleep(1.0)
            finally:
                sim.wait(timeout=args.duration + 120)
                serve.stop()
            print(f"\n### simulate --rate {rate:g} for {args.duration:g} s, serve "
                  f"--max-batch-events {args.max_batch} --trigger-interval "
                  f"{args.trigger_interval:g}s\n")
            shown = [r for i, r in enumerate(rows) if i % max(1, len(rows) // 16) == 0 or
                     i == len(rows) - 1]
            print(table(["t s", "produced", "processed", "backlog (produced-processed)",
                         "ragpulse_consumer_lag"],
                        [(round(t), p, int(d), int(p - d), int(g)) for t, p, d, g in shown]))
            during = [r for r in rows if r[0] <= args.duration]
            third = max(1, len(during) // 3)
            mid = max(p - d for _, p, d, _ in during[third: 2 * third] or during)
            last = max(p - d for _, p, d, _ in during[2 * third:] or during)
            span = during[-1][0] - during[third][0] if len(during) > third + 1 else float("nan")
            proc_rate = (during[-1][2] - during[third][2]) / span
            prod_rate = (during[-1][1] - during[third][1]) / span
            drained = next((t for t, p, d, _ in rows if t > args.duration and d >= p), None)
            cpu_use = (cpu[len(during) - 1] - cpu[third]) / span
            summary.append((rate, prod_rate, proc_rate, f"{cpu_use:.0%}", mid, last,
                            "bounded" if last <= 1.5 * mid + rate * 2 else "growing",
                            f"{drained - args.duration:.0f} s" if drained else "not drained"))
    print("\n### Paced runs (steady part: after the first third of the run)\n")
    print(f"({busy_elsewhere()})")
    print(table(["target events/s", "produced events/s", "processed events/s",
                 "serve CPU use", "max backlog 2nd third", "max backlog last third", "lag",
                 "drain after end"],
                summary))


# --------------------------------------------------------------------------------------------
# llm: judge endpoint bound
# --------------------------------------------------------------------------------------------


def cmd_llm(args: argparse.Namespace) -> None:
    sample_rates = [float(x) for x in args.sample_rates.split(",")]
    bound = args.concurrency / args.latency
    rows = []
    with broker_and_dir() as (broker, tmp), FakeOpenAI(latency=args.latency) as fake:
        for sr in sample_rates:
            topic = f"llm-{int(sr * 100)}"
            broker.create_topic(topic, args.partitions)
            fake.reset_log()
            serve = Serve(broker.bootstrap, topic, tmp, [
                "--judge-backend", "openai", "--judge-base-url", fake.base_url,
                "--judge-concurrency", str(args.concurrency), "--judges", "groundedness",
                "--sample-rate", str(sr), "--trigger-interval", f"{args.trigger_interval}s",
            ])
            serve.start()
            sim = start_simulate(broker.bootstrap, topic, args.rate, args.duration,
                                 tmp / "sim.log")
            t0 = time.time()
            series: list[tuple[float, int, float, float]] = []
            try:
                while time.time() - t0 < args.duration:
                    produced = backlog(broker.bootstrap, topic)
                    m = serve.scrape()
                    series.append((time.time() - t0, produced, total(m, "ragpulse_events_total"),
                                   total(m, "ragpulse_events_judged_total")))
                    time.sleep(1.0)
            finally:
                sim.wait(timeout=60)
                serve.stop()
            third = len(series) // 3
            (ta, _, _, ja), (tb, _, _, jb) = series[third], series[-1]
            judged_rate = (jb - ja) / (tb - ta)
            mid_backlog = series[2 * third][1] - series[2 * third][2]
            end_backlog = series[-1][1] - series[-1][2]
            offered = args.rate * sr
            calls = [r for r in fake.requests if r.outcome == "ok"]
            rows.append((sr, offered, judged_rate, f"{judged_rate / bound:.0%}", int(mid_backlog),
                         int(end_backlog), fake.max_concurrent, len(calls),
                         # judged counts arrive in whole cycles, so one backlog sample is noisy;
                         # the judged rate against the offered one is the steadier verdict
                         "keeps up" if judged_rate >= 0.95 * offered else "falls behind"))
            print(f"  sample rate {sr}: judged {judged_rate:.1f}/s, backlog {mid_backlog:.0f} -> "
                  f"{end_backlog:.0f}, peak concurrency {fake.max_concurrent}", flush=True)
    print(f"\n### LLM judges: groundedness via the fake server ({args.latency * 1000:.0f} ms per "
          f"reply), --judge-concurrency {args.concurrency}, traffic {args.rate:g} events/s for "
          f"{args.duration:g} s; bound = {args.concurrency} / {args.latency} = {bound:.0f} "
          "calls/s\n")
    print(table(["sample rate", "offered judge calls/s", "judged events/s (last 2/3)",
                 "of bound", "backlog at 2/3", "backlog at end", "server peak concurrency",
                 "calls served", "lag"], rows))


def llm_drain_once(
    broker: ApacheKafkaBroker, fake: FakeOpenAI, topic: str, args: argparse.Namespace,
    workdir: Path,
    code: Path | None,
) -> dict[str, float]:
    """Drain the backlog of `topic` with LLM judges; how busy serve kept the fake server."""
    fake.reset_log()
    serve = Serve(broker.bootstrap, topic, workdir, [
        "--judge-backend", "openai", "--judge-base-url", fake.base_url,
        "--judge-concurrency", str(args.concurrency), "--judges", "groundedness",
        "--judge-cache-size", "0", "--sample-rate", "1",
        "--max-batch-events", str(args.max_batch), "--trigger-interval", "1s",
    ], code)
    serve.start()
    try:
        if not wait_until(lambda: total(serve.scrape(), "ragpulse_events_judged_total")
                          >= args.events, args.events * args.latency / args.concurrency * 4 + 120):
            raise RuntimeError(f"serve did not judge the backlog in time:\n{serve.log_tail()}")
        cycles = total(serve.scrape(), "ragpulse_cycle_duration_seconds_count")
    finally:
        serve.stop()
    occ = fake.occupancy()
    return {"calls_s": occ.calls_per_second, "in_flight": occ.mean_in_flight,
            "longest_idle": occ.longest_idle, "idle_s": sum(occ.idle_gaps),
            "seconds": occ.seconds, "cycles": cycles}


def cmd_llm_drain(args: argparse.Namespace) -> None:
    bound = args.concurrency / args.latency
    codes: list[Path | None] = [c.resolve() for c in args.code] or [None]
    results: dict[str, list[dict[str, float]]] = collections.defaultdict(list)
    with broker_and_dir() as (broker, tmp), FakeOpenAI(latency=args.latency) as fake:
        n = 0
        for r in range(args.repeats):
            for code in codes:  # interleaved, so drift hits every checkout alike
                topic = f"llm-drain-{n}"
                n += 1
                broker.create_topic(topic, args.partitions)
                preload(broker.bootstrap, topic, args.events, args.partitions,
                        event_rate=50, start=time.time() - args.events / 50)
                name = "this checkout" if code is None else str(code)
                res = llm_drain_once(broker, fake, topic, args, tmp, code)
                results[name].append(res)
                print(f"  repeat {r + 1} {name}: {res['calls_s']:.1f} calls/s "
                      f"({res['calls_s'] / bound:.1%} of {bound:.0f}), mean in flight "
                      f"{res['in_flight']:.1f}, longest idle {res['longest_idle']:.2f} s, "
                      f"{res['cycles']:.0f} cycles; {busy_elsewhere()}", flush=True)
    rows = []
    for name, rs in results.items():

        def med(key: str, rs: list[dict[str, float]] = rs) -> float:
            return statistics.median(x[key] for x in rs)

        rows.append((name, med("calls_s"), f"{med('calls_s') / bound:.1%}", med("in_flight"),
                     med("longest_idle"), med("idle_s"), med("seconds"), int(med("cycles"))))
    print(f"\n### LLM judges draining {args.events:,} events (groundedness, sample rate 1, "
          f"--max-batch-events {args.max_batch}): fake server {args.latency * 1000:.0f} ms per "
          f"reply, --judge-concurrency {args.concurrency}, bound {bound:.0f} calls/s; medians "
          f"of {args.repeats}\n")
    print(table(["code", "calls/s", "of bound", "mean in flight", "longest idle s",
                 "idle s in all", "first call to last s", "cycles"], rows))


# --------------------------------------------------------------------------------------------
# freshness
# --------------------------------------------------------------------------------------------


def cmd_freshness(args: argparse.Namespace) -> None:
    with broker_and_dir() as (broker, tmp):
        broker.create_topic("fresh", args.partitions)
        serve = Serve(broker.bootstrap, "fresh", tmp, [
            "--judge-backend", "local", "--sample-rate", "1",
            "--trigger-interval", f"{args.trigger_interval}s", "--window", f"{args.window}s",
        ])
        serve.start()
        time.sleep(3)  # let the first (empty) cycles pass: we measure the steady state
        producer = PacedProducer(broker.bootstrap, "fresh", args.rate, args.duration)
        producer.start()
        producer.ready.wait(30)
        scrapes: list[tuple[float, float, float]] = []  # (time, verdicts, in-progress samples)
        try:
            deadline = time.time() + args.duration + 60
            n = producer.n
            while time.time() < deadline:
                m = serve.scrape()
                now = time.time()
                verdicts = total(m, "ragpulse_judge_verdicts_total", judge="groundedness")
                live = total(m, "ragpulse_judge_in_progress_window_samples", judge="groundedness")
                scrapes.append((now, verdicts, live))
                if verdicts >= n:
                    break
                time.sleep(max(0.0, args.scrape - (time.time() - now)))
        finally:
            producer.stop_flag.set()
            producer.join(timeout=30)
            serve.stop()
    t0, rate = producer.t0, args.rate
    produced_at = [t0 + i / rate for i in range(producer.sent)]
    # (a) counter freshness: event i (in production order) is visible at the first scrape whose
    # ragpulse_judge_verdicts_total{judge="groundedness"} (summed) is at least i + 1.
    counter_lat = _first_reaching(produced_at, [(t, v) for t, v, _ in scrapes])
    # (b) in-progress window freshness, for the events of the last window of the run: visible at
    # the first scrape whose in-progress window samples reach its rank inside that window.
    w = args.window
    last_w = math.floor(produced_at[-1] / w) * w
    in_last = [p for p in produced_at if p >= last_w]
    window_lat = _first_reaching(in_last, [(t, s) for t, _, s in scrapes])
    rows = []
    for name, lat, of in (("verdicts counter", counter_lat, len(produced_at)),
                          ("in-progress window samples", window_lat, len(in_last))):
        if lat:
            rows.append((name, len(lat), of, statistics.median(lat), percentile(lat, 0.95),
                         max(lat)))
    print(f"\n### Freshness: {args.rate:g} events/s for {args.duration:g} s, --trigger-interval "
          f"{args.trigger_interval:g}s, /metrics every {args.scrape:g} s\n")
    print(table(["visible in", "events measured", "of", "median s", "p95 s", "max s"], rows))


def _first_reaching(produced_at: Sequence[float], scrapes: Sequence[tuple[float, float]]) -> list[
    float
]:
    """For the i-th event, (time of the first scrape with count >= i + 1) - production time."""
    out: list[float] = []
    j = 0
    for i, p in enumerate(produced_at):
        while j < len(scrapes) and scrapes[j][1] < i + 1:
            j += 1
        if j == len(scrapes):
            break
        out.append(scrapes[j][0] - p)
    return out


# --------------------------------------------------------------------------------------------
# memory
# --------------------------------------------------------------------------------------------


def cmd_memory(args: argparse.Namespace) -> None:
    with broker_and_dir() as (broker, tmp):
        broker.create_topic("mem", args.partitions)
        flags = ["--judge-backend", "local", "--sample-rate", "1",
                 "--trigger-interval", f"{args.trigger_interval}s"]
        if args.realtime:
            serve = Serve(broker.bootstrap, "mem", tmp, flags)
            ready = serve.start()
            sim = start_simulate(broker.bootstrap, "mem", args.event_rate, args.realtime,
                                 tmp / "sim.log")
            target = round(args.event_rate * args.realtime)
            what = (f"real time: simulate --rate {args.event_rate:g} for {args.realtime:g} s "
                    f"({target:,} events)")
        else:
            target = args.events
            rate = preload(broker.bootstrap, "mem", target, args.partitions,
                           event_rate=args.event_rate,
                           start=time.time() - target / args.event_rate)
            print(f"pre-loaded {target:,} events ({rate:,.0f}/s produced)", flush=True)
            serve = Serve(broker.bootstrap, "mem", tmp, flags)
            ready = serve.start()
            sim = None
            what = (f"drain as fast as possible: {target:,} events with event times spread over "
                    f"{target / args.event_rate / 3600:g} h")
        samples: list[tuple[float, float, int]] = []  # (t, processed, rss KiB)
        cpu = 0.0
        try:
            deadline = time.time() + args.timeout
            while time.time() < deadline:
                m = serve.scrape()
                done = total(m, "ragpulse_events_total")
                samples.append((time.time() - ready, done, rss_kib(serve.pid)))
                cpu = cpu_seconds(serve.pid)
                if done >= target:
                    break
                time.sleep(args.every)
            state_kib = sum(p.stat().st_size for p in tmp.glob("state-*.sqlite*")) // 1024
        finally:
            if sim is not None:
                sim.kill()
                sim.wait(timeout=10)
            serve.stop()
    print(f"\n### Resident memory of serve ({what})\n")
    rows = []
    for frac in (0.0, 0.25, 0.5, 0.75, 1.0):
        hit = next((s for s in samples if s[1] >= frac * target and (frac > 0 or s[1] > 0)),
                   None)
        label = f"{frac:.0%}" if frac else "after 1st cycle"
        if hit is None:  # --timeout came first: say so rather than show the last sample as it
            last = samples[-1]
            rows.append((f"{label} (not reached; last sample)", round(last[0]), int(last[1]),
                         last[2] / 1024))
            break
        rows.append((label, round(hit[0]), int(hit[1]), hit[2] / 1024))
    rows.insert(0, ("start (/metrics up)", 0, 0, samples[0][2] / 1024))
    print(table(["point", "t s", "events processed", "RSS MiB"], rows))
    later = [s[2] for s in samples if s[1] >= 0.25 * target]
    if later:
        print(f"\nRSS from 25 % to the end: min {min(later) / 1024:.0f} MiB, max "
              f"{max(later) / 1024:.0f} MiB; {len(samples)} samples every {args.every:g} s; "
              f"state file {state_kib / 1024:.1f} MiB; "
              f"{samples[-1][1] / max(samples[-1][0], 1e-9):,.0f} events/s on average, "
              f"{samples[-1][1] / max(cpu, 1e-9):,.0f} per serve CPU-second; {busy_elsewhere()}")


# --------------------------------------------------------------------------------------------


# Each scenario: its function, its help, and its options with their defaults (an option's type
# is its default's).
SCENARIOS: dict[str, tuple[Callable[[argparse.Namespace], None], str, dict[str, object]]] = {
    "drain": (cmd_drain, "throughput on a pre-loaded backlog", {
        "events": 100_000, "partitions": 4, "max_batch": "5000,20000,50000", "repeats": 3,
        "profile": 0.0,
    }),
    "scale": (cmd_scale, "a backlog drained by 1 and by N instances", {
        "events": 100_000, "partitions": 4, "instances": 2, "max_batch": 20_000, "repeats": 3,
    }),
    "paced": (cmd_paced, "lag under ragpulse simulate at fixed rates", {
        "rates": "3000,5000", "duration": 60.0, "drain_wait": 60.0, "partitions": 4,
        "max_batch": 50_000, "trigger_interval": 1.0,
    }),
    "llm": (cmd_llm, "sample-rate limit of the LLM judges", {
        "sample_rates": "0.1,0.25,0.5,0.75", "rate": 200.0, "duration": 60.0, "latency": 0.3,
        "concurrency": 32, "partitions": 4, "trigger_interval": 1.0,
    }),
    "llm-drain": (cmd_llm_drain, "LLM judge calls/s against concurrency / latency", {
        "events": 2000, "partitions": 4, "max_batch": 500, "latency": 1.0, "concurrency": 32,
        "repeats": 3,
    }),
    "freshness": (cmd_freshness, "production-to-/metrics delay", {
        "rate": 500.0, "duration": 60.0, "trigger_interval": 1.0, "scrape": 0.2, "window": 300.0,
        "partitions": 4,
    }),
    "memory": (cmd_memory, "serve's RSS over one hour of traffic", {
        "events": 1_800_000, "event_rate": 500.0, "realtime": 0.0, "partitions": 4, "every": 3.0,
        "trigger_interval": 5.0, "timeout": 3600.0,
    }),
}
# (metavar, help) of the options that need saying more than their name.
OPTION_HELP = {
    "profile": ("SECONDS", "py-spy the first run of the last --max-batch for this long"),
    "realtime": ("SECONDS", "send --event-rate events/s for this long instead of a backlog"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="scenario", required=True)
    for name, (run, about, options) in SCENARIOS.items():
        scenario = sub.add_parser(name, help=about)
        for option, default in options.items():
            metavar, text = OPTION_HELP.get(option, (None, None))
            scenario.add_argument(f"--{option.replace('_', '-')}", type=type(default),
                                  default=default, metavar=metavar, help=text)
        scenario.set_defaults(run=run)
    for name in ("drain", "llm-drain"):
        sub.choices[name].add_argument(
            "--code", action="append", default=[], type=Path, metavar="DIR",
            help="a checkout of ragpulse whose serve to run (repeatable: checkouts are "
            "measured side by side, interleaved); default: this one")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # start-up retries are not news
    args.run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
