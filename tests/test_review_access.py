"""The review page's bearer tokens (the alternative to basic auth) and its dead letters: a
review-topic record the page cannot show goes to REVIEW_TOPIC.dlq with its reason, is counted,
and the page carries on. The command runs for real against Apache Kafka."""

from __future__ import annotations

import contextlib
import hashlib
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cli import ragpulse_command
from kafka_broker import ApacheKafkaBroker, produce
from processes import free_port, stop_process
from serve_process import read_topic

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.formats.review import (
    MAX_REVIEW_ITEM_BYTES,
    JudgeView,
    ReviewItem,
    decode_label,
    encode_item,
)
from ragpulse.pipeline.review.access import AnyLogin, BearerTokens, read_token_file

T0 = datetime(2025, 11, 20, 10, 0, tzinfo=UTC)
ANA_TOKEN = "ana-" + "7f3a9c" * 8
BO_TOKEN = "bo-" + "51e0d4" * 8


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_file(path: Path, **tokens: str) -> Path:
    path.write_text("# reviewer  sha256 of the token\n" + "".join(
        f"{name} {'sha256:' if name == 'bo' else ''}{digest(token)}\n"
        for name, token in tokens.items()))
    return path


def item(event_id: str, response: str = "The Pro plan has 25 seats.") -> ReviewItem:
    return ReviewItem(
        event_id=event_id, app="docs", model="m", event_time=T0, window_start=T0,
        window_end=T0.replace(minute=5), reason="random", request="How many seats?",
        response=response,
        verdicts=(JudgeView(judge="groundedness", rating="no", prompt_version="v1f2"),),
        redacted=False, queued_at=T0,
    )


# -- the token file (pure) ----------------------------------------------------------------------


def test_a_token_names_its_reviewer_and_a_rotated_file_is_read_again(tmp_path: Path) -> None:
    path = token_file(tmp_path / "tokens", ana=ANA_TOKEN, bo=BO_TOKEN)
    tokens = BearerTokens(path)
    assert tokens.user(f"Bearer {ANA_TOKEN}") == "ana"
    assert tokens.user(f"bearer {BO_TOKEN}") == "bo"
    assert tokens.user(f"Bearer {ANA_TOKEN}x") is None
    assert tokens.user(f"Basic {ANA_TOKEN}") is None
    assert tokens.user(None) is None
    # Rotated in place: the old token is refused from the next request on.
    new = "ana-" + "c0ffee" * 8
    token_file(path, ana=new)
    assert tokens.user(f"Bearer {ANA_TOKEN}") is None
    assert tokens.user(f"Bearer {new}") == "ana"
    # A rotation that does not read keeps the reviewers read before.
    path.write_text("ana not-a-digest\n")
    assert tokens.user(f"Bearer {new}") == "ana"
    assert AnyLogin(BearerTokens(token_file(tmp_path / "t2", bo=BO_TOKEN)), tokens).user(
        f"Bearer {new}") == "ana"


@pytest.mark.parametrize(("text", "message"), [
    ("ana abc\n", "line 1: expected 'REVIEWER SHA256_HEX'"),
    (f"ana {digest('x')}\n# ok\nbo {digest('x')}\n", "line 3: the same token as ana's"),
    ("# nobody\n", "no reviewer in it"),
    (f"ana {ANA_TOKEN}\n", "line 1: expected"),  # a token in clear is refused
])
def test_a_token_file_that_cannot_be_used_is_refused_naming_the_line(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "tokens"
    path.write_text(text)
    with pytest.raises(SettingsError, match=re.escape(message)):
        read_token_file(path)


# -- the command --------------------------------------------------------------------------------


class Page:
    def __init__(self, broker: ApacheKafkaBroker, tokens: Path, log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = log.open("wb")
        self.log_path = log
        self.process = subprocess.Popen(
            [*ragpulse_command(), "review", "--kafka-bootstrap", broker.bootstrap, "--topic",
             "chat", "--bearer-token-file", str(tokens), "--port", str(self.port),
             "--kafka-timeout", "3s"],
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True,
        )

    def get(self, path: str, token: str | None = None,
            form: dict[str, str] | None = None) -> tuple[int, str]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data)
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()

    def healthz_until(self, wanted: str) -> str:
        """/healthz once it says `wanted` (the page reads the topics on a thread of its own)."""
        body = ""
        for _ in range(600):
            assert self.process.poll() is None, self.log_path.read_text()
            with contextlib.suppress(OSError):
                _, body = self.get("/healthz")
                if wanted in body:
                    return body
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=0.1)
        raise AssertionError(f"/healthz never said {wanted!r}: {body}\n"
                             f"{self.log_path.read_text()}")

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


