"""A real `ragpulse serve` on a real Apache Kafka broker reads the reviewers' labels back: each
label counted once per judge, prompt version and slice, the bad ones dead-lettered with their
reason and never in the counts (a label of an event no review item was queued for
among them), the agreement and the corrected pass ratio on /metrics, and a
serve killed (SIGKILL) just after reading labels, or just after saving them, counts each label
exactly once when it starts again."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from cycle_holds import CycleHolds
from kafka_broker import ApacheKafkaBroker, for_module
from queued_items import queued_items
from serve_process import T0, Scrape, TopicFactory, caught_up

from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.formats.review import LabelRecord, encode_label, label_id

pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(300)]

JUDGE = "groundedness"
VERSION = "local"  # the local judges' prompt version
READ = "ragpulse_review_labels_read_total"


@pytest.fixture(scope="module")
def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    yield from for_module(apache_kafka)


def label(
    event: str, judge_rating: str, verdict: str, *, reviewer: str = "ann",
    reason: str = "random", judge: str = JUDGE, version: str = VERSION,
) -> LabelRecord:
    return LabelRecord(
        label_id=label_id(event, judge, version, reviewer), event_id=event, judge=judge,
        prompt_version=version, judge_rating=judge_rating, verdict=verdict,
        reviewer=reviewer, labelled_at=datetime(2026, 11, 28, tzinfo=UTC),
        reason=reason,
    )


def queue(broker: ApacheKafkaBroker, topic: str, labels: list[LabelRecord | bytes]) -> None:
    """Publish to the review topic an item for the event of each of `labels` (as a review
    queue would have before anyone labelled it), its verdict judged by the running version."""
    events = sorted({lab.event_id for lab in labels if isinstance(lab, LabelRecord)} - NEVER)
    broker.produce(topic, queued_items(events, JUDGE, VERSION), partition=0)


def publish(broker: ApacheKafkaBroker, topic: str, labels: list[LabelRecord | bytes]) -> None:
    for item in labels:
        if isinstance(item, bytes):
            broker.produce(topic, [item], partition=0)
        else:
            key, value = encode_label(item)
            # A label's partition follows its key, as the review page's producer places it.
            broker.produce(topic, [value], partition=sum(key) % 2)


# The random slice: 6 passes people agree with, 2 passes they fail (the judge said yes wrongly),
# 3 fails people agree with, 1 fail they pass. Cells: yes_yes 6, no_yes 2, no_no 3, yes_no 1.
RANDOM = (
    [label(f"r{i}", "yes", "right") for i in range(6)]
    + [label(f"w{i}", "yes", "wrong") for i in range(2)]
    + [label(f"f{i}", "no", "right") for i in range(3)]
    + [label("m0", "no", "wrong")]
)
# A second reviewer on one item: kept, a label of its own.
SECOND = [label("r0", "yes", "wrong", reviewer="bob")]
TARGETED = [label(f"t{i}", "no", "wrong", reason="failing") for i in range(3)]
DUPLICATE = [RANDOM[0]]
NOT_BINARY = [label("e0", "error", "wrong")]
NEVER = {"n0"}  # no item of it was ever queued
BAD: list[LabelRecord | bytes] = [
    label("u0", "yes", "right", judge="tone_of_voice"),
    label("n0", "yes", "right"),
    label("v0", "yes", "right", version="0123abcd"),
    b'{"event_id": "x", "judge": "groundedness"}',
    b"not json at all",
]
ALL: list[LabelRecord | bytes] = [*RANDOM, *SECOND, *TARGETED, *DUPLICATE, *NOT_BINARY, *BAD]


def cells(scrape: Scrape, slice_: str) -> dict[tuple[str, str], float]:
    """The non-zero cells of a slice's table (every cell is exported, at 0 until it grows)."""
    found = scrape.select("ragpulse_review_labels_total", judge=JUDGE, slice=slice_)
    assert len(found) == 4
    return {(lab["human"], lab["rating"]): v for lab, v in found if v}


def kappa(yy: int, yn: int, ny: int, nn: int) -> float:
    """Cohen's kappa of a 2x2 table (people's rating first), written out here."""
    n = yy + yn + ny + nn
    observed = (yy + nn) / n
    chance = ((yy + yn) * (yy + ny) + (ny + nn) * (yn + nn)) / (n * n)
    return (observed - chance) / (1 - chance)


def outcomes(scrape: Scrape) -> dict[str, float]:
    return {lab["outcome"]: v for lab, v in scrape.select(READ)}


def expect_counts(scrape: Scrape) -> None:
    # r0 twice (ann, then bob): bob's label is his own, in the same cell as a wrong yes.
    assert cells(scrape, "random") == {
        ("yes", "yes"): 6, ("no", "yes"): 3, ("no", "no"): 3, ("yes", "no"): 1,
    }
    assert cells(scrape, "targeted") == {("yes", "no"): 3}
    assert outcomes(scrape) == {
        "counted": 16, "duplicate": 1, "not_binary": 1, "unknown_judge": 1,
        "unknown_event": 1, "other_version": 1, "malformed": 2,
    }


