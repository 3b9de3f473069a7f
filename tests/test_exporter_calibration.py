"""`ragpulse exporter --judge-calibration FILE`: the stream's corrected pass ratio starts from the
calibration file as serve's does, and adds the reviewers' labels the stream counted to it.

Serve's figures come from serve's own part (`ReviewLabels.figures`, with the same file given to
`ServeSettings`); the exporter's from its pane table and label counters, fed the same window and
the same label counts. The two /metrics must show the same numbers: with a seed only, labels
only, and both; a seed of another prompt version than the stream's windows is left out (serve
refuses it at start; the exporter learns the version from the panes) and says so.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import orjson
import pytest
from cli import ragpulse_in_process
from prometheus_client import CollectorRegistry

from ragpulse.pipeline.commands.exporter import RatingsExporter
from ragpulse.pipeline.formats.rating_rows import RatingPane
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.metrics.collector import MetricsSnapshot, registry_for
from ragpulse.pipeline.service.labels import ReviewLabels
from ragpulse.pipeline.service.state import StateStore
from ragpulse.pipeline.settings.models import ExporterSettings, JudgeSettings, ServeSettings
from ragpulse.pipeline.windows import RatingCounts, WindowKey

JUDGE = "groundedness"
VERSION = "local"  # the local judges' prompt version
T0 = 1_700_000_400.0
WINDOW = WindowKey(T0, T0 + 60, JUDGE, "a", "m", VERSION)
COUNTS = RatingCounts(70, 30, 0)  # the window: 70 passes of 100 graded
# The seed: 200 labelled passes (180 passed by the judge), 100 labelled fails (80 failed).
SEED = {"positives": 200, "true_positives": 180, "negatives": 100, "true_negatives": 80}
# The stream's label counts, by (slice, human, rating): the random slice has 7 labelled passes
# (6 passed by the judge) and 5 labelled fails (3 failed); targeted items stay out of it.
CELLS = {
    ("random", "yes", "yes"): 6, ("random", "yes", "no"): 1,
    ("random", "no", "yes"): 2, ("random", "no", "no"): 3,
    ("targeted", "no", "yes"): 4,
}
FAMILIES = (
    catalogue.CALIBRATION_LABELLED, catalogue.CALIBRATION_SENSITIVITY,
    catalogue.CALIBRATION_SPECIFICITY, "ragpulse_judge_pass_ratio_corrected",
    "ragpulse_judge_pass_ratio_corrected_ci_low", "ragpulse_judge_pass_ratio_corrected_ci_high",
    catalogue.HUMAN_KAPPA, catalogue.HUMAN_SENSITIVITY, catalogue.HUMAN_SPECIFICITY,
    catalogue.HUMAN_LABELS,
)


def seed_file(tmp_path: Path, version: str = VERSION) -> Path:
    path = tmp_path / "calibration-groundedness.json"
    path.write_bytes(orjson.dumps({
        "format": 1, "judge": JUDGE, "backend": "local", "model": None,
        "prompt_version": version, **SEED,
    }))
    return path


def label_counts(cells: Mapping[tuple[str, str, str], int]) -> dict[counting.CounterKey, int]:
    return {
        counting.key(catalogue.REVIEW_LABELS, judge=JUDGE, version=VERSION, slice=slice_,
                     human=human, rating=rating): n
        for (slice_, human, rating), n in cells.items()
    }


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in registry.collect() if family.name in FAMILIES
        for s in family.samples
    }


def exporter_samples(
    seeds: list[Path], counts: Mapping[counting.CounterKey, int]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    exporter = RatingsExporter(ExporterSettings(
        bootstrap="127.0.0.1:9", ratings_topic="logs.ratings", judge_calibrations=seeds,
    ))
    exporter.apply(RatingPane(WINDOW, COUNTS, "on_time", 1))
    for key, value in counts.items():
        exporter.apply_label_count(key, value)
    return samples(registry_for(exporter.snapshot, event_counters=False))


def serve_samples(
    tmp_path: Path, seeds: list[Path], counts: Mapping[counting.CounterKey, int]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    settings = ServeSettings(
        judges=JudgeSettings(backend="local", names=(JUDGE,)), bootstrap="127.0.0.1:9",
        topic="logs", dead_letter_topic="logs.dlq", verdicts_topic="logs.verdicts",
        judge_calibrations=seeds,
    )
    figures = ReviewLabels(settings, StateStore(tmp_path / "state.sqlite")).figures(counts)
    snapshot = MetricsSnapshot(
        counts=counts, complete={WINDOW: COUNTS}, calibrations=figures.calibrations,
        agreements=figures.agreements,
    )
    return samples(registry_for(lambda: snapshot, event_counters=False))


def rogan_gladen(p: float, sensitivity: float, specificity: float) -> float:
    return min(1.0, max(0.0, (p + specificity - 1) / (sensitivity + specificity - 1)))


@pytest.mark.parametrize(
    ("case", "sensitivity", "specificity", "labelled_yes"),
    [
        ("seed", 180 / 200, 80 / 100, 200),
        ("labels", 6 / 7, 3 / 5, 7),
        ("both", (180 + 6) / (200 + 7), (80 + 3) / (100 + 5), 207),
    ],
)
def test_the_exporter_corrects_the_pass_ratio_as_serve_does_from_a_seed_labels_or_both(
    tmp_path: Path, case: str, sensitivity: float, specificity: float, labelled_yes: int
) -> None:
    seeds = [] if case == "labels" else [seed_file(tmp_path)]
    counts = {} if case == "seed" else label_counts(CELLS)
    exported = exporter_samples(seeds, counts)
    assert exported == serve_samples(tmp_path, seeds, counts)

    def value(name: str, **labels: str) -> float:
        return exported[(name, tuple(sorted(labels.items())))]

    assert value(catalogue.CALIBRATION_SENSITIVITY, judge=JUDGE) == pytest.approx(sensitivity)
    assert value(catalogue.CALIBRATION_SPECIFICITY, judge=JUDGE) == pytest.approx(specificity)
    assert value(catalogue.CALIBRATION_LABELLED, judge=JUDGE, label="yes") == labelled_yes
    series = {"judge": JUDGE, "version": VERSION, "app": "a", "model": "m"}
    corrected = value("ragpulse_judge_pass_ratio_corrected", **series)
    assert corrected == pytest.approx(rogan_gladen(0.7, sensitivity, specificity))
    low = value("ragpulse_judge_pass_ratio_corrected_ci_low", **series)
    high = value("ragpulse_judge_pass_ratio_corrected_ci_high", **series)
    assert low < corrected < high
    # The agreement with reviewers is the labels' alone, never the seed's.
    agreement = [k for k in exported if k[0] == catalogue.HUMAN_KAPPA]
    assert len(agreement) == (0 if case == "seed" else 2)  # the random and targeted slices


def test_a_seed_of_another_prompt_version_is_left_out_and_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seeds = [seed_file(tmp_path, version="0123abcd")]
    counts = label_counts(CELLS)
    with caplog.at_level(logging.WARNING, logger="ragpulse.pipeline.commands.exporter"):
        exported = exporter_samples(seeds, counts)
    # The labels alone, as without the file.
    assert exported == exporter_samples([], counts)
    said = [r.getMessage() for r in caplog.records if "prompt version 0123abcd" in r.getMessage()]
    assert len(said) == 1 and f"windows carry {VERSION}" in said[0]


def test_the_exporter_refuses_a_judge_calibrated_twice_and_a_bad_file(tmp_path: Path) -> None:
    seed = seed_file(tmp_path)
    other = tmp_path / "copy.json"
    other.write_bytes(seed.read_bytes())
    argv = ["exporter", "--kafka-bootstrap", "127.0.0.1:9", "--ratings-topic", "logs.ratings"]
    done = ragpulse_in_process(*argv, "--judge-calibration", str(seed),
                               "--judge-calibration", str(other), "--print-config")
    assert done.returncode == 2
    assert f"judge '{JUDGE}' is calibrated twice" in done.stderr
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    done = ragpulse_in_process(*argv, "--judge-calibration", str(bad), "--print-config")
    assert done.returncode == 2
    assert "key 'format'" in done.stderr and "Traceback" not in done.stderr
    done = ragpulse_in_process(*argv, "--judge-calibration", str(seed), "--print-config")
    assert done.returncode == 0, done.stderr
