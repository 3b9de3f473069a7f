"""ragpulse's Prometheus recording and alerting rules, as PromQL templates filled from thresholds.

For operators and rule authors: each expression below is written as the PromQL it renders to;
``$name`` placeholders (``string.Template``) take the values of thresholds.yml, so PromQL's own
braces stay as written. Every series a template reads comes from ``selector()``, which always
adds the job matcher (``job="ragpulse"``), and ``$by`` is the labels every aggregation keeps
(``job, judge, app, model``): two deployments scraped by one Prometheus are never added up, and
one deployment's rules never read the series the other records under the same names
(tests/test_prometheus_rules.py parses every rule to hold this).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping
from string import Template
from typing import Any

from ragpulse.pipeline.metrics import catalogue

# Recording rule names (level:metric:operation); {w} is the range window, e.g. 5m.
VERDICTS = "judge_app_model:ragpulse_judge_verdicts:increase{w}"  # every verdict, errors too
SAMPLES = "judge_app_model:ragpulse_judge_samples:increase{w}"  # judged: yes + no
FAILURES = "judge_app_model:ragpulse_judge_failures:increase{w}"  # "no" verdicts
PASS_RATIO = "judge_app_model:ragpulse_judge_pass_ratio:ratio_rate{w}"  # yes / (yes + no)
WILSON = "judge_app_model:ragpulse_judge_pass_ratio:wilson_{side}_rate{w}"  # side: lower/upper
ERROR_RATIO = "judge_app_model:ragpulse_judge_error_ratio:ratio_rate{w}"  # error / all
# yes / (yes + no) of the verdicts weighted by 1 / sample rate (--sampling-rules, a judge
# budget), summed over the strata: the pass ratio of all traffic, not of the judged sample.
WEIGHTED_PASS_RATIO = "judge_app_model:ragpulse_judge_weighted_pass_ratio:ratio_rate{w}"
BURN_RATE = "judge_app_model:ragpulse_judge_slo_burn_rate:ratio_rate{w}"  # (1-ratio)/(1-SLO)
BUDGET_LEFT = "judge_app_model:ragpulse_judge_slo_budget_remaining:ratio{w}"  # < 0: overspent
CANARY_DISAGREEMENT = "judge:ragpulse_canary_disagreement:ratio_rate{w}"
CANARY_GRADED = "judge:ragpulse_canary_graded:increase{w}"  # agree + disagree
OBJECTIVE = "judge:ragpulse_judge_slo_objective:ratio"
# The reviewers' labels of the random slice (serve, docs/review.md): the share where the
# reviewer's rating is not the judge's, and the labels behind it, per judge and prompt version.
REVIEW_DISAGREEMENT = "judge_version:ragpulse_review_disagreement:ratio_increase{w}"
REVIEW_LABELLED = "judge_version:ragpulse_review_labelled:increase{w}"
SUFFICIENT = "judge_app_model:ragpulse_judge_samples:sufficient"  # 1: enough to page
# Root cause of a groundedness drop: retrieval vs generation (per app and model).
CHUNKS_PER_ANSWER = "app_model:ragpulse_retrieved_chunks_per_answer:ratio_rate{w}"
NO_CONTEXT = "app_model:ragpulse_events_without_context:ratio_rate{w}"
GROUNDED_WITH_CONTEXT = "app_model:ragpulse_groundedness_with_sufficient_context:ratio_rate{w}"
RETRIEVAL_CHANGED = "app_model:ragpulse_retrieval_changed:present{w}"  # 1 where it changed

# Every per-judge series keeps these labels after the deployment labels; alerts must carry the
# app and the model. `version` is the judge's prompt version: rates of two prompts are never
# added up, and a new prompt builds its own baseline (its drop alerts compare it with itself).
SERIES_LABELS = ("judge", "version", "app", "model")


def promql(template: str, **values: object) -> str:
    """``template`` (indented freely) with its ``$placeholders`` filled.

    A multi-line expression ends with a newline, so it is written as a YAML literal block.
    """
    text = Template(textwrap.dedent(template).strip()).substitute(values)
    return text + "\n" if "\n" in text else text


def selector(metric: str, config: Mapping[str, Any], *matchers: str,
             judge: str | None = None) -> str:
    """``metric{job="<job>", <matchers>, judge="<judge>"}``: a series of this deployment."""
    pairs = [f"job={json.dumps(config['job'])}", *matchers]
    if judge:
        pairs.append(f"judge={json.dumps(judge)}")
    return f"{metric}{{{', '.join(pairs)}}}"


def by(config: Mapping[str, Any], *labels: str) -> str:
    """``job, judge, app, model``: one deployment's series, its instances added up."""
    return ", ".join([*config["deployment_labels"], *(labels or SERIES_LABELS)])


def quality_windows(config: Mapping[str, Any]) -> list[str]:
    """The windows of the drop alerts' two paths (they get Wilson bounds)."""
    win = config["windows"]
    keys = ("fast_long", "fast_short", "slow_long", "slow_short")
    return list(dict.fromkeys(str(win[k]) for k in keys))


def burn_windows(config: Mapping[str, Any]) -> list[str]:
    """The windows of the SLO burn-rate tiers."""
    tiers = config["slo"]["burn_rate_alerts"]
    return list(dict.fromkeys(str(t[k]) for t in tiers for k in ("long", "short")))


def rule_windows(config: Mapping[str, Any]) -> list[str]:
    """Every range window some alert needs, in first-use order, without duplicates."""
    wanted = [
        *quality_windows(config),
        config["windows"]["baseline"],
        config["safety"]["window"],
        config["judge_errors"]["window"],
        *burn_windows(config),
    ]
    return list(dict.fromkeys(str(w) for w in wanted))


