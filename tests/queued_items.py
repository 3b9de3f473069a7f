"""Review items as a review queue publishes them, for tests that label events: serve and stream
count a label only when an item with its event id and judge was queued (docs/review.md)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from ragpulse.pipeline.formats.review import JudgeView, ReviewItem, encode_item


def queued_item(event_id: str, judge: str = "groundedness", version: str = "local",
                rating: str = "yes") -> bytes:
    """The review-topic value of an item of `event_id` with one verdict of `judge`."""
    at = datetime.now(UTC)
    return encode_item(ReviewItem(
        event_id=event_id, app="help-bot", model="m1", event_time=at, window_start=at,
        window_end=at + timedelta(seconds=10), reason="random", request="q?", response="a.",
        verdicts=(JudgeView(judge=judge, rating=rating, prompt_version=version),),
        redacted=True, queued_at=at,
    ))[1]


def queued_items(event_ids: Iterable[str], judge: str = "groundedness",
                 version: str = "local") -> list[bytes]:
    """An item of each of `event_ids` (in order, once each)."""
    return [queued_item(e, judge, version) for e in dict.fromkeys(event_ids)]
