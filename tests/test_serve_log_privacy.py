"""serve's log follows the redaction policy at every level: at --log-level DEBUG no user text.

Measured before (tests/bench/bench_debug_log.py, 40 events, code of 730baa7): one serve run at
DEBUG with --redact-pii on logged the events' own words 480 times and the planted PII 480 times
(kafka-python's request and response lines, the OpenAI client's request bodies). The test runs
a real `ragpulse --log-level DEBUG serve` on Apache Kafka with the LLM judge stand-in until it
has judged every event, then looks for each event's words and PII in its whole log.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from cli import ragpulse_command
from fake_openai import FakeOpenAI
from kafka_broker import ApacheKafkaBroker
from serve_process import ServeProcess, caught_up
from users_text import planted_events

EVENTS = 20


class ServeAtDebug(ServeProcess):
    def command(self) -> list[str]:
        return [*ragpulse_command(), "--log-level", "DEBUG", *self.serve_args()]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_serve_at_debug_logs_no_word_of_the_users_text(
    kafka_broker: ApacheKafkaBroker, tmp_path: Path
) -> None:
    events, words, pii = planted_events(EVENTS)
    kafka_broker.create_topic("debug-log", 2)
    kafka_broker.produce("debug-log", events)
    with FakeOpenAI() as endpoint:
        serve = ServeAtDebug(
            kafka_broker.bootstrap, "debug-log", tmp_path / "state.sqlite",
            ["--judge-backend", "openai", "--judge-base-url", endpoint.base_url,
             "--judges", "groundedness,safety", "--redact-pii", "on", "--window", "1h"],
            env={**os.environ},
        )
        try:
            serve.start()
            serve.wait_for(
                lambda m: caught_up(EVENTS)(m)
                and m.total("ragpulse_judge_verdicts_total") >= 2 * EVENTS,
                180, "every event judged",
            )
            assert serve.terminate() == 0
            log = serve.log_text()
        finally:
            serve.stop()
        # The judge endpoint got the users' text (redacted): it went where it is configured to.
        assert any(words[0] in str(r.body) for r in endpoint.requests)
    assert "--log-level DEBUG serve" in log
    assert [w for w in words if w in log] == []
    assert [p for p in pii if p in log] == []