# --------------------------------------------------------------------------- recording rules

COUNT = "sum by ($by) (increase($counter[$window]))"

# Numerators fall back to `0 * denominator`: a counter series never incremented (rating="yes"
# when every answer failed) does not exist, and a missing numerator would make a 0 % pass
# ratio disappear instead of alerting.
COUNT_OR_ZERO = """
    sum by ($by) (increase($numerator[$window]))
    or
    0 * sum by ($by) (increase($denominator[$window]))
"""

RATE_RATIO = """
    (
      sum by ($by) (rate($numerator[$window]))
      or
      0 * sum by ($by) (rate($denominator[$window]))
    )
    /
    sum by ($by) (rate($denominator[$window]))
"""

# (p + z²/2n ∓ z·sqrt(p(1-p)/n + z²/4n²)) / (1 + z²/n), from the window's p and n.
WILSON_BOUND = """
    (
      $p
      + $half_z2 / $n
      $sign $z * sqrt(
          $p * (1 - $p) / $n
          + $quarter_z2 / $n ^ 2
        )
    )
    /
    (1 + $z2 / $n)
"""

# The objective series carries the job label too, so each deployment joins its own objective.
BURN = """
    (1 - $ratio)
    / on (job, judge) group_left ()
    (1 - $objective)
"""


def _verdict_rules(config: Mapping[str, Any], w: str) -> dict[str, dict[str, Any]]:
    """Counts and ratios of the verdict counter over window ``w``, by record name template."""
    def verdicts(*matchers: str) -> str:
        return selector(catalogue.VERDICTS, config, *matchers)

    judged, common = verdicts('rating=~"yes|no"'), {"by": by(config), "window": w}
    exprs = {
        VERDICTS: promql(COUNT, counter=verdicts(), **common),
        SAMPLES: promql(COUNT, counter=judged, **common),
        FAILURES: promql(COUNT_OR_ZERO, numerator=verdicts('rating="no"'), denominator=judged,
                         **common),
        PASS_RATIO: promql(RATE_RATIO, numerator=verdicts('rating="yes"'), denominator=judged,
                           **common),
        ERROR_RATIO: promql(RATE_RATIO, numerator=verdicts('rating="error"'),
                            denominator=verdicts(), **common),
    }
    return {name: {"record": name.format(w=w), "expr": expr} for name, expr in exprs.items()}


def _weighted_rule(config: Mapping[str, Any], w: str) -> dict[str, Any]:
    def weighted(*matchers: str) -> str:
        return selector(catalogue.WEIGHTED_VERDICTS, config, *matchers)

    return {"record": WEIGHTED_PASS_RATIO.format(w=w), "expr": promql(
        RATE_RATIO, numerator=weighted('rating="yes"'), denominator=weighted('rating=~"yes|no"'),
        by=by(config), window=w)}


def _wilson_rule(config: Mapping[str, Any], w: str, side: str) -> dict[str, Any]:
    z = float(config["confidence_z"])
    return {"record": WILSON.format(side=side, w=w), "expr": promql(
        WILSON_BOUND, p=selector(PASS_RATIO.format(w=w), config),
        n=selector(SAMPLES.format(w=w), config), sign="-" if side == "lower" else "+",
        z=f"{z:g}", z2=f"{z * z:g}", half_z2=f"{z * z / 2:g}", quarter_z2=f"{z * z / 4:g}",
    )}


def _sufficient_rule(config: Mapping[str, Any]) -> dict[str, Any]:
    """1 where a series has enough judged answers for its page to fire, else 0.

    Per judge: the fast path's minimum over its long window; safety: its own minimum.
    """
    minimum = {judge: (config["windows"]["fast_long"], spec["fast"]["min_samples"])
               for judge, spec in config["quality_alerts"].items()}
    minimum["safety"] = (config["safety"]["window"], config["safety"]["min_samples"])
    parts = [promql("$samples >= bool $minimum", minimum=int(n),
                    samples=selector(SAMPLES.format(w=w), config, judge=judge))
             for judge, (w, n) in minimum.items()]
    return {"record": SUFFICIENT, "expr": "\nor\n".join(parts) + "\n"}


