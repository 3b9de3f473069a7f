"""serve's open conversations across cycles, as one part the serve loop asks.

For whoever changes how serve judges conversations. The rules are in
`pipeline.service.conversations` (pure); `OpenSessions` applies them to each cycle: at its
start (`begin`) the saved turns, the sessions the watermark has closed (judged in the cycle's
graph) and the cut-off of final windows the open sessions hold; after the graph (`changes`)
the cycle's changes to the saved conversations, saved in the cycle's transaction; and the
hold left after them. Without --session-judges it does nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from ragpulse.judges.sessions import Session
from ragpulse.pipeline.graphs.bounded import GraphResult
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.metrics.counting import SESSIONS_JUDGED, SESSIONS_TRUNCATED
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.service.conversations import (
    SESSIONS_REJUDGED,
    SessionChanges,
    StoredTurn,
    due,
    hold,
    judged_session,
    new_turns,
    plan,
)
from ragpulse.pipeline.service.state import StateStore
from ragpulse.pipeline.settings.models import ServeSettings
from ragpulse.pipeline.stages.parse import AdmissionRules
from ragpulse.pipeline.stages.sessions import session_key

log = logging.getLogger(__name__)


class OpenSessions:
    """The conversations of one topic between cycles (module docstring)."""

    def __init__(self, settings: ServeSettings, state: StateStore) -> None:
        self.config = settings.session_config()
        self._state = state
        self._topic = settings.topic
        self._window = settings.window_seconds
        self._saved: list[StoredTurn] = []
        self._due: list[Session] = []

    @property
    def active(self) -> bool:
        """Whether conversations are judged (--session-judges): then a cycle's records are
        read before its graph, to save their turns."""
        return self.config is not None

    def begin(self, watermark: float | None) -> tuple[list[Session], float | None]:
        """A cycle starts from `watermark`: the sessions it closed (with their kept turns'
        text), and the cut-off of final windows the open sessions hold (None: none)."""
        config = self.config
        if config is None:
            return [], None
        self._saved = self._state.session_turns(self._topic)
        closed = due(self._saved, config.gap_seconds, watermark)
        texts = self._state.session_texts(
            self._topic, (t for c in closed for t in c.turns if t.kept)
        )
        self._due = [judged_session(c, texts, config) for c in closed]
        return self._due, hold(self._saved, config.gap_seconds, self._window)

    def idle(self, cutoff: float | None) -> SessionChanges | None:
        """The changes of a cycle that judged nothing: the judged sessions no turn can join
        any more are forgotten."""
        if self.config is None or not self._saved:
            return None
        return plan(
            self._saved, {}, {}, [], self.config, window_size=self._window, final_before=cutoff
        )

    def changes(
        self, result: GraphResult, records: Sequence[SourceRecord], rules: AdmissionRules
    ) -> tuple[SessionChanges | None, counting.Counts]:
        """The cycle's changes to the saved conversations, and the counter increments they
        add: the sessions its graph judged, its new turns (the events the graph judged, by its
        `rules`, that name a session), the sessions they re-open."""
        config = self.config
        if config is None:
            return None, counting.Counts()
        judged = self._due
        fresh = list(new_turns(records, rules))
        changes = plan(
            self._saved,
            {session_key(x): result.session_windows.get(session_key(x), {}) for x in judged},
            self._state.judged_sessions(
                self._topic, ((e.app, e.session_id or "") for _, e in fresh)
            ),
            fresh,
            config,
            window_size=self._window,
            final_before=rules.closed_before,
        )
        for x in judged:
            changes.counts[counting.key(SESSIONS_JUDGED, app=x.app, model=x.model)] += 1
            if x.truncated:
                changes.counts[counting.key(SESSIONS_TRUNCATED, app=x.app, model=x.model)] += 1
        rejudged = sum(n for k, n in changes.counts.items() if k[0] == SESSIONS_REJUDGED)
        if judged or rejudged:
            log.info(
                "%d sessions judged, %d re-opened by a late turn, %d open",
                len(judged), rejudged,
                len({(t.app, t.session_id) for t in changes.after if t.judged is None}),
            )
        return changes, changes.counts

    def hold_after(self, changes: SessionChanges | None) -> float | None:
        """The cut-off of final windows the open sessions hold once `changes` are saved."""
        if self.config is None:
            return None
        after = changes.after if changes is not None else self._saved
        return hold(after, self.config.gap_seconds, self._window)
