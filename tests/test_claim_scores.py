"""The claim-score judges after Ragas (judges.llm.claim_scores: faithfulness, answer_correctness)
against the HTTP stand-in (tests/fake_openai): one call returns the claims and their verdicts,
the score is computed from them, the rating is yes at the threshold; malformed claim JSON, cut
off replies and embedding failures become errors with their cause, never a score."""

from __future__ import annotations

import argparse
import json

import pytest
from fake_openai import MARKER, FakeOpenAI, Fault, fake_openai_fixture  # noqa: F401
from test_llm_judges import endpoint_for

from ragpulse.judges.base import Chunk, JudgeInput, Verdict
from ragpulse.judges.llm.build import build_llm_judges
from ragpulse.judges.llm.claim_scores import ClaimVerdict, CorrectnessReply, claim_f1, cosine
from ragpulse.judges.panel import JudgePanel
from ragpulse.judges.redaction import TextPolicy
from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.settings.command_flags import add_judge_arguments, judge_settings

CONTEXT = (Chunk("Deleted files stay in the trash for 30 days, then they are removed."),)
QUESTION = "How long are deleted files kept?"
# Three claims, the last one not in the context (the stand-in rates a claim with MARKER "no").
THREE_CLAIMS = (
    "Deleted files stay in the trash for 30 days. Then they are removed. "
    f"Administrators can restore them {MARKER}."
)


def judge_one(
    server: FakeOpenAI, item: JudgeInput, name: str, **options: object
) -> Verdict:
    endpoint = endpoint_for(server, max_retries=options.pop("max_retries", 0))
    panel = JudgePanel(build_llm_judges([name], endpoint, **options))  # type: ignore[arg-type]
    try:
        return panel.judge_batch([item])[0][0]
    finally:
        panel.close()


def chats(server: FakeOpenAI) -> list[dict[str, object]]:
    return [r.body for r in server.requests if r.body and r.path.endswith("/chat/completions")]


# -- faithfulness -------------------------------------------------------------------------------


def test_faithfulness_is_the_share_of_supported_claims_from_one_call(
    fake_openai: FakeOpenAI,
) -> None:
    verdict = judge_one(fake_openai, JudgeInput(QUESTION, THREE_CLAIMS, CONTEXT), "faithfulness")
    assert verdict.rating == "no"  # 2/3 is below the default threshold 0.7
    assert verdict.score == pytest.approx(2 / 3)  # counted for the window's mean
    assert verdict.rationale is not None
    assert verdict.rationale.startswith(
        "faithfulness 0.67: 2 of 3 claims supported; not supported: "
    )
    assert "Administrators can restore them" in verdict.rationale
    (body,) = chats(fake_openai)
    # One request, asking for the claims schema, with question, context and answer fenced.
    assert body["response_format"]["json_schema"]["name"] == "claim_verdicts"  # type: ignore[index]
    user = body["messages"][-1]["content"]  # type: ignore[index]
    assert "<question-" in user and "<chunks-" in user and "<answer-" in user
    served = fake_openai.requests[0]
    assert (verdict.prompt_tokens, verdict.completion_tokens) == (
        served.prompt_tokens, served.completion_tokens,
    )
    assert verdict.prompt_tokens > 0


def test_the_score_threshold_decides_the_rating(fake_openai: FakeOpenAI) -> None:
    item = JudgeInput(QUESTION, THREE_CLAIMS, CONTEXT)
    assert judge_one(fake_openai, item, "faithfulness", score_threshold=0.6).rating == "yes"
    assert judge_one(fake_openai, item, "faithfulness", score_threshold=0.7).rating == "no"


def test_an_answer_whose_claims_are_all_supported_scores_one(fake_openai: FakeOpenAI) -> None:
    item = JudgeInput(QUESTION, "Deleted files stay in the trash for 30 days.", CONTEXT)
    verdict = judge_one(fake_openai, item, "faithfulness")
    assert (verdict.rating, verdict.rationale) == (
        "yes", "faithfulness 1.00: 1 of 1 claims supported",
    )


