"""serve's open conversations across cycles, as one part the serve loop asks.

For whoever changes how serve judges conversations. The rules are in
`pipeline.service.conversations` (`SavedConversations` reads and changes, by the state file's
session index, only the sessions a cycle touches); `OpenSessions` applies them to each cycle:
at its start (`begin`) the sessions the watermark has closed (judged in the cycle's graph) and
the cut-off of final windows the open sessions hold; after the graph (`changes`) the cycle's
changes to the saved conversations, saved in the cycle's transaction; and the hold left after
them. Without --session-judges it does nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from ragpulse.judges.sessions import Session
from ragpulse.pipeline.graphs.bounded import GraphResult
from ragpulse.pipeline.metrics import catalogue, counting
from ragpulse.pipeline.records import SourceRecord
from ragpulse.pipeline.service.conversations import (
    DueSessions,
    SavedConversations,
    SessionChanges,
    new_turns,
)
from ragpulse.pipeline.service.state import StateStore
from ragpulse.pipeline.settings.models import ServeSettings
from ragpulse.pipeline.stages.parse import AdmissionRules


class OpenSessions:
    """The conversations of one topic between cycles (module docstring)."""

    def __init__(self, settings: ServeSettings, state: StateStore) -> None:
        config = settings.session_config()
        self._state = state
        self._topic = settings.topic
        self._saved = (
            None
            if config is None
            else SavedConversations(
                state, settings.topic, config, window_size=settings.window_seconds,
                max_open=settings.session_max_open, max_due=settings.max_batch_events,
            )
        )
        self._due: DueSessions | None = None

    @property
    def active(self) -> bool:
        """Whether conversations are judged (--session-judges): then a cycle's records are
        read before its graph, to save their turns."""
        return self._saved is not None

    def begin(self, watermark: float | None) -> tuple[list[Session], float | None]:
        """A cycle starts from `watermark`: the sessions it closed (with their kept turns'
        text), and the cut-off of final windows the open sessions hold (None: none)."""
        if self._saved is None:
            return [], None
        held = self._saved.hold()
        self._due = self._saved.due(watermark)
        return self._due.sessions, held

    def idle(self, cutoff: float | None) -> SessionChanges | None:
        """The changes of a cycle that judged nothing: the judged sessions no turn can join
        any more are forgotten."""
        if self._saved is None or self._due is None:
            return None
        return self._saved.changes(self._due, {}, [], cutoff)

    def changes(
        self, result: GraphResult, records: Sequence[SourceRecord], rules: AdmissionRules
    ) -> tuple[SessionChanges | None, counting.Counts]:
        """The cycle's changes to the saved conversations, and the counter increments they
        add: the sessions its graph judged, its new turns (the events the graph judged, by its
        `rules`, that name a session), the sessions they re-open."""
        if self._saved is None or self._due is None:
            return None, counting.Counts()
        changes = self._saved.changes(
            self._due, result.session_windows, new_turns(records, rules), rules.closed_before
        )
        return changes, changes.counts

    @staticmethod
    def hold_after(changes: SessionChanges | None) -> float | None:
        """The cut-off of final windows the open sessions hold once `changes` are saved."""
        return changes.hold if changes is not None else None

    def gauges(self) -> dict[str, float]:
        """The open sessions, for /metrics (none without --session-judges)."""
        if self._saved is None:
            return {}
        return {catalogue.SESSIONS_OPEN: self._state.open_session_count(self._topic)}
