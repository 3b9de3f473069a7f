"""The review item and the label record: what `serve` and `stream` queue for a person to check,
and what that person says back (docs/review.md).

A **review item** is one judged event as a reviewer needs it: the request, the response and the
retrieved chunks (redacted as judge prompts are, `--redact-pii`), each judge's rating with its
rationale (as verdict rows keep it, `--store-text`), its prompt version, P(yes) when the judge
reports it (`--judge-logprobs` on a binary scale) and its score on a graded scale; the event's
id, app, model, event time and window; and **why it was queued**: `random` (the uniform slice
of `--review-rate`, the only items from which a judge's error rates are estimated) or a
targeted reason (`disagreement`: the cascade's two tiers disagreed; `unsure`: P(yes) near 0.5;
`failing`: some judge said `no` or `error`), which are kept apart from that estimate.

A **label record** is one reviewer's verdict on one judge's rating of one item: the judge was
right, wrong, or (on a graded scale) the correct score; an optional note; the reviewer's name
(from the login), the time, the prompt version judged and whether the item came from the random
slice. Its `label_id` is a digest of (event, judge, prompt version, reviewer): the same click
sent twice is the same label, so a consumer keeps it once; two reviewers give two labels.

Kafka keys: a review item by its event id, a label by event id and judge (`label_key`), so one
item's labels share a partition, in order. Both are validated here, at the boundary: a record
that is not one is refused with the reason (`InvalidReviewRecord`).
"""

from __future__ import annotations

import hashlib
import math
from datetime import UTC, datetime
from typing import Annotated, Literal, get_args

import orjson
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

QueueReason = Literal["random", "disagreement", "unsure", "failing"]
QUEUE_REASONS: tuple[QueueReason, ...] = get_args(QueueReason)
# The reasons chosen on purpose: their items are labelled like the others but never enter the
# estimate of a judge's error rates (they are not a uniform sample of its verdicts).
TargetedReason = Literal["disagreement", "unsure", "failing"]
TARGETED_REASONS: tuple[TargetedReason, ...] = get_args(TargetedReason)
# A label's reason: its item's, or `imported` (`ragpulse import-labels`: a team's own labels,
# chosen by the team, so, like targeted ones, kept apart from the error-rate estimate).
LabelReason = Literal["random", "disagreement", "unsure", "failing", "imported"]

# A review item the page shows whole: a larger one is kept apart (dead-letter topic) with this
# reason, never cut (a cut answer or chunk would be reviewed as if it were the whole).
MAX_REVIEW_ITEM_BYTES = 512 * 1024
MAX_NOTE_CHARS = 2000
MAX_NAME_CHARS = 200
Verdict = Literal["right", "wrong", "score"]


class InvalidReviewRecord(ValueError):
    """A review-topic or labels-topic record that is not one; the message says what is wrong."""


def _aware(value: datetime) -> datetime:
    if value.tzinfo is None:
        raise ValueError("must carry a time zone (UTC)")
    return value.astimezone(UTC)


AwareTime = Annotated[datetime, AfterValidator(_aware)]
Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
# An event id is the chatbot's request id, whose length events do not bound: a generous bound.
EventId = Annotated[str, Field(min_length=1, max_length=4096)]


def _finite(value: float | None) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError("must be a finite number")
    return value


Finite = Annotated[float | None, AfterValidator(_finite)]


class ReviewChunk(BaseModel):
    """One retrieved passage as the reviewer sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    content: str
    doc_uri: str | None = None


class JudgeView(BaseModel):
    """One judge's verdict on the item, as the reviewer sees it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    judge: Name
    rating: Literal["yes", "no", "error"]
    rationale: str | None = None
    error_message: str | None = None
    prompt_version: str
    # P(yes) of a binary verdict (--judge-logprobs); None when the judge did not report it.
    p_yes: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # The score on a graded scale, and the scale's scores when known (None: binary).
    score: Finite = None
    scale: tuple[int, ...] | None = None
    # The judge cascade's other tier's rating, when the two disagreed (costs/cascade.py).
    other_tier_rating: Literal["yes", "no"] | None = None


