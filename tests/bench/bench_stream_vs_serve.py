"""`ragpulse stream` on Beam's Flink runner against `ragpulse serve`, on the same backlog and
machine, side by side in one run.

For whoever chooses between one `serve` and a Flink job. A backlog of N simulated events (a
tenth of a minute apart, in the past, so that every window closes once it is read) is produced
to a test broker; then, R times each:

    stream  `ragpulse stream` submitted to an embedded Flink (tests/flink_runner.py, the jars of
            `make stream-tools`), or with `--flink cluster` to a Flink cluster of a JobManager
            and two TaskManagers with deploy/flink's configuration and parallelism 2
            (tests/flink_cluster.py), local judges, one-minute windows, its own ratings topic,
            `--partition-idle-after=2s` as serve below; timed from the moment Flink's REST API
            shows the job RUNNING with all its tasks running to the last window's on-time pane
            on the ratings topic (the submission, one to two minutes of expansion and staging,
            and the start of the embedded Flink that each job gets, are not counted); CPU:
            every process of Flink and Beam's services (job server, expansion service,
            JobManager, TaskManagers, the worker pool and its SDK workers)
    serve   `ragpulse serve` with a fresh state file, same judges and windows; timed from its
            start to its count of events read reaching N; CPU: the serve process

and prints events/s and events per CPU-second, medians of R, side by side.

With `--base DIR` (embedded Flink only), each repeat also runs the stream of another revision,
a checkout in DIR with its own .venv (`make .venv/.installed-stamp` there): its own `ragpulse`
submits the job and its own worker pool runs the Python stages, on the same job server and
expansion service, so a change is measured before and after in one run:

    git -C . archive BASE | tar -x -C /tmp/base && make -C /tmp/base .venv/.installed-stamp
    RAGPULSE_CACHE=... .venv/bin/python tests/bench/bench_stream_vs_serve.py [--events N]
        [--repeats R] [--flink embedded|cluster] [--base /tmp/base]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from beam_services import service
from cli import ragpulse_command
from flink_cluster import FlinkCluster, flink_cluster_running
from flink_runner import FlinkServices, flink_services
from kafka_broker import ApacheKafkaBroker
from processes import free_port
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


# The embedded Flink of Beam's job server (a new one for each job) logs its REST API's port.
_REST_ENDPOINT = re.compile(rb"Rest endpoint listening at localhost:(\d+)")


def _rest_endpoints(services: FlinkServices) -> list[str]:
    log = (services.log_dir / "flink-job-server.log").read_bytes()
    return [f"http://localhost:{m.group(1).decode()}" for m in _REST_ENDPOINT.finditer(log)]


def _all_tasks_running(rest: str) -> bool:
    try:
        with urllib.request.urlopen(f"{rest}/jobs/overview", timeout=10) as response:
            jobs = json.loads(response.read())["jobs"]
    except OSError:
        return False
    return any(
        j["state"] == "RUNNING" and j["tasks"]["running"] == j["tasks"]["total"] for j in jobs
    )


def wait_for_job_running(services: FlinkServices | FlinkCluster, endpoints_before: int) -> None:
    """Until Flink runs every task of the submitted job (embedded: in the job's own Flink,
    whose REST port the job server logs after `endpoints_before` earlier ones)."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if isinstance(services, FlinkCluster):
            if services.running_job() is not None:
                return
        else:
            endpoints = _rest_endpoints(services)
            if len(endpoints) > endpoints_before and _all_tasks_running(endpoints[-1]):
                return
        time.sleep(0.2)
    raise RuntimeError("the job's tasks were not all running within 900s")


