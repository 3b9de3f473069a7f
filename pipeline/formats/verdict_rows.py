"""The verdict row: one judged event with every judge's rating, rationale and error.

Written by `ragpulse run` (verdicts.jsonl) and `ragpulse serve` (the verdicts topic), with the
Agent Evaluation output field names `response/llm_judged/<judge>/{rating,rationale,
error_message}` plus `error_cause`, `score` (graded scales) and `version` (the prompt version);
a judge skipped for lack of its required field is rated `skipped`. Read back by
`ragpulse explain` and by serve's exemplars.
Free of Beam, so that reading rows stays fast.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from ragpulse.pipeline.windows import isoformat_utc

if TYPE_CHECKING:
    from ragpulse.judges import TextPolicy
    from ragpulse.pipeline.records import JudgedEvent

_PREFIX = "response/llm_judged/"
_RATING_SUFFIX = "/rating"


class InvalidVerdictRow(ValueError):
    """A row that is not in the verdict row format; the message says what is wrong."""


def verdict_row(judged: JudgedEvent, policy: TextPolicy) -> dict[str, Any]:
    """The `verdicts.jsonl` row (also what serve publishes), with Agent Evaluation field names.

    Request id, event time, app, model and ratings are kept as they are. Rationales and error
    messages are user text, as they can quote the question or the answer: `policy.store_text`
    keeps them in full, redacted (PII and operator patterns replaced, the default), or not at
    all ("none": no rationale, and an error message that only names the error's cause).
    """
    record = judged.record
    row: dict[str, Any] = {
        "request_id": record.request_id,
        "event_time": isoformat_utc(record.event_time),
        "app": record.app,
        "model": record.model,
    }
    session = record.session
    if session is not None:  # a conversation's verdicts: which one, and which turns
        row["session_id"] = session.session_id
        row["turns"] = list(session.request_ids)
        row["turns_dropped"] = session.dropped
    store = policy.store_text
    redact = policy.redactor().redact
    for v, version in judged.versioned():
        prefix = f"{_PREFIX}{v.judge}"
        rationale, error = v.rationale, v.error_message
        if store == "none":
            rationale = None
            if error is not None:
                error = f"{v.error_cause or 'error'} (message not stored: --store-text none)"
        elif store == "redacted":
            rationale = redact(rationale) if rationale else rationale
            error = redact(error) if error else error
        row[f"{prefix}/rating"] = v.rating
        row[f"{prefix}/rationale"] = rationale
        row[f"{prefix}/error_message"] = error
        row[f"{prefix}/error_cause"] = v.error_cause  # the ragpulse_judge_errors_total label
        row[f"{prefix}/score"] = v.score  # a graded scale's score (None on the binary scale)
        row[f"{prefix}/version"] = version  # the prompt version, as the metrics label it
    return row


@dataclasses.dataclass(frozen=True, slots=True)
class FailingVerdict:
    """One judge's `no` or `error` on one event, as read back from a verdict row."""

    request_id: str
    event_time: float  # epoch seconds
    app: str
    model: str
    judge: str
    rating: str  # "no" or "error"
    rationale: str | None
    error_message: str | None


def failing_verdicts(row: Mapping[str, Any]) -> Iterator[FailingVerdict]:
    """The `no` and `error` verdicts of a row, judge by judge; InvalidVerdictRow if malformed."""
    try:
        request_id = row["request_id"]
        event_time = datetime.fromisoformat(row["event_time"]).timestamp()
        app, model = row["app"], row["model"]
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidVerdictRow(
            f"not a verdict row (request_id, event_time, app, model): {exc}"
        ) from None
    if not all(isinstance(v, str) for v in (request_id, app, model)):
        raise InvalidVerdictRow("request_id, app and model must be strings")
    for field, rating in row.items():
        if not field.endswith(_RATING_SUFFIX) or not field.startswith(_PREFIX):
            continue
        if rating not in ("yes", "no", "error", "skipped"):
            raise InvalidVerdictRow(f"{field} is {rating!r}, not yes, no, error or skipped")
        if rating in ("yes", "skipped"):
            continue
        base = field.removesuffix(_RATING_SUFFIX)
        yield FailingVerdict(
            request_id=request_id,
            event_time=event_time,
            app=app,
            model=model,
            judge=base.removeprefix(_PREFIX),
            rating=rating,
            rationale=row.get(f"{base}/rationale"),
            error_message=row.get(f"{base}/error_message"),
        )
