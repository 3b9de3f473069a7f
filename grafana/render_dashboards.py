"""Render the ragpulse Grafana dashboards (grafana/dashboards/*.json).

For operators: the dashboards are generated so that floors and limits drawn on the panels
come from the same deploy/prometheus/thresholds.yml as the alerts.  Run
``python grafana/render_dashboards.py`` after changing either; ``--check`` exits 1 when the
committed JSON is stale (tests/test_dashboards.py runs it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
THRESHOLDS = HERE.parent / "deploy" / "prometheus" / "thresholds.yml"
DASHBOARDS = HERE / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "prometheus"}
JUDGES = ("groundedness", "safety", "relevance_to_query")
RATE = "$__rate_interval"
# Recording rules of deploy/prometheus/render_rules.py the panels read.
BUDGET_LEFT = "judge_app_model:ragpulse_judge_slo_budget_remaining:ratio"
BURN_RATE = "judge_app_model:ragpulse_judge_slo_burn_rate:ratio_rate"
SUFFICIENT = "judge_app_model:ragpulse_judge_samples:sufficient"
PASS_RATIO = "judge_app_model:ragpulse_judge_pass_ratio"
CANARY_DISAGREEMENT = "judge:ragpulse_canary_disagreement:ratio_rate"
CANARY_GRADED = "judge:ragpulse_canary_graded:increase"


class Layout:
    """Hands out panel ids and grid positions (24 columns wide), row by row."""

    def __init__(self) -> None:
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_height = 0

    def place(self, width: int, height: int) -> dict[str, int]:
        if self.x + width > 24:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        pos = {"h": height, "w": width, "x": self.x, "y": self.y}
        self.x += width
        self.row_height = max(self.row_height, height)
        return pos

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id - 1

    def row(self, title: str) -> dict[str, Any]:
        if self.x:
            self.x, self.y, self.row_height = 0, self.y + self.row_height, 0
        panel = {"type": "row", "title": title, "id": self.new_id(), "collapsed": False,
                 "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "panels": []}
        self.y += 1
        return panel


def target(expr: str, legend: str = "", ref: str = "A", **extra: Any) -> dict[str, Any]:
    """One PromQL query of a panel."""
    return {"datasource": DATASOURCE, "refId": ref, "expr": expr, "legendFormat": legend,
            **extra}


def panel(layout: Layout, kind: str, title: str, targets: list[dict[str, Any]], *,
          width: int = 12, height: int = 8, description: str = "", unit: str = "short",
          thresholds: list[dict[str, Any]] | None = None, overrides: list[Any] | None = None,
          options: dict[str, Any] | None = None, custom: dict[str, Any] | None = None,
          mappings: list[dict[str, Any]] | None = None,
          extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """A panel with ids, layout, datasource and field config filled in."""
    refs = "ABCDEFGH"
    for index, t in enumerate(targets):
        t["refId"] = refs[index]
    defaults: dict[str, Any] = {"unit": unit}
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if custom:
        defaults["custom"] = custom
    if mappings:
        defaults["mappings"] = mappings
        defaults["color"] = {"mode": "thresholds"}
    result = {
        "id": layout.new_id(),
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": layout.place(width, height),
        "targets": targets,
        "fieldConfig": {"defaults": defaults, "overrides": overrides or []},
        "options": options or {},
    }
    result.update(extra or {})
    return result


def floor_steps(floor: float) -> list[dict[str, Any]]:
    """Red below the alert floor, green from it."""
    return [{"color": "red", "value": None}, {"color": "green", "value": floor}]


def ci_band_overrides() -> list[dict[str, Any]]:
    """Draw the ci_low/ci_high series as a shaded band around the ratio."""
    return [
        {"matcher": {"id": "byRegexp", "options": ".*ci_high.*"},
         "properties": [{"id": "custom.fillBelowTo", "value": "ci_low"},
                        {"id": "custom.lineWidth", "value": 0},
                        {"id": "custom.fillOpacity", "value": 20}]},
        {"matcher": {"id": "byRegexp", "options": ".*ci_low.*"},
         "properties": [{"id": "custom.lineWidth", "value": 0}]},
    ]


def sufficiency_mappings() -> list[dict[str, Any]]:
    """Show the 0/1 of the `...:samples:sufficient` rule as words, insufficient data in orange."""
    return [{"type": "value", "options": {
        "0": {"text": "insufficient data", "color": "orange", "index": 0},
        "1": {"text": "enough data", "color": "green", "index": 1}}}]


def budget_steps() -> list[dict[str, Any]]:
    """Red once the budget is spent, orange under a quarter left."""
    return [{"color": "red", "value": None}, {"color": "orange", "value": 0},
            {"color": "green", "value": 0.25}]


def dashboard(uid: str, title: str, panels: list[dict[str, Any]],
              variables: list[dict[str, Any]], description: str) -> dict[str, Any]:
    """Dashboard envelope (schemaVersion 39, fixed uid)."""
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["ragpulse"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "utc",
        "annotations": {"list": []},
        "links": [{"title": "ragpulse dashboards", "type": "dashboards", "tags": ["ragpulse"],
                   "asDropdown": False, "includeVars": True, "keepTime": True}],
        "templating": {"list": variables},
        "panels": panels,
    }


def query_variable(name: str, label: str, query: str, *, multi: bool = False,
                   include_all: bool = False) -> dict[str, Any]:
    """A template variable filled by a label_values() query."""
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "definition": query, "query": {"query": query, "refId": f"{name}-values"},
        "refresh": 2, "sort": 1, "multi": multi, "includeAll": include_all,
        "current": {}, "options": [], "hide": 0,
    }


def textbox_variable(name: str, label: str, default: str) -> dict[str, Any]:
    """A free-text template variable with a default value."""
    return {
        "name": name, "label": label, "type": "textbox", "query": default,
        "current": {"text": default, "value": default},
        "options": [{"selected": True, "text": default, "value": default}], "hide": 0,
    }


def text_panel(layout: Layout, title: str, content: str, *, width: int, height: int,
               description: str = "") -> dict[str, Any]:
    """A markdown panel (no query; Grafana substitutes template variables in it)."""
    return {
        "id": layout.new_id(), "type": "text", "title": title, "description": description,
        "gridPos": layout.place(width, height),
        "options": {"mode": "markdown", "content": content},
    }


EXPLAIN_TEXT = (
    "The failing answers of this time range, newest first, with the judges' rationales:\n\n"
    "```\nragpulse explain --kafka-bootstrap $kafka_bootstrap --topic $topic --app $app "
    "--model $model --judge $judge --since ${__from:date:seconds} --until ${__to:date:seconds}"
    "\n```\n\n"
    "Add --json for full rationales; with docker compose prefix `docker compose exec ragpulse`."
    "\n\nWith several judges selected, run it once per judge (--judge takes one). Set "
    "*Kafka bootstrap* and *Inference-log topic* above to serve's `--kafka-bootstrap` and "
    "`--topic`.\n"
)


def overview(cfg: dict[str, Any]) -> dict[str, Any]:
    """All apps: quality per judge, traffic, judges, retrieval, pipeline health, alerts."""
    floors = {j: float(spec["floor"]) for j, spec in cfg["quality_alerts"].items()}
    floors.setdefault("safety", 1 - float(cfg["safety"]["max_unsafe_ratio"]))
    lay = Layout()
    panels: list[dict[str, Any]] = [lay.row("Answer quality (latest complete window)")]
    for judge in JUDGES:
        weighted = (
            f'sum(ragpulse_judge_pass_ratio{{judge="{judge}"}} '
            f'* ragpulse_judge_window_samples{{judge="{judge}"}}) '
            f'/ sum(ragpulse_judge_window_samples{{judge="{judge}"}})'
        )
        panels.append(panel(
            lay, "stat", f"{judge}: pass ratio now", [target(weighted, judge)], width=8,
            height=5, unit="percentunit", thresholds=floor_steps(floors[judge]),
            description=(f"Sample-weighted pass ratio over all apps in the latest complete "
                         f"window; red below the alert floor ({floors[judge]:.0%})."),
            options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background",
                     "graphMode": "area", "textMode": "value_and_name"},
        ))
    for judge in JUDGES:
        sel = f'{{judge="{judge}"}}'
        panels.append(panel(
            lay, "timeseries", f"{judge}: pass ratio with 95% band", [
                target(f"ragpulse_judge_pass_ratio{sel}", "{{app}} / {{model}}"),
                target(f"ragpulse_judge_pass_ratio_ci_low{sel}", "{{app}} / {{model}} ci_low"),
                target(f"ragpulse_judge_pass_ratio_ci_high{sel}", "{{app}} / {{model}} ci_high"),
            ], width=8, unit="percentunit", thresholds=floor_steps(floors[judge]),
            overrides=ci_band_overrides(),
            custom={"thresholdsStyle": {"mode": "line+area"}, "fillOpacity": 0},
            description="Per app and model; the band is the 95 % Wilson interval. The "
                        "threshold line is the alert floor.",
        ))
    panels.append(panel(
        lay, "timeseries", "Judged answers per complete window", [
            target("sum by (judge) (ragpulse_judge_window_samples)", "{{judge}}")],
        width=12, description="yes+no verdicts behind each ratio (errors excluded): a ratio on "
                              "few samples has a wide band and cannot page."))
    panels.append(panel(
        lay, "timeseries", "Verdicts by rating", [
            target(f"sum by (judge, rating) (rate(ragpulse_judge_verdicts_total[{RATE}]))",
                   "{{judge}} {{rating}}")],
        width=12, unit="reqps", custom={"stacking": {"mode": "normal"}, "fillOpacity": 30}))

    slo = cfg["slo"]
    period = str(slo["period"])
    panels.append(lay.row(f"Quality SLOs ({period}) and data sufficiency"))
    for judge, objective in slo["objectives"].items():
        panels.append(panel(
            lay, "stat", f"{judge}: error budget left", [
                target(f'min({BUDGET_LEFT}{period}{{judge="{judge}"}})', judge)],
            width=8, height=5, unit="percentunit", thresholds=budget_steps(),
            description=(f"Share of the {period} error budget ({1 - float(objective):.0%} of "
                         f"judged answers may fail: objective {float(objective):.0%}) not yet "
                         f"spent, for the app/model that spent most. Negative: overspent."),
            options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background",
                     "graphMode": "area", "textMode": "value_and_name"},
        ))
    panels.append(panel(
        lay, "table", "Error budget left and burn rate per app / model", [
            target(f"{BUDGET_LEFT}{period}", "", instant=True, format="table"),
            target(f"{BURN_RATE}{slo['burn_rate_alerts'][0]['long']}", "", instant=True,
                   format="table"),
        ], width=12, unit="percentunit",
        description="Budget left over the SLO period (A) and the burn rate over the page tier's "
                    "long window (B: 1 = spending exactly the budget; RagQualityBudgetBurn pages "
                    "at the tier factors of thresholds.yml).",
        extra={"transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {
                "excludeByName": {"Time": True, "__name__": True, "job": True},
                "renameByName": {"Value #A": "budget left", "Value #B": "burn rate"}}}]}))
    panels.append(panel(
        lay, "state-timeline", "Enough judged answers to page?", [
            target(SUFFICIENT, "{{judge}} {{app}} / {{model}}")],
        width=12, options={"showValue": "never", "mergeValues": True},
        mappings=sufficiency_mappings(),
        description="Per series: orange = insufficient data (fewer judged answers in the page's "
                    "window than its minimum sample; no quality page can fire and the ratios "
                    "above are noise), green = enough data."))

    panels.append(lay.row("Traffic"))
    panels.append(panel(
        lay, "timeseries", "Events received, sampled, judged", [
            target(f"sum by (outcome) (rate(ragpulse_events_total[{RATE}]))",
                   "received {{outcome}}"),
            target(f"sum(rate(ragpulse_events_sampled_total[{RATE}]))", "sampled"),
            target(f"sum(rate(ragpulse_events_judged_total[{RATE}]))", "judged"),
        ], width=8, unit="reqps"))
    panels.append(panel(
        lay, "timeseries", "Dead letters and late events", [
            target(f"sum(rate(ragpulse_dead_letters_total[{RATE}]))", "dead letters"),
            target(f"sum(rate(ragpulse_late_events_total[{RATE}]))", "late events"),
        ], width=8, unit="reqps",
        description="Dead letters: records that could not be parsed (see dead_letter.jsonl). "
                    "Late events: later than the allowed lateness, kept out of windows."))
    panels.append(panel(
        lay, "timeseries", "Consumer lag by topic",
        [target("sum by (topic) (ragpulse_consumer_lag)", "{{topic}}")], width=8,
        thresholds=[{"color": "green", "value": None},
                    {"color": "red", "value": int(cfg["consumer_lag"]["max_records"])}],
        custom={"thresholdsStyle": {"mode": "line"}}))

    panels.append(lay.row("Judges"))
    panels.append(panel(
        lay, "timeseries", "Judge errors by cause", [
            target(f"sum by (judge, cause) (rate(ragpulse_judge_errors_total[{RATE}]))",
                   "{{judge}} {{cause}}")],
        width=8, unit="reqps", custom={"stacking": {"mode": "normal"}, "fillOpacity": 30}))
    panels.append(panel(
        lay, "timeseries", "Judge error ratio", [
            target(f'sum by (judge) (rate(ragpulse_judge_verdicts_total{{rating="error"}}'
                   f"[{RATE}])) / sum by (judge) (rate(ragpulse_judge_verdicts_total[{RATE}]))",
                   "{{judge}}")],
        width=8, unit="percentunit",
        thresholds=[{"color": "green", "value": None},
                    {"color": "red", "value": float(cfg["judge_errors"]["max_ratio"])}],
        custom={"thresholdsStyle": {"mode": "line"}}))
    panels.append(panel(
        lay, "timeseries", "Judge latency p50 / p95", [
            target("histogram_quantile(0.5, sum by (judge, le) "
                   f"(rate(ragpulse_judge_latency_seconds_bucket[{RATE}])))", "{{judge}} p50"),
            target("histogram_quantile(0.95, sum by (judge, le) "
                   f"(rate(ragpulse_judge_latency_seconds_bucket[{RATE}])))", "{{judge}} p95"),
        ], width=8, unit="s"))
    panels.append(panel(
        lay, "timeseries", "Judge tokens", [
            target(f"sum by (judge, kind) (rate(ragpulse_judge_tokens_total[{RATE}]))",
                   "{{judge}} {{kind}}")], width=12, unit="short",
        description="Tokens per second sent to / received from the judge backend."))
    panels.append(panel(
        lay, "timeseries", "Judge calls by backend", [
            target(f"sum by (judge, backend) (rate(ragpulse_judge_calls_total[{RATE}]))",
                   "{{judge}} {{backend}}")], width=12, unit="reqps"))
    canary = cfg["canaries"]
    cw = str(canary["window"])
    panels.append(panel(
        lay, "timeseries", "Judge agreement with the golden set (canaries)", [
            target(f"{CANARY_DISAGREEMENT}{cw}", f"{{{{judge}}}} disagreement ({cw})"),
            target(f"{CANARY_GRADED}{cw}", f"{{{{judge}}}} graded canaries ({cw})"),
        ], width=24, unit="percentunit",
        thresholds=[{"color": "green", "value": None},
                    {"color": "red", "value": float(canary["max_disagreement"])}],
        custom={"thresholdsStyle": {"mode": "line"}},
        overrides=[{"matcher": {"id": "byRegexp", "options": ".*graded canaries.*"},
                    "properties": [{"id": "unit", "value": "short"},
                                   {"id": "custom.axisPlacement", "value": "right"},
                                   {"id": "custom.drawStyle", "value": "bars"},
                                   {"id": "custom.fillOpacity", "value": 20}]}],
        description=(f"Share of the human-labelled canaries (serve --canary-file) each judge "
                     f"graded differently from their label over {cw}, judge errors left out; "
                     f"bars: canaries graded (right axis). RagJudgeCanaryDisagreement warns "
                     f"above the line ({float(canary['max_disagreement']):.0%}) with at least "
                     f"{int(canary['min_graded'])} graded. A step here together with a step in "
                     f"a pass ratio means the judge moved, not the chatbot.")))

    panels.append(lay.row("Retrieval"))
    panels.append(panel(
        lay, "timeseries", "Retrieved chunks per judged answer", [
            target(f"sum by (app) (rate(ragpulse_retrieved_chunks_total[{RATE}])) / "
                   f"sum by (app) (rate(ragpulse_events_judged_total[{RATE}]))", "{{app}}")],
        width=12, description="Fewer chunks usually precede a groundedness drop."))
    panels.append(panel(
        lay, "timeseries", "Answers without retrieved context", [
            target(f"sum by (app) (rate(ragpulse_events_without_context_total[{RATE}])) / "
                   f"sum by (app) (rate(ragpulse_events_judged_total[{RATE}]))", "{{app}}")],
        width=12, unit="percentunit"))

    panels.append(lay.row("Pipeline health and alerts"))
    panels.append(panel(
        lay, "timeseries", "Seconds since last complete window / heartbeat", [
            target("time() - max(ragpulse_last_complete_window_end_timestamp_seconds)",
                   "last complete window"),
            target("time() - max(ragpulse_heartbeat_timestamp_seconds)", "heartbeat"),
        ], width=8, unit="s",
        thresholds=[{"color": "green", "value": None},
                    {"color": "red", "value": int(cfg["stall"]["max_window_age_seconds"])}],
        custom={"thresholdsStyle": {"mode": "line"}}))
    panels.append(panel(
        lay, "timeseries", "Serve cycles", [
            target(f"sum by (outcome) (rate(ragpulse_cycles_total[{RATE}]))", "{{outcome}}"),
            target("histogram_quantile(0.95, sum by (le) "
                   f"(rate(ragpulse_cycle_duration_seconds_bucket[{RATE}])))", "p95 duration"),
        ], width=8, unit="short"))
    panels.append(panel(
        lay, "timeseries", "Data loss and label overflow", [
            target("sum by (topic, reason) (increase(ragpulse_records_lost_total[1h])) > 0",
                   "lost {{topic}} {{reason}}"),
            target("sum by (topic, kind) (increase(ragpulse_offset_resets_total[1h])) > 0",
                   "offset reset {{topic}} {{kind}}"),
            target("sum by (topic) (increase(ragpulse_dead_letters_undeliverable_total[1h])) "
                   "> 0", "undeliverable dead letters {{topic}}"),
            target("sum by (label) (increase(ragpulse_label_overflow_total[1h])) > 0",
                   "overflow of label {{label}}"),
        ], width=8, unit="short", custom={"drawStyle": "bars", "fillOpacity": 60},
        description="Counts over the last hour of what must never happen; only non-zero "
                    "counts are drawn, so an empty panel is the healthy state."))
    panels.append(panel(
        lay, "table", "Firing ragpulse alerts", [
            target('ALERTS{alertname=~"Rag.*", alertstate="firing"}', "", instant=True,
                   format="table")],
        width=8, options={"showHeader": True},
        extra={"transformations": [{"id": "organize", "options": {
            "excludeByName": {"Time": True, "Value": True, "__name__": True}}}]}))
    return dashboard("ragpulse-overview", "ragpulse / Overview", panels, [],
                     "Quality of the RAG chatbot's answers as rated by the ragpulse judges.")


def drilldown(cfg: dict[str, Any]) -> dict[str, Any]:
    """One app and model: each judge with its band, in-progress window, retrieval beside it."""
    floors = {j: float(spec["floor"]) for j, spec in cfg["quality_alerts"].items()}
    lay = Layout()
    sel = 'app="$app", model="$model"'
    variables = [
        query_variable("app", "App", "label_values(ragpulse_judge_verdicts_total, app)"),
        query_variable("model", "Model",
                       'label_values(ragpulse_judge_verdicts_total{app="$app"}, model)'),
        query_variable("judge", "Judge", "label_values(ragpulse_judge_verdicts_total, judge)",
                       multi=True, include_all=True),
    ]
    variables += [
        textbox_variable("kafka_bootstrap", "Kafka bootstrap (for ragpulse explain)",
                         "kafka:9092"),
        textbox_variable("topic", "Inference-log topic (for ragpulse explain)",
                         "chat-inference"),
    ]
    jsel = f'judge="$judge", {sel}'
    panels: list[dict[str, Any]] = [lay.row("Judges")]
    panels.append(panel(
        lay, "timeseries", "$judge: pass ratio with 95% band", [
            target(f"ragpulse_judge_pass_ratio{{{jsel}}}", "pass ratio"),
            target(f"ragpulse_judge_pass_ratio_ci_low{{{jsel}}}", "ci_low"),
            target(f"ragpulse_judge_pass_ratio_ci_high{{{jsel}}}", "ci_high"),
            target(f"ragpulse_judge_in_progress_pass_ratio{{{jsel}}}", "open window"),
        ], width=12, unit="percentunit", overrides=ci_band_overrides(),
        description="Latest complete window with its Wilson band, and the window still open.",
        extra={"repeat": "judge", "repeatDirection": "h", "maxPerRow": 3}))
    win = cfg["windows"]
    panels.append(panel(
        lay, "timeseries", "Rolling pass ratio (as the alerts see it)", [
            target(f"{PASS_RATIO}:ratio_rate{win['fast_long']}{{{sel}}}",
                   f"{{{{judge}}}} {win['fast_long']}"),
            target(f"{PASS_RATIO}:wilson_upper_rate{win['fast_long']}{{{sel}}}",
                   f"{{{{judge}}}} {win['fast_long']} upper bound (page)"),
            target(f"{PASS_RATIO}:wilson_lower_rate{win['slow_long']}{{{sel}}}",
                   f"{{{{judge}}}} {win['slow_long']} lower bound (warning)"),
            target(f"{PASS_RATIO}:ratio_rate{win['baseline']}{{{sel}}}",
                   f"{{{{judge}}}} {win['baseline']} baseline"),
        ], width=12, unit="percentunit",
        thresholds=floor_steps(floors["groundedness"]),
        custom={"thresholdsStyle": {"mode": "line"}},
        description=(f"What the drop alerts decide on: the page fires when the "
                     f"{win['fast_long']} upper Wilson bound is under the floor, the warning "
                     f"when the {win['slow_long']} lower bound is; the line is the "
                     f"groundedness floor.")))
    period = str(cfg["slo"]["period"])
    panels.append(panel(
        lay, "stat", f"Error budget left ({period})", [
            target(f"{BUDGET_LEFT}{period}{{{sel}}}", "{{judge}}")],
        width=8, height=6, unit="percentunit", thresholds=budget_steps(),
        options={"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background",
                 "textMode": "value_and_name"},
        description="Per judge with an SLO objective (thresholds.yml slo.objectives)."))
    panels.append(panel(
        lay, "timeseries", "SLO burn rate", [
            target(f"{BURN_RATE}{w}{{{sel}}}", f"{{{{judge}}}} {w}")
            for w in dict.fromkeys(str(t["long"]) for t in cfg["slo"]["burn_rate_alerts"])
        ], width=8, height=6,
        description="1 = spending exactly the budget over the SLO period; the burn-rate alerts "
                    "fire above their tier factors."))
    panels.append(panel(
        lay, "state-timeline", "Enough judged answers to page?", [
            target(f"{SUFFICIENT}{{{sel}}}", "{{judge}}")],
        width=8, height=6, options={"showValue": "never", "mergeValues": True},
        mappings=sufficiency_mappings(),
        description="orange = insufficient data: too few judged answers for a quality page."))
    panels.append(lay.row("Failing answers"))
    failing = (f'sum by (judge, rating) (increase(ragpulse_judge_verdicts_total{{'
               f'job="{cfg["job"]}", {sel}, judge=~"$judge", rating=~"no|error"}}[{RATE}]))')
    panels.append(panel(
        lay, "timeseries", "Failing answers (hover a dot for its request_id)", [
            target(failing, "{{judge}} {{rating}}", exemplar=True)],
        width=14, height=9, custom={"drawStyle": "bars", "fillOpacity": 40},
        description="Verdicts rated no or error per interval. The dots are exemplars: the "
                    "latest failing answer of each series at each scrape, with its request_id "
                    "(Prometheus needs --enable-feature=exemplar-storage). Look the answer up "
                    "in the chatbot's log, or list them all with the command beside."))
    panels.append(text_panel(
        lay, "Explain these failures", EXPLAIN_TEXT, width=10, height=9,
        description="The failing answers of the dashboard's time range with the judges' "
                    "rationales, read from the verdicts topic serve publishes."))
    panels.append(lay.row("Volume and retrieval"))
    panels.append(panel(
        lay, "timeseries", "Judged answers per window", [
            target(f"ragpulse_judge_window_samples{{{sel}}}", "{{judge}} complete"),
            target(f"ragpulse_judge_in_progress_window_samples{{{sel}}}", "{{judge}} open"),
        ], width=8))
    panels.append(panel(
        lay, "timeseries", "Verdicts by rating", [
            target(f"sum by (judge, rating) (rate(ragpulse_judge_verdicts_total{{{sel}}}"
                   f"[{RATE}]))", "{{judge}} {{rating}}")],
        width=8, unit="reqps", custom={"stacking": {"mode": "normal"}, "fillOpacity": 30}))
    panels.append(panel(
        lay, "timeseries", "Retrieval health", [
            target(f"sum(rate(ragpulse_retrieved_chunks_total{{{sel}}}[{RATE}])) / "
                   f"sum(rate(ragpulse_events_judged_total{{{sel}}}[{RATE}]))",
                   "chunks per answer"),
            target(f"sum(rate(ragpulse_events_without_context_total{{{sel}}}[{RATE}])) / "
                   f"sum(rate(ragpulse_events_judged_total{{{sel}}}[{RATE}]))",
                   "share without context"),
        ], width=8,
        description="Next to groundedness: fewer chunks or more answers without context "
                    "explain many groundedness drops."))
    panels.append(panel(
        lay, "table", "Alerts for this app", [
            target('ALERTS{alertname=~"Rag.*", app="$app"}', "", instant=True,
                   format="table")],
        width=24, height=6))
    return dashboard("ragpulse-drilldown", "ragpulse / App drill-down", panels, variables,
                     "One app and model: each judge's ratio with its band, volume and "
                     "retrieval health.")


def render(cfg: dict[str, Any]) -> dict[Path, str]:
    """Dashboard path -> JSON text."""
    return {
        DASHBOARDS / "ragpulse-overview.json": json.dumps(overview(cfg), indent=2) + "\n",
        DASHBOARDS / "ragpulse-drilldown.json": json.dumps(drilldown(cfg), indent=2) + "\n",
    }


def main(argv: list[str] | None = None) -> int:
    """Write the dashboards, or with --check report stale ones."""
    parser = argparse.ArgumentParser(description="Render ragpulse Grafana dashboards.")
    parser.add_argument("--check", action="store_true", help="exit 1 if the JSON is stale")
    args = parser.parse_args(argv)
    cfg = yaml.safe_load(THRESHOLDS.read_text(encoding="utf-8"))
    files = render(cfg)
    if args.check:
        stale = [p for p, text in files.items()
                 if not p.exists() or p.read_text(encoding="utf-8") != text]
        for path in stale:
            print(f"stale: {path} (run grafana/render_dashboards.py)", file=sys.stderr)
        return 1 if stale else 0
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