def test_an_answer_without_claims_is_faithful(fake_openai: FakeOpenAI) -> None:
    fake_openai.push_faults(Fault.reply('{"claims": []}'))
    verdict = judge_one(fake_openai, JudgeInput(QUESTION, "I don't know.", CONTEXT), "faithfulness")
    assert (verdict.rating, verdict.rationale) == (
        "yes", "faithfulness 1.00: the answer makes no factual claim",
    )


@pytest.mark.parametrize(
    ("reply", "reason"),
    [
        pytest.param('{"claims": [{"claim": "Files stay 30 days."', "not the claims JSON",
                     id="cut-off JSON"),
        pytest.param('{"claims": [{"claim": "Files stay 30 days.", "verdict": "maybe"}]}',
                     "claims.0.verdict", id="a verdict outside yes/no"),
        pytest.param('{"rationale": "fine", "rating": "yes"}', "claims: Field required",
                     id="a yes/no verdict instead of claims"),
        pytest.param("All claims are supported.", "not the claims JSON", id="prose"),
    ],
)
def test_malformed_claim_json_is_an_unparsable_error_that_still_counts_its_tokens(
    fake_openai: FakeOpenAI, reply: str, reason: str
) -> None:
    fake_openai.push_faults(Fault.reply(reply))
    verdict = judge_one(fake_openai, JudgeInput(QUESTION, THREE_CLAIMS, CONTEXT), "faithfulness")
    assert (verdict.rating, verdict.error_cause) == ("error", "unparsable")
    assert verdict.error_message is not None and reason in verdict.error_message
    assert verdict.prompt_tokens > 0


def test_a_claims_reply_cut_off_at_max_tokens_is_truncated(fake_openai: FakeOpenAI) -> None:
    fake_openai.push_faults(Fault.reply('{"claims": []}', finish_reason="length"))
    verdict = judge_one(fake_openai, JudgeInput(QUESTION, THREE_CLAIMS, CONTEXT), "faithfulness")
    assert (verdict.rating, verdict.error_cause) == ("error", "truncated")


def test_a_server_error_goes_through_the_shared_retry_layer(fake_openai: FakeOpenAI) -> None:
    fake_openai.push_faults(Fault.http(503))
    item = JudgeInput(QUESTION, THREE_CLAIMS, CONTEXT)
    verdict = judge_one(fake_openai, item, "faithfulness", max_retries=1)
    assert verdict.rationale is not None and verdict.rationale.startswith("faithfulness 0.67")
    assert [r.outcome for r in fake_openai.requests] == ["status 503", "ok"]


def test_faithfulness_without_context_is_no_and_without_answer_an_input_error(
    fake_openai: FakeOpenAI,
) -> None:
    no_context = judge_one(fake_openai, JudgeInput(QUESTION, THREE_CLAIMS), "faithfulness")
    assert (no_context.rating, no_context.rationale) == (
        "no", "no retrieved context to support the answer",
    )
    empty = judge_one(fake_openai, JudgeInput(QUESTION, " ", CONTEXT), "faithfulness")
    assert (empty.rating, empty.error_cause) == ("error", "input")
    assert fake_openai.requests == []


@pytest.mark.parametrize("reply_format", ["json_object", "text"])
def test_claims_are_read_with_the_other_reply_formats(
    fake_openai: FakeOpenAI, reply_format: str
) -> None:
    endpoint = endpoint_for(fake_openai, max_retries=0, reply_format=reply_format)
    panel = JudgePanel(build_llm_judges(["faithfulness"], endpoint))
    try:
        (verdict,) = panel.judge_batch([JudgeInput(QUESTION, THREE_CLAIMS, CONTEXT)])[0]
    finally:
        panel.close()
    assert verdict.rationale is not None and verdict.rationale.startswith("faithfulness 0.67")
    (body,) = chats(fake_openai)
    assert body.get("response_format", {}).get("type", "text") == reply_format  # type: ignore[attr-defined]


