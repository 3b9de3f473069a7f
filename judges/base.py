"""What a judge reads, what it returns, and the protocol every judge follows.

The pipeline turns an inference-log event into a `JudgeInput`; each judge turns a `JudgeInput`
into a `Verdict`. `error` is a rating of its own ("could not grade"), never a failing grade:
it is left out of pass ratios and counted by cause so a broken judge is visible.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import time
from collections.abc import Sequence
from typing import Literal, Protocol, get_args, runtime_checkable

Rating = Literal["yes", "no", "error", "skipped"]
# The ratings a verdict counter and a window count. `skipped` is not one of them: a judge that
# is not meant to run on an event (it lacks the judge's required field, e.g. correctness
# without an expected answer) neither passes nor fails nor errs; it is counted apart
# (ragpulse_judge_skipped_total) and stays out of every window and ratio.
RATINGS: tuple[Rating, ...] = ("yes", "no", "error")

# Why a verdict is `error`; a closed set so it can label a metric (ragpulse_judge_errors_total).
#   timeout        the endpoint did not answer within --judge-timeout
#   rate_limited   HTTP 429, or a wait (Retry-After, --judge-rpm/--judge-tpm) past the deadline
#   server_error   HTTP 5xx
#   client_error   any other HTTP 4xx (the request is wrong: key, model, response_format ...)
#   connection     the endpoint could not be reached
#   malformed      the endpoint's reply is not a chat completion (HTML, wrong shape, not JSON)
#   unparsable     a well-formed reply whose text holds no yes/no verdict
#   truncated      the reply was cut off at --judge-max-tokens (finish_reason "length")
#   circuit_open   the endpoint's circuit breaker is open: not called, failed fast
#   deadline       the batch's --judge-batch-deadline passed before the call finished
#   internal       the judge itself raised (a bug): the panel kept the batch going
#   input          the event holds what the judge needs in a form it cannot grade (both
#                  expected_response and expected_facts, an empty answer ...); an event that
#                  lacks a required field altogether is `skipped`, not an error
ErrorCause = Literal[
    "timeout",
    "rate_limited",
    "server_error",
    "client_error",
    "connection",
    "malformed",
    "unparsable",
    "truncated",
    "circuit_open",
    "deadline",
    "internal",
    "input",
]
ERROR_CAUSES: tuple[ErrorCause, ...] = get_args(ErrorCause)


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """One retrieved passage, as the chatbot's retriever returned it."""

    content: str
    doc_uri: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    """One earlier message of the conversation (`role` is user, assistant or system)."""

    role: str
    content: str


@dataclasses.dataclass(frozen=True, slots=True)
class Guideline:
    """One named set of rules the answer must follow (the event's `guidelines`: a plain list
    is one set named "guidelines")."""

    name: str
    rules: tuple[str, ...]


# The name of the one set a plain list of guidelines forms: graded as one verdict.
LIST_GUIDELINES = "guidelines"
# A guideline's name labels its verdicts' series (`guideline`), so it is short and plain.
GUIDELINE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def global_guidelines(flags: Sequence[str]) -> tuple[Guideline, ...]:
    """Guidelines for every event from `--guideline NAME=RULE` values, grouped by name in the
    order first given; ValueError (one line) for a value without a name or a rule."""
    grouped: dict[str, list[str]] = {}
    for flag in flags:
        name, sep, rule = flag.partition("=")
        if not sep or not GUIDELINE_NAME.fullmatch(name.strip()) or not rule.strip():
            raise ValueError(
                f"{flag!r} is not NAME=RULE (NAME of 1-64 letters, digits, _ . -), e.g. "
                "'english=The response must be in English'"
            )
        grouped.setdefault(name.strip(), []).append(rule.strip())
    return tuple(Guideline(name, tuple(rules)) for name, rules in grouped.items())


