"""The review queue's depth, measured by the review page and shown at its /metrics (the
dashboard's queue-depth panel reads it): items the page holds that nobody has labelled yet,
and review-topic records it has not read yet, against a real Apache Kafka."""

from __future__ import annotations

import base64
import time
from datetime import UTC, datetime

import bcrypt
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from prometheus_client.parser import text_string_to_metric_families

from ragpulse.pipeline.formats.review import (
    JudgeView,
    LabelRecord,
    ReviewItem,
    encode_item,
    encode_label,
    label_id,
)
from ragpulse.pipeline.kafka_security import PLAINTEXT
from ragpulse.pipeline.metrics.http import BasicAuth
from ragpulse.pipeline.review.app import review_app
from ragpulse.pipeline.review.queue import LabelPublisher, ReviewQueue
from ragpulse.pipeline.sinks.kafka import KafkaTopic

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

T0 = datetime(2025, 11, 20, 10, 0, tzinfo=UTC)
AUTH = {"Authorization": "Basic " + base64.b64encode(b"ana:pw").decode()}


def item(event_id: str) -> bytes:
    return encode_item(ReviewItem(
        event_id=event_id, app="a", model="m", event_time=T0, window_start=T0,
        window_end=T0.replace(minute=5), reason="random", request="q", response="a",
        verdicts=(JudgeView(judge="groundedness", rating="yes", prompt_version="v1"),),
        redacted=True, queued_at=T0,
    ))[1]


def label(event_id: str) -> bytes:
    return encode_label(LabelRecord(
        label_id=label_id(event_id, "groundedness", "v1", "bob"), event_id=event_id,
        judge="groundedness", prompt_version="v1", judge_rating="yes", verdict="right",
        reviewer="bob", labelled_at=T0, reason="random",
    ))[1]


def test_the_page_exports_the_items_nobody_labelled_and_the_records_it_has_not_read(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    kafka_broker.create_topic("chat.review")
    kafka_broker.create_topic("chat.labels")
    kafka_broker.produce("chat.review", [item(f"e{i}") for i in range(5)], partition=0)
    kafka_broker.produce("chat.labels", [label("e0"), label("e3")], partition=0)

    # Records the reader has not reached count as unread: a consumer at the topic's start.
    queue = ReviewQueue(kafka_broker.bootstrap, PLAINTEXT, "chat.review", "chat.labels", 10.0)
    consumer = KafkaConsumer(bootstrap_servers=kafka_broker.bootstrap, enable_auto_commit=False)
    try:
        tp = TopicPartition("chat.review", 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        assert queue._unread(consumer, {tp}) == 5
    finally:
        consumer.close()

    queue.start()
    publisher = LabelPublisher(KafkaTopic(kafka_broker.bootstrap, PLAINTEXT, "chat.labels", 10.0))
    users = {"ana": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))}
    client = review_app(queue, publisher, BasicAuth(users)).test_client()
    try:
        deadline = time.monotonic() + 30  # only a failure waits this long
        while (queue.status().items, queue.status().labels) != (5, 2):
            assert time.monotonic() < deadline, queue.status()
            time.sleep(0.1)
        while queue.status().unread:  # the reader's next poll sees its own position
            assert time.monotonic() < deadline, queue.status()
            time.sleep(0.1)
        assert client.get("/metrics").status_code == 401  # the reviewers' login, as every page
        answer = client.get("/metrics", headers=AUTH)
        assert answer.status_code == 200
        depth = {
            s.labels["state"]: s.value
            for family in text_string_to_metric_families(answer.get_data(as_text=True))
            for s in family.samples
            if s.name == "ragpulse_review_queue_depth"
        }
        assert depth == {"unlabelled": 3, "unread": 0}
    finally:
        queue.stop()
        publisher.close()
