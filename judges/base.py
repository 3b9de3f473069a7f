"""What a judge reads, what it returns, and the protocol every judge follows.

The pipeline turns an inference-log event into a `JudgeInput`; each judge turns a `JudgeInput`
into a `Verdict`. `error` is a rating of its own ("could not grade"), never a failing grade:
it is left out of pass ratios and counted by cause so a broken judge is visible.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Literal, Protocol, runtime_checkable

Rating = Literal["yes", "no", "error"]
RATINGS: tuple[Rating, ...] = ("yes", "no", "error")

# Why a verdict is `error`; a closed set so it can label a metric.
ErrorCause = Literal[
    "timeout", "rate_limited", "server_error", "client_error", "connection", "unparsable", "input"
]
ERROR_CAUSES: tuple[ErrorCause, ...] = (
    "timeout", "rate_limited", "server_error", "client_error", "connection", "unparsable", "input"
)


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
class JudgeInput:
    """The part of an inference-log event that judges look at."""

    question: str
    answer: str
    chunks: tuple[Chunk, ...] = ()
    history: tuple[Turn, ...] = ()


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

    def __post_init__(self) -> None:
        if (self.rating == "error") != (self.error_message is not None):
            raise ValueError("a verdict has an error_message exactly when its rating is 'error'")


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


class JudgePanel:
    """Runs several judges over a batch of inputs on one private event loop.

    Concurrency bounds live with the judges that need them (the LLM endpoint's semaphore);
    the panel only starts every (input, judge) pair and waits for all of them. When every judge
    also offers a synchronous `grade` (the local judges), the panel calls that instead: a
    coroutine, a task and two event-loop callbacks per (input, judge) pair cost about as much as
    a local judge itself, and they buy nothing when there is no I/O to overlap.
    """

    def __init__(self, judges: Sequence[Judge]) -> None:
        if not judges:
            raise ValueError("a judge panel needs at least one judge")
        self.judges = tuple(judges)
        self._loop = asyncio.new_event_loop()
        graders = tuple(j.grade for j in self.judges if isinstance(j, SyncJudge))
        self._graders: tuple[Callable[[JudgeInput], Verdict], ...] | None = (
            graders if len(graders) == len(self.judges) else None
        )

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(j.name for j in self.judges)

    def judge_batch(self, items: Sequence[JudgeInput]) -> list[tuple[Verdict, ...]]:
        """One tuple of verdicts per input, in the order of `self.judges`."""
        graders = self._graders
        if graders is not None:
            return [tuple(grade(item) for grade in graders) for item in items]
        return self._loop.run_until_complete(self._judge_all(items))

    async def _judge_all(self, items: Sequence[JudgeInput]) -> list[tuple[Verdict, ...]]:
        flat = await asyncio.gather(*(j.judge(item) for item in items for j in self.judges))
        n = len(self.judges)
        return [tuple(flat[i * n : (i + 1) * n]) for i in range(len(items))]

    def close(self) -> None:
        """Let judges release what they hold on the panel's loop (HTTP clients), then close it.

        A judge may offer `async aclose()`; pooled connections left to a closed loop raise
        "Event loop is closed" when they are collected.
        """
        for judge in self.judges:
            aclose = getattr(judge, "aclose", None)
            if aclose is not None:
                self._loop.run_until_complete(aclose())
        self._loop.close()
