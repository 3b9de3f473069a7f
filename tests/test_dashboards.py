"""The Grafana dashboards are well formed, wired to the provisioned datasource, and every
panel query is PromQL that a real Prometheus accepts."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dashboard_queries import (
    BUILTIN_VARIABLES,
    grafana_panel_queries,
    iter_panels,
    load_dashboard,
    substitute,
    variables_used,
)
from processes import require_binary
from prometheus_server import PrometheusServer, running_prometheus

pytestmark = pytest.mark.slow  # a real Prometheus

REPO = Path(__file__).resolve().parent.parent
GRAFANA = REPO / "grafana"
DASHBOARDS = {
    "ragpulse-overview": GRAFANA / "dashboards" / "ragpulse-overview.json",
    "ragpulse-drilldown": GRAFANA / "dashboards" / "ragpulse-drilldown.json",
}
EXAMPLE_VALUES = {"app": "shop", "model": "m1", "judge": "groundedness"}
RULES = REPO / "deploy" / "prometheus" / "rules" / "ragpulse.rules.yml"
RECORDING_RULE_NAME = re.compile(r"\b[a-z_]+:[a-z_]+:[a-z_0-9]+\b")


@pytest.fixture(scope="module")
def prometheus() -> Iterator[PrometheusServer]:
    with running_prometheus() as server:
        yield server


def provisioned_datasource_uids() -> set[str]:
    provisioning = yaml.safe_load(
        (GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text(encoding="utf-8")
    )
    return {ds["uid"] for ds in provisioning["datasources"] if ds["type"] == "prometheus"}


def data_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Panels that query Prometheus: not rows, not text panels."""
    return [p for p in iter_panels(dashboard) if p.get("type") not in {"row", "text"}]


def text_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in iter_panels(dashboard) if p.get("type") == "text"]


def test_committed_dashboards_match_their_generator_and_thresholds() -> None:
    result = subprocess.run(
        [sys.executable, str(REPO / "deploy" / "monitoring" / "render.py"), "--check"],
        capture_output=True, text=True, check=False,
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_dashboard_has_its_fixed_uid_and_a_current_schema(uid: str) -> None:
    dashboard = load_dashboard(DASHBOARDS[uid])
    assert dashboard["uid"] == uid
    assert dashboard["schemaVersion"] >= 36


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_panel_ids_are_unique(uid: str) -> None:
    ids = [p["id"] for p in iter_panels(load_dashboard(DASHBOARDS[uid]))]
    assert len(ids) == len(set(ids)), ids


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_every_panel_and_target_uses_the_provisioned_datasource(uid: str) -> None:
    uids = provisioned_datasource_uids()
    for panel in data_panels(load_dashboard(DASHBOARDS[uid])):
        assert panel["datasource"]["uid"] in uids, panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] in uids, panel["title"]


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_every_panel_has_targets_and_every_target_an_expression(uid: str) -> None:
    for panel in data_panels(load_dashboard(DASHBOARDS[uid])):
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), f"{panel['title']} {target['refId']}"


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_every_variable_used_is_defined(uid: str) -> None:
    dashboard = load_dashboard(DASHBOARDS[uid])
    defined = {v["name"] for v in dashboard["templating"]["list"]} | set(BUILTIN_VARIABLES)
    texts = [p.get("title", "") for p in iter_panels(dashboard)]
    texts += [p.get("repeat", "") and f"${p['repeat']}" for p in iter_panels(dashboard)]
    texts += [t["expr"] for p in data_panels(dashboard) for t in p["targets"]]
    texts += [v.get("query", "") for v in dashboard["templating"]["list"]]
    texts += [p["options"]["content"] for p in text_panels(dashboard)]
    used = set().union(*(variables_used(t) for t in texts))
    assert used <= defined, f"undefined: {used - defined}"


