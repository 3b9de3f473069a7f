"""Claim-based scores after Ragas, on the LLM backend: `faithfulness` and `answer_correctness`.

For operators who want a graded signal rather than one yes/no: the judge model splits the
answer into short standalone claims and checks each, in a single call that returns the claims
and their verdicts as JSON (the json_schema reply format holds the model to that shape).

* faithfulness = the share of the answer's claims that the retrieved passages support (an
  answer making no factual claim, "I don't know", invents nothing: 1.0);
* answer_correctness = F1 over claims against the expected answer (`expected_response` or
  `expected_facts`): TP are the answer's claims the expected answer supports, FP the answer's
  other claims, FN the expected answer's claims the answer lacks; F1 = TP / (TP + (FP + FN) / 2).
  With `--judge-embeddings-model`, blended as Ragas does: 0.75 F1 + 0.25 the cosine similarity
  of the two texts' embeddings from the endpoint's /embeddings.

The rating is "yes" when the score is at least `--judge-score-threshold`; the score and the
claims that lowered it are in the rationale ("faithfulness 0.67: 2 of 3 claims supported; not
supported: ..."). The calls go through the shared `OpenAIJudgeEndpoint` (retry, breaker,
quotas, deadline, key scrubbing) and the prompts fence untrusted text like every LLM judge
(`judges.llm.judge`). A reply that is not the claims JSON is `error` with cause `unparsable`, never
a score. The prompts are versioned here (PROMPT_VERSION), not in judges/prompts/: their reply is
not the verdict shape those files describe, so --judge-prompts does not replace them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict

from ragpulse.judges.base import InputName, JudgeInput, Verdict
from ragpulse.judges.endpoint.client import EndpointFailure, OpenAIJudgeEndpoint
from ragpulse.judges.llm.fencing import new_nonce
from ragpulse.judges.llm.judge import (
    YES_OR_NO,
    BinaryRating,
    ReplyRating,
    ReplyText,
    UnparsableReply,
    fence_rules,
    fenced_inputs,
    object_schema,
    reply_body,
    reply_verdict,
    settings_version,
    strict_schema,
    validate_reply,
    with_prompt_cut,
)
from ragpulse.judges.registry import DEFAULT_SCORE_THRESHOLD, JudgeEntry, judge_entry

PROMPT_VERSION = 1
# Ragas' answer_correctness weights: claim F1, then semantic similarity.
SIMILARITY_WEIGHT = 0.25

# -- replies (a boundary: validated with pydantic) ----------------------------------------------


class ClaimVerdict(BaseModel):
    """One claim and whether the evidence supports it."""

    model_config = ConfigDict(frozen=True)

    claim: ReplyText
    verdict: ReplyRating


class FaithfulnessReply(BaseModel):
    """The answer's claims, each checked against the retrieved passages."""

    model_config = ConfigDict(frozen=True)

    claims: tuple[ClaimVerdict, ...]


class CorrectnessReply(BaseModel):
    """The answer's claims checked against the expected answer, and the other way round."""

    model_config = ConfigDict(frozen=True)

    answer_claims: tuple[ClaimVerdict, ...]
    expected_claims: tuple[ClaimVerdict, ...]


def _claims_schema(name: str, lists: Sequence[str]) -> dict[str, Any]:
    """OpenAI's json_schema (strict) for an object of claim lists."""
    claim = object_schema({"claim": {"type": "string"}, "verdict": YES_OR_NO})
    return strict_schema(name, {key: {"type": "array", "items": claim} for key in lists})


_Reply = TypeVar("_Reply", bound=BaseModel)


def parse_claims(text: str | None, model: type[_Reply]) -> _Reply:
    """The claims JSON of a reply (bare or in a code block); `UnparsableReply` says why not."""
    try:
        body = reply_body(text)
    except UnparsableReply as exc:
        raise UnparsableReply(f"the reply is not the claims JSON: {exc.reason}") from exc
    if isinstance(body, str):
        raise UnparsableReply("the reply is not the claims JSON (no JSON object)")
    return validate_reply(model, body)


# -- scores (pure) ------------------------------------------------------------------------------


def faithfulness_score(reply: FaithfulnessReply) -> float:
    """The share of claims supported; 1.0 when the answer makes no claim."""
    if not reply.claims:
        return 1.0
    return sum(c.verdict == "yes" for c in reply.claims) / len(reply.claims)


