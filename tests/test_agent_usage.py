"""The chatbot's own cost and latency: token counts and answer time read from the events,
exported per app and model over every accepted event (sampled or not), beside the judges'."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ragpulse.pipeline.cli import main


def _event(i: int, model: str, **extra: object) -> bytes:
    return orjson.dumps({
        "request_id": f"req-{i}", "timestamp": "2025-11-20T10:00:00Z", "app": "faq",
        "model": model, "request": "How long are deleted files kept?",
        "response": "Deleted files are kept for 30 days.", **extra,
    })


@pytest.mark.slow  # runs a Beam pipeline
def test_ragpulse_run_exports_the_chatbots_tokens_and_latency_per_app_and_model(
    tmp_path: Path,
) -> None:
    completion = {"choices": [{"message": {"role": "assistant", "content": "Kept 30 days."}}],
                  "usage": {"prompt_tokens": 300, "completion_tokens": 20, "total_tokens": 320}}
    src = tmp_path / "events.jsonl"
    src.write_bytes(b"\n".join([
        _event(1, "m1", usage={"input_tokens": 1000, "output_tokens": 50}, latency_seconds=0.4),
        _event(2, "m1", usage={"input_tokens": 2000, "output_tokens": 150}, latency_seconds=2.5),
        _event(3, "m2", response=completion, latency_seconds=9.0),
        _event(4, "m2"),  # says nothing of its cost: counted in no agent series
    ]) + b"\n")
    out = tmp_path / "out"
    # A sample rate far below 1: the agent's cost is counted over every accepted event.
    assert main(["run", str(src), "--output", str(out), "--judge-backend", "local",
                 "--sample-rate", "0.0001"]) == 0
    samples = {
        (s.name, s.labels.get("model"), s.labels.get("le")): s.value
        for f in text_string_to_metric_families((out / "metrics.prom").read_text())
        for s in f.samples if s.name.startswith("ragpulse_agent_")
    }
    assert samples[("ragpulse_agent_input_tokens_total", "m1", None)] == 3000
    assert samples[("ragpulse_agent_output_tokens_total", "m1", None)] == 200
    assert samples[("ragpulse_agent_total_tokens_total", "m1", None)] == 3200
    assert samples[("ragpulse_agent_usage_events_total", "m1", None)] == 2
    assert samples[("ragpulse_agent_total_tokens_total", "m2", None)] == 320
    assert samples[("ragpulse_agent_usage_events_total", "m2", None)] == 1
    assert samples[("ragpulse_agent_latency_seconds_count", "m1", None)] == 2
    assert samples[("ragpulse_agent_latency_seconds_sum", "m1", None)] == pytest.approx(2.9)
    assert samples[("ragpulse_agent_latency_seconds_bucket", "m1", "0.5")] == 1
    assert samples[("ragpulse_agent_latency_seconds_bucket", "m1", "3.0")] == 2
    assert samples[("ragpulse_agent_latency_seconds_bucket", "m2", "8.0")] == 0
    assert samples[("ragpulse_agent_latency_seconds_bucket", "m2", "13.0")] == 1
