"""Stratified sampling (pipeline/costs/sampling.py): rules, their checks, and unbiased weighted
counts
through the real Beam graph."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from cli import one_line_error
from graph_runs import stage_config
from prometheus_client.parser import text_string_to_metric_families

from ragpulse.pipeline.cli import main
from ragpulse.pipeline.costs.sampling import (
    DEFAULT_STRATUM,
    SAMPLED,
    SEEN,
    WEIGHTED_VERDICTS,
    WEIGHTS,
    SamplingPlan,
    SamplingRulesError,
    WeightedCounts,
    load_plan,
    plan_from_data,
)
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.formats.events import parse_event
from ragpulse.pipeline.graphs.bounded import GraphResult, Sinks, run_graph
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.settings.command_flags import RUN
from ragpulse.pipeline.settings.models import BatchSettings, JudgeSettings, build
from ragpulse.pipeline.sinks.files import WriteDeadLetters

RULES: dict[str, Any] = {
    "rules": [
        {"name": "negative_feedback", "when": {"feedback": ["negative", "thumbs_down"]},
         "rate": 1.0},
        {"name": "new_model", "when": {"model": "model-v2"}, "rate": 0.5},
    ],
    "default_rate": 0.05,
}
CHUNK = "The Eiffel Tower in Paris is 330 metres tall and opened in 1889."
WINDOW = 3600.0
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z, the start of a window


def synthetic_event(i: int, *, feedback: str | None, model: str, passes: bool) -> bytes:
    """An event the local groundedness judge rates `yes` (the answer's number is in the chunk)
    or `no` (it is not)."""
    answer = f"The Eiffel Tower in Paris is {330 if passes else 512} metres tall."
    return orjson.dumps({
        "request_id": f"req-{i}",
        "request": "How tall is the Eiffel Tower?",
        "response": answer,
        "retrieved_context": [{"content": CHUNK, "doc_uri": "doc"}],
        "timestamp": int((T0 + i * 0.1) * 1000),
        "app": "help-bot",
        "model": model,
        **({"feedback": feedback} if feedback else {}),
    })


# (name, feedback, model, percent of traffic, true pass ratio): disliked answers fail most,
# the new model is between, the rest pass most; the sample over-represents the failing strata.
STRATA = (
    ("negative_feedback", "negative", "model-v1", 10, 0.30),
    ("new_model", None, "model-v2", 20, 0.60),
    ("default", None, "model-v1", 70, 0.90),
)


def synthetic_traffic(n: int) -> tuple[list[SourceRecord], float]:
    """`n` records of the three strata and the exact pass ratio of all of them.

    In each block of 100 events, each stratum has its percent of them, and the first share of
    those (its true ratio) pass, so the true ratio is known exactly; which events are sampled
    is up to the request-id hash.
    """
    records, yes = [], 0
    for i in range(n):
        position, start = i % 100, 0
        stratum = 0
        while position >= start + STRATA[stratum][3]:
            start += STRATA[stratum][3]
            stratum += 1
        _, feedback, model, percent, true_ratio = STRATA[stratum]
        passes = position - start < true_ratio * percent
        yes += passes
        raw = synthetic_event(i, feedback=feedback, model=model, passes=passes)
        records.append(SourceRecord(raw, "events", 0, i))
    return records, yes / n


def run_stratified(records: list[SourceRecord], tmp_path: Path, plan: SamplingPlan | None
                   ) -> GraphResult:
    config = stage_config(
        judges=JudgeSettings(backend="local", names=("groundedness",)).spec(),
        window_seconds=WINDOW,
    ).admitting(sampling=plan)
    import apache_beam as beam

    return run_graph(beam.Create(records), config, Sinks(dead_letters=WriteDeadLetters(tmp_path)))


@pytest.mark.slow
def test_weighted_pass_ratio_estimates_the_true_ratio_where_the_stratified_sample_is_biased(
    tmp_path: Path,
) -> None:
    records, truth = synthetic_traffic(20_000)
    assert truth == pytest.approx(0.10 * 0.30 + 0.20 * 0.60 + 0.70 * 0.90)  # 0.78
    result = run_stratified(records, tmp_path, plan_from_data(RULES, 1.0))
    counts = result.counts

    def verdicts(metric: str, rating: str) -> float:
        return sum(v for (m, lab), v in counts.items() if m == metric and ("rating", rating) in lab)

    def pass_ratio(metric: str) -> float:
        return verdicts(metric, "yes") / (verdicts(metric, "yes") + verdicts(metric, "no"))

    unweighted, weighted = pass_ratio(counting.VERDICTS), pass_ratio(WEIGHTED_VERDICTS)
    # The sample holds every disliked answer and 5 % of the rest: unweighted, it reads ~0.52.
    assert abs(unweighted - truth) > 0.2
    assert weighted == pytest.approx(truth, abs=0.03)
    # The event-time windows carry the same estimate.
    assert {(k.window_start, k.model) for k in result.weighted_windows} == {
        (T0, "model-v1"), (T0, "model-v2")
    }
    window_counts = sum(result.weighted_windows.values(), WeightedCounts())
    assert window_counts.pass_ratio == pytest.approx(weighted, abs=1e-6)
    assert window_counts.yes + window_counts.no == pytest.approx(20_000, rel=0.05)
    # Per stratum: everything seen, the sampled share near its rate, weights summing to ~seen.
    for name, _, _, share, _ in STRATA:
        seen = counts[counting.key(SEEN, stratum=name)]
        sampled = counts[counting.key(SAMPLED, stratum=name)]
        rate = {"negative_feedback": 1.0, "new_model": 0.5, "default": 0.05}[name]
        assert seen == 20_000 * share / 100
        assert sampled / seen == pytest.approx(rate, rel=0.15)
        assert counts[counting.key(WEIGHTS, stratum=name)] / 1e6 == pytest.approx(
            sampled / rate, rel=1e-6
        )
    # And Prometheus sees the weighted family as floats beside the integer one.
    registry = registry_for(lambda: MetricsSnapshot(counts, result.windows))
    exported_yes = sum(
        registry.get_sample_value(
            "ragpulse_judge_verdicts_weighted_total",
            {"judge": "groundedness", "version": "local", "rating": "yes", "stratum": name,
             "app": "help-bot", "model": model},
        ) or 0.0
        for name, _, model, _, _ in STRATA
    )
    assert exported_yes == pytest.approx(verdicts(WEIGHTED_VERDICTS, "yes") / 1e6)


@pytest.mark.slow
def test_without_rules_no_weighted_series_exist_and_the_counts_are_unchanged(
    tmp_path: Path,
) -> None:
    records, _ = synthetic_traffic(300)
    plain = run_stratified(records, tmp_path / "plain", None)
    assert not plain.weighted_windows
    assert not any(m in (WEIGHTED_VERDICTS, SEEN, SAMPLED, WEIGHTS) for m, _ in plain.counts)
    # Rules that keep everything leave the integer counts exactly as they were.
    keep_all = plan_from_data(
        {"rules": [{**rule, "rate": 1.0} for rule in RULES["rules"]], "default_rate": 1.0}, 0.1
    )
    ruled = run_stratified(records, tmp_path / "ruled", keep_all)
    assert ruled.windows == plain.windows

    def stable(counts: Counter[counting.CounterKey]) -> Counter[counting.CounterKey]:
        # Without the sampling families and the latencies, which vary run to run.
        return Counter({k: v for k, v in counts.items()
                        if k[0] not in {WEIGHTED_VERDICTS, SEEN, SAMPLED, WEIGHTS}
                        and "latency" not in k[0]})

    assert stable(ruled.counts) == stable(plain.counts)


def test_the_first_matching_rule_decides_the_stratum() -> None:
    plan = plan_from_data(RULES, 0.2)
    disliked_new = parse_event(synthetic_event(1, feedback="thumbs_down", model="model-v2",
                                               passes=True))
    new = parse_event(synthetic_event(2, feedback="positive", model="model-v2", passes=True))
    other = parse_event(synthetic_event(3, feedback=None, model="model-v1", passes=True))
    assert plan.stratum_of(disliked_new) == ("negative_feedback", 1.0)
    assert plan.stratum_of(new) == ("new_model", 0.5)
    assert plan.stratum_of(other) == (DEFAULT_STRATUM, 0.05)
    # Without default_rate in the file, unmatched events keep --sample-rate.
    assert plan_from_data({"rules": RULES["rules"]}, 0.2).stratum_of(other) == ("default", 0.2)


def test_a_governed_plan_scales_rates_but_never_below_the_floor() -> None:
    plan = plan_from_data(RULES, 1.0).governed(0.1, floor=0.02)
    assert plan.effective(1.0) == pytest.approx(0.1)
    assert plan.effective(0.05) == 0.02
    assert plan.effective(0.01) == 0.01  # a rate already under the floor is not raised


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"rules": [{"name": "neg", "when": {"feedback": "negative"}, "rate": 1.5}]},
         r"rule 1 \(neg\): 'rate' must be a number within \[0, 1\], got a number \(value "
         r"not shown\)"),
        ({"rules": [{"name": "neg", "when": {"feedback": "negative"}, "rate": 1},
                    {"name": "neg", "when": {"app": "x"}, "rate": 0.1}]},
         r"rule 2 \(neg\): the name is already taken"),
        ({"rules": [{"name": "a", "when": {"user": "bob"}, "rate": 1}]},
         r"rule 1 \(a\): cannot match on 'user'; rules read app, model, feedback"),
        ({"rules": [{"name": "Bad Name", "when": {"app": "x"}, "rate": 1}]},
         r"rule 1 \(Bad Name\): 'name' must be"),
        ({"rules": [{"name": "a", "when": {"app": "x"}}]}, r"rule 1 \(a\): 'rate' is missing"),
        ({"rules": [{"name": "a", "when": {}, "rate": 1}]}, r"rule 1 \(a\): 'when' must map"),
        ({"rules": [{"name": "a", "when": {"app": "x"}, "rate": 1, "rates": 2}]},
         r"rule 1 \(a\): unknown key 'rates'"),
        ({"rules": [{"name": "default", "when": {"app": "x"}, "rate": 1}]},
         r"rule 1 \(default\): the name is already taken by the stratum of unmatched events"),
        ({"rules": []}, r"'rules' must be a non-empty list"),
        ({"rules": [{"name": "a", "when": {"app": "x"}, "rate": 1}], "default_rate": "all"},
         r"default_rate must be a number within \[0, 1\], got a string \(value not shown\)"),
    ],
)
def test_bad_rules_are_refused_naming_the_rule(rules: object, message: str) -> None:
    with pytest.raises(SamplingRulesError, match=message):
        plan_from_data(rules, 1.0)


def test_a_bad_rules_file_is_one_settings_error_naming_the_flag_file_and_rule(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rules.yml"
    path.write_text("rules:\n  - name: neg\n    when: {feedback: negative}\n    rate: -1\n")
    with pytest.raises(SettingsError) as caught:
        build(BatchSettings, RUN.flag_names(), judges=JudgeSettings(backend="local"), sampling=path)
    assert str(caught.value) == (
        f"invalid settings: --sampling-rules: sampling rules {path}: rule 1 (neg): 'rate' must "
        "be a number within [0, 1], got a number (value not shown)"
    )
    with pytest.raises(SamplingRulesError, match=r"sampling rules .*: cannot read it"):
        load_plan(tmp_path / "missing.yml", 1.0)


@pytest.mark.slow
def test_ragpulse_run_with_a_rules_file_prints_the_weighted_ratio_and_exports_the_families(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    records, _ = synthetic_traffic(400)
    src = tmp_path / "events.jsonl"
    src.write_bytes(b"\n".join(r.raw for r in records) + b"\n")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(RULES))
    out = tmp_path / "out"
    assert main(["run", str(src), "--output", str(out), "--judge-backend", "local",
                 "--judges", "groundedness", "--window", "1h",
                 "--sampling-rules", str(rules)]) == 0
    printed = capsys.readouterr().out
    assert "w = weighted by 1 / sample rate" in printed and " w=" in printed
    families = {f.name: f for f in text_string_to_metric_families(
        (out / "metrics.prom").read_text())}
    seen = {s.labels["stratum"]: s.value for s in families["ragpulse_seen_events"].samples
            if s.name.endswith("_total")}
    assert seen == {"negative_feedback": 40, "new_model": 80, "default": 280}
    assert "ragpulse_judge_verdicts_weighted" in families


def test_ragpulse_run_refuses_a_bad_rules_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "events.jsonl"
    src.write_bytes(synthetic_traffic(1)[0][0].raw + b"\n")
    rules = tmp_path / "rules.yml"
    rules.write_text("rules:\n  - name: vip\n    when: {user: bob}\n    rate: 1\n")
    code = main(["run", str(src), "--output", str(tmp_path / "out"), "--judge-backend", "local",
                 "--sampling-rules", str(rules)])
    line = one_line_error(code, capsys.readouterr().err, allow_info=True)
    assert line.endswith("rule 1 (vip): cannot match on 'user'; rules read app, model, feedback")
