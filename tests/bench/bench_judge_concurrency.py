"""Benchmark: how fast ragpulse's judging paths call an LLM endpoint, against a bare client loop.

Starts the local stand-in endpoint (tests/fake_openai.py) answering every call after a fixed
latency, then sends the same events (simulated inference-log events) to it three ways, at each
concurrency bound:

    bare loop     `openai.AsyncOpenAI` + `asyncio.Semaphore(C)` + `asyncio.gather`, the same
                  messages as the judge: the rate any client reaches against this server
    judge_batch   `JudgePanel.judge_batch` over all events (the library)
    ragpulse run  the CLI on a JSON Lines file of the events (`--judge-backend openai`)

The rate of each is the server's: ok calls / seconds from the first call's start to the last
call's end (so `ragpulse run`'s start-up is not counted against it). The ways run side by side
in one process, interleaved round by round, so they see the same machine state; each is
repeated and the median is reported with its share of the bare loop and of the bound
concurrency / latency.

    .venv/bin/python tests/bench/bench_judge_concurrency.py            # concurrency 16 and 32
    .venv/bin/python tests/bench/bench_judge_concurrency.py --concurrency 8 --events 320
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai

from fake_openai import FakeOpenAI

from ragpulse.judges.base import JudgeInput
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint, _Call
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.fencing import new_nonce
from ragpulse.judges.llm.judge import VERDICT_SCHEMA, LLMJudge
from ragpulse.judges.panel import JudgePanel
from ragpulse.pipeline.commands.simulate import simulate
from ragpulse.pipeline.formats.events import parse_event

RAGPULSE = Path(sys.executable).with_name("ragpulse")


def make_events(count: int) -> tuple[list[bytes], list[JudgeInput]]:
    """Simulated events (with context: every one is judged), as lines and as judge inputs."""
    lines, inputs = [], []
    for event in simulate(5, count * 3, time.time() - count):
        if event.kind == "malformed":
            continue
        item = parse_event(event.payload).judge_input
        if item.chunks:
            lines.append(event.payload)
            inputs.append(item)
        if len(inputs) == count:
            break
    return lines, inputs


def bare_loop(server: FakeOpenAI, inputs: list[JudgeInput], concurrency: int, judge: str) -> int:
    """Send each input's judge messages with a plain AsyncOpenAI client; error replies."""
    endpoint = OpenAIJudgeEndpoint(base_url=server.base_url, api_key="bench")
    (llm,) = build_llm_judges([judge], endpoint)
    assert isinstance(llm, LLMJudge)
    options = endpoint._request_options(_Call(None, VERDICT_SCHEMA, endpoint.max_tokens))

    async def run() -> int:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="bench", max_retries=0)
        semaphore = asyncio.Semaphore(concurrency)

        async def one(item: JudgeInput) -> bool:
            async with semaphore:
                reply = await client.chat.completions.create(
                    model=endpoint.model,
                    messages=llm.messages(item, new_nonce()),  # type: ignore[arg-type]
                    temperature=endpoint.temperature,
                    **options,
                )
            return json.loads(reply.choices[0].message.content or "")["rating"] in ("yes", "no")

        try:
            return sum(not ok for ok in await asyncio.gather(*(one(i) for i in inputs)))
        finally:
            await client.close()

    return asyncio.run(run())


def judge_batch(server: FakeOpenAI, inputs: list[JudgeInput], concurrency: int, judge: str) -> int:
    endpoint = OpenAIJudgeEndpoint(
        base_url=server.base_url, api_key="bench", concurrency=concurrency, max_retries=0
    )
    panel = JudgePanel(build_llm_judges([judge], endpoint))
    try:
        rows = panel.judge_batch(inputs)
    finally:
        panel.close()
    return sum(1 for row in rows for v in row if v.rating == "error")


def ragpulse_run(server: FakeOpenAI, events: Path, concurrency: int, judge: str) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-run-") as out:
        subprocess.run(
            [str(RAGPULSE), "run", str(events), "--output", out, "--judge-backend", "openai",
             "--judge-base-url", server.base_url, "--judges", judge, "--judge-cache-size", "0",
             "--judge-concurrency", str(concurrency), "--judge-max-retries", "0"],
            check=True, capture_output=True,
        )
        verdicts = (Path(out) / "verdicts.jsonl").read_text().splitlines()
    return sum(1 for line in verdicts if json.loads(line).get("rating") == "error")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=480)
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per reply")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 32])
    parser.add_argument("--judge", default="groundedness")
    args = parser.parse_args(argv)

    lines, inputs = make_events(args.events)
    ways: dict[str, Callable[[FakeOpenAI, int], int]] = {}
    rates: dict[tuple[str, int], list[float]] = {}
    errors = 0
    with tempfile.TemporaryDirectory(prefix="bench-judge-") as tmp:
        events_file = Path(tmp) / "events.jsonl"
        events_file.write_bytes(b"\n".join(lines) + b"\n")
        ways = {
            "bare loop": lambda s, c: bare_loop(s, inputs, c, args.judge),
            "judge_batch": lambda s, c: judge_batch(s, inputs, c, args.judge),
            "ragpulse run": lambda s, c: ragpulse_run(s, events_file, c, args.judge),
        }
        with FakeOpenAI(latency=args.latency) as server:
            bare_loop(server, inputs[:8], 8, args.judge)  # warm-up: imports, first loop
            for round_number in range(1, args.repeats + 1):
                for c in args.concurrency:
                    for way, run in ways.items():
                        server.reset_log()
                        errors += run(server, c)
                        rate = server.occupancy().calls_per_second
                        rates.setdefault((way, c), []).append(rate)
                        print(f"round {round_number}: concurrency {c:>3} {way:>12}: "
                              f"{rate:6.1f} calls/s", flush=True)

    print(f"\n{len(inputs)} events, 1 judge ({args.judge}), reply latency "
          f"{args.latency * 1000:.0f} ms, medians of {args.repeats} rounds\n")
    print("| concurrency | way | calls/s | of bare loop | of bound C / L |")
    print("|---|---|---|---|---|")
    for c in args.concurrency:
        bare = statistics.median(rates["bare loop", c])
        for way in ways:
            rate = statistics.median(rates[way, c])
            print(f"| {c} | {way} | {rate:.1f} | {rate / bare:.1%} | "
                  f"{rate / (c / args.latency):.1%} |")
    print(f"\nerror verdicts: {errors}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