# The parts of a `JudgeInput`, by name: what a judge requires (judges.registry) and what an LLM
# judge's prompt shows (judges.llm.judge). The ground truth of the input schema: "expected" is the
# expected answer (`expected_response` or `expected_facts`), "expected_chunks" the
# `expected_retrieved_context`, "guidelines" the event's guidelines. "transcript" is a whole
# conversation (a session judge's input, judges.sessions): every turn, held in `history`.
InputName = Literal[
    "history", "question", "chunks", "answer", "expected", "expected_chunks", "guidelines",
    "tool_calls", "transcript",
]

ToolStatus = Literal["ok", "error"]


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool the chatbot's agent called while answering, in the order it called them: the
    event's `tool_calls`, or the tool spans of its trace (pipeline.formats.events,
    pipeline.formats.otlp).

    `arguments` and `result` are text as the agent and the tool gave them (objects as JSON
    text), cut at the event's size bound; `status` "error" means the call failed, `error` then
    says how when the source did. `description` is what the tool does (its description and
    parameter schema, when the source gives them); `span_id` names the tool's span.
    """

    name: str
    arguments: str | None = None
    result: str | None = None
    status: ToolStatus = "ok"
    error: str | None = None
    span_id: str | None = None
    description: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class JudgeInput:
    """The part of an inference-log event that judges look at.

    The four fields after `history` are the optional ground truth of the Agent Evaluation input
    schema, present in evaluation sets and golden canaries, rarely in production traffic.
    """

    question: str
    answer: str
    chunks: tuple[Chunk, ...] = ()
    history: tuple[Turn, ...] = ()
    expected_response: str | None = None
    expected_facts: tuple[str, ...] = ()
    expected_chunks: tuple[Chunk, ...] = ()  # `content` may be empty: only doc_uri is required
    guidelines: tuple[Guideline, ...] = ()
    # The agent's tool calls while answering (empty for a chatbot that called none).
    tool_calls: tuple[ToolCall, ...] = ()

    def lacks(self, names: Sequence[InputName]) -> list[InputName]:
        """Those of `names` this event does not have: blank text, no chunk with text, no turns,
        no expected answer, no expected doc_uri, no guideline rule, no tool call."""
        return [name for name in names if not self._has(name)]

    @property
    def facts(self) -> tuple[str, ...]:
        """The expected facts that are not blank."""
        return tuple(f for f in self.expected_facts if f.strip())

    @property
    def both_expected(self) -> bool:
        """Whether the event gives both `expected_response` and `expected_facts`, which the
        input schema forbids (a judge reading the expected answer rates it `error`)."""
        return bool(self.expected_response and self.expected_response.strip() and self.facts)

    def _has(self, name: InputName) -> bool:
        if name == "chunks":
            return any(c.content and not c.content.isspace() for c in self.chunks)
        if name in ("history", "transcript"):
            return bool(self.history)
        if name == "expected":
            return bool((self.expected_response or "").strip() or self.facts)
        if name == "expected_chunks":
            return any(c.doc_uri and c.doc_uri.strip() for c in self.expected_chunks)
        if name == "guidelines":
            return any(rule.strip() for g in self.guidelines for rule in g.rules)
        if name == "tool_calls":
            return bool(self.tool_calls)
        return bool((self.question if name == "question" else self.answer).strip())


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """One judge's grade of one event, in Agent Evaluation terms (rating, rationale, error)."""

    judge: str
    rating: Rating
    rationale: str | None = None
    error_message: str | None = None
    error_cause: ErrorCause | None = None
    latency_seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of `prompt_tokens`, those the provider read from its prompt cache (billed for less).
    cached_prompt_tokens: int = 0
    # Given earlier to an identical input and taken from the panel's verdict cache
    # (judges.verdict_cache): no call was made, no tokens spent, latency 0.
    cached: bool = False
    # Of a `skipped` verdict: the required inputs the event lacks (JudgeInput.lacks).
    missing: tuple[InputName, ...] = ()
    # Of a judge on a graded scale (0-3, 1-5, a composite): the score; `rating` is then "yes"
    # when it is at or above the judge's pass score. None on the binary scale.
    score: float | None = None
    # Computed from other verdicts of the event (a composite, judges.composite): no call.
    derived: bool = False
    # Of an ensemble (judges.llm.ensemble): each member's rating, whose majority is `rating`.
    votes: tuple[Rating, ...] = ()
    # Of a judge that grades each named guideline on its own (guideline_adherence): one verdict
    # per name, judged "<judge>/<name>"; the pipeline counts and stores these in its place.
    parts: tuple[Verdict, ...] = ()
    # Of the judge cascade's LLM verdict (pipeline.costs.cascade): the local tier's rating
    # when the two tiers disagreed (both yes or no); None when they agreed or one did not run.
    # The review queue queues such verdicts for a person to settle (docs/review.md).
    other_tier_rating: Rating | None = None

    # Characters of the event's inputs left out of the judge's prompt (judges.llm.judge caps
    # each input at MAX_INPUT_CHARS); the rationale says so too.
    prompt_chars_cut: int = 0

    def __post_init__(self) -> None:
        if (self.rating == "error") != (self.error_message is not None):
            raise ValueError("a verdict has an error_message exactly when its rating is 'error'")
        if (self.rating == "skipped") != bool(self.missing):
            raise ValueError("a verdict names missing inputs exactly when its rating is 'skipped'")
        # These feed Prometheus counters, which must only grow: checked here, where every
        # verdict is made, so the pipeline can add them up without looking.
        prompt, completion = self.prompt_tokens, self.completion_tokens
        if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
            raise ValueError(f"token counts must be ints >= 0, got {prompt!r}, {completion!r}")
        cached = self.cached_prompt_tokens
        if type(cached) is not int or not 0 <= cached <= prompt:
            raise ValueError(f"cached prompt tokens must be an int in 0..{prompt}, got {cached!r}")
        if self.score is not None and (
            self.rating not in ("yes", "no") or not math.isfinite(self.score)
        ):
            raise ValueError(f"a score must be finite, on a yes or no verdict, got {self.score!r}")
        if not 0.0 <= self.latency_seconds < math.inf:
            raise ValueError(f"latency must be finite and >= 0, got {self.latency_seconds!r}")


