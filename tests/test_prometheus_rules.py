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

import promql_parser
import pytest
import yaml
from processes import require_binary
from prometheus_server import PrometheusServer, prometheus_config, running_prometheus

pytestmark = pytest.mark.slow  # promtool and a real Prometheus

REPO = Path(__file__).resolve().parent.parent
PROM_DIR = REPO / "deploy" / "prometheus"
RENDER = REPO / "deploy" / "monitoring" / "render.py"
RULE_FILES = [PROM_DIR / "rules" / "ragpulse.rules.yml", PROM_DIR / "rules" / "ragpulse.alerts.yml"]
PROMTOOL_TESTS = sorted((REPO / "tests" / "promtool").glob("*.yaml"))
# Every promtool file replays hours of series through ~60 recording rules: several seconds each.
PROMTOOL_PARAMS = [pytest.param(p, id=p.name, marks=pytest.mark.slow) for p in PROMTOOL_TESTS]
RUNBOOK = REPO / "deploy" / "runbook.md"
EXPECTED_ALERTS = {
    "RagGroundednessDrop", "RagSafetyViolations", "RagRelevanceDrop", "RagJudgeErrorsHigh",
    "RagQualityBudgetBurn", "RagPulseStalled", "RagPulseDown", "RagConsumerLagHigh",
    "RagRecordsLost", "RagOffsetReset", "RagDeadLettersUndeliverable", "RagLabelOverflow",
    "RagJudgeCanaryDisagreement", "RagLateEventsHigh", "RagToolCallErrorsHigh",
    "RagKnowledgeRetentionDrop", "RagJudgeHumanAgreementLow",
}
# Raw ragpulse metrics in an expression (recording rules' own names contain a colon).
RAW_METRIC = re.compile(r"(?<![:\w])(ragpulse_\w+)(\{[^}]*\})?")
# level:metric:operations (https://prometheus.io/docs/practices/rules/)
RECORD_NAME = re.compile(r"^[a-z_]+:[a-z_]+:[a-z_0-9]+$")


def promtool() -> str:
    return require_binary("promtool", "prometheus")


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    # A guard against a hang, not a speed limit: groundedness.test.yaml alone took 2m29s of
    # wall time (36 s of CPU) on a loaded two-core machine.
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, check=False,
                          timeout=900)


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


# A metric, rule or alert name, wherever it occurs in a rule or a test case.
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def rules_a_test_needs(test_file: Path, directory: Path) -> Path:
    """A copy of `test_file` whose rule files keep only the rules its cases read: the alerts it
    names, the recording rules of the series its expressions query, and, transitively, the
    recording rules those rules read (their expressions and templates). Each kept rule is the
    committed one (its YAML loaded and dumped again), in the same group and order, so what it
    evaluates to at every step is what the whole file gives: a rule reads only the series it
    names. promtool
    evaluates every rule at every step, and most files exercise a few of the ~100 rules over
    hours of steps (stop 38: the 13 files took 225 CPU-seconds, a sixteenth of the suite)."""
    test = yaml.safe_load(test_file.read_text(encoding="utf-8"))
    files = [(test_file.parent / f).resolve() for f in test["rule_files"]]
    groups = [(f, g) for f in files
              for g in yaml.safe_load(f.read_text(encoding="utf-8"))["groups"]]
    defined: dict[str, list[dict[str, Any]]] = {}
    for _, group in groups:
        for rule in group["rules"]:
            defined.setdefault(rule.get("record") or rule["alert"], []).append(rule)
    wanted = set()
    for case in test["tests"]:
        wanted |= {c["alertname"] for c in case.get("alert_rule_test", [])}
        wanted |= {n for c in case.get("promql_expr_test", []) for n in NAME.findall(c["expr"])}
    kept: set[int] = set()  # id() of each kept rule
    todo = [n for n in wanted if n in defined]
    while todo:
        for rule in defined.pop(todo.pop(), []):
            kept.add(id(rule))
            todo += [n for n in NAME.findall(yaml.safe_dump(rule)) if n in defined]
    copies = []
    for i, f in enumerate(files):
        trimmed = [{**g, "rules": [r for r in g["rules"] if id(r) in kept]}
                   for source, g in groups if source == f]
        copy = directory / f"{i}-{f.name}"
        copy.write_text(yaml.safe_dump({"groups": trimmed}, sort_keys=False), encoding="utf-8")
        copies.append(str(copy))
    trimmed_test = directory / test_file.name
    trimmed_test.write_text(yaml.safe_dump({**test, "rule_files": copies}, sort_keys=False),
                            encoding="utf-8")
    return trimmed_test


