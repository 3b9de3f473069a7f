"""The reviewers' labels sorted as serve counts them (pipeline/service/labels.py, pure), and the
figures made of them (pipeline/calibration.py): each outcome, a second reviewer, a duplicate,
kappa from a table equal to kappa from pairs, and the calibration seed plus labels."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

import pytest

from ragpulse.pipeline.calibration import (
    Confusion,
    JudgeCalibration,
    cohen_kappa,
    corrected_ratio,
    with_labels,
)
from ragpulse.pipeline.formats.review import LabelRecord, encode_label, label_id
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.service import state as state_module
from ragpulse.pipeline.service.labels import sort_labels
from ragpulse.pipeline.service.state import CycleOutcome, LabelsTaken, StateStore

VERSIONS = {"groundedness": "local", "safety": "local"}


def record(value: bytes, position: int = 0, oversize: int | None = None) -> SourceRecord:
    return SourceRecord(value, "chat.labels", 0, position, oversize_bytes=oversize)


def label(event: str, rating: str, verdict: str, *, reviewer: str = "ann",
          judge: str = "groundedness", version: str = "local",
          reason: str = "random") -> bytes:
    return encode_label(LabelRecord(
        label_id=label_id(event, judge, version, reviewer), event_id=event, judge=judge,
        prompt_version=version, judge_rating=rating, verdict=verdict, reviewer=reviewer,
        labelled_at=datetime(2026, 11, 28, tzinfo=UTC), reason=reason,
        correct_score=2.0 if verdict == "score" else None,
    ))[1]


def nothing_before(ids: Iterable[str]) -> set[str]:
    return set()


def outcomes(counts: dict) -> dict[str, int]:
    return {dict(lab)["outcome"]: int(v) for (name, lab), v in counts.items()
            if name == "ragpulse_review_labels_read_total"}


def cells(counts: dict) -> dict[tuple[str, str, str], int]:
    return {(dict(lab)["slice"], dict(lab)["human"], dict(lab)["rating"]): int(v)
            for (name, lab), v in counts.items() if name == "ragpulse_review_labels_total"}


def test_each_label_gets_one_outcome_and_only_counted_ones_enter_the_table() -> None:
    values = [
        label("a", "yes", "right"), label("a", "yes", "wrong", reviewer="bob"),
        label("a", "yes", "right"),  # ann's click sent again
        label("b", "no", "wrong", reason="unsure"),
        label("c", "error", "wrong"), label("d", "yes", "score"),
        label("e", "yes", "right", judge="tone"), label("f", "yes", "right", version="v2"),
        b"{}", b"\xff\xfe",
    ]
    sorted_ = sort_labels([record(v, i) for i, v in enumerate(values)], VERSIONS,
                          nothing_before)
    assert outcomes(sorted_.counts) == {"counted": 3, "duplicate": 1, "not_binary": 2,
                                        "unknown_judge": 1, "other_version": 1, "malformed": 2}
    assert cells(sorted_.counts) == {("random", "yes", "yes"): 1, ("random", "no", "yes"): 1,
                                     ("targeted", "yes", "no"): 1}
    # The not_binary labels are remembered too, so a copy of one is a duplicate.
    assert len(sorted_.counted) == 5
    assert [r.record.position for r in sorted_.rejected] == [8, 9, 6, 7]
    assert "not a label record" in sorted_.rejected[0].reason


def test_a_label_counted_in_an_earlier_cycle_is_a_duplicate() -> None:
    value = label("a", "yes", "right")
    first = sort_labels([record(value)], VERSIONS, nothing_before)
    ids = {i for i, _, _ in first.counted}
    again = sort_labels([record(value, 1)], VERSIONS, lambda asked: ids & set(asked))
    assert outcomes(again.counts) == {"duplicate": 1}
    assert not again.counted


def test_an_oversized_record_is_malformed_with_its_size() -> None:
    sorted_ = sort_labels([record(b"{", oversize=70_000)], VERSIONS, nothing_before)
    assert outcomes(sorted_.counts) == {"malformed": 1}
    assert "70000 bytes" in sorted_.rejected[0].reason


@pytest.mark.parametrize("table", [(6, 1, 2, 3), (10, 0, 0, 10), (3, 4, 5, 6), (0, 0, 4, 0)])
def test_kappa_of_a_table_is_kappa_of_its_pairs(table: tuple[int, int, int, int]) -> None:
    yy, yn, ny, nn = table
    pairs = ([("yes", "yes")] * yy + [("yes", "no")] * yn + [("no", "yes")] * ny
             + [("no", "no")] * nn)
    assert Confusion(yy, yn, ny, nn).kappa == cohen_kappa(pairs)


def test_labels_add_to_the_calibration_seed_and_alone_need_a_pass_and_a_fail() -> None:
    seed = JudgeCalibration("groundedness", "local", None, "cal.json", 40, 38, 20, 17, "local")
    merged = with_labels(seed, "groundedness", "local", Confusion(6, 1, 2, 3), "local", None)
    assert merged is not None
    assert (merged.positives, merged.true_positives, merged.negatives,
            merged.true_negatives) == (47, 44, 25, 20)
    assert merged.source == "cal.json + 12 review labels"
    assert corrected_ratio(80, 100, merged) != corrected_ratio(80, 100, seed)
    assert with_labels(None, "groundedness", "local", Confusion(5, 1, 0, 0), "local",
                       None) is None
    alone = with_labels(None, "groundedness", "local", Confusion(5, 1, 1, 3), "local", None)
    assert alone is not None and alone.sensitivity == 5 / 6 and alone.specificity == 3 / 4
    assert with_labels(seed, "groundedness", "local", Confusion(), "local", None) is seed


def queued_as(
    table: dict[tuple[str, str], str],
) -> Callable[[Iterable[tuple[str, str]]], dict[tuple[str, str], str]]:
    def lookup(keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
        return {k: table[k] for k in keys if k in table}
    return lookup


def test_a_label_of_no_queued_item_or_of_another_version_than_the_queued_ones_is_kept_apart(
) -> None:
    values = [
        label("a", "yes", "right"),  # its item was queued with the running version
        label("b", "yes", "right"),  # no item of b was queued
        label("c", "yes", "right"),  # c was queued by a judge version since replaced
        # A team's own label of b (ragpulse import-labels): not checked against the queue.
        label("b", "yes", "right", reason="imported", reviewer="team"),
    ]
    queued = queued_as({("a", "groundedness"): "local", ("c", "groundedness"): "v0"})
    sorted_ = sort_labels([record(v, i) for i, v in enumerate(values)], VERSIONS,
                          nothing_before, queued)
    assert outcomes(sorted_.counts) == {"counted": 2, "unknown_event": 1, "other_version": 1}
    reasons = [r.reason for r in sorted_.rejected]
    assert "no review item with this event id and judge was queued" in reasons[0]
    assert "judged with 'v0'" in reasons[1]


def test_the_state_file_keeps_the_newest_queued_verdicts_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_module, "QUEUED_KEPT", 3)
    with StateStore(tmp_path / "state.sqlite") as store:
        for i in range(5):
            store.apply_cycle("chat", CycleOutcome(labels=LabelsTaken(
                "chat.labels", review_topic="chat.review", review_offsets={0: i + 1},
                queued=[(f"e{i}", "groundedness", "local")],
            )))
        keys = [(f"e{i}", "groundedness") for i in range(5)]
        assert store.queued_versions(keys) == {k: "local" for k in keys[2:]}
        assert store.offsets("chat.review") == {0: 5}


def grades(counts: dict) -> dict[tuple[str, str], int]:
    return {(dict(lab)["grade"], dict(lab)["rating"]): int(v) for (name, lab), v in counts.items()
            if name == "ragpulse_review_label_grades_total"}


def test_a_correct_score_is_tabulated_by_grade_and_counted_as_pass_or_fail_by_the_pass_score(
) -> None:
    def scored(event: str, judge_rating: str, score: float) -> bytes:
        return encode_label(LabelRecord(
            label_id=label_id(event, "groundedness", "local", "ann"), event_id=event,
            judge="groundedness", prompt_version="local", judge_rating=judge_rating,
            verdict="score", correct_score=score, reviewer="ann",
            labelled_at=datetime(2026, 11, 28, tzinfo=UTC), reason="random",
        ))[1]

    values = [scored("a", "yes", 3), scored("b", "yes", 1), scored("c", "no", 0),
              scored("d", "no", 2)]
    records = [record(v, i) for i, v in enumerate(values)]
    # The judge's pass score is 2 (a 0-3 scale): 3 and 2 are passes, 1 and 0 fails.
    sorted_ = sort_labels(records, VERSIONS, nothing_before, None, {"groundedness": 2.0})
    assert outcomes(sorted_.counts) == {"counted": 4}
    assert cells(sorted_.counts) == {("random", "yes", "yes"): 1, ("random", "no", "yes"): 1,
                                     ("random", "no", "no"): 1, ("random", "yes", "no"): 1}
    assert grades(sorted_.counts) == {("3", "yes"): 1, ("1", "yes"): 1, ("0", "no"): 1,
                                      ("2", "no"): 1}
    # Without the judge's pass score, the grades are still tabulated, and nothing is in the
    # yes/no table.
    unknown = sort_labels(records, VERSIONS, nothing_before)
    assert outcomes(unknown.counts) == {"not_binary": 4}
    assert not cells(unknown.counts) and grades(unknown.counts) == grades(sorted_.counts)
