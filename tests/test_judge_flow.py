"""Judge calls keep flowing: between the batches of the judge panel and between serve's cycles.

Against the local stand-in endpoint (tests/fake_openai.py) answering after a fixed latency,
which records every change of the number of calls in flight. The library tests drive the
shared panel directly; the serve tests run `ragpulse serve` as a subprocess on a real (Tansu)
broker, where the calls for the next cycle's events are started ahead by
`pipeline.service.lookahead` and taken over by that cycle's judge stage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest
from cycle_holds import CycleHolds
from fake_openai import FakeOpenAI
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import Scrape, ServeProcess, serve_processes_fixture, wait_until  # noqa: F401

from ragpulse.judges.base import Chunk, JudgeInput
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.panel import JudgePanel
from ragpulse.pipeline.commands.simulate import simulate

T0 = 1_763_632_800.0
ServeFactory = Callable[..., ServeProcess]

ITEM = JudgeInput(
    question="How do I rotate a token?",
    answer="Open Settings, choose Tokens, then Rotate.",
    chunks=(Chunk("Tokens are rotated from Settings > Tokens.", "tokens.md"),),
)


def llm_panel(server: FakeOpenAI, concurrency: int) -> JudgePanel:
    endpoint = OpenAIJudgeEndpoint(
        base_url=server.base_url, api_key="test", concurrency=concurrency, max_retries=0
    )
    return JudgePanel(build_llm_judges(["groundedness"], endpoint))


def test_a_batch_takes_over_the_calls_started_ahead_for_its_inputs_without_calling_again() -> None:
    items = [dataclasses.replace(ITEM, question=f"How do I rotate token {i}?") for i in range(6)]
    with FakeOpenAI(latency=0.2) as server:
        panel = llm_panel(server, concurrency=3)
        try:
            panel.start_ahead(items[:4])
            wait_until(lambda: len(server.requests) >= 3, "the first calls to answer", 10)
            rows = panel.judge_batch(items)
        finally:
            panel.close()
    assert len(server.requests) == 6  # four taken over, two called by the batch
    verdicts = [v for row in rows for v in row]
    assert [v.rating for v in verdicts] == ["yes"] * 6
    # Taken over as real calls (counted by the batch), not as cached verdicts.
    assert all(not v.cached and v.latency_seconds > 0 and v.prompt_tokens > 0 for v in verdicts)


def test_a_canary_never_takes_over_a_call_started_ahead_for_the_same_input() -> None:
    with FakeOpenAI(latency=0.1) as server:
        panel = llm_panel(server, concurrency=2)
        try:
            panel.start_ahead([ITEM])
            wait_until(lambda: len(server.requests) == 1, "the first call", 10)
            panel.judge_batch([ITEM], fresh={0})
            assert len(server.requests) == 2  # the canary was judged by a call of its own
            panel.judge_batch([ITEM])
            assert len(server.requests) == 2  # the call started ahead is still there to take
        finally:
            panel.close()


def test_a_batch_submitted_before_the_last_is_waited_for_queues_behind_it_in_one_loop() -> None:
    first = [dataclasses.replace(ITEM, question=f"first {i}") for i in range(4)]
    second = [dataclasses.replace(ITEM, question=f"second {i}") for i in range(4)]
    with FakeOpenAI(latency=0.3) as server:
        panel = llm_panel(server, concurrency=4)
        try:
            a, b = panel.submit(first), panel.submit(second)
            rows = a.result(timeout=30) + b.result(timeout=30)
        finally:
            panel.close()
    assert [v.rating for row in rows for v in row] == ["yes"] * 8
    # One endpoint bound across both batches: never more than 4 in flight, and the second
    # batch's calls went out as the first one's ended (a wave boundary, not a wait).
    assert server.max_concurrent == 4
    assert server.occupancy().longest_idle < 0.5


# --- serve -----------------------------------------------------------------------------------

EVENTS = 60
FIRST = 12  # judged before the measured part: start-up is not a gap between cycles
SERVE_ARGS = [
    "--window", "10s",
    "--allowed-lateness", "1h",
    "--judges", "groundedness",
    "--judge-backend", "openai",
    "--judge-concurrency", "4",
    "--judge-max-retries", "0",
    "--judge-cache-size", "0",
    "--max-batch-events", "12",  # cycles of 3 s of calls each (4 in flight, 1 s each)
    "--trigger-interval", "0.2s",
]  # fmt: skip


def produce(broker: ApacheKafkaBroker, topic: str, payloads: list[bytes]) -> None:
    broker.produce(topic, payloads[0::2], partition=0)
    broker.produce(topic, payloads[1::2], partition=1)


def judged(n: int) -> Callable[[Scrape], bool]:
    return lambda m: m.total("ragpulse_events_judged_total") == n


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_judge_calls_keep_flowing_between_serve_cycles_and_each_event_costs_one_call(
    serve_processes: ServeFactory, tmp_path: Path, kafka_broker: ApacheKafkaBroker  # noqa: F811
) -> None:
    payloads = [e.payload for e in simulate(8, EVENTS, T0, rate=10)]
    broker = kafka_broker
    holds = CycleHolds(tmp_path / "hooks")
    with FakeOpenAI(latency=1.0) as server:
        broker.create_topic("flow", 2)
        args = [*SERVE_ARGS, "--judge-base-url", server.base_url]
        serve = serve_processes(
            broker.bootstrap, "flow", tmp_path / "state.sqlite", args, env=holds.env
        ).start()
        produce(broker, "flow", payloads[:FIRST])
        serve.wait_for(judged(FIRST), 120, "the first events judged")
        # Between two cycles: the next cycle's graph has not read anything yet. Built by a
        # hold, not by timing: the cycle that judges the next events is stopped at "judged",
        # and the events after them are produced only then, so only the lookahead can call
        # for those. (Produced before the hold, a slow cycle could reach "judged" after the
        # lookahead had called for every one of them, leaving nothing to call while held:
        # seen at load 30.)
        holds.hold("judged")
        produce(broker, "flow", payloads[FIRST : 2 * FIRST])  # one cycle's worth
        holds.wait_at("judged", serve)
        held_at = len(server.requests)
        produce(broker, "flow", payloads[2 * FIRST :])  # three more cycles' worth
        wait_until(lambda: len(server.requests) >= held_at + 4, "4 more calls", 120)
        holds.release("judged")
        m = serve.wait_for(judged(EVENTS), 180, "every event judged")
        assert serve.terminate() == 0
        occupancy = server.occupancy()
    assert m.total("ragpulse_cycles_total", outcome="ok") >= 5
    # Every event judged by exactly one call, counted once: the calls started ahead of a
    # cycle were taken over by it, none was made twice and none left uncounted.
    assert occupancy.ok_calls == EVENTS
    assert m.total("ragpulse_judge_calls_total", judge="groundedness") == EVENTS
    assert m.total("ragpulse_judge_verdicts_total", judge="groundedness") == EVENTS


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_sigkill_while_calls_run_ahead_of_the_next_cycle_loses_and_double_counts_nothing(
    serve_processes: ServeFactory, tmp_path: Path, kafka_broker: ApacheKafkaBroker  # noqa: F811
) -> None:
    state = tmp_path / "state.sqlite"
    broker = kafka_broker
    with FakeOpenAI(latency=1.0) as server:
        broker.create_topic("flow-kill", 2)
        produce(broker, "flow-kill", [e.payload for e in simulate(8, EVENTS, T0, rate=10)])
        args = [*SERVE_ARGS, "--judge-base-url", server.base_url]
        serve = serve_processes(broker.bootstrap, "flow-kill", state, args).start()
        first = serve.wait_for(
            lambda m: m.total("ragpulse_cycles_total", outcome="ok") >= 1, 120, "a cycle saved"
        )
        counted = first.total("ragpulse_events_judged_total")
        # Calls beyond the saved cycles' events are running: the next cycle's, started ahead.
        wait_until(lambda: len(server.requests) > counted + 4, "more than 4 more calls", 60)
        assert serve.kill() != 0
        called_before_kill = len(server.requests)

        again = serve_processes(broker.bootstrap, "flow-kill", state, args).start()
        m = again.wait_for(judged(EVENTS), 180, "every event judged after the restart")
        assert again.terminate() == 0
    assert m.total("ragpulse_judge_verdicts_total", judge="groundedness") == EVENTS
    assert m.total("ragpulse_events_total", outcome="accepted") == EVENTS
    # The calls started ahead and lost with the process were made again after the restart.
    assert len(server.requests) > EVENTS and called_before_kill > counted


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_after_the_topic_is_recreated_calls_start_ahead_again_and_the_next_cycle_takes_them_over(
    serve_processes: ServeFactory, tmp_path: Path, kafka_broker: ApacheKafkaBroker  # noqa: F811
) -> None:
    """The lookahead's consumer keeps the position its own reads left it at (with the leader
    epoch of the records read, KIP-320). A topic deleted and recreated shorter puts that
    position past the new log's end: the read ahead must start again from the cycle's new
    range, not fail there (LogTruncationError on Apache Kafka) and stop starting calls."""
    payloads = [e.payload for e in simulate(8, 46, T0, rate=10)]
    broker = kafka_broker
    holds = CycleHolds(tmp_path / "hooks")
    with FakeOpenAI(latency=0.2) as server:
        broker.create_topic("ahead-recreated", 1)
        broker.produce("ahead-recreated", payloads[:24], partition=0)
        args = [*SERVE_ARGS, "--judge-base-url", server.base_url]
        serve = serve_processes(
            broker.bootstrap, "ahead-recreated", tmp_path / "state.sqlite", args, env=holds.env
        ).start()
        serve.wait_for(judged(24), 120, "the first topic's 24 events judged")
        with serve.paused():
            broker.delete_topic("ahead-recreated")
            broker.create_topic("ahead-recreated", 1)
            broker.produce("ahead-recreated", payloads[24:36], partition=0)  # offsets 0..11
        holds.hold("judged")
        holds.wait_at("judged", serve)  # the new topic's first 12 events, judged, not saved
        assert len(server.requests) == 36
        broker.produce("ahead-recreated", payloads[36:], partition=0)  # offsets 12..21
        # The cycle is held: only the lookahead can call for these ten.
        wait_until(lambda: len(server.requests) == 46, "46 calls", 240)
        holds.release("judged")
        m = serve.wait_for(judged(46), 120, "the recreated topic's 22 events judged")
        assert serve.terminate() == 0
    # A read ahead racing the reset may fail, on the old log's positions; none fails from the
    # positions of the cycle that reset (the lookahead logs both under one lock, in order).
    after_reset = serve.log_text().split("were reset to another log", 1)[1]
    assert "could not read ahead" not in after_reset
    assert m.total("ragpulse_offset_resets_total", kind="beyond_end") == 1
    # Taken over by the next cycle: each event judged by one call, counted once.
    assert len(server.requests) == 46
    assert m.total("ragpulse_judge_calls_total", judge="groundedness") == 46
    assert m.total("ragpulse_judge_verdicts_total", judge="groundedness") == 46
