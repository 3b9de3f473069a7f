"""Human labels teams already have, read as labels of the labels topic.

For `ragpulse import-labels` (pipeline/commands/import_labels.py). Two sources:

* **MLflow 3 traces** exported as JSON (`Trace.to_json()`, or `mlflow.search_traces` rows: an
  object with `info`, a list of them, or one per line): each assessment of a trace whose
  `source.source_type` is `HUMAN` and that carries `feedback` is a human label: its
  `assessment_name` is the judge, `feedback.value` the rating (true/false, "yes"/"no",
  "pass"/"fail"), `source.source_id` the reviewer, `create_time` the time, `rationale` the
  note. The event id is the trace's `client_request_id` (the chatbot's request id, what
  ragpulse's events carry as their id), else its `trace_id`. Assessments of other sources
  (LLM_JUDGE, CODE) are not labels; an `LLM_JUDGE` assessment of the same name on the same
  trace is that judge's rating, if ragpulse's is not known.
* **CSV or JSON Lines** with `event_id`, `judge`, `label` (yes/no), and optionally
  `reviewer`, `note`, `labelled_at` (ISO 8601), `judge_rating` and `prompt_version`.

A label record says whether a judge's rating was right, so each human rating needs the
judge's rating and prompt version of that event: from the review topic's item when the event
was queued, else from the row (`judge_rating`, `prompt_version`). `ImportRow` is what one row
says; `to_label` makes it a label or says why it cannot be one (`kind: details`). A row that
is not one (`InvalidImportRow`) is an error naming its line: nothing of the file is published.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import orjson
from pydantic import ValidationError

from ragpulse.pipeline.formats.review import (
    MAX_NOTE_CHARS,
    LabelRecord,
    ReviewItem,
    label_id,
)

_YES = {"yes", "true", "pass", "1", "y", "correct", "good"}
_NO = {"no", "false", "fail", "0", "n", "incorrect", "bad"}


class InvalidImportRow(ValueError):
    """A row that is not a human label; the message says where and why."""


@dataclasses.dataclass(frozen=True, slots=True)
class ImportRow:
    """One human rating as a file says it, with where it was read."""

    where: str  # "line 7", "trace tr-1, assessment a-2"
    event_id: str
    judge: str
    rating: str  # "yes" or "no"
    reviewer: str
    labelled_at: datetime
    note: str | None = None
    judge_rating: str | None = None
    prompt_version: str | None = None


def rating_of(value: Any, where: str) -> str:
    """A human rating as "yes" or "no"; InvalidImportRow for anything else."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str) and value.strip().lower() in _YES | _NO:
        return "yes" if value.strip().lower() in _YES else "no"
    if isinstance(value, int | float) and value in (0, 1):
        return "yes" if value == 1 else "no"
    raise InvalidImportRow(f"{where}: label {value!r} is not a yes/no rating (yes, no, true, "
                           "false, pass, fail)")


def _time(value: Any, where: str, default: datetime) -> datetime:
    if value in (None, ""):
        return default
    if isinstance(value, int | float) and not isinstance(value, bool):
        return datetime.fromtimestamp(value / 1000, UTC)  # MLflow's *_time_ms
    try:
        parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise InvalidImportRow(f"{where}: time {value!r} is not ISO 8601") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _text(row: dict[str, Any], key: str, where: str, required: bool = True) -> str | None:
    value = row.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        if required:
            raise InvalidImportRow(f"{where}: no {key}")
        return None
    if not isinstance(value, str):
        raise InvalidImportRow(f"{where}: {key} must be text, not {value!r}")
    return value.strip()


# -- plain rows ---------------------------------------------------------------------------------

ROW_KEYS = ("event_id", "judge", "label", "reviewer", "note", "labelled_at", "judge_rating",
            "prompt_version")


def plain_rows(data: bytes, kind: str, reviewer: str | None, now: datetime) -> Iterator[ImportRow]:
    """The rows of a CSV (header line first) or JSON Lines file (`kind`)."""
    if kind == "csv":
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InvalidImportRow(f"not UTF-8 ({exc})") from None
        reader = csv.DictReader(io.StringIO(text))
        missing = [k for k in ("event_id", "judge", "label") if k not in (reader.fieldnames or [])]
        if missing:
            raise InvalidImportRow(f"line 1: the header lacks {', '.join(missing)} (columns: "
                                   "event_id, judge, label; optional reviewer, note, "
                                   "labelled_at, judge_rating, prompt_version)")
        for row in reader:
            yield _plain_row(dict(row), f"line {reader.line_num}", reviewer, now)
        return
    for where, row in _json_lines(data):
        yield _plain_row(row, where, reviewer, now)


