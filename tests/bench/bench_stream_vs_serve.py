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

With `--live RATE` (repeatable) and `--duration SECONDS`, live instead, on embedded Flink: for
each rate, a new topic of one partition, read at once by both sides with their own groups:
the stream (flags as above, with `group.id` set, so that its read commits offsets at each
checkpoint) is submitted and Flink runs all its tasks, serve (its default trigger interval,
15s) answers on /metrics, both idle for 20 s (their idle CPU is measured), and only then
`ragpulse simulate --rate RATE --duration SECONDS` produces. Printed for each side: events
judged per second over the producing period (serve: its events judged at the producer's
end, from /metrics; stream: the offset its group committed with the last checkpoint, which
every stage had processed), the lag at that moment (serve: events not yet read; stream: the
topic's end offset less that committed offset), events counted in the windows by then (serve:
/metrics; stream: the latest panes on the ratings topic), how long after the producer's end
the side had counted every event, the CPU-s of every process of the side from producing's
start to then, per event, and per event less the side's idle CPU; the stream's on-time panes'
delay after each window's end; the producer's and the broker's CPU, and the load average:

    RAGPULSE_CACHE=... .venv/bin/python tests/bench/bench_stream_vs_serve.py --live 100
        --live 400 --duration 150

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
import resource
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
from kafka import KafkaConsumer
from kafka.structs import TopicPartition
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
from test_stream_flink_live import TimedPanes, judged

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.formats.rating_rows import RatingPane

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


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of one process (the broker, which shares this process's session)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:13]) / TICKS


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


def stream_argv(
    broker: ApacheKafkaBroker,
    services: FlinkServices | FlinkCluster,
    topic: str,
    ratings: str,
    run: str,
    ragpulse: list[str],
    *extra: str,
) -> list[str]:
    """The `ragpulse stream` command line of a run (`extra` last)."""
    return [
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
        *extra,
    ]


def submit_until_running(argv: list[str], services: FlinkServices | FlinkCluster) -> None:
    """Submits the job, returns once Flink runs every task of it."""
    endpoints_before = 0 if isinstance(services, FlinkCluster) else len(_rest_endpoints(services))
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(done.stderr[-3000:])
    wait_for_job_running(services, endpoints_before)


def cancel_stream(services: FlinkServices | FlinkCluster) -> None:
    if isinstance(services, FlinkCluster):
        job = services.running_job()
        if job is not None:
            services.cancel(job)
    else:
        cancel_jobs(services)


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
    submit_until_running(stream_argv(broker, services, topic, ratings, run, ragpulse), services)
    leaders = list(services.pids)
    cpu0, t0 = session_cpu_seconds(leaders), time.monotonic()
    while not n_windows <= reader.on_time_windows():
        time.sleep(0.2)
    elapsed, cpu = time.monotonic() - t0, session_cpu_seconds(leaders) - cpu0
    reader.close()
    cancel_stream(services)
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


# --- live mode: events produced at a fixed rate while both sides run

# The sessions of the embedded Flink's services (tests/flink_runner.py starts them in this
# order): each session holds the processes its service starts.
EMBEDDED_PROCESSES = (
    "expansion service",
    "job server and its embedded Flink",
    "worker pool and its SDK workers",
)
# How long, after the producer's last event, a side may take to count every event.
COUNT_ALL_WITHIN_S = 300.0
# Both sides running, nothing produced yet: how long their CPU is measured before producing.
IDLE_S = 20.0
# serve's own default, as deployed (tests/serve_process.py runs it with 0.5s): one cycle
# every 15 s once caught up, so up to 15 s of events are waiting when producing ends.
SERVE_TRIGGER_INTERVAL = "15s"


@dataclasses.dataclass
class LiveSide:
    """One side of a live run: its processes (label: session leader), their CPU when producing
    began, and what was seen of it at the end of producing and once it had counted every event."""

    processes: dict[str, int]
    cpu_start: dict[str, float]
    idle_cpu_per_s: float = 0.0  # CPU-s per second before producing, all its processes
    # At the end of producing: records not yet read (serve: events read, from /metrics;
    # stream: the topic's end offset minus the group's offset committed with the last
    # checkpoint, which every stage, the judges included, had processed), events judged by
    # then (serve: /metrics; stream: the committed offset) and events counted in the windows
    # (serve: judged is counted; stream: in the latest panes on the ratings topic).
    lag_at_end: int = 0
    judged_at_end: int = 0
    counted_at_end: int = 0
    all_counted_after: float | None = None  # seconds after the producer's end
    cpu_used: dict[str, float] = dataclasses.field(default_factory=dict)
    cpu_seconds: float = 0.0  # wall time over which cpu_used was measured

    def cpu_now(self) -> dict[str, float]:
        return {
            label: session_cpu_seconds([pid]) - self.cpu_start[label]
            for label, pid in self.processes.items()
        }


def live_side(processes: dict[str, int]) -> LiveSide:
    return LiveSide(processes, {label: session_cpu_seconds([pid]) for label, pid in
                                processes.items()})


def counted_in_panes(panes: TimedPanes) -> int:
    """Events counted by the latest panes of every window, for the judge that counted most (a
    judge may skip an event that lacks its input)."""
    by_window: dict[float, list[RatingPane]] = {}
    for _, pane in panes.poll():
        by_window.setdefault(pane.key.window_start, []).append(pane)
    return max(
        (sum(judged(window_panes, judge) for window_panes in by_window.values())
         for judge in JUDGES.split(",")),
        default=0,
    )


def on_time_delays(panes: TimedPanes) -> dict[float, float]:
    """Per window: seconds from its end to the moment its first on-time pane was read."""
    delays: dict[float, float] = {}
    for read_at, pane in panes.poll():
        start = pane.key.window_start
        if pane.timing == "on_time" and start not in delays:
            delays[start] = read_at - (start + WINDOW_S)
    return dict(sorted(delays.items()))


def group_lag(bootstrap: str, topic: str, group: str) -> int:
    """The topic's end offset minus the group's committed offset (partition 0)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        committed = consumer.committed(tp) or 0
        return int(consumer.end_offsets([tp])[tp]) - int(committed)
    finally:
        consumer.close(autocommit=False)


@dataclasses.dataclass(frozen=True)
class LiveRun:
    rate: float
    produced: int
    producing_s: float
    load: tuple[float, float]  # 1-minute load average when producing began and ended
    producer_cpu: float
    broker_cpu: float  # the Kafka broker's, from producing's start until both had counted all
    sides: dict[str, LiveSide]
    on_time_delays: dict[float, float]


def live_run(
    broker: ApacheKafkaBroker, services: FlinkServices, rate: float, duration: float,
    run: str, work: Path,
) -> LiveRun:
    """Both sides read one topic (one partition), each with its own group; the producer starts
    once Flink runs every task of the stream's job and serve's /metrics answers."""
    topic, group = f"live-{run}", f"bench-live-{run}"
    ratings = f"{topic}.ratings"
    create_topics(broker.bootstrap, topic, ratings)
    panes = TimedPanes(broker.bootstrap, ratings)
    submit_until_running(stream_argv(
        broker, services, topic, ratings, run, ragpulse_command(),
        # With a group, the read commits its offsets at each checkpoint: after every stage,
        # the judges included, has processed the records before it (Flink's barriers).
        f"--kafka-consumer-config=group.id={group}",
    ), services)
    serve = ServeProcess(
        broker.bootstrap, topic, work / f"serve-{run}.sqlite",
        [f"--window={WINDOW_S}s", f"--judges={JUDGES}", f"--group-id={group}-serve",
         f"--dead-letter-topic={topic}.serve-dlq",
         f"--trigger-interval={SERVE_TRIGGER_INTERVAL}"],
        log_path=work / f"serve-{run}.log",
    )
    try:
        with serve:
            assert serve.process is not None
            sides = {
                "serve": live_side({"serve": serve.process.pid}),
                "stream": live_side(dict(zip(EMBEDDED_PROCESSES, services.pids, strict=True))),
            }
            stream, served = sides["stream"], sides["serve"]
            time.sleep(IDLE_S)
            for side in sides.values():
                side.idle_cpu_per_s = sum(side.cpu_now().values()) / IDLE_S
                side.cpu_start = {label: session_cpu_seconds([pid])
                                  for label, pid in side.processes.items()}
            load_start = os.getloadavg()[0]
            started, broker_cpu = time.monotonic(), process_cpu_seconds(broker.pid)
            children_cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
            with (work / f"producer-{run}.log").open("w+") as log:
                producer = subprocess.Popen(
                    [*ragpulse_command(), "simulate", f"--kafka-bootstrap={broker.bootstrap}",
                     f"--topic={topic}", f"--rate={rate}", f"--duration={duration}s",
                     f"--seed={sum(map(ord, run))}"],
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
                while producer.poll() is None:
                    panes.poll()
                    time.sleep(0.5)
                ended = time.monotonic()
                log.seek(0)
                report = log.read()
            children_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            producer_cpu = (children_after.ru_utime + children_after.ru_stime
                            - children_cpu.ru_utime - children_cpu.ru_stime)
            sent = re.search(r"sent (\d+) events to \S+ in ([\d.]+)s", report)
            if producer.returncode != 0 or sent is None:
                raise RuntimeError(f"the producer failed:\n{report}")
            produced, producing_s = int(sent.group(1)), float(sent.group(2))
            load_end = os.getloadavg()[0]
            scrape = serve.metrics()
            served.lag_at_end = produced - int(scrape.total("ragpulse_events_total"))
            served.judged_at_end = int(scrape.total("ragpulse_events_judged_total"))
            served.counted_at_end = served.judged_at_end
            stream.lag_at_end = group_lag(broker.bootstrap, topic, group)
            stream.judged_at_end = produced - stream.lag_at_end
            stream.counted_at_end = counted_in_panes(panes)
            while time.monotonic() - ended < COUNT_ALL_WITHIN_S and (
                served.all_counted_after is None or stream.all_counted_after is None
            ):
                if served.all_counted_after is None and (
                    serve.metrics().total("ragpulse_events_judged_total") >= produced
                ):
                    served.all_counted_after = time.monotonic() - ended
                    served.cpu_used = served.cpu_now()
                    served.cpu_seconds = time.monotonic() - started
                if stream.all_counted_after is None and counted_in_panes(panes) >= produced:
                    stream.all_counted_after = time.monotonic() - ended
                    stream.cpu_used = stream.cpu_now()
                    stream.cpu_seconds = time.monotonic() - started
                time.sleep(0.5)
            broker_cpu = process_cpu_seconds(broker.pid) - broker_cpu
            for side in sides.values():
                if not side.cpu_used:
                    side.cpu_used = side.cpu_now()
                    side.cpu_seconds = time.monotonic() - started
    finally:
        cancel_stream(services)
        panes.close()
    return LiveRun(rate, produced, producing_s, (load_start, load_end), producer_cpu,
                   broker_cpu, sides, on_time_delays(panes))


def print_live(run: LiveRun) -> None:
    n = run.produced
    print(f"\nlive at {run.rate:g}/s: {n} events produced in {run.producing_s:.1f} s "
          f"({n / run.producing_s:.1f}/s; the producer used {run.producer_cpu:.1f} CPU-s, the "
          f"broker {run.broker_cpu:.1f}); "
          f"1-minute load average {run.load[0]:.1f} when producing began, "
          f"{run.load[1]:.1f} when it ended; {os.cpu_count()} cores")
    print(f"{'':7} {'judged/s':>9} {'lag at end':>11} {'counted at end':>15} "
          f"{'all counted after':>18} {'CPU-s':>7} {'over s':>7} {'CPU-ms/event':>13} "
          f"{'idle CPU-s/s':>13} {'less idle':>10}")
    for name, side in run.sides.items():
        after = (f"not within {COUNT_ALL_WITHIN_S:g}s" if side.all_counted_after is None
                 else f"{side.all_counted_after:.1f} s")
        cpu = sum(side.cpu_used.values())
        # The CPU above what the side used before producing, per event.
        marginal = cpu - side.idle_cpu_per_s * side.cpu_seconds
        print(f"{name:7} {side.judged_at_end / run.producing_s:9.1f} {side.lag_at_end:11d} "
              f"{side.counted_at_end:15d} {after:>18} {cpu:7.1f} {side.cpu_seconds:7.1f} "
              f"{1000 * cpu / n:13.3f} {side.idle_cpu_per_s:13.3f} {1000 * marginal / n:10.3f}")
    for name, side in run.sides.items():
        print(f"{name} CPU-s by process: " + ", ".join(
            f"{label} {cpu:.1f}" for label, cpu in side.cpu_used.items()))
    delays = ", ".join(f"{d:.1f}" for d in run.on_time_delays.values())
    print(f"stream on-time panes read after their window's end (s, window by window): {delays}",
          flush=True)


def live_main(rates: list[float], duration: float, work: Path) -> None:
    print(f"live: judges {JUDGES} (local), one-minute windows, --partition-idle-after=2s, "
          f"one topic of one partition read by both sides at once (each its own group)",
          flush=True)
    with ApacheKafkaBroker() as broker, flink_services(work) as services:
        for i, rate in enumerate(rates):
            print_live(live_run(broker, services, rate, duration, f"{i}-{rate:g}", work))


def backlog_main(args: argparse.Namespace, work: Path) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, help="backlog: events (default 2000)")
    parser.add_argument("--repeats", type=int, help="backlog: runs of each side (default 3)")
    parser.add_argument("--flink", choices=("embedded", "cluster"), default="embedded")
    parser.add_argument("--base", type=Path, help="a checkout of another revision, with .venv")
    parser.add_argument("--live", type=float, action="append", metavar="RATE",
                        help="live: events per second, one run per --live (repeatable)")
    parser.add_argument("--duration", type=float, metavar="SECONDS",
                        help="live: how long each rate is produced (default 150)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-stream-"))
    if args.live:
        used = [flag for flag, value in (("--events", args.events), ("--repeats", args.repeats),
                ("--base", args.base)) if value is not None]
        if used or args.flink != "embedded":
            parser.error(f"--live runs on embedded Flink, without {', '.join(used) or '--flink'}")
        if any(rate <= 0 for rate in args.live) or (args.duration or 150) <= 0:
            parser.error("--live and --duration must be positive")
        live_main(args.live, args.duration or 150.0, work)
        return
    if args.duration is not None:
        parser.error("--duration goes with --live")
    args.events = args.events or 2000
    args.repeats = args.repeats or 3
    if args.base is not None and args.flink != "embedded":
        parser.error("--base runs with --flink embedded only")
    if args.base is not None and not (args.base / ".venv" / "bin" / "ragpulse").is_file():
        parser.error(f"--base {args.base}: no .venv/bin/ragpulse (make .venv/.installed-stamp)")
    backlog_main(args, work)


if __name__ == "__main__":
    main()
