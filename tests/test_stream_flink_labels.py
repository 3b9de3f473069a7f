"""`ragpulse stream` reads the reviewers' labels on Beam's Flink runner (the services of
tests/flink_runner.py, as tests/test_stream_flink.py): the job runs with the review queue on,
the test labels the items it finds on the review topic while the job runs, and the label counts
come back on the ratings topic, each label once; a label of an event never queued is
dead-lettered."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from flink_runner import FlinkServices, flink  # noqa: F401
from kafka import KafkaConsumer, TopicPartition
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import read_topic
from test_stream_flink import (
    cancel_jobs,
    create_topics,
    produce_at,
    produce_events,
    submit,
    wait_until,
    window_start,
)

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.formats import label_counts
from ragpulse.pipeline.formats.review import LabelRecord, decode_item, encode_label, label_id

pytestmark = [pytest.mark.slow, pytest.mark.flink, pytest.mark.timeout(900)]

JUDGE = "groundedness"
READ = "ragpulse_review_labels_read_total"


def label(event_id: str, version: str, rating: str) -> bytes:
    return encode_label(LabelRecord(
        label_id=label_id(event_id, JUDGE, version, "ann"), event_id=event_id, judge=JUDGE,
        prompt_version=version, judge_rating=rating, verdict="right", reviewer="ann",
        labelled_at=datetime.now(UTC), reason="random",
    ))[1]


def label_totals(bootstrap: str, topic: str) -> dict[Any, int]:
    """The largest value of each label counter on the ratings topic (as the exporter keeps)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        end = consumer.end_offsets([tp])[tp]
        totals: dict[Any, int] = {}
        while consumer.position(tp) < end:
            for batch in consumer.poll(timeout_ms=500).values():
                for r in batch:
                    if label_counts.is_label_count(r.value):
                        key, value = label_counts.decode(r.value)
                        totals[key] = max(value, totals.get(key, 0))
        return totals
    finally:
        consumer.close(autocommit=False)


def test_stream_on_flink_counts_labels_made_while_it_runs_once_each(
    kafka_broker: ApacheKafkaBroker, flink: FlinkServices  # noqa: F811
) -> None:
    bootstrap = kafka_broker.bootstrap
    topic = "labelled-logs"
    create_topics(bootstrap, topic, f"{topic}.ratings", f"{topic}.dlq", f"{topic}.review",
                  f"{topic}.labels")
    # Live traffic (event times now), so that the watermark passes the labels' record times.
    now = time.time()
    events = list(simulate(11, 20, window_start(now) - 60))
    produce_events(bootstrap, topic, events)
    argv = [
        "stream", f"--kafka-bootstrap={bootstrap}", f"--topic={topic}", "--window=60s",
        "--allowed-lateness=10m", "--early-firing=2s", f"--judges={JUDGE}",
        "--judge-backend=local", "--review-rate=1", "--review-max-per-hour=100000",
        *flink.stream_args, "--beam-arg=--checkpointing_interval=2000",
    ]
    try:
        submit(argv, flink)
        items = read_topic(bootstrap, f"{topic}.review", 3, timeout=300)
        queued = [decode_item(r.value) for r in items[:3]]
        labels = [label(i.event_id, i.verdicts[0].prompt_version, i.verdicts[0].rating)
                  for i in queued]
        version = queued[0].verdicts[0].prompt_version
        # Labelled while the job runs: three items, one of them twice, and an event never queued.
        produce_at(bootstrap, f"{topic}.labels", [
            (v, time.time()) for v in [*labels, labels[0], label("never-queued", version, "yes")]
        ])
        # More live events after the labels, so that the events' watermark passes them too.
        produce_events(bootstrap, topic, list(simulate(12, 10, time.time())))

        def counted() -> dict[Any, int] | None:
            # Each counter has panes of its own: wait until every one has shown its count.
            totals = label_totals(bootstrap, f"{topic}.ratings")
            outcomes = {dict(k[1])["outcome"]: v for k, v in totals.items() if k[0] == READ}
            cells = sum(v for k, v in totals.items() if k[0] == "ragpulse_review_labels_total")
            done = (outcomes.get("counted"), outcomes.get("duplicate"),
                    outcomes.get("unknown_event"), cells) == (3, 1, 1, 3)
            return totals if done else None

        totals = wait_until(counted, "the label counts on the ratings topic", logs=flink.logs)
        (letter,) = read_topic(bootstrap, f"{topic}.dlq", 1)
        assert b"never-queued" in dict(letter.headers)["reason"]
    finally:
        cancel_jobs(flink)
    cells = {k: v for k, v in totals.items() if k[0] == "ragpulse_review_labels_total"}
    assert {dict(k[1])["version"] for k in cells} == {version}
    # Each label's cell is the judge's rating as the reviewer confirmed it (right).
    ratings = sorted(i.verdicts[0].rating for i in queued)
    assert sorted(dict(k[1])["human"] for k, v in cells.items() for _ in range(v)) == ratings
