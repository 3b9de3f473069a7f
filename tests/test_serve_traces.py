"""`ragpulse serve --input-format otlp_proto` against a real Apache Kafka broker: the spans of one
trace, made by the OpenTelemetry SDK, arrive out of order in separate Kafka records read by
different cycles, and across a SIGKILL; they are judged once, as one answer, after the wait.
What cannot be assembled, and records that are not OTLP, are dead-lettered with a reason."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import orjson
import pytest
from kafka_broker import ApacheKafkaBroker, for_module
from otlp_receiver import OtlpReceiver, attributes
from otlp_spans import openinference_trace, otlp_proto, trace_id
from serve_process import Scrape, TopicFactory, saved_offsets, wait_until

from ragpulse.pipeline.service.state import StateStore

pytestmark = pytest.mark.timeout(180)

GROUNDED = "QP-1457 quality records are retained for ten years."
FLAGS = (
    "--input-format", "otlp_proto",
    "--judges", "groundedness",
    "--publish-verdicts", "all",
    "--allowed-lateness", "10m",
)  # fmt: skip


@pytest.fixture(scope="module")
def broker(apache_kafka: ApacheKafkaBroker) -> Iterator[ApacheKafkaBroker]:
    yield from for_module(apache_kafka)


@pytest.fixture()
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as server:
        yield server


def read_up_to(state_file: Path, topic: str, offset: int) -> Callable[[], bool]:
    """True once serve has saved the offsets (and so the spans) up to `offset` of partition 0."""
    return lambda: saved_offsets(state_file, topic).get(0) == offset


def pending(state_file: Path, topic: str) -> list[str]:
    with StateStore(state_file) as store:
        return sorted(a.part.span_id for a in store.pending_spans(topic))


def accepted(m: Scrape) -> float:
    return m.value("ragpulse_events_total", outcome="accepted") or 0.0


def test_spans_arriving_out_of_order_over_several_cycles_are_judged_as_one_answer(
    served_topic: TopicFactory, receiver: OtlpReceiver
) -> None:
    topic = served_topic("spans")
    # A wait long enough for the three steps below to happen inside it, however slow the
    # machine: the trace is judged once it is over, counted from its first span's read.
    serve = topic.serve(
        *FLAGS, "--trace-assembly-wait", "15s", "--evaluation-events-endpoint", receiver.url
    )
    retriever, llm, root = openinference_trace(answer=GROUNDED)  # the SDK's end order
    rootless = [s for s in openinference_trace() if s.parent is not None]

    topic.produce([otlp_proto([root])])
    wait_until(read_up_to(topic.state, topic.name, 1), "the root span saved as pending")
    assert pending(topic.state, topic.name) == [f"{root.context.span_id:016x}"]
    serve.wait_for(lambda m: m.value("ragpulse_traces_pending") == 1, 10, "the gauge")

    topic.produce([otlp_proto([llm]), b"\x0a\xff not protobuf", otlp_proto(rootless)])
    wait_until(read_up_to(topic.state, topic.name, 4), "the next records read")
    topic.produce([otlp_proto([retriever])])
    # The record that is not OTLP was dead-lettered in the cycle that read it (its counts are
    # saved with its offsets); the trace is still waiting for the retriever.
    m = serve.wait_for(lambda m: m.total("ragpulse_events_total") >= 1, 30, "garbage")
    assert m.value("ragpulse_events_total", outcome="invalid") == 1 and accepted(m) == 0

    m = serve.wait_for(lambda m: m.total("ragpulse_events_total") >= 3, 60, "both traces out")
    assert accepted(m) == 1
    assert m.value("ragpulse_events_total", outcome="invalid") == 2
    assert m.total("ragpulse_judge_verdicts_total", app="support-bot", model="gpt-4o-mini") == 1

    (verdict,) = [orjson.loads(r.value) for r in topic.read("verdicts", 1)]
    assert verdict["request_id"] == trace_id([root])
    # Grounded in the retriever's documents, which arrived last: the parts were put together.
    assert verdict["response/llm_judged/groundedness/rating"] == "yes"
    letters = topic.read("dlq", 2)
    reasons = sorted(dict(r.headers)["reason"].decode() for r in letters)
    assert reasons[0].startswith("record is not an OTLP protobuf ExportTraceServiceRequest")
    assert reasons[1].startswith(f"trace {trace_id(rootless)}: no root span arrived within 15s")
    assert pending(topic.state, topic.name) == []
    serve.wait_for(lambda m: m.value("ragpulse_traces_pending") == 0, 10, "the gauge")
    # The verdict, as a gen_ai.evaluation.result event on the span that gave the answer.
    (event,) = receiver.wait_for_records(1)
    assert (event.trace_id.hex(), event.span_id.hex()) == (
        trace_id([root]),
        f"{root.context.span_id:016x}",
    )
    assert attributes(event)["gen_ai.evaluation.name"] == "groundedness"
    assert attributes(event)["gen_ai.evaluation.score.label"] == "yes"

    # The Collector sends the root again (a retry after the wait): not judged twice.
    topic.produce([otlp_proto([root])])
    m = serve.wait_for(lambda m: m.total("ragpulse_events_total") >= 4, 30, "the repeat")
    assert accepted(m) == 1 and m.value("ragpulse_events_total", outcome="invalid") == 3
    # Read back in partition order, not in the order they were written: look for it among all.
    reasons = [dict(r.headers)["reason"] for r in topic.read("dlq", 3)]
    assert sum(b"arrived after the trace was assembled" in r for r in reasons) == 1, reasons
    assert serve.terminate() == 0


def test_pending_spans_survive_a_kill_and_the_trace_is_counted_once(
    served_topic: TopicFactory,
) -> None:
    topic = served_topic("spans-kill")
    retriever, llm, root = openinference_trace(answer=GROUNDED)
    first = topic.serve(*FLAGS, "--trace-assembly-wait", "6s")
    topic.produce([otlp_proto([llm, root])])
    wait_until(read_up_to(topic.state, topic.name, 1), "the first spans saved")
    first.kill()  # SIGKILL: nothing but the state file carries the spans on

    topic.produce([otlp_proto([retriever])])
    second = topic.serve(*FLAGS, "--trace-assembly-wait", "6s")
    m = second.wait_for(lambda m: accepted(m) >= 1, 60, "the trace judged")
    # A few more cycles: a replay or a second assembly would show up as a second count.
    cycles = m.total("ragpulse_cycles_total")
    m = second.wait_for(lambda m: m.total("ragpulse_cycles_total") >= cycles + 4, 30, "cycles")
    assert accepted(m) == 1 and m.total("ragpulse_events_total") == 1
    (verdict,) = [orjson.loads(r.value) for r in topic.read("verdicts", 1)]
    assert verdict["request_id"] == trace_id([root])
    assert verdict["response/llm_judged/groundedness/rating"] == "yes"
    assert pending(topic.state, topic.name) == []
    assert second.terminate() == 0
