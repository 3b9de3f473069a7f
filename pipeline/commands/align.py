"""`ragpulse align --judge NAME`: a new prompt version of an LLM judge, with few-shot examples
chosen from its reviewers' labels, and its agreement with them before and after.

Reads the labels (the labels topic, or a JSON Lines file of label records) and the review items
they label (the review topic, or a file), joins them (pipeline/review/labelled.py), measures by
cross-validation how the judge agrees with the reviewers with its current prompt and with
examples chosen from the other folds (pipeline/review/alignment.py), and writes, under
--output: the aligned prompt (for a shipped judge, `prompts/` with every shipped prompt file and
the aligned one, for --judge-prompts; for a custom judge, its file with the examples) and
`align-report.json`. It never replaces the running prompt: the printed report says how to roll
the new version out, and that its calibration starts empty (another prompt version has other
error rates; `serve --judge-calibration` refuses a file of the old one).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from ragpulse.judges import JudgeInput
from ragpulse.judges.llm.judge import FRAME_VERSION, JudgePrompt, available_prompts, load_prompt
from ragpulse.judges.registry import JUDGES, SESSION_JUDGES
from ragpulse.pipeline.calibration import Interval, Value, verdict_value
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.formats.review import decode_item, decode_label
from ragpulse.pipeline.review.alignment import (
    AlignmentError,
    CrossValidation,
    aligned_prompt,
    check_alignable,
    choose_examples,
    cross_validate,
)
from ragpulse.pipeline.review.labelled import (
    Gathered,
    gather,
    rating_counts,
    read_items_file,
    read_labels_file,
    read_topic,
)
from ragpulse.pipeline.settings.models import AlignSettings, JudgeSettings

log = logging.getLogger(__name__)
REPORT_FILE = "align-report.json"


def current_prompt(judges: JudgeSettings, name: str) -> tuple[JudgePrompt, Any | None]:
    """The judge's prompt in use, and its CustomJudge when it is a custom judge; SettingsError
    for a judge align cannot take (unknown, local-only, a session judge)."""
    custom = {c.entry.name: c for c in judges.custom_judges}
    if name in custom:
        return custom[name].prompt, custom[name]
    if name in SESSION_JUDGES:
        raise SettingsError(f"--judge {name}: a session judge; review items are single answers")
    if name not in JUDGES:
        raise SettingsError(f"--judge {name}: no such judge (known: {', '.join(JUDGES)}; a "
                            "custom judge needs its --custom-judge FILE)")
    try:
        return load_prompt(name, judges.prompts_dir), None
    except ValueError:
        raise SettingsError(
            f"--judge {name}: it has no LLM prompt to align (LLM judges: "
            f"{', '.join(available_prompts())})"
        ) from None


def read_labelled(settings: AlignSettings) -> Gathered:
    """The labels and items of the judge, from the topics or the files."""
    if settings.labels_file is not None:
        assert settings.items_file is not None
        labels = read_labels_file(settings.labels_file)
        items = read_items_file(settings.items_file)
    else:
        assert settings.bootstrap is not None
        assert settings.labels_topic is not None and settings.review_topic is not None
        labels, bad_labels = read_topic(settings.bootstrap, settings.kafka_security,
                                        settings.labels_topic, settings.kafka_timeout_seconds,
                                        decode_label)
        items, bad_items = read_topic(settings.bootstrap, settings.kafka_security,
                                      settings.review_topic, settings.kafka_timeout_seconds,
                                      decode_item)
        if bad_labels or bad_items:
            log.warning("left out records that are not labels or review items: %d of %s, %d "
                        "of %s", bad_labels, settings.labels_topic, bad_items,
                        settings.review_topic)
    return gather(settings.judges.names[0], labels, items)


def _prompt_data(prompt: JudgePrompt) -> dict[str, Any]:
    return prompt.model_dump(mode="json", exclude_defaults=True)


def _dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


class _Judging:
    """Judges inputs with a given prompt of the judge, through the same registry and panel as
    calibrate (a shipped judge's prompt from a folder of prompt files, a custom judge's in its
    CustomJudge)."""

    def __init__(self, judges: JudgeSettings, custom: Any | None, folder: Path) -> None:
        self._judges = judges
        self._custom = custom
        self._folder = folder
        self.calls = 0

    def __call__(self, prompt: JudgePrompt, inputs: Sequence[JudgeInput]) -> list[Value | None]:
        if self._custom is not None:
            replaced = dataclasses.replace(self._custom, prompt=prompt)
            judges = self._judges.model_copy(update={"custom_judges": tuple(
                replaced if c.entry.name == prompt.name else c
                for c in self._judges.custom_judges
            )})
        else:
            write_prompt_folder(self._folder, prompt, self._judges.prompts_dir)
            judges = self._judges.model_copy(update={"prompts_dir": self._folder})
        panel = judges.spec().build()
        values: list[Value | None] = []
        try:
            batch = judges.batch_events
            for start in range(0, len(inputs), batch):
                for row in panel.judge_batch(list(inputs[start : start + batch])):
                    values.append(verdict_value(row[0]))
        finally:
            panel.close()
        self.calls += len(inputs)
        return values


def write_prompt_folder(folder: Path, prompt: JudgePrompt, source: Path | None) -> None:
    """`folder` as --judge-prompts reads it: every LLM judge's prompt file as in use (from
    `source`, else the shipped ones), with `prompt` in place of its judge's."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, entry in {**JUDGES, **SESSION_JUDGES}.items():
        if entry.prompt is None:
            continue
        target = folder / entry.prompt
        if name == prompt.name:
            target.write_text(_dump(_prompt_data(prompt)))
        elif source is not None:
            if (source / entry.prompt).exists():  # a folder without the session judges' files
                target.write_bytes((source / entry.prompt).read_bytes())
        else:
            shipped = importlib.resources.files("ragpulse.judges") / "prompts" / entry.prompt
            target.write_bytes(shipped.read_bytes())


