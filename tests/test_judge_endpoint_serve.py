"""`ragpulse serve` (a real subprocess, a real Kafka-protocol broker) on a broken judge endpoint:
malformed replies and outages become error verdicts by cause, every cycle succeeds, and the
circuit breaker opened in one cycle still holds in the next, whose pipeline is new."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from fake_openai import FakeOpenAI, Fault
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import ServeProcess, serve_processes_fixture  # noqa: F401

from ragpulse.pipeline.commands.simulate import simulate

T0 = 1_763_632_800.0

ServeFactory = Callable[..., ServeProcess]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_broken_endpoint_costs_error_verdicts_not_cycles_and_the_breaker_spans_cycles(
    serve_processes: ServeFactory, tmp_path: Path, kafka_broker: ApacheKafkaBroker  # noqa: F811
) -> None:
    topic = "judge-outage"
    broker = kafka_broker
    with FakeOpenAI() as judge_server:
        broker.create_topic(topic, 1)
        # The endpoint sends a proxy's HTML page, then is down for good.
        judge_server.push_faults(Fault.html(), *[Fault.http(503)] * 100)
        args = [
            "--window", "10s",
            "--judges", "groundedness",
            "--judge-backend", "openai",
            "--judge-base-url", judge_server.base_url,
            "--judge-concurrency", "1",
            "--judge-max-retries", "0",
            "--judge-breaker-failures", "3",
            "--judge-breaker-cooldown", "10m",
        ]  # fmt: skip
        state = tmp_path / "state.sqlite"
        serve = serve_processes(broker.bootstrap, topic, state, args).start()
        events = [e.payload for e in simulate(5, 20, T0, rate=10)]
        broker.produce(topic, events[:10], partition=0)
        first = serve.wait_for(
            lambda m: m.total("ragpulse_events_judged_total") == 10, 60, "the first cycle"
        )
        errors = first.by_labels("ragpulse_judge_errors_total")
        assert errors == {
            (("cause", "malformed"), ("judge", "groundedness")): 1,
            (("cause", "server_error"), ("judge", "groundedness")): 2,
            (("cause", "circuit_open"), ("judge", "groundedness")): 7,
        }
        assert len(judge_server.requests) == 3
        broker.produce(topic, events[10:], partition=0)
        second = serve.wait_for(
            lambda m: m.total("ragpulse_events_judged_total") == 20, 60, "the second cycle"
        )
        assert second.total("ragpulse_judge_errors_total", cause="circuit_open") == 17
        assert len(judge_server.requests) == 3  # the new cycle's pipeline never called it
        assert second.total("ragpulse_cycles_total", outcome="failed") == 0
        assert serve.healthz()[0] == 200
        assert serve.terminate() == 0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_an_event_repeated_in_a_later_cycle_gets_its_verdict_from_the_cache_without_a_call(
    serve_processes: ServeFactory, tmp_path: Path, kafka_broker: ApacheKafkaBroker  # noqa: F811
) -> None:
    topic = "judge-cache"
    events = [orjson.loads(e.payload) for e in simulate(6, 10, T0, rate=10)]
    # The same requests and answers again, later, under new request ids: the judge inputs
    # are identical, so the verdicts kept by the first cycle's judging are given again.
    repeats = [
        {**e, "request_id": f"again-{i}", "timestamp": int(T0 * 1000) + 10_000 + 100 * i}
        for i, e in enumerate(events)
    ]
    broker = kafka_broker
    with FakeOpenAI() as judge_server:
        broker.create_topic(topic, 1)
        args = [
            "--window", "10s",
            "--judges", "groundedness",
            "--judge-backend", "openai",
            "--judge-base-url", judge_server.base_url,
        ]  # fmt: skip
        serve = serve_processes(broker.bootstrap, topic, tmp_path / "state.sqlite", args).start()
        broker.produce(topic, [orjson.dumps(e) for e in events], partition=0)
        first = serve.wait_for(
            lambda m: m.total("ragpulse_events_judged_total") == 10, 60, "the first cycle"
        )
        asked = len(judge_server.requests)
        hits = first.total("ragpulse_judge_cache_hits_total", judge="groundedness")
        assert asked + hits == 10 and asked > 0
        assert first.total("ragpulse_judge_calls_total", judge="groundedness") == asked

        broker.produce(topic, [orjson.dumps(e) for e in repeats], partition=0)
        second = serve.wait_for(
            lambda m: m.total("ragpulse_events_judged_total") == 20, 60, "the second cycle"
        )
        assert len(judge_server.requests) == asked  # no call in the later cycle
        assert second.total("ragpulse_judge_cache_hits_total", judge="groundedness") == hits + 10
        assert second.total("ragpulse_judge_calls_total", judge="groundedness") == asked
        assert second.total("ragpulse_judge_verdicts_total", judge="groundedness") == 20
        assert serve.terminate() == 0
