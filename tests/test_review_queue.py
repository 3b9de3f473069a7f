"""The review queue's formats and its selection, as pure functions: what an item and a label
are, which judged events are queued and why, the hourly bound, and redaction."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from apache_beam.pvalue import TaggedOutput

from ragpulse.judges import TextPolicy
from ragpulse.judges.base import Chunk, JudgeInput, Verdict
from ragpulse.judges.sessions import Session
from ragpulse.pipeline.costs.sampling import is_sampled
from ragpulse.pipeline.formats.review import (
    MAX_REVIEW_ITEM_BYTES,
    InvalidReviewRecord,
    LabelRecord,
    ReviewItem,
    decode_item,
    decode_label,
    encode_item,
    encode_label,
    label_id,
    label_key,
)
from ragpulse.pipeline.kafka_security import PLAINTEXT
from ragpulse.pipeline.records import InferenceRecord, JudgedEvent
from ragpulse.pipeline.sinks.kafka import KafkaTopic
from ragpulse.pipeline.stages.review import (
    QUEUED_VERDICTS,
    REFUSED_ITEMS,
    HourlyBound,
    ReviewQueueConfig,
    _SelectForReview,
    in_random_slice,
    queue_reason,
    review_item,
)

T0 = 1_763_632_800.0
NOW = datetime.fromtimestamp(T0, UTC)


def config(**changes: Any) -> ReviewQueueConfig:
    base = ReviewQueueConfig(
        target=KafkaTopic("127.0.0.1:9", PLAINTEXT, "chat.review", 5.0),
        rate=0.0,
        targets=("disagreement", "unsure", "failing"),
        unsure_band=0.1,
        max_per_hour=100,
        window_seconds=300.0,
        policy=TextPolicy(redact_pii="off"),
        p_yes_judges=frozenset({"groundedness"}),
    )
    return dataclasses.replace(base, **changes)


def judged(*verdicts: Verdict, request_id: str = "req-1", question: str = "What is the plan?",
           session: Session | None = None) -> JudgedEvent:
    record = InferenceRecord(
        request_id=request_id, event_time=T0 + 42, app="support-bot", model="m",
        judge_input=JudgeInput(
            question, "The plan is Pro.", (Chunk("Pro plan: 10 seats", "kb/1"),)
        ),
        session=session,
    )
    return JudgedEvent(record, verdicts, tuple("v1f2" for _ in verdicts))


def yes(judge: str = "groundedness", **kw: Any) -> Verdict:
    return Verdict(judge, "yes", "supported", **kw)


def no(judge: str = "groundedness", **kw: Any) -> Verdict:
    return Verdict(judge, "no", "not supported", **kw)


def item(**changes: Any) -> ReviewItem:
    event = judged(no(), yes("safety"))
    made = review_item(event, "failing", ("groundedness",), config(), T0 + 60)
    return made.model_copy(update=changes) if changes else made


# --- formats --------------------------------------------------------------------------------


def test_a_review_item_round_trips_through_its_kafka_record_keyed_by_event_id() -> None:
    made = item()
    key, value = encode_item(made)
    assert key == b"req-1"
    back = decode_item(value)
    assert back == made
    assert back.window_start == datetime.fromtimestamp(T0, UTC)
    assert [v.judge for v in back.verdicts] == ["groundedness", "safety"]
    assert back.verdicts[0].rationale == "not supported"
    assert back.verdicts[0].prompt_version == "v1f2"


def test_a_random_item_names_no_judges_and_a_targeted_one_names_some() -> None:
    data = item().model_dump(mode="json")
    with pytest.raises(ValueError, match="targeted item names the judges"):
        ReviewItem.model_validate({**data, "reason": "random"})
    with pytest.raises(ValueError, match="targeted item names the judges"):
        ReviewItem.model_validate({**data, "reason_judges": []})
    with pytest.raises(ValueError, match="each judge's verdict appears once"):
        ReviewItem.model_validate({**data, "verdicts": [data["verdicts"][0]] * 2})


def test_malformed_review_records_are_refused_with_the_field_at_fault() -> None:
    with pytest.raises(InvalidReviewRecord, match="event_id"):
        decode_item(b'{"app": "a"}')
    with pytest.raises(InvalidReviewRecord, match=r"Invalid JSON|json"):
        decode_item(b"not json")
    data = item().model_dump(mode="json")
    data["event_time"] = "2025-11-20T10:00:00"  # no time zone
    with pytest.raises(InvalidReviewRecord, match="time zone"):
        decode_item(ReviewItem.__pydantic_serializer__.to_json(data))


def test_an_item_larger_than_the_page_allows_is_refused_not_cut() -> None:
    big = item(response="x" * MAX_REVIEW_ITEM_BYTES)
    with pytest.raises(ValueError, match="over the page's limit"):
        encode_item(big)
    with pytest.raises(InvalidReviewRecord, match="over the review item limit"):
        decode_item(b" " * (MAX_REVIEW_ITEM_BYTES + 1))


def label(**changes: Any) -> LabelRecord:
    fields: dict[str, Any] = {
        "event_id": "req-1", "judge": "groundedness", "prompt_version": "v1f2",
        "judge_rating": "no", "verdict": "wrong", "reviewer": "ana", "labelled_at": NOW,
        "reason": "random",
    }
    fields.update(changes)
    fields.setdefault("label_id", label_id(fields["event_id"], fields["judge"],
                                           fields["prompt_version"], fields["reviewer"]))
    return LabelRecord(**fields)


def test_a_label_is_keyed_by_event_and_judge_and_round_trips() -> None:
    made = label(note="the chunk says 10 seats")
    key, value = encode_label(made)
    assert key == label_key("req-1", "groundedness") == b'["req-1","groundedness"]'
    assert decode_label(value) == made
    assert made.random


def test_the_label_id_is_one_per_event_judge_version_and_reviewer() -> None:
    first = label_id("req-1", "groundedness", "v1f2", "ana")
    assert first == label_id("req-1", "groundedness", "v1f2", "ana")  # the same click again
    others = {
        label_id("req-1", "groundedness", "v1f2", "bo"),  # a second reviewer: a second label
        label_id("req-1", "groundedness", "v1f3", "ana"),  # another prompt version
        label_id("req-1", "safety", "v1f2", "ana"),
        label_id("req-2", "groundedness", "v1f2", "ana"),
    }
    assert first not in others and len(others) == 4


def test_labels_that_do_not_add_up_are_refused() -> None:
    with pytest.raises(ValueError, match="label_id is not the digest"):
        label(label_id="0" * 32)
    with pytest.raises(ValueError, match="correct_score is given exactly"):
        label(verdict="score")
    with pytest.raises(ValueError, match="correct_score is given exactly"):
        label(correct_score=3.0)
    with pytest.raises(ValueError, match="finite"):
        label(verdict="score", correct_score=float("nan"))
    with pytest.raises(ValueError, match="time zone"):
        label(labelled_at=datetime(2025, 11, 20, 10))
    with pytest.raises(InvalidReviewRecord, match="reviewer"):
        decode_label(label().model_dump_json().replace('"ana"', '""').encode())
    assert label(verdict="score", correct_score=4.0).correct_score == 4.0


# --- selection ------------------------------------------------------------------------------


def test_an_event_in_the_random_slice_is_random_whatever_else_it_is() -> None:
    event = judged(no(other_tier_rating="yes"))
    assert queue_reason(event, config(rate=1.0)) == ("random", ())


def test_targeted_reasons_come_in_order_and_name_their_judges() -> None:
    c = config()
    assert queue_reason(judged(yes(), yes("safety")), c) is None
    assert queue_reason(judged(no(), yes("safety")), c) == ("failing", ("groundedness",))
    disagreeing = judged(no(), yes("safety", other_tier_rating="no"))
    assert queue_reason(disagreeing, c) == ("disagreement", ("safety",))
    unsure = judged(yes(score=0.55), no("safety"))
    assert queue_reason(unsure, c) == ("unsure", ("groundedness",))
    assert queue_reason(unsure, config(targets=("failing",))) == ("failing", ("safety",))
    assert queue_reason(unsure, config(targets=())) is None


def test_unsure_needs_a_judge_whose_score_is_p_yes_and_a_p_yes_near_one_half() -> None:
    c = config(unsure_band=0.1)
    assert queue_reason(judged(yes(score=0.65)), c) is None  # outside the band
    assert queue_reason(judged(yes(score=0.41)), c) == ("unsure", ("groundedness",))
    # A graded judge's score is not P(yes), however close to 0.5.
    assert queue_reason(judged(yes("comprehensiveness", score=0.5)), c) is None


def test_conversations_errors_only_and_skipped_judges_are_not_queued() -> None:
    session = Session("s1", "support-bot", "m", ())
    assert queue_reason(judged(no(), session=session), config(rate=1.0)) is None
    skipped = Verdict("correctness", "skipped", missing=("expected",))
    assert queue_reason(judged(skipped), config(rate=1.0)) is None
    errored = Verdict("groundedness", "error", error_message="timeout", error_cause="timeout")
    assert queue_reason(judged(errored), config()) is None  # an error is not a failing grade
    assert queue_reason(judged(errored, skipped), config(rate=1.0)) == ("random", ())


def test_the_random_slice_is_uniform_and_independent_of_the_sampler() -> None:
    ids = [f"req-{i}" for i in range(40_000)]
    in_slice = [i for i in ids if in_random_slice(i, 0.1)]
    assert 0.1 * 40_000 - 3 * 60 < len(in_slice) < 0.1 * 40_000 + 3 * 60  # sd = 60
    sampled = [i for i in ids if is_sampled(i, 0.5)]
    share = sum(in_random_slice(i, 0.1) for i in sampled) / len(sampled)
    # Salted apart: among the events the sampler kept, the slice is still 10 %, where an
    # unsalted hash would put every event of the slice among them (20 %).
    assert 0.09 < share < 0.11
    assert not any(in_random_slice(i, 0.0) for i in ids[:1000])
    assert all(in_random_slice(i, 1.0) for i in ids[:1000])


def test_review_items_are_redacted_as_judge_prompts_are() -> None:
    event = judged(no(), question="Mail me at ana.silva@example.com please")
    on = review_item(event, "failing", ("groundedness",), config(policy=TextPolicy("on")), T0)
    assert "ana.silva@example.com" not in on.request and on.redacted
    off = review_item(event, "failing", ("groundedness",), config(policy=TextPolicy("off")), T0)
    assert "ana.silva@example.com" in off.request and not off.redacted
    # Rationales follow --store-text, as verdict rows do.
    quiet = review_item(event, "failing", ("groundedness",),
                        config(policy=TextPolicy("off", store_text="none")), T0)
    assert quiet.verdicts[0].rationale is None


def test_p_yes_and_graded_scores_are_told_apart() -> None:
    event = judged(yes(score=0.52), yes("comprehensiveness", score=4.0))
    made = review_item(event, "unsure", ("groundedness",),
                       config(scales={"comprehensiveness": (1, 2, 3, 4, 5)}), T0)
    grounded, graded = made.verdicts
    assert (grounded.p_yes, grounded.score, grounded.scale) == (0.52, None, None)
    assert (graded.p_yes, graded.score, graded.scale) == (None, 4.0, (1, 2, 3, 4, 5))


def test_the_hourly_bound_keeps_half_for_the_random_slice_and_counts_by_event_hour() -> None:
    HourlyBound.reset()
    hour = 3600 * 500_000.0
    taken = [HourlyBound.take("t", False, 5, hour + i) for i in range(4)]
    assert taken == [True, True, False, False]  # targeted: at most half of 5
    assert [HourlyBound.take("t", True, 5, hour + 10 + i) for i in range(4)] == [
        True, True, True, False
    ]
    assert HourlyBound.take("other", True, 5, hour)  # each topic its own bound
    assert HourlyBound.take("t", False, 5, hour + 3600)  # the next hour has its own
    assert not HourlyBound.take("t", True, 5, hour + 3599)  # a late event of a full hour
    HourlyBound.reset()


def test_an_event_that_makes_no_valid_item_is_refused_without_failing_the_bundle() -> None:
    HourlyBound.reset()
    select = _SelectForReview(config(rate=1.0), now=T0)
    select.setup()
    (invalid,) = select.process(judged(no(), request_id="r" * 5000))
    (too_large,) = select.process(judged(no(), question="q" * MAX_REVIEW_ITEM_BYTES))
    # Each a dead letter of the review topic's dead-letter topic, with its reason.
    assert isinstance(invalid, TaggedOutput) and invalid.tag == REFUSED_ITEMS
    assert dict(invalid.value.headers)["reason"].startswith(b"invalid: event_id")
    assert isinstance(too_large, TaggedOutput) and too_large.tag == REFUSED_ITEMS
    headers = dict(too_large.value.headers)
    assert headers["reason"].startswith(b"too_large: review item of ")
    assert int(headers["original-size"]) > MAX_REVIEW_ITEM_BYTES
    assert too_large.value.key == b"req-1" and headers["truncated"] == b"false"
    *queued, (key, value) = select.process(judged(no()))
    assert key == b"req-1" and decode_item(value).reason == "random"
    # Each verdict of the item, for the stream's labels to be checked against.
    assert [(q.tag, q.value.event_id, q.value.judge) for q in queued] == [
        (QUEUED_VERDICTS, "req-1", v.judge) for v in decode_item(value).verdicts
    ]
    HourlyBound.reset()