def write_custom_judge(path: Path, prompt: JudgePrompt, custom: Any) -> None:
    """The custom judge's file with the aligned prompt, keeping its registry keys."""
    original = yaml.safe_load(Path(custom.entry.prompt).read_text())
    own = {k: original[k] for k in ("requires", "when_missing", "assessment") if k in original}
    path.write_text(_dump(_prompt_data(prompt) | own))


def main(settings: AlignSettings) -> int:
    name = settings.judges.names[0]
    if settings.judges.backend != "openai":
        raise SettingsError("align needs --judge-backend openai: a local judge has no prompt "
                            "to show examples to")
    prompt, custom = current_prompt(settings.judges, name)
    gathered = read_labelled(settings)
    try:
        check_alignable(prompt, gathered.items)
    except AlignmentError as exc:
        left = "; ".join(f"{n} {why}" for why, n in gathered.left_out.items())
        raise SettingsError(f"{exc}{f' (left out: {left})' if left else ''}") from None
    output = settings.output
    assert output is not None
    output.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragpulse-align-") as scratch:
        judging = _Judging(settings.judges, custom, Path(scratch))
        cv = cross_validate(prompt, gathered.items, judging, settings.examples, settings.folds)
        chosen = choose_examples(gathered.items, cv.before, settings.examples)
        new = aligned_prompt(prompt, chosen)
    if custom is not None:
        written = output / f"{name}.yaml"
        write_custom_judge(written, new, custom)
        rollout = (f"replace --custom-judge {custom.entry.prompt} with --custom-judge "
                   f"{written}")
    else:
        written = output / "prompts"
        write_prompt_folder(written, new, settings.judges.prompts_dir)
        rollout = f"add --judge-prompts {written} to serve, stream and run"
    report = alignment_report(settings, gathered, prompt, new, chosen, cv, written, rollout)
    (output / REPORT_FILE).write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print(summary(report))
    return 0


def alignment_report(
    settings: AlignSettings, gathered: Gathered, prompt: JudgePrompt, new: JudgePrompt,
    chosen: Sequence[Any], cv: CrossValidation, written: Path, rollout: str,
) -> dict[str, Any]:
    """The JSON align writes (and prints a summary of)."""
    judges = settings.judges
    notes = [n for item in gathered.items for n in item.notes]
    return {
        "judge": prompt.name,
        "model": judges.model,
        "labelled_items": len(gathered.items),
        "ratings": rating_counts(gathered.items),
        "left_out": gathered.left_out,
        "prompt_version_before": f"v{prompt.version}f{FRAME_VERSION}",
        "prompt_version_after": f"v{new.version}f{FRAME_VERSION}",
        "examples": [{"event_id": i.event_id, "rating": i.truth} for i in chosen],
        "cross_validation": {
            "folds": cv.folds,
            "examples_per_fold": cv.examples_per_fold,
            **cv.change.to_json(),
        },
        "guideline_candidates": notes,
        "written": str(written),
        "rollout": rollout,
    }


def _fmt(i: dict[str, Any]) -> str:
    interval = Interval(**i)
    if interval.value is None:
        return "-"
    if interval.low is None or interval.high is None:
        return f"{interval.value:.3f} [no interval]"
    return f"{interval.value:.3f} [{interval.low:.3f}, {interval.high:.3f}]"


def summary(report: dict[str, Any]) -> str:
    """What `ragpulse align` prints."""
    cv = report["cross_validation"]
    left = ", ".join(f"{why} {n}" for why, n in report["left_out"].items()) or "none"
    ratings = ", ".join(f"{r} {n}" for r, n in report["ratings"].items())
    lines = [
        f"{report['judge']} ({report['model']}) aligned to {report['labelled_items']} labelled "
        f"items ({ratings}); labels left out: {left}",
        f"{cv['folds']}-fold cross-validation, {cv['examples_per_fold']} examples chosen from "
        f"the other folds; {cv['graded']} items graded by both prompts"
        f" ({cv['left_out']} left out: a judge error)",
        "",
        f"  {'':<18}{'before (' + report['prompt_version_before'] + ')':<28}"
        f"{'after (' + report['prompt_version_after'] + ')':<28}change",
        f"  {'balanced accuracy':<18}{_fmt(cv['before_balanced_accuracy']):<28}"
        f"{_fmt(cv['after_balanced_accuracy']):<28}{_fmt(cv['change_balanced_accuracy'])}",
        f"  {'Cohen kappa':<18}{_fmt(cv['before_kappa']):<28}"
        f"{_fmt(cv['after_kappa']):<28}{_fmt(cv['change_kappa'])}",
        f"  {'mistakes':<18}{cv['mistakes_before']:<28}{cv['mistakes_after']:<28}",
        "  (95 % bootstrap intervals; the change's is paired, on the same items)",
        "",
        f"new prompt version {report['prompt_version_after']} with {len(report['examples'])} "
        f"labelled examples: {report['written']}",
        "It is not in use. To roll it out: " + report["rollout"] + ". Its verdicts are new "
        "series (version label " + report["prompt_version_after"] + "), and its calibration "
        "starts empty: a --judge-calibration file of " + report["prompt_version_before"]
        + " is refused; label its verdicts again (or run `ragpulse calibrate`).",
    ]
    if report["guideline_candidates"]:
        lines.append(f"{len(report['guideline_candidates'])} reviewer notes, guideline "
                     f"candidates, are in {REPORT_FILE}")
    return "\n".join(lines)
