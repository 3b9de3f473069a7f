"""Verdicts as OpenTelemetry `gen_ai.evaluation.result` events, sent to an OTLP/HTTP endpoint.

For teams whose answers come from traces (`--input-format otlp_*`): with
`--evaluation-events-endpoint URL` (e.g. a Collector's http://collector:4318/v1/logs), serve
sends one event per judge verdict, carrying the trace id and span id of the judged answer, so
the tracing backend shows the evaluation on the trace. Each event is an OTLP log record named
`gen_ai.evaluation.result` (GenAI semantic conventions) with the attributes

    gen_ai.evaluation.name          the judge (groundedness, safety, ...)
    gen_ai.evaluation.score.label   yes or no (absent for error)
    gen_ai.evaluation.score.value   1.0 for yes, 0.0 for no (absent for error)
    gen_ai.evaluation.explanation   the rationale, as --store-text allows (redacted by default;
                                    absent with --store-text none)
    error.type                      the error cause, when the judge could not rate

Events whose request id is not a trace id (32 hex digits) or that have no span id are not
judged answers of a trace and are not sent. Rationales may quote the question or the answer:
they are the verdict rows' rationales, under the same text policy, never more.

Delivery is that of the other outputs (pipeline/sinks/kafka.py): each bundle's events are sent
in one ExportLogsServiceRequest before the bundle ends; a status the endpoint may get over
(408, 429, 5xx, no connection) is handed to serve as unacknowledged, which retries the cycle
and, after --undeliverable-after, counts them in
`ragpulse_dead_letters_undeliverable_total{topic=<endpoint>}`; other refusals are counted there
at once.
"""

from __future__ import annotations

import logging
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

import apache_beam as beam
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.logs.v1.logs_pb2 import LogRecord, ResourceLogs, ScopeLogs
from opentelemetry.proto.resource.v1.resource_pb2 import Resource

from ragpulse.judges import TextPolicy
from ragpulse.judges.endpoint.retry import CallFailure, is_retryable
from ragpulse.pipeline.formats.verdict_rows import verdict_row
from ragpulse.pipeline.records import JudgedEvent
from ragpulse.pipeline.sinks.kafka import (
    SendPerBundle,
    count_unacknowledged,
    count_undeliverable,
)

log = logging.getLogger(__name__)

EVENT_NAME = "gen_ai.evaluation.result"
_SCORES = {"yes": 1.0, "no": 0.0}
_HEX = frozenset("0123456789abcdef")


def is_linked(judged: JudgedEvent) -> bool:
    """True when the event names the span of a trace: a 32-hex-digit request id and a span id."""
    rid = judged.record.request_id
    return judged.record.span_id is not None and len(rid) == 32 and set(rid) <= _HEX


def evaluation_request(
    judged: Iterable[JudgedEvent], policy: TextPolicy, now_ns: int
) -> ExportLogsServiceRequest:
    """One OTLP logs request with a `gen_ai.evaluation.result` record per verdict of `judged`
    (events that `is_linked`); explanations follow `policy` as the verdict rows do."""
    records = []
    for event in judged:
        row = verdict_row(event, policy)
        trace_id = bytes.fromhex(event.record.request_id)
        span_id = bytes.fromhex(event.record.span_id or "")
        for v in event.verdicts:
            if v.rating == "skipped":  # the judge did not run on this answer: no evaluation
                continue
            attributes = [_kv("gen_ai.evaluation.name", v.judge)]
            if v.rating in _SCORES:
                # A graded scale's score (0-3, 1-5, a composite's 0..1), else yes 1 / no 0.
                value = v.score if v.score is not None else _SCORES[v.rating]
                attributes.append(_kv("gen_ai.evaluation.score.label", v.rating))
                attributes.append(_kv("gen_ai.evaluation.score.value", value))
            else:
                attributes.append(_kv("error.type", v.error_cause or "error"))
            explanation = row[f"response/llm_judged/{v.judge}/rationale"]
            if explanation:
                attributes.append(_kv("gen_ai.evaluation.explanation", explanation))
            records.append(
                LogRecord(
                    time_unix_nano=now_ns,
                    observed_time_unix_nano=now_ns,
                    event_name=EVENT_NAME,
                    trace_id=trace_id,
                    span_id=span_id,
                    attributes=attributes,
                )
            )
    return ExportLogsServiceRequest(
        resource_logs=[
            ResourceLogs(
                resource=Resource(attributes=[_kv("service.name", "ragpulse")]),
                scope_logs=[
                    ScopeLogs(scope=InstrumentationScope(name="ragpulse"), log_records=records)
                ],
            )
        ]
    )


def _kv(key: str, value: str | float) -> KeyValue:
    any_value = (
        AnyValue(double_value=value) if isinstance(value, float) else AnyValue(string_value=value)
    )
    return KeyValue(key=key, value=any_value)


def describe_endpoint(url: str) -> str:
    """The endpoint as logs and metric labels name it: without user info, query or fragment,
    which may hold credentials."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def post(url: str, body: bytes, timeout_s: float) -> CallFailure | None:
    """POST one OTLP/HTTP protobuf request; None when the endpoint accepted it."""
    request = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/x-protobuf"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            reply.read()
    except urllib.error.HTTPError as exc:
        return CallFailure("status", status=exc.code, detail=exc.reason)
    except (OSError, TimeoutError) as exc:
        return CallFailure("connection", detail=type(exc).__name__)
    return None


class _Export(SendPerBundle):
    def __init__(self, url: str, policy: TextPolicy, timeout_s: float) -> None:
        self._url = url
        self._policy = policy
        self._timeout_s = timeout_s

    def send(self, events: list[JudgedEvent]) -> None:
        request = evaluation_request(events, self._policy, time.time_ns())
        n = sum(len(e.verdicts) for e in events)
        failure = post(self._url, request.SerializeToString(), self._timeout_s)
        where = describe_endpoint(self._url)
        if failure is None:
            log.info("sent %d evaluation events to %s", n, where)
            return
        why = f"HTTP {failure.status}" if failure.kind == "status" else str(failure.detail)
        if is_retryable(failure):
            count_unacknowledged(where, why, n)
            return
        log.error("%d evaluation events refused by %s (%s) and dropped", n, where, why)
        count_undeliverable(where, n)


class ExportEvaluations(beam.PTransform):
    """Sink: the verdicts of judged answers from traces as `gen_ai.evaluation.result` events,
    POSTed as OTLP/HTTP protobuf to `url` (see the module docstring)."""

    # A class, not a `composite_transform`: that would show `url`, which may hold credentials
    # (`describe_endpoint`), as display data in the runner's UI.
    def __init__(self, url: str, policy: TextPolicy, timeout_s: float = 10.0) -> None:
        super().__init__()
        self._url = url
        self._policy = policy
        self._timeout_s = timeout_s

    def expand(self, judged: Any) -> Any:
        return (
            judged
            | "FromTraces" >> beam.Filter(is_linked)
            | "Send" >> beam.ParDo(_Export(self._url, self._policy, self._timeout_s))
        )
