"""deploy/otel-collector/config.yaml run by a real OpenTelemetry Collector (built by
`make otelcol` with the Collector Builder from deploy/otel-collector/builder-config.yaml): the
OpenTelemetry SDK exports a chatbot's traces over OTLP/HTTP to it, its kafka exporter publishes
them to the test's broker (endpoints through the config's environment variables), and
`ragpulse serve --input-format otlp_proto` judges each trace exactly once."""

from __future__ import annotations

import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from kafka_broker import ApacheKafkaBroker
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from pinned_tools import REPO, otelcol
from processes import free_port, stop_process
from serve_process import ServeProcess, read_topic

pytestmark = [pytest.mark.collector, pytest.mark.slow, pytest.mark.timeout(300)]

CONFIG = REPO / "deploy" / "otel-collector" / "config.yaml"
READY = "Everything is ready. Begin running and processing data."
TRACES = 12
ANSWER = "QP-1457 quality records are retained for ten years."
DOC = "QP-1457: quality records are retained for ten years."


def spans_topic() -> str:
    exporter = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))["exporters"]["kafka/ragpulse"]
    return str(exporter["traces"]["topic"])


class Collector:
    """The built Collector on deploy/otel-collector/config.yaml, its OTLP receivers on free
    loopback ports and its exporter on `bootstrap`; its own metrics server switched off (a
    fixed port, :8888, that parallel tests would share)."""

    def __init__(self, bootstrap: str) -> None:
        self.http_port, self.grpc_port = free_port(), free_port()
        self.env = {"KAFKA_BROKERS": bootstrap,
                    "OTLP_HTTP_ENDPOINT": f"127.0.0.1:{self.http_port}",
                    "OTLP_GRPC_ENDPOINT": f"127.0.0.1:{self.grpc_port}"}
        handle = tempfile.NamedTemporaryFile(prefix="otelcol-", suffix=".log", delete=False)  # noqa: SIM115
        handle.close()
        self.log_path = Path(handle.name)
        self.process: subprocess.Popen[bytes] | None = None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def start(self, timeout: float = 60.0) -> None:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [str(otelcol()), "--config", f"file:{CONFIG}",
                 "--set", "service.telemetry.metrics.level=none"],
                stdout=log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while READY not in self.log_text():
            if self.process.poll() is not None:
                raise AssertionError(f"the Collector exited ({self.process.returncode}):\n"
                                     f"{self.log_text()}")
            assert time.monotonic() < deadline, f"Collector not ready:\n{self.log_text()}"
            time.sleep(0.1)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        stop_process(self.process)
        return self.process.returncode


@pytest.fixture()
def collector(kafka_broker: Any) -> Iterator[Collector]:
    running = Collector(kafka_broker.bootstrap)
    try:
        running.start()
        yield running
    finally:
        running.stop()
        print(f"--- Collector log ---\n{running.log_text()}")
        running.log_path.unlink(missing_ok=True)


def send_traces(endpoint: str, count: int) -> list[str]:
    """`count` RAG traces (root CHAIN, RETRIEVER and LLM children, OpenInference attributes)
    exported by the SDK's OTLP/HTTP exporter; their trace ids (32 hex digits)."""
    provider = TracerProvider(resource=Resource.create({"service.name": "support-bot"}))
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("ragpulse-tests")
    ids = []
    for i in range(count):
        question = f"How long are QP-1457 quality records kept? ({i})"
        with tracer.start_as_current_span("rag-query") as root:
            root.set_attribute("openinference.span.kind", "CHAIN")
            root.set_attribute("input.value", question)
            with tracer.start_as_current_span("retrieve") as retriever:
                retriever.set_attribute("openinference.span.kind", "RETRIEVER")
                retriever.set_attribute("retrieval.documents.0.document.id", "kb/qp-1457")
                retriever.set_attribute("retrieval.documents.0.document.content", DOC)
            with tracer.start_as_current_span("llm") as llm:
                llm.set_attribute("openinference.span.kind", "LLM")
                llm.set_attribute("llm.model_name", "gpt-4o-mini")
                llm.set_attribute("output.value", ANSWER)
            root.set_attribute("output.value", ANSWER)
            ids.append(f"{root.get_span_context().trace_id:032x}")
    assert provider.force_flush(30_000), "the SDK could not export its spans to the Collector"
    provider.shutdown()
    return ids


def test_sdk_spans_go_through_the_collector_and_kafka_and_each_trace_is_judged_once(
    kafka_broker: ApacheKafkaBroker,
    collector: Collector,
    serve_processes: Callable[..., ServeProcess],
    tmp_path: Path,
) -> None:
    topic = spans_topic()
    kafka_broker.create_topic(topic, partitions=2)
    ids = send_traces(f"http://127.0.0.1:{collector.http_port}", TRACES)
    serve = serve_processes(
        kafka_broker.bootstrap, topic, tmp_path / "state.sqlite",
        ["--input-format", "otlp_proto", "--judges", "groundedness", "--window", "10s",
         "--publish-verdicts", "all", "--trace-assembly-wait", "5s",
         "--allowed-lateness", "10m"],
    ).start()

    def accepted(m: Any) -> float:
        return m.value("ragpulse_events_total", outcome="accepted") or 0.0

    m = serve.wait_for(lambda m: accepted(m) >= TRACES, 120, f"{TRACES} traces judged")
    # More cycles after the last trace: a span read twice or a trace assembled twice would
    # show up as another count.
    cycles = m.total("ragpulse_cycles_total")
    m = serve.wait_for(lambda m: m.total("ragpulse_cycles_total") >= cycles + 4, 60, "cycles")
    assert accepted(m) == TRACES and m.total("ragpulse_events_total") == TRACES
    assert m.value("ragpulse_traces_pending") == 0
    assert m.total("ragpulse_judge_verdicts_total", judge="groundedness") == TRACES
    verdicts = [orjson.loads(r.value) for r in read_topic(
        kafka_broker.bootstrap, f"{topic}.verdicts", TRACES)]
    assert sorted(v["request_id"] for v in verdicts) == sorted(ids)
    assert {v["response/llm_judged/groundedness/rating"] for v in verdicts} == {"yes"}
    assert serve.terminate() == 0
    assert collector.stop() == 0
