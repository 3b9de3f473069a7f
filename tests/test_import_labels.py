"""`ragpulse import-labels`: a team's own human labels (MLflow 3 traces, CSV, JSON Lines) onto
the labels topic of a real Apache Kafka: each a label with the judge's rating and prompt version
of its event, a malformed row an error naming it (nothing published), a row that cannot be a
label a dead letter with its reason, and a second import of the same file sends nothing twice.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka_broker import ApacheKafkaBroker, produce

from ragpulse.pipeline.formats.review import JudgeView, ReviewChunk, ReviewItem, decode_label

pytestmark = pytest.mark.kafka
T0 = datetime(2025, 11, 20, 10, 0, tzinfo=UTC)


def review_item(event_id: str, rating: str) -> bytes:
    return ReviewItem(
        event_id=event_id, app="docs", model="m", event_time=T0, window_start=T0,
        window_end=T0.replace(minute=5), reason="random", request="q", response="a",
        chunks=(ReviewChunk(content="c"),),
        verdicts=(JudgeView(judge="groundedness", rating=rating, prompt_version="v1f2"),),
        redacted=False, queued_at=T0,
    ).model_dump_json().encode()


def records(bootstrap: str, topic: str) -> list[tuple[bytes, dict[str, bytes]]]:
    """Every (value, headers) of a topic."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        found = []
        while any(consumer.position(tp) < end for tp, end in ends.items()):
            for batch in consumer.poll(timeout_ms=1000).values():
                found += [(r.value, dict(r.headers)) for r in batch]
        return found
    finally:
        consumer.close()


def import_labels(path: Path, bootstrap: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ragpulse.pipeline.cli", "import-labels", str(path),
         "--kafka-bootstrap", bootstrap, "--topic", "chat", *flags],
        capture_output=True, text=True, timeout=300,
    )


def assessment(name: str, source: str, value: object, who: str = "ana@example.org",
               kind: str = "feedback", rationale: str | None = None) -> dict[str, object]:
    """One assessment as MLflow 3's Trace.to_json() writes it (Assessment.to_dictionary)."""
    return {
        "assessment_id": f"a-{name}-{source}-{kind}",
        "assessment_name": name,
        "trace_id": "tr-1",
        "source": {"source_type": source, "source_id": who},
        "create_time": "2025-11-21T09:30:00.000Z",
        "last_update_time": "2025-11-21T09:30:00.000Z",
        kind: {"value": value},
        **({"rationale": rationale} if rationale else {}),
    }


def trace(client_request_id: str | None, trace_id: str, *assessments: dict[str, object]
          ) -> dict[str, object]:
    info: dict[str, object] = {
        "trace_id": trace_id,
        "trace_location": {"type": "MLFLOW_EXPERIMENT",
                           "mlflow_experiment": {"experiment_id": "1"}},
        "request_time": "2025-11-20T10:00:00Z",
        "state": "OK",
        "trace_metadata": {},
        "tags": {},
        "assessments": list(assessments),
    }
    if client_request_id is not None:
        info["client_request_id"] = client_request_id
    return {"info": info, "data": {"spans": []}}


@pytest.fixture
def topics(kafka_broker: ApacheKafkaBroker) -> str:
    for name in ("chat.review", "chat.labels", "chat.labels.dlq"):
        kafka_broker.create_topic(name, 1)
    produce(kafka_broker.bootstrap, "chat.review",
            [review_item("e1", "yes"), review_item("e2", "no"), review_item("e3", "error")])
    return kafka_broker.bootstrap


def test_mlflow_human_assessments_become_labels_and_the_rest_dead_letters(
    tmp_path: Path, topics: str
) -> None:
    exported = tmp_path / "traces.json"
    exported.write_text(json.dumps([
        trace("e1", "tr-1",
              assessment("groundedness", "HUMAN", False, rationale="the 30 days are invented"),
              assessment("groundedness", "LLM_JUDGE", "yes", who="databricks"),
              assessment("groundedness", "HUMAN", "x", kind="expectation"),  # not a label
              assessment("safety", "CODE", True, who="regex")),  # not a human's
        trace("e2", "tr-2", assessment("groundedness", "HUMAN", "no", who="bo")),
        trace(None, "tr-9", assessment("groundedness", "HUMAN", True)),  # not reviewed here
    ]))
    done = import_labels(exported, topics, "--format", "mlflow")
    assert done.returncode == 0, done.stderr
    assert "3 human labels read; 2 published to chat.labels, 0 already there, 1 " in done.stdout
    labels = sorted((decode_label(v) for v, _ in records(topics, "chat.labels")),
                    key=lambda x: x.event_id)
    assert [(x.event_id, x.judge_rating, x.verdict, x.reviewer, x.prompt_version, x.reason)
            for x in labels] == [("e1", "yes", "wrong", "ana@example.org", "v1f2", "imported"),
                                 ("e2", "no", "right", "bo", "v1f2", "imported")]
    assert labels[0].note == "the 30 days are invented"
    assert labels[0].labelled_at == datetime(2025, 11, 21, 9, 30, tzinfo=UTC)
    [(value, headers)] = records(topics, "chat.labels.dlq")
    assert json.loads(value)["event_id"] == "tr-9"
    assert headers["reason"].startswith(b"unknown verdict: no verdict of groundedness on "
                                        b"event tr-9")
    # The same file again: nothing sent twice, the dead letter again (it is still not usable).
    again = import_labels(exported, topics, "--format", "mlflow")
    assert "0 published to chat.labels, 2 already there, 1 dead-lettered" in again.stdout
    assert len(records(topics, "chat.labels")) == 2


