"""The review page's application in process (Flask's test client): what it answers to a stale
item, a form without marks, a bad score, a note too long, and a broker it cannot reach. The
browser tests (tests/test_review_page.py) run the same application in the real command."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from typing import Any

import bcrypt
import pytest

from ragpulse.pipeline.formats.review import MAX_NOTE_CHARS, JudgeView, ReviewItem
from ragpulse.pipeline.kafka_security import PLAINTEXT
from ragpulse.pipeline.metrics.http import BasicAuth
from ragpulse.pipeline.review.app import csrf_token, review_app
from ragpulse.pipeline.review.queue import LabelPublisher, ReviewQueue
from ragpulse.pipeline.sinks.kafka import KafkaTopic

KEY = b"k" * 32
T0 = datetime(2025, 11, 20, 10, 0, 42, tzinfo=UTC)
AUTH = {"Authorization": "Basic " + base64.b64encode(b"ana:pw").decode()}


def item(event_id: str = "evt-1") -> ReviewItem:
    return ReviewItem(
        event_id=event_id, app="a", model="m", event_time=T0,
        window_start=T0.replace(second=0), window_end=T0.replace(minute=5, second=0),
        reason="random", request="q", response="<script>alert(1)</script>",
        verdicts=(
            JudgeView(judge="groundedness", rating="no", prompt_version="v1"),
            JudgeView(judge="readability", rating="yes", prompt_version="v1", score=4.0,
                      scale=(1, 2, 3, 4, 5)),
            JudgeView(judge="safety", rating="error", prompt_version="v1",
                      error_message="timeout"),
        ),
        redacted=False, queued_at=T0,
    )


@pytest.fixture
def client() -> Any:
    # No broker listens on port 1: every publish fails, as in an outage.
    queue = ReviewQueue("127.0.0.1:1", PLAINTEXT, "chat.review", "chat.labels", 1.0)
    queue.add_item(item())
    publisher = LabelPublisher(KafkaTopic("127.0.0.1:1", PLAINTEXT, "chat.labels", 1.0))
    users = {"ana": bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4))}
    app = review_app(queue, publisher, BasicAuth(users), csrf_key=KEY)
    yield app.test_client()
    publisher.close()


def form(event_id: str = "evt-1", **fields: str) -> dict[str, str]:
    return {"csrf": csrf_token(KEY, "ana", event_id), **fields}


def test_the_page_shows_the_next_item_escaped_with_security_headers(client: Any) -> None:
    first = client.get("/", headers=AUTH)
    assert first.status_code == 302 and first.headers["Location"].endswith("/item/evt-1")
    page = client.get("/item/evt-1", headers=AUTH)
    text = page.get_data(as_text=True)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "<script>alert(1)" not in text
    assert "could not grade: timeout" in text
    assert 'name="verdict-safety"' not in text  # an error is not labelled
    assert "of 1/2/3/4/5" in text  # the graded judge offers its scale
    assert page.headers["X-Frame-Options"] == "DENY"
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    assert page.headers["Cache-Control"] == "no-store"


def test_a_stale_item_gets_a_clear_page_and_nothing_is_saved(client: Any) -> None:
    gone = client.post("/item/evt-404", headers=AUTH,
                       data=form("evt-404", **{"verdict-groundedness": "wrong"}))
    assert gone.status_code == 409
    assert "not in the review queue any more" in gone.get_data(as_text=True)
    assert client.get("/item/evt-404", headers=AUTH).status_code == 409


def test_forms_that_cannot_be_used_are_shown_again_with_what_to_fix(client: Any) -> None:
    empty = client.post("/item/evt-1", headers=AUTH, data=form())
    assert empty.status_code == 400
    assert "Mark at least one judge" in empty.get_data(as_text=True)
    bad = client.post("/item/evt-1", headers=AUTH,
                      data=form(**{"verdict-readability": "score", "score-readability": "7"}))
    assert bad.status_code == 400
    assert "must be one of 1, 2, 3, 4, 5" in bad.get_data(as_text=True)
    long = client.post("/item/evt-1", headers=AUTH, data=form(
        **{"verdict-groundedness": "wrong", "note": "n" * (MAX_NOTE_CHARS + 1)}))
    assert long.status_code == 400 and "longer than" in long.get_data(as_text=True)
    other = client.post("/item/evt-1", headers=AUTH,
                        data={"csrf": csrf_token(KEY, "bo", "evt-1"),
                              "verdict-groundedness": "wrong"})
    assert other.status_code == 403  # a token issued to another reviewer


def test_an_unreachable_broker_says_not_saved_and_keeps_the_marks(client: Any) -> None:
    answer = client.post("/item/evt-1", headers=AUTH, data=form(**{
        "verdict-groundedness": "wrong", "verdict-readability": "score",
        "score-readability": "2", "note": "keep me",
    }))
    text = answer.get_data(as_text=True)
    assert answer.status_code == 503
    assert "Not saved" in text and "press Save again" in text
    assert 'value="wrong" checked' in text and 'value="score" checked' in text
    assert 'value="2"' in text and "keep me" in text
    # Nothing was taken as saved: the item is still this reviewer's next one.
    assert client.get("/", headers=AUTH).headers["Location"].endswith("/item/evt-1")
