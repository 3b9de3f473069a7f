"""`ragpulse run` end to end (FnApiRunner) with the openai backend on a misbehaving stand-in:
malformed replies and an echoed API key become error rows with a cause, the run exits 0, and
the circuit breaker outlives one pipeline, as it must for serve's pipeline per cycle."""

from __future__ import annotations

import base64
import logging
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from fake_openai import FakeOpenAI, Fault, fake_openai_fixture  # noqa: F401
from prometheus_client.parser import text_string_to_metric_families
from test_file_run import event, rows

from ragpulse.judges.endpoint.client import forget_shared_endpoint_states
from ragpulse.pipeline.cli import main

SECRET = "sk-live-RUN-ECHO-0123456789abcdef"


@pytest.fixture(autouse=True)
def _fresh_breakers_and_quotas() -> Iterator[None]:
    forget_shared_endpoint_states()
    yield
    forget_shared_endpoint_states()


def run(src: Path, out: Path, server: FakeOpenAI, *extra: str) -> int:
    return main(
        [
            "run",
            str(src),
            "--output",
            str(out),
            "--judge-backend",
            "openai",
            "--judge-base-url",
            server.base_url,
            "--judges",
            "groundedness",
            "--judge-concurrency",
            "1",  # faults reach events in file order
            # The events differ only in request_id: one call per event, not one verdict
            # given again from the cache.
            "--judge-cache-size",
            "0",
            "--judge-max-retries",
            "0",
            *extra,
        ]
    )


def error_counts(out: Path) -> dict[str, float]:
    return {
        s.labels["cause"]: s.value
        for f in text_string_to_metric_families((out / "metrics.prom").read_text())
        for s in f.samples
        if s.name == "ragpulse_judge_errors_total"
    }


@pytest.mark.slow
def test_malformed_replies_and_an_echoed_key_become_error_rows_with_causes_and_the_run_exits_0(
    fake_openai: FakeOpenAI,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    fake_openai.push_faults(
        Fault.html(),
        Fault.raw_body({"choices": [{"message": "yes", "finish_reason": "stop"}]}),
        Fault.reply('{"rationale": "ok", "rating": "yes"}', usage={"prompt_tokens": -9}),
        Fault.http(400, message="bad request from {authorization}"),
        Fault.reply('{"rationale": "Key {authorization} seen.", "rating": "no"}'),
    )
    src = tmp_path / "events.jsonl"
    src.write_bytes(b"\n".join(event(i) for i in range(8)) + b"\n")
    out = tmp_path / "out"
    assert run(src, out, fake_openai) == 0

    verdicts = sorted(rows(out / "verdicts.jsonl"), key=lambda r: r["request_id"])
    assert len(verdicts) == 8
    prefix = "response/llm_judged/groundedness"
    by_id = {r["request_id"]: r for r in verdicts}
    assert by_id["req-0"][f"{prefix}/rating"] == "error"
    assert by_id["req-0"][f"{prefix}/error_cause"] == "malformed"
    assert "text/html" in by_id["req-0"][f"{prefix}/error_message"]
    assert by_id["req-1"][f"{prefix}/error_cause"] == "malformed"
    assert "message" in by_id["req-1"][f"{prefix}/error_message"]
    assert by_id["req-2"][f"{prefix}/rating"] == "yes"  # odd usage does not cost the verdict
    assert by_id["req-3"][f"{prefix}/error_cause"] == "client_error"
    assert by_id["req-4"][f"{prefix}/rationale"] == "Key Bearer [redacted] seen."
    assert error_counts(out) == {"malformed": 2, "client_error": 1}

    outputs = b"".join(p.read_bytes() for p in out.iterdir())
    for form in (SECRET, base64.b64encode(SECRET.encode()).decode().rstrip("=")):
        assert form.encode() not in outputs
        assert form not in caplog.text
    assert fake_openai.requests[0].headers["authorization"] == f"Bearer {SECRET}"


@pytest.mark.slow
def test_an_open_breaker_outlives_the_pipeline_so_the_next_run_sends_nothing(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    fake_openai.push_faults(*[Fault.http(503)] * 50)  # the endpoint is down
    src = tmp_path / "events.jsonl"
    src.write_bytes(b"\n".join(event(i) for i in range(10)) + b"\n")
    flags = ("--judge-breaker-failures", "3", "--judge-breaker-cooldown", "10m")
    assert run(src, tmp_path / "first", fake_openai, *flags) == 0
    assert error_counts(tmp_path / "first") == {"server_error": 3, "circuit_open": 7}
    assert len(fake_openai.requests) == 3
    # A second pipeline builds a new panel and endpoint (as serve does every cycle): the
    # breaker it finds is still open, so it fails fast without calling the endpoint.
    assert run(src, tmp_path / "second", fake_openai, *flags) == 0
    assert error_counts(tmp_path / "second") == {"circuit_open": 10}
    assert len(fake_openai.requests) == 3
    row = orjson.loads((tmp_path / "second" / "verdicts.jsonl").read_bytes().splitlines()[0])
    assert "circuit breaker is open" in row["response/llm_judged/groundedness/error_message"]