@pytest.mark.parametrize("test_file", PROMTOOL_PARAMS)
def test_promtool_unit_tests_pass(test_file: Path, tmp_path: Path) -> None:
    result = run(promtool(), "test", "rules", rules_a_test_needs(test_file, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_there_are_promtool_unit_tests_for_every_alert() -> None:
    text = "".join(p.read_text(encoding="utf-8") for p in PROMTOOL_TESTS)
    tested = set(re.findall(r"alertname: (Rag\w+)", text))
    assert tested >= EXPECTED_ALERTS


def test_every_promtool_file_has_a_case_where_an_alert_fires() -> None:
    # A file whose alert cases all expect silence would still pass if every alert broke.
    for path in PROMTOOL_TESTS:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
        firing = [case for test in document["tests"] for case in test.get("alert_rule_test", [])
                  if case.get("exp_alerts")]
        assert firing, f"{path.name}: no alert_rule_test case expects an alert to fire"


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
            for judge in ("groundedness", "relevance_to_query", "safety", "knowledge_retention",
                          "JUDGE"):
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


def walk(node: Any) -> Iterator[Any]:
    """Every node of a parsed PromQL expression, ``node`` first."""
    yield node
    for attr in ("lhs", "rhs", "expr", "args", "vector_selector", "param"):
        child = getattr(node, attr, None)
        for item in child if isinstance(child, list) else [child]:
            if item is not None:
                yield from walk(item)


def deployment_mixing(expr: str, job: str, deployment: set[str]) -> list[str]:
    """What in ``expr`` could add up or join two deployments scraped by one Prometheus.

    A selector without the ``job="<job>"`` matcher (recorded series included: the other
    deployment records the same names), an aggregation that drops a deployment label or keeps
    ``instance``, and a vector matching not on the job or ignoring a deployment label.
    """
    faults: list[str] = []
    for node in walk(promql_parser.parse(expr)):
        if isinstance(node, promql_parser.VectorSelector):
            if not any(m.name == "job" and m.op == promql_parser.MatchOp.Equal
                       and m.value == job for m in node.matchers.matchers):
                faults.append(f"{node} lacks job=\"{job}\"")
        elif isinstance(node, promql_parser.AggregateExpr):
            grouping = node.modifier  # None: sum(...) keeps no label at all
            labels = set(grouping.labels) if grouping else set()
            if grouping is None or grouping.type == promql_parser.AggModifierType.By:
                mixes = not deployment <= labels or "instance" in labels
            else:
                mixes = bool(deployment & labels)
            if mixes:
                faults.append(f"{node} adds up deployments or instances")
        elif isinstance(node, promql_parser.BinaryExpr) and node.modifier:
            # No matching clause: one-to-one on all labels, the job included.
            if (matching := node.modifier.matching) is None:
                continue
            labels = set(matching.labels)
            if matching.type == promql_parser.LabelModifierType.Include:
                # on (job, judge) is enough: the SLO objective series are per job.
                mixes = "job" not in labels
            else:
                mixes = bool(deployment & labels)
            if mixes:
                faults.append(f"{node.modifier} joins across deployments")
    return faults


def test_the_deployment_check_catches_selectors_and_aggregations_that_mix_deployments() -> None:
    job = {"job"}
    kept = 'sum by (job, judge) (rate(x{job="ragpulse"}[5m]))'
    assert deployment_mixing(kept, "ragpulse", job) == []
    for mixing in (
        'judge_app_model:r:ratio_rate5m{judge="groundedness"} < 0.8',  # another job's series
        'sum by (judge) (rate(x{job="ragpulse"}[5m]))',  # sums two deployments
        'sum(x{job="ragpulse"})',
        'sum without (job) (x{job="ragpulse"})',
        'sum by (job, instance) (x{job="ragpulse"})',
        '(1 - a{job="ragpulse"}) / on (judge) group_left () (1 - b{job="ragpulse"})',
        'a{job="ragpulse"} / ignoring (job) b{job="ragpulse"}',
        'absent(up{job=~"ragpulse|other"})',
    ):
        assert deployment_mixing(mixing, "ragpulse", job), mixing


def test_every_rule_selects_its_job_and_keeps_the_deployment_labels() -> None:
    thresholds = yaml.safe_load((PROM_DIR / "thresholds.yml").read_text(encoding="utf-8"))
    job, deployment = thresholds["job"], set(thresholds["deployment_labels"])
    for rule in rules(RULE_FILES[0]) + alerts():
        name = rule.get("record") or rule["alert"]
        assert deployment_mixing(rule["expr"], job, deployment) == [], name
        nodes = walk(promql_parser.parse(rule["expr"]))
        if not any(isinstance(node, promql_parser.VectorSelector) for node in nodes):
            # No selector at all (the SLO objectives' vector(0.9)): the rule labels the job.
            assert rule.get("labels", {}).get("job") == job, f"{name} carries no job label"


def test_two_deployments_in_one_prometheus_keep_their_own_series_and_objectives(
    tmp_path: Path,
) -> None:
    # Two ragpulse deployments, one Prometheus: each rule file reads only its own job's series
    # and joins its own SLO objective (99 % and 95 % for safety), so equal pass ratios (90 %)
    # give each its own burn rate instead of one deployment's rules overwriting the other's.
    for job, objective in (("ragpulse", "0.99"), ("ragpulse-b", "0.95")):
        rendered = run(sys.executable, RENDER, "--set", f"job={job}", "--set",
                       f"slo.objectives.safety={objective}", "--out-dir", tmp_path / job)
        assert rendered.returncode == 0, rendered.stderr
    series = "ragpulse_judge_verdicts_total{{job={job!r}, instance={job!r}, judge='safety', " \
             "app='shop', model='m1', rating={rating!r}}}"
    labels = "{{job={job!r}, judge='safety', app='shop', model='m1'}}"
    unit_test = {
        "rule_files": [str(tmp_path / job / "ragpulse.rules.yml")
                       for job in ("ragpulse", "ragpulse-b")],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": series.format(job=job, rating=rating), "values": f"0+{n}x90"}
                for job in ("ragpulse", "ragpulse-b") for rating, n in (("yes", 9), ("no", 1))
            ],
            "promql_expr_test": [
                {"expr": "round(judge_app_model:ragpulse_judge_slo_burn_rate:ratio_rate1h, 0.001)",
                 "eval_time": "60m",
                 "exp_samples": [{"labels": labels.format(job="ragpulse"), "value": 10},
                                 {"labels": labels.format(job="ragpulse-b"), "value": 2}]},
                {"expr": "count(judge_app_model:ragpulse_judge_pass_ratio:wilson_lower_rate5m)",
                 "eval_time": "60m", "exp_samples": [{"labels": "{}", "value": 2}]},
            ],
        }],
    }
    test_file = tmp_path / "two_deployments.test.yaml"
    test_file.write_text(yaml.safe_dump(unit_test), encoding="utf-8")
    result = run(promtool(), "test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


def test_quality_alerts_keep_app_and_model_labels() -> None:
    for rule in alerts():
        if rule["alert"] in {"RagGroundednessDrop", "RagRelevanceDrop", "RagJudgeErrorsHigh"}:
            assert "on (job, judge, version, app, model)" in rule["expr"], rule["alert"]


def test_the_pass_ratios_of_two_prompt_versions_are_recorded_apart_never_added_up(
    tmp_path: Path,
) -> None:
    # The prompt of safety changed: v1f2 passes 90 %, v2f2 50 %. Added up they would read
    # 70 %, a ratio no prompt has.
    series = "ragpulse_judge_verdicts_total{{job='ragpulse', instance='a', judge='safety', " \
             "version={version!r}, app='shop', model='m1', rating={rating!r}}}"
    labels = "{{job='ragpulse', judge='safety', version={version!r}, app='shop', model='m1'}}"
    unit_test = {
        "rule_files": [str(RULE_FILES[0])],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": series.format(version=version, rating=rating), "values": f"0+{n}x90"}
                for version, counts in (("v1f2", (("yes", 9), ("no", 1))),
                                        ("v2f2", (("yes", 5), ("no", 5))))
                for rating, n in counts
            ],
            "promql_expr_test": [{
                "expr": "round(judge_app_model:ragpulse_judge_pass_ratio:ratio_rate1h, 0.001)",
                "eval_time": "60m",
                "exp_samples": [{"labels": labels.format(version="v1f2"), "value": 0.9},
                                {"labels": labels.format(version="v2f2"), "value": 0.5}],
            }],
        }],
    }
    test_file = tmp_path / "versions.test.yaml"
    test_file.write_text(yaml.safe_dump(unit_test), encoding="utf-8")
    result = run(promtool(), "test", "rules", test_file)
    assert result.returncode == 0, result.stdout + result.stderr


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
