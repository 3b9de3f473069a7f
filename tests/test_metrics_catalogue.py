"""Every metric name lives in pipeline/metrics/catalogue.py: no other module of pipeline/,
judges/ or deploy/ spells one as a literal, every name the Prometheus rules and the dashboards
query is one the catalogue lists, and the collector exports catalogued names with the
catalogue's help texts."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

from prometheus_client import CollectorRegistry

from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for
from ragpulse.pipeline.windows import RatingCounts, WindowKey

REPO = Path(__file__).resolve().parent.parent
CATALOGUE = REPO / "pipeline" / "metrics" / "catalogue.py"
# A raw metric name in PromQL; recording rules' names (level:metric:operation) are not.
RAW_NAME = re.compile(r"(?<![:\w])ragpulse_\w+")
WHOLE_NAME = re.compile(r"[rbuRBU]*(['\"])(ragpulse_\w*)\1")
# What every such literal holds: a module without it has none.
QUOTED_NAME = re.compile(r"['\"]ragpulse_")


def name_literals(path: Path) -> list[str]:
    """The string literals of a module that are a bare metric name (or a name's prefix); names
    mentioned in prose (docstrings, comments, help texts) are documentation, not values."""
    text = path.read_text("utf-8")
    if not QUOTED_NAME.search(text):  # no literal can match: skip the (slow) tokenizer
        return []
    found = []
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.STRING and WHOLE_NAME.fullmatch(token.string):
            found.append(f"{path.name}:{token.start[0]}: {token.string}")
    return found


def test_no_module_but_the_catalogue_spells_a_metric_name_as_a_literal() -> None:
    sources = [p for folder in ("pipeline", "judges", "deploy")
               for p in sorted((REPO / folder).rglob("*.py")) if p != CATALOGUE]
    assert len(sources) > 50
    spelt = [hit for path in sources for hit in name_literals(path)]
    assert spelt == []


def test_the_scan_finds_a_name_spelt_as_a_literal(tmp_path: Path) -> None:
    module = tmp_path / "x.py"
    module.write_text('"""Counts ragpulse_events_total."""\nKEY = "ragpulse_events_total"\n')
    assert name_literals(module) == ['x.py:2: "ragpulse_events_total"']


def test_every_metric_the_rules_and_dashboards_query_is_in_the_catalogue() -> None:
    files = [
        *sorted((REPO / "deploy" / "prometheus" / "rules").glob("*.yml")),
        REPO / "deploy" / "kubernetes" / "prometheusrule.yaml",
        *sorted((REPO / "grafana" / "dashboards").glob("*.json")),
        *sorted((REPO / "deploy" / "monitoring").glob("*.py")),
    ]
    used = {(name, f.name) for f in files for name in RAW_NAME.findall(f.read_text("utf-8"))}
    assert {n for n, _ in used} >= {catalogue.VERDICTS, catalogue.WEIGHTED_VERDICTS}
    assert sorted((n, f) for n, f in used if n not in catalogue.ALL_NAMES) == []


def test_the_collector_learns_names_from_the_catalogue_not_from_the_cost_controls() -> None:
    tree = ast.parse((REPO / "pipeline" / "metrics" / "collector.py").read_text("utf-8"))
    imported = {f"{node.module}.{alias.name}" for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module for alias in node.names}
    assert "ragpulse.pipeline.metrics.catalogue" in imported
    costs = ("ragpulse.pipeline.costs.budget", "ragpulse.pipeline.costs.cascade")
    assert [m for m in imported if m.startswith(costs)] == []
    assert "ragpulse.pipeline.canaries.CANARY_VERDICTS" not in imported


def test_a_scrape_shows_catalogued_names_with_the_catalogue_help() -> None:
    counts = counting.merge({
        counting.key(catalogue.VERDICTS, judge="safety", version="v1", rating="yes",
                     app="a", model="m"): 3,
        counting.key(catalogue.WEIGHTED_VERDICTS, judge="safety", version="v1", rating="yes",
                     stratum="default", app="a", model="m"): 20_000_000,
        counting.key(catalogue.CASCADE_AGREEMENT, judge="safety", agree="yes",
                     selected="sample"): 1,
    })
    windows = {WindowKey(0.0, 60.0, "safety", "a", "m", "v1"): RatingCounts(yes=3)}
    registry: CollectorRegistry = registry_for(
        lambda: MetricsSnapshot(counts, windows, gauges={catalogue.HEARTBEAT: 1.0})
    )
    families = list(registry.collect())
    help_of = {**catalogue.COUNTER_HELP, **catalogue.GAUGE_HELP, **catalogue.FAMILY_HELP}
    for family in families:
        for sample in family.samples:
            assert sample.name in catalogue.ALL_NAMES, sample.name
        exposed = family.name + "_total" if family.type == "counter" else family.name
        if exposed in help_of:
            assert family.documentation == help_of[exposed], family.name
    names = {s.name for f in families for s in f.samples}
    assert {catalogue.VERDICTS, catalogue.WEIGHTED_VERDICTS, catalogue.CASCADE_AGREEMENT,
            catalogue.HEARTBEAT, "ragpulse_judge_pass_ratio"} <= names