def test_labels_are_counted_once_by_judge_version_and_slice_and_bad_ones_kept_apart(
    served_topic: TopicFactory, broker: ApacheKafkaBroker,
) -> None:
    events = list(simulate(3, 40, T0, rate=2))
    topic = served_topic("labelled", records=events)
    broker.create_topic("labelled.labels", 2)
    broker.create_topic("labelled.review", 1)
    queue(broker, "labelled.review", ALL)
    publish(broker, "labelled.labels", ALL)
    serve = topic.serve()
    scrape = serve.wait_for(
        lambda m: caught_up(40)(m) and m.total(READ) >= len(ALL), 90, "every label read"
    )
    expect_counts(scrape)
    # The figures of the random slice, and of the targeted items apart.
    key = {"judge": JUDGE, "version": VERSION, "slice": "random"}
    assert scrape.value("ragpulse_judge_human_sensitivity", **key) == pytest.approx(6 / 7)
    assert scrape.value("ragpulse_judge_human_specificity", **key) == pytest.approx(3 / 6)
    assert scrape.value("ragpulse_judge_human_agreement_kappa", **key) == pytest.approx(
        kappa(6, 1, 3, 3)
    )
    assert scrape.value("ragpulse_judge_human_labels", **key, human="yes") == 7
    assert scrape.value("ragpulse_judge_human_labels", **key, human="no") == 6
    targeted = {**key, "slice": "targeted"}
    assert scrape.value("ragpulse_judge_human_sensitivity", **targeted) == 0.0
    assert scrape.value("ragpulse_judge_human_specificity", **targeted) is None
    # The corrected pass ratio rests on the random slice alone (no calibration file here).
    assert scrape.value("ragpulse_judge_calibration_labelled", judge=JUDGE, label="yes") == 7
    assert scrape.value("ragpulse_judge_calibration_labelled", judge=JUDGE, label="no") == 6
    assert scrape.select("ragpulse_judge_in_progress_pass_ratio_corrected", judge=JUDGE) or \
        scrape.select("ragpulse_judge_pass_ratio_corrected", judge=JUDGE)
    # Judges without labels get no figure.
    assert not scrape.select("ragpulse_judge_human_agreement_kappa", judge="answer_relevance")

    letters = topic.read("dlq", 5)
    reasons = sorted(dict(r.headers)["reason"].decode() for r in letters)
    assert len(reasons) == 5
    assert any("judge 'tone_of_voice', which this job does not run" in r for r in reasons)
    assert any("prompt version '0123abcd'" in r and "never enter its counts" in r
               for r in reasons)
    assert any("event 'n0'" in r and "no review item" in r for r in reasons)
    assert sum(r.startswith("not a label record") for r in reasons) == 2
    assert serve.terminate() == 0

    # Read again by a new serve on the same state: nothing more is counted.
    publish(broker, "labelled.labels", [RANDOM[1]])
    again = topic.serve()
    scrape = again.wait_for(lambda m: m.total(READ) >= len(ALL) + 1, 90, "the copy read")
    assert outcomes(scrape)["duplicate"] == 2
    assert cells(scrape, "random")[("yes", "yes")] == 6
    assert again.terminate() == 0


@pytest.mark.parametrize("phase", ["labels", "labels_saved"])
def test_a_serve_killed_after_reading_labels_counts_each_exactly_once_after_restart(
    served_topic: TopicFactory, broker: ApacheKafkaBroker, serve_processes: Any,
    tmp_path: Path, phase: str,
) -> None:
    name = f"crash-{phase.replace('_', '-')}"
    topic = served_topic(name, records=list(simulate(4, 20, T0, rate=2)))
    broker.create_topic(f"{name}.labels", 2)
    broker.create_topic(f"{name}.review", 1)
    more = [label(f"late{i}", "no", "right") for i in range(2)]
    queue(broker, f"{name}.review", [*ALL, *more])
    holds = CycleHolds(tmp_path / "hooks")
    holds.hold(phase)
    serve = serve_processes(
        broker.bootstrap, name, topic.state, ["--window", "10s"], env=holds.env
    ).start()
    publish(broker, f"{name}.labels", ALL)
    holds.wait_at(phase, serve)
    # SIGKILL with the labels read and, at `labels`, nothing saved; at `labels_saved`, saved.
    assert serve.kill() != 0
    holds.release(phase)
    again = topic.serve()
    scrape = again.wait_for(lambda m: m.total(READ) >= len(ALL), 90, "every label read")
    expect_counts(scrape)
    publish(broker, f"{name}.labels", list(more))
    scrape = again.wait_for(lambda m: m.total(READ) >= len(ALL) + 2, 90, "the later labels")
    assert cells(scrape, "random")[("no", "no")] == 5
    assert outcomes(scrape)["counted"] == 18
    assert again.terminate() == 0

