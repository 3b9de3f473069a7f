"""`ragpulse stream` for real, on Beam's Flink runner.

    events produced to Kafka -> `ragpulse stream` (Beam's Java KafkaIO, expanded by Beam's
    expansion service; the job on an embedded Flink through Beam's Flink job server; the Python
    stages in a Python worker pool) -> ratings and dead-letter topics -> `ragpulse exporter`
    -> Prometheus with the shipped recording rules

and the same events through `ragpulse serve`, whose metrics the stream's must equal.

The job is stopped (cancelled through the job service) and resubmitted with the same consumer
group half-way: KafkaIO commits the group's offsets when Flink finalizes a checkpoint
(`--checkpointing_interval`), and the resubmitted job starts from them, so nothing is read
twice or skipped. Window state is not carried over (the portable job server restores no
savepoint here), so the test stops the job between windows; docs/operations.md says what
happens to a window that is open when the job stops.

The services come from tests/flink_runner.py (jars fetched by `make stream-tools`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from cli import ragpulse
from flink_runner import FlinkServices, flink  # noqa: F401
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from processes import free_port
from prometheus_server import PrometheusServer, prometheus_config, running_prometheus
from serve_process import Scrape, ServeProcess, read_topic
from test_exporter import RULE_FILES, running_exporter, scrape
from test_stream_sessions import turn
from waiting import wait_until

from ragpulse.pipeline.commands.simulate import Incidents, SimulatedEvent, simulate
from ragpulse.pipeline.formats import rating_rows
from ragpulse.pipeline.formats.rating_rows import RatingPane

pytestmark = [pytest.mark.slow, pytest.mark.flink, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
WINDOW_S = 60
JUDGES = "groundedness,safety,relevance_to_query"
GROUP = "ragpulse-stream"
MALFORMED = 3
# Each wait includes Flink deploying the job (up to 5 min on a loaded 2-core machine).
WAIT_S = 300.0


def stream_argv(bootstrap: str, topic: str, services: FlinkServices) -> list[str]:
    """The `ragpulse stream` command line the test submits; deploy/flink/submit-job.yaml must
    pass the same flags (test_the_flink_deployment_submits_the_flags_this_test_runs)."""
    return [
        "stream",
        f"--kafka-bootstrap={bootstrap}",
        f"--topic={topic}",
        f"--window={WINDOW_S}s",
        "--allowed-lateness=10m",
        "--early-firing=60s",
        f"--kafka-consumer-config=group.id={GROUP}",
        f"--judges={JUDGES}",
        "--judge-backend=local",
        *services.stream_args,
        # Flink checkpoints every 2 s; KafkaIO commits the group's offsets at each one.
        "--beam-arg=--checkpointing_interval=2000",
    ]


def submit(argv: Sequence[str], services: FlinkServices) -> None:
    """Runs `ragpulse stream`, which returns once the job runs (expanding the Kafka reader and
    staging its jars take a minute or two on a loaded 2-core machine)."""
    done = ragpulse(*argv, timeout=600)
    assert done.returncode == 0, f"{done.stderr[-4000:]}\n{services.logs()}"
    assert "(job state RUNNING)" in done.stderr


def produce_events(bootstrap: str, topic: str, events: Sequence[SimulatedEvent]) -> None:
    """Each event with its event time as the Kafka record time (the stream's event time)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for e in events:
            stamp = int(e.event_time * 1000)
            producer.send(topic, value=e.payload, partition=0, timestamp_ms=stamp)
        producer.flush(timeout=30)
    finally:
        producer.close()


def produce_at(bootstrap: str, topic: str, records: Sequence[tuple[bytes, float]]) -> None:
    """Each (payload, event time) with its event time as the Kafka record time."""
    produce_events(bootstrap, topic, [SimulatedEvent(raw, at, "turn") for raw, at in records])


def create_topics(bootstrap: str, *names: str) -> None:
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(n, 1, 1) for n in names])
    finally:
        admin.close()


class RatingsReader:
    """Reads the ratings topic from the start and keeps every pane read, in order."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest"
        )
        self.tp = TopicPartition(topic, 0)
        self.consumer.assign([self.tp])
        self.consumer.seek_to_beginning(self.tp)
        self.panes: list[RatingPane] = []

    def poll(self) -> list[RatingPane]:
        for batch in self.consumer.poll(timeout_ms=200).values():
            self.panes.extend(rating_rows.decode(r.value) for r in batch)
        return self.panes

    def on_time_windows(self) -> set[float]:
        return {p.key.window_start for p in self.poll() if p.timing == "on_time"}

    def close(self) -> None:
        self.consumer.close(autocommit=False)


def committed(bootstrap: str, topic: str) -> int:
    """The stream's consumer group's committed offset of the topic (-1: none yet)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=GROUP,
                             enable_auto_commit=False)
    try:
        offset = consumer.committed(TopicPartition(topic, 0))
    finally:
        consumer.close(autocommit=False)
    return -1 if offset is None else int(offset)


