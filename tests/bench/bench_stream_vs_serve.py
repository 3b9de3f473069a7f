"""`ragpulse stream` on Beam's Flink runner against `ragpulse serve`, on the same backlog and
machine, side by side in one run.

For whoever chooses between one `serve` and a Flink job. A backlog of N simulated events (a
tenth of a minute apart, in the past, so that every window closes once it is read) is produced
to a test broker; then, R times each:

    stream  `ragpulse stream` submitted to an embedded Flink (tests/flink_runner.py, the jars of
            `make stream-tools`), or with `--flink cluster` to a Flink cluster of a JobManager
            and two TaskManagers with deploy/flink's configuration and parallelism 2
            (tests/flink_cluster.py), local judges, one-minute windows, its own ratings topic;
            timed from the job's RUNNING state to the last window's on-time pane on the
            ratings topic (the submission itself, one to two minutes of expansion and staging,
            is not counted); CPU: every process of Flink and Beam's services (job server,
            expansion service, JobManager, TaskManagers, the worker pool and its SDK workers)
    serve   `ragpulse serve` with a fresh state file, same judges and windows; timed from its
            start to its count of events read reaching N; CPU: the serve process

and prints events/s and events per CPU-second, medians of R, side by side.

    RAGPULSE_CACHE=... .venv/bin/python tests/bench/bench_stream_vs_serve.py [--events N]
        [--repeats R] [--flink embedded|cluster]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cli import ragpulse_command
from flink_cluster import FlinkCluster, flink_cluster_running
from flink_runner import FlinkServices, flink_services
from kafka_broker import ApacheKafkaBroker
from serve_process import ServeProcess
from test_stream_flink import (
    JUDGES,
    WINDOW_S,
    RatingsReader,
    cancel_jobs,
    create_topics,
    produce_events,
    window_start,
)

from ragpulse.pipeline.commands.simulate import simulate

TICKS = os.sysconf("SC_CLK_TCK")


def session_cpu_seconds(leaders: Iterable[int]) -> float:
    """User + system CPU of every live process in the sessions of `leaders` (and what their
    reaped children used)."""
    sessions = set(leaders)
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sessions:  # field 6 of stat: the session id
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / TICKS


def stream_run(
    broker: ApacheKafkaBroker,
    services: FlinkServices | FlinkCluster,
    topic: str,
    n_windows: set[float],
    run: int,
) -> tuple[float, float]:
    ratings = f"{topic}.ratings-{run}"
    create_topics(broker.bootstrap, ratings)
    reader = RatingsReader(broker.bootstrap, ratings)
    argv = [
        *ragpulse_command(), "stream", f"--kafka-bootstrap={broker.bootstrap}", f"--topic={topic}",
        f"--ratings-topic={ratings}", f"--dead-letter-topic={topic}.dlq-{run}",
        f"--window={WINDOW_S}s", f"--judges={JUDGES}", "--judge-backend=local",
        *services.stream_args,
        # Without checkpoints no pane left the job in the tests' runs (Beam 2.62.0, Flink 1.19).
        "--beam-arg=--checkpointing_interval=2000",
        *(["--beam-arg=--parallelism=2"] if isinstance(services, FlinkCluster) else []),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    leaders = list(services.pids)
    cpu0, t0 = session_cpu_seconds(leaders), time.monotonic()
    while not n_windows <= reader.on_time_windows():
        time.sleep(0.2)
    elapsed, cpu = time.monotonic() - t0, session_cpu_seconds(leaders) - cpu0
    reader.close()
    if isinstance(services, FlinkCluster):
        job = services.running_job()
        if job is not None:
            services.cancel(job)
    else:
        cancel_jobs(services)
    return elapsed, cpu


def serve_run(
    broker: ApacheKafkaBroker, topic: str, n: int, work: Path, run: int
) -> tuple[float, float]:
    serve = ServeProcess(
        broker.bootstrap, topic, work / f"serve-{run}.sqlite",
        [f"--window={WINDOW_S}s", f"--judges={JUDGES}", f"--group-id=bench-{run}",
         f"--dead-letter-topic={topic}.serve-dlq-{run}"],
        log_path=work / f"serve-{run}.log",
    )
    t0 = time.monotonic()
    with serve:
        assert serve.process is not None
        serve.wait_for(lambda m: m.total("ragpulse_events_total") >= n, timeout=1800)
        elapsed = time.monotonic() - t0
        cpu = session_cpu_seconds([serve.process.pid])
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flink", choices=("embedded", "cluster"), default="embedded")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    topic = "bench-logs"
    start = window_start(time.time()) - 2 * 3600
    events = list(simulate(11, args.events, start, rate=10.0))
    windows = {window_start(e.event_time) for e in events}
    stream = f"stream ({args.flink} Flink)"
    results: dict[str, list[tuple[float, float]]] = {stream: [], "serve": []}
    runner = flink_cluster_running(work) if args.flink == "cluster" else flink_services(work)
    with ApacheKafkaBroker() as broker, runner as services:
        create_topics(broker.bootstrap, topic)
        produce_events(broker.bootstrap, topic, events)
        for run in range(args.repeats):
            results[stream].append(stream_run(broker, services, topic, windows, run))
            results["serve"].append(serve_run(broker, topic, args.events, work, run))
    print(f"{args.events} events, {len(windows)} one-minute windows, judges {JUDGES} (local), "
          f"medians of {args.repeats} runs, {os.cpu_count()} cores")
    print(f"{'':16} {'events/s':>10} {'events/CPU-s':>13} {'seconds':>8} {'CPU-s':>7}")
    for name, runs in results.items():
        elapsed = statistics.median(e for e, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        rate = statistics.median(args.events / e for e, _ in runs)
        per_cpu = statistics.median(args.events / c for _, c in runs)
        print(f"{name:16} {rate:10.1f} {per_cpu:13.1f} {elapsed:8.1f} {cpu:7.1f}")


if __name__ == "__main__":
    main()
