"""The generated Prometheus rules are current, valid for promtool and a real Prometheus, follow
the naming and annotation conventions, and behave as the promtool unit tests specify."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from processes import require_binary
from prometheus_server import PrometheusServer, prometheus_config, running_prometheus

pytestmark = pytest.mark.slow  # promtool and a real Prometheus

REPO = Path(__file__).resolve().parent.parent
PROM_DIR = REPO / "deploy" / "prometheus"
RENDER = PROM_DIR / "render_rules.py"
RULE_FILES = [PROM_DIR / "rules" / "ragpulse.rules.yml", PROM_DIR / "rules" / "ragpulse.alerts.yml"]
PROMTOOL_TESTS = sorted((REPO / "tests" / "promtool").glob("*.yaml"))
# Every promtool file replays hours of series through ~60 recording rules: several seconds each.
PROMTOOL_PARAMS = [pytest.param(p, id=p.name, marks=pytest.mark.slow) for p in PROMTOOL_TESTS]
RUNBOOK = REPO / "deploy" / "runbook.md"
EXPECTED_ALERTS = {
    "RagGroundednessDrop", "RagSafetyViolations", "RagRelevanceDrop", "RagJudgeErrorsHigh",
    "RagQualityBudgetBurn", "RagPulseStalled", "RagPulseDown", "RagConsumerLagHigh",
    "RagRecordsLost", "RagOffsetReset", "RagDeadLettersUndeliverable", "RagLabelOverflow",
    "RagJudgeCanaryDisagreement",
}
# Raw ragpulse metrics in an expression (recording rules' own names contain a colon).
RAW_METRIC = re.compile(r"(?<![:\w])(ragpulse_\w+)(\{[^}]*\})?")
# level:metric:operations (https://prometheus.io/docs/practices/rules/)
RECORD_NAME = re.compile(r"^[a-z_]+:[a-z_]+:[a-z_0-9]+$")


def promtool() -> str:
    return require_binary("promtool", "prometheus")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False,
                          timeout=120)


def rules(path: Path) -> list[dict[str, Any]]:
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> list[dict[str, Any]]:
    return rules(RULE_FILES[1])


def runbook_anchors() -> set[str]:
    """GitHub-style anchors of the runbook's headings."""
    anchors = set()
    for line in RUNBOOK.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_committed_rule_files_match_thresholds_yml() -> None:
    result = run(sys.executable, RENDER, "--check")
    assert result.returncode == 0, result.stderr