class ReviewItem(BaseModel):
    """One judged event queued for review, and why (see the module's docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event_id: EventId
    app: str
    model: str
    event_time: AwareTime
    window_start: AwareTime
    window_end: AwareTime
    reason: QueueReason
    # The judges whose verdicts made a targeted item (empty for `random`).
    reason_judges: tuple[str, ...] = ()
    request: str
    response: str
    chunks: tuple[ReviewChunk, ...] = ()
    verdicts: tuple[JudgeView, ...] = Field(min_length=1)
    # Whether request, response and chunks were redacted (--redact-pii) before queuing.
    redacted: bool
    queued_at: AwareTime

    @model_validator(mode="after")
    def _consistent(self) -> ReviewItem:
        if self.window_end <= self.window_start:
            raise ValueError("window_end must be after window_start")
        if (self.reason == "random") != (not self.reason_judges):
            raise ValueError("a targeted item names the judges that made it; a random one none")
        judges = [v.judge for v in self.verdicts]
        if len(set(judges)) != len(judges):
            raise ValueError("each judge's verdict appears once")
        return self

    @property
    def random(self) -> bool:
        """Whether this item is from the uniform random slice (the error-rate estimate's)."""
        return self.reason == "random"

    def verdict_of(self, judge: str) -> JudgeView | None:
        return next((v for v in self.verdicts if v.judge == judge), None)


class LabelRecord(BaseModel):
    """One reviewer's label of one judge's verdict on one review item."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    event_id: EventId
    judge: Name
    prompt_version: str
    judge_rating: Literal["yes", "no", "error"]
    # right / wrong: the judge's rating is (not) what the reviewer would give; score: on a graded
    # scale, the score the reviewer would give (`correct_score`).
    verdict: Verdict
    correct_score: Finite = None
    note: str | None = Field(None, max_length=MAX_NOTE_CHARS)
    reviewer: Name
    labelled_at: AwareTime
    # The item's queue reason (or `imported`): only `random` labels estimate error rates.
    reason: LabelReason

    @model_validator(mode="after")
    def _consistent(self) -> LabelRecord:
        if (self.verdict == "score") != (self.correct_score is not None):
            raise ValueError("a correct_score is given exactly when the verdict is 'score'")
        if self.label_id != label_id(self.event_id, self.judge, self.prompt_version, self.reviewer):
            raise ValueError("label_id is not the digest of event, judge, version and reviewer")
        return self

    @property
    def random(self) -> bool:
        return self.reason == "random"


def human_rating(
    label: LabelRecord, pass_score: float | None = None
) -> Literal["yes", "no"] | None:
    """The rating the reviewer would give, when the label says it on the judge's yes/no: the
    judge's own when `right`, the other one when `wrong`; on a graded scale (`score`), `yes`
    when the correct score is at or above the judge's own `pass_score` (what its verdicts
    count as a pass). None for a judge that could not grade (`error`), or a correct score
    whose judge's pass score is not known here."""
    if label.judge_rating == "error":
        return None
    if label.verdict == "score":
        if pass_score is None or label.correct_score is None:
            return None
        return "yes" if label.correct_score >= pass_score else "no"
    if label.verdict == "right":
        return label.judge_rating
    return "no" if label.judge_rating == "yes" else "yes"


def label_id(event_id: str, judge: str, prompt_version: str, reviewer: str) -> str:
    """The idempotency id of a label: one per (event, judge, prompt version, reviewer), so a
    label sent again (a retried click, a retried publish) is recognised as the same one."""
    text = "\0".join((event_id, judge, prompt_version, reviewer))
    return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def label_key(event_id: str, judge: str) -> bytes:
    """The Kafka key of a label: its event id and judge."""
    return orjson.dumps([event_id, judge])


def encode_item(item: ReviewItem) -> tuple[bytes, bytes]:
    """(Kafka key, value) of a review item; ValueError when it is over MAX_REVIEW_ITEM_BYTES."""
    value = item.model_dump_json().encode()
    if len(value) > MAX_REVIEW_ITEM_BYTES:
        raise ValueError(
            f"review item of {len(value)} bytes is over the page's limit of "
            f"{MAX_REVIEW_ITEM_BYTES} bytes"
        )
    return item.event_id.encode("utf-8"), value


def decode_item(value: bytes) -> ReviewItem:
    """The review item a review-topic value holds; InvalidReviewRecord says what is wrong."""
    if len(value) > MAX_REVIEW_ITEM_BYTES:
        raise InvalidReviewRecord(
            f"{len(value)} bytes is over the review item limit of {MAX_REVIEW_ITEM_BYTES}"
        )
    try:
        return ReviewItem.model_validate_json(value)
    except ValidationError as exc:
        raise InvalidReviewRecord(_first_error(exc)) from None


def encode_label(label: LabelRecord) -> tuple[bytes, bytes]:
    """(Kafka key, value) of a label."""
    return label_key(label.event_id, label.judge), label.model_dump_json().encode()


def decode_label(value: bytes) -> LabelRecord:
    """The label a labels-topic value holds; InvalidReviewRecord says what is wrong."""
    try:
        return LabelRecord.model_validate_json(value)
    except ValidationError as exc:
        raise InvalidReviewRecord(_first_error(exc)) from None


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"]) or "record"
    return f"{where}: {error['msg']}"
