"""ragpulse's Grafana dashboards, built with Grafana's foundation SDK from thresholds.yml.

For operators and dashboard authors: the floors and limits drawn on the panels come from the
same thresholds as the alerts, and the panels read the recording rules by the names rules.py
records. The SDK's typed builders (pinned to the Grafana 11.2 schema that compose runs) reject
an option a panel kind does not have, where hand-written JSON is silently ignored by Grafana.
Panel ids, query refIds and the datasource are filled in once, by ``_finish``.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard as builders
from grafana_foundation_sdk.builders import prometheus, stat, statetimeline, table, text, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models
from grafana_foundation_sdk.models import prometheus as prometheus_models
from grafana_foundation_sdk.models import text as text_models
from rules import (
    BUDGET_LEFT,
    BURN_RATE,
    CANARY_DISAGREEMENT,
    CANARY_GRADED,
    CHUNKS_PER_ANSWER,
    GROUNDED_WITH_CONTEXT,
    NO_CONTEXT,
    PASS_RATIO,
    RETRIEVAL_CHANGED,
    REVIEW_DISAGREEMENT,
    SUFFICIENT,
    WEIGHTED_PASS_RATIO,
    WILSON,
)

from ragpulse.judges.registry import DEFAULT_JUDGES, SESSION_JUDGES
from ragpulse.pipeline.metrics import catalogue

DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="prometheus")
# The default judges, in the registry's order: one row of panels each on the overview.
JUDGES = DEFAULT_JUDGES
Step = tuple[str, float | None]


# --------------------------------------------------------------------------- building blocks


def query(expr: str, legend: str = "") -> prometheus.Dataquery:
    """One PromQL query of a panel."""
    return prometheus.Dataquery().expr(expr).legend_format(legend)


def table_query(expr: str) -> prometheus.Dataquery:
    """An instant query whose series become table rows."""
    return query(expr).instant().format(prometheus_models.PromQueryFormat.TABLE)


def steps(*colours: Step) -> builders.ThresholdsConfig:
    """Absolute thresholds: each colour from its value on (the first from minus infinity)."""
    return builders.ThresholdsConfig().mode(models.ThresholdsMode.ABSOLUTE).steps(
        [models.Threshold(color=colour, value=value) for colour, value in colours])


def floor_steps(floor: float) -> builders.ThresholdsConfig:
    """Red below the alert floor, green from it."""
    return steps(("red", None), ("green", floor))


def limit_steps(limit: float) -> builders.ThresholdsConfig:
    """Green up to a limit an alert fires above, red from it."""
    return steps(("green", None), ("red", limit))


BUDGET_STEPS = (("red", None), ("orange", 0), ("green", 0.25))  # red once spent, orange < 25 %


def line(mode: common.GraphThresholdsStyleMode = common.GraphThresholdsStyleMode.LINE,
         ) -> common_builders.GraphThresholdsStyleConfig:
    """Draw the thresholds as a line (or line and area) on a time series."""
    return common_builders.GraphThresholdsStyleConfig().mode(mode)


def stacked() -> common_builders.StackingConfig:
    return common_builders.StackingConfig().mode(common.StackingMode.NORMAL)


def graph(title: str, *queries: prometheus.Dataquery, width: int = 12, height: int = 8,
          unit: str = "short", description: str = "") -> timeseries.Panel:
    """A time series panel; callers chain what else it needs."""
    return (timeseries.Panel().title(title).description(description).span(width)
            .height(height).unit(unit).targets(list(queries)))


def ci_band(panel: timeseries.Panel) -> timeseries.Panel:
    """Draw the ci_low/ci_high series as a shaded band around the ratio."""
    return (panel
            .override_by_regexp(".*ci_high.*", [
                models.DynamicConfigValue(id_val="custom.fillBelowTo", value="ci_low"),
                models.DynamicConfigValue(id_val="custom.lineWidth", value=0),
                models.DynamicConfigValue(id_val="custom.fillOpacity", value=20)])
            .override_by_regexp(".*ci_low.*", [
                models.DynamicConfigValue(id_val="custom.lineWidth", value=0)]))


def pass_ratio_band(title: str, judge: str, floor: float | None, *, width: int,
                    description: str) -> timeseries.Panel:
    """A judge's pass ratio per app, model and version with its 95 % Wilson band, and the
    alert floor's line when the judge has one."""
    panel = ci_band(graph(
        title,
        query(f'ragpulse_judge_pass_ratio{{judge="{judge}"}}', "{{app}} / {{model}} {{version}}"),
        query(f'ragpulse_judge_pass_ratio_ci_low{{judge="{judge}"}}',
              "{{app}} / {{model}} {{version}} ci_low"),
        query(f'ragpulse_judge_pass_ratio_ci_high{{judge="{judge}"}}',
              "{{app}} / {{model}} {{version}} ci_high"),
        width=width, unit="percentunit", description=description,
    ))
    if floor is not None:
        panel = panel.thresholds(floor_steps(floor)).thresholds_style(
            line(common.GraphThresholdsStyleMode.LINE_AND_AREA))
    return panel.fill_opacity(0)


