"""serve's lookahead starts calls only for the events the next cycle's ParseEvents judges: on any
record (valid, invalid, oversize, late, future-dated, in any sampling stratum), the record the
lookahead picks and the events the real Beam stage keeps are the same
(pipeline/service/lookahead.py, `judge_input_ahead`; pipeline/stages/parse.py, `ParseEvents`)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import apache_beam as beam
import orjson
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.service.lookahead import judge_input_ahead
from ragpulse.pipeline.settings.models import JudgeSettings, ServeSettings
from ragpulse.pipeline.stages.parse import AdmissionRules, ParseEvents

NOW = time.time()
CUTOFF = NOW - 3_600.0  # windows ending an hour ago are final
MAX_BYTES = 2_048

RULES = """
rules:
  - {name: unhappy, when: {feedback: negative}, rate: 1.0}
  - {name: new_model, when: {model: m2}, rate: 0.3}
default_rate: 0.5
"""

record = st.fixed_dictionaries(
    {
        "request_id": st.text(alphabet="abcdef0123456789", min_size=1, max_size=12),
        "offset": st.sampled_from([-7_200.0, -30.0, 0.0, 600.0, 86_400.0 * 365]),
        "model": st.sampled_from(["m1", "m2"]),
        "feedback": st.sampled_from([None, "negative", "positive"]),
        "session_id": st.sampled_from([None, "s1", "s2"]),
        "shape": st.sampled_from(["event", "event", "event", "not json", "no response", "huge"]),
    }
)


def raw(r: Mapping[str, object]) -> bytes:
    if r["shape"] == "not json":
        return b"{not json"
    event: dict[str, object] = {
        "request_id": r["request_id"],
        "timestamp": round((NOW + float(r["offset"])) * 1000),  # type: ignore[arg-type]
        "app": "a",
        "model": r["model"],
        "request": "How do I export a report?",
        "response": "x" * (3 * MAX_BYTES) if r["shape"] == "huge" else "Open it and export.",
    }
    if r["shape"] == "no response":
        del event["response"]
    for field in ("feedback", "session_id"):
        if r[field] is not None:
            event[field] = r[field]
    return orjson.dumps(event)


def serve_settings(tmp_path: Path) -> ServeSettings:
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    return ServeSettings(
        judges=JudgeSettings(backend="local"),
        bootstrap="127.0.0.1:9",
        topic="t",
        dead_letter_topic="t.dlq",
        verdicts_topic="t.verdicts",
        sample_rate=0.5,
        sampling=rules,
        max_event_bytes=MAX_BYTES,
        window_seconds=60.0,
    )


def rules(s: ServeSettings) -> AdmissionRules:
    """A cycle's admission rules as serve builds them (its cut-off, its clock): what its graph
    and, with the clock read per record, its lookahead (`Lookahead.cycle_started`) use."""
    return s.stage_config(closed_before=CUTOFF).admitting(now=NOW).admission


@pytest.mark.slow  # five Beam pipelines
@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(record, min_size=1, max_size=40, unique_by=lambda r: r["request_id"]))
def test_the_lookahead_calls_for_exactly_the_events_parse_events_judges(
    tmp_path: Path, records: list[dict[str, object]]
) -> None:
    s = serve_settings(tmp_path)
    payloads = [raw(r) for r in records]
    ahead = sorted(
        orjson.loads(p)["request_id"]
        for p in payloads
        if judge_input_ahead(p, NOW, rules(s), s.topic) is not None
    )
    sources = [
        SourceRecord(p, "t", 0, i, NOW, len(p) if len(p) > MAX_BYTES else None)
        for i, p in enumerate(payloads)
    ]
    with TestPipeline() as p:
        parsed = p | beam.Create(sources) | ParseEvents(rules(s))
        assert_that(parsed.events | beam.Map(lambda e: e.request_id), equal_to(ahead))
    # Every kind of decision was exercised across the examples (checked in the test below).


def test_the_records_cover_every_decision(tmp_path: Path) -> None:
    s = serve_settings(tmp_path)
    base = {"request_id": "r", "model": "m1", "feedback": None, "session_id": None}
    kept = {**base, "offset": 0.0, "shape": "event", "feedback": "negative"}  # rate 1.0
    for refused in ({**kept, "shape": "not json"}, {**kept, "shape": "huge"},
                    {**kept, "shape": "no response"}, {**kept, "offset": -7_200.0},
                    {**kept, "offset": 86_400.0 * 365}):
        assert judge_input_ahead(raw(refused), NOW, rules(s), s.topic) is None, refused
    assert judge_input_ahead(raw(kept), NOW, rules(s), s.topic) is not None
    unsampled = [i for i in range(40)
                 if judge_input_ahead(raw({**base, "request_id": f"r{i}", "offset": 0.0,
                                           "shape": "event", "model": "m2"}),
                                      NOW, rules(s), s.topic) is None]
    assert 0 < len(unsampled) < 40  # the 0.3 stratum keeps some and leaves some out
