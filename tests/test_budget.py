"""The judge budget governor (pipeline/costs/budget.py): spend, prices, the factor per cycle, and
cycles of the real graph against the stand-in LLM endpoint staying within the budget while the
weighted pass ratio stays on the truth."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Literal

import apache_beam as beam
import orjson
import pytest
from fake_openai import MARKER, FakeOpenAI, fake_openai_fixture  # noqa: F401
from graph_runs import stage_config
from kafka_broker import ApacheKafkaBroker, kafka_broker  # noqa: F401
from serve_process import Scrape, ServeProcess, serve_processes_fixture  # noqa: F401

from ragpulse.pipeline.costs.budget import (
    PROBE_EVENTS,
    BudgetGovernor,
    BudgetSettings,
    HourSpend,
    Prices,
    load_prices,
    spend_of,
)
from ragpulse.pipeline.costs.sampling import SAMPLED, SEEN, SPEND, WEIGHTED_VERDICTS, plan_from_data
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.graphs.bounded import Sinks, run_graph
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.service.state import CycleOutcome, StateStore
from ragpulse.pipeline.settings.blocks import BUDGET
from ragpulse.pipeline.settings.flags import FlagTable, add_flags, values_of
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.sinks.files import WriteDeadLetters

HOUR = 1_767_225_600.0  # 2026-01-01T00:00:00Z
ServeFactory = Callable[..., ServeProcess]


def tokens(prompt: int, completion: int, cached: int = 0) -> counting.Counts:
    return Counter({
        counting.key("ragpulse_judge_tokens_total", judge="safety", kind="prompt"): prompt,
        counting.key("ragpulse_judge_tokens_total", judge="safety", kind="completion"): completion,
        counting.key("ragpulse_judge_tokens_total", judge="safety", kind="cached_prompt"): cached,
    })


def test_spend_is_tokens_or_their_cost_with_cached_prompt_tokens_at_their_own_price() -> None:
    counts = tokens(prompt=1_000_000, completion=200_000, cached=400_000)
    assert spend_of(counts, None) == 1_200_000
    prices = Prices(prompt=0.15, cached_prompt=0.075, completion=0.60)
    assert spend_of(counts, prices) == pytest.approx(0.6 * 0.15 + 0.4 * 0.075 + 0.2 * 0.60)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def cycle_counts(seen: dict[str, int], judged: int, spend_tokens: int) -> counting.Counts:
    counts = tokens(spend_tokens, 0)
    for stratum, n in seen.items():
        counts[counting.key(SEEN, stratum=stratum)] = n
    counts[counting.key(SAMPLED, stratum="default")] = judged
    return counts


def test_the_first_cycle_is_a_probe_then_the_factor_fits_the_rest_of_the_hours_budget() -> None:
    clock = Clock(HOUR + 10)
    governor = BudgetGovernor(BudgetSettings(per_hour=10_000, min_sample_rate=0.0), clock)
    plan = plan_from_data({"rules": [{"name": "vip", "when": {"app": "vip"}, "rate": 1.0}]}, 1.0)
    governed = governor.plan_for(plan, records=1000)
    assert governor.factor == PROBE_EVENTS / 1000
    assert governed.effective(1.0) == pytest.approx(PROBE_EVENTS / 1000)
    # The probe: 32 events seen, all default, judged at 100 tokens each.
    increments = governor.record(cycle_counts({"default": 32}, 32, 3200))
    assert increments == Counter({counting.key(SPEND, unit="tokens"): 3200 * 10**6})
    # 6,800 tokens left; 1,000 records at 100 tokens each would be 100,000. The factor keeps
    # the expected spend m plus three standard deviations (sqrt(m * 100)) within 6,800.
    governor.plan_for(plan, records=1000)
    assert governor.factor == pytest.approx(0.0473, abs=1e-3)
    governor.record(cycle_counts({"default": 1000}, 68, 6800))
    assert governor.plan_for(plan, records=1000).effective(0.5) == 0.0  # spent: factor 0
    # A new clock hour brings a new budget, paced over the ~1,000 records an hour seen so far.
    clock.now = HOUR + 3600
    governor.plan_for(plan, records=10)
    assert governor.factor == pytest.approx(0.096, abs=0.002)
    assert governor.gauges() == {
        "ragpulse_judge_budget_per_hour": 10_000,
        "ragpulse_judge_budget_spent_this_hour": 0.0,
        "ragpulse_judge_sample_factor": governor.factor,
    }


def test_the_budget_is_paced_over_the_records_expected_in_the_rest_of_the_hour() -> None:
    clock = Clock(HOUR)
    governor = BudgetGovernor(BudgetSettings(per_hour=10_000, min_sample_rate=0.0), clock)
    plan = plan_from_data({"rules": [{"name": "vip", "when": {"app": "vip"}, "rate": 1.0}]}, 1.0)
    governor.plan_for(plan, records=100)
    governor.record(cycle_counts({"default": 100}, 10, 1000))  # 100 tokens per judged event
    # 100 records a minute: 5,900 more expected in the 59 minutes left of the hour, so the
    # 9,000 tokens left cover about 1.5 % of the 6,000 records, not 90 % of these 100.
    clock.now = HOUR + 60
    governor.plan_for(plan, records=100)
    assert governor.factor == pytest.approx(9000 / (6000 * 100), rel=0.1)


def test_a_spent_budget_leaves_every_stratum_at_the_floor() -> None:
    governor = BudgetGovernor(BudgetSettings(per_hour=100, min_sample_rate=0.02), Clock(HOUR))
    governor.record(tokens(150, 0))
    plan = governor.plan_for(plan_from_data(
        {"rules": [{"name": "neg", "when": {"feedback": "negative"}, "rate": 1.0}],
         "default_rate": 0.01}, 1.0), records=100)
    assert (plan.effective(1.0), plan.effective(0.01)) == (0.02, 0.01)


def test_a_restart_within_the_hour_goes_on_from_the_saved_spend_and_does_not_probe_again() -> None:
    settings = BudgetSettings(per_hour=10_000, min_sample_rate=0.0)
    plan = plan_from_data({"rules": [{"name": "vip", "when": {"app": "vip"}, "rate": 1.0}]}, 1.0)
    saved = cycle_counts({"default": 1000}, 100, 10_000)  # 100 tokens per judged event
    clock = Clock(HOUR + 3300)
    restarted = BudgetGovernor(settings, clock)
    restarted.restore(int(HOUR // 3600), "tokens", 9_990.0, saved)
    assert restarted.gauges()["ragpulse_judge_budget_spent_this_hour"] == 9_990.0
    # 10 tokens left: no probe of PROBE_EVENTS events (3,200 tokens), the floor alone.
    restarted.plan_for(plan, records=1000)
    assert restarted.factor == 0.0
    assert restarted.this_hour_with(50.0) == (int(HOUR // 3600), 10_040.0)
    # The saved spend of another hour, or in another unit, is not this hour's.
    for hour, unit in ((int(HOUR // 3600) - 1, "tokens"), (int(HOUR // 3600), "cost")):
        other = BudgetGovernor(settings, clock)
        other.restore(hour, unit, 9_990.0, saved)
        assert other.spent_this_hour == 0.0
        other.plan_for(plan, records=1000)
        # No probe: the factor keeps m + 3 sqrt(100 m) within the 10,000 tokens, as known
        # from the saved 100 tokens per judged event (m = 7,417 tokens).
        assert other.factor == pytest.approx(0.0742, abs=1e-3)


def test_a_restarted_process_paces_its_first_cycle_from_the_saved_arrival_rate(
    tmp_path: Path,
) -> None:
    """Restarting every 12 s spent 0.72x the hour's budget in 2 minutes: each process's first
    cycle was budgeted as if nothing came after it. The pace is saved with the spend (through
    the state file, as serve saves it) and the restarted process's first cycle is paced by it."""
    settings = BudgetSettings(per_hour=100_000, min_sample_rate=0.0)
    plan = plan_from_data({"rules": [{"name": "vip", "when": {"app": "vip"}, "rate": 1.0}]}, 1.0)
    clock = Clock(HOUR + 60)
    learned = cycle_counts({"default": 1000}, 100, 10_000)  # 100 tokens per judged event
    first = BudgetGovernor(settings, clock)
    first.restore(int(HOUR // 3600), "tokens", 0.0, learned)
    for cycle in range(3):  # 100 records arrive every 12 s: 8.3 records/s
        clock.now = HOUR + 60 + 12 * cycle
        first.plan_for(plan, records=100)
        charge = first.charge(cycle_counts({"default": 100}, 10, 1000))
        first.committed()
    with StateStore(tmp_path / "state.sqlite") as state:
        state.apply_cycle("t", CycleOutcome(**charge.saves))  # type: ignore[arg-type]
    with StateStore(tmp_path / "state.sqlite") as state:
        saved = state.hour_spend()
    assert saved is not None and saved.arrivals == pytest.approx(100 / 12)

    def first_factor(pace: HourSpend | None) -> float:
        clock.now = HOUR + 100
        restarted = BudgetGovernor(settings, clock)
        assert saved is not None
        restarted.restore(saved.hour, saved.unit, saved.spent, learned, pace)
        restarted.plan_for(plan, records=100)
        return restarted.factor

    # Without the pace, the first cycle may spend all that is left of the hour on its own.
    assert first_factor(None) == 1.0
    # With it, the rest of the hour's records (about 7 a second for 3,500 s, 100 tokens per
    # judged event at rate 1) are budgeted for too: 97,000 tokens left over some 25,000
    # records and more, a factor under 0.05.
    assert 0 < first_factor(saved) < 0.05


def parse_budget_flags(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_flags(p, FlagTable(None, (BUDGET,)))
    return p.parse_args(list(argv))


def budget_settings(
    args: argparse.Namespace, model: str, backend: Literal["local", "openai"]
) -> BudgetSettings | None:
    judges = JudgeSettings(model=model, backend=backend)
    built: BudgetSettings | None = BUDGET.build(values_of(BUDGET.flags, args), {"judges": judges})
    return built


def test_budget_flags_are_checked_against_the_backend_and_the_price_table(tmp_path: Path) -> None:
    table = tmp_path / "prices.yml"
    table.write_text("gpt-4o-mini: {prompt: 0.15, completion: 0.6}\nother: {prompt: 1}\n")
    args = parse_budget_flags("--judge-budget-per-hour", "2.5", "--judge-price-table", str(table))
    budget = budget_settings(args, "gpt-4o-mini", "openai")
    assert budget == BudgetSettings(2.5, 0.01, Prices(0.15, 0.15, 0.6))
    assert budget.unit == "cost"
    with pytest.raises(SettingsError, match="--judge-backend local spends nothing"):
        budget_settings(args, "gpt-4o-mini", "local")
    with pytest.raises(SettingsError, match=r"no prices for the judge model 'gpt-5' "
                                            r"\(--judge-model\); it lists gpt-4o-mini, other"):
        budget_settings(args, "gpt-5", "openai")
    with pytest.raises(SettingsError, match="other: the completion price is missing"):
        load_prices(table, "other")
    with pytest.raises(SettingsError, match="--judge-price-table needs --judge-budget-per-hour"):
        budget_settings(parse_budget_flags("--judge-price-table", str(table)), "m", "openai")
    assert budget_settings(parse_budget_flags(), "m", "openai") is None


# --- cycles of the real graph against the stand-in endpoint -----------------------------------

RULES = {"rules": [{"name": "negative_feedback", "when": {"feedback": "negative"}, "rate": 1.0}],
         "default_rate": 0.5}


def cycle_records(cycle: int, n: int) -> tuple[list[SourceRecord], int]:
    """`n` events: a quarter with negative feedback, of which 1 in 10 pass; of the rest, 14 in
    15 pass (the stand-in rates an answer holding MARKER `no`). Returns them and the passes."""
    records, passes = [], 0
    for j in range(n):
        i = cycle * n + j
        disliked = j % 4 == 0
        ok = (j // 4) % 10 == 0 if disliked else j % 20 != 1
        passes += ok
        answer = f"Refunds take {i} days." + ("" if ok else f" {MARKER}")
        raw = orjson.dumps({
            "request_id": f"req-{i}", "request": "How long do refunds take?",
            "response": answer, "timestamp": int((HOUR + i) * 1000), "app": "shop",
            "model": "m1", **({"feedback": "negative"} if disliked else {}),
        })
        records.append(SourceRecord(raw, "events", 0, i))
    return records, passes


@pytest.mark.slow
def test_governed_cycles_spend_within_the_hours_budget_and_the_weighted_ratio_stays_unbiased(
    fake_openai: FakeOpenAI, tmp_path: Path
) -> None:
    judges = JudgeSettings(backend="openai", names=("safety",), base_url=fake_openai.base_url,
                           max_retries=0)
    base = stage_config(judges=judges.spec(), window_seconds=3600.0)
    plan = plan_from_data(RULES, 1.0)
    # Measure one judged event's tokens, to set a budget of about a fifth of the traffic.
    probe, _ = cycle_records(999, 8)
    run_graph(beam.Create(probe), base, Sinks(WriteDeadLetters(tmp_path)))
    per_event = sum(r.prompt_tokens + r.completion_tokens for r in fake_openai.requests) / 8
    fake_openai.reset_log()
    cycles, per_cycle = 8, 400
    budget = cycles * per_cycle * per_event / 5
    clock = Clock(HOUR)
    governor = BudgetGovernor(BudgetSettings(budget, min_sample_rate=0.01), clock)

    totals: counting.Counts = Counter()
    passes = factors = spent_above_floor = 0.0
    for cycle in range(cycles):
        clock.now = HOUR + 1 + cycle * 3500 / cycles  # the cycles span the hour
        records, ok = cycle_records(cycle, per_cycle)
        passes += ok
        config = base.admitting(sampling=governor.plan_for(plan, len(records)))
        factors += governor.factor
        result = run_graph(beam.Create(records), config, Sinks(WriteDeadLetters(tmp_path)))
        totals.update(governor.record(result.counts))
        totals.update(result.counts)
        if governor.factor > 0:
            spent_above_floor = governor.spent_this_hour
    truth = passes / (cycles * per_cycle)
    assert truth == pytest.approx(0.25 * 0.1 + 0.75 * 14 / 15)

    spent = sum(r.prompt_tokens + r.completion_tokens for r in fake_openai.requests)
    assert spent == governor.spent_this_hour == totals[counting.key(SPEND, unit="tokens")] / 1e6
    # Within the budget, used for most of it, and paced: no cycle left to the floor alone.
    assert 0.7 * budget <= spent <= budget
    assert spent_above_floor == spent
    assert factors / cycles < 0.5  # ... by lowering the rate

    def ratio(metric: str) -> float:
        yes = sum(v for (m, lab), v in totals.items() if m == metric and ("rating", "yes") in lab)
        no = sum(v for (m, lab), v in totals.items() if m == metric and ("rating", "no") in lab)
        return yes / (yes + no)

    # Disliked answers are judged at twice the rate of the rest: the raw ratio is too low.
    assert ratio(counting.VERDICTS) < truth - 0.08
    assert ratio(WEIGHTED_VERDICTS) == pytest.approx(truth, abs=0.05)


# --- `ragpulse serve`: the governor across cycles of a real subprocess --------------------------

def caught_up_with(seen: int) -> Callable[[Scrape], bool]:
    return lambda m: m.total("ragpulse_seen_events_total") == seen


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_serve_lowers_the_rate_across_cycles_to_stay_within_the_budget_and_exports_spend(
    serve_processes: ServeFactory, tmp_path: Path, kafka_broker: ApacheKafkaBroker  # noqa: F811
) -> None:
    topic = "judge-budget"
    batches = [cycle_records(cycle, 120)[0] for cycle in range(4)]
    broker = kafka_broker
    with FakeOpenAI() as judge_server:
        broker.create_topic(topic, 1)
        # Tokens: about a third of what judging at the full rates would take; how much of it
        # the governor plans to use depends on the minute of the hour (it paces the budget
        # over the rest of the hour), so only the bound is checked.
        budget = 60_000
        args = [
            "--window", "1h",
            "--judges", "safety",
            "--judge-backend", "openai",
            "--judge-base-url", judge_server.base_url,
            "--judge-max-retries", "0",
            "--judge-budget-per-hour", str(budget),
            "--judge-min-sample-rate", "0.1",
        ]  # fmt: skip
        serve = serve_processes(broker.bootstrap, topic, tmp_path / "state.sqlite", args).start()
        factors: list[float | None] = []
        for n, batch in enumerate(batches, start=1):
            broker.produce(topic, [r.raw for r in batch], partition=0)
            scrape = serve.wait_for(caught_up_with(120 * n), 60, f"cycle {n}")
            factors.append(scrape.value("ragpulse_judge_sample_factor"))
        spent = sum(r.prompt_tokens + r.completion_tokens for r in judge_server.requests)
        # Every token the stand-in counted is in the spend counter and the hour's gauge.
        assert scrape.value("ragpulse_judge_spend_total", unit="tokens") == spent
        assert scrape.value("ragpulse_judge_budget_spent_this_hour") == spent
        assert scrape.value("ragpulse_judge_budget_per_hour") == budget
        assert spent <= budget
        assert factors[0] == PROBE_EVENTS / 120
        assert any(f is not None and f < 0.5 for f in factors[1:])
        judged = scrape.total("ragpulse_events_judged_total")
        assert judged < 0.5 * 480
        # The weighted verdicts estimate all 480 events, however few were judged.
        weighted = scrape.total(
            "ragpulse_judge_verdicts_weighted_total", rating="yes"
        ) + scrape.total("ragpulse_judge_verdicts_weighted_total", rating="no")
        assert weighted == pytest.approx(480, rel=0.35)
        assert serve.terminate() == 0