@pytest.fixture
def page(kafka_broker: ApacheKafkaBroker, tmp_path: Path) -> Iterator[tuple[str, Page]]:
    for name in ("chat.review", "chat.labels", "chat.review.dlq"):
        kafka_broker.create_topic(name, 1)
    served = Page(kafka_broker, token_file(tmp_path / "tokens", ana=ANA_TOKEN, bo=BO_TOKEN),
                  tmp_path / "review.log")
    try:
        yield kafka_broker.bootstrap, served
    finally:
        served.stop()


@pytest.mark.kafka
def test_a_reviewer_with_a_bearer_token_labels_under_their_name(
    page: tuple[str, Page]
) -> None:
    bootstrap, served = page
    produce(bootstrap, "chat.review", [encode_item(item("evt-1"))[1]])
    served.healthz_until("items 1 ")
    assert served.get("/item/evt-1")[0] == 401
    assert served.get("/item/evt-1", token="not-a-token")[0] == 401
    status, html = served.get("/item/evt-1", token=BO_TOKEN)
    assert status == 200 and "bo" in html
    csrf = re.search(r'name="csrf" value="([^"]+)"', html)
    assert csrf is not None
    status, _ = served.get("/item/evt-1", token=BO_TOKEN, form={
        "csrf": csrf.group(1), "verdict-groundedness": "right", "note": "10 seats, not 25"})
    assert status in (200, 302, 303)
    [record] = read_topic(bootstrap, "chat.labels", 1)
    label = decode_label(record.value)
    assert (label.reviewer, label.verdict, label.note) == ("bo", "right", "10 seats, not 25")
    # ana's form token is not bo's: a token names one reviewer, as a login does.
    forged = served.get("/item/evt-1", token=ANA_TOKEN, form={
        "csrf": csrf.group(1), "verdict-groundedness": "wrong"})
    assert forged[0] == 403


@pytest.mark.kafka
def test_review_records_the_page_cannot_show_are_dead_lettered_with_their_reason(
    page: tuple[str, Page]
) -> None:
    bootstrap, served = page
    oversized = item("evt-big", response="x" * MAX_REVIEW_ITEM_BYTES).model_dump_json().encode()
    assert len(oversized) > MAX_REVIEW_ITEM_BYTES
    produce(bootstrap, "chat.review",
            [oversized, b'{"event_id": "evt-bad"}', encode_item(item("evt-ok"))[1]],
            max_request_size=2 * MAX_REVIEW_ITEM_BYTES)
    body = served.healthz_until("items 1 ")
    assert "dead-lettered invalid=1 too_large=1" in body
    letters = read_topic(bootstrap, "chat.review.dlq", 2)
    assert len(letters) == 2
    by_offset = {int(dict(r.headers)["source-offset"]): r for r in letters}
    big, bad = by_offset[0], by_offset[1]
    assert dict(big.headers)["reason"].startswith(b"too_large: ")
    assert dict(big.headers)["original-size"] == str(len(oversized)).encode()
    assert big.value == oversized  # under the dead-letter bound: kept whole
    assert dict(bad.headers)["reason"].startswith(b"invalid: ")
    assert bad.value == b'{"event_id": "evt-bad"}'
    # The page goes on with the item it can show.
    status, html = served.get("/item/evt-ok", token=ANA_TOKEN)
    assert status == 200 and "evt-ok" in html
