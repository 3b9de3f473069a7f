"""Benchmark: how the LLM endpoint's concurrency bound changes judging throughput.

Starts the local stand-in endpoint (tests/fake_openai.py) answering every call in 200 ms,
then judges the same events with one LLM judge through `JudgePanel` at several concurrency
bounds. The settings run side by side in one process, interleaved round by round, so they see
the same machine state; each is repeated and the median is reported with the speed-up over the
lowest concurrency. With latency L, N events and bound C the ideal time is N * L / C.

    .venv/bin/python tests/bench/bench_judge_concurrency.py            # concurrency 4 and 16
    .venv/bin/python tests/bench/bench_judge_concurrency.py --serial   # also 1 (adds ~100 s)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for fake_openai

from fake_openai import FakeOpenAI

from judges.base import Chunk, JudgeInput, JudgePanel
from judges.llm import OpenAIJudgeEndpoint, build_llm_judges


def make_events(count: int) -> list[JudgeInput]:
    """Distinct, realistic-sized events (question, answer, two chunks)."""
    return [
        JudgeInput(
            question=f"How do I rotate the access token of workspace {i}?",
            answer=f"Open workspace {i} settings, choose Tokens, then click Rotate.",
            chunks=(
                Chunk(f"Tokens of workspace {i} are rotated from Settings > Tokens.", f"doc{i}"),
                Chunk("Rotating a token revokes the previous one immediately.", "tokens.md"),
            ),
        )
        for i in range(count)
    ]


def run_once(
    server: FakeOpenAI, events: list[JudgeInput], concurrency: int, judge: str
) -> tuple[float, int, int]:
    """Seconds to judge all events, peak concurrent requests seen, and error verdicts."""
    server.reset_log()
    endpoint = OpenAIJudgeEndpoint(
        base_url=server.base_url, api_key="bench", concurrency=concurrency, max_retries=0
    )
    panel = JudgePanel(build_llm_judges([judge], endpoint))
    try:
        started = time.perf_counter()
        rows = panel.judge_batch(events)
        elapsed = time.perf_counter() - started
    finally:
        panel.close()
    errors = sum(1 for row in rows for v in row if v.rating == "error")
    return elapsed, server.max_concurrent, errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=160)
    parser.add_argument("--latency", type=float, default=0.2, help="seconds per reply")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--serial", action="store_true", help="also run concurrency 1")
    parser.add_argument("--judge", default="groundedness")
    args = parser.parse_args(argv)

    levels = sorted({*args.concurrency, *([1] if args.serial else [])})
    events = make_events(args.events)
    times: dict[int, list[float]] = {c: [] for c in levels}
    peaks: dict[int, int] = dict.fromkeys(levels, 0)
    errors = 0
    with FakeOpenAI(latency=args.latency) as server:
        run_once(server, events[:8], max(levels), args.judge)  # warm-up: imports, first loop
        for round_number in range(1, args.repeats + 1):
            for c in levels:
                elapsed, peak, failed = run_once(server, events, c, args.judge)
                times[c].append(elapsed)
                peaks[c] = max(peaks[c], peak)
                errors += failed
                print(f"round {round_number}: concurrency {c:>3}: {elapsed:6.2f} s", flush=True)

    base = statistics.median(times[levels[0]])
    print()
    print(
        f"{args.events} events, 1 judge ({args.judge}), reply latency {args.latency * 1000:.0f} ms,"
        f" {args.repeats} rounds"
    )
    header = (
        f"{'concurrency':>11} {'median s':>9} {'min s':>7} {'max s':>7} {'ideal s':>8} "
        f"{'events/s':>9} {'speed-up':>9} {'peak seen':>10}"
    )
    print(header)
    print("-" * len(header))
    for c in levels:
        median = statistics.median(times[c])
        ideal = args.events * args.latency / c
        print(
            f"{c:>11} {median:>9.2f} {min(times[c]):>7.2f} {max(times[c]):>7.2f} {ideal:>8.2f} "
            f"{args.events / median:>9.1f} {base / median:>8.1f}x {peaks[c]:>10}"
        )
    print(f"\nspeed-up is relative to concurrency {levels[0]}; error verdicts: {errors}")
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