def _json_lines(data: bytes) -> Iterator[tuple[str, dict[str, Any]]]:
    """("line N", object) of each non-blank line of JSON Lines."""
    for number, raw in enumerate(data.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            line = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise InvalidImportRow(f"line {number}: not JSON ({exc})") from None
        if not isinstance(line, dict):
            raise InvalidImportRow(f"line {number}: not a JSON object")
        yield f"line {number}", line


def _plain_row(row: dict[str, Any], where: str, reviewer: str | None,
               now: datetime) -> ImportRow:
    unknown = sorted(k for k in row if k not in ROW_KEYS and k is not None)
    if unknown:
        raise InvalidImportRow(f"{where}: unknown column(s) {', '.join(unknown)}")
    if None in row:
        raise InvalidImportRow(f"{where}: more fields than the header names")
    who = _text(row, "reviewer", where, required=reviewer is None) or reviewer
    assert who is not None
    judge_rating = _text(row, "judge_rating", where, required=False)
    return ImportRow(
        where=where,
        event_id=_text(row, "event_id", where) or "",
        judge=_text(row, "judge", where) or "",
        rating=rating_of(row.get("label"), where),
        reviewer=who,
        labelled_at=_time(row.get("labelled_at"), where, now),
        note=_text(row, "note", where, required=False),
        judge_rating=None if judge_rating is None else rating_of(judge_rating, where),
        prompt_version=_text(row, "prompt_version", where, required=False),
    )


# -- MLflow traces ------------------------------------------------------------------------------


def mlflow_rows(data: bytes) -> Iterator[ImportRow]:
    """The human feedback assessments of exported MLflow traces (see the module docstring)."""
    for where, trace in _traces(data):
        info = trace.get("info", trace)
        if not isinstance(info, dict):
            raise InvalidImportRow(f"{where}: 'info' is not an object")
        trace_id = info.get("trace_id") or info.get("request_id")
        event_id = info.get("client_request_id") or trace_id
        if not isinstance(event_id, str) or not event_id:
            raise InvalidImportRow(f"{where}: no client_request_id nor trace_id")
        assessments = info.get("assessments") or []
        if not isinstance(assessments, list):
            raise InvalidImportRow(f"{where}: 'assessments' is not a list")
        judged = {
            a.get("assessment_name"): a.get("feedback", {}).get("value")
            for a in assessments
            if isinstance(a, dict) and _source(a) == "LLM_JUDGE" and isinstance(
                a.get("feedback"), dict)
        }
        for number, a in enumerate(assessments, start=1):
            at = f"{where}, trace {event_id}, assessment {a.get('assessment_id', number)}" \
                if isinstance(a, dict) else f"{where}, assessment {number}"
            if not isinstance(a, dict):
                raise InvalidImportRow(f"{at}: not an object")
            if _source(a) != "HUMAN" or "feedback" not in a:
                continue  # a judge's or code's assessment, or an expectation: not a label
            feedback = a["feedback"]
            if not isinstance(feedback, dict) or "value" not in feedback:
                raise InvalidImportRow(f"{at}: feedback without a value")
            name = a.get("assessment_name")
            if not isinstance(name, str) or not name:
                raise InvalidImportRow(f"{at}: no assessment_name (the judge)")
            source = a.get("source") or {}
            reviewer = source.get("source_id") if isinstance(source, dict) else None
            if not isinstance(reviewer, str) or not reviewer or reviewer == "default":
                raise InvalidImportRow(f"{at}: the HUMAN source has no source_id (the "
                                       "reviewer's name)")
            judge_said = judged.get(name)
            yield ImportRow(
                where=at,
                event_id=event_id,
                judge=name,
                rating=rating_of(feedback["value"], at),
                reviewer=reviewer,
                labelled_at=_time(a.get("create_time") or a.get("create_time_ms"), at,
                                  datetime.now(UTC)),
                note=a.get("rationale") if isinstance(a.get("rationale"), str) else None,
                judge_rating=None if judge_said is None else rating_of(judge_said, at),
            )


def _source(assessment: dict[str, Any]) -> str | None:
    source = assessment.get("source")
    kind = source.get("source_type") if isinstance(source, dict) else None
    return "LLM_JUDGE" if kind == "AI_JUDGE" else kind  # MLflow's deprecated name


def _traces(data: bytes) -> Iterator[tuple[str, dict[str, Any]]]:
    try:
        whole = orjson.loads(data)
    except orjson.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        yield "trace 1", whole
        return
    if isinstance(whole, list):
        for number, trace in enumerate(whole, start=1):
            if not isinstance(trace, dict):
                raise InvalidImportRow(f"trace {number}: not a JSON object")
            yield f"trace {number}", trace
        return
    yield from _json_lines(data)


# -- rows as labels -----------------------------------------------------------------------------


def to_label(row: ImportRow, items: dict[str, ReviewItem]) -> LabelRecord | str:
    """The label record of a row, or why it cannot be one (a dead letter's reason): the
    judge's rating and prompt version come from the event's review item, else from the row."""
    item = items.get(row.event_id)
    view = item.verdict_of(row.judge) if item is not None else None
    if view is not None:
        if view.rating == "error":
            return f"judge error: the judge could not grade event {row.event_id}"
        judge_rating: str = view.rating
        version = view.prompt_version
    elif row.judge_rating is not None and row.prompt_version is not None:
        judge_rating, version = row.judge_rating, row.prompt_version
    else:
        return (f"unknown verdict: no verdict of {row.judge} on event {row.event_id} is known "
                "(not in the review topic, and the row gives no judge_rating and "
                "prompt_version)")
    if row.note is not None and len(row.note) > MAX_NOTE_CHARS:
        return f"note too long: {len(row.note)} characters, over {MAX_NOTE_CHARS}"
    try:
        return LabelRecord(
            label_id=label_id(row.event_id, row.judge, version, row.reviewer),
            event_id=row.event_id,
            judge=row.judge,
            prompt_version=version,
            judge_rating=judge_rating,
            verdict="right" if row.rating == judge_rating else "wrong",
            note=row.note,
            reviewer=row.reviewer,
            labelled_at=row.labelled_at,
            reason="imported",
        )
    except ValidationError as exc:
        error = exc.errors()[0]
        return f"invalid label: {'.'.join(str(p) for p in error['loc']) or 'label'}: {error['msg']}"
