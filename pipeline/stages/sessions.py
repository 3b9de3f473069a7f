"""Conversations in event time: the turns of one session grouped by Beam session windows and
judged once per session (the session judges, judges.sessions).

For the graph builders (`pipeline.graphs.bounded`, `pipeline.graphs.unbounded`): `GroupSessions`
takes the sampled `InferenceRecord`s, keeps those naming a `session_id`, keys them by (app, session
id), puts each turn at its event time into `Sessions(gap)` windows (a conversation is over once no
turn came for `gap`, --session-gap) and, when the window closes (the watermark passes the
session's last turn + gap; at the end of the input in `ragpulse run`), makes one `Session`
(ordered, capped: judges.sessions.make_session) and one judge record of it: an
`InferenceRecord` whose `request_id` is `session:["<app>","<id>"]` (session_request_id), event
time the session's last turn (the windowed pass ratios count a session by its end), judge
input the transcript, and `session` the Session itself (verdict rows name its turns). The
session judges' panel (`JudgeSpec.for_sessions`) then judges those records with the same
`JudgeEvents` stage as the answers, so their verdicts are counted under the same metric names
and labels (ragpulse_judge_verdicts_total{judge="user_frustration",...}) and windowed alike.

Sampling is by conversation (pipeline.costs.sampling.sampling_key): every turn of a sampled
conversation is judged per answer and the session is judged whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from typing import Any

import apache_beam as beam
import orjson
from apache_beam.metrics import Metrics
from apache_beam.transforms import trigger, window
from apache_beam.utils.timestamp import Duration

from ragpulse.judges import JudgeSpec
from ragpulse.judges.sessions import (
    DEFAULT_SESSION_GAP_SECONDS,
    DEFAULT_SESSION_MAX_BYTES,
    DEFAULT_SESSION_MAX_TURNS,
    Session,
    SessionTurn,
    make_session,
    transcript_input,
)
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.counting import (
    COUNTER_NAMESPACE,
    SESSIONS_JUDGED,
    SESSIONS_TRUNCATED,
)
from ragpulse.pipeline.records import InferenceRecord

__all__ = [
    "GroupSessions",
    "SessionConfig",
    "SessionKey",
    "session_key",
    "session_record",
    "session_request_id",
    "turn_of",
]

# One judged conversation: (app, session id, its last turn's event time). The session id alone
# is not enough: the same id used again after a pause longer than the gap is another session.
SessionKey = tuple[str, str, float]


def session_key(session: Session) -> SessionKey:
    return (session.app, session.session_id, session.end)


@dataclasses.dataclass(frozen=True)
class SessionConfig:
    """How conversations are windowed and judged (picklable): the session judges' spec, the
    gap that ends a session, and the cap on its turns and bytes."""

    judges: JudgeSpec
    gap_seconds: float = DEFAULT_SESSION_GAP_SECONDS
    max_turns: int = DEFAULT_SESSION_MAX_TURNS
    max_bytes: int = DEFAULT_SESSION_MAX_BYTES


def keyed_turn(event: InferenceRecord) -> Iterator[window.TimestampedValue]:
    """The turn of an event that names a conversation, keyed by (app, session id), at its
    event time; nothing for an event without one."""
    if event.session_id is None:
        return
    yield window.TimestampedValue(
        ((event.app, event.session_id), (event.model, turn_of(event))), event.event_time
    )


def turn_of(event: InferenceRecord) -> SessionTurn:
    """The conversation turn an event is: its id, time, request, answer and feedback."""
    return SessionTurn(
        event.request_id,
        event.event_time,
        event.judge_input.question,
        event.judge_input.answer,
        event.feedback,
    )


def session_request_id(app: str, session_id: str) -> str:
    """The request id (and verdict row key) of a session's judge record: `session:` and the JSON
    array [app, session id], so two apps' conversations with the same id stay two rows, whatever
    characters either holds."""
    return "session:" + orjson.dumps([app, session_id]).decode()


def session_record(session: Session) -> InferenceRecord:
    """The record the session judges grade: the session's transcript, dated by its end."""
    return InferenceRecord(
        request_id=session_request_id(session.app, session.session_id),
        event_time=session.end,
        app=session.app,
        model=session.model,
        judge_input=transcript_input(session),
        session_id=session.session_id,
        session=session,
    )


def build_session(
    key: tuple[str, str], turns: Iterable[tuple[str, SessionTurn]], max_turns: int,
    max_bytes: int,
) -> Session:
    """The Session of one window's turns; its model is the last turn's (pure)."""
    app, session_id = key
    listed = sorted(turns, key=lambda mt: (mt[1].event_time, mt[1].request_id))
    return make_session(
        session_id, app, listed[-1][0], (t for _, t in listed),
        max_turns=max_turns, max_bytes=max_bytes,
    )


class _MakeSessions(beam.DoFn):
    def __init__(self, max_turns: int, max_bytes: int) -> None:
        self._max_turns = max_turns
        self._max_bytes = max_bytes

    def setup(self) -> None:
        self._counters: dict[counting.CounterKey, Any] = {}

    def _inc(self, name: str, app: str, model: str) -> None:
        k = counting.key(name, app=app, model=model)
        counter = self._counters.get(k)
        if counter is None:
            counter = self._counters[k] = Metrics.counter(COUNTER_NAMESPACE, counting.encode(k))
        counter.inc()

    def process(
        self, element: tuple[tuple[str, str], Iterable[tuple[str, SessionTurn]]]
    ) -> Iterator[InferenceRecord]:
        key, turns = element
        session = build_session(key, turns, self._max_turns, self._max_bytes)
        self._inc(SESSIONS_JUDGED, session.app, session.model)
        if session.truncated:
            self._inc(SESSIONS_TRUNCATED, session.app, session.model)
        yield session_record(session)


class GroupSessions(beam.PTransform):
    """Sampled events -> one judge record per conversation (see the module docstring)."""

    def __init__(self, config: SessionConfig, lateness_seconds: float | None = None) -> None:
        """`lateness_seconds` (stream): a turn up to that late for its session window (behind
        the watermark by its time + the gap + that) re-opens the session, which is then made
        again with all its turns (a late, accumulating pane); None: each session once, when
        the watermark passes it (later turns are dropped by the runner)."""
        super().__init__()
        self._config = config
        self._lateness = lateness_seconds

    def expand(self, events: Any) -> Any:
        c = self._config
        sessions = window.Sessions(c.gap_seconds)
        into = (
            beam.WindowInto(sessions)
            if self._lateness is None
            else beam.WindowInto(
                sessions,
                trigger=trigger.AfterWatermark(late=trigger.AfterCount(1)),
                allowed_lateness=Duration(seconds=self._lateness),
                accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
            )
        )
        return (
            events
            | "KeyTurnsBySession" >> beam.FlatMap(keyed_turn)
            | "SessionWindows" >> into
            | "GroupTurns" >> beam.GroupByKey()
            | "MakeSessions" >> beam.ParDo(_MakeSessions(c.max_turns, c.max_bytes))
            | "BackToGlobal" >> beam.WindowInto(window.GlobalWindows())
        )