def test_with_redaction_no_email_of_the_event_reaches_the_claims_prompt(
    fake_openai: FakeOpenAI,
) -> None:
    redact = TextPolicy(redact_pii="on").redactor().judge_input
    item = JudgeInput(QUESTION, "Write to alice@example.com. Files stay 30 days.", CONTEXT)
    verdict = judge_one(fake_openai, item, "faithfulness", redact=redact)
    assert verdict.rating == "yes"
    (body,) = chats(fake_openai)
    user = body["messages"][-1]["content"]  # type: ignore[index]
    assert "alice@example.com" not in user and "[EMAIL]" in user


# -- answer_correctness -------------------------------------------------------------------------


def test_answer_correctness_is_claim_f1_against_the_expected_answer(
    fake_openai: FakeOpenAI,
) -> None:
    right = JudgeInput(QUESTION, "Files are kept for 30 days.", expected_response="30 days.")
    verdict = judge_one(fake_openai, right, "answer_correctness")
    assert verdict.rating == "yes"
    assert verdict.rationale == (
        "answer_correctness 1.00: claim F1 1.00 (1 matching, 0 not expected, 0 missed)"
    )
    wrong = JudgeInput(
        QUESTION, f"Files are kept for 90 days {MARKER}.",
        expected_facts=("Files are kept for 30 days", "Then they are removed"),
    )
    verdict = judge_one(fake_openai, wrong, "answer_correctness")
    assert verdict.rating == "no"
    assert verdict.rationale is not None
    assert verdict.rationale.startswith(
        "answer_correctness 0.00: claim F1 0.00 (0 matching, 1 not expected, 2 missed); "
        "missed: 'Files are kept for 30 days'; 'Then they are removed'"
    )
    body = chats(fake_openai)[-1]
    assert body["response_format"]["json_schema"]["name"] == "claim_comparison"  # type: ignore[index]
    assert "<expected-" in body["messages"][-1]["content"]  # type: ignore[index]


def test_claim_f1_follows_ragas() -> None:
    def v(verdict: str) -> ClaimVerdict:
        return ClaimVerdict(claim="c", verdict=verdict)

    # Ragas' example: TP 1 (born 1879), FP 1 (born in Spain), FN 1 (born in Germany): 0.5.
    reply = CorrectnessReply(answer_claims=(v("yes"), v("no")), expected_claims=(v("yes"), v("no")))
    assert claim_f1(reply) == pytest.approx(0.5)
    assert cosine([1.0, 0.0], [1.0, 0.0]) == pytest.approx(1.0)
    assert cosine([1.0, 0.0], [0.0, 0.0]) == 0.0


def test_answer_correctness_without_an_expected_answer_is_skipped_without_a_call(
    fake_openai: FakeOpenAI,
) -> None:
    verdict = judge_one(fake_openai, JudgeInput(QUESTION, "30 days."), "answer_correctness")
    assert (verdict.rating, verdict.error_cause) == ("skipped", None)
    assert fake_openai.requests == []


def test_with_an_embeddings_model_the_f1_is_blended_with_the_embeddings_similarity(
    fake_openai: FakeOpenAI,
) -> None:
    item = JudgeInput(QUESTION, "Files are kept for 30 days.", expected_response="30 days.")
    verdict = judge_one(fake_openai, item, "answer_correctness", embeddings_model="embed-small")
    (embedded,) = [r for r in fake_openai.requests if r.path.endswith("/embeddings")]
    assert embedded.body == {
        "model": "embed-small", "input": [item.answer, "30 days."], "encoding_format": "float",
    }
    assert verdict.rationale is not None
    similarity = float(verdict.rationale.rsplit("embedding similarity ", 1)[1])
    assert 0 < similarity < 1
    assert verdict.rationale.startswith(f"answer_correctness {0.75 + 0.25 * similarity:.2f}: ")
    chat = next(r for r in fake_openai.requests if r.path.endswith("/chat/completions"))
    assert verdict.prompt_tokens == chat.prompt_tokens + embedded.prompt_tokens


