"""Labelled items: what a judge said of a reviewed answer and what the reviewers say is true.

For `ragpulse align` (and its tests and benchmark). A label (pipeline/formats/review.py) says
whether one judge's rating of one review item was right; the item holds the request, response
and chunks. `gather` joins the two into one `LabelledItem` per reviewed event: the text, the
human rating (`truth_of`: the judge's rating when it was right, the other one when wrong), and
the reviewers' notes. What cannot be used is counted with its reason in `Gathered`, never
dropped silently: a label without its item, reviewers who disagree on the event, a label of a
verdict the judge could not grade, a graded-scale label (`align` aligns yes/no judges).

Labels and items come from the labels and review topics (`read_topic`, every partition from
its start to its end when called) or from JSON Lines files in the same format (`read_jsonl`,
a malformed line is an error naming file and line).
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Literal, TypeVar

from ragpulse.judges.base import Chunk, JudgeInput
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.formats.review import (
    InvalidReviewRecord,
    LabelRecord,
    ReviewItem,
    decode_item,
    decode_label,
)
from ragpulse.pipeline.kafka_security import KafkaSecurity, connect

BinaryRating = Literal["yes", "no"]
_Record = TypeVar("_Record")


@dataclasses.dataclass(frozen=True, slots=True)
class LabelledItem:
    """One reviewed event of one judge: its text as the judge read it and the human rating."""

    event_id: str
    judge_input: JudgeInput
    truth: BinaryRating
    notes: tuple[str, ...]  # the reviewers' notes: guideline candidates


@dataclasses.dataclass(frozen=True, slots=True)
class Gathered:
    """The labelled items of one judge, and what was left out, by reason (label counts)."""

    items: tuple[LabelledItem, ...]
    left_out: dict[str, int]


def truth_of(label: LabelRecord) -> BinaryRating | None:
    """The rating the reviewer says is right; None for a label that says none (a graded
    scale's score, or a verdict the judge could not grade)."""
    if label.verdict == "score" or label.judge_rating == "error":
        return None
    if label.verdict == "right":
        return label.judge_rating
    return "no" if label.judge_rating == "yes" else "yes"


def judge_input_of(item: ReviewItem) -> JudgeInput:
    """What a judge reads of a review item (the text as queued: redacted when it was)."""
    return JudgeInput(
        question=item.request,
        answer=item.response,
        chunks=tuple(Chunk(c.content, c.doc_uri) for c in item.chunks),
    )


def gather(
    judge: str, labels: Iterable[LabelRecord], items: Iterable[ReviewItem]
) -> Gathered:
    """One LabelledItem per event the reviewers agree on, in the order of the events' first
    label; a label sent twice (the same `label_id`) counts once."""
    by_event = {item.event_id: item for item in items}
    left_out: Counter[str] = Counter()
    seen: set[str] = set()
    truths: dict[str, list[BinaryRating]] = {}
    notes: dict[str, list[str]] = {}
    for label in labels:
        if label.judge != judge or label.label_id in seen:
            continue
        seen.add(label.label_id)
        truth = truth_of(label)
        if truth is None:
            left_out["graded scale" if label.verdict == "score" else "judge error"] += 1
            continue
        if label.event_id not in by_event:
            left_out["no review item"] += 1
            continue
        truths.setdefault(label.event_id, []).append(truth)
        if label.note:
            notes.setdefault(label.event_id, []).append(label.note)
    chosen: list[LabelledItem] = []
    for event_id, said in truths.items():
        if len(set(said)) > 1:
            left_out["reviewers disagree"] += len(said)
            continue
        chosen.append(LabelledItem(
            event_id, judge_input_of(by_event[event_id]), said[0],
            tuple(notes.get(event_id, ())),
        ))
    return Gathered(tuple(chosen), dict(sorted(left_out.items())))


# -- reading labels and items ------------------------------------------------------------------


def read_jsonl(path: Path, decode: Callable[[bytes], _Record], what: str) -> list[_Record]:
    """Every record of a JSON Lines file; SettingsError names the file and the first bad line."""
    records: list[_Record] = []
    try:
        with path.open("rb") as lines:
            for number, raw in enumerate(lines, start=1):
                if not raw.strip():
                    continue
                try:
                    records.append(decode(raw))
                except InvalidReviewRecord as exc:
                    raise SettingsError(f"{what} file {path}, line {number}: {exc}") from None
    except OSError as exc:
        raise SettingsError(f"{what} file {path}: cannot read it ({exc.strerror})") from None
    return records


def read_labels_file(path: Path) -> list[LabelRecord]:
    return read_jsonl(path, decode_label, "labels")


def read_items_file(path: Path) -> list[ReviewItem]:
    return read_jsonl(path, decode_item, "review items")


def read_topic(
    bootstrap: str,
    security: KafkaSecurity,
    topic: str,
    timeout_s: float,
    decode: Callable[[bytes], _Record],
    missing_ok: bool = False,
) -> tuple[list[_Record], int]:
    """Every record of `topic` from its start to the end it had when called, decoded, and how
    many were refused (not a record of the kind: left out, counted). SettingsError when the
    broker does not answer within `timeout_s`, or the topic does not exist (none read, with
    `missing_ok`)."""
    from kafka import KafkaConsumer, TopicPartition

    try:
        consumer = connect(
            KafkaConsumer, bootstrap, security, enable_auto_commit=False, group_id=None,
            request_timeout_ms=int(timeout_s * 1000) + 5000,
        )
    except Exception as exc:
        raise SettingsError(f"cannot reach Kafka at {bootstrap}: {exc}") from None
    try:
        partitions = consumer.partitions_for_topic(topic)
        if not partitions:
            if missing_ok:
                return [], 0
            raise SettingsError(f"topic {topic} does not exist on {bootstrap}")
        tps = [TopicPartition(topic, p) for p in sorted(partitions)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        ends = consumer.end_offsets(tps)
        records: list[_Record] = []
        refused = 0
        for value in _values_to(consumer, ends, timeout_s, topic):
            try:
                records.append(decode(value))
            except InvalidReviewRecord:
                refused += 1
        return records, refused
    finally:
        consumer.close()


def _values_to(consumer: object, ends: dict[object, int], timeout_s: float,
               topic: str) -> Iterator[bytes]:
    """The values up to `ends`; SettingsError after `timeout_s` without a record."""
    deadline = time.monotonic() + timeout_s
    while any(consumer.position(tp) < end for tp, end in ends.items()):  # type: ignore[attr-defined]
        if time.monotonic() > deadline:
            raise SettingsError(f"reading {topic}: the broker stopped answering")
        batches = consumer.poll(timeout_ms=500)  # type: ignore[attr-defined]
        for tp, records in batches.items():
            for record in records:
                if record.offset < ends[tp]:
                    yield record.value or b""
            if records:
                deadline = time.monotonic() + timeout_s


def rating_counts(items: Sequence[LabelledItem]) -> dict[str, int]:
    """How many labelled items of each human rating."""
    return dict(sorted(Counter(i.truth for i in items).items()))