def running_jobs(services: FlinkServices) -> list[str]:
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{services.job_port}") as channel:
        stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
        jobs = stub.GetJobs(beam_job_api_pb2.GetJobsRequest(), timeout=30).job_info
        return [j.job_id for j in jobs if j.state == beam_job_api_pb2.JobState.RUNNING]


def cancel_jobs(services: FlinkServices) -> None:
    """Cancels every running job through Beam's job service, then the Flink jobs themselves
    (Beam's `Cancel` leaves a job on the embedded Flink running: the first phase's job read the
    second phase's records and committed their offsets, docs/figures.md), and waits until
    neither reports one running."""
    from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{services.job_port}") as channel:
        stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
        for job_id in running_jobs(services):
            stub.Cancel(beam_job_api_pb2.CancelJobRequest(job_id=job_id), timeout=60)
    wait_until(lambda: not running_jobs(services), "the job's cancellation", 120)
    services.cancel_flink_jobs()
    wait_until(lambda: not services.running_flink_jobs(), "the Flink job's cancellation", 120)


def window_start(t: float) -> float:
    return t - t % WINDOW_S


WindowCounts = dict[tuple[str, str, str, str], tuple[int, int, int]]


def iso(start: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))


def serve_results(
    bootstrap: str, topic: str, total: int, tmp_path: Path
) -> tuple[Scrape, WindowCounts]:
    """`ragpulse serve` on the same topic (its own state, group and dead-letter topic), once it
    has read all `total` records: its metrics, and (yes, no, error) per (window start, judge,
    app, model) from its state (`ragpulse windows`)."""
    serve = ServeProcess(
        bootstrap,
        topic,
        tmp_path / "serve.sqlite",
        [
            f"--window={WINDOW_S}s",
            f"--judges={JUDGES}",
            f"--dead-letter-topic={topic}.serve-dlq",
            "--group-id=ragpulse-serve",
        ],
        log_path=tmp_path / "serve.log",
    )
    with serve:
        serve.wait_for(lambda m: m.total("ragpulse_events_total") >= total, timeout=WAIT_S)
        rows = serve.windows()
        return serve.metrics(), {
            (str(r["window_start"]), r["judge"], r["app"], r["model"]):
                (int(r["yes"]), int(r["no"]), int(r["error"]))
            for r in rows
        }


def stream_results(panes: Sequence[RatingPane]) -> WindowCounts:
    """(yes, no, error) of each window's latest pane, keyed as `serve_results`."""
    latest: dict[tuple[str, str, str, str], RatingPane] = {}
    for p in panes:
        key = (iso(p.key.window_start), p.key.judge, p.key.app, p.key.model)
        if key not in latest or p.index > latest[key].index:
            latest[key] = p
    return {k: (p.counts.yes, p.counts.no, p.counts.error) for k, p in latest.items()}


def verdict_totals(m: Scrape) -> dict[tuple[str, str, str, str], float]:
    """ragpulse_judge_verdicts_total by (judge, app, model, rating)."""
    return {
        (lab["judge"], lab["app"], lab["model"], lab["rating"]): v
        for lab, v in m.select("ragpulse_judge_verdicts_total")
    }


def pass_ratios(m: Scrape) -> dict[tuple[str, str, str], float]:
    return {
        (lab["judge"], lab["app"], lab["model"]): v
        for lab, v in m.select("ragpulse_judge_pass_ratio")
    }


def prometheus_values(prom: PrometheusServer, expr: str, keys: Sequence[str]) -> dict[Any, float]:
    return {
        tuple(s["metric"][k] for k in keys): float(s["value"][1])
        for s in prom.query(expr)["result"]
    }


