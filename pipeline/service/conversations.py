"""Conversations in `ragpulse serve`: the turns of open sessions kept in the state file between
cycles, each session judged once the watermark passes its last turn plus the gap, re-opened by
a late turn.

`run` and `stream` group turns with Beam session windows inside one pipeline
(`pipeline.stages.sessions`); serve runs one bounded pipeline per micro-batch, so the session
windows live here instead, as the same rule on the turns saved in the state file: turns of one
(app, session id) belong to one session while each follows the previous one by less than
`--session-gap` in event time (Beam's `Sessions(gap)` merging), and a session is due once the
watermark reaches its last turn + the gap. Everything a cycle changes (turns added, sessions
judged, re-opened or forgotten, the counts they move) is saved in the cycle's transaction with
its offsets (`StateStore.apply_cycle`), so a SIGKILL neither loses a session nor judges it
twice: the replayed cycle finds the same sessions due, and the call journal
(`pipeline.service.journal`) gives back the verdicts already paid for.

A cycle, in the serve loop (`pipeline.service.loop`):

1. `due`: the open sessions the previous watermark has closed; the loop judges them in the
   cycle's graph (`run_graph(sessions_due=...)`), each dated by its last turn.
2. `plan`: after the graph, the cycle's new turns (the sampled, admitted events that name a
   session: `new_turns`) are added. A turn that falls within the gap of a session already
   judged is a late turn: while every window holding that session's verdicts is still open, the
   session is re-opened (its verdict counts are taken back out of those windows, it is judged
   again when due, and `ragpulse_session_rejudged_total` counts it), so the counts never count
   one session twice; once one of them is final, the turn is counted in
   `ragpulse_session_turns_late_total` and left out of the session. A judged session is
   remembered until no admissible turn could still join it.
3. `hold`: no window is final while an open session could still be dated in it: the cut-off of
   final windows is held at the window of the earliest open session's last turn, so a
   session's verdicts always land in an open window, whatever the gap and the lateness.

A cycle's work is in proportion to the turns that arrived and the sessions that close, not to
the sessions open (`SavedConversations`, issue 31: 100,000 open sessions made cycles last
minutes): the state file indexes the session windows of its turns (`Span`, one row each: last
turn, open or judged), so the sessions due, the oldest open ones and the hold are read from that
index, and only the turns of the (app, session id)s a cycle touches (due, given a turn, or
forgotten) are loaded, planned and saved. At most `--session-max-open` sessions stay open: the
ones with the oldest last turn beyond it are judged early, counted in
`ragpulse_sessions_closed_early_total` and logged; and at most `max_due` sessions are judged
in one cycle (the rest stay open, holding their windows, for the next), so a cycle's memory is
bounded whatever the crowd.

The cap (`--session-max-turns`, `--session-max-bytes`) is kept in the state as in
`judges.sessions.make_session`: only the text of a session's last turns within the cap is
kept; the turns left out are remembered by id and time (they still merge sessions) and counted
as dropped when the session is judged (`ragpulse_sessions_truncated_total`).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol

from ragpulse.judges.sessions import Session, SessionTurn, make_session
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import InferenceRecord, SourceRecord
from ragpulse.pipeline.stages.parse import AdmissionRules
from ragpulse.pipeline.stages.sessions import SessionConfig, SessionKey, session_key, turn_of
from ragpulse.pipeline.windows import RatingCounts, WindowKey, window_start

__all__ = [
    "Conversation",
    "DueSessions",
    "SavedConversations",
    "SessionChanges",
    "SessionRows",
    "Span",
    "StoredTurn",
    "due",
    "hold",
    "judged_session",
    "new_turns",
    "plan",
    "spans_of",
    "split",
]

log = logging.getLogger(__name__)

SESSIONS_REJUDGED = catalogue.SESSIONS_REJUDGED
SESSION_TURNS_LATE = catalogue.SESSION_TURNS_LATE

TurnKey = tuple[str, str, str]  # (app, session id, request id)
AppSession = tuple[str, str]  # (app, session id)


@dataclasses.dataclass(frozen=True, slots=True)
class StoredTurn:
    """One turn as the state file lists it, without its text (loaded only to judge).

    `kept`: its text is kept (False: the cap left it out); `judged`: the last turn's time of
    the judged session it belongs to (None: its session is open)."""

    app: str
    session_id: str
    request_id: str
    event_time: float
    model: str
    size: int
    kept: bool = True
    judged: float | None = None

    @property
    def key(self) -> TurnKey:
        return (self.app, self.session_id, self.request_id)


@dataclasses.dataclass(frozen=True, slots=True)
class Conversation:
    """The turns of one session window (one app and session id, no gap of `--session-gap`)."""

    turns: tuple[StoredTurn, ...]

    @property
    def app(self) -> str:
        return self.turns[0].app

    @property
    def session_id(self) -> str:
        return self.turns[0].session_id

    @property
    def last(self) -> float:
        return self.turns[-1].event_time

    @property
    def key(self) -> SessionKey:
        return (self.app, self.session_id, self.last)

    @property
    def is_open(self) -> bool:
        return all(t.judged is None for t in self.turns)


def _order(t: StoredTurn) -> tuple[float, str]:
    return (t.event_time, t.request_id)


def split(turns: Iterable[StoredTurn], gap: float) -> list[Conversation]:
    """The session windows of `turns`: per (app, session id), in event-time order, a new one
    wherever a turn follows the previous by `gap` or more (Beam's `Sessions(gap)`)."""
    out: list[Conversation] = []
    by_key = sorted(turns, key=lambda t: (t.app, t.session_id, t.event_time, t.request_id))
    for _, group in itertools.groupby(by_key, key=lambda t: (t.app, t.session_id)):
        current: list[StoredTurn] = []
        for t in group:
            if current and t.event_time >= current[-1].event_time + gap:
                out.append(Conversation(tuple(current)))
                current = []
            current.append(t)
        out.append(Conversation(tuple(current)))
    return out


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """One session window as the state file indexes it: its last turn's time, and whether it is
    open (not judged yet)."""

    last: float
    open: bool


def spans_of(turns: Iterable[StoredTurn], gap: float) -> dict[AppSession, list[Span]]:
    """The session windows of `turns`, per (app, session id)."""
    out: dict[AppSession, list[Span]] = {}
    for c in split(turns, gap):
        out.setdefault((c.app, c.session_id), []).append(Span(c.last, c.is_open))
    return out


def due(turns: Iterable[StoredTurn], gap: float, watermark: float | None) -> list[Conversation]:
    """The open sessions the watermark has closed (watermark >= last turn + gap)."""
    if watermark is None:
        return []
    return [c for c in split(turns, gap) if c.is_open and c.last + gap <= watermark]


def hold(turns: Iterable[StoredTurn], gap: float, window_size: float) -> float | None:
    """The latest cut-off of final windows that leaves every open session's window open: the
    start of the window of the earliest open session's last turn (None: no open session).

    It never reopens a final window: the turn was admitted, so its window ended after the
    cut-off then in force, and since windows are aligned, no window ends between that window's
    start and the cut-off: the windows final before are exactly those ending at or before it."""
    starts = [window_start(c.last, window_size) for c in split(turns, gap) if c.is_open]
    return min(starts) if starts else None


def judged_session(
    conversation: Conversation, texts: Mapping[TurnKey, SessionTurn], config: SessionConfig
) -> Session:
    """The Session a due conversation is judged as: its kept turns within the cap, the turns
    the cap left out counted as dropped; its model is the last turn's."""
    kept = [texts[t.key] for t in conversation.turns if t.kept and t.key in texts]
    if not kept:  # never: the last turn's text is always kept
        raise ValueError(f"session {conversation.session_id!r} has no kept turn")
    session = make_session(
        conversation.session_id,
        conversation.app,
        conversation.turns[-1].model,
        kept,
        max_turns=config.max_turns,
        max_bytes=config.max_bytes,
    )
    left_out = len(conversation.turns) - len(kept)
    return dataclasses.replace(session, dropped=session.dropped + left_out)


def new_turns(
    records: Iterable[SourceRecord], rules: AdmissionRules
) -> Iterator[tuple[str, InferenceRecord]]:
    """The turns among a cycle's records: each event the cycle's graph judges (by the cycle's
    own `AdmissionRules`, so with the same clock) that names a session, with its model."""
    for record in records:
        event = rules.judged(record)
        if event is not None and event.session_id is not None:
            yield event.model, event


@dataclasses.dataclass
class SessionChanges:
    """What one cycle changes in the saved conversations (`StateStore.apply_cycle`).

    `added`: new turns, with their text (None when the cap or lateness leaves it out);
    `updated`: saved turns whose `kept` or `judged` changed; `forgotten`: turns of judged
    sessions no turn can join any more; `judged_added` / `judged_removed`: judged sessions and
    their verdict counts, kept to be taken back out (`retracted`) if a late turn re-opens one;
    `counts`: counter increments (re-judged sessions, late turns)."""

    added: list[tuple[StoredTurn, SessionTurn | None]] = dataclasses.field(default_factory=list)
    updated: list[StoredTurn] = dataclasses.field(default_factory=list)
    forgotten: list[TurnKey] = dataclasses.field(default_factory=list)
    judged_added: dict[SessionKey, dict[WindowKey, RatingCounts]] = dataclasses.field(
        default_factory=dict
    )
    judged_removed: list[SessionKey] = dataclasses.field(default_factory=list)
    retracted: dict[WindowKey, RatingCounts] = dataclasses.field(default_factory=dict)
    counts: counting.Counts = dataclasses.field(default_factory=Counter)
    # The planned (app, session id)s' turns as saved after the cycle, and their session
    # windows (an empty list: none left), which replace theirs in the state file's index.
    after: list[StoredTurn] = dataclasses.field(default_factory=list)
    spans: dict[AppSession, list[Span]] = dataclasses.field(default_factory=dict)
    # The cut-off of final windows the sessions open after the cycle hold, and how many are
    # open (`SavedConversations.changes`; None: not known, from `plan` alone).
    hold: float | None = None
    open_after: int | None = None


def plan(
    saved: Sequence[StoredTurn],
    judged_now: Mapping[SessionKey, dict[WindowKey, RatingCounts]],
    judged_counts: Mapping[SessionKey, dict[WindowKey, RatingCounts]],
    fresh: Iterable[tuple[str, InferenceRecord]],
    config: SessionConfig,
    *,
    window_size: float,
    final_before: float | None,
) -> SessionChanges:
    """The cycle's changes to the saved conversations (see the module docstring).

    `saved`: the turns in the state at the cycle's start of every (app, session id) the cycle
    touches: the sessions judged, those of the fresh turns, and the judged ones to forget (all
    the saved turns will do; none other is changed); `judged_now`: the sessions the cycle
    judged (their keys are those of `due`) with their verdict counts per window;
    `judged_counts`: the same for the sessions judged in earlier cycles that are still saved;
    `fresh`: the cycle's new turns (`new_turns`); `final_before`: windows ending at or before it
    were final when the cycle started (the cut-off the cycle's events were admitted under)."""
    gap = config.gap_seconds
    changes = SessionChanges()
    turns: dict[TurnKey, StoredTurn] = {t.key: t for t in saved}
    touched: set[TurnKey] = set()
    verdicts = dict(judged_counts)

    def update(t: StoredTurn) -> None:
        turns[t.key] = t
        touched.add(t.key)

    # 1. The sessions judged in this cycle: their turns are now judged.
    open_now = {c.key: c for c in split(saved, gap) if c.is_open}
    for key, counts in judged_now.items():
        for t in open_now[key].turns:
            update(dataclasses.replace(t, judged=key[2]))
        verdicts[key] = counts
        changes.judged_added[key] = counts
    # 2. The new turns (a request id read twice counts once).
    texts: dict[TurnKey, SessionTurn] = {}
    for model, event in fresh:
        assert event.session_id is not None
        turn = turn_of(event)
        stored = StoredTurn(
            event.app, event.session_id, event.request_id, event.event_time, model, turn.size
        )
        if stored.key in turns or stored.key in texts:
            continue
        texts[stored.key] = turn
        update(stored)
    apps_sessions = {(k[0], k[1]) for k in texts}
    # 3. A new turn in a judged session re-opens it, or is late for it.
    mine = [t for t in turns.values() if (t.app, t.session_id) in apps_sessions]
    for conversation in split(mine, gap):
        late_ones = [t for t in conversation.turns if t.key in texts]
        lasts = sorted({t.judged for t in conversation.turns if t.judged is not None})
        if not late_ones or not lasts:
            continue
        app, session_id = conversation.app, conversation.session_id
        keys = [(app, session_id, last) for last in lasts]
        replaceable = all(
            final_before is None or w.window_end > final_before
            for k in keys
            for w in verdicts.get(k, {})
        )
        if replaceable:
            for k in keys:
                for w, c in verdicts.pop(k, {}).items():
                    changes.retracted[w] = changes.retracted.get(w, RatingCounts()) + c
                if k in changes.judged_added:
                    del changes.judged_added[k]
                else:
                    changes.judged_removed.append(k)
                changes.counts[counting.key(SESSIONS_REJUDGED, app=app)] += 1
            for t in conversation.turns:
                if t.judged is not None:
                    update(dataclasses.replace(t, judged=None))
        else:
            for t in late_ones:
                update(dataclasses.replace(t, kept=False, judged=lasts[-1]))
                texts.pop(t.key)
                changes.counts[counting.key(SESSION_TURNS_LATE, app=app)] += 1
    # 4. The cap: only the last turns' text within it is kept.
    for conversation in split(mine, gap):
        if not conversation.is_open:
            continue
        for t in _left_out(conversation, config.max_turns, config.max_bytes):
            if t.kept:
                update(dataclasses.replace(t, kept=False))
                texts.pop(t.key, None)
    # 5. Judged sessions no admissible turn can join any more are forgotten: a turn joins one
    # only before its last turn + the gap, and a turn is admitted only in an open window.
    forget: set[SessionKey] = set()
    if final_before is not None:
        for conversation in split(turns.values(), gap):
            if conversation.is_open:
                continue
            if window_start(conversation.last + gap, window_size) + window_size <= final_before:
                for t in conversation.turns:
                    changes.forgotten.append(t.key)
                    touched.discard(t.key)
                    del turns[t.key]
                forget.update({(t.app, t.session_id, t.judged) for t in conversation.turns
                               if t.judged is not None})
    for k in sorted(forget):
        if k in changes.judged_added:
            del changes.judged_added[k]
        elif k not in changes.judged_removed:
            changes.judged_removed.append(k)
    saved_keys = {t.key for t in saved}
    for turn_key in sorted(touched):
        t = turns[turn_key]
        if turn_key in saved_keys:
            changes.updated.append(t)
        else:
            changes.added.append((t, texts.get(turn_key)))
    changes.after = list(turns.values())
    changes.spans = {
        **{(t.app, t.session_id): [] for t in saved},
        **{k[:2]: [] for k in texts},
        **spans_of(changes.after, gap),
    }
    return changes


def _left_out(conversation: Conversation, max_turns: int, max_bytes: int) -> list[StoredTurn]:
    """The turns whose text the cap leaves out: all but the last `max_turns` within `max_bytes`
    (the last turn is always kept: `make_session` cuts it to fit)."""
    kept = 0
    used = 0
    full = False
    left: list[StoredTurn] = []
    for t in reversed(conversation.turns):
        full = full or not t.kept or kept == max_turns or (kept > 0 and used + t.size > max_bytes)
        if full:
            left.append(t)
            continue
        kept += 1
        used += t.size
    return left


class SessionRows(Protocol):
    """The state file's reads of the saved conversations (`pipeline.service.state.StateStore`,
    which imports this module: a protocol, not an import, keeps one direction)."""

    def index_sessions(self, gap: float) -> bool: ...

    def session_turns(
        self, topic: str, apps_sessions: Iterable[AppSession] | None = None
    ) -> list[StoredTurn]: ...

    def session_texts(
        self, topic: str, turns: Iterable[StoredTurn]
    ) -> dict[TurnKey, SessionTurn]: ...

    def judged_sessions(
        self, topic: str, apps_sessions: Iterable[AppSession]
    ) -> dict[SessionKey, dict[WindowKey, RatingCounts]]: ...

    def open_session_count(self, topic: str) -> int: ...

    def open_sessions_by_last(self, topic: str) -> Iterator[tuple[str, str, float]]: ...

    def judged_sessions_before(self, topic: str, last_before: float) -> set[AppSession]: ...


@dataclasses.dataclass(frozen=True, slots=True)
class DueSessions:
    """The sessions a cycle judges (`SavedConversations.due`): `sessions`, each with its kept
    turns' text; `turns`, the saved turns of their (app, session id)s; `early`, those judged
    before their gap ended (--session-max-open); `open_before`, the sessions open at the
    cycle's start."""

    sessions: list[Session]
    turns: list[StoredTurn]
    early: frozenset[SessionKey]
    open_before: int


class SavedConversations:
    """serve's conversations in the state file, for one topic: each cycle asks which sessions
    are due (`due`) and what its new turns change (`changes`), reading by index only the
    sessions it touches (see the module docstring)."""

    def __init__(
        self,
        rows: SessionRows,
        topic: str,
        config: SessionConfig,
        *,
        window_size: float,
        max_open: int,
        max_due: int,
    ) -> None:
        self._rows = rows
        self._topic = topic
        self.config = config
        self._window_size = window_size
        self._max_open = max_open
        self._max_due = max_due
        self._indexed = False

    def _index(self) -> None:
        """Check the state file's index of session windows (built again from every saved turn
        if --session-gap changed, or on a file written before it) at the first cycle, not at
        start-up: /healthz answers meanwhile, and a build that hangs counts as a cycle."""
        if not self._indexed:
            if self._rows.index_sessions(self.config.gap_seconds):
                log.info("session index of %s built for --session-gap %gs", self._topic,
                         self.config.gap_seconds)
            self._indexed = True

    def hold(self) -> float | None:
        """The cut-off of final windows the open sessions hold now (`hold`)."""
        self._index()
        first = next(iter(self._rows.open_sessions_by_last(self._topic)), None)
        return None if first is None else window_start(first[2], self._window_size)

    def due(self, watermark: float | None) -> DueSessions:
        """The open sessions the watermark has closed, then, while more than --session-max-open
        are open, the ones with the oldest last turn (judged early); at most `max_due`, oldest
        first (the rest are judged in the next cycles)."""
        self._index()
        gap = self.config.gap_seconds
        open_before = self._rows.open_session_count(self._topic)
        over = open_before - self._max_open
        chosen: dict[SessionKey, bool] = {}  # -> judged early
        for app, session_id, last in self._rows.open_sessions_by_last(self._topic):
            closed = watermark is not None and last + gap <= watermark
            if len(chosen) >= self._max_due or not (closed or len(chosen) < over):
                break
            chosen[(app, session_id, last)] = not closed
        if not chosen:
            return DueSessions([], [], frozenset(), open_before)
        turns = self._rows.session_turns(self._topic, {k[:2] for k in chosen})
        closing = [c for c in split(turns, gap) if c.is_open and c.key in chosen]
        texts = self._rows.session_texts(
            self._topic, (t for c in closing for t in c.turns if t.kept)
        )
        sessions = [judged_session(c, texts, self.config) for c in closing]
        early = frozenset(k for k, is_early in chosen.items() if is_early)
        if early:
            log.warning(
                "%d sessions judged before --session-gap passed: %d were open, more than "
                "--session-max-open %d (the oldest are judged first)",
                len(early), open_before, self._max_open,
            )
        return DueSessions(sessions, turns, early, open_before)

    def changes(
        self,
        due: DueSessions,
        session_windows: Mapping[SessionKey, dict[WindowKey, RatingCounts]],
        fresh: Iterable[tuple[str, InferenceRecord]],
        final_before: float | None,
    ) -> SessionChanges:
        """The cycle's changes (`plan`) on the sessions it touches: those it judged (their
        verdict counts per window in `session_windows`, from the graph), those of its `fresh`
        turns (`new_turns`), and the judged ones no turn can join any more; with their counts,
        the hold and the open sessions after it."""
        gap = self.config.gap_seconds
        fresh = list(fresh)
        given = {(e.app, e.session_id or "") for _, e in fresh}
        loaded = {(t.app, t.session_id) for t in due.turns}
        # A judged session is forgotten once its last turn + the gap is in a final window.
        forget = (
            self._rows.judged_sessions_before(self._topic, final_before - gap)
            if final_before is not None
            else set()
        )
        turns = [*due.turns, *self._rows.session_turns(self._topic, (given | forget) - loaded)]
        changes = plan(
            turns,
            {session_key(x): session_windows.get(session_key(x), {}) for x in due.sessions},
            self._rows.judged_sessions(self._topic, given),
            fresh,
            self.config,
            window_size=self._window_size,
            final_before=final_before,
        )
        for x in due.sessions:
            changes.counts[counting.key(catalogue.SESSIONS_JUDGED, app=x.app, model=x.model)] += 1
            if x.truncated:
                changes.counts[
                    counting.key(catalogue.SESSIONS_TRUNCATED, app=x.app, model=x.model)
                ] += 1
        for app, _, _ in due.early:
            changes.counts[counting.key(catalogue.SESSIONS_CLOSED_EARLY, app=app)] += 1
        opens = [s.last for spans in changes.spans.values() for s in spans if s.open]
        for app, session_id, last in self._rows.open_sessions_by_last(self._topic):
            if (app, session_id) not in changes.spans:
                opens.append(last)
                break
        changes.hold = window_start(min(opens), self._window_size) if opens else None
        before = spans_of(turns, gap)
        changes.open_after = (
            due.open_before
            - sum(s.open for spans in before.values() for s in spans)
            + sum(s.open for spans in changes.spans.values() for s in spans)
        )
        rejudged = sum(n for k, n in changes.counts.items() if k[0] == SESSIONS_REJUDGED)
        if due.sessions or rejudged:
            log.info(
                "%d sessions judged (%d early), %d re-opened by a late turn, %d open",
                len(due.sessions), len(due.early), rejudged, changes.open_after,
            )
        return changes
