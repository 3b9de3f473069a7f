"""`ragpulse calibrate`: how often a judge agrees with people, on a file of labelled events.

Judges every line of a JSON Lines file of human-labelled events (the event schema plus
`label`, see pipeline.calibration) with one judge, through the same registry and judge panel
as run and serve, then prints agreement, balanced accuracy, Cohen's kappa, sensitivity,
specificity, the confusion matrix and the disagreements, and writes them as JSON (--output):
the file `run` and `serve --judge-calibration` read to correct pass ratios.

A line that is not a valid labelled event stops the command with an error naming the line:
a calibration set is small and curated, and a silently smaller one would shift every figure.
A null label (annotators could not agree) is counted as unlabelled and left out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import orjson

from ragpulse.judges import JudgeInput, TextPolicy
from ragpulse.pipeline.calibration import (
    AgreementReport,
    Judged,
    Value,
    agreement_report,
    parse_label,
)
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event
from ragpulse.pipeline.settings.models import CalibrateSettings

log = logging.getLogger(__name__)

# Labelled events need no timestamp: they never enter a window. This one is only there so that
# the event parser, which requires an event time, accepts them.
_ANY_TIME = 1_000_000_000.0


def read_labelled(path: Path, judge: str) -> tuple[list[tuple[str, JudgeInput, Value]], int]:
    """The (request_id, judge input, label) of each labelled line, and how many lines have a
    null label; SettingsError names the file and line of the first bad line."""
    items: list[tuple[str, JudgeInput, Value]] = []
    unlabelled = 0
    with path.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
            if not raw.strip():
                continue
            try:
                record = parse_event(raw, record_time=_ANY_TIME)
                label = parse_label(_label_of(orjson.loads(raw), judge))
            except InvalidEvent as exc:
                raise SettingsError(f"labelled file {path}, line {number}: {exc.reason}") from None
            except ValueError as exc:
                raise SettingsError(f"labelled file {path}, line {number}: {exc}") from None
            if label is None:
                unlabelled += 1
            else:
                items.append((record.request_id, record.judge_input, label))
    if not items:
        raise SettingsError(f"labelled file {path}: no line has a label for {judge}")
    return items, unlabelled


def _label_of(line: dict[str, object], judge: str) -> object:
    """The line's `label`, or its `labels.JUDGE` (the canaries' golden-set format)."""
    if "label" in line:
        if "labels" in line:
            raise ValueError("give 'label' or 'labels', not both")
        return line["label"]
    labels = line.get("labels")
    if not isinstance(labels, dict) or judge not in labels:
        raise ValueError(f"no 'label' (nor 'labels.{judge}'): each line needs its human label")
    return labels[judge]


def calibrate(settings: CalibrateSettings) -> AgreementReport:
    """Judge every labelled event and compare the verdicts with the labels."""
    judge = settings.judges.names[0]
    items, unlabelled = read_labelled(settings.input, judge)
    spec = settings.judges.spec()
    panel = spec.build()
    batch = settings.judges.batch_events
    judged: list[Judged] = []
    try:
        for start in range(0, len(items), batch):
            part = items[start : start + batch]
            verdicts = panel.judge_batch([item for _, item, _ in part])
            judged += [
                Judged(request_id, label, v[0])
                for (request_id, _, label), v in zip(part, verdicts, strict=True)
            ]
    finally:
        panel.close()
    return agreement_report(
        judged,
        judge=judge,
        backend=spec.backend,
        model=spec.model if spec.backend == "openai" else None,
        labelled_file=str(settings.input),
        unlabelled=unlabelled,
        pass_threshold=settings.pass_threshold,
        rationale=_stored_text(settings.judges.text_policy()),
        probabilities=spec.logprobs,
        prompt_version=panel.prompt_versions[0],
    )


def _stored_text(policy: TextPolicy) -> Callable[[str | None], str | None]:
    """What the report keeps of a rationale, which can quote the answer (--store-text)."""
    redact = policy.redactor().redact

    def keep(text: str | None) -> str | None:
        if text is None or policy.store_text == "full":
            return text
        return redact(text) if policy.store_text == "redacted" else None

    return keep


def main(settings: CalibrateSettings) -> int:
    report = calibrate(settings)
    assert settings.output is not None
    settings.output.write_bytes(orjson.dumps(report.to_json(), option=orjson.OPT_INDENT_2) + b"\n")
    print(summary(report, settings.output, settings.show))
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary(report: AgreementReport, output: Path, show: int) -> str:
    """The table `ragpulse calibrate` prints."""
    r = report
    errors = sum(r.errors_by_cause.values())
    by_cause = ", ".join(f"{cause} {n}" for cause, n in r.errors_by_cause.items())
    lines = [
        f"{r.judge} ({r.backend}{', ' + r.model if r.model else ''}, prompt version "
        f"{r.prompt_version}) against the human labels "
        f"of {r.labelled_file}",
        f"graded {r.graded}; judge errors and skips {errors}"
        f"{f' ({by_cause})' if by_cause else ''}, left out; unlabelled {r.unlabelled}, left out",
        "",
        f"  exact agreement     {_fmt(r.exact_agreement)}",
    ]
    if r.within_one is not None:
        lines.append(f"  within one point    {_fmt(r.within_one)}")
    lines += [
        f"  balanced accuracy   {_fmt(r.balanced_accuracy)}",
        f"  Cohen's kappa       {_fmt(r.cohen_kappa)}",
        f"  sensitivity         {_fmt(r.sensitivity)}"
        + (f"  ({r.true_positives}/{r.positives} labelled passes passed)"
           if r.positives is not None else "  (needs labelled passes; --pass-threshold)"),
        f"  specificity         {_fmt(r.specificity)}"
        + (f"  ({r.true_negatives}/{r.negatives} labelled fails failed)"
           if r.negatives is not None else "  (needs labelled fails; --pass-threshold)"),
    ]
    if r.probabilities:
        lines += [
            f"  Brier score         {_fmt(r.brier_score)}  (P(yes) of {r.probabilities} "
            "verdicts, --judge-logprobs)",
            f"  calibration error   {_fmt(r.expected_calibration_error)}  (expected, 10 bins)",
        ]
    lines += [
        "",
        "confusion: rows are human labels, columns the judge's verdicts",
        *_matrix(r.confusion),
        "",
        f"disagreements: {len(r.disagreements)}"
        + (f" (the first {show} below)" if len(r.disagreements) > show else ""),
    ]
    for d in r.disagreements[:show]:
        rationale = " ".join((d["rationale"] or "").split())
        lines.append(
            f"  {str(d['request_id'])[:24]:<24} label {d['label']!s:<4} verdict "
            f"{d['verdict']!s:<4} {rationale[:80]}"
        )
    lines += ["", f"report (every disagreement and error) in {output}"]
    return "\n".join(lines)


def _matrix(confusion: Mapping[str, Mapping[str, int]]) -> Sequence[str]:
    columns = sorted({v for row in confusion.values() for v in row}, key=_order)
    head = f"  {'label':<8}" + "".join(f"{c:>8}" for c in columns)
    rows = [
        f"  {label:<8}" + "".join(f"{confusion[label].get(c, 0):>8}" for c in columns)
        for label in sorted(confusion, key=_order)
    ]
    return [head, *rows]


def _order(value: str) -> tuple[int, str]:
    # Scores in numeric order; "no" before "yes".
    return (int(value), "") if value.lstrip("-").isdigit() else (1 << 30, value)
