"""`ragpulse stream` reads the reviewers' labels back (pipeline/stages/labels.py): the unbounded
graph under TestStream (tests/test_stream.py says why), its review queue, label counts and dead
letters published to a real Apache Kafka, and `ragpulse exporter`'s reader turning the ratings
topic into the metrics serve exports.

One TestStream plays both topics: events, then labels, some of them played before the events
whose review items they label (as a runner may deliver them), and each kind of bad label. What
is checked is what the exporter shows and what the dead-letter topic holds.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.test_stream import TestStream
from apache_beam.transforms.window import TimestampedValue
from graph_runs import stage_config
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from prometheus_client import generate_latest
from serve_process import Scrape, read_topic
from test_review_stream import stream_review_queue, topic_on
from test_stream import GROUNDED, SCHEDULE, T0, UNGROUNDED, event, kafka_record

from ragpulse.pipeline.commands.exporter import RatingsExporter
from ragpulse.pipeline.formats import label_counts
from ragpulse.pipeline.formats.review import LabelRecord, encode_label, label_id
from ragpulse.pipeline.graphs.unbounded import StreamLabels, StreamSinks, build_stream
from ragpulse.pipeline.metrics.collector import registry_for
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.models import ExporterSettings, JudgeSettings
from ragpulse.pipeline.sinks.kafka import (
    KafkaTopic,
    PublishDeadLetters,
    PublishLabelCounts,
    PublishRatings,
)
from ragpulse.pipeline.stages.labels import LabelsConfig
from ragpulse.pipeline.stages.review import HourlyBound

pytestmark = [pytest.mark.slow, pytest.mark.kafka]

JUDGE = "groundedness"
SPEC = JudgeSettings(backend="local", names=(JUDGE,)).spec()
VERSION = SPEC.prompt_versions()[JUDGE]
READ = "ragpulse_review_labels_read_total"
LABELLED_AT = T0 + 100  # every label's Kafka record time: after the events it labels


def label(event_id: str, rating: str, verdict: str, *, reviewer: str = "ann",
          judge: str = JUDGE, version: str = VERSION) -> bytes:
    return encode_label(LabelRecord(
        label_id=label_id(event_id, judge, version, reviewer), event_id=event_id, judge=judge,
        prompt_version=version, judge_rating=rating, verdict=verdict, reviewer=reviewer,
        labelled_at=datetime.fromtimestamp(LABELLED_AT, UTC), reason="random",
        correct_score=2.0 if verdict == "score" else None,
    ))[1]


def label_record(offset: int, value: bytes) -> TimestampedValue:
    """A labels-topic record as ReadKafkaStream yields it, stamped with its record time."""
    at = LABELLED_AT + offset
    return TimestampedValue(SourceRecord(value, "logs.labels", 0, offset, record_time=at), at)


class _Tag(beam.PTransform):
    """One output of the test's TestStream, as a source `build_stream` applies to the pipeline
    (the TestStream plays the events and the labels topics in one script)."""

    def __init__(self, outputs: dict[str, Any], tag: str) -> None:
        super().__init__()
        self._outputs = outputs
        self._tag = tag

    def expand(self, pbegin: Any) -> Any:
        if not self._outputs:
            self._outputs.update(pbegin.pipeline | "Play" >> self._script)
        return self._outputs[self._tag] | "Take" >> beam.Map(lambda x: x)

    _script: TestStream


# Played before the events: the labels of r0 reach the job before r0's review item does.
EARLY_LABELS = [label("r0", "yes", "right")]
LABELS = [
    label("r1", "no", "right"),
    label("r1", "no", "wrong", reviewer="bob"),  # a second reviewer: a label of its own
    label("r0", "yes", "right"),  # ann's click on r0 sent again: a duplicate
    label("r2", "yes", "wrong"),
    label("r3", "yes", "score"),  # a graded scale's correct score: kept, not in the table
    label("never-queued", "yes", "right"),
    label("r3", "yes", "right", judge="tone_of_voice"),
    label("r3", "yes", "right", reviewer="cy", version="0123abcd"),
    b"not a label",
]


def test_the_stream_counts_each_label_once_and_the_exporter_shows_serves_figures(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
) -> None:
    review = stream_review_queue(kafka_broker, rate=1.0, targets=())

    def target(topic: str) -> KafkaTopic:
        return topic_on(kafka_broker, topic)
    config = stage_config(judges=SPEC, window_seconds=60.0, review=review)
    script = (
        TestStream(output_tags={"events", "labels"})
        .advance_watermark_to(T0, tag="events")
        .advance_watermark_to(T0, tag="labels")
        .add_elements([label_record(i, v) for i, v in enumerate(EARLY_LABELS)], tag="labels")
        .add_elements([
            kafka_record(0, event("r0", T0 + 5, GROUNDED), T0 + 5),
            kafka_record(1, event("r1", T0 + 6, UNGROUNDED), T0 + 6),
            kafka_record(2, event("r2", T0 + 7, GROUNDED), T0 + 7),
            kafka_record(3, event("r3", T0 + 8, GROUNDED), T0 + 8),
        ], tag="events")
        .advance_watermark_to(T0 + 61, tag="events")
        .add_elements([label_record(len(EARLY_LABELS) + i, v) for i, v in enumerate(LABELS)],
                      tag="labels")
        # The watermark passes the labels' times: each is decided; then an early pane of the
        # counts (a running job's watermark never reaches the end of the global window).
        .advance_watermark_to(LABELLED_AT + 60, tag="events")
        .advance_watermark_to(LABELLED_AT + 60, tag="labels")
        .advance_processing_time(SCHEDULE.early_firing_seconds + 1)
        .advance_watermark_to_infinity(tag="events")
        .advance_watermark_to_infinity(tag="labels")
    )
    outputs: dict[str, Any] = {}
    events, labels = _Tag(outputs, "events"), _Tag(outputs, "labels")
    events._script = labels._script = script
    sinks = StreamSinks(
        dead_letters=PublishDeadLetters(target("logs.dlq"), runner_retries=True),
        ratings=PublishRatings(target("logs.ratings")),
        labels=StreamLabels(
            source=labels, counts=PublishLabelCounts(target("logs.ratings")),
            config=LabelsConfig({JUDGE: VERSION}, horizon_seconds=86400.0,
                                early_firing_seconds=SCHEDULE.early_firing_seconds),
        ),
    )
    options = PipelineOptions(["--streaming", "--runner=BundleBasedDirectRunner"])
    with beam.Pipeline(options=options) as p:
        build_stream(p, events, config, SCHEDULE, sinks)
    HourlyBound.reset()

    letters = read_topic(kafka_broker.bootstrap, "logs.dlq", 4)
    reasons = sorted(dict(r.headers)["reason"].decode() for r in letters)
    assert len(reasons) == 4
    assert any("judge 'tone_of_voice', which this job does not run" in r for r in reasons)
    assert any("event 'never-queued'" in r and "no review item" in r for r in reasons)
    assert any("prompt version '0123abcd'" in r for r in reasons)
    assert any(r.startswith("not a label record") for r in reasons)

    scrape = exporter_scrape(kafka_broker.bootstrap, labels_read=1 + len(LABELS), cells=4)
    assert {lab["outcome"]: v for lab, v in scrape.select(READ) if v} == {
        "counted": 4, "duplicate": 1, "not_binary": 1, "unknown_judge": 1,
        "unknown_event": 1, "other_version": 1, "malformed": 1,
    }
    cells = {(lab["human"], lab["rating"]): v
             for lab, v in scrape.select("ragpulse_review_labels_total", judge=JUDGE,
                                         version=VERSION, slice="random")}
    assert cells == {("yes", "yes"): 1, ("no", "no"): 1, ("yes", "no"): 1, ("no", "yes"): 1}
    key = {"judge": JUDGE, "version": VERSION, "slice": "random"}
    assert scrape.value("ragpulse_judge_human_sensitivity", **key) == pytest.approx(1 / 2)
    assert scrape.value("ragpulse_judge_human_specificity", **key) == pytest.approx(1 / 2)
    assert scrape.value("ragpulse_judge_human_agreement_kappa", **key) == pytest.approx(0.0)
    assert scrape.value("ragpulse_judge_human_labels", **key, human="yes") == 2
    # The window's pass ratio corrected with those labels (3 of 4 passed; with sensitivity and
    # specificity 1/2 the Rogan-Gladen correction is undefined: no series), and the rates it
    # would use are exported with their label counts.
    assert scrape.value("ragpulse_judge_calibration_labelled", judge=JUDGE, label="yes") == 2
    assert scrape.value("ragpulse_judge_calibration_sensitivity", judge=JUDGE) == 0.5
    # The graded score of r3 is tabulated by grade (this judge has no pass score: not_binary).
    assert scrape.value("ragpulse_review_label_grades_total", judge=JUDGE, version=VERSION,
                        slice="random", grade="2", rating="yes") == 1


def exporter_scrape(bootstrap: str, labels_read: int, cells: int) -> Scrape:
    """What `ragpulse exporter` shows once it has read `labels_read` labels' outcomes and
    `cells` labels in the judges' tables from the ratings topic (each counter is a row of its
    own; its reader thread on the real topic; the deadline is only a failure's)."""
    exporter = RatingsExporter(ExporterSettings(
        bootstrap=bootstrap, ratings_topic="logs.ratings", kafka_timeout_seconds=10.0,
    ))
    stop = threading.Event()
    reader = threading.Thread(target=exporter.run, args=(stop,), daemon=True)
    reader.start()
    registry = registry_for(exporter.snapshot, event_counters=False)
    deadline = time.monotonic() + 60
    try:
        while True:
            scrape = Scrape.parse(generate_latest(registry).decode())
            done = (scrape.total(READ) >= labels_read
                    and scrape.total("ragpulse_review_labels_total") >= cells)
            if done or time.monotonic() > deadline:
                return scrape
            time.sleep(0.2)
    finally:
        stop.set()
        reader.join(30)


def test_a_label_count_row_reads_back_as_its_counter_and_nothing_else_does() -> None:
    key, value = label_counts.encode(("ragpulse_review_labels_read_total",
                                      (("outcome", "counted"),)), 7)
    assert label_counts.is_label_count(value) and key.startswith(b'["label_count"')
    assert label_counts.decode(value) == (("ragpulse_review_labels_read_total",
                                           (("outcome", "counted"),)), 7)
    for bad in (b'{"row":"label_count","counter":"ragpulse_judge_verdicts_total",'
                b'"labels":{"outcome":"x"},"value":1}',
                b'{"row":"label_count","counter":"ragpulse_review_labels_read_total",'
                b'"labels":{"outcome":"x"},"value":-1}',
                b'{"row":"label_count"'):
        with pytest.raises(label_counts.InvalidLabelCount):
            label_counts.decode(bad)
