"""The review page of `ragpulse review`: one review item at a time, labels posted to the labels
topic (docs/review.md).

A Flask application, served by ragpulse's own bounded WSGI server with the TLS of
`--web-config-file` (pipeline/metrics/http.py, as /metrics is). Every page but /healthz needs a
basic-auth login, and the login names the reviewer: the label form has no name field.

The label form carries a CSRF token, an HMAC of (reviewer, event id) under a key made at start:
a page of another site cannot post a label with the reviewer's remembered basic-auth login.
What can go wrong is said on the page, never swallowed:

* no login or a wrong one: 401; a form without a valid token: 403 ("reload the page");
* the item is no longer in the queue (stale): 409, with a link to the next one;
* the broker does not acknowledge the labels: 503, the form shown again with the reviewer's marks
  and note kept, "not saved, press Save again". A label's id is a digest of (event, judge,
  prompt version, reviewer), so a label sent twice is one label for every consumer, and a label
  the page has seen on the topic is not sent again ("already saved").
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import math
import secrets
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Response, g, redirect, render_template, request, url_for

from ragpulse.pipeline.formats.review import (
    MAX_NOTE_CHARS,
    JudgeView,
    LabelRecord,
    ReviewItem,
    label_id,
)
from ragpulse.pipeline.metrics import catalogue
from ragpulse.pipeline.review.access import Login
from ragpulse.pipeline.review.queue import LabelNotSaved, LabelPublisher, ReviewQueue

log = logging.getLogger(__name__)


def csrf_token(key: bytes, reviewer: str, event_id: str) -> str:
    """The label form's token for `reviewer` on the item `event_id`."""
    message = f"{reviewer}\0{event_id}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


class _FormError(ValueError):
    """A label form that cannot be used as it is; the message says what to fix."""


