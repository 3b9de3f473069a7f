"""`ragpulse review` in a real browser: Debian's chromium, driven by Playwright, against the real
command on a real Apache Kafka broker.

A reviewer logs in, labels items with the keyboard and with the mouse, and the labels are on the
labels topic with the login's name; a second reviewer's labels of the same item are kept too.
Refused access, a forged form (CSRF) and a broker outage each give a clear page, and no label is
lost or doubled. The first test also takes docs/review-page.png's screenshot (into tmp_path;
`RAGPULSE_SCREENSHOT=PATH` writes it there instead, which is how the docs' copy was made).
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import yaml
from cli import ragpulse_command
from kafka_broker import ApacheKafkaBroker
from processes import free_port, stop_process
from serve_process import read_topic

from ragpulse.pipeline.formats.review import (
    JudgeView,
    LabelRecord,
    ReviewChunk,
    ReviewItem,
    decode_label,
    encode_item,
    label_id,
    label_key,
)

# A browser, a JVM broker and the command, each started on a 2-core machine shared with others.
pytestmark = [pytest.mark.kafka, pytest.mark.slow, pytest.mark.timeout(600)]

CHROMIUM = "/usr/bin/chromium"  # Debian's package, installed by the Makefile (SYSTEM_PACKAGES)
USERS = {"ana": "ana-secret", "bo": "bo-secret"}
T0 = datetime(2025, 11, 20, 10, 0, 42, tzinfo=UTC)


def item(event_id: str, reason: str = "random", **changes: Any) -> ReviewItem:
    fields: dict[str, Any] = {
        "event_id": event_id,
        "app": "support-bot",
        "model": "gpt-4o-mini",
        "event_time": T0,
        "window_start": T0.replace(second=0),
        "window_end": T0.replace(minute=5, second=0),
        "reason": reason,
        "reason_judges": () if reason == "random" else ("groundedness",),
        "request": "How many seats does the Pro plan include?",
        "response": "The Pro plan includes 25 seats and priority support.",
        "chunks": (
            ReviewChunk(content="Pro plan: up to 10 seats, email support.", doc_uri="kb/plans"),
            ReviewChunk(content="Priority support comes with Enterprise.", doc_uri="kb/support"),
        ),
        "verdicts": (
            JudgeView(judge="groundedness", rating="no", prompt_version="v1f2", p_yes=0.31,
                      rationale="The chunks say 10 seats, not 25; priority support is "
                      "Enterprise only."),
            JudgeView(judge="relevance_to_query", rating="yes", prompt_version="v1f2",
                      rationale="It answers the question about seats."),
        ),
        "redacted": True,
        "queued_at": T0.replace(minute=6),
    }
    fields.update(changes)
    return ReviewItem(**fields)


@pytest.fixture
def web_config(tmp_path: Path) -> Path:
    path = tmp_path / "web.yml"
    users = {u: bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=4)).decode()
             for u, p in USERS.items()}
    path.write_text(yaml.safe_dump({"basic_auth_users": users}))
    return path


class ReviewPage:
    """`ragpulse review` as a subprocess on a free port, stopped by PID."""

    def __init__(self, broker: ApacheKafkaBroker, topic: str, web_config: Path,
                 log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log_path.open("wb")
        self.process = subprocess.Popen(
            [*ragpulse_command(), "review", "--kafka-bootstrap", broker.bootstrap,
             "--topic", topic, "--web-config-file", str(web_config), "--port", str(self.port),
             "--kafka-timeout", "3s"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.log_path = log_path
        self._wait_until_up()

    def _wait_until_up(self) -> None:
        for _ in range(600):
            assert self.process.poll() is None, self.log_path.read_text()
            with contextlib.suppress(OSError), urllib.request.urlopen(
                f"{self.url}/healthz", timeout=2
            ) as answer:
                if answer.status == 200:
                    return
            # Waiting for the process to bind its port; it is watched for an early exit too.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.1)
        raise AssertionError(f"the review page never answered:\n{self.log_path.read_text()}")

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


@pytest.fixture
def review_page(kafka_broker: ApacheKafkaBroker, web_config: Path,
                tmp_path: Path) -> Iterator[tuple[ApacheKafkaBroker, str, ReviewPage]]:
    topic = "chat"
    kafka_broker.create_topic(f"{topic}.review", 1)
    kafka_broker.create_topic(f"{topic}.labels", 1)
    page = ReviewPage(kafka_broker, topic, web_config, tmp_path / "review.log")
    try:
        yield kafka_broker, topic, page
    finally:
        page.stop()
        print(page.log_path.read_text()[-4000:])


@pytest.fixture
def chromium() -> Iterator[Any]:
    assert shutil.which("chromium") and Path(CHROMIUM).is_file(), (
        "Debian's chromium is missing: make test installs it (SYSTEM_PACKAGES)"
    )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def produce_items(broker: ApacheKafkaBroker, topic: str, *items: ReviewItem) -> None:
    broker.produce(f"{topic}.review", [encode_item(i)[1] for i in items], partition=0)


def labels_on(broker: ApacheKafkaBroker, topic: str, expected: int) -> list[LabelRecord]:
    records = read_topic(broker.bootstrap, f"{topic}.labels", expected)
    for r in records:
        label = decode_label(r.value)
        assert r.key == label_key(label.event_id, label.judge)
    return [decode_label(r.value) for r in records]


def login(browser: Any, user: str, password: str | None = None) -> Any:
    context = browser.new_context(
        http_credentials={"username": user, "password": password or USERS[user]},
        viewport={"width": 1200, "height": 1000},
    )
    return context.new_page()


def open_item(page: Any, url: str, event_id: str) -> None:
    """Go to the page until it shows `event_id` (the page reads the topic on its own thread)."""
    for _ in range(300):
        page.goto(url)
        if page.locator(f"text={event_id}").count():
            return
        page.wait_for_timeout(100)
    raise AssertionError(f"{event_id} never shown; the page said: {page.content()[:2000]}")


def test_a_reviewer_labels_items_by_keyboard_and_mouse_and_the_labels_reach_the_topic(
    review_page: tuple[ApacheKafkaBroker, str, ReviewPage], chromium: Any, tmp_path: Path
) -> None:
    broker, topic, server = review_page
    produce_items(broker, topic, item("evt-1"), item("evt-2"), item("evt-3", reason="failing"))
    page = login(chromium, "ana")
    open_item(page, server.url, "evt-1")
    assert "How many seats does the Pro plan include?" in page.inner_text("#request")
    assert "kb/plans" in page.content() and "The chunks say 10 seats" in page.content()
    assert page.locator("text=signed in as").inner_text().endswith("ana")
    shot = Path(os.environ.get("RAGPULSE_SCREENSHOT", tmp_path / "review-page.png"))
    page.screenshot(path=str(shot), full_page=True)

    # The keyboard: groundedness wrong, relevance right, Enter saves and moves on.
    page.keyboard.press("w")
    page.keyboard.press("r")
    page.keyboard.press("Enter")
    page.wait_for_url("**/item/evt-2*")
    assert "2 saved" in page.inner_text("[role=status]")

    # The mouse: both right, a note, the button.
    page.locator('.judge[data-judge="groundedness"] input[value=right]').click()
    page.locator('.judge[data-judge="relevance_to_query"] input[value=right]').click()
    page.fill("#note", "fine as it is")
    page.click("#save")
    page.wait_for_url("**/item/evt-3*")
    assert "random" not in page.inner_text(".tag.targeted")  # a targeted item says so

    # `a` marks every judge right; `x` would skip: here the item is labelled.
    page.keyboard.press("a")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Nothing to review")

    labels = labels_on(broker, topic, 6)
    got = {(x.event_id, x.judge): x for x in labels}
    assert len(labels) == len(got) == 6
    assert got[("evt-1", "groundedness")].verdict == "wrong"
    assert got[("evt-1", "relevance_to_query")].verdict == "right"
    assert got[("evt-2", "groundedness")].note == "fine as it is"
    assert {x.reviewer for x in labels} == {"ana"}
    assert {x.prompt_version for x in labels} == {"v1f2"}
    assert got[("evt-3", "groundedness")].reason == "failing"
    assert got[("evt-1", "groundedness")].reason == "random"
    for x in labels:
        assert x.label_id == label_id(x.event_id, x.judge, "v1f2", "ana")

    # A second reviewer labels the same item: both reviewers' labels are kept.
    other = login(chromium, "bo")
    open_item(other, server.url, "evt-1")
    other.keyboard.press("r")
    other.keyboard.press("r")
    other.keyboard.press("Enter")
    other.wait_for_url("**/item/evt-2*")
    labels = labels_on(broker, topic, 8)
    assert len(labels) == 8
    assert {x.reviewer for x in labels if x.event_id == "evt-1"} == {"ana", "bo"}


def test_no_login_or_a_wrong_one_is_refused_with_a_page(
    review_page: tuple[ApacheKafkaBroker, str, ReviewPage], chromium: Any
) -> None:
    _, _, server = review_page
    # Headless chromium ends a navigation answered 401 with ERR_INVALID_AUTH_CREDENTIALS (it has
    # no login dialog), so the answer is read with the browser context's own HTTP client.
    stranger = chromium.new_context().request
    answer = stranger.get(server.url)
    assert answer.status == 401
    assert answer.headers["www-authenticate"].startswith("Basic")
    assert "needs your reviewer login" in answer.text()
    # A wrong password (the browser gives up on it: ERR_INVALID_AUTH_CREDENTIALS), as sent.
    wrong = base64.b64encode(b"ana:not-her-password").decode()
    request = urllib.request.Request(server.url, headers={"Authorization": f"Basic {wrong}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 401
    assert "needs your reviewer login" in refused.value.read().decode()
    # /healthz stays open, as on /metrics' server.
    assert stranger.get(f"{server.url}/healthz").status == 200


def test_a_forged_label_form_is_refused_and_nothing_is_published(
    review_page: tuple[ApacheKafkaBroker, str, ReviewPage], chromium: Any
) -> None:
    broker, topic, server = review_page
    produce_items(broker, topic, item("evt-9"))
    page = login(chromium, "ana")
    open_item(page, server.url, "evt-9")
    # What another site's form would send with ana's remembered login: no token, or bo's page's.
    forged = page.request.post(f"{server.url}/item/evt-9", form={
        "verdict-groundedness": "wrong", "csrf": "0" * 64,
    })
    assert forged.status == 403 and "Nothing was saved" in forged.text()
    # The real form still works afterwards, and only its labels are on the topic.
    page.keyboard.press("w")
    page.keyboard.press("r")
    page.keyboard.press("Enter")
    page.wait_for_selector("text=Nothing to review")
    labels = labels_on(broker, topic, 2)
    assert sorted((x.judge, x.verdict) for x in labels) == [
        ("groundedness", "wrong"), ("relevance_to_query", "right")
    ]


def test_a_broker_outage_keeps_the_marks_says_not_saved_and_the_retry_saves_once(
    review_page: tuple[ApacheKafkaBroker, str, ReviewPage], chromium: Any
) -> None:
    broker, topic, server = review_page
    produce_items(broker, topic, item("evt-5"))
    page = login(chromium, "ana")
    open_item(page, server.url, "evt-5")
    page.keyboard.press("w")
    page.keyboard.press("r")
    page.fill("#note", "25 is wrong")
    broker.stop()
    try:
        with page.expect_navigation():
            page.click("#save")
        assert "Not saved" in page.inner_text("#error")
        # The reviewer's marks and note are still there, ready to send again.
        assert page.locator('.judge[data-judge="groundedness"] input[value=wrong]').is_checked()
        assert page.input_value("#note") == "25 is wrong"
    finally:
        broker.start()
    page.click("#save")
    page.wait_for_selector("text=Nothing to review")
    labels = labels_on(broker, topic, 2)
    assert sorted((x.judge, x.verdict) for x in labels) == [
        ("groundedness", "wrong"), ("relevance_to_query", "right")
    ]
    assert all(x.note == "25 is wrong" for x in labels)

    # The same label sent again (the item opened again and saved) is not published twice.
    page.goto(f"{server.url}/item/evt-5")
    assert "you labelled this one already" in page.content()
    page.locator('.judge[data-judge="groundedness"] input[value=wrong]').click()
    page.click("#save")
    page.wait_for_selector("text=Nothing to review")
    assert "0 saved, 1 already saved" in page.inner_text("[role=status]")
    assert len(labels_on(broker, topic, 2)) == 2

