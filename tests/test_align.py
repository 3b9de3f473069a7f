"""`ragpulse align`: examples chosen from labels, the agreement before and after on labels the
examples did not use, a new prompt version written beside the running one, and clear errors.

The judge model is the stand-in that follows the examples it is shown (tests/example_judge.py):
without examples of their kind it fails every answer holding the marker word and passes the
rest, so the labelled items below are made for it to err on two kinds of answer (a correct
answer that holds the word, an invented refund rule without it) and to be right on two others.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import pytest
from example_judge import ExampleFollowingJudge
from fake_openai import MARKER, FakeOpenAI
from kafka_broker import ApacheKafkaBroker, produce

from ragpulse.judges.base import JudgeInput
from ragpulse.judges.llm.custom import load_custom_judge
from ragpulse.judges.llm.judge import load_prompt, load_prompt_file
from ragpulse.pipeline.calibration import bootstrap_interval, cohen_kappa
from ragpulse.pipeline.formats.review import (
    JudgeView,
    LabelRecord,
    ReviewChunk,
    ReviewItem,
    encode_item,
    encode_label,
    label_id,
)
from ragpulse.pipeline.review.alignment import (
    AlignmentError,
    check_alignable,
    choose_examples,
    folds_of,
)
from ragpulse.pipeline.review.labelled import LabelledItem, gather

T0 = datetime(2025, 11, 20, 10, 0, tzinfo=UTC)
VERSION = "v1f2"

# (kind, human rating, the question, the answer): {n} makes each item of a kind its own.
KINDS = {
    "marker_right": ("yes", "Which characters are {MARKER} in file names on share {n}?",
                     "On share {n} the {MARKER} characters in file names are slash, colon "
                     "and the asterisk."),
    "invented_refund": ("no", "How are refunds for order {n} paid?",
                        "Refunds for order {n} are paid in cash at any branch within one hour "
                        "of asking."),
    "plain_right": ("yes", "When does the library open on day {n}?",
                    "The library opens at nine on day {n}, as the timetable says."),
    "marker_wrong": ("no", "Can I share my password for account {n}?",
                     "Sharing the password of account {n} is {MARKER} but fine for friends "
                     "and family members."),
}


def items_and_labels(per_kind: int = 5, reviewer: str = "ana") -> tuple[
        list[ReviewItem], list[LabelRecord]]:
    """Review items of the four kinds, with a label each saying whether the stand-in's
    default verdict (no iff the marker) was right."""
    items, labels = [], []
    for kind, (truth, question, answer) in KINDS.items():
        for n in range(per_kind):
            event_id = f"{kind}-{n}"
            q = question.format(n=n, MARKER=MARKER)
            a = answer.format(n=n, MARKER=MARKER)
            said = "no" if MARKER in a else "yes"
            items.append(review_item(event_id, q, a, said))
            labels.append(label(event_id, said, "right" if said == truth else "wrong",
                                reviewer, note=f"{kind}: as the reviewers' guide says"))
    return items, labels


def review_item(event_id: str, question: str, answer: str, said: str) -> ReviewItem:
    return ReviewItem(
        event_id=event_id, app="docs", model="m", event_time=T0, window_start=T0,
        window_end=T0.replace(minute=5), reason="random", request=question, response=answer,
        chunks=(ReviewChunk(content=f"The help centre's page on {question.lower()}"),),
        verdicts=(JudgeView(judge="groundedness", rating=said, prompt_version=VERSION),),
        redacted=False, queued_at=T0,
    )


def label(event_id: str, said: str, verdict: str, reviewer: str = "ana",
          note: str | None = None) -> LabelRecord:
    return LabelRecord(
        label_id=label_id(event_id, "groundedness", VERSION, reviewer), event_id=event_id,
        judge="groundedness", prompt_version=VERSION, judge_rating=said, verdict=verdict,
        note=note, reviewer=reviewer, labelled_at=T0, reason="random",
    )


def write_jsonl(path: Path, records: list[ReviewItem] | list[LabelRecord]) -> Path:
    path.write_text("".join(r.model_dump_json() + "\n" for r in records))
    return path


def align(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ragpulse.pipeline.cli", "align", *args],
        capture_output=True, text=True, timeout=600,
    )


@pytest.fixture
def stand_in() -> Iterator[tuple[FakeOpenAI, ExampleFollowingJudge]]:
    model = ExampleFollowingJudge()
    with FakeOpenAI(reply_for=model) as server:
        yield server, model


def judge_flags(server: FakeOpenAI) -> list[str]:
    return ["--judge", "groundedness", "--judge-backend", "openai", "--judge-base-url",
            server.base_url, "--judge-model", "stand-in", "--judge-cache-size", "0"]


# -- the choice of examples, the folds and the figures (pure) -----------------------------------


def labelled(event_id: str, truth: Literal["yes", "no"], question: str) -> LabelledItem:
    return LabelledItem(event_id, JudgeInput(question=question, answer="a"), truth, ())


def test_examples_are_both_ratings_mistakes_first_and_unlike_each_other() -> None:
    items = (
        [labelled(f"cat-{i}", "yes", f"cats purr softly {i}") for i in range(4)]
        + [labelled(f"car-{i}", "yes", f"cars need fuel {i}") for i in range(4)]
        + [labelled(f"tax-{i}", "no", f"taxes are due {i}") for i in range(4)]
    )
    # The judge erred on every cat and car item and on no tax item.
    judged = ["no"] * 8 + ["no"] * 4
    chosen = choose_examples(items, judged, 4)
    kinds = [i.event_id.split("-")[0] for i in chosen]
    assert sorted(kinds) == ["car", "cat", "tax", "tax"]  # both ratings, one cat and one car
    right_yes = [labelled("ok", "yes", "fine")]
    chosen = choose_examples(items[:2] + right_yes, ["yes", "no", "yes"], 1)
    assert [i.event_id for i in chosen] == ["cat-1"]  # the mistake, not the right verdicts


def test_folds_are_stratified_and_cover_every_item_once() -> None:
    items = [labelled(f"y{i}", "yes", "q") for i in range(7)] + [
        labelled(f"n{i}", "no", "q") for i in range(3)]
    folds = folds_of(items, 5)
    assert len(folds) == 3  # no more folds than the rarer rating has items
    assert sorted(i for f in folds for i in f) == list(range(10))
    assert all(any(items[i].truth == "no" for i in f) for f in folds)


def test_the_kappa_interval_is_fixed_and_holds_the_figure() -> None:
    pairs = [("yes", "yes")] * 30 + [("no", "no")] * 20 + [("yes", "no")] * 5 + [
        ("no", "yes")] * 5
    first, second = bootstrap_interval(pairs, cohen_kappa), bootstrap_interval(pairs, cohen_kappa)
    assert first == second
    assert first.low is not None and first.high is not None and first.value is not None
    assert first.low < first.value < first.high
    assert first.value == pytest.approx(cohen_kappa(pairs))


def test_labels_sent_twice_count_once_and_disagreeing_reviewers_are_left_out() -> None:
    items, labels = items_and_labels(per_kind=2)
    other = label("plain_right-0", "yes", "wrong", reviewer="bo")  # bo says no, ana yes
    orphan = label("never-queued", "yes", "right")
    gathered = gather("groundedness", [*labels, labels[0], other, orphan], items)
    assert len(gathered.items) == 7
    assert gathered.left_out == {"no review item": 1, "reviewers disagree": 2}
    assert "plain_right-0" not in {i.event_id for i in gathered.items}


@pytest.mark.parametrize(("judge", "message"), [
    ("correctness", "correctness reads expected, which review items do not hold"),
    ("chunk_relevance", "chunk_relevance grades each passage"),
])
def test_judges_whose_inputs_review_items_lack_cannot_be_aligned(judge: str, message: str) -> None:
    items = [labelled(f"y{i}", "yes", "q") for i in range(6)] + [
        labelled(f"n{i}", "no", "q") for i in range(6)]
    with pytest.raises(AlignmentError, match=message):
        check_alignable(load_prompt(judge), items)


# -- the command, with the stand-in judge -----------------------------------------------------


def test_align_from_files_learns_the_reviewers_kinds_and_writes_a_new_version(
    tmp_path: Path, stand_in: tuple[FakeOpenAI, ExampleFollowingJudge]
) -> None:
    server, model = stand_in
    items, labels = items_and_labels()
    out = tmp_path / "aligned"
    done = align(*judge_flags(server), "--labels", str(write_jsonl(tmp_path / "l.jsonl", labels)),
                 "--items", str(write_jsonl(tmp_path / "i.jsonl", items)),
                 "--output", str(out), "--examples", "6", "--folds", "5")
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "align-report.json").read_text())
    cv = report["cross_validation"]
    # Before: the marker answers that are right and the invented refunds are all wrong.
    assert cv["mistakes_before"] == 10 and cv["graded"] == 20
    assert cv["before_balanced_accuracy"]["value"] == pytest.approx(0.5)
    # After: the examples of the other folds show both kinds; every held-out item is right.
    assert cv["mistakes_after"] == 0
    assert cv["after_kappa"]["value"] == pytest.approx(1.0)
    assert cv["change_kappa"]["low"] > 0
    assert model.followed > 0
    # The new version: the shipped prompt's examples plus 6 labelled ones, version bumped;
    # every other prompt file is there too, so --judge-prompts can read the folder.
    shipped = load_prompt("groundedness")
    new = load_prompt("groundedness", out / "prompts")
    assert new.version == shipped.version + 1
    assert new.examples[: len(shipped.examples)] == shipped.examples
    added = new.examples[len(shipped.examples):]
    assert len(added) == 6 and {e.rating for e in added} == {"yes", "no"}
    assert all(MARKER in (e.answer or "") for e in added if e.rating == "yes")
    assert all("as the reviewers' guide says" in e.rationale for e in added)
    assert load_prompt("safety", out / "prompts") == load_prompt("safety")
    assert report["prompt_version_before"] == f"v{shipped.version}f2"
    assert report["prompt_version_after"] == f"v{shipped.version + 1}f2"
    # It says how to roll it out and that its calibration starts empty; nothing else changed.
    assert f"--judge-prompts {out / 'prompts'}" in done.stdout
    assert "calibration starts empty" in done.stdout
    assert load_prompt("groundedness") == shipped


def test_align_a_custom_judge_writes_its_file_with_the_examples(
    tmp_path: Path, stand_in: tuple[FakeOpenAI, ExampleFollowingJudge]
) -> None:
    server, _ = stand_in
    shipped = load_prompt_file(Path("judges/prompts/groundedness.yaml"))
    custom = shipped.model_dump(mode="json", exclude_defaults=True) | {
        "name": "grounded_docs", "requires": ["answer"]}
    path = tmp_path / "grounded_docs.yaml"
    path.write_text(json.dumps(custom))  # JSON is YAML
    items, labels = items_and_labels()
    labels = [label(x.event_id, x.judge_rating, x.verdict) for x in labels]
    labels = [x.model_copy(update={"judge": "grounded_docs", "label_id": label_id(
        x.event_id, "grounded_docs", VERSION, "ana")}) for x in labels]
    flags = judge_flags(server)
    flags[1] = "grounded_docs"
    done = align(*flags, "--custom-judge", str(path), "--labels",
                 str(write_jsonl(tmp_path / "l.jsonl", labels)), "--items",
                 str(write_jsonl(tmp_path / "i.jsonl", items)), "--output",
                 str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    aligned = load_custom_judge(tmp_path / "out" / "grounded_docs.yaml")
    assert aligned.prompt.version == 2 and len(aligned.prompt.examples) == 8
    assert aligned.entry.requires == ("answer",)
    assert f"replace --custom-judge {path}" in done.stdout


@pytest.mark.parametrize(("case", "message"), [
    ("few", "4 usable labelled items of groundedness; align needs at least 10"),
    ("one rating", "every labelled item of groundedness is rated 'yes'; align needs both"),
    ("unknown judge", "groundednes"),
    ("local judge", "a local judge has no prompt"),
    ("no items", "--labels FILE needs --items FILE"),
])
def test_align_refuses_what_it_cannot_align_in_one_line(
    tmp_path: Path, stand_in: tuple[FakeOpenAI, ExampleFollowingJudge], case: str, message: str
) -> None:
    server, _ = stand_in
    items, labels = items_and_labels()
    if case == "few":
        labels = labels[:2] + labels[-2:]
    if case == "one rating":
        labels = [x for x in labels if x.event_id.startswith(("marker_right", "plain_right"))]
    flags = judge_flags(server)
    if case == "unknown judge":
        flags[1] = "groundedness"[:-1]
    if case == "local judge":
        flags[3] = "local"
        flags = [*flags[:4], "--judge-cache-size", "0"]
    sources = ["--labels", str(write_jsonl(tmp_path / "l.jsonl", labels))]
    if case != "no items":
        sources += ["--items", str(write_jsonl(tmp_path / "i.jsonl", items))]
    done = align(*flags, *sources, "--output", str(tmp_path / "out"))
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("ragpulse align:")]
    assert len(errors) == 1 and message in errors[0]
    assert not (tmp_path / "out").exists()
    assert server.requests == []  # nothing judged, nothing paid


def test_a_malformed_label_line_is_an_error_naming_its_line(
    tmp_path: Path, stand_in: tuple[FakeOpenAI, ExampleFollowingJudge]
) -> None:
    server, _ = stand_in
    items, labels = items_and_labels()
    path = write_jsonl(tmp_path / "l.jsonl", labels)
    path.write_text(path.read_text() + '{"event_id": "x"}\n')
    done = align(*judge_flags(server), "--labels", str(path), "--items",
                 str(write_jsonl(tmp_path / "i.jsonl", items)))
    assert done.returncode == 2
    assert f"labels file {path}, line 21: " in done.stderr


@pytest.mark.kafka
def test_align_reads_the_labels_and_review_topics(
    tmp_path: Path, kafka_broker: ApacheKafkaBroker,
    stand_in: tuple[FakeOpenAI, ExampleFollowingJudge],
) -> None:
    server, _ = stand_in
    items, labels = items_and_labels()
    kafka_broker.create_topic("chat.review", 2)
    kafka_broker.create_topic("chat.labels", 2)
    produce(kafka_broker.bootstrap, "chat.review", [encode_item(i)[1] for i in items]
            + [b"not a review item"])
    # Each label twice (a retried click) and a record that is not a label: counted once, and
    # left out with a warning.
    produce(kafka_broker.bootstrap, "chat.labels",
            [encode_label(x)[1] for x in labels + labels] + [b"{}"])
    done = align(*judge_flags(server), "--kafka-bootstrap", kafka_broker.bootstrap, "--topic",
                 "chat", "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "align-report.json").read_text())
    assert report["labelled_items"] == 20
    assert report["cross_validation"]["mistakes_after"] == 0
    assert "1 of chat.labels, 1 of chat.review" in done.stderr
