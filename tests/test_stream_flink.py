"""`ragpulse stream` on Beam's Flink runner with an embedded Flink (the job server runs the
job in its own JVM), and the helpers the other embedded-Flink modules share.

    events produced to Kafka -> `ragpulse stream` (Beam's Java KafkaIO, expanded by Beam's
    expansion service; the job on the job server's embedded Flink; the Python stages in a
    Python worker pool) -> ratings and dead-letter topics

Here: session judges on Flink. The other embedded-Flink modules: live traffic and a drained
backlog (test_stream_flink_live.py), labels (test_stream_flink_labels.py). What a deployment
runs (a Flink cluster, parallelism 2, TaskManagers killed, a savepoint, a cancel and a
resubmission from the group's committed offsets, dead letters, the exporter and Prometheus's
rules, each compared with `ragpulse serve`) is tests/test_stream_flink_cluster.py.

The services come from tests/flink_runner.py (jars fetched by `make stream-tools`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import grpc
import pytest
from cli import ragpulse
from flink_runner import FlinkServices, flink  # noqa: F401
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.structs import TopicPartition
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from test_stream_sessions import turn
from waiting import wait_until

from ragpulse.pipeline.commands.simulate import SimulatedEvent
from ragpulse.pipeline.formats import rating_rows
from ragpulse.pipeline.formats.rating_rows import RatingPane

pytestmark = [pytest.mark.slow, pytest.mark.flink, pytest.mark.timeout(900)]

WINDOW_S = 60
# The judges of bench_stream_vs_serve.py's runs.
JUDGES = "groundedness,safety,relevance_to_query"
# Each wait includes Flink deploying the job (up to 5 min on a loaded 2-core machine).
WAIT_S = 300.0


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