def big_number(title: str, expr: str, legend: str, thresholds: builders.ThresholdsConfig, *,
               description: str, width: int = 8, height: int = 5) -> stat.Panel:
    """A stat panel: the latest value with its name, coloured by ``thresholds``."""
    return (stat.Panel().title(title).description(description).span(width).height(height)
            .unit("percentunit").thresholds(thresholds).with_target(query(expr, legend))
            .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]))
            .color_mode(common.BigValueColorMode.BACKGROUND)
            .graph_mode(common.BigValueGraphMode.AREA)
            .text_mode(common.BigValueTextMode.VALUE_AND_NAME))


def sufficiency(expr: str, legend: str, *, description: str, width: int,
                height: int) -> statetimeline.Panel:
    """The 0/1 of the `...:samples:sufficient` rule as words, insufficient data in orange."""
    return (statetimeline.Panel().title("Enough judged answers to page?")
            .description(description).span(width).height(height)
            .with_target(query(expr, legend))
            .show_value(common.VisibilityMode.NEVER).merge_values(True)
            .color_scheme(builders.FieldColor().mode(models.FieldColorModeId.THRESHOLDS))
            .mappings([models.ValueMap(options={
                "0": models.ValueMappingResult(text="insufficient data", color="orange", index=0),
                "1": models.ValueMappingResult(text="enough data", color="green", index=1)})]))


def hide_columns(*names: str) -> models.DataTransformerConfig:
    return models.DataTransformerConfig(
        id_val="organize", options={"excludeByName": dict.fromkeys(names, True)})


def dashboard(uid: str, title: str, description: str) -> builders.Dashboard:
    """Dashboard envelope: fixed uid, UTC, 30 s refresh, links to the other ragpulse boards."""
    return (builders.Dashboard(title).uid(uid).description(description).tags(["ragpulse"])
            .version(1).editable().tooltip(models.DashboardCursorSync.CROSSHAIR)
            .refresh("30s").time("now-6h", "now").timezone("utc").variables([]).annotations([])
            .link(builders.DashboardLink("ragpulse dashboards")
                  .type(models.DashboardLinkType.DASHBOARDS).tags(["ragpulse"])
                  .as_dropdown(False).include_vars(True).keep_time(True)))


def _finish(board: builders.Dashboard) -> dict[str, Any]:
    """The dashboard as JSON data, every panel numbered and every query on the datasource."""
    model = board.build()
    for number, panel in enumerate(model.panels or [], start=1):
        panel.id_val = number
        if isinstance(panel, models.Panel) and panel.targets:
            panel.datasource = DATASOURCE
            for ref, target in zip("ABCDEFGH", panel.targets, strict=False):
                target.ref_id = ref  # type: ignore[attr-defined]
                target.datasource = DATASOURCE  # type: ignore[attr-defined]
    data: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder))
    return data


# --------------------------------------------------------------------------- dashboards


