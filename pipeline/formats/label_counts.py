"""The label-count row: one counter of the reviewers' labels as `ragpulse stream` publishes it to
the ratings topic, beside the window panes, and `ragpulse exporter` reads it back.

The stream counts labels in a global window with accumulating panes (`pipeline.stages.labels`):
each row holds the counter's whole value so far, never an increment, so a row read twice, out
of order or after a restarted worker changes nothing: the exporter keeps the largest value of
each counter (counts only grow). The counters are serve's: `ragpulse_review_labels_total`
(judge, version, slice, human, rating), `ragpulse_review_label_grades_total` (judge, version,
slice, grade, rating) and `ragpulse_review_labels_read_total` (outcome).

A row starts with `{"row":"label_count"` (orjson keeps the field order), which tells it from a
rating row without parsing it twice. The Kafka key is the counter's identity, so a compacted
ratings topic keeps each counter's latest row.
"""

from __future__ import annotations

import orjson

from ragpulse.pipeline.formats.events import MAX_LABEL_CHARS
from ragpulse.pipeline.metrics import catalogue, counting

_KIND = "label_count"
_PREFIX = b'{"row":"label_count"'
# The counters a label-count row may carry, and the label names of each.
_COUNTERS: dict[str, frozenset[str]] = {
    catalogue.REVIEW_LABELS: frozenset({"judge", "version", "slice", "human", "rating"}),
    catalogue.REVIEW_LABELS_READ: frozenset({"outcome"}),
    catalogue.REVIEW_LABEL_GRADES: frozenset({"judge", "version", "slice", "grade", "rating"}),
}


class InvalidLabelCount(ValueError):
    """A label-count row that is not one; the message says what is wrong."""


def is_label_count(value: bytes) -> bool:
    """Whether a ratings-topic value is a label-count row (not a rating row)."""
    return value.startswith(_PREFIX)


def encode(counter: counting.CounterKey, value: int) -> tuple[bytes, bytes]:
    """(Kafka key, value) of a counter's value so far."""
    name, labels = counter
    return (
        orjson.dumps([_KIND, name, labels]),
        orjson.dumps({"row": _KIND, "counter": name, "labels": dict(labels), "value": value}),
    )


def decode(value: bytes) -> tuple[counting.CounterKey, int]:
    """(counter key, value so far) of a label-count row; InvalidLabelCount says what is wrong."""
    try:
        row = orjson.loads(value)
        name, labels, count = row["counter"], row["labels"], row["value"]
    except orjson.JSONDecodeError as exc:
        raise InvalidLabelCount(f"not JSON: {exc}") from None
    except (KeyError, TypeError) as exc:
        raise InvalidLabelCount(f"not a label-count row: missing {exc}") from None
    if row.get("row") != _KIND:
        raise InvalidLabelCount(f"row must be {_KIND!r}")
    if name not in _COUNTERS:
        raise InvalidLabelCount(f"counter {str(name)[:100]!r} is not a label counter")
    # A named guideline's judge ("j/name") is counted as judge j and guideline name.
    if not isinstance(labels, dict) or set(labels) - {"guideline"} != _COUNTERS[name]:
        raise InvalidLabelCount(f"labels of {name} must be {', '.join(sorted(_COUNTERS[name]))}")
    for label, text in labels.items():
        if not isinstance(text, str) or len(text) > MAX_LABEL_CHARS:
            raise InvalidLabelCount(
                f"label {label} must be a string of at most {MAX_LABEL_CHARS} characters"
            )
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise InvalidLabelCount("value must be an integer >= 0")
    return (name, tuple(sorted(labels.items()))), count