def claim_f1(reply: CorrectnessReply) -> float:
    """Ragas' F1 over claims: TP / (TP + (FP + FN) / 2); UnparsableReply when both lists are
    empty (the model found no claim in either text, which says nothing about correctness)."""
    tp = sum(c.verdict == "yes" for c in reply.answer_claims)
    fp = len(reply.answer_claims) - tp
    fn = sum(c.verdict == "no" for c in reply.expected_claims)
    if tp + fp + fn == 0:
        if reply.expected_claims:
            return 1.0  # every expected claim stated and no claim besides: only the TP lists
        raise UnparsableReply("the reply lists no claim of the answer or the expected answer")
    return tp / (tp + (fp + fn) / 2)


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors, clipped to 0..1 (0 for a zero vector)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return min(1.0, max(0.0, dot / norm)) if norm else 0.0


def _quoted(claims: Sequence[ClaimVerdict], limit: int = 3) -> str:
    shown = "; ".join(repr(c.claim[:100]) for c in claims[:limit])
    more = f" and {len(claims) - limit} more" if len(claims) > limit else ""
    return shown + more


# -- judges -------------------------------------------------------------------------------------

_CLAIMS_RULES = (
    "A claim is one short, self-contained statement of fact, with its subject named (no "
    "pronouns). Greetings, restating the question and saying \"I don't know\" are not claims."
)


