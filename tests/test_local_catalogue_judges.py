"""The opt-in judges of the Agent Evaluation catalogue on the local backend: chunk_relevance,
context_sufficiency, correctness and document_recall, and what each does without its inputs."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_local_judges import _eval_script

from ragpulse.judges.base import Chunk, JudgeInput, Verdict
from ragpulse.judges.chunk_verdicts import event_verdict
from ragpulse.judges.local.judge import build_local_judges
from ragpulse.judges.registry import DEFAULT_JUDGES, judge_entry
from ragpulse.pipeline.cli import main

EIFFEL = Chunk(
    "The Eiffel Tower was built between 1887 and 1889. It is 330 metres tall.", "wiki/eiffel.md"
)
LOUVRE = Chunk("The Louvre is the most visited art museum, home of the Mona Lisa.", "louvre.md")
QUESTION = "When was the Eiffel Tower built?"
ANSWER = "The Eiffel Tower was built from 1887 to 1889."


def grade(name: str, item: JudgeInput) -> Verdict:
    (judge,) = build_local_judges([name])
    verdict: Verdict = judge.grade(item)  # type: ignore[attr-defined]
    return verdict


def event(**fields: object) -> JudgeInput:
    base: dict[str, object] = {"question": QUESTION, "answer": ANSWER, "chunks": (LOUVRE, EIFFEL)}
    base.update(fields)
    return JudgeInput(**base)  # type: ignore[arg-type]


def test_the_catalogue_judges_are_opt_in_and_the_default_panel_is_unchanged() -> None:
    assert DEFAULT_JUDGES == ("groundedness", "safety", "relevance_to_query")
    for name in ("chunk_relevance", "context_sufficiency", "correctness", "document_recall"):
        assert "local" in judge_entry(name).backends


# ------------------------------------------------------------------ chunk_relevance


def test_one_relevant_chunk_makes_the_event_yes_with_the_chunk_ratings_and_precision() -> None:
    v = grade("chunk_relevance", event())
    assert v.rating == "yes"
    assert v.rationale is not None
    assert v.rationale.startswith("precision 1/2: [1] no, [2] yes.")
    assert v.score == 0.5  # the event's precision, counted for the window's mean


def test_no_relevant_chunk_makes_the_event_no() -> None:
    v = grade("chunk_relevance", event(chunks=(LOUVRE, Chunk("Opening hours: 9 to 18."))))
    assert v.rating == "no"
    assert v.rationale is not None and v.rationale.startswith("precision 0/2: [1] no, [2] no.")
    assert v.score == 0.0


def test_nothing_retrieved_is_no_relevant_chunk_not_an_error() -> None:
    v = grade("chunk_relevance", event(chunks=()))
    assert v.rating == "no"
    assert v.rationale == "nothing was retrieved, so no retrieved chunk is relevant"


def test_a_question_without_key_words_cannot_be_graded_offline() -> None:
    v = grade("chunk_relevance", event(question="What is it?"))
    assert (v.rating, v.error_cause) == ("error", "input")
    assert v.error_message is not None and "no key word" in v.error_message


def test_an_unrated_chunk_leaves_a_relevant_one_deciding_and_else_makes_an_error() -> None:
    failed = Verdict("chunk_relevance", "error", error_message="timed out", error_cause="timeout")
    yes = Verdict("chunk_relevance", "yes", "on topic", prompt_tokens=10, completion_tokens=2)
    no = Verdict("chunk_relevance", "no", "off topic", prompt_tokens=7, completion_tokens=3)
    decided = event_verdict("chunk_relevance", [failed, yes], 0.5)
    assert (decided.rating, decided.prompt_tokens, decided.completion_tokens) == ("yes", 10, 2)
    assert decided.rationale is not None and "[1] error, [2] yes" in decided.rationale
    assert decided.score == 1.0  # over the chunks that could be rated
    unknown = event_verdict("chunk_relevance", [no, failed], 0.5)
    assert (unknown.rating, unknown.error_cause) == ("error", "timeout")
    assert unknown.error_message is not None and "chunk [2]: timed out" in unknown.error_message


# ------------------------------------------------------------------ context_sufficiency


def test_context_holding_the_expected_answer_is_sufficient() -> None:
    v = grade("context_sufficiency", event(expected_response="It was built from 1887 to 1889."))
    assert v.rating == "yes", v.rationale


def test_context_lacking_a_number_of_the_expected_answer_is_insufficient_and_names_it() -> None:
    expected = "It is 330 metres tall and weighs 10,100 tonnes."
    v = grade("context_sufficiency", event(expected_response=expected))
    assert v.rating == "no"
    assert v.rationale is not None and "10,100" in v.rationale


def test_every_expected_fact_must_be_in_the_context() -> None:
    facts = ("built between 1887 and 1889", "designed by Gustave Eiffel's engineering company")
    v = grade("context_sufficiency", event(expected_facts=facts))
    assert v.rating == "no"
    assert v.rationale is not None and "Gustave" in v.rationale
    assert grade("context_sufficiency", event(expected_facts=facts[:1])).rating == "yes"


def test_without_an_expected_answer_the_question_says_what_the_context_must_hold() -> None:
    assert grade("context_sufficiency", event()).rating == "yes"
    v = grade("context_sufficiency", event(chunks=(LOUVRE,)))
    assert v.rating == "no"
    assert v.rationale is not None and v.rationale.startswith("No expected answer")


def test_nothing_retrieved_is_insufficient_context() -> None:
    v = grade("context_sufficiency", event(chunks=(), expected_response="1889"))
    assert (v.rating, v.rationale) == (
        "no",
        "nothing was retrieved, so the context cannot be sufficient",
    )


# ------------------------------------------------------------------ correctness


@pytest.mark.parametrize(
    ("answer", "rating"),
    [
        ("It was finished in 1889.", "yes"),
        ("Construction ended in 1887.", "no"),
        ("Paris is a lovely city.", "no"),
    ],
)
def test_the_answer_must_state_the_expected_answer(answer: str, rating: str) -> None:
    v = grade("correctness", event(answer=answer, expected_response="1889"))
    assert v.rating == rating, v.rationale


def test_an_expected_answer_in_other_words_passes_and_one_with_a_missing_word_fails() -> None:
    expected = "Gustave Eiffel's engineering company"
    ok = grade("correctness", event(answer="It was the engineering company of Gustave Eiffel.",
                                    expected_response=expected))
    assert ok.rating == "yes", ok.rationale
    bad = grade("correctness", event(answer="An architect from Lyon.", expected_response=expected))
    assert bad.rating == "no"
    assert bad.rationale is not None and "Gustave" in bad.rationale


def test_every_expected_fact_must_be_stated() -> None:
    facts = ("built by 1889", "330 metres tall")
    v = grade("correctness", event(answer=ANSWER, expected_facts=facts))
    assert v.rating == "no"
    assert v.rationale is not None and "330" in v.rationale
    stated = event(answer=ANSWER + " It is 330 m tall.", expected_facts=facts)
    assert grade("correctness", stated).rating == "yes"


def test_correctness_without_an_expected_answer_is_skipped_naming_the_fields() -> None:
    v = grade("correctness", event())
    assert (v.rating, v.missing, v.error_cause) == ("skipped", ("expected",), None)
    assert v.rationale == (
        "skipped: correctness needs expected_response or expected_facts; the event has none"
    )


@pytest.mark.parametrize("name", ["correctness", "context_sufficiency"])
def test_both_expected_response_and_expected_facts_is_an_input_error(name: str) -> None:
    v = grade(name, event(expected_response="1889", expected_facts=("1889",)))
    assert (v.rating, v.error_cause) == ("error", "input")
    assert v.error_message is not None and "allows one of them" in v.error_message


# ------------------------------------------------------------------ document_recall


def test_document_recall_is_yes_only_when_every_expected_document_was_retrieved() -> None:
    both = (Chunk("", "wiki/eiffel.md"), Chunk("", "wiki/paris.md"))
    v = grade("document_recall", event(expected_chunks=both))
    assert (v.rating, v.rationale) == (
        "no", "recall 1/2 = 0.50; not retrieved: 'wiki/paris.md'."
    )
    assert v.score == 0.5  # the recall, exported as the window's mean recall
    v = grade("document_recall", event(expected_chunks=both[:1]))
    assert (v.rating, v.rationale) == (
        "yes", "recall 1/1 = 1.00: every expected document was retrieved."
    )
    assert v.score == 1.0


def test_document_recall_of_an_event_with_nothing_retrieved_is_zero() -> None:
    v = grade("document_recall", event(chunks=(), expected_chunks=(Chunk("", "a.md"),)))
    assert (v.rating, v.rationale) == ("no", "recall 0/1 = 0.00: nothing was retrieved.")
    assert v.score == 0.0


def test_document_recall_cannot_match_chunks_without_doc_uri() -> None:
    item = event(chunks=(Chunk("text"),), expected_chunks=(Chunk("", "a.md"),))
    v = grade("document_recall", item)
    assert (v.rating, v.error_cause) == ("error", "input")
    assert v.error_message is not None and "doc_uri" in v.error_message


def test_document_recall_without_expected_documents_is_skipped() -> None:
    v = grade("document_recall", event())
    assert (v.rating, v.missing) == ("skipped", ("expected_chunks",))
    assert v.rationale == (
        "skipped: document_recall needs expected_retrieved_context with doc_uri; the event "
        "has none"
    )


# ------------------------------------------------------------------ measurement script


def test_the_correctness_measurement_counts_an_answer_matching_any_accepted_reference() -> None:
    module = _eval_script()
    rows = [
        {"question": "q", "response": "Bill Russell won 11.", "reference": ["Russell", "x"],
         "label_pass": True},
        {"question": "q", "response": "Michael Jordan.", "reference": ["Bill Russell"],
         "label_pass": False},
        {"question": "q", "response": "Robert Horry.", "reference": ["Bill Russell"],
         "label_pass": True},
    ]
    judged, baseline, _ = module.evaluate_correctness("tiny", rows)
    assert judged.startswith("| correctness · tiny | 3 | 75.0 % | 66.7 % |")
    assert baseline.startswith("| baseline: normalised containment · tiny | 3 | 75.0 % | 66.7 % |")


# ------------------------------------------------------------------ through `ragpulse run`


@pytest.mark.slow  # runs a Beam pipeline
def test_ragpulse_run_grades_the_ground_truth_of_each_event_with_the_opt_in_judges(
    tmp_path: Path,
) -> None:
    def line(i: int, answer: str, **truth: object) -> bytes:
        return orjson.dumps({
            "request_id": f"req-{i}", "timestamp": "2025-11-20T10:00:00Z",
            "request": QUESTION, "response": answer,
            "retrieved_context": [{"content": LOUVRE.content, "doc_uri": LOUVRE.doc_uri},
                                  {"content": EIFFEL.content, "doc_uri": EIFFEL.doc_uri}],
            **truth,
        })

    src = tmp_path / "events.jsonl"
    src.write_bytes(b"\n".join([
        line(1, ANSWER, expected_response="1889",
             expected_retrieved_context=[{"doc_uri": "wiki/eiffel.md"}]),
        line(2, "It was built in 1920.", expected_facts=["built between 1887 and 1889"],
             expected_retrieved_context=[{"doc_uri": "wiki/paris.md"}]),
        line(3, ANSWER),
    ]) + b"\n")
    out = tmp_path / "out"
    judges = "chunk_relevance,context_sufficiency,correctness,document_recall"
    argv = ["run", str(src), "--output", str(out), "--judge-backend", "local", "--judges", judges]
    assert main(argv) == 0
    rows = {r["request_id"]: r for r in map(orjson.loads, (out / "verdicts.jsonl").read_bytes()
                                            .splitlines())}

    def ratings(request_id: str) -> dict[str, str | None]:
        row = rows[request_id]
        return {j: row[f"response/llm_judged/{j}/rating"] for j in judges.split(",")}

    assert ratings("req-1") == {"chunk_relevance": "yes", "context_sufficiency": "yes",
                                "correctness": "yes", "document_recall": "yes"}
    assert ratings("req-2") == {"chunk_relevance": "yes", "context_sufficiency": "yes",
                                "correctness": "no", "document_recall": "no"}
    assert ratings("req-3") == {"chunk_relevance": "yes", "context_sufficiency": "yes",
                                "correctness": "skipped", "document_recall": "skipped"}
    assert rows["req-3"]["response/llm_judged/correctness/error_cause"] is None
    # The window's mean precision, with its count: each event has one relevant chunk of two.
    (window,) = [w for w in map(orjson.loads, (out / "windows.jsonl").read_bytes().splitlines())
                 if w["judge"] == "chunk_relevance"]
    assert (window["scored"], window["score_mean"]) == (3, 0.5)
    # The window's mean recall, with its count: req-1 found its document, req-2 did not.
    (window,) = [w for w in map(orjson.loads, (out / "windows.jsonl").read_bytes().splitlines())
                 if w["judge"] == "document_recall"]
    assert (window["scored"], window["score_mean"]) == (2, 0.5)
    samples = {(s.name, s.labels["judge"]): s.value
               for f in text_string_to_metric_families((out / "metrics.prom").read_text())
               for s in f.samples if "judge" in s.labels}
    assert samples[("ragpulse_judge_score_sum", "document_recall")] == 1.0
    assert samples[("ragpulse_judge_score_count", "document_recall")] == 2