def test_drilldown_is_filtered_by_app_and_model_variables() -> None:
    dashboard = load_dashboard(DASHBOARDS["ragpulse-drilldown"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"app", "model"} <= set(variables)
    assert "label_values(" in variables["app"]["query"]
    assert "$app" in variables["model"]["query"]
    for panel in data_panels(dashboard):
        for target in panel["targets"]:
            assert '"$app"' in target["expr"], panel["title"]


def test_overview_shows_every_required_signal() -> None:
    exprs = " ".join(e for _, e in grafana_panel_queries(DASHBOARDS["ragpulse-overview"]))
    for needle in (
        "ragpulse_judge_pass_ratio_ci_low", "ragpulse_judge_pass_ratio_ci_high",
        "ragpulse_judge_window_samples", "ragpulse_events_sampled_total",
        "ragpulse_events_judged_total", "ragpulse_judge_errors_total",
        "histogram_quantile(0.95, sum by (judge, le) (rate(ragpulse_judge_latency_seconds_bucket",
        "ragpulse_judge_tokens_total", "ragpulse_consumer_lag", "ragpulse_dead_letters_total",
        'ALERTS{alertname=~"Rag.*"', "ragpulse_retrieved_chunks_total",
        "ragpulse_events_without_context_total",
        "rate(ragpulse_agent_latency_seconds_bucket", "ragpulse_agent_input_tokens_total",
        "ragpulse_agent_output_tokens_total", "ragpulse_agent_total_tokens_total",
    ):
        assert needle in exprs, needle


def test_every_recording_rule_a_panel_reads_is_generated() -> None:
    groups = yaml.safe_load(RULES.read_text(encoding="utf-8"))["groups"]
    recorded = {rule["record"] for group in groups for rule in group["rules"]}
    read = {name for path in DASHBOARDS.values()
            for _, expr in grafana_panel_queries(path, EXAMPLE_VALUES)
            for name in RECORDING_RULE_NAME.findall(expr)}
    assert read, "no panel reads a recording rule"
    assert read <= recorded, f"not generated: {read - recorded}"


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_dashboard_shows_the_error_budget_left_and_an_insufficient_data_state(uid: str) -> None:
    panels = data_panels(load_dashboard(DASHBOARDS[uid]))
    exprs = {p["title"]: " ".join(t["expr"] for t in p["targets"]) for p in panels}
    assert any("ragpulse_judge_slo_budget_remaining" in e for e in exprs.values())
    state = [p for p in panels if "ragpulse_judge_samples:sufficient" in exprs[p["title"]]]
    assert state
    for p in state:
        mapped = p["fieldConfig"]["defaults"]["mappings"][0]["options"]
        assert mapped["0"]["text"] == "insufficient data", p["title"]


def test_query_extraction_substitutes_variables_and_rejects_unknown_ones() -> None:
    queries = grafana_panel_queries(DASHBOARDS["ragpulse-drilldown"], EXAMPLE_VALUES)
    assert queries and all("$" not in expr for _, expr in queries)
    assert any('app="shop", model="m1"' in expr for _, expr in queries)
    assert ("groundedness: pass ratio with 95% band" in {t for t, _ in queries})
    with pytest.raises(KeyError, match="no value for template variable"):
        grafana_panel_queries(DASHBOARDS["ragpulse-drilldown"])
    assert substitute("x[${__rate_interval}] [[app]]", {"__rate_interval": "20s",
                                                          "app": "a"}) == "x[20s] a"


@pytest.mark.parametrize("uid", sorted(DASHBOARDS))
def test_every_panel_query_parses_in_a_real_prometheus(
    uid: str, prometheus: PrometheusServer
) -> None:
    queries = grafana_panel_queries(DASHBOARDS[uid], EXAMPLE_VALUES)
    assert queries
    errors = []
    for title, expr in queries:
        body = prometheus.api("query", {"query": expr})
        if body["status"] != "success":
            errors.append(f"{title}: {body.get('error')}\n  {expr}")
    assert not errors, "\n".join(errors)


def test_a_malformed_panel_query_would_be_reported(prometheus: PrometheusServer) -> None:
    body = prometheus.api("query", {"query": "sum by (judge) (rate(x[$__rate_interval])"})
    assert body["status"] == "error"


def test_variable_queries_parse_in_a_real_prometheus(prometheus: PrometheusServer) -> None:
    dashboard = load_dashboard(DASHBOARDS["ragpulse-drilldown"])
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        # label_values(<selector>, label) is Grafana's; the selector must be valid PromQL.
        inner = variable["query"].removeprefix("label_values(").rsplit(",", 1)[0]
        prometheus.query(substitute(inner, EXAMPLE_VALUES))


def test_drilldown_explains_its_failures_with_the_dashboards_own_filters_and_time_range() -> None:
    dashboard = load_dashboard(DASHBOARDS["ragpulse-drilldown"])
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["kafka_bootstrap"]["type"] == "textbox"
    assert variables["kafka_bootstrap"]["current"]["value"] == "kafka:9092"
    assert variables["topic"]["current"]["value"] == "chat-inference"
    (explain,) = [p for p in text_panels(dashboard) if p["title"] == "Explain these failures"]
    assert explain["options"]["mode"] == "markdown" and "targets" not in explain
    assert ("ragpulse explain --kafka-bootstrap $kafka_bootstrap --topic $topic --app $app "
            "--model $model --judge $judge --since ${__from:date:seconds} "
            "--until ${__to:date:seconds}") in explain["options"]["content"]
    assert variables_used("--since ${__from:date:seconds}") == {"__from"}


def test_failing_answers_panel_asks_for_exemplars_and_the_query_runs_for_them(
    prometheus: PrometheusServer,
) -> None:
    dashboard = load_dashboard(DASHBOARDS["ragpulse-drilldown"])
    (failing,) = [p for p in data_panels(dashboard)
                  if p["title"] == "Failing answers (hover a dot for its request_id)"]
    (target,) = failing["targets"]
    assert target["exemplar"] is True
    assert 'job="ragpulse"' in target["expr"] and 'rating=~"no|error"' in target["expr"]
    expr = substitute(target["expr"], {**BUILTIN_VARIABLES, **EXAMPLE_VALUES})
    # Grafana fetches the dots from the exemplar API with the panel's query.
    body = prometheus.api("query_exemplars", {"query": expr, "start": "0", "end": "60"})
    assert body["status"] == "success", body


def test_the_stall_panel_shows_the_stalest_of_two_instances(tmp_path: Path) -> None:
    # Two `serve --instances 2` targets; instance 1's loop stops at 5m. At 20m the panel must
    # show its 15 minutes (what RagPulseStalled fires on), not instance 0's fresh heartbeat.
    panel = "Seconds since last complete window / heartbeat"
    exprs = [e for t, e in grafana_panel_queries(DASHBOARDS["ragpulse-overview"]) if t == panel]
    heartbeat = next(e for e in exprs if "heartbeat" in e)
    window = next(e for e in exprs if "window" in e)
    series = []
    for name in ("ragpulse_heartbeat_timestamp_seconds",
                 "ragpulse_last_complete_window_end_timestamp_seconds"):
        series += [
            {"series": f'{name}{{job="ragpulse",instance="ragpulse-0:9464"}}',
             "values": "0+60x20"},
            {"series": f'{name}{{job="ragpulse",instance="ragpulse-1:9464"}}',
             "values": "0+60x5 300x15"},
        ]
    spec = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": expr, "eval_time": "20m", "exp_samples": [{"labels": "{}", "value": 900}]}
                for expr in (heartbeat, window)
            ],
        }],
    }
    test_file = tmp_path / "stall_panel.test.yaml"
    test_file.write_text(yaml.safe_dump(spec))
    done = subprocess.run([require_binary("promtool", "prometheus"), "test", "rules",
                           str(test_file)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