class ClaimScoreJudge:
    """Base of the claim-score judges: one call, a claims JSON reply, a 0..1 score, a rating.

    Subclasses set the prompt (`inputs`, `instructions`, the reply `schema` and `reply` model)
    and `score_of`.
    """

    name: ClassVar[str]
    inputs: ClassVar[tuple[InputName, ...]]
    instructions: ClassVar[str]
    example: ClassVar[str]
    reply: ClassVar[type[BaseModel]]
    schema: ClassVar[dict[str, Any]]

    def __init__(
        self,
        endpoint: OpenAIJudgeEndpoint,
        redact: Callable[[JudgeInput], JudgeInput] | None = None,
        *,
        threshold: float = DEFAULT_SCORE_THRESHOLD,
        embeddings_model: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.redact = redact
        self.threshold = threshold
        self.embeddings_model = embeddings_model
        self.entry: JudgeEntry = judge_entry(self.name)
        self._system = (
            f"{self.instructions}\n\n{fence_rules(self.inputs)}\n\n"
            f"Reply with only a JSON object of this shape:\n{self.example}"
        )
        self.version = settings_version(
            PROMPT_VERSION,
            self._system,
            endpoint,
            redact is not None,
            threshold,
            embeddings_model,
        )

    async def aclose(self) -> None:
        """Close the shared endpoint's client on this loop (a no-op when already closed)."""
        await self.endpoint.aclose()

    def messages(self, item: JudgeInput, nonce: str) -> list[dict[str, str]]:
        """The chat messages for one (already redacted) event, fenced with `nonce`."""
        return [
            {"role": "system", "content": self._system},
            {"role": "user", "content": f"{fenced_inputs(self.inputs, item, nonce)}\n"
             "List the claims and their verdicts."},
        ]

    async def judge(self, item: JudgeInput) -> Verdict:
        """Score one event; failures are `error` with a cause, never a score."""
        missing = self.entry.verdict_if_missing(item)
        if missing is not None:
            return missing
        if not item.answer.strip():
            return Verdict(
                self.name,
                "error",
                error_message="the answer is empty; it has no claim to score",
                error_cause="input",
            )
        if self.redact is not None:
            item = self.redact(item)
        outcome = await self.endpoint.complete(
            self.name, self.messages(item, new_nonce()), self.schema
        )
        scored: list[tuple[float, str]] = []

        def read(content: str | None) -> tuple[BinaryRating, str, float]:
            scored.append(self.score_of(parse_claims(content, self.reply)))
            return self._rated(*scored[0])

        verdict = reply_verdict(self.name, outcome, self.endpoint.max_tokens, read)
        if verdict.rating != "error" and self.embeddings_model is not None:
            verdict = await self._blend(item, verdict, *scored[0])
        return with_prompt_cut(verdict, self.inputs, item)

    def _rated(self, score: float, why: str) -> tuple[BinaryRating, str, float]:
        """The rating at the threshold, the rationale, and the score itself (counted for the
        window's mean: ragpulse_judge_score)."""
        rating: BinaryRating = "yes" if score >= self.threshold else "no"
        return rating, f"{self.name} {score:.2f}: {why}", score

    def score_of(self, reply: Any) -> tuple[float, str]:
        """The score of a validated reply and a sentence on how it was reached."""
        raise NotImplementedError

    async def _blend(self, item: JudgeInput, verdict: Verdict, score: float, why: str) -> Verdict:
        """The verdict with the embeddings' similarity blended in (only answer_correctness)."""
        return verdict


class FaithfulnessJudge(ClaimScoreJudge):
    """Ragas faithfulness: the share of the answer's claims the retrieved passages support."""

    name = "faithfulness"
    inputs = ("question", "chunks", "answer")
    instructions = (
        "You are an impartial judge checking whether one answer of a retrieval-augmented "
        "chatbot is faithful to the passages its retriever returned.\n"
        "Step 1: split the answer into its factual claims, in the order the answer makes "
        f"them. {_CLAIMS_RULES}\n"
        'Step 2: for each claim, the verdict is "yes" when the passages state it or it follows '
        'directly from them, and "no" when it is missing from the passages or contradicts them, '
        "even if it is true in the real world."
    )
    example = (
        '{"claims": [{"claim": "Deleted files stay in the trash for 30 days.", "verdict": '
        '"yes"}, {"claim": "Administrators can restore deleted files.", "verdict": "no"}]}\n'
        'An answer without any claim: {"claims": []}'
    )
    reply = FaithfulnessReply
    schema = _claims_schema("claim_verdicts", ["claims"])

    def score_of(self, reply: FaithfulnessReply) -> tuple[float, str]:
        claims = reply.claims
        if not claims:
            return 1.0, "the answer makes no factual claim"
        unsupported = [c for c in claims if c.verdict == "no"]
        why = f"{len(claims) - len(unsupported)} of {len(claims)} claims supported"
        if unsupported:
            why += f"; not supported: {_quoted(unsupported)}"
        return faithfulness_score(reply), why


class AnswerCorrectnessJudge(ClaimScoreJudge):
    """Ragas answer_correctness: F1 over claims against the expected answer, optionally
    blended with the embeddings' cosine similarity."""

    name = "answer_correctness"
    inputs = ("question", "expected", "answer")
    instructions = (
        "You are an impartial judge comparing one answer of a retrieval-augmented chatbot with "
        "the expected answer.\n"
        f"Step 1: split the answer into its factual claims. {_CLAIMS_RULES} For each, the "
        'verdict is "yes" when the expected answer states or directly implies it, else "no".\n'
        "Step 2: split the expected answer into its factual claims (each listed fact is one). "
        'For each, the verdict is "yes" when the answer states it, in any wording, else "no".'
    )
    example = (
        '{"answer_claims": [{"claim": "Deleted files stay in the trash for 90 days.", '
        '"verdict": "no"}], "expected_claims": [{"claim": "Deleted files stay in the trash for '
        '30 days.", "verdict": "no"}]}'
    )
    reply = CorrectnessReply
    schema = _claims_schema("claim_comparison", ["answer_claims", "expected_claims"])

    def score_of(self, reply: CorrectnessReply) -> tuple[float, str]:
        f1 = claim_f1(reply)
        tp = sum(c.verdict == "yes" for c in reply.answer_claims)
        extra = [c for c in reply.answer_claims if c.verdict == "no"]
        missed = [c for c in reply.expected_claims if c.verdict == "no"]
        why = f"claim F1 {f1:.2f} ({tp} matching, {len(extra)} not expected, {len(missed)} missed)"
        if missed:
            why += f"; missed: {_quoted(missed)}"
        if extra:
            why += f"; not expected: {_quoted(extra)}"
        return f1, why

    async def _blend(self, item: JudgeInput, verdict: Verdict, score: float, why: str) -> Verdict:
        if self.embeddings_model is None:
            return verdict
        expected = "\n".join(item.facts) if item.facts else item.expected_response or ""
        started = time.perf_counter()
        texts = [item.answer, expected]
        outcome = await self.endpoint.embed(self.name, texts, self.embeddings_model)
        if isinstance(outcome, EndpointFailure):
            return Verdict(
                self.name,
                "error",
                error_message=f"embeddings: {outcome.message}",
                error_cause=outcome.cause,
                latency_seconds=verdict.latency_seconds + outcome.latency_seconds,
                prompt_tokens=verdict.prompt_tokens,
                completion_tokens=verdict.completion_tokens,
                cached_prompt_tokens=verdict.cached_prompt_tokens,
            )
        similarity = cosine(*outcome.vectors)
        blended = (1 - SIMILARITY_WEIGHT) * score + SIMILARITY_WEIGHT * similarity
        rating, rationale, _ = self._rated(
            blended, f"{why}; embedding similarity {similarity:.2f}"
        )
        return Verdict(
            self.name,
            rating,
            rationale,
            score=blended,
            latency_seconds=verdict.latency_seconds + time.perf_counter() - started,
            prompt_tokens=verdict.prompt_tokens + outcome.prompt_tokens,
            completion_tokens=verdict.completion_tokens,
            cached_prompt_tokens=verdict.cached_prompt_tokens,
        )