@pytest.mark.parametrize(
    ("fault", "cause"),
    [(Fault.http(500), "server_error"), (Fault.malformed(), "malformed")],
)
def test_a_failed_embeddings_call_is_an_error_with_its_cause_not_a_score(
    fake_openai: FakeOpenAI, fault: Fault, cause: str
) -> None:
    item = JudgeInput(QUESTION, "Files are kept for 30 days.", expected_response="30 days.")
    panel_options = {"embeddings_model": "embed-small"}
    # The chat call is served first; the fault then meets the embeddings call.
    fake_openai.push_faults(Fault.reply(json.dumps({
        "answer_claims": [{"claim": "Files are kept for 30 days.", "verdict": "yes"}],
        "expected_claims": [{"claim": "30 days.", "verdict": "yes"}],
    })), fault)
    verdict = judge_one(fake_openai, item, "answer_correctness", **panel_options)
    assert (verdict.rating, verdict.error_cause) == ("error", cause)
    assert verdict.error_message is not None and verdict.error_message.startswith("embeddings: ")
    assert verdict.prompt_tokens > 0  # the chat call's tokens are still counted


# -- settings -----------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_flags_reach_the_judges_built_from_the_settings(fake_openai: FakeOpenAI) -> None:
    args = parse(
        "--judges", "faithfulness,answer_correctness", "--judge-base-url", fake_openai.base_url,
        "--judge-score-threshold", "0.6", "--judge-embeddings-model", "embed-small",
    )
    panel = judge_settings(args, env={}).spec().build()
    item = JudgeInput(QUESTION, THREE_CLAIMS, CONTEXT, expected_response=THREE_CLAIMS)
    try:
        faithful, correct = panel.judge_batch([item])[0]
    finally:
        panel.close()
    assert faithful.rating == "yes"  # 0.67 passes at 0.6
    assert correct.rationale is not None and "embedding similarity" in correct.rationale


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("--judges", "faithfulness", "--judge-score-threshold", "1.5"),
         "--judge-score-threshold"),
        (("--judges", "faithfulness", "--judge-embeddings-model", "embed-small"),
         "--judge-embeddings-model: only the answer_correctness judge reads it"),
        (("--judges", "faithfulness", "--judge-backend", "local"),
         "judge(s) faithfulness have no local implementation"),
    ],
)
def test_bad_score_flags_are_one_line_settings_errors(argv: tuple[str, ...], says: str) -> None:
    args = parse("--judge-base-url", "http://127.0.0.1:9/v1", *argv)
    with pytest.raises(SettingsError) as caught:
        judge_settings(args, env={})
    assert says in str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_claim_score_judge_counts_what_the_prompt_cap_cut_and_still_scores(
    fake_openai: FakeOpenAI,
) -> None:
    """As a single judge's call does (ragpulse_judge_prompt_chars_cut_total): before, the
    passages were cut at MAX_INPUT_CHARS and 0 was counted."""
    from ragpulse.judges.llm.judge import MAX_INPUT_CHARS

    passage = Chunk(CONTEXT[0].content + " " + "z" * 20_000)
    verdict = judge_one(fake_openai, JudgeInput(QUESTION, THREE_CLAIMS, (passage,)),
                        "faithfulness")
    assert verdict.prompt_chars_cut >= len(passage.content) - MAX_INPUT_CHARS > 0
    assert (verdict.rating, verdict.score) == ("no", pytest.approx(2 / 3))
    assert f"[ragpulse cut {verdict.prompt_chars_cut} characters" in (verdict.rationale or "")
