"""Judges measured against human labels (`ragpulse calibrate`) and pass ratios corrected for
their errors (--judge-calibration on run and serve).

The labelled files are built here with counts known by hand: the local correctness judge is
deterministic (an answer naming the expected answer is "yes", another "no", an event without
one skipped), so each statistic can be checked against its hand-computed value.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from cli import one_line_error, ragpulse
from fake_openai import MARKER, FakeOpenAI, Fault, fake_openai_fixture  # noqa: F401
from prometheus_client.parser import text_string_to_metric_families

from ragpulse.judges.base import Verdict
from ragpulse.pipeline.calibration import (
    MIN_YOUDEN,
    CalibrationError,
    JudgeCalibration,
    Judged,
    agreement_report,
    check_calibrations,
    corrected_ratio,
    load_calibration,
    rogan_gladen,
)
from ragpulse.pipeline.cli import main
from ragpulse.pipeline.commands.calibrate import read_labelled
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for
from ragpulse.pipeline.settings.command_flags import RUN
from ragpulse.pipeline.settings.models import JudgeSettings, RunSettings, build
from ragpulse.pipeline.windows import RatingCounts, WindowKey

T0 = 1_763_632_800  # 2025-11-20T10:00:00Z, a multiple of 300
RIGHT = "The capital of France is Paris."
WRONG = "The capital of France is Lyon."


def labelled_event(i: int, answer: str, label: object, *, expected: str | None = "Paris") -> bytes:
    event: dict[str, Any] = {
        "request_id": f"lab-{i}",
        "request": "What is the capital of France?",
        "response": answer,
        "label": label,
    }
    if expected is not None:
        event["expected_response"] = expected
    return orjson.dumps(event)


# (answer, label, how many): the judge says yes to RIGHT and no to WRONG, so
# 6 true passes, 3 passes failed, 2 fails passed, 5 true fails.
CONFUSION = ((RIGHT, "yes", 6), (WRONG, "yes", 3), (RIGHT, "no", 2), (WRONG, "no", 5))


def labelled_file(folder: Path) -> Path:
    lines, i = [], 0
    for answer, label, n in CONFUSION:
        for _ in range(n):
            lines.append(labelled_event(i, answer, label))
            i += 1
    # Two events the judge cannot grade (no expected answer) and one without a human verdict.
    lines.append(labelled_event(100, RIGHT, "yes", expected=None))
    lines.append(labelled_event(101, WRONG, "no", expected=None))
    lines.append(labelled_event(102, RIGHT, None))
    path = folder / "labelled.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_calibrate_reports_every_statistic_of_a_known_confusion_matrix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "cal.json"
    code = main(["calibrate", str(labelled_file(tmp_path)), "--judge", "correctness",
                 "--output", str(output)])
    assert code == 0
    printed = capsys.readouterr().out
    assert "exact agreement     0.688" in printed and "Cohen's kappa       0.375" in printed
    report = json.loads(output.read_text())
    tp, fn, fp, tn = 6, 3, 2, 5
    n = tp + fn + fp + tn
    assert report["graded"] == n
    assert report["unlabelled"] == 1
    # Both lack the expected answer: the judge is skipped for them, which calibrate leaves out
    # and reports apart, like an error.
    assert report["errors_by_cause"] == {"skipped": 2}
    assert sorted(e["request_id"] for e in report["errors"]) == ["lab-100", "lab-101"]
    assert report["confusion"] == {"no": {"no": tn, "yes": fp}, "yes": {"no": fn, "yes": tp}}
    assert (report["positives"], report["true_positives"]) == (tp + fn, tp)
    assert (report["negatives"], report["true_negatives"]) == (fp + tn, tn)
    assert report["exact_agreement"] == pytest.approx(11 / 16)
    assert report["sensitivity"] == pytest.approx(6 / 9)
    assert report["specificity"] == pytest.approx(5 / 7)
    assert report["balanced_accuracy"] == pytest.approx((6 / 9 + 5 / 7) / 2)
    # Chance agreement: labels 9 yes / 7 no, verdicts 8 yes / 8 no -> (9*8 + 7*8) / 16^2 = 0.5.
    assert report["cohen_kappa"] == pytest.approx((11 / 16 - 0.5) / 0.5)
    assert report["within_one"] is None  # a binary judge
    disagreements = {d["request_id"]: (d["label"], d["verdict"]) for d in report["disagreements"]}
    assert disagreements == {
        **{f"lab-{i}": ("yes", "no") for i in range(6, 9)},
        **{f"lab-{i}": ("no", "yes") for i in range(9, 11)},
    }
    assert all(d["rationale"] for d in report["disagreements"])


def test_graded_labels_get_agreement_within_one_point_and_a_pass_threshold() -> None:
    @dataclasses.dataclass(frozen=True)
    class ScoredVerdict(Verdict):  # what a judge on a graded scale returns
        score: int = 0

    pairs = [(3, 3), (3, 2), (2, 0), (1, 1), (0, 1), (3, 3)]  # (label, score)
    judged = [
        Judged(f"g{i}", label, ScoredVerdict("helpfulness", "yes", score=score))
        for i, (label, score) in enumerate(pairs)
    ]
    report = agreement_report(
        judged, judge="helpfulness", backend="openai", model="m", labelled_file="f",
        pass_threshold=2,
    )
    assert report.exact_agreement == pytest.approx(3 / 6)
    assert report.within_one == pytest.approx(5 / 6)
    # Per-class recall: 3 -> 2/3, 2 -> 0/1, 1 -> 1/1, 0 -> 0/1.
    assert report.balanced_accuracy == pytest.approx((2 / 3 + 0 + 1 + 0) / 4)
    # Passing is a score >= 2: labels pass 4 (all passed but the 2 scored 0), fail 2 (1 of them
    # scored 1, the other 1: both failed).
    assert (report.positives, report.true_positives) == (4, 3)
    assert (report.negatives, report.true_negatives) == (2, 2)
    assert report.confusion == {"0": {"1": 1}, "1": {"1": 1}, "2": {"0": 1},
                                "3": {"2": 1, "3": 2}}


@pytest.mark.slow  # a subprocess, to see the one line and no traceback
def test_a_bad_label_stops_calibrate_naming_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_bytes(labelled_event(1, RIGHT, "yes") + b"\n" + labelled_event(2, RIGHT, "maybe"))
    done = ragpulse("calibrate", str(path), "--judge", "correctness",
                    "--output", str(tmp_path / "c.json"))
    line = one_line_error(done.returncode, done.stderr, allow_info=True)
    assert f"labelled file {path}, line 2" in line and "'maybe'" in line
    assert not (tmp_path / "c.json").exists()


def test_an_event_without_a_label_stops_calibrate_naming_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    event = orjson.loads(labelled_event(1, RIGHT, "yes"))
    del event["label"]
    path.write_bytes(labelled_event(0, RIGHT, "no") + b"\n\n" + orjson.dumps(event))
    with pytest.raises(SettingsError, match="line 3: no 'label'"):
        read_labelled(path, "correctness")


def test_golden_set_lines_are_read_with_the_label_of_the_judge_and_both_forms_are_refused(
    tmp_path: Path,
) -> None:
    golden = orjson.loads(labelled_event(1, WRONG, "no"))
    del golden["label"]
    golden["labels"] = {"correctness": "yes", "safety": "no"}  # a canary file's line
    path = tmp_path / "golden.jsonl"
    path.write_bytes(orjson.dumps(golden) + b"\n" + labelled_event(2, RIGHT, None))
    items, unlabelled = read_labelled(path, "correctness")
    assert [(request_id, label) for request_id, _, label in items] == [("lab-1", "yes")]
    assert unlabelled == 1
    path.write_bytes(orjson.dumps({**golden, "label": "no"}))
    with pytest.raises(SettingsError, match="line 1: give 'label' or 'labels', not both"):
        read_labelled(path, "correctness")


def test_store_text_none_keeps_the_rationales_out_of_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "cal.json"
    code = main(["calibrate", str(labelled_file(tmp_path)), "--judge", "correctness",
                 "--output", str(output), "--store-text", "none"])
    assert code == 0
    report = json.loads(output.read_text())
    assert report["disagreements"] and all(d["rationale"] is None for d in report["disagreements"])
    assert all(e["error_message"] is None for e in report["errors"])
    assert "disagreements: 5" in capsys.readouterr().out


def test_calibrate_an_llm_judge_counts_endpoint_failures_as_errors_apart_from_the_figures(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    # The stand-in model says "no" to an answer holding MARKER, "yes" to any other.
    # Distinct answers: identical inputs would be judged once (the verdict cache).
    lines = [labelled_event(i, f"{RIGHT} ({i}{MARKER if i % 3 == 0 else ''})",
                            "no" if i % 2 else "yes") for i in range(12)]
    path = tmp_path / "labelled.jsonl"
    path.write_bytes(b"\n".join(lines))
    fake_openai.push_faults(Fault.http(500), Fault.http(500))  # the first two calls fail
    output = tmp_path / "cal.json"
    code = main(["calibrate", str(path), "--judge", "correctness", "--output", str(output),
                 "--judge-backend", "openai", "--judge-base-url", fake_openai.base_url,
                 "--judge-model", "judge-m", "--judge-concurrency", "1",
                 "--judge-max-retries", "0"])
    assert code == 0
    report = json.loads(output.read_text())
    assert report["errors_by_cause"] == {"server_error": 2}
    assert sorted(e["request_id"] for e in report["errors"]) == ["lab-0", "lab-1"]
    assert report["graded"] == 10
    # Events 2..11: label yes on even i, verdict no when i % 3 == 0 (3, 6, 9).
    graded = range(2, 12)
    tp = sum(1 for i in graded if i % 2 == 0 and i % 3 != 0)
    tn = sum(1 for i in graded if i % 2 == 1 and i % 3 == 0)
    assert (report["true_positives"], report["positives"]) == (tp, 5)
    assert (report["true_negatives"], report["negatives"]) == (tn, 5)
    assert (report["backend"], report["model"]) == ("openai", "judge-m")
    assert load_calibration(output).model == "judge-m"


def test_brier_score_and_calibration_error_of_known_probabilities() -> None:
    def judged(label: str, rating: str, p: float) -> Judged:
        return Judged("r", label, Verdict("groundedness", rating, "why", score=p))  # type: ignore[arg-type]

    cases = [judged("yes", "yes", 0.9), judged("yes", "yes", 0.9), judged("no", "yes", 0.9),
             judged("no", "no", 0.2), judged("yes", "no", 0.2)]
    report = agreement_report(cases, judge="groundedness", backend="openai", model="m",
                              labelled_file="f", probabilities=True)
    # (0.01 + 0.01 + 0.81 + 0.04 + 0.64) / 5
    assert report.brier_score == pytest.approx(0.302)
    # Bin 0.9: mean P 0.9, 2/3 yes; bin 0.2: mean P 0.2, 1/2 yes -> 3/5*0.2333 + 2/5*0.3.
    assert report.expected_calibration_error == pytest.approx(0.6 * (0.9 - 2 / 3) + 0.4 * 0.3)
    assert report.probabilities == 5
    without = agreement_report(cases, judge="groundedness", backend="openai", model="m",
                               labelled_file="f")
    assert (without.brier_score, without.expected_calibration_error) == (None, None)


def test_calibrate_with_logprobs_reports_the_brier_score_of_the_endpoints_p_yes(
    tmp_path: Path,
) -> None:
    lines = [labelled_event(i, f"{RIGHT} ({i}{MARKER if i % 2 else ''})",
                            "no" if i % 2 else "yes") for i in range(6)]
    path = tmp_path / "labelled.jsonl"
    path.write_bytes(b"\n".join(lines))
    output = tmp_path / "cal.json"
    with FakeOpenAI(logprobs="on", rating_probability=0.8) as server:
        assert main(["calibrate", str(path), "--judge", "correctness", "--output", str(output),
                     "--judge-backend", "openai", "--judge-base-url", server.base_url,
                     "--judge-logprobs"]) == 0
    report = json.loads(output.read_text())
    # Every verdict right, each at 0.8 on its rating: P(yes) 0.8 on yes, 0.2 on no.
    assert report["probabilities"] == 6
    assert report["brier_score"] == pytest.approx(0.04)
    assert report["expected_calibration_error"] == pytest.approx(0.2)


# ------------------------------------------------------------------ calibration files


def calibration_json(**changes: Any) -> dict[str, Any]:
    base = {"format": 1, "judge": "groundedness", "backend": "local", "model": None,
            "prompt_version": "local",
            "positives": 200, "true_positives": 180, "negatives": 100, "true_negatives": 80}
    return {**base, **changes}


def write(path: Path, data: object) -> Path:
    path.write_bytes(orjson.dumps(data))
    return path


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"format": 2}, "format"),
        ({"backend": "vllm"}, "backend"),
        ({"true_negatives": None}, "true_negatives"),
        ({"positives": 0, "true_positives": 0}, "positives"),
        ({"true_positives": 201}, "true_positives"),
        ({"negatives": -1}, "negatives"),
        ({"judge": ""}, "judge"),
        ({"prompt_version": None}, "prompt_version"),
    ],
)
def test_a_bad_calibration_file_is_refused_naming_the_file_and_key(
    tmp_path: Path, changes: dict[str, Any], key: str
) -> None:
    path = write(tmp_path / "cal.json", calibration_json(**changes))
    with pytest.raises(CalibrationError, match=re.escape(f"calibration file {path}, key '{key}'")):
        load_calibration(path)


def batch_settings(tmp_path: Path, *calibrations: Path) -> RunSettings:
    events = tmp_path / "e.jsonl"
    events.write_text("")
    judges = JudgeSettings(backend="local", names=("groundedness",))
    return build(
        RunSettings, RUN.flag_names(), input=events, judges=judges,
        judge_calibrations=calibrations,
    )


def test_a_calibration_for_another_backend_twice_the_same_judge_or_not_json_is_refused(
    tmp_path: Path,
) -> None:
    other = write(tmp_path / "other.json", calibration_json(backend="openai"))
    with pytest.raises(SettingsError, match=r"--judge-calibration: .* measured groundedness on "
                       r"the openai backend; this run uses local"):
        batch_settings(tmp_path, other)
    cal = write(tmp_path / "cal.json", calibration_json())
    with pytest.raises(SettingsError, match="judge 'groundedness' is calibrated twice"):
        batch_settings(tmp_path, cal, cal)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(SettingsError, match=re.escape(f"calibration file {broken}: not JSON")):
        batch_settings(tmp_path, broken)
    assert batch_settings(tmp_path, cal).judge_calibrations == (load_calibration(cal),)


@pytest.mark.slow  # imports Beam in a subprocess
def test_run_refuses_a_calibration_of_another_prompt_version_in_one_line(
    tmp_path: Path, fake_openai: FakeOpenAI
) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text("")
    cal = write(tmp_path / "cal.json", calibration_json(backend="openai", prompt_version="v0f2"))
    done = ragpulse("run", str(events), "--judges", "groundedness", "--judge-calibration", str(cal),
                    "--judge-backend", "openai", "--judge-base-url", fake_openai.base_url)
    line = one_line_error(done.returncode, done.stderr, allow_info=True)
    assert line == (
        "ragpulse run: invalid settings: --judge-calibration: "
        f"{cal} measured groundedness with prompt version v0f2; this run uses v1f2: run "
        "`ragpulse calibrate` again with this prompt"
    )
    # The version calibrate records is the one run checks: the same file with it is accepted.
    assert main(["calibrate", str(labelled_file(tmp_path)), "--judge", "correctness",
                 "--output", str(tmp_path / "c.json"), "--judge-backend", "openai",
                 "--judge-base-url", fake_openai.base_url]) == 0
    assert load_calibration(tmp_path / "c.json").prompt_version == "v1f2"


@pytest.mark.slow  # imports Beam in a subprocess
def test_run_refuses_a_calibration_for_a_judge_it_does_not_run_in_one_line(
    tmp_path: Path,
) -> None:
    events = tmp_path / "e.jsonl"
    events.write_text("")
    cal = write(tmp_path / "cal.json", calibration_json(judge="safety"))
    done = ragpulse("run", str(events), "--judges", "groundedness", "--judge-calibration", str(cal))
    line = one_line_error(done.returncode, done.stderr, allow_info=True)
    assert line.startswith("ragpulse run: invalid settings: --judge-calibration: ")
    assert f"{cal} calibrates judge 'safety', which is not in --judges" in line


# ------------------------------------------------------------------ the corrected ratio


def calibration(tp: int, pos: int, tn: int, neg: int) -> JudgeCalibration:
    """A groundedness calibration: `tp` of `pos` labelled passes passed, `tn` of `neg` fails
    failed."""
    return JudgeCalibration("groundedness", "local", None, "test", pos, tp, neg, tn, "local")


def test_corrected_ratio_is_rogan_gladen_and_its_interval_holds_it() -> None:
    c = calibration(180, 200, 80, 100)  # sensitivity 0.9, specificity 0.8
    r = corrected_ratio(70, 100, c)
    assert r is not None
    assert r.value == pytest.approx((0.7 + 0.8 - 1) / (0.9 + 0.8 - 1))
    assert r.low < r.value < r.high
    assert corrected_ratio(70, 100, c) == r  # the same counts, the same interval (fixed seed)
    assert corrected_ratio(0, 0, c) is None
    # Observed ratios the judge's errors alone explain are clipped to [0, 1].
    assert rogan_gladen(0.95, 0.9, 0.8) == 1.0 and rogan_gladen(0.1, 0.9, 0.8) == 0.0


def test_the_corrected_ratio_of_large_synthetic_windows_recovers_the_true_rate() -> None:
    rng = random.Random(7)
    sens, spec = 0.85, 0.75
    c = calibration(round(sens * 2000), 2000, round(spec * 2000), 2000)
    for true_rate in (0.3, 0.8, 0.95):
        n = 20_000
        yes = sum(
            rng.random() < (sens if rng.random() < true_rate else 1 - spec) for _ in range(n)
        )
        r = corrected_ratio(yes, n, c)
        assert r is not None
        assert abs(yes / n - true_rate) > 0.05  # the raw ratio is well off...
        assert r.value == pytest.approx(true_rate, abs=0.02)  # ...the corrected one is not
        assert r.low <= true_rate <= r.high


SCENARIOS = [
    # (true pass rate, window n, labelled passes, labelled fails, sensitivity, specificity)
    (0.9, 100, 100, 100, 0.9, 0.8),
    (0.95, 500, 40, 25, 0.97, 0.85),  # small calibration set: the delta method covers 80 %
    (0.6, 50, 60, 40, 0.8, 0.7),
    (0.7, 200, 50, 50, 0.75, 0.7),
]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_corrected_interval_covers_the_true_rate_about_95_percent_of_the_time(
    scenario: tuple[float, int, int, int, float, float],
) -> None:
    true_rate, n, pos, neg, sens, spec = scenario
    rng = random.Random(repr(scenario))
    observed = true_rate * sens + (1 - true_rate) * (1 - spec)
    trials, covered = 400, 0
    for _ in range(trials):
        # A fresh calibration set and a fresh window each time: both uncertainties vary.
        tp = sum(rng.random() < sens for _ in range(pos))
        tn = sum(rng.random() < spec for _ in range(neg))
        yes = sum(rng.random() < observed for _ in range(n))
        r = corrected_ratio(yes, n, calibration(tp, pos, tn, neg))
        assert r is not None
        covered += r.low <= true_rate <= r.high
    # 400 trials: the binomial standard error at 95 % is 1.1 points.
    assert 0.91 <= covered / trials <= 0.99, covered / trials


def collect(snapshot: MetricsSnapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = registry_for(lambda: snapshot)
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect()
        for s in family.samples
    }


def series(judge: str) -> tuple[tuple[str, str], ...]:
    return (("app", "a"), ("judge", judge), ("model", "m"), ("version", ""))


def test_metrics_export_the_corrected_ratio_of_calibrated_judges_only() -> None:
    windows = {
        WindowKey(T0, T0 + 300, judge, "a", "m"): RatingCounts(70, 30, 2)
        for judge in ("groundedness", "safety")
    }
    cal = calibration(180, 200, 80, 100)
    metrics = collect(MetricsSnapshot({}, windows, calibrations={"groundedness": cal}))
    corrected = corrected_ratio(70, 100, cal)
    assert corrected is not None
    name = "ragpulse_judge_pass_ratio_corrected"
    assert metrics[(name, series("groundedness"))] == pytest.approx(corrected.value)
    assert metrics[(f"{name}_ci_low", series("groundedness"))] == pytest.approx(corrected.low)
    assert metrics[(f"{name}_ci_high", series("groundedness"))] == pytest.approx(corrected.high)
    assert (name, series("safety")) not in metrics
    assert metrics[("ragpulse_judge_pass_ratio", series("safety"))] == 0.7  # unchanged
    judge = (("judge", "groundedness"),)
    assert metrics[("ragpulse_judge_calibration_sensitivity", judge)] == 0.9
    assert metrics[("ragpulse_judge_calibration_labelled", (*judge, ("label", "no")))] == 100


def test_a_judge_no_better_than_chance_gets_no_corrected_ratio_and_one_warning_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    chance = calibration(52, 100, 51, 100)  # sens + spec - 1 = 0.03
    assert chance.youden <= MIN_YOUDEN
    with caplog.at_level(logging.WARNING, logger="ragpulse.pipeline.calibration"):
        check_calibrations([chance], ["groundedness"], "local", "any")
    assert [r.getMessage() for r in caplog.records if "barely depend" in r.getMessage()]
    windows = {WindowKey(T0, T0 + 300, "groundedness", "a", "m"): RatingCounts(70, 30, 0)}
    metrics = collect(MetricsSnapshot({}, windows, calibrations={"groundedness": chance}))
    assert not [k for k in metrics if k[0].startswith("ragpulse_judge_pass_ratio_corrected")]
    assert corrected_ratio(70, 100, chance) is None


# ------------------------------------------------------------------ run and serve


GROUNDED = "Refunds are accepted within 30 days of purchase."
UNGROUNDED = "Refunds are accepted within 90 days at the Zurich office of Globex."


def event(i: int, grounded: bool, second: int) -> bytes:
    """An event at T0 + `second` that the local groundedness judge passes when `grounded`."""
    return orjson.dumps({
        "request_id": f"e{i}", "timestamp": (T0 + second) * 1000, "app": "a", "model": "m",
        "request": "How many days do refunds take?",
        "response": GROUNDED if grounded else UNGROUNDED,
        "retrieved_context": [{"content": GROUNDED, "doc_uri": "kb/1"}],
    })


def events_file(folder: Path, grounded: int, ungrounded: int) -> Path:
    path = folder / "events.jsonl"
    flags = [True] * grounded + [False] * ungrounded
    path.write_bytes(b"\n".join(event(i, g, i) for i, g in enumerate(flags)) + b"\n")
    return path


@pytest.mark.slow  # runs a Beam pipeline
def test_run_writes_the_corrected_ratio_to_windows_jsonl_and_the_metrics_textfile(
    tmp_path: Path,
) -> None:
    cal = write(tmp_path / "cal.json", calibration_json())  # sensitivity 0.9, specificity 0.8
    out = tmp_path / "out"
    done = ragpulse("run", str(events_file(tmp_path, 30, 10)), "--output", str(out),
                    "--judges", "groundedness,safety", "--judge-calibration", str(cal))
    assert done.returncode == 0, done.stderr
    rows = {r["judge"]: r for r in map(json.loads, (out / "windows.jsonl").read_text().split())}
    assert (rows["groundedness"]["yes"], rows["groundedness"]["no"]) == (30, 10)
    expected = corrected_ratio(30, 40, load_calibration(cal))
    assert expected is not None and expected.value == pytest.approx((0.75 - 0.2) / 0.7)
    g = rows["groundedness"]
    assert (g["corrected_percentage"], g["corrected_ci_low"], g["corrected_ci_high"]) == (
        pytest.approx(expected.value), pytest.approx(expected.low), pytest.approx(expected.high)
    )
    assert "corrected_percentage" not in rows["safety"]
    samples = {
        (s.name, s.labels.get("judge")): s.value
        for f in text_string_to_metric_families((out / "metrics.prom").read_text())
        for s in f.samples
    }
    assert samples[("ragpulse_judge_pass_ratio_corrected", "groundedness")] == pytest.approx(
        expected.value
    )
    assert samples[("ragpulse_judge_pass_ratio_corrected_ci_low", "groundedness")] == (
        pytest.approx(expected.low)
    )
    assert ("ragpulse_judge_pass_ratio_corrected", "safety") not in samples


@pytest.fixture(scope="module")
def broker(apache_kafka: Any) -> Iterator[Any]:
    from kafka_broker import for_module

    yield from for_module(apache_kafka)


def test_serve_exports_the_corrected_ratio_of_a_calibrated_judge_at_scrape(
    tmp_path: Path, served_topic: Any
) -> None:
    cal = write(tmp_path / "cal.json", calibration_json())  # sensitivity 0.9, specificity 0.8
    # The window [T0, T0 + 10 s) holds 7 grounded answers and 3 others; it closes once the
    # events of the next window move the watermark past its end.
    first = [event(i, i < 7, i) for i in range(10)]
    second = [event(10 + i, True, 10 + i) for i in range(5)]
    topic = served_topic("calibrated", records=[*first, *second])
    serve = topic.serve(
        "--allowed-lateness", "0s", "--out-of-orderness", "0s",
        "--judges", "groundedness", "--judge-calibration", str(cal),
    )
    labels = {"judge": "groundedness", "version": "local", "app": "a", "model": "m"}
    name = "ragpulse_judge_pass_ratio_corrected"
    scrape = serve.wait_for(lambda m: m.value(name, **labels) is not None, 60, "a corrected ratio")
    assert scrape.value("ragpulse_judge_pass_ratio", **labels) == 0.7
    expected = corrected_ratio(7, 10, load_calibration(cal))
    assert expected is not None and expected.value == pytest.approx((0.7 - 0.2) / 0.7)
    assert scrape.value(name, **labels) == pytest.approx(expected.value)
    assert scrape.value(f"{name}_ci_low", **labels) == pytest.approx(expected.low)
    assert scrape.value(f"{name}_ci_high", **labels) == pytest.approx(expected.high)
    # The open window's ratio is corrected too (all 5 grounded: observed 1.0, clipped to 1).
    assert scrape.value("ragpulse_judge_in_progress_pass_ratio_corrected", **labels) == 1.0