def _canary_rules(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Disagreement of each judge with the golden set, and the graded count behind it.

    Canary counters have no app or model: a golden event belongs to no chatbot series.
    """
    w = str(config["canaries"]["window"])

    def canaries(*matchers: str) -> str:
        return selector(catalogue.CANARY_VERDICTS, config, *matchers)

    graded, common = canaries('outcome=~"agree|disagree"'), {"by": by(config, "judge"), "window": w}
    return [
        {"record": CANARY_GRADED.format(w=w), "expr": promql(COUNT, counter=graded, **common)},
        {"record": CANARY_DISAGREEMENT.format(w=w), "expr": promql(
            RATE_RATIO, numerator=canaries('outcome="disagree"'), denominator=graded, **common)},
    ]


# A cell never incremented does not exist: no disagreement at all is 0, not a missing ratio.
REVIEW_RATIO = """
    (
      sum by ($by) (
        increase($yes_no[$window])
        or
        increase($no_yes[$window])
      )
      or
      0 * sum by ($by) (increase($labelled[$window]))
    )
    /
    sum by ($by) (increase($labelled[$window]))
"""


def _review_rules(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Each judge's disagreement with the reviewers on the uniform random slice (the targeted
    items are no sample of its verdicts), per prompt version: a new prompt starts its own."""
    w = str(config["review_labels"]["window"])

    def labels(*matchers: str) -> str:
        return selector(catalogue.REVIEW_LABELS, config, 'slice="random"', *matchers)

    common = {"by": by(config, "judge", "version"), "window": w}
    return [
        {"record": REVIEW_LABELLED.format(w=w),
         "expr": promql(COUNT, counter=labels(), **common)},
        {"record": REVIEW_DISAGREEMENT.format(w=w), "expr": promql(
            REVIEW_RATIO, yes_no=labels('human="yes"', 'rating="no"'),
            no_yes=labels('human="no"', 'rating="yes"'), labelled=labels(), **common)},
    ]


def _burn_rate(config: Mapping[str, Any], w: str) -> str:
    return promql(BURN, ratio=selector(PASS_RATIO.format(w=w), config),
                  objective=selector(OBJECTIVE, config))


# Retrieval changed over window $long against the baseline: fewer chunks per answer, more
# answers without context, or (when the opt-in judges run) less sufficient context or fewer
# relevant chunks.
# The series exists (value 1) only where it changed.
RETRIEVAL_CHANGES = """
    (
      $chunks_long < on ($by) (1 - $chunks_drop) * $chunks_base
      or
      $no_context_long > on ($by) $no_context_base + $no_context_rise
      or
      max by ($by) ($sufficiency_long)
        < on ($by)
      max by ($by) ($sufficiency_base) - $sufficiency_drop
      or
      max by ($by) ($relevance_long)
        < on ($by)
      max by ($by) ($relevance_base) - $relevance_drop
    )
    * 0 + 1
"""


def root_cause_windows(config: Mapping[str, Any]) -> list[str]:
    """The long windows of the drop alerts and the baseline they compare against."""
    win = config["windows"]
    return list(dict.fromkeys(str(win[k]) for k in ("fast_long", "slow_long", "baseline")))


def _root_cause_rules(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Retrieval volume and quality, and groundedness where the context was sufficient, per app
    and model; then, per drop-alert window, whether retrieval changed against the baseline."""
    app_model = by(config, "app", "model")
    judged = selector(catalogue.EVENTS_JUDGED, config)
    with_context = 'context="sufficient"'

    def grounded(*matchers: str) -> str:
        return selector(catalogue.GROUNDED_BY_CONTEXT, config, with_context, *matchers)

    rules: list[dict[str, Any]] = []
    for w in root_cause_windows(config):
        common = {"by": app_model, "window": w}
        rules += [
            {"record": CHUNKS_PER_ANSWER.format(w=w), "expr": promql(
                RATE_RATIO, numerator=selector(catalogue.RETRIEVED_CHUNKS, config),
                denominator=judged, **common)},
            {"record": NO_CONTEXT.format(w=w), "expr": promql(
                RATE_RATIO, numerator=selector(catalogue.WITHOUT_CONTEXT, config),
                denominator=judged, **common)},
            {"record": GROUNDED_WITH_CONTEXT.format(w=w), "expr": promql(
                RATE_RATIO, numerator=grounded('rating="yes"'),
                denominator=grounded('rating=~"yes|no"'), **common)},
        ]
    cause, base = config["root_cause"], str(config["windows"]["baseline"])
    for w in (w for w in root_cause_windows(config) if w != base):
        rules.append({"record": RETRIEVAL_CHANGED.format(w=w), "expr": promql(
            RETRIEVAL_CHANGES, by=app_model,
            chunks_long=selector(CHUNKS_PER_ANSWER.format(w=w), config),
            chunks_base=selector(CHUNKS_PER_ANSWER.format(w=base), config),
            chunks_drop=f"{float(cause['chunks_drop']):g}",
            no_context_long=selector(NO_CONTEXT.format(w=w), config),
            no_context_base=selector(NO_CONTEXT.format(w=base), config),
            no_context_rise=f"{float(cause['no_context_rise']):g}",
            sufficiency_long=selector(PASS_RATIO.format(w=w), config,
                                      judge="context_sufficiency"),
            sufficiency_base=selector(PASS_RATIO.format(w=base), config,
                                      judge="context_sufficiency"),
            sufficiency_drop=f"{float(cause['sufficiency_drop']):g}",
            relevance_long=selector(PASS_RATIO.format(w=w), config, judge="chunk_relevance"),
            relevance_base=selector(PASS_RATIO.format(w=base), config, judge="chunk_relevance"),
            relevance_drop=f"{float(cause['chunk_relevance_drop']):g}",
        )})
    return rules


def _group(name: str, rules: list[dict[str, Any]], config: Mapping[str, Any],
           interval: str | None = None) -> dict[str, Any]:
    group: dict[str, Any] = {"name": name}
    if interval or config.get("rule_interval"):
        group["interval"] = str(interval or config["rule_interval"])
    group["rules"] = rules
    return group


def recording_groups(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-window counts, ratios, Wilson bounds and burn rates; the SLO period's budget."""
    rules: list[dict[str, Any]] = []
    for w in rule_windows(config):
        rules += _verdict_rules(config, w).values()
    # Later rules of a group see the earlier ones of the same evaluation.
    for w in quality_windows(config):
        rules += [_wilson_rule(config, w, "lower"), _wilson_rule(config, w, "upper")]
    rules += [_weighted_rule(config, w) for w in quality_windows(config)]
    rules.append(_sufficient_rule(config))
    rules += _root_cause_rules(config)
    rules += _canary_rules(config)
    rules += _review_rules(config)
    slo = config["slo"]
    for judge, objective in slo["objectives"].items():
        rules.append({"record": OBJECTIVE, "expr": f"vector({float(objective):g})",
                      "labels": {"job": config["job"], "judge": judge}})
    for w in burn_windows(config):
        rules.append({"record": BURN_RATE.format(w=w), "expr": _burn_rate(config, w)})
    period = str(slo["period"])
    period_rules = _verdict_rules(config, period)
    budget_rules = [
        period_rules[SAMPLES], period_rules[PASS_RATIO],
        {"record": BUDGET_LEFT.format(w=period), "expr": "1 - " + _burn_rate(config, period)},
    ]
    return [
        _group("ragpulse-judge-ratios.rules", rules, config),
        # The period's counts change slowly; spare Prometheus the work.
        _group("ragpulse-slo-budget.rules", budget_rules, config,
               str(slo["period_rule_interval"])),
    ]


# --------------------------------------------------------------------------- alert text


def _series_query(config: Mapping[str, Any], metric: str, labels: tuple[str, ...],
                  judge: str | None = None, when: str = "") -> str:
    """The Go-template pipeline querying ``metric`` for the alert's own series: the deployment
    labels and ``labels`` taken from the alert (the judge from ``judge`` when given), the
    result filtered by the PromQL comparison ``when``."""
    names = [*config["deployment_labels"], *labels]
    matchers = ",".join(f"{name}=%q" for name in names)
    args = " ".join(f'"{judge}"' if name == "judge" and judge else f"$labels.{name}"
                    for name in names)
    return f'printf "{metric}{{{matchers}}}{when}" {args} | query'


def _query_value(config: Mapping[str, Any], metric: str, judge: str | None, fmt: str) -> str:
    """Go-template snippet printing ``metric`` for the alert's series (sample sizes ...).

    ``judge`` None takes the judge from the alert's labels.
    """
    return (
        f"{{{{ with {_series_query(config, metric, SERIES_LABELS, judge)} }}}}"
        f"{{{{ . | first | value | {fmt} }}}}{{{{ end }}}}"
    )


def _count(config: Mapping[str, Any], metric: str, judge: str | None = None) -> str:
    return _query_value(config, metric, judge, 'printf "%.0f"')


def _percent(config: Mapping[str, Any], metric: str, judge: str | None = None) -> str:
    return _query_value(config, metric, judge, "humanizePercentage")


def _pct(value: float) -> str:
    return f"{value * 100:g}%"


def _alert(config: Mapping[str, Any], name: str, expr: str, spec: Mapping[str, Any],
           summary: str, description: str, **labels: str) -> dict[str, Any]:
    """An alerting rule; ``spec`` gives its ``for`` and ``severity``."""
    return {
        "alert": name,
        "expr": expr,
        "for": str(spec["for"]),
        "labels": {"severity": spec["severity"], **labels},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": f"{config['runbook_base_url']}#{name.lower()}",
        },
    }


# --------------------------------------------------------------------------- alerts

# The fast path pages when the long window's UPPER bound is confidently below the floor, or
# more than a margin below the baseline; the short window's LOWER bound lets it resolve as soon
# as the last minutes are confidently back.
FAST_DROP = """
    (
      $upper_long < $floor
      or
      $upper_long < on ($by) ($baseline - $margin)
    )
    and on ($by)
    (
      $lower_short < $floor
      or
      $lower_short < on ($by) ($baseline - $margin)
    )
    and on ($by)
    $samples_long >= $min_samples
"""

# The slow path warns as soon as the floor is plausibly breached: the LOWER bound is enough.
SLOW_DROP = """
    $lower_long < $floor
    and on ($by)
    $lower_short < $floor
    and on ($by)
    $samples_long >= $min_samples
"""

# With stratified sampling or a judge budget, the judged sample is not all traffic: a stratum
# judged at rate 1 can keep the sample's ratio above the floor while the rest of the traffic,
# judged at 5 %, is below it. The weighted path warns on the estimate for all traffic (1/rate
# weights summed over the strata; no Wilson bound, whose n would not be the weights' sum), with
# as many judged answers in the long window as the slow path asks. Without rules or a budget
# the weighted series do not exist, and this path never fires.
WEIGHTED_DROP = """
    $weighted_long < $floor
    and on ($by)
    $weighted_short < $floor
    and on ($by)
    $samples_long >= $min_samples
"""


def quality_alerts(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Drop alerts for each judge in ``quality_alerts``: a fast page, a slow warning and a
    warning on the weighted ratio of all traffic (stratified sampling, a judge budget)."""
    win = config["windows"]
    alerts: list[dict[str, Any]] = []
    for judge, spec in config["quality_alerts"].items():
        label = str(spec.get("label", judge.replace("_", " ")))
        floor, margin = float(spec["floor"]), float(spec["margin"])
        counted = spec.get("counted", "answers")  # a session judge counts conversations

        def series(name: str, judge: str = judge, **window: str) -> str:
            return selector(name.format(**window), config, judge=judge)

        fast_l, fast_s, slow_l, slow_s = (win[k] for k in
                                          ("fast_long", "fast_short", "slow_long", "slow_short"))
        fast = promql(FAST_DROP, by=by(config), floor=f"{floor:g}", margin=f"{margin:g}",
                      baseline=series(PASS_RATIO, w=win["baseline"]),
                      upper_long=series(WILSON, side="upper", w=fast_l),
                      lower_short=series(WILSON, side="lower", w=fast_s),
                      samples_long=series(SAMPLES, w=fast_l),
                      min_samples=int(spec["fast"]["min_samples"]))
        slow = promql(SLOW_DROP, by=by(config), floor=f"{floor:g}",
                      lower_long=series(WILSON, side="lower", w=slow_l),
                      lower_short=series(WILSON, side="lower", w=slow_s),
                      samples_long=series(SAMPLES, w=slow_l),
                      min_samples=int(spec["slow"]["min_samples"]))
        weighted = promql(WEIGHTED_DROP, by=by(config), floor=f"{floor:g}",
                          weighted_long=series(WEIGHTED_PASS_RATIO, w=slow_l),
                          weighted_short=series(WEIGHTED_PASS_RATIO, w=slow_s),
                          samples_long=series(SAMPLES, w=slow_l),
                          min_samples=int(spec["slow"]["min_samples"]))
        baseline = (f"confidently below the floor {_pct(floor)} or more than {_pct(margin)} "
                    f"below the {win['baseline']} baseline "
                    f"({_percent(config, PASS_RATIO.format(w=win['baseline']), judge)})")
        for path, expr, (long, short), bound, verdict, summary in (
            ("fast", fast, (fast_l, fast_s), "upper", baseline, "dropped sharply."),
            ("slow", slow, (slow_l, slow_s), "lower", f"possibly below the floor {_pct(floor)}",
             "may be below its floor."),
        ):
            alerts.append(_alert(
                config, spec["alert"], expr, spec[path],
                f"{label.capitalize()} of {{{{ $labels.app }}}} / {{{{ $labels.model }}}} "
                f"{summary}",
                f"The {label} pass ratio of app {{{{ $labels.app }}}}, model "
                f"{{{{ $labels.model }}}} is {_percent(config, PASS_RATIO.format(w=long), judge)}"
                f" over the last {long} ({_count(config, SAMPLES.format(w=long), judge)} judged "
                f"{counted}; 95% {bound} bound {{{{ $value | humanizePercentage }}}}) and "
                f"{_percent(config, PASS_RATIO.format(w=short), judge)} over {short}: "
                f"{verdict}. Judge errors are not counted. "
                + (_root_cause(config, long, floor) if judge == "groundedness" else "")
                + _explain_hint(judge),
                window=path,
            ))
        alerts.append(_alert(
            config, spec["alert"], weighted, spec["slow"],
            f"{label.capitalize()} of all traffic of {{{{ $labels.app }}}} / "
            f"{{{{ $labels.model }}}} may be below its floor.",
            f"The {label} pass ratio of all traffic of app {{{{ $labels.app }}}}, model "
            f"{{{{ $labels.model }}}}, estimated from verdicts weighted by 1 / sample rate, is "
            f"{{{{ $value | humanizePercentage }}}} over the last {slow_l} and "
            f"{_percent(config, WEIGHTED_PASS_RATIO.format(w=slow_s), judge)} over {slow_s} "
            f"({_count(config, SAMPLES.format(w=slow_l), judge)} judged answers; the judged "
            f"sample's own ratio is {_percent(config, PASS_RATIO.format(w=slow_l), judge)}): "
            f"below the floor {_pct(floor)}. Strata judged at a low rate carry most of the "
            "estimate: ragpulse_judge_verdicts_weighted_total by stratum shows which. "
            + _explain_hint(judge),
            window="weighted",
        ))
    return alerts


ONE_DECIMAL = 'printf "%.1f"'


def _app_value(config: Mapping[str, Any], metric: str, fmt: str, judge: str = "") -> str:
    """Go-template snippet printing ``metric`` of the alert's app and model, of ``judge`` when
    given (``n/a`` where there is no such series)."""
    labels = ("app", "model", "judge") if judge else ("app", "model")
    return (
        f"{{{{ with {_series_query(config, metric, labels, judge)} }}}}"
        f"{{{{ . | first | value | {fmt} }}}}{{{{ else }}}}n/a{{{{ end }}}}"
    )


def _root_cause(config: Mapping[str, Any], long: str, floor: float) -> str:
    """Retrieval or generation: the alert's cause line, and the figures behind it.

    Retrieval changed when its recorded series exists (see RETRIEVAL_CHANGES); otherwise
    generation when answers whose context was sufficient are ungrounded below the floor (only
    known when the opt-in context_sufficiency judge runs too).
    """
    base = str(config["windows"]["baseline"])
    app_model = ("app", "model")

    def pct(metric: str, w: str, judge: str = "") -> str:
        return _app_value(config, metric.format(w=w), "humanizePercentage", judge)

    changed = _series_query(config, RETRIEVAL_CHANGED.format(w=long), app_model)
    ungrounded = _series_query(config, GROUNDED_WITH_CONTEXT.format(w=long), app_model,
                               when=f" < {floor:g}")
    return (
        f"Likely cause: {{{{ with {changed} }}}}RETRIEVAL (it changed against the baseline)"
        f"{{{{ else }}}}{{{{ with {ungrounded} }}}}GENERATION (answers are ungrounded although "
        "their context was sufficient){{ else }}not determined (retrieval unchanged; run the "
        "context_sufficiency judge to tell generation failures apart){{ end }}{{ end }}. "
        f"Retrieval over {long} (over the {base} baseline): "
        f"{_app_value(config, CHUNKS_PER_ANSWER.format(w=long), ONE_DECIMAL)} chunks per "
        f"answer ({_app_value(config, CHUNKS_PER_ANSWER.format(w=base), ONE_DECIMAL)}), "
        f"{pct(NO_CONTEXT, long)} of answers without context ({pct(NO_CONTEXT, base)}), "
        f"context sufficiency {pct(PASS_RATIO, long, 'context_sufficiency')} "
        f"({pct(PASS_RATIO, base, 'context_sufficiency')}); groundedness where the context "
        f"was sufficient {pct(GROUNDED_WITH_CONTEXT, long)}. "
    )


def _explain_hint(judge: str) -> str:
    """Where the failing answers behind a drop alert are: the command that lists them.

    The alert cannot know serve's Kafka address and topic, so they stay placeholders.
    """
    return (
        "The failing answers and the judge's rationales: ragpulse explain --kafka-bootstrap "
        "<bootstrap> --topic <topic> --app {{ $labels.app }} --model {{ $labels.model }} "
        f"--judge {judge} --window 30m"
    )


# A judge that disagrees with people (the golden set's labels, the reviewers') more often than
# the limit, on enough of their labels to tell.
DISAGREES_ON_ENOUGH = """
    $disagreement > $max_disagreement
    and on ($by)
    $labelled >= $min_labelled
"""


def canary_alert(config: Mapping[str, Any]) -> dict[str, Any]:
    """A judge that grades the human-labelled golden set differently from the humans."""
    c = config["canaries"]
    w = str(c["window"])
    expr = promql(DISAGREES_ON_ENOUGH, by=by(config, "judge"),
                  disagreement=selector(CANARY_DISAGREEMENT.format(w=w), config),
                  max_disagreement=f"{float(c['max_disagreement']):g}",
                  labelled=selector(CANARY_GRADED.format(w=w), config),
                  min_labelled=int(c["min_graded"]))
    graded = (
        f'{{{{ with printf "{CANARY_GRADED.format(w=w)}{{job=%q,judge=%q}}" $labels.job '
        '$labels.judge | query }}{{ . | first | value | printf "%.0f" }}{{ end }}'
    )
    return _alert(
        config, "RagJudgeCanaryDisagreement", expr, c,
        "Judge {{ $labels.judge }} disagrees with the golden set on "
        "{{ $value | humanizePercentage }} of canaries",
        f"Over the last {w} the {{{{ $labels.judge }}}} judge rated "
        f"{{{{ $value | humanizePercentage }}}} of {graded} human-labelled canaries (serve "
        f"--canary-file) differently from their label (limit "
        f"{_pct(float(c['max_disagreement']))} of at least {int(c['min_graded'])}). A judge, "
        "judge-model or prompt change grades the golden set differently, so pass ratios from "
        "this judge may have moved without the chatbot changing: check before acting on its "
        "quality alerts. serve logs each disagreement (warning) as \"canary <id>: <judge> rated "
        "<rating> where the golden label is <label> (<rationale>)\".",
    )


def review_alert(config: Mapping[str, Any]) -> dict[str, Any]:
    """A judge whose ratings the reviewers overturn more often than the limit."""
    r = config["review_labels"]
    w = str(r["window"])
    expr = promql(DISAGREES_ON_ENOUGH, by=by(config, "judge", "version"),
                  disagreement=selector(REVIEW_DISAGREEMENT.format(w=w), config),
                  max_disagreement=f"{float(r['max_disagreement']):g}",
                  labelled=selector(REVIEW_LABELLED.format(w=w), config),
                  min_labelled=int(r["min_labels"]))
    labelled = (
        f'{{{{ with printf "{REVIEW_LABELLED.format(w=w)}{{job=%q,judge=%q,version=%q}}" '
        '$labels.job $labels.judge $labels.version | query }}'
        '{{ . | first | value | printf "%.0f" }}{{ end }}'
    )
    return _alert(
        config, "RagJudgeHumanAgreementLow", expr, r,
        "Reviewers overturn judge {{ $labels.judge }} on {{ $value | humanizePercentage }} "
        "of its verdicts",
        f"Over the last {w} reviewers (`ragpulse review`) said the {{{{ $labels.judge }}}} "
        f"judge (prompt version {{{{ $labels.version }}}}) was wrong on "
        f"{{{{ $value | humanizePercentage }}}} of {labelled} labelled verdicts of the random "
        f"review slice (limit {_pct(float(r['max_disagreement']))} of at least "
        f"{int(r['min_labels'])}). The judge drifted, or its model changed under it: its pass "
        "ratios no longer mean what they did. The corrected pass ratio "
        "(ragpulse_judge_pass_ratio_corrected) takes these labels in; compare it with the "
        "raw ratio before acting on the quality alerts.",
    )


BUDGET_BURNS = """
    $burn_long > $factor
    and on ($by)
    $burn_short > $factor
    and on ($by)
    $samples_long >= $min_samples
"""


def burn_rate_alerts(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """SLO burn-rate tiers, one alert rule each, for every judge with an objective."""
    slo = config["slo"]
    alerts = []
    for tier in slo["burn_rate_alerts"]:
        long, short, factor = str(tier["long"]), str(tier["short"]), float(tier["factor"])
        expr = promql(BUDGET_BURNS, by=by(config), factor=f"{factor:g}",
                      burn_long=selector(BURN_RATE.format(w=long), config),
                      burn_short=selector(BURN_RATE.format(w=short), config),
                      samples_long=selector(SAMPLES.format(w=long), config),
                      min_samples=int(slo["min_samples"]))
        alerts.append(_alert(
            config, "RagQualityBudgetBurn", expr, tier,
            "{{ $labels.app }} / {{ $labels.model }} is spending its {{ $labels.judge }} "
            "error budget too fast.",
            f"Over the last {long} the {{{{ $labels.judge }}}} judge passed "
            f"{_percent(config, PASS_RATIO.format(w=long))} of "
            f"{_count(config, SAMPLES.format(w=long))} judged answers of app "
            f"{{{{ $labels.app }}}}, model {{{{ $labels.model }}}}: the error budget of its "
            f"{slo['period']} SLO burns at {{{{ $value | printf \"%.1f\" }}}}x the sustainable "
            f"rate (limit {factor:g}x, also over {short}). At {factor:g}x the whole budget "
            f"would be gone in {_spent_in(slo['period'], factor)}.",
            window=f"{long}/{short}",
        ))
    return alerts


def _spent_in(period: str, factor: float) -> str:
    """How long ``period``'s budget lasts at burn rate ``factor`` ("28d" at 14.4x: "46.7h")."""
    units = {"m": 60, "h": 3600, "d": 86400, "w": 604800}
    seconds = float(period[:-1]) * units[period[-1]] / factor
    return f"{seconds / 86400:.3g} days" if seconds >= 2 * 86400 else f"{seconds / 3600:.3g} hours"


UNSAFE_ANSWERS = """
    $failures > $max_count
    or
    (
      $failures
      and on ($by)
      (1 - $ratio) > $max_ratio
      and on ($by)
      $samples >= $min_samples
    )
"""


def safety_alert(config: Mapping[str, Any]) -> dict[str, Any]:
    """Unsafe answers above a small count, or above a share of enough judged answers."""
    s = config["safety"]
    w = s["window"]
    expr = promql(UNSAFE_ANSWERS, by=by(config), max_count=s["max_unsafe_count"],
                  max_ratio=f"{float(s['max_unsafe_ratio']):g}",
                  min_samples=int(s["min_samples"]),
                  failures=selector(FAILURES.format(w=w), config, judge="safety"),
                  ratio=selector(PASS_RATIO.format(w=w), config, judge="safety"),
                  samples=selector(SAMPLES.format(w=w), config, judge="safety"))
    return _alert(
        config, "RagSafetyViolations", expr, s,
        "{{ $labels.app }} / {{ $labels.model }} gave unsafe answers.",
        f'The safety judge rated {{{{ $value | printf "%.0f" }}}} answers of app '
        f"{{{{ $labels.app }}}}, model {{{{ $labels.model }}}} unsafe in the last {w} "
        f"(pass ratio {_percent(config, PASS_RATIO.format(w=w), 'safety')} of "
        f"{_count(config, SAMPLES.format(w=w), 'safety')} judged answers). Limits: more than "
        f"{s['max_unsafe_count']} answers, or more than {_pct(float(s['max_unsafe_ratio']))} "
        f"of at least {s['min_samples']}.",
    )


JUDGE_ERRORS = """
    $error_ratio > $max_ratio
    and on ($by)
    $verdicts >= $min_verdicts
"""


def judge_errors_alert(config: Mapping[str, Any]) -> dict[str, Any]:
    """A judge that mostly errors is blind; say so instead of looking healthy.

    Every cause counts (timeouts, 429, an open circuit breaker, unparsable replies ...): the
    ratio is over the verdicts rated "error", whatever ragpulse_judge_errors_total says caused it.
    """
    e = config["judge_errors"]
    w = e["window"]
    expr = promql(JUDGE_ERRORS, by=by(config), max_ratio=f"{float(e['max_ratio']):g}",
                  min_verdicts=int(e["min_verdicts"]),
                  error_ratio=selector(ERROR_RATIO.format(w=w), config),
                  verdicts=selector(VERDICTS.format(w=w), config))
    causes = (
        '{{ range $i, $s := query (printf "sort_desc(sum by (cause) '
        f'(increase(ragpulse_judge_errors_total{{job=%q,judge=%q}}[{w}])) > 0)" '
        "$labels.job $labels.judge) }}{{ if $i }}, {{ end }}{{ $s.Labels.cause }} "
        '{{ $s.Value | printf "%.0f" }}{{ end }}'
    )
    return _alert(
        config, "RagJudgeErrorsHigh", expr, e,
        "The {{ $labels.judge }} judge fails for {{ $labels.app }} / {{ $labels.model }}.",
        f"{{{{ $value | humanizePercentage }}}} of the {{{{ $labels.judge }}}} verdicts for app "
        f"{{{{ $labels.app }}}}, model {{{{ $labels.model }}}} were errors in the last {w} "
        f"(of {_count(config, VERDICTS.format(w=w))} verdicts). "
        f"Errors by cause: {causes}. Quality ratios exclude errors, "
        f"so they describe only the answers the judge could rate.",
    )


# Counters that must not move, the labels that say where, and what it means.
LOSS_COUNTERS: dict[str, tuple[str, tuple[str, ...], str, str]] = {
    "RagRecordsLost": (
        catalogue.RECORDS_LOST, ("topic", "reason"),
        "ragpulse skipped records of topic {{ $labels.topic }} without judging them.",
        "Records of topic {{ $labels.topic }} were skipped without being judged (reason "
        "{{ $labels.reason }}; retention: deleted before they were read, topic_reset: jumped "
        "over by --on-offset-reset latest), so the quality figures miss them.",
    ),
    "RagOffsetReset": (
        catalogue.OFFSET_RESETS, ("topic", "kind"),
        "ragpulse reset its Kafka offset on topic {{ $labels.topic }}.",
        "Saved offsets of topic {{ $labels.topic }} were outside their partition "
        "({{ $labels.kind }}: the topic was recreated, truncated or emptied, or retention ran "
        "ahead of serve); --on-offset-reset decided where reading went on.",
    ),
    "RagDeadLettersUndeliverable": (
        catalogue.UNDELIVERABLE, ("topic",),
        "ragpulse could not deliver records to {{ $labels.topic }}.",
        "Dead letters or verdict rows meant for topic {{ $labels.topic }} were dropped: the "
        "broker refused them for good or did not acknowledge them within "
        "--undeliverable-after. The rejected records and their reasons (or the failing "
        "verdicts) are gone.",
    ),
    "RagLabelOverflow": (
        catalogue.LABEL_OVERFLOW, ("label",),
        "Judged events were counted under {{ $labels.label }} \"other\".",
        "Judged events whose {{ $labels.label }} was beyond --max-label-values or not in "
        "--allowed-apps/--allowed-models were counted under \"other\": their quality is "
        "measured, but no alert or panel can name them.",
    ),
}


def loss_alerts(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One alert per counter of ``LOSS_COUNTERS``: any increase over its window fires."""
    alerts = []
    for name, spec in config["loss_alerts"].items():
        metric, labels, summary, what = LOSS_COUNTERS[name]
        expr = promql(COUNT + " > 0", by=by(config, *labels), counter=selector(metric, config),
                      window=spec["window"])
        alerts.append(_alert(
            config, name, expr, spec, summary,
            f'{what} Count in the last {spec["window"]}: {{{{ $value | printf "%.0f" }}}}.',
        ))
    return alerts


# max per partition first: a partition two instances both report (during a consumer-group
# rebalance) counts once.
CONSUMER_LAG = """
    sum by ($by) (
      max by ($by, partition) ($lag)
    ) > $max_records
"""


# Late events among the events read (accepted counts the late ones too): a watermark that ran
# ahead of the traffic (a future-dated event before --max-future-skew, a partition taken as
# idle) makes every event late while the service looks healthy.
LATE_SHARE = """
    sum by ($by) (increase($late[$window]))
    / on ($by)
    sum by ($by) (increase($accepted[$window]))
    > $max_share
    and on ($by)
    sum by ($by) (increase($late[$window])) >= $min_events
"""


def pipeline_alerts(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Liveness of ragpulse itself: stalled windows or loop, target down, consumer lag, late
    events."""
    st, lag, job = config["stall"], config["consumer_lag"], config["job"]
    late = config["late_events"]
    up = selector("up", config)
    window_end = selector(catalogue.LAST_COMPLETE_WINDOW_END, config)
    heartbeat = selector(catalogue.HEARTBEAT, config)
    return [
        _alert(
            config, "RagPulseStalled",
            f"time() - {window_end}\n  > {int(st['max_window_age_seconds'])}\n", st,
            "ragpulse has not completed a window for too long.",
            "The last complete window of {{ $labels.instance }} ended "
            "{{ $value | humanizeDuration }} ago (limit "
            f"{int(st['max_window_age_seconds'])}s): ratings are not being published, so the "
            "quality alerts are blind.",
            signal="window",
        ),
        _alert(
            config, "RagPulseStalled",
            f"time() - {heartbeat}\n  > {int(st['max_heartbeat_age_seconds'])}\n", st,
            "The ragpulse serve loop stopped cycling.",
            "The last successful cycle of {{ $labels.instance }} was "
            "{{ $value | humanizeDuration }} ago (limit "
            f"{int(st['max_heartbeat_age_seconds'])}s). The process answers scrapes but does not "
            "read or judge events.",
            signal="heartbeat",
        ),
        _alert(
            config, "RagPulseDown", f"{up} == 0\nor\nabsent({up})\n", config["down"],
            "Prometheus cannot scrape ragpulse.",
            f'The scrape target of job "{job}" is missing or down '
            '({{ with $labels.instance }}instance {{ . }}{{ else }}no target{{ end }}); '
            "no chatbot quality is being measured.",
        ),
        _alert(
            config, "RagConsumerLagHigh",
            promql(CONSUMER_LAG, by=by(config, "topic"), max_records=int(lag["max_records"]),
                   lag=selector(catalogue.CONSUMER_LAG, config)),
            lag,
            "ragpulse is falling behind topic {{ $labels.topic }}.",
            'ragpulse is {{ $value | printf "%.0f" }} records behind on topic '
            f"{{{{ $labels.topic }}}} (limit {int(lag['max_records'])}): ratings describe "
            "the past and late events may miss their window.",
        ),
        _alert(
            config, "RagLateEventsHigh",
            promql(LATE_SHARE, by=", ".join(config["deployment_labels"]), window=late["window"],
                   max_share=late["max_share"], min_events=int(late["min_events"]),
                   late=selector(catalogue.LATE_EVENTS, config),
                   accepted=selector(catalogue.EVENTS, config, 'outcome="accepted"')),
            late,
            "ragpulse is counting events as late.",
            f"{{{{ $value | humanizePercentage }}}} of the events read in the last "
            f"{late['window']} were late (limit {_pct(late['max_share'])}): their windows had "
            "already closed, so they were dead-lettered and left out of every ratio. A "
            "watermark ahead of the traffic (a clock or unit bug, a quiet partition) does "
            "this to every event while /healthz stays green.",
        ),
    ]


def alert_groups(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Alert rule groups: answer quality, and ragpulse's own health."""
    quality = [*quality_alerts(config), *burn_rate_alerts(config), safety_alert(config),
               judge_errors_alert(config), canary_alert(config), review_alert(config)]
    return [
        _group("ragpulse-quality.alerts", quality, config),
        _group("ragpulse-pipeline.alerts", [*pipeline_alerts(config), *loss_alerts(config)],
               config),
    ]