def review_app(
    queue: ReviewQueue,
    publisher: LabelPublisher,
    auth: Login,
    *,
    clock: Callable[[], float] = time.time,
    csrf_key: bytes | None = None,
) -> Flask:
    """The review page's WSGI application."""
    app = Flask(__name__)
    app.config["MAX_CONTENT_LENGTH"] = 32 * 1024
    key = csrf_key or secrets.token_bytes(32)

    @app.before_request
    def _login() -> Response | None:
        g.nonce = secrets.token_urlsafe(16)
        if request.path == "/healthz":
            return None
        reviewer = auth.user(request.headers.get("Authorization"))
        if reviewer is None:
            page = render_template("message.html", title="Login needed", reviewer=None,
                                   message="This page needs your reviewer login.")
            return Response(page, 401, {"WWW-Authenticate": 'Basic realm="ragpulse review"'})
        g.reviewer = reviewer
        return None

    @app.after_request
    def _headers(response: Response) -> Response:
        response.headers["Cache-Control"] = "no-store"
        response.headers["X-Frame-Options"] = "DENY"
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Content-Security-Policy"] = (
            f"default-src 'none'; style-src 'unsafe-inline'; script-src 'nonce-{g.nonce}'; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        )
        return response

    @app.get("/healthz")
    def healthz() -> tuple[str, int]:
        status = queue.status()
        if status.error:
            return f"broker: {status.error}\n", 503
        refused = " ".join(f"{why}={n}" for why, n in sorted(status.refused.items()))
        counts = f"items {status.items} labels {status.labels} dead-lettered {refused or 0}"
        return f"ok\n{counts}\n", 200

    @app.get("/metrics")
    def metrics() -> Response:
        # The queue's depth, for the dashboard (behind the reviewers' login, as every page).
        status = queue.status()
        name, help_text = catalogue.REVIEW_QUEUE_DEPTH, catalogue.GAUGE_HELP[
            catalogue.REVIEW_QUEUE_DEPTH]
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge",
                 f'{name}{{state="unlabelled"}} {status.unlabelled}',
                 f'{name}{{state="unread"}} {status.unread}']
        return Response("\n".join(lines) + "\n", 200,
                        {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    @app.get("/")
    def next_item() -> Any:
        item = queue.next_item(g.reviewer)
        if item is None:
            status = queue.status()
            return render_template("empty.html", title="Nothing to review", status=status,
                                   reviewer=g.reviewer, saved=request.args.get("saved"))
        return redirect(url_for("show", event_id=item.event_id, saved=request.args.get("saved")))

    @app.get("/item/<path:event_id>")
    def show(event_id: str) -> Any:
        item = queue.item(event_id)
        if item is None:
            return _stale(event_id)
        return _form(item, {}, "", saved=request.args.get("saved"))

    @app.post("/item/<path:event_id>/skip")
    def skip(event_id: str) -> Any:
        if not _token_ok(event_id):
            return _forbidden()
        queue.skip(g.reviewer, event_id)
        return redirect(url_for("next_item"), 303)

    @app.post("/item/<path:event_id>")
    def label(event_id: str) -> Any:
        if not _token_ok(event_id):
            return _forbidden()
        item = queue.item(event_id)
        if item is None:
            return _stale(event_id)
        choices = {v.judge: (request.form.get(f"verdict-{v.judge}", ""),
                             request.form.get(f"score-{v.judge}", "")) for v in item.verdicts}
        note = request.form.get("note", "")
        try:
            labels = _labels(item, choices, note, g.reviewer, clock())
        except _FormError as exc:
            return _form(item, choices, note, error=str(exc)), 400
        new = [x for x in labels if not queue.has_label(x.label_id)]
        try:
            if new:
                publisher.publish(new)
        except LabelNotSaved as exc:
            log.warning("labels of %s by %s not saved: %s", event_id, g.reviewer, exc)
            why = (f"Not saved: the labels topic did not take them ({exc}). Your marks are "
                   "still here: press Save again when the broker is back.")
            return _form(item, choices, note, error=why), 503
        for x in labels:
            queue.add_label(x)
        log.info("%d labels of %s by %s saved (%d already were)", len(new), event_id,
                 g.reviewer, len(labels) - len(new))
        saved = f"{len(new)} saved" + (f", {len(labels) - len(new)} already saved"
                                       if len(new) < len(labels) else "")
        return redirect(url_for("next_item", saved=saved), 303)

    def _token_ok(event_id: str) -> bool:
        sent = request.form.get("csrf", "")
        return hmac.compare_digest(sent, csrf_token(key, g.reviewer, event_id))

    def _forbidden() -> tuple[str, int]:
        return render_template(
            "message.html", title="Form expired", reviewer=g.reviewer,
            message="This form was not issued to you by this review page (or the page was "
            "restarted since). Nothing was saved: reload the item and label it again.",
        ), 403

    def _stale(event_id: str) -> tuple[str, int]:
        return render_template(
            "message.html", title="Item no longer in the queue", reviewer=g.reviewer,
            message=f"The item {event_id!r} is not in the review queue any more (the topic's "
            "retention removed it, or the page was restarted before reading it). Nothing was "
            "saved.", next_link=True,
        ), 409

    def _form(item: ReviewItem, choices: dict[str, tuple[str, str]], note: str,
              error: str | None = None, saved: str | None = None) -> str:
        open_judges = set(queue.open_judges(item, g.reviewer))
        return render_template(
            "item.html", title=f"Review {item.event_id}", item=item, reviewer=g.reviewer,
            csrf=csrf_token(key, g.reviewer, item.event_id), choices=choices, note=note,
            error=error, saved=saved, open_judges=open_judges, max_note=MAX_NOTE_CHARS,
            nonce=g.nonce,
        )

    return app


def _labels(item: ReviewItem, choices: dict[str, tuple[str, str]], note: str, reviewer: str,
            now: float) -> list[LabelRecord]:
    """The labels a form gives; _FormError when it gives none or a bad one."""
    if len(note) > MAX_NOTE_CHARS:
        raise _FormError(f"The note is longer than {MAX_NOTE_CHARS} characters.")
    labels = []
    for view in item.verdicts:
        choice, score_text = choices.get(view.judge, ("", ""))
        if view.rating == "error" or not choice:
            continue
        labels.append(LabelRecord(
            label_id=label_id(item.event_id, view.judge, view.prompt_version, reviewer),
            event_id=item.event_id,
            judge=view.judge,
            prompt_version=view.prompt_version,
            judge_rating=view.rating,
            verdict=_verdict(view, choice),
            correct_score=_score(view, score_text) if choice == "score" else None,
            note=note.strip() or None,
            reviewer=reviewer,
            labelled_at=datetime.fromtimestamp(now, UTC),
            reason=item.reason,
        ))
    if not labels:
        raise _FormError("Mark at least one judge's verdict right or wrong (keys r / w).")
    return labels


def _verdict(view: JudgeView, choice: str) -> Any:
    if choice not in ("right", "wrong", "score"):
        raise _FormError(f"{view.judge}: {choice!r} is not right, wrong or a score.")
    return choice


def _score(view: JudgeView, text: str) -> float:
    try:
        score = float(text)
    except ValueError:
        raise _FormError(f"{view.judge}: give the correct score as a number.") from None
    if not math.isfinite(score) or (view.scale is not None and score not in view.scale):
        scale = ", ".join(str(s) for s in view.scale or ())
        raise _FormError(f"{view.judge}: the score must be one of {scale or 'a finite number'}.")
    return score
