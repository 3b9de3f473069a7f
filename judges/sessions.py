"""Conversations as judge input: a session of turns, its size cap, and the transcript a session
judge reads.

For the pipeline stages that group an app's turns by `session_id` (event-time session windows)
and for the session judges (judges.registry `SESSION_JUDGES`; custom ones with `assessment:
SESSION`). A `Session` is one conversation's turns in event-time order; `make_session` orders
them, drops a turn read twice (same request id) and applies the cap: at most `max_turns` turns
and `max_bytes` bytes of text (question, answer and feedback), keeping the LAST turns, so an
oversize conversation is judged on how it ended and is marked `truncated` (counted apart, a
metric). A single last turn over `max_bytes` is cut to fit.

A session judge is an ordinary judge (the `Judge` protocol) whose `JudgeInput` is the session's
transcript (`transcript_input`): every turn in `history` (user, assistant, and a "feedback"
message where the user gave feedback), the last turn's question and answer as `question` and
`answer`. So the panel's verdict cache, concurrency bound, retries, breaker and redaction
(`Redactor.judge_input` redacts `history`) apply to it unchanged, and an LLM session judge
fences the whole transcript in one fence (judges.llm.judge, subject `conversation`): one call per
session, whatever its number of turns.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ragpulse.judges.base import JudgeInput, Turn

__all__ = [
    "DEFAULT_SESSION_GAP_SECONDS",
    "DEFAULT_SESSION_MAX_BYTES",
    "DEFAULT_SESSION_MAX_TURNS",
    "Session",
    "SessionTurn",
    "make_session",
    "transcript_input",
]

# A conversation is over once no turn came for this long in event time (--session-gap).
DEFAULT_SESSION_GAP_SECONDS = 300.0
DEFAULT_SESSION_MAX_TURNS = 50
DEFAULT_SESSION_MAX_BYTES = 65_536


@dataclasses.dataclass(frozen=True, slots=True)
class SessionTurn:
    """One turn of a conversation: the user's request and the chatbot's answer, with the
    event's id, event time (epoch seconds) and the user's feedback on the answer, if any."""

    request_id: str
    event_time: float
    question: str
    answer: str
    feedback: str | None = None

    @property
    def size(self) -> int:
        """The bytes of its text, as the cap counts them."""
        return sum(len(t.encode()) for t in (self.question, self.answer, self.feedback or ""))


@dataclasses.dataclass(frozen=True, slots=True)
class Session:
    """One conversation as judged: its id, the app and model of its last turn, its turns in
    event-time order, and whether earlier turns were left out by the cap (`dropped` of them)."""

    session_id: str
    app: str
    model: str
    turns: tuple[SessionTurn, ...]
    dropped: int = 0
    # The event time of its first turn, the dropped ones included (None: `turns[0]`'s).
    began: float | None = None

    @property
    def truncated(self) -> bool:
        return self.dropped > 0

    @property
    def turn_count(self) -> int:
        """Its turns, the dropped ones included."""
        return len(self.turns) + self.dropped

    @property
    def start(self) -> float:
        return self.turns[0].event_time

    @property
    def end(self) -> float:
        return self.turns[-1].event_time

    @property
    def request_ids(self) -> tuple[str, ...]:
        return tuple(t.request_id for t in self.turns)


def make_session(
    session_id: str,
    app: str,
    model: str,
    turns: Iterable[SessionTurn],
    *,
    max_turns: int = DEFAULT_SESSION_MAX_TURNS,
    max_bytes: int = DEFAULT_SESSION_MAX_BYTES,
) -> Session:
    """The session of `turns` (in any order): ordered by (event time, request id), each request
    id once, capped to its last `max_turns` turns within `max_bytes` bytes of text.

    ValueError when there is no turn or a cap is below 1: a session has at least one turn.
    """
    if max_turns < 1 or max_bytes < 1:
        raise ValueError(f"session caps must be >= 1, got {max_turns} turns, {max_bytes} bytes")
    by_id: dict[str, SessionTurn] = {}
    for turn in sorted(turns, key=lambda t: (t.event_time, t.request_id)):
        by_id.setdefault(turn.request_id, turn)
    ordered = list(by_id.values())
    if not ordered:
        raise ValueError(f"session {session_id!r} has no turns")
    kept: list[SessionTurn] = []
    used = 0
    for turn in reversed(ordered):
        if len(kept) == max_turns or (kept and used + turn.size > max_bytes):
            break
        kept.append(turn)
        used += turn.size
    kept.reverse()
    if used > max_bytes:  # the last turn alone is over the cap: cut its text
        kept[-1] = _cut(kept[-1], max_bytes)
    return Session(
        session_id, app, model, tuple(kept), dropped=len(ordered) - len(kept),
        began=ordered[0].event_time,
    )


def _cut(turn: SessionTurn, max_bytes: int) -> SessionTurn:
    half = max(1, max_bytes // 2)
    question = turn.question.encode()[:half].decode(errors="ignore")
    answer = turn.answer.encode()[: max(1, max_bytes - len(question.encode()))]
    return dataclasses.replace(
        turn, question=question, answer=answer.decode(errors="ignore"), feedback=None
    )


def transcript_input(session: Session) -> JudgeInput:
    """What a session judge reads: every turn as messages in `history` (a "feedback" message
    after an answer the user rated), the last turn's question and answer."""
    messages: list[Turn] = []
    for turn in session.turns:
        messages.append(Turn("user", turn.question))
        messages.append(Turn("assistant", turn.answer))
        if turn.feedback:
            messages.append(Turn("feedback", turn.feedback))
    last = session.turns[-1]
    return JudgeInput(question=last.question, answer=last.answer, history=tuple(messages))
