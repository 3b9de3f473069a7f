"""What the verdict cache saves, and what it costs when nothing repeats.

For whoever sets --judge-cache-size / --judge-cache-ttl. Two measurements, medians of R runs:

    local     the three default local judges (`JudgePanel.judge_batch`, batches of 256) over N
              synthetic events (tests/bench/bench_pipeline.py's generator): cache off, cache
              on with no repeats (the cost of hashing and looking up every event), cache on
              with a share of repeated events. (Why `JudgeSpec.build` gives the local
              judges no cache: they grade faster than it looks up.)
    llm       one LLM judge (groundedness) on tests/fake_openai.py answering after a fixed
              latency, concurrency 16, over M events of which the same share repeat: HTTP
              requests, prompt tokens and wall time, cache off and on; and the cached prompt
              tokens a provider's prefix cache reports (the stand-in plays one)

Each cache-on run starts with an empty cache.

    .venv/bin/python tests/bench/bench_verdict_cache.py [--events N] [--llm-events M]
        [--repeat-share F] [--latency S] [--repeats R]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_pipeline import synthetic_events
from fake_openai import FakeOpenAI

from ragpulse.judges import DEFAULT_JUDGES
from ragpulse.judges.base import JudgeInput, Verdict
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.local.judge import build_local_judges
from ragpulse.judges.panel import JudgePanel
from ragpulse.judges.verdict_cache import VerdictCache
from ragpulse.pipeline.formats.events import parse_event

BATCH = 256


def with_repeats(items: list[JudgeInput], share: float, seed: int) -> list[JudgeInput]:
    """`items` with the given share of them replaced by copies of earlier ones."""
    rng = random.Random(seed)
    out = list(items)
    for i in range(1, len(out)):
        if rng.random() < share:
            out[i] = out[rng.randrange(i)]
    return out


def judge_all(panel: JudgePanel, items: Sequence[JudgeInput]) -> list[Verdict]:
    return [
        v
        for i in range(0, len(items), BATCH)
        for row in panel.judge_batch(items[i : i + BATCH])
        for v in row
    ]


def local_round(items: list[JudgeInput], cached: bool) -> float:
    panel = JudgePanel(
        build_local_judges(DEFAULT_JUDGES), cache=VerdictCache(10_000, 600) if cached else None
    )
    start = time.perf_counter()
    judge_all(panel, items)
    elapsed = time.perf_counter() - start
    panel.close()
    return elapsed


def llm_round(
    server: FakeOpenAI, items: list[JudgeInput], cached: bool
) -> tuple[float, int, int, int]:
    server.reset_log()
    endpoint = OpenAIJudgeEndpoint(base_url=server.base_url, api_key="unused", concurrency=16)
    panel = JudgePanel(
        build_llm_judges(("groundedness",), endpoint),
        cache=VerdictCache(10_000, 600) if cached else None,
    )
    start = time.perf_counter()
    verdicts = judge_all(panel, items)
    elapsed = time.perf_counter() - start
    panel.close()
    return (
        elapsed,
        len(server.requests),
        sum(v.prompt_tokens for v in verdicts),
        sum(v.cached_prompt_tokens for v in verdicts),
    )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--events", type=int, default=5000)
    ap.add_argument("--llm-events", type=int, default=400)
    ap.add_argument("--repeat-share", type=float, default=0.25)
    ap.add_argument("--latency", type=float, default=0.1, help="stand-in reply latency, s")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    share = args.repeat_share

    distinct = [parse_event(raw).judge_input for raw in synthetic_events(args.events, seed=7)]
    repeated = with_repeats(distinct, share, seed=1)
    local_round(distinct, cached=False)  # warm the judges' own caches
    rounds = {
        "off": (distinct, False),
        "on, no repeats": (distinct, True),
        f"off, {share:.0%} repeats": (repeated, False),
        f"on, {share:.0%} repeats": (repeated, True),
    }
    local: dict[str, list[float]] = {k: [] for k in rounds}
    for _ in range(args.repeats):
        for name, (items, cached) in rounds.items():
            local[name].append(local_round(items, cached))
    print(
        f"\nlocal panel ({', '.join(DEFAULT_JUDGES)}), N = {args.events} events, "
        f"median of {args.repeats}\n"
    )
    print("| cache | wall s | events/s |\n|---|---:|---:|")
    for name, times in local.items():
        t = statistics.median(times)
        print(f"| {name} | {t:.3f} | {args.events / t:,.0f} |")

    llm_items = with_repeats(distinct[: args.llm_events], share, seed=2)
    results: dict[str, list[tuple[float, int, int, int]]] = {"off": [], "on": []}
    with FakeOpenAI(latency=args.latency, prompt_cache=True) as server:
        for _ in range(args.repeats):
            for name in results:
                results[name].append(llm_round(server, llm_items, name == "on"))
    print(
        f"\nLLM judge groundedness on the stand-in ({args.latency * 1000:.0f} ms per reply, "
        f"concurrency 16), M = {args.llm_events} events, {share:.0%} repeats, "
        f"median of {args.repeats}\n"
    )
    print(
        "| verdict cache | wall s | HTTP requests | prompt tokens | of which cached_prompt |\n"
        "|---|---:|---:|---:|---:|"
    )
    for name, runs in results.items():
        wall = statistics.median(r[0] for r in runs)
        requests, prompt, prompt_cached = runs[-1][1:]
        print(f"| {name} | {wall:.2f} | {requests} | {prompt:,} | {prompt_cached:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
