"""`ragpulse import-labels FILE`: human labels a team already has, onto the labels topic.

Reads MLflow 3 traces exported as JSON (their HUMAN feedback assessments) or a plain CSV / JSON
Lines file of (event id, judge, label) (pipeline/review/imports.py), makes each row a label
record (the judge's rating and prompt version from the event's review item, or from the row),
and publishes them to the labels topic as the review page does (keyed by event id and judge,
acknowledged by the broker), with the reason `imported` (kept apart from the error-rate
estimate, like targeted items: the team chose what it labelled).

Nothing is dropped silently:
* a row that is not a label (no judge, a rating that is not yes/no, a bad time, an unknown
  column) stops the command with its line (or trace and assessment), before anything is
  published: fix the file and run it again;
* a row that is a label but cannot be one of ragpulse's (no verdict of that judge on that event
  is known; a note too long) goes to the dead-letter topic (`LABELS_TOPIC.dlq`) with its reason
  in the `reason` header, and is counted in the summary;
* a label already on the topic (the same event, judge, prompt version and reviewer: a second
  import of the same file) is not sent again, and is counted.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

import orjson

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.formats.review import LabelRecord, decode_item, decode_label
from ragpulse.pipeline.review.imports import (
    ImportRow,
    InvalidImportRow,
    mlflow_rows,
    plain_rows,
    to_label,
)
from ragpulse.pipeline.review.labelled import read_topic
from ragpulse.pipeline.settings.models import ImportLabelsSettings


def read_rows(settings: ImportLabelsSettings) -> list[ImportRow]:
    """Every row of the file; SettingsError names the file and where the first bad row is."""
    try:
        data = settings.input.read_bytes()
    except OSError as exc:
        raise SettingsError(f"{settings.input}: cannot read it ({exc.strerror})") from None
    now = datetime.now(UTC)
    try:
        if settings.format == "mlflow":
            return list(mlflow_rows(data))
        return list(plain_rows(data, settings.format, settings.reviewer, now))
    except InvalidImportRow as exc:
        raise SettingsError(f"{settings.input}: {exc}; nothing was published") from None


def _dead_letter(row: ImportRow, reason: str, source: str) -> tuple[bytes, bytes, str]:
    """(key, value, reason) of a row that could not be a label."""
    value = orjson.dumps({
        "source": source, "where": row.where, "event_id": row.event_id, "judge": row.judge,
        "label": row.rating, "reviewer": row.reviewer,
        "labelled_at": row.labelled_at.isoformat(), "note": row.note,
        "judge_rating": row.judge_rating, "prompt_version": row.prompt_version,
    })
    return row.event_id.encode("utf-8"), value, reason


def main(settings: ImportLabelsSettings) -> int:
    from ragpulse.pipeline.review.queue import LabelNotSaved, LabelPublisher
    from ragpulse.pipeline.sinks.kafka import (
        KafkaTopic,
        OutputRecord,
        close_producer,
        deliver,
        new_producer,
    )

    rows = read_rows(settings)
    timeout = settings.kafka_timeout_seconds
    # A topic not there yet holds nothing: each row then needs its judge_rating and version.
    items, _ = read_topic(settings.bootstrap, settings.kafka_security, settings.review_topic,
                          timeout, decode_item, missing_ok=True)
    present, _ = read_topic(settings.bootstrap, settings.kafka_security, settings.labels_topic,
                            timeout, decode_label, missing_ok=True)
    by_event = {item.event_id: item for item in items}
    known = {label.label_id for label in present}
    labels: dict[str, LabelRecord] = {}
    letters: list[tuple[bytes, bytes, str]] = []
    already = 0
    for row in rows:
        made = to_label(row, by_event)
        if isinstance(made, str):
            letters.append(_dead_letter(row, made, str(settings.input)))
        elif made.label_id in known or made.label_id in labels:
            already += 1
        else:
            labels[made.label_id] = made
    if letters:
        producer = new_producer(KafkaTopic(settings.bootstrap, settings.kafka_security,
                                           settings.dead_letter_topic, timeout))
        try:
            d = deliver(producer, settings.dead_letter_topic, [
                OutputRecord(value, key, (("reason", reason.encode("utf-8")),))
                for key, value, reason in letters
            ], timeout_s=timeout)
        finally:
            close_producer(producer, timeout)
        problems = d.refused + d.unacknowledged
        if problems:
            raise SettingsError(f"the dead-letter topic {settings.dead_letter_topic} did not "
                                f"take {len(problems)} row(s): {problems[0][1]}; no label was "
                                "published, run it again")
    publisher = LabelPublisher(KafkaTopic(settings.bootstrap, settings.kafka_security,
                                          settings.labels_topic, timeout))
    try:
        publisher.publish(list(labels.values()))
    except LabelNotSaved as exc:
        raise SettingsError(f"the labels were not saved ({exc}); running it again sends none "
                            "twice") from None
    finally:
        publisher.close()
    reasons = Counter(reason.split(":")[0] for _, _, reason in letters)
    print(f"{settings.input}: {len(rows)} human labels read; {len(labels)} published to "
          f"{settings.labels_topic}, {already} already there, {len(letters)} dead-lettered to "
          f"{settings.dead_letter_topic}"
          + (f" ({'; '.join(f'{n} {why}' for why, n in reasons.items())})" if letters else ""))
    return 0
