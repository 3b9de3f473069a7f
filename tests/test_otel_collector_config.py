"""The OpenTelemetry Collector configuration shipped in deploy/otel-collector/ routes traces to
the topic and in the encoding that `ragpulse serve` is told to read: its structure, and its
values against ragpulse's CLI. (A real Collector runs it: tests/test_otel_collector.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ragpulse.pipeline.cli import build_parser
from ragpulse.pipeline.settings.command_flags import SERVE, settings_from
from ragpulse.pipeline.settings.flags import default_of
from ragpulse.pipeline.settings.models import BatchSettings

CONFIG = Path(__file__).resolve().parent.parent / "deploy" / "otel-collector" / "config.yaml"


def config() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(CONFIG.read_text(encoding="utf-8"))
    return loaded


def ragpulse_exporters(cfg: dict[str, Any]) -> list[dict[str, Any]]:
    """The kafka exporters that a traces pipeline uses, each checked to be defined."""
    found = []
    for name, pipeline in cfg["service"]["pipelines"].items():
        if name.split("/")[0] != "traces":
            continue
        for receiver in pipeline["receivers"]:
            assert receiver in cfg["receivers"], f"pipeline {name}: undefined {receiver}"
        for processor in pipeline.get("processors", ()):
            assert processor in cfg["processors"], f"pipeline {name}: undefined {processor}"
        for exporter in pipeline["exporters"]:
            assert exporter in cfg["exporters"], f"pipeline {name}: undefined {exporter}"
            if exporter.split("/")[0] == "kafka":
                found.append(cfg["exporters"][exporter])
    return found


def serve_settings(topic: str, encoding: str) -> Any:
    args = build_parser().parse_args(
        ["serve", "--kafka-bootstrap", "kafka:9092", "--topic", topic, "--input-format", encoding]
    )
    return settings_from(SERVE, args)


def test_the_traces_pipeline_publishes_to_kafka_in_an_encoding_ragpulse_reads() -> None:
    (kafka,) = ragpulse_exporters(config())
    topic, encoding = kafka["traces"]["topic"], kafka["traces"]["encoding"]
    settings = serve_settings(topic, encoding)
    assert (settings.topic, settings.input_format) == (topic, encoding)
    assert encoding in ("otlp_json", "otlp_proto")
    # One partition per trace, so that the instance reading it sees every span of it.
    assert kafka["partition_traces_by_id"] is True
    # A message over ragpulse's record limit would be dead-lettered for its size.
    assert kafka["producer"]["max_message_bytes"] <= default_of(BatchSettings, "max_event_bytes")


def test_an_encoding_ragpulse_cannot_read_is_refused_by_its_flag() -> None:
    # The Kafka exporter also offers these; a config switched to one must fail the check above.
    for other in ("raw", "jaeger_proto", "zipkin_json"):
        with pytest.raises(SystemExit):
            serve_settings("ragpulse.spans", other)