def test_rule_files_pass_promtool_check() -> None:
    result = run(promtool(), "check", "rules", *RULE_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("test_file", PROMTOOL_PARAMS)
def test_promtool_unit_tests_pass(test_file: Path) -> None:
    result = run(promtool(), "test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_are_promtool_unit_tests_for_every_alert() -> None:
    text = "".join(p.read_text(encoding="utf-8") for p in PROMTOOL_TESTS)
    tested = set(re.findall(r"alertname: (Rag\w+)", text))
    assert tested >= EXPECTED_ALERTS


def test_every_expected_alert_exists_with_for_severity_and_annotations() -> None:
    found = {rule["alert"] for rule in alerts()}
    assert found == EXPECTED_ALERTS
    for rule in alerts():
        assert rule.get("for"), rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
        for key in ("summary", "description", "runbook_url"):
            assert rule["annotations"].get(key), f"{rule['alert']} lacks {key}"


def test_quality_alert_descriptions_report_the_value_and_the_sample_size() -> None:
    for rule in alerts():
        if rule["alert"] in {"RagGroundednessDrop", "RagRelevanceDrop", "RagSafetyViolations"}:
            description = rule["annotations"]["description"]
            assert "$value" in description
            assert "ragpulse_judge_samples" in description and "query" in description


def test_runbook_urls_point_to_existing_runbook_sections() -> None:
    anchors = runbook_anchors()
    for rule in alerts():
        url = rule["annotations"]["runbook_url"]
        assert "runbook.md#" in url
        assert url.rsplit("#", 1)[1] in anchors, f"{rule['alert']}: no section for {url}"


def panel_titles() -> set[str]:
    """Every panel title of the dashboards, repeated and per-judge titles for each judge."""
    titles = set()
    for path in (REPO / "grafana" / "dashboards").glob("*.json"):
        for panel in json.loads(path.read_text(encoding="utf-8"))["panels"]:
            for judge in ("groundedness", "relevance_to_query", "safety", "JUDGE"):
                title = panel["title"].replace("$judge", judge)
                titles.add(title if judge == "JUDGE" else title.replace("JUDGE", judge))
                titles.add(re.sub(rf"^{judge}:", "JUDGE:", title))
    return titles


def test_runbook_says_for_every_alert_which_dashboard_panel_confirms_it() -> None:
    sections = re.split(r"^## ", RUNBOOK.read_text(encoding="utf-8"), flags=re.MULTILINE)
    confirm = {}
    for section in sections[1:]:
        name, body = section.split("\n", 1)
        match = re.search(r"\*\*Confirm\.\*\*(.*?)\n\n", body, re.DOTALL)
        confirm[name.strip()] = match.group(1) if match else ""
    titles = panel_titles()
    for alert in EXPECTED_ALERTS:
        named = {" ".join(b.split()) for b in re.findall(r"\*\*(.+?)\*\*", confirm.get(alert, ""),
                                                      re.DOTALL)}
        assert named & titles, f"{alert}: the runbook names no dashboard panel ({named})"


def test_recording_rules_are_named_level_metric_operation() -> None:
    names = [rule["record"] for rule in rules(RULE_FILES[0])]
    assert names
    for name in names:
        assert RECORD_NAME.match(name), name
    assert "judge_app_model:ragpulse_judge_pass_ratio:ratio_rate5m" in names
    for window in ("1m", "5m", "30m", "1h", "6h", "1d", "3d", "28d"):
        assert f"judge_app_model:ragpulse_judge_samples:increase{window}" in names
    for window in ("1m", "5m", "1h"):
        for side in ("lower", "upper"):
            assert f"judge_app_model:ragpulse_judge_pass_ratio:wilson_{side}_rate{window}" in names


def test_every_rule_selects_the_ragpulse_job_and_adds_up_its_instances() -> None:
    for rule in rules(RULE_FILES[0]) + alerts():
        name = rule.get("record") or rule["alert"]
        for metric, matchers in RAW_METRIC.findall(rule["expr"]):
            assert 'job="ragpulse"' in matchers, f"{name}: {metric} without the job selector"
        for grouping in re.findall(r"\bby \(([^)]*)\)", rule["expr"]):
            labels = {label.strip() for label in grouping.split(",")}
            assert "instance" not in labels, name
            if "judge" in labels or "topic" in labels:
                assert "job" in labels, f"{name}: sums two deployments together"


def test_quality_alerts_keep_app_and_model_labels() -> None:
    for rule in alerts():
        if rule["alert"] in {"RagGroundednessDrop", "RagRelevanceDrop", "RagJudgeErrorsHigh"}:
            assert "on (job, judge, app, model)" in rule["expr"], rule["alert"]


def test_rules_render_with_short_windows_for_a_fast_end_to_end_run(tmp_path: Path) -> None:
    overrides = {
        "windows.fast_short": "20s", "windows.fast_long": "2m", "windows.slow_short": "2m",
        "windows.slow_long": "6m", "windows.baseline": "6m", "safety.window": "3m",
        "judge_errors.window": "1m", "quality_alerts.groundedness.fast.for": "20s",
        "quality_alerts.groundedness.fast.min_samples": "5", "rule_interval": "5s",
    }
    args = [a for key, value in overrides.items() for a in ("--set", f"{key}={value}")]
    result = run(sys.executable, RENDER, *args, "--out-dir", tmp_path)
    assert result.returncode == 0, result.stderr
    fast = rules(tmp_path / "ragpulse.alerts.yml")[0]
    assert fast["for"] == "20s"
    assert "wilson_upper_rate2m" in fast["expr"] and ">= 5" in fast["expr"]
    check = run(promtool(), "check", "rules", tmp_path / "ragpulse.rules.yml",
                tmp_path / "ragpulse.alerts.yml")
    assert check.returncode == 0, check.stdout + check.stderr


def test_a_slow_path_minimum_sample_that_would_warn_on_healthy_traffic_is_rejected(
    tmp_path: Path,
) -> None:
    # 40 answers at the 90 % objective: Wilson lower bound 0.769, under the 80 % floor.
    result = run(sys.executable, RENDER, "--set",
                 "quality_alerts.groundedness.slow.min_samples=40", "--out-dir", tmp_path)
    assert result.returncode == 2
    assert "min_samples=40 is too small" in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_misspelt_threshold_override_is_rejected(tmp_path: Path) -> None:
    result = run(sys.executable, RENDER, "--set", "quality_alerts.groundedness.flor=0.9",
                 "--out-dir", tmp_path)
    assert result.returncode == 2
    assert "flor" in result.stderr
    assert not list(tmp_path.iterdir())


@pytest.fixture(scope="module")
def prometheus_with_rules(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    # The committed rules, but the SLO period's group (every 5m when shipped) evaluated every
    # second too, so that every rule has been evaluated within the test's patience.
    out = tmp_path_factory.mktemp("rules")
    rendered = run(sys.executable, RENDER, "--set", "slo.period_rule_interval=1s",
                   "--out-dir", out)
    assert rendered.returncode == 0, rendered.stderr
    files = [out / path.name for path in RULE_FILES]
    config = prometheus_config(rule_files=files, evaluation_interval="1s")
    with running_prometheus(config) as server:
        yield server


def test_a_real_prometheus_loads_and_evaluates_every_rule(
    prometheus_with_rules: PrometheusServer,
) -> None:
    def evaluated() -> list[dict[str, Any]] | None:
        groups = prometheus_with_rules.api("rules")["data"]["groups"]
        loaded = [rule for group in groups for rule in group["rules"]]
        done = all(r.get("lastEvaluation", "").startswith("20") for r in loaded)
        return loaded if loaded and done else None

    loaded = prometheus_with_rules.wait_for(evaluated, timeout=20)
    assert len(loaded) == len(rules(RULE_FILES[0])) + len(alerts())
    unhealthy = [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"]
    assert not unhealthy


def test_every_rule_expression_parses_in_a_real_prometheus(
    prometheus_with_rules: PrometheusServer,
) -> None:
    for rule in rules(RULE_FILES[0]) + alerts():
        prometheus_with_rules.query(rule["expr"])