def test_stream_on_flink_judges_like_serve_publishes_dead_letters_and_resumes_without_loss(
    kafka_broker: ApacheKafkaBroker, flink: FlinkServices, tmp_path: Path  # noqa: F811
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = "inference-logs"
    create_topics(bootstrap, topic, f"{topic}.ratings", f"{topic}.dlq", f"{topic}.serve-dlq")
    # Two phases of traffic, each filling whole one-minute windows well in the past: the
    # reader's watermark jumps to the present once it has caught up, closing them all.
    t0 = window_start(time.time()) - 30 * WINDOW_S
    first = list(simulate(7, 2 * WINDOW_S, t0, incidents=Incidents(
        malformed_burst_at=30, malformed_burst_count=MALFORMED)))
    second = list(simulate(8, 2 * WINDOW_S, t0 + 3 * WINDOW_S))
    first_windows = {window_start(e.event_time) for e in first}
    second_windows = {window_start(e.event_time) for e in second}
    produce_events(bootstrap, topic, first)
    argv = stream_argv(bootstrap, topic, flink)

    ratings = RatingsReader(bootstrap, f"{topic}.ratings")
    try:
        submit(argv, flink)
        wait_until(lambda: first_windows <= ratings.on_time_windows(),
                   "the on-time panes of the first windows", logs=flink.logs)
        letters = read_topic(bootstrap, f"{topic}.dlq", MALFORMED)
        assert len(letters) == MALFORMED
        assert all(dict(r.headers).get("reason") for r in letters)
        # Stop the job once its checkpoint has committed every offset it read.
        wait_until(lambda: committed(bootstrap, topic) == len(first),
                   "the commit of the group's offsets", logs=flink.logs)
        cancel_jobs(flink)
        panes_before_stop = len(ratings.poll())

        produce_events(bootstrap, topic, second)
        submit(argv, flink)
        wait_until(lambda: second_windows <= ratings.on_time_windows(),
                   "the on-time panes of the second windows", logs=flink.logs)
        wait_until(lambda: committed(bootstrap, topic) == len(first) + len(second),
                   "the commit of the second offsets", logs=flink.logs)
        cancel_jobs(flink)
        resumed = ratings.poll()[panes_before_stop:]
    finally:
        ratings.close()

    # The resumed job read on from the committed offsets: no pane of a first window again.
    assert {p.key.window_start for p in resumed} == second_windows
    assert len(read_topic(bootstrap, f"{topic}.dlq", MALFORMED)) == MALFORMED

    # Window by window, the stream's final counts (hence its pass ratios) are serve's.
    served, served_windows = serve_results(bootstrap, topic, len(first) + len(second), tmp_path)
    assert stream_results(ratings.panes) == served_windows
    assert {(w, judge) for w, judge, _, _ in served_windows} == {
        (iso(w), judge) for w in first_windows | second_windows for judge in JUDGES.split(",")
    }
    port = free_port()
    config = prometheus_config(
        [f"127.0.0.1:{port}"], RULE_FILES, scrape_interval="1s", evaluation_interval="1s"
    )
    with running_exporter(
        kafka_broker, f"{topic}.ratings", port, tmp_path / "exporter.log"
    ), running_prometheus(config) as prom:
        exported = scrape(port)
        # Through the exporter: every verdict of every judge, app and model, as serve counted.
        assert verdict_totals(exported) == verdict_totals(served)
        assert sum(verdict_totals(served).values()) > 0
        # Prometheus scrapes the exporter's pass ratios and evaluates the shipped rules on them.
        expected = pass_ratios(exported)
        assert expected
        keys = ("judge", "app", "model")

        def scraped() -> dict[Any, float]:
            return prometheus_values(prom, "ragpulse_judge_pass_ratio", keys)

        got = wait_until(lambda: scraped() if len(scraped()) == len(expected) else None,
                         "Prometheus's scrape of the exporter")
        assert all(math.isclose(got[k], v) for k, v in expected.items())
        groups = prom.api("rules")["data"]["groups"]
        failing = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
                   if r["health"] == "err"]
        assert groups and failing == []


def test_stream_on_flink_judges_each_session_once_with_the_rejudging_state_in_the_graph(
    kafka_broker: ApacheKafkaBroker, flink: FlinkServices  # noqa: F811
) -> None:
    """Session judges on Flink: the session windows (late, accumulating panes) and
    `ReplaceRejudged`'s keyed state and timer run in the job, and each conversation is judged
    once, in the window of its last turn. Late turns re-opening a session are tested on
    TestStream (tests/test_stream_sessions.py): here, records produced while the job ran gave
    no pane within 300 s (docs/sessions.md, "Not yet")."""
    bootstrap = kafka_broker.bootstrap
    topic = "conversations"
    create_topics(bootstrap, topic, f"{topic}.ratings", f"{topic}.dlq")
    t0 = window_start(time.time()) - 2 * WINDOW_S
    argv = [
        "stream", f"--kafka-bootstrap={bootstrap}", f"--topic={topic}", f"--window={WINDOW_S}s",
        "--allowed-lateness=30m", "--early-firing=60s",
        "--kafka-consumer-config=group.id=ragpulse-sessions", "--judges=safety",
        "--session-judges=user_frustration", "--session-gap=60s", "--judge-backend=local",
        *flink.stream_args, "--beam-arg=--checkpointing_interval=2000",
    ]
    # calm passes; upset fails (negative feedback, "not what I asked").
    produce_at(bootstrap, topic, [
        (turn("calm", 1, t0 + 5, "How do I export my data?"), t0 + 5),
        (turn("upset", 1, t0 + 10, "How do I export my invoices?"), t0 + 10),
        (turn("calm", 2, t0 + 15, "Thanks, and can I pick a date range?"), t0 + 15),
        (turn("upset", 2, t0 + 20, "That's not what I asked, how do I export?", "negative"),
         t0 + 20),
    ])
    ratings = RatingsReader(bootstrap, f"{topic}.ratings")

    def frustration() -> list[tuple[int, int]]:
        return [(p.counts.yes, p.counts.no) for p in ratings.poll()
                if p.key.judge == "user_frustration" and p.key.window_start == t0]

    try:
        submit(argv, flink)
        seen = wait_until(lambda: (1, 1) in frustration() and frustration(),
                          "the two sessions' verdicts", logs=flink.logs)
    finally:
        cancel_jobs(flink)
        ratings.close()
    assert all(yes + no <= 2 for yes, no in seen)
