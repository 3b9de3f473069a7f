"""What stratified sampling and the judge budget governor cost, and how close spend stays to the
budget.

For whoever sets --sampling-rules and --judge-budget-per-hour. Two measurements:

    overhead  per accepted event, the sampling decision alone (no parsing, no judging): plain
              `is_sampled` at --sample-rate, against a plan of 3 rules (`stratum_of`, the hash,
              and the weighted copy of the record), median of R runs over N events; and the
              governor's own work per serve cycle (`plan_for` + `record`), divided by the
              cycle's records
    spend     C cycles of E events through the real graph (FnApiRunner) with one LLM judge on
              tests/fake_openai.py, governed by budgets of a share of what judging at the
              rules' full rates would spend (measured on a probe), the cycles' clock spread
              over one hour (the governor paces by it): the realised spend / budget
              (before the floor's sample, and with it), the mean factor, and the weighted and
              unweighted pass ratios against the known truth

    .venv/bin/python tests/bench/bench_budget.py [--events N] [--repeats R] [--cycles C]
        [--cycle-events E] [--shares 0.1,0.25,0.5] [--min-rate F]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import apache_beam as beam
from fake_openai import FakeOpenAI
from graph_runs import stage_config
from test_budget import HOUR, RULES, Clock, cycle_records

from ragpulse.pipeline.costs.budget import BudgetGovernor, BudgetSettings
from ragpulse.pipeline.costs.sampling import (
    SAMPLED,
    SEEN,
    WEIGHTED_VERDICTS,
    is_sampled,
    plan_from_data,
)
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.graphs.bounded import Sinks, run_graph
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.sinks.files import WriteDeadLetters

THREE_RULES = {
    "rules": [
        {"name": "negative_feedback", "when": {"feedback": ["negative", "thumbs_down"]},
         "rate": 1.0},
        {"name": "new_model", "when": {"model": "m2"}, "rate": 0.5},
        {"name": "vip", "when": {"app": ["vip-bot", "vip-2"]}, "rate": 0.3},
    ],
    "default_rate": 0.05,
}


def overhead(n: int, repeats: int) -> None:
    records = [parse_event(r.raw) for r in cycle_records(0, n)[0]]
    plan = plan_from_data(THREE_RULES, 0.05)

    def plain() -> None:
        for e in records:
            is_sampled(e.request_id, 0.05)

    def stratified() -> None:
        for e in records:
            stratum, rate = plan.stratum_of(e)
            if is_sampled(e.request_id, rate):
                dataclasses.replace(e, stratum=stratum, weight=1.0 / rate)

    for name, fn in (("plain is_sampled", plain), ("stratified (3 rules)", stratified)):
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        print(f"  {name:24s} {statistics.median(times) / n * 1e6:7.2f} us/event (median of "
              f"{repeats}, {n} events)")

    governor = BudgetGovernor(BudgetSettings(1e9, 0.01), Clock(HOUR))
    counts: counting.Counts = Counter({
        counting.key("ragpulse_judge_tokens_total", judge="safety", kind="prompt"): 100_000,
        counting.key(SEEN, stratum="negative_feedback"): 2000,
        counting.key(SEEN, stratum="default"): 8000,
        counting.key(SAMPLED, stratum="default"): 2000,
    })
    governor.record(counts)
    cycle = 50_000
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        governor.plan_for(plan, cycle)
        governor.record(counts)
        times.append(time.perf_counter() - start)
    per_cycle = statistics.median(times)
    print(f"  governor per cycle       {per_cycle * 1e6:7.1f} us ({per_cycle / cycle * 1e9:.2f} "
          f"ns per record of a {cycle}-record cycle)")


def spend(cycles: int, per_cycle: int, shares: list[float], min_rate: float) -> None:
    plan = plan_from_data(RULES, 1.0)
    with FakeOpenAI() as server, tempfile.TemporaryDirectory() as tmp:
        judges = JudgeSettings(backend="openai", names=("safety",), base_url=server.base_url,
                               max_retries=0, cache_size=0)
        base = stage_config(judges=judges.spec(), window_seconds=3600.0)
        sinks = Sinks(dead_letters=WriteDeadLetters(Path(tmp)))
        probe, _ = cycle_records(10_000, 16)
        run_graph(beam.Create(probe), base, sinks)
        per_event = sum(r.prompt_tokens + r.completion_tokens for r in server.requests) / 16
        full = cycles * per_cycle * per_event * (0.25 * 1.0 + 0.75 * 0.5)
        print(f"  {per_event:.0f} tokens per judged event; full-rate spend {full:.0f} tokens")
        print("  budget share | spent/budget (no floor) | spent/budget | mean factor | "
              "weighted err | unweighted err")
        for share in shares:
            server.reset_log()
            budget = share * full
            clock = Clock(HOUR)
            governor = BudgetGovernor(BudgetSettings(budget, min_rate), clock)
            totals: counting.Counts = Counter()
            passes = factors = before_floor = 0.0
            for cycle in range(cycles):
                clock.now = HOUR + 1 + cycle * 3500 / cycles  # the cycles span the hour
                records, ok = cycle_records(cycle + int(share * 1000) * cycles, per_cycle)
                passes += ok
                config = base.admitting(sampling=governor.plan_for(plan, per_cycle))
                factors += governor.factor
                result = run_graph(beam.Create(records), config, sinks)
                governor.record(result.counts)
                totals.update(result.counts)
                if governor.factor > 0:
                    before_floor = governor.spent_this_hour
            truth = passes / (cycles * per_cycle)

            def ratio(metric: str, totals: counting.Counts = totals) -> float:
                yes = sum(v for (m, lab), v in totals.items()
                          if m == metric and ("rating", "yes") in lab)
                no = sum(v for (m, lab), v in totals.items()
                         if m == metric and ("rating", "no") in lab)
                return yes / (yes + no)

            print(f"  {share:12.2f} | {before_floor / budget:23.3f} | "
                  f"{governor.spent_this_hour / budget:12.3f} | {factors / cycles:11.3f} | "
                  f"{ratio(WEIGHTED_VERDICTS) - truth:+12.3f} | "
                  f"{ratio(counting.VERDICTS) - truth:+14.3f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--cycles", type=int, default=8)
    p.add_argument("--cycle-events", type=int, default=400)
    p.add_argument("--shares", default="0.1,0.25,0.5")
    p.add_argument("--min-rate", type=float, default=0.01)
    args = p.parse_args()
    print("overhead")
    overhead(args.events, args.repeats)
    print("spend")
    spend(args.cycles, args.cycle_events, [float(s) for s in args.shares.split(",")],
          args.min_rate)


if __name__ == "__main__":
    main()