def overview(cfg: dict[str, Any]) -> dict[str, Any]:
    """All apps: quality per judge, traffic, judges, retrieval, pipeline health, alerts."""
    floors = {j: float(spec["floor"]) for j, spec in cfg["quality_alerts"].items()}
    floors.setdefault("safety", 1 - float(cfg["safety"]["max_unsafe_ratio"]))
    board = dashboard("ragpulse-overview", "ragpulse / Overview",
                      "Quality of the RAG chatbot's answers as rated by the ragpulse judges.")
    board.with_row(builders.Row("Answer quality (latest complete window)"))
    for judge in JUDGES:
        board.with_panel(big_number(
            f"{judge}: pass ratio now",
            f'sum(ragpulse_judge_pass_ratio{{judge="{judge}"}} '
            f'* ragpulse_judge_window_samples{{judge="{judge}"}}) '
            f'/ sum(ragpulse_judge_window_samples{{judge="{judge}"}})',
            judge, floor_steps(floors[judge]),
            description=f"Sample-weighted pass ratio over all apps in the latest complete "
                        f"window; red below the alert floor ({floors[judge]:.0%})."))
    for judge in JUDGES:
        board.with_panel(pass_ratio_band(
            f"{judge}: pass ratio with 95% band", judge, floors[judge], width=8,
            description="Per app and model; the band is the 95 % Wilson interval. The "
                        "threshold line is the alert floor."))
    # The chatbot's own cost and latency beside its quality: a drop above can be read against
    # a model change (the model label) or a latency or token change here.
    board.with_panel(graph(
        "Chatbot latency p50 / p95",
        query("histogram_quantile(0.5, sum by (app, model, le) "
              "(rate(ragpulse_agent_latency_seconds_bucket[$__rate_interval])))",
              "p50 {{app}} / {{model}}"),
        query("histogram_quantile(0.95, sum by (app, model, le) "
              "(rate(ragpulse_agent_latency_seconds_bucket[$__rate_interval])))",
              "p95 {{app}} / {{model}}"),
        width=8, unit="s",
        description="The chatbot's own time to answer (the events' latency_seconds, or the "
                    "trace's root span duration), over every accepted event."))
    board.with_panel(graph(
        "Chatbot tokens per answer",
        query("sum by (app, model) (rate(ragpulse_agent_input_tokens_total[$__rate_interval]))"
              "\n/\nsum by (app, model) "
              "(rate(ragpulse_agent_usage_events_total[$__rate_interval]))",
              "input {{app}} / {{model}}"),
        query("sum by (app, model) (rate(ragpulse_agent_output_tokens_total[$__rate_interval]))"
              "\n/\nsum by (app, model) "
              "(rate(ragpulse_agent_usage_events_total[$__rate_interval]))",
              "output {{app}} / {{model}}"),
        width=8,
        description="The chatbot's own tokens (the events' usage: agent/input_token_count, "
                    "output_token_count) per answer that reported them."))
    board.with_panel(graph(
        "Chatbot tokens per second",
        query("sum by (app, model) (rate(ragpulse_agent_total_tokens_total[$__rate_interval]))",
              "{{app}} / {{model}}"),
        width=8,
        description="The chatbot's own total token spend (agent/total_token_count), per app "
                    "and model: its cost rate.").stacking(stacked()).fill_opacity(30))
    board.with_panel(graph(
        "Judged answers per complete window",
        query("sum by (judge) (ragpulse_judge_window_samples)", "{{judge}}"),
        description="yes+no verdicts behind each ratio (errors excluded): a ratio on few "
                    "samples has a wide band and cannot page."))
    board.with_panel(graph(
        "Verdicts by rating",
        query("sum by (judge, version, rating) "
              "(rate(ragpulse_judge_verdicts_total[$__rate_interval]))",
              "{{judge}} {{version}} {{rating}}"),
        unit="reqps",
        description="By prompt version (the version label): a prompt change starts new "
                    "series.").stacking(stacked()).fill_opacity(30))
    board.with_panel(graph(
        "Mean score of graded scales",
        query("sum by (judge, version) (rate(ragpulse_judge_score_sum[$__rate_interval]))\n/\n"
              "sum by (judge, version) (rate(ragpulse_judge_score_count[$__rate_interval]))",
              "{{judge}} {{version}}"),
        description="Judges on a 0-3 or 1-5 scale and composites (binary judges have no "
                    "score); their pass ratio is the share at or above the pass score."))
    board.with_panel(graph(
        "Pass ratio corrected for judge error (calibrated judges)",
        *(query(f"{catalogue.WINDOW_PREFIX}pass_ratio_corrected{part}",
                f"{{{{judge}}}} {{{{app}}}} / {{{{model}}}} {{{{version}}}}{legend}")
          for part, legend in (("", ""), ("_ci_low", " ci_low"), ("_ci_high", " ci_high"))),
        unit="percentunit",
        description="The latest complete window's pass ratio corrected for the judge's "
                    "sensitivity and specificity (Rogan-Gladen, --judge-calibration), with a "
                    "95 % interval carrying the window's and the calibration set's size. Only "
                    "as good as the calibration set is like this traffic (see the README)."))
    weighted = WEIGHTED_PASS_RATIO.format(w=cfg["windows"]["fast_long"])
    board.with_panel(graph(
        "Pass ratio of all traffic (weighted by sampling)",
        query(weighted, "{{judge}} {{app}} / {{model}} {{version}}"),
        unit="percentunit",
        description="With --sampling-rules or a judge budget, each judged answer stands for "
                    "1/rate answers: this estimates the pass ratio of all traffic; the other "
                    "ratios describe the judged sample."))
    board.with_panel(graph(
        "Judges skipped for a missing field",
        query("sum by (judge, missing) (rate(ragpulse_judge_skipped_total[$__rate_interval]))",
              "{{judge}} without {{missing}}"),
        unit="reqps",
        description="Events a judge did not grade because they lack its required field "
                    "(e.g. correctness without an expected answer); in no ratio."))

    slo = cfg["slo"]
    period = str(slo["period"])
    board.with_row(builders.Row(f"Quality SLOs ({period}) and data sufficiency"))
    for judge, objective in slo["objectives"].items():
        board.with_panel(big_number(
            f"{judge}: error budget left",
            f'min({BUDGET_LEFT.format(w=period)}{{judge="{judge}"}})', judge,
            steps(*BUDGET_STEPS),
            description=f"Share of the {period} error budget ({1 - float(objective):.0%} of "
                        f"judged answers may fail: objective {float(objective):.0%}) not yet "
                        f"spent, for the app/model that spent most. Negative: overspent."))
    board.with_panel(
        table.Panel().title("Error budget left and burn rate per app / model").span(12)
        .height(8).unit("percentunit")
        .description("Budget left over the SLO period (A) and the burn rate over the page "
                     "tier's long window (B: 1 = spending exactly the budget; "
                     "RagQualityBudgetBurn pages at the tier factors of thresholds.yml).")
        .targets([table_query(BUDGET_LEFT.format(w=period)),
                  table_query(BURN_RATE.format(w=slo["burn_rate_alerts"][0]["long"]))])
        .with_transformation(models.DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(models.DataTransformerConfig(id_val="organize", options={
            "excludeByName": {"Time": True, "__name__": True, "job": True},
            "renameByName": {"Value #A": "budget left", "Value #B": "burn rate"}})))
    board.with_panel(sufficiency(
        SUFFICIENT, "{{judge}} {{app}} / {{model}}", width=12, height=8,
        description="Per series: orange = insufficient data (fewer judged answers in the page's "
                    "window than its minimum sample; no quality page can fire and the ratios "
                    "above are noise), green = enough data."))

    board.with_row(builders.Row("Conversations (session judges)"))
    for judge in SESSION_JUDGES:
        board.with_panel(pass_ratio_band(
            f"{judge}: pass ratio of conversations with 95% band", judge, floors.get(judge),
            width=6,
            description="Whole conversations (--session-judges), counted in the window of "
                        "their last turn; empty without session judges."))
    board.with_panel(graph(
        "Conversations judged and truncated",
        query("sum by (app) (rate(ragpulse_sessions_judged_total[$__rate_interval]))",
              "judged {{app}}"),
        query("sum by (app) (rate(ragpulse_sessions_truncated_total[$__rate_interval]))",
              "truncated {{app}}"),
        width=6, unit="reqps",
        description="Truncated: over --session-max-turns or --session-max-bytes, judged on "
                    "their last turns."))

    board.with_row(builders.Row("Traffic"))
    board.with_panel(graph(
        "Events received, sampled, judged",
        query("sum by (outcome) (rate(ragpulse_events_total[$__rate_interval]))",
              "received {{outcome}}"),
        query("sum(rate(ragpulse_events_sampled_total[$__rate_interval]))", "sampled"),
        query("sum(rate(ragpulse_events_judged_total[$__rate_interval]))", "judged"),
        width=8, unit="reqps"))
    board.with_panel(graph(
        "Dead letters and late events",
        query("sum(rate(ragpulse_dead_letters_total[$__rate_interval]))", "dead letters"),
        query("sum(rate(ragpulse_late_events_total[$__rate_interval]))", "late events"),
        width=8, unit="reqps",
        description="Dead letters: records that could not be parsed (see dead_letter.jsonl). "
                    "Late events: later than the allowed lateness, kept out of windows."))
    board.with_panel(graph(
        "Consumer lag by topic", query(
            "sum by (topic) (max by (topic, partition) (ragpulse_consumer_lag))", "{{topic}}"
        ),
        width=8).thresholds(limit_steps(int(cfg["consumer_lag"]["max_records"])))
        .thresholds_style(line()))

    board.with_row(builders.Row("Judges"))
    board.with_panel(graph(
        "Judge errors by cause",
        query("sum by (judge, cause) (rate(ragpulse_judge_errors_total[$__rate_interval]))",
              "{{judge}} {{cause}}"),
        width=8, unit="reqps").stacking(stacked()).fill_opacity(30))
    board.with_panel(graph(
        "Judge error ratio",
        query('sum by (judge) (rate(ragpulse_judge_verdicts_total{rating="error"}'
              "[$__rate_interval]))\n/\n"
              "sum by (judge) (rate(ragpulse_judge_verdicts_total[$__rate_interval]))",
              "{{judge}}"),
        width=8, unit="percentunit",
    ).thresholds(limit_steps(float(cfg["judge_errors"]["max_ratio"]))).thresholds_style(line()))
    board.with_panel(graph(
        "Judge latency p50 / p95",
        *(query(f"histogram_quantile({q}, sum by (judge, le) "
                "(rate(ragpulse_judge_latency_seconds_bucket[$__rate_interval])))",
                f"{{{{judge}}}} p{q * 100:g}") for q in (0.5, 0.95)),
        width=8, unit="s"))
    board.with_panel(graph(
        "Judge tokens",
        query("sum by (judge, kind) (rate(ragpulse_judge_tokens_total[$__rate_interval]))",
              "{{judge}} {{kind}}"),
        description="Tokens per second sent to / received from the judge backend."))
    board.with_panel(graph(
        "Judge calls by backend",
        query("sum by (judge, backend) (rate(ragpulse_judge_calls_total[$__rate_interval]))",
              "{{judge}} {{backend}}"),
        unit="reqps"))
    canary = cfg["canaries"]
    cw, max_disagreement = str(canary["window"]), float(canary["max_disagreement"])
    board.with_panel(graph(
        "Judge agreement with the golden set (canaries)",
        query(CANARY_DISAGREEMENT.format(w=cw), f"{{{{judge}}}} disagreement ({cw})"),
        query(CANARY_GRADED.format(w=cw), f"{{{{judge}}}} graded canaries ({cw})"),
        width=24, unit="percentunit",
        description=f"Share of the human-labelled canaries (serve --canary-file) each judge "
                    f"graded differently from their label over {cw}, judge errors left out; "
                    f"bars: canaries graded (right axis). RagJudgeCanaryDisagreement warns "
                    f"above the line ({max_disagreement:.0%}) with at least "
                    f"{int(canary['min_graded'])} graded. A step here together with a step in "
                    f"a pass ratio means the judge moved, not the chatbot.",
    ).thresholds(limit_steps(max_disagreement)).thresholds_style(line())
        .override_by_regexp(".*graded canaries.*", [
            models.DynamicConfigValue(id_val="unit", value="short"),
            models.DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            models.DynamicConfigValue(id_val="custom.drawStyle", value="bars"),
            models.DynamicConfigValue(id_val="custom.fillOpacity", value=20)]))

    review = cfg["review_labels"]
    rw, max_overturned = str(review["window"]), float(review["max_disagreement"])
    board.with_row(builders.Row("Reviewers' labels"))
    board.with_panel(graph(
        "Judge agreement with reviewers",
        query('ragpulse_judge_human_agreement_kappa{slice="random"}',
              "{{judge}} {{version}} kappa (all labels)"),
        query(REVIEW_DISAGREEMENT.format(w=rw), f"{{{{judge}}}} {{{{version}}}} overturned ({rw})"),
        width=12, unit="percentunit",
        description=f"Cohen's kappa of each judge's ratings and the reviewers' (`ragpulse "
                    f"review`) over the labels of the uniform random slice of its running "
                    f"prompt version, and the share of its verdicts reviewers overturned over "
                    f"{rw}. RagJudgeHumanAgreementLow warns above the line "
                    f"({max_overturned:.0%}) with at least {int(review['min_labels'])} labels.",
    ).thresholds(limit_steps(max_overturned)).thresholds_style(line()))
    board.with_panel(graph(
        "Labels per day",
        query("sum by (judge, slice) (increase(ragpulse_review_labels_total[1d]))",
              "{{judge}} {{slice}}"),
        query('sum by (outcome) (increase(ragpulse_review_labels_read_total'
              '{outcome!="counted"}[1d])) > 0', "{{outcome}}"),
        width=6, unit="short",
        description="Labels counted over the last day, per judge and slice, and the labels "
                    "not counted (duplicate, not_binary; dead-lettered: unknown_judge, "
                    "unknown_event, other_version, malformed)."))
    board.with_panel(graph(
        "Review queue: items queued and labelled",
        query("max by (state) (ragpulse_review_queue_depth)", "queue depth: {{state}}"),
        query("sum by (reason) (increase(ragpulse_review_queued_total[1d]))",
              "queued per day: {{reason}}"),
        width=6, unit="short",
        description="The review queue's depth as the review page measures it "
                    "(ragpulse review's /metrics): items it holds that no reviewer has "
                    "labelled yet (unlabelled) and review-topic records it has not read yet "
                    "(unread); and the items queued per day."))

    board.with_row(builders.Row("Retrieval"))
    board.with_panel(graph(
        "Retrieved chunks per judged answer",
        query("sum by (app) (rate(ragpulse_retrieved_chunks_total[$__rate_interval]))\n/\n"
              "sum by (app) (rate(ragpulse_events_judged_total[$__rate_interval]))", "{{app}}"),
        description="Fewer chunks usually precede a groundedness drop."))
    board.with_panel(graph(
        "Answers without retrieved context",
        query("sum by (app) (rate(ragpulse_events_without_context_total[$__rate_interval]))\n"
              "/\nsum by (app) (rate(ragpulse_events_judged_total[$__rate_interval]))",
              "{{app}}"),
        unit="percentunit"))

    # Empty unless the opt-in tool judges run (--judges tool_call_errors,tool_selection,...)
    # on traffic whose answers carry tool calls.
    tool_floor = floors.get("tool_call_errors")
    tool_window = cfg["windows"]["fast_long"]
    board.with_row(builders.Row("Agent tool calls"))
    tool_ratio = graph(
        f"Answers whose tool calls all worked ({tool_window})",
        query(f'{PASS_RATIO.format(w=tool_window)}{{judge="tool_call_errors"}}',
              "{{app}} / {{model}} {{version}}"),
        unit="percentunit",
        description="Pass ratio of the tool_call_errors judge: answers whose agent called "
                    "tools, none of which failed. Answers without tool calls are skipped. "
                    "RagToolCallErrorsHigh warns below the line.")
    if tool_floor is not None:
        tool_ratio = tool_ratio.thresholds(floor_steps(tool_floor)).thresholds_style(line())
    board.with_panel(tool_ratio)
    board.with_panel(graph(
        "Tool judges: verdicts by rating",
        query('sum by (judge, rating) (rate(ragpulse_judge_verdicts_total{judge=~"tool_.*"}'
              "[$__rate_interval]))", "{{judge}} {{rating}}"),
        query('sum by (judge) (rate(ragpulse_judge_skipped_total{judge=~"tool_.*"}'
              "[$__rate_interval]))", "{{judge}} skipped (no tool calls)"),
        unit="reqps",
        description="tool_call_errors (failed or repeated calls), tool_selection (the right "
                    "tools, none missing) and tool_arguments (arguments supported by the "
                    "conversation); skipped: answers without tool calls, in no ratio."))

    board.with_row(builders.Row("Pipeline health and alerts"))
    board.with_panel(graph(
        "Seconds since last complete window / heartbeat",
        # min over instances: the stalest one, which RagPulseStalled (per instance) sees; max
        # would show the freshest of several `serve --instances` and hide one that stalled.
        query("time() - min(ragpulse_last_complete_window_end_timestamp_seconds)",
              "last complete window (stalest instance)"),
        query("time() - min(ragpulse_heartbeat_timestamp_seconds)",
              "heartbeat (stalest instance)"),
        width=8, unit="s",
    ).thresholds(limit_steps(int(cfg["stall"]["max_window_age_seconds"])))
        .thresholds_style(line()))
    board.with_panel(graph(
        "Serve cycles",
        query("sum by (outcome) (rate(ragpulse_cycles_total[$__rate_interval]))", "{{outcome}}"),
        query("histogram_quantile(0.95, sum by (le) "
              "(rate(ragpulse_cycle_duration_seconds_bucket[$__rate_interval])))",
              "p95 duration"),
        width=8))
    board.with_panel(graph(
        "Data loss and label overflow",
        query("sum by (topic, reason) (increase(ragpulse_records_lost_total[1h])) > 0",
              "lost {{topic}} {{reason}}"),
        query("sum by (topic, kind) (increase(ragpulse_offset_resets_total[1h])) > 0",
              "offset reset {{topic}} {{kind}}"),
        query("sum by (topic) (increase(ragpulse_dead_letters_undeliverable_total[1h])) > 0",
              "undeliverable dead letters {{topic}}"),
        query("sum by (label) (increase(ragpulse_label_overflow_total[1h])) > 0",
              "overflow of label {{label}}"),
        width=8,
        description="Counts over the last hour of what must never happen; only non-zero "
                    "counts are drawn, so an empty panel is the healthy state.",
    ).draw_style(common.GraphDrawStyle.BARS).fill_opacity(60))
    board.with_panel(
        table.Panel().title("Firing ragpulse alerts").span(8).height(8).show_header(True)
        .with_target(table_query('ALERTS{alertname=~"Rag.*", alertstate="firing"}'))
        .with_transformation(hide_columns("Time", "Value", "__name__")))
    return _finish(board)


EXPLAIN_TEXT = """\
The failing answers of this time range, newest first, with the judges' rationales:

```
ragpulse explain --kafka-bootstrap $kafka_bootstrap --topic $topic --app $app --model $model \
--judge $judge --since ${__from:date:seconds} --until ${__to:date:seconds}
```

Add --json for full rationales; with docker compose prefix `docker compose exec ragpulse`.

With several judges selected, run it once per judge (--judge takes one). Set *Kafka bootstrap* \
and *Inference-log topic* above to serve's `--kafka-bootstrap` and `--topic`.
"""


def textbox(name: str, label: str, default: str) -> builders.TextBoxVariable:
    """A free-text template variable with a default value."""
    current = models.VariableOption(selected=True, text=default, value=default)
    return (builders.TextBoxVariable(name).label(label).default_value(default)
            .current(current).options([current]))


def values_of(name: str, label: str, promql: str) -> builders.QueryVariable:
    """A template variable filled by a label_values() query, refreshed with the time range."""
    return (builders.QueryVariable(name).label(label).query(promql).datasource(DATASOURCE)
            .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
            .sort(models.VariableSort.ALPHABETICAL_ASC))


def drilldown(cfg: dict[str, Any]) -> dict[str, Any]:
    """One app and model: each judge with its band, in-progress window, retrieval beside it."""
    floors = {j: float(spec["floor"]) for j, spec in cfg["quality_alerts"].items()}
    win = cfg["windows"]
    period = str(cfg["slo"]["period"])
    sel = 'app="$app", model="$model"'
    jsel = f'judge="$judge", {sel}'
    board = (dashboard("ragpulse-drilldown", "ragpulse / App drill-down",
                       "One app and model: each judge's ratio with its band, volume and "
                       "retrieval health.")
             .with_variable(values_of("app", "App",
                                      "label_values(ragpulse_judge_verdicts_total, app)"))
             .with_variable(values_of("model", "Model", "label_values("
                                      'ragpulse_judge_verdicts_total{app="$app"}, model)'))
             .with_variable(values_of("judge", "Judge",
                                      "label_values(ragpulse_judge_verdicts_total, judge)")
                            .multi(True).include_all(True))
             .with_variable(textbox("kafka_bootstrap", "Kafka bootstrap (for ragpulse explain)",
                                    "kafka:9092"))
             .with_variable(textbox("topic", "Inference-log topic (for ragpulse explain)",
                                    "chat-inference")))

    board.with_row(builders.Row("Judges"))
    board.with_panel(ci_band(graph(
        "$judge: pass ratio with 95% band",
        query(f"ragpulse_judge_pass_ratio{{{jsel}}}", "pass ratio {{version}}"),
        query(f"ragpulse_judge_pass_ratio_ci_low{{{jsel}}}", "ci_low {{version}}"),
        query(f"ragpulse_judge_pass_ratio_ci_high{{{jsel}}}", "ci_high {{version}}"),
        query(f"ragpulse_judge_in_progress_pass_ratio{{{jsel}}}", "open window {{version}}"),
        unit="percentunit",
        description="Latest complete window with its Wilson band, and the window still open.",
    )).repeat("judge").repeat_direction("h").max_per_row(3))
    board.with_panel(graph(
        "Rolling pass ratio (as the alerts see it)",
        query(f"{PASS_RATIO.format(w=win['fast_long'])}{{{sel}}}",
              f"{{{{judge}}}} {{{{version}}}} {win['fast_long']}"),
        query(f"{WILSON.format(side='upper', w=win['fast_long'])}{{{sel}}}",
              f"{{{{judge}}}} {{{{version}}}} {win['fast_long']} upper bound (page)"),
        query(f"{WILSON.format(side='lower', w=win['slow_long'])}{{{sel}}}",
              f"{{{{judge}}}} {{{{version}}}} {win['slow_long']} lower bound (warning)"),
        query(f"{PASS_RATIO.format(w=win['baseline'])}{{{sel}}}",
              f"{{{{judge}}}} {{{{version}}}} {win['baseline']} baseline"),
        unit="percentunit",
        description=f"What the drop alerts decide on: the page fires when the "
                    f"{win['fast_long']} upper Wilson bound is under the floor, the warning "
                    f"when the {win['slow_long']} lower bound is; the line is the "
                    f"groundedness floor.",
    ).thresholds(floor_steps(floors["groundedness"])).thresholds_style(line()))
    board.with_panel(big_number(
        f"Error budget left ({period})", f"{BUDGET_LEFT.format(w=period)}{{{sel}}}",
        "{{judge}}", steps(*BUDGET_STEPS), height=6,
        description="Per judge with an SLO objective (thresholds.yml slo.objectives)."))
    board.with_panel(graph(
        "SLO burn rate",
        *(query(f"{BURN_RATE.format(w=w)}{{{sel}}}", f"{{{{judge}}}} {w}")
          for w in dict.fromkeys(str(t["long"]) for t in cfg["slo"]["burn_rate_alerts"])),
        width=8, height=6,
        description="1 = spending exactly the budget over the SLO period; the burn-rate alerts "
                    "fire above their tier factors."))
    board.with_panel(sufficiency(
        f"{SUFFICIENT}{{{sel}}}", "{{judge}}", width=8, height=6,
        description="orange = insufficient data: too few judged answers for a quality page."))

    board.with_row(builders.Row("Failing answers"))
    board.with_panel(graph(
        "Failing answers (hover a dot for its request_id)",
        query(f'sum by (judge, version, rating) (increase(ragpulse_judge_verdicts_total{{'
              f'job="{cfg["job"]}", {sel}, judge=~"$judge", rating=~"no|error"}}'
              "[$__rate_interval]))", "{{judge}} {{version}} {{rating}}").exemplar(True),
        width=14, height=9,
        description="Verdicts rated no or error per interval. The dots are exemplars: the "
                    "latest failing answer of each series at each scrape, with its request_id "
                    "(Prometheus needs --enable-feature=exemplar-storage). Look the answer up "
                    "in the chatbot's log, or list them all with the command beside.",
    ).draw_style(common.GraphDrawStyle.BARS).fill_opacity(40))
    board.with_panel(
        text.Panel().title("Explain these failures").span(10).height(9)
        .description("The failing answers of the dashboard's time range with the judges' "
                     "rationales, read from the verdicts topic serve publishes.")
        .mode(text_models.TextMode.MARKDOWN).content(EXPLAIN_TEXT))

    board.with_row(builders.Row("Volume and retrieval"))
    board.with_panel(graph(
        "Judged answers per window",
        query(f"ragpulse_judge_window_samples{{{sel}}}", "{{judge}} complete"),
        query(f"ragpulse_judge_in_progress_window_samples{{{sel}}}", "{{judge}} open"),
        width=8))
    board.with_panel(graph(
        "Verdicts by rating",
        query(f"sum by (judge, version, rating) (rate(ragpulse_judge_verdicts_total{{{sel}}}"
              "[$__rate_interval]))", "{{judge}} {{version}} {{rating}}"),
        width=8, unit="reqps").stacking(stacked()).fill_opacity(30))
    board.with_panel(graph(
        "Retrieval health",
        query(f"sum(rate(ragpulse_retrieved_chunks_total{{{sel}}}[$__rate_interval]))\n/\n"
              f"sum(rate(ragpulse_events_judged_total{{{sel}}}[$__rate_interval]))",
              "chunks per answer"),
        query(f"sum(rate(ragpulse_events_without_context_total{{{sel}}}[$__rate_interval]))"
              f"\n/\nsum(rate(ragpulse_events_judged_total{{{sel}}}[$__rate_interval]))",
              "share without context"),
        width=8,
        description="Next to groundedness: fewer chunks or more answers without context "
                    "explain many groundedness drops."))

    long, base = str(win["fast_long"]), str(win["baseline"])
    board.with_row(builders.Row("Groundedness drop: retrieval or generation?"))
    board.with_panel(graph(
        "Retrieval against its baseline",
        query(f"{CHUNKS_PER_ANSWER.format(w=long)}{{{sel}}}", f"chunks per answer {long}"),
        query(f"{CHUNKS_PER_ANSWER.format(w=base)}{{{sel}}}", f"chunks per answer {base}"),
        query(f"{NO_CONTEXT.format(w=long)}{{{sel}}}", f"share without context {long}"),
        query(f"{NO_CONTEXT.format(w=base)}{{{sel}}}", f"share without context {base}"),
        width=12,
        description=f"What RagGroundednessDrop's description calls RETRIEVAL: over {long}, "
                    f"the chunks per answer fell more than "
                    f"{float(cfg['root_cause']['chunks_drop']):.0%} under the {base} "
                    f"baseline, or the share without context rose more than "
                    f"{float(cfg['root_cause']['no_context_rise']):.0%}, or context "
                    "sufficiency fell (then 'retrieval changed' shows 1)."))
    board.with_panel(graph(
        "Retrieval or generation (needs the context_sufficiency judge)",
        query(f"{RETRIEVAL_CHANGED.format(w=long)}{{{sel}}}", "retrieval changed (1)"),
        query(f"{GROUNDED_WITH_CONTEXT.format(w=long)}{{{sel}}}",
              f"groundedness where the context was sufficient {long}"),
        query(f'{PASS_RATIO.format(w=long)}{{{sel}, judge="context_sufficiency"}}',
              f"context sufficiency {long}"),
        query(f'{PASS_RATIO.format(w=long)}{{{sel}, judge="chunk_relevance"}}',
              f"chunk relevance {long}"),
        width=12, unit="percentunit",
        description="'retrieval changed' is 1 while RagGroundednessDrop would say RETRIEVAL. "
                    "GENERATION: answers are ungrounded although their retrieved context was "
                    "sufficient (compare with the groundedness panels above). Needs the opt-in "
                    "judges context_sufficiency (and, for its line, chunk_relevance) next to "
                    "groundedness in --judges."
    ).thresholds(floor_steps(floors["groundedness"])).thresholds_style(line()))
    board.with_panel(
        table.Panel().title("Alerts for this app").span(24).height(6)
        .with_target(table_query('ALERTS{alertname=~"Rag.*", app="$app"}')))
    return _finish(board)