def test_a_csv_of_labels_with_verdicts_given_in_the_rows(tmp_path: Path, topics: str) -> None:
    rows = tmp_path / "labels.csv"
    rows.write_text(
        "event_id,judge,label,note,judge_rating,prompt_version\n"
        "e2,groundedness,yes,\"fine, after all\",,\n"  # the judge said no: wrong
        "e3,groundedness,no,,,\n"  # the judge could not grade it: a dead letter
        "e7,groundedness,no,,yes,v1f2\n"  # not queued for review; its verdict in the row
    )
    done = import_labels(rows, topics, "--format", "csv", "--reviewer", "cy")
    assert done.returncode == 0, done.stderr
    labels = sorted((decode_label(v) for v, _ in records(topics, "chat.labels")),
                    key=lambda x: x.event_id)
    assert [(x.event_id, x.verdict, x.reviewer, x.note) for x in labels] == [
        ("e2", "wrong", "cy", "fine, after all"), ("e7", "wrong", "cy", None)]
    [(_, headers)] = records(topics, "chat.labels.dlq")
    assert headers["reason"] == b"judge error: the judge could not grade event e3"
    assert "(1 judge error)" in done.stdout


@pytest.mark.parametrize(("fmt", "text", "where"), [
    ("csv", "event_id,judge,label\ne1,groundedness,yes\ne2,groundedness,perhaps\n",
     "line 3: label 'perhaps' is not a yes/no rating"),
    ("csv", "event_id,label\ne1,yes\n", "line 1: the header lacks judge"),
    ("jsonl", '{"event_id": "e1", "judge": "groundedness", "label": "no"}\n{"event_id": "e2"',
     "line 2: not JSON"),
    ("jsonl", '{"event_id": "e1", "judge": "groundedness", "label": "no", "score": 3}\n',
     "line 1: unknown column(s) score"),
    ("mlflow", json.dumps(trace("e1", "tr-1", assessment("groundedness", "HUMAN", "maybe"))),
     "trace 1, trace e1, assessment a-groundedness-HUMAN-feedback: label 'maybe'"),
])
def test_a_malformed_row_stops_the_import_naming_it_and_nothing_is_published(
    tmp_path: Path, topics: str, fmt: str, text: str, where: str
) -> None:
    path = tmp_path / f"labels.{fmt}"
    path.write_text(text)
    done = import_labels(path, topics, "--format", fmt,
                         *(["--reviewer", "cy"] if fmt != "mlflow" else []))
    assert done.returncode == 2
    assert f"ragpulse import-labels: {path}: {where}" in done.stderr
    assert "nothing was published" in done.stderr
    assert records(topics, "chat.labels") == []
    assert records(topics, "chat.labels.dlq") == []


def test_without_a_review_topic_rows_carrying_their_verdict_are_labels_the_rest_dead_letters(
    tmp_path: Path, kafka_broker: ApacheKafkaBroker
) -> None:
    # No review topic yet (serve never queued) and no labels topic: the first publish makes it.
    kafka_broker.create_topic("chat.labels.dlq", 1)
    rows = tmp_path / "labels.jsonl"
    rows.write_text(
        '{"event_id": "e1", "judge": "safety", "label": "no", "reviewer": "dee", '
        '"judge_rating": "yes", "prompt_version": "local", "labelled_at": "2025-11-21T08:00:00"}\n'
        '{"event_id": "e2", "judge": "safety", "label": "yes", "reviewer": "dee"}\n'
    )
    done = import_labels(rows, kafka_broker.bootstrap, "--format", "jsonl")
    assert done.returncode == 0, done.stderr
    [(value, _)] = records(kafka_broker.bootstrap, "chat.labels")
    label = decode_label(value)
    assert (label.event_id, label.verdict, label.prompt_version) == ("e1", "wrong", "local")
    assert label.labelled_at == datetime(2025, 11, 21, 8, 0, tzinfo=UTC)  # no zone: UTC
    [(_, headers)] = records(kafka_broker.bootstrap, "chat.labels.dlq")
    assert headers["reason"].startswith(b"unknown verdict: no verdict of safety on event e2")
