"""One OTLP span with a number out of range, or any record that fails to build, is refused with
its reason and never fails the batch: decode, `ragpulse run` and `ragpulse serve`.

Before: `startTimeUnixNano` as a 26-digit string or 1.5e300 made every serve cycle fail
("Integer exceeds 64-bit range": /healthz 503 for good, the other refused records re-published
at every retry) and `ragpulse run` exit 1 with a traceback.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from otlp_spans import openinference_trace, otlp_json, trace_id
from serve_process import caught_up, read_topic, serve_processes_fixture  # noqa: F401
from test_serve import ServeFactory

from ragpulse.pipeline.cli import main
from ragpulse.pipeline.formats.events import InvalidEvent
from ragpulse.pipeline.formats.otlp import decode_spans
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.sources.otlp import collect_traces

HUGE_START_TIMES = ["12345678901234567890123456", 1.5e300, str(2**64), -1, "1e18", True]


def _edit_spans(message: bytes, edit: Any) -> bytes:
    data = orjson.loads(message)
    for rs in data["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                edit(span)
    return orjson.dumps(data)


def with_start(message: bytes, value: object) -> bytes:
    return _edit_spans(message, lambda span: span.update(startTimeUnixNano=value))


def poisoned_trace(value: object) -> bytes:
    """One whole trace, every span of it with `value` as startTimeUnixNano."""
    return with_start(otlp_json(openinference_trace()), value)


@pytest.mark.parametrize("value", HUGE_START_TIMES)
def test_a_start_time_that_is_no_64_bit_count_of_nanoseconds_is_refused_at_decode(
    value: object,
) -> None:
    with pytest.raises(InvalidEvent, match="startTimeUnixNano"):
        decode_spans(poisoned_trace(value), "otlp_json")


def test_start_times_as_the_collector_writes_them_still_decode() -> None:
    message = otlp_json(openinference_trace())
    assert all(p.start_ns > 0 for p in decode_spans(message, "otlp_json"))
    as_number = _edit_spans(
        message, lambda s: s.update(startTimeUnixNano=int(s["startTimeUnixNano"]))
    )
    assert decode_spans(as_number, "otlp_json") == decode_spans(message, "otlp_json")


def test_an_int_attribute_beyond_int64_is_refused_at_decode() -> None:
    def huge_attribute(span: dict[str, Any]) -> None:
        span.setdefault("attributes", []).append(
            {"key": "llm.token_count.total", "value": {"intValue": "9" * 30}}
        )

    message = _edit_spans(otlp_json(openinference_trace()), huge_attribute)
    with pytest.raises(InvalidEvent, match="not an int64"):
        decode_spans(message, "otlp_json")


def test_a_record_that_fails_in_an_unforeseen_way_is_refused_and_the_others_assembled() -> None:
    # input.value as bytes: decodes, but no JSON can hold it (the state store and the
    # assembled event both are JSON): before, the TypeError escaped and failed the batch.
    def bytes_question(span: dict[str, Any]) -> None:
        for kv in span.get("attributes", []):
            if kv["key"] == "input.value":
                kv["value"] = {"bytesValue": base64.b64encode(b"question?").decode()}

    bad = _edit_spans(otlp_json(openinference_trace()), bytes_question)
    good_spans = openinference_trace()
    records = [
        SourceRecord(bad, "t", 0, 0),
        SourceRecord(otlp_json(good_spans), "t", 0, 1),
    ]
    batch = collect_traces(records, (), encoding="otlp_json", now=100.0, wait=0.0, origin="t")

    refused = [r for r in batch.records if r.refused is not None]
    assembled = [r for r in batch.records if r.refused is None]
    assert [r.position for r in refused] == [0]
    assert refused[0].refused is not None
    assert refused[0].refused.startswith("could not decode the OTLP record (TypeError")
    assert [orjson.loads(r.raw)["request_id"] for r in assembled] == [trace_id(good_spans)]


@pytest.mark.slow  # a Beam pipeline
@pytest.mark.parametrize("value", ["12345678901234567890123456", 1.5e300])
def test_ragpulse_run_dead_letters_a_span_with_a_huge_start_time_and_judges_the_rest(
    tmp_path: Path, value: object
) -> None:
    good = openinference_trace()
    src = tmp_path / "spans.jsonl"
    src.write_bytes(poisoned_trace(value) + b"\n" + otlp_json(good) + b"\n")
    out = tmp_path / "out"
    flags = ["--input-format", "otlp_json", "--judges", "groundedness", "--judge-backend", "local"]

    assert main(["run", str(src), "--output", str(out), *flags]) == 0

    verdicts = [orjson.loads(x) for x in (out / "verdicts.jsonl").read_bytes().splitlines()]
    assert [v["request_id"] for v in verdicts] == [trace_id(good)]
    letters = [orjson.loads(x) for x in (out / "dead_letter.jsonl").read_bytes().splitlines()]
    assert len(letters) == 1
    assert "startTimeUnixNano" in letters[0]["reason"]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_serve_refuses_a_span_with_a_huge_start_time_and_keeps_cycling(
    kafka_broker: ApacheKafkaBroker,  # noqa: F811
    serve_processes: ServeFactory,
    tmp_path: Path,
) -> None:
    topic = "spans"
    kafka_broker.create_topic(topic, 1)
    good = [openinference_trace() for _ in range(3)]
    kafka_broker.produce(
        topic,
        [otlp_json(good[0]), poisoned_trace("12345678901234567890123456"),
         poisoned_trace(1.5e300), otlp_json(good[1]), otlp_json(good[2])],
        partition=0,
    )
    serve = serve_processes(
        kafka_broker.bootstrap, topic, tmp_path / "state.sqlite",
        ["--input-format", "otlp_json", "--trace-assembly-wait", "0s", "--window", "10s",
         "--judges", "groundedness"],
    ).start()
    m = serve.wait_for(caught_up(5), 90, "three traces judged and two records refused")
    # Two more cycles after it, none failed.
    ok = m.total("ragpulse_cycles_total", outcome="ok")
    m = serve.wait_for(lambda s: s.total("ragpulse_cycles_total", outcome="ok") >= ok + 2, 60)

    assert m.value("ragpulse_events_total", outcome="accepted") == 3
    assert m.value("ragpulse_events_total", outcome="invalid") == 2
    assert m.total("ragpulse_cycles_total", outcome="failed") == 0
    assert serve.healthz()[0] == 200
    letters = read_topic(kafka_broker.bootstrap, f"{topic}.dlq", 2)
    reasons = sorted(dict(x.headers)["reason"].decode() for x in letters)
    assert len(reasons) == 2 and all("startTimeUnixNano" in r for r in reasons)
    assert serve.terminate() == 0
