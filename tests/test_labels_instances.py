"""Reviewers' labels with several serve instances (--instance I --instances N), against a real
Apache Kafka broker, two real `ragpulse serve` subprocesses splitting a topic's partitions, each
queuing its own judged events for review.

A label of an event judged by instance 0 and one of an event judged by instance 1 are both
counted, each exactly once over the two: instance 0 alone exports the label counters and the
agreement figures (Prometheus sums them over instances) and dead-letters a bad label (once);
every instance reads the labels into its own state, so the corrected pass ratio of instance 1's
windows rests on the same labels as instance 0's. Instance 0 killed (SIGKILL) and started again
counts nothing twice and goes on with the labels that come after.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import (
    T0,
    Scrape,
    ServeProcess,
    caught_up,
    produce_round_robin,
    read_topic,
)

from ragpulse.pipeline.commands.simulate import Incidents, simulate
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.formats.review import LabelRecord, ReviewItem, decode_item, encode_label
from ragpulse.pipeline.formats.review import label_id as make_label_id
from ragpulse.pipeline.sources.kafka import log_bounds

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]

JUDGE = "groundedness"
TOPIC = "split-labels"
PARTITIONS = 2
EVENTS = 80
DROP = Incidents(groundedness_drop_at=0.0, drop_to=0.5)
LABELS = "ragpulse_review_labels_total"
READ = "ragpulse_review_labels_read_total"
HUMAN = "ragpulse_judge_human_labels"
CALIBRATION = "ragpulse_judge_calibration_labelled"


def instance_args(i: int) -> list[str]:
    return [
        "--window", "10s", "--judges", JUDGE, "--group-id", "split-labels",
        "--instances", str(PARTITIONS), "--instance", str(i),
        "--review-rate", "1", "--review-max-per-hour", "100000",
    ]


def label(item: ReviewItem, verdict: str, reviewer: str = "ann") -> LabelRecord:
    (view,) = [v for v in item.verdicts if v.judge == JUDGE]
    return LabelRecord(
        label_id=make_label_id(item.event_id, JUDGE, view.prompt_version, reviewer),
        event_id=item.event_id, judge=JUDGE, prompt_version=view.prompt_version,
        judge_rating=view.rating, verdict=verdict, reviewer=reviewer,
        labelled_at=datetime.now(UTC), reason=item.reason,
    )


def never_queued(like: LabelRecord) -> LabelRecord:
    return LabelRecord(
        label_id=make_label_id("never-queued", JUDGE, like.prompt_version, "ann"),
        event_id="never-queued", judge=JUDGE, prompt_version=like.prompt_version,
        judge_rating="yes", verdict="right", reviewer="ann", labelled_at=datetime.now(UTC),
        reason="random",
    )


def publish(broker: ApacheKafkaBroker, labels: Sequence[LabelRecord]) -> None:
    for lab in labels:
        key, value = encode_label(lab)
        # A label's partition follows its key, as the review page's producer places it.
        broker.produce(f"{TOPIC}.labels", [value], partition=sum(key) % 2)


def cells(scrape: Scrape) -> Counter[tuple[str, str]]:
    return Counter({(lab["human"], lab["rating"]): v for lab, v in scrape.select(LABELS) if v})


def calibration(scrape: Scrape) -> tuple[float | None, float | None]:
    return (scrape.value(CALIBRATION, judge=JUDGE, label="yes"),
            scrape.value(CALIBRATION, judge=JUDGE, label="no"))


def dead_letters_of(bootstrap: str, event_id: str) -> int:
    """How many records of the dead-letter topic are of `event_id`'s label."""
    ends = log_bounds(bootstrap, f"{TOPIC}.dlq", timeout_s=10).ends
    letters = read_topic(bootstrap, f"{TOPIC}.dlq", sum(ends.values()))
    return sum(event_id.encode() in r.value for r in letters)