class Judge(Protocol):
    """A judge grades one input; `name` is the Agent Evaluation judge name."""

    name: str

    async def judge(self, item: JudgeInput) -> Verdict: ...


@runtime_checkable
class SyncJudge(Protocol):
    """A judge that computes without waiting on I/O may also offer `grade`, the same as
    `judge` but synchronous; the panel then calls it directly (see `JudgePanel`)."""

    name: str

    def grade(self, item: JudgeInput) -> Verdict: ...


class ThrottledLog:
    """At most one warning per key per interval on `logger`, then how many were held back.

    A judge outage fails every call; one line per call would bury everything else in the log
    (the counts are in ragpulse_judge_errors_total).
    """

    def __init__(self, logger: logging.Logger, interval_seconds: float) -> None:
        self._log = logger
        self._interval = interval_seconds
        self._last: dict[tuple[str, ...], float] = {}
        self._held: dict[tuple[str, ...], int] = {}

    def warning(self, key: tuple[str, ...], msg: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] = self._held.get(key, 0) + 1
            return
        held = self._held.pop(key, 0)
        self._last[key] = now
        suffix = (
            f" (and {held} more like it in the last {now - last:.0f} s)" if held and last else ""
        )
        self._log.warning(msg + suffix, *args)


def judge_version(judge: Judge) -> str:
    """What produced a judge's verdicts, for the verdict cache: the judge's `version` when it
    has one (LLM judges: prompt, model and request settings), else its implementation."""
    version = getattr(judge, "version", None)
    if isinstance(version, str):
        return version
    return f"{type(judge).__module__}.{type(judge).__qualname__}"


def prompt_version(judge: Judge) -> str:
    """The short version of a judge's prompt, for the `version` label of its metric series: the
    judge's `prompt_version` when it has one (LLM judges: the prompt file's `version` and the
    frame's, "v1f2"), else "local" (the local judges, whose method is the release's).

    Few values by design (one per prompt edit): a prompt change starts new series, so rates of
    two prompts are never added up, and a dashboard shows when the prompt changed.
    """
    version = getattr(judge, "prompt_version", None)
    return version if isinstance(version, str) else "local"