def stream_run(
    broker: ApacheKafkaBroker,
    services: FlinkServices | FlinkCluster,
    topic: str,
    n_windows: set[float],
    run: str,
    ragpulse: list[str],
) -> tuple[float, float]:
    ratings = f"{topic}.ratings-{run}"
    create_topics(broker.bootstrap, ratings)
    reader = RatingsReader(broker.bootstrap, ratings)
    argv = [
        *ragpulse, "stream", f"--kafka-bootstrap={broker.bootstrap}", f"--topic={topic}",
        f"--ratings-topic={ratings}", f"--dead-letter-topic={topic}.dlq-{run}",
        f"--window={WINDOW_S}s", f"--judges={JUDGES}", "--judge-backend=local",
        # The 60s default would add a minute of waiting for the last window to each run (the
        # one partition never runs dry while the backlog is read); serve runs with 2s too.
        "--partition-idle-after=2s",
        *services.stream_args,
        # Without checkpoints no pane left the job in the tests' runs (Beam 2.62.0, Flink 1.19).
        "--beam-arg=--checkpointing_interval=2000",
        *(["--beam-arg=--parallelism=2"] if isinstance(services, FlinkCluster) else []),
    ]
    endpoints_before = 0 if isinstance(services, FlinkCluster) else len(_rest_endpoints(services))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    wait_for_job_running(services, endpoints_before)
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


@contextmanager
def revision_services(
    services: FlinkServices, base: Path, log_dir: Path
) -> Iterator[FlinkServices]:
    """`services` with a worker pool of the checkout `base` (its .venv's python, its sources):
    the job server and expansion service are shared, the Python stages are the base's."""
    python = base / ".venv" / "bin" / "python"
    port = free_port()
    argv = [str(python), str(base / "tests" / "beam_services.py"), str(port)]
    with service("worker-pool-base", argv, port, log_dir, python=python) as pid:
        yield dataclasses.replace(services, pool_port=port, pids=(*services.pids, pid))


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
    parser.add_argument("--base", type=Path, help="a checkout of another revision, with .venv")
    args = parser.parse_args()
    if args.base is not None and args.flink != "embedded":
        parser.error("--base runs with --flink embedded only")
    if args.base is not None and not (args.base / ".venv" / "bin" / "ragpulse").is_file():
        parser.error(f"--base {args.base}: no .venv/bin/ragpulse (make .venv/.installed-stamp)")
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    topic = "bench-logs"
    start = window_start(time.time()) - 2 * 3600
    events = list(simulate(11, args.events, start, rate=10.0))
    windows = {window_start(e.event_time) for e in events}
    stream = f"stream ({args.flink} Flink)"
    base = f"stream (base {args.base.name})" if args.base else ""
    results: dict[str, list[tuple[float, float]]] = {stream: [], "serve": []}
    if args.base:
        results = {base: [], **results}
    runner = flink_cluster_running(work) if args.flink == "cluster" else flink_services(work)
    with ApacheKafkaBroker() as broker, runner as services:
        create_topics(broker.bootstrap, topic)
        produce_events(broker.bootstrap, topic, events)
        for run in range(args.repeats):
            if args.base:
                # --base runs with --flink embedded only (checked above).
                assert isinstance(services, FlinkServices)
                with revision_services(services, args.base, work) as base_services:
                    results[base].append(stream_run(
                        broker, base_services, topic, windows, f"base-{run}",
                        [str(args.base / ".venv" / "bin" / "ragpulse")],
                    ))
            results[stream].append(
                stream_run(broker, services, topic, windows, str(run), ragpulse_command())
            )
            results["serve"].append(serve_run(broker, topic, args.events, work, run))
    print(f"{args.events} events, {len(windows)} one-minute windows, judges {JUDGES} (local), "
          f"medians of {args.repeats} runs, {os.cpu_count()} cores")
    width = max(len(name) for name in results)
    print(f"{'':{width}} {'events/s':>10} {'events/CPU-s':>13} {'seconds':>8} {'CPU-s':>7}")
    for name, runs in results.items():
        elapsed = statistics.median(e for e, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        rate = statistics.median(args.events / e for e, _ in runs)
        per_cpu = statistics.median(args.events / c for _, c in runs)
        print(f"{name:{width}} {rate:10.1f} {per_cpu:13.1f} {elapsed:8.1f} {cpu:7.1f}")


if __name__ == "__main__":
    main()