def test_a_label_of_each_instances_events_counts_once_and_corrects_every_instances_windows(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: Callable[..., ServeProcess],
    tmp_path: Path,
) -> None:
    broker = kafka_broker
    broker.create_topic(TOPIC, PARTITIONS)
    broker.create_topic(f"{TOPIC}.labels", 2)
    broker.create_topic(f"{TOPIC}.review", 1)
    # Half of the answers ungrounded: the judge passes some and fails some on each instance.
    events = list(simulate(21, EVENTS, T0, rate=2, incidents=DROP))
    placed = produce_round_robin(broker, TOPIC, events, PARTITIONS)
    # Which instance judges each event: the one reading its partition (p % instances).
    judged_by = {
        parse_event(e.payload).request_id: partition % PARTITIONS
        for e, (partition, _) in zip(events, placed, strict=True) if e.kind != "malformed"
    }
    per_instance = Counter(partition % PARTITIONS for partition, _ in placed)
    states = [tmp_path / f"instance-{i}.sqlite" for i in range(PARTITIONS)]
    serves = [
        serve_processes(broker.bootstrap, TOPIC, states[i], instance_args(i)).start()
        for i in range(PARTITIONS)
    ]
    scrapes = [
        s.wait_for(caught_up(per_instance[i]), 180, "its partitions read")
        for i, s in enumerate(serves)
    ]
    queued = sum(m.total("ragpulse_review_queued_total") for m in scrapes)
    items = [decode_item(r.value) for r in read_topic(broker.bootstrap, f"{TOPIC}.review",
                                                      int(queued), timeout=60)]
    assert {judged_by[i.event_id] for i in items} == {0, 1}, "each instance queued items"

    def item_of(instance: int, rating: str, skip: int = 0) -> ReviewItem:
        return [
            i for i in items if judged_by[i.event_id] == instance
            and [v.rating for v in i.verdicts if v.judge == JUDGE] == [rating]
        ][skip]

    # Of each instance's events one the judge passed and one it failed, the reviewers agreeing,
    # and a second reviewer overturning the pass of instance 1's: cells yes_yes 2, no_no 2,
    # no_yes 1 (human first).
    first = [
        label(item_of(0, "yes"), "right"), label(item_of(0, "no"), "right"),
        label(item_of(1, "yes"), "right"), label(item_of(1, "no"), "right"),
        label(item_of(1, "yes"), "wrong", reviewer="bob"),
    ]
    bad = never_queued(first[0])
    publish(broker, [bad, *first])  # the bad one first: read by the time the others count
    scrapes = [
        serves[0].wait_for(lambda m: m.total(READ) >= 6, 120, "every label read"),
        serves[1].wait_for(lambda m: calibration(m) == (2, 3), 120, "the labels in its figures"),
    ]
    expected = Counter({("yes", "yes"): 2, ("no", "no"): 2, ("no", "yes"): 1})
    # Summed over the instances, as Prometheus sums: each label once.
    assert cells(scrapes[0]) + cells(scrapes[1]) == expected
    assert cells(scrapes[1]) == Counter()
    assert scrapes[1].select(READ) == [] and scrapes[1].select(HUMAN) == []
    assert sum(m.total(HUMAN, slice="random") for m in scrapes) == 5
    assert scrapes[0].value(READ, outcome="counted") == 5
    assert scrapes[0].value(READ, outcome="unknown_event") == 1
    # Both instances correct their windows with the same labels: sensitivity 2/2, specificity
    # 2/3; instance 1's windows get a corrected ratio although instance 0 exports the counts.
    for m in scrapes:
        assert calibration(m) == (2, 3)
        assert m.value("ragpulse_judge_calibration_specificity", judge=JUDGE) == (
            pytest.approx(2 / 3)
        )
        assert (m.select("ragpulse_judge_pass_ratio_corrected", judge=JUDGE)
                or m.select("ragpulse_judge_in_progress_pass_ratio_corrected", judge=JUDGE))
    assert dead_letters_of(broker.bootstrap, "never-queued") == 1

    # Instance 0 killed and started again on its state: nothing counted twice; a later label
    # (of instance 1's event) and a copy of an earlier one (a duplicate) are read by both.
    assert serves[0].kill() != 0
    serves[0] = serve_processes(broker.bootstrap, TOPIC, states[0], instance_args(0)).start()
    later = label(item_of(1, "no", skip=1), "right", reviewer="cy")
    publish(broker, [later, first[2]])
    scrapes = [
        serves[0].wait_for(lambda m: m.total(READ) >= 8, 120, "the later labels read"),
        serves[1].wait_for(lambda m: calibration(m) == (2, 4), 120, "the later label"),
    ]
    assert cells(scrapes[0]) + cells(scrapes[1]) == expected + Counter({("no", "no"): 1})
    assert scrapes[0].value(READ, outcome="duplicate") == 1
    assert scrapes[0].value(READ, outcome="counted") == 6
    assert calibration(scrapes[0]) == (2, 4)
    assert dead_letters_of(broker.bootstrap, "never-queued") == 1
    for s in serves:
        assert s.terminate() == 0
