"""serve's conversations between cycles (pipeline/service/conversations.py): which sessions the
watermark closes, what a late turn does to a judged session, the cap, the windows held open,
and what is forgotten; then the same through a real state file (`StateStore.apply_cycle`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragpulse.judges.base import JudgeInput
from ragpulse.pipeline.records import InferenceRecord
from ragpulse.pipeline.service.conversations import (
    DueSessions,
    SavedConversations,
    SessionChanges,
    StoredTurn,
    due,
    hold,
    judged_session,
    plan,
    split,
)
from ragpulse.pipeline.service.state import CycleOutcome, StateError, StateStore
from ragpulse.pipeline.settings.models import JudgeSettings
from ragpulse.pipeline.stages.sessions import SessionConfig, session_key
from ragpulse.pipeline.windows import RatingCounts, WindowKey

GAP = 300.0
WINDOW = 60.0
CONFIG = SessionConfig(
    JudgeSettings(backend="local").spec().for_sessions(("user_frustration",)), GAP, 3, 10_000
)


def stored(session: str, i: int, t: float, judged: float | None = None) -> StoredTurn:
    return StoredTurn("app", session, f"{session}-{i}", t, "m", 10, True, judged)


def event(session: str, i: int, t: float, text: str = "q") -> tuple[str, InferenceRecord]:
    return "m", InferenceRecord(
        request_id=f"{session}-{i}", event_time=t, app="app", model="m",
        judge_input=JudgeInput(question=text, answer="a"), session_id=session,
    )


def counts_at(t: float, yes: int = 1) -> dict[WindowKey, RatingCounts]:
    start = t - t % WINDOW
    return {WindowKey(start, start + WINDOW, "user_frustration", "app", "m"): RatingCounts(yes)}


def test_turns_split_where_the_gap_passes_and_a_session_is_due_once_the_watermark_passes_it():
    turns = [stored("a", 1, 0), stored("a", 2, 299), stored("a", 3, 599), stored("a", 4, 899.5),
             stored("b", 1, 100)]
    assert [len(c.turns) for c in split(turns, GAP)] == [2, 1, 1, 1]
    assert due(turns, GAP, None) == []
    assert [c.key for c in due(turns, GAP, 598)] == [("app", "b", 100)]
    assert [c.key for c in due(turns, GAP, 599)] == [("app", "a", 299), ("app", "b", 100)]
    assert [c.key for c in due(turns, GAP, 899)] == [("app", "a", 299), ("app", "a", 599),
                                                      ("app", "b", 100)]
    # Judged sessions are not due again, and they hold no window.
    judged = [stored("a", 1, 0, judged=0)]
    assert due(judged, GAP, 10_000) == []
    assert hold(judged, GAP, WINDOW) is None
    assert hold(turns, GAP, WINDOW) == 60.0  # b's last turn (100) is in [60, 120)


def test_a_late_turn_reopens_its_session_while_its_windows_are_open_and_takes_its_counts_back():
    saved = [stored("a", 1, 0, judged=40), stored("a", 2, 40, judged=40)]
    earlier = {("app", "a", 40.0): counts_at(40)}
    changes = plan(saved, {}, earlier, [event("a", 3, 100)], CONFIG, window_size=WINDOW,
                   final_before=0.0)
    assert changes.retracted == counts_at(40)
    assert changes.judged_removed == [("app", "a", 40.0)]
    assert sum(changes.counts.values()) == 1  # ragpulse_session_rejudged_total{app}
    assert all(t.judged is None for t in changes.after)
    assert [c.key for c in due(changes.after, GAP, 400)] == [("app", "a", 100.0)]
    # Once a window of its verdicts is final, the turn is late for it and left out.
    late = plan(saved, {}, earlier, [event("a", 3, 100)], CONFIG, window_size=WINDOW,
                final_before=60.0)
    assert late.retracted == {} and late.judged_removed == []
    assert dict(late.counts) == {("ragpulse_session_turns_late_total", (("app", "app"),)): 1}
    assert due(late.after, GAP, 10_000) == []


def test_a_session_judged_in_this_cycle_is_reopened_by_a_turn_of_the_same_cycle():
    saved = [stored("a", 1, 0), stored("a", 2, 40)]
    (conversation,) = due(saved, GAP, 340)
    changes = plan(saved, {conversation.key: counts_at(40)}, {}, [event("a", 3, 200)], CONFIG,
                   window_size=WINDOW, final_before=0.0)
    # Counted by the cycle and taken back out by it: the windows count nothing for it yet.
    assert changes.judged_added == {} and changes.retracted == counts_at(40)
    assert [len(c.turns) for c in split(changes.after, GAP) if c.is_open] == [3]


def test_a_turn_read_twice_counts_once_and_the_cap_keeps_the_last_turns_text():
    saved = [stored("a", 1, 0)]
    fresh = [event("a", i, i * 10.0) for i in (1, 2, 3, 4, 5)] + [event("a", 5, 50.0)]
    changes = plan(saved, {}, {}, fresh, CONFIG, window_size=WINDOW, final_before=None)
    assert len(changes.after) == 5
    kept = sorted(t.request_id for t in changes.after if t.kept)
    assert kept == ["a-3", "a-4", "a-5"]  # --session-max-turns 3
    assert [t.request_id for t, text in changes.added if text is not None] == kept
    texts = {t.key: text for t, text in changes.added if text is not None}
    (conversation,) = due(changes.after, GAP, 10_000)
    session = judged_session(conversation, texts, CONFIG)
    assert session.request_ids == ("a-3", "a-4", "a-5") and session.dropped == 2


def test_a_judged_session_is_forgotten_once_no_admissible_turn_can_join_it():
    saved = [stored("a", 1, 0, judged=0)]
    earlier = {("app", "a", 0.0): counts_at(0)}
    kept = plan(saved, {}, earlier, [], CONFIG, window_size=WINDOW, final_before=GAP)
    assert kept.forgotten == []
    gone = plan(saved, {}, earlier, [], CONFIG, window_size=WINDOW, final_before=GAP + WINDOW)
    assert gone.forgotten == [("app", "a", "a-1")] and gone.judged_removed == [("app", "a", 0.0)]
    # The loop loads the counts of judged sessions only where a new turn may join one: the
    # saved counts of a session forgotten without them go too.
    unloaded = plan(saved, {}, {}, [], CONFIG, window_size=WINDOW, final_before=GAP + WINDOW)
    assert unloaded.judged_removed == [("app", "a", 0.0)]


def test_the_state_file_saves_the_changes_and_refuses_to_take_counts_out_of_a_final_window(
    tmp_path: Path,
) -> None:
    with StateStore(tmp_path / "state.sqlite") as state:
        first = plan([], {}, {}, [event("a", 1, 0, "hello"), event("a", 2, 40)], CONFIG,
                     window_size=WINDOW, final_before=None)
        state.apply_cycle("t", CycleOutcome(offsets={0: 2}, sessions=first))
        saved = state.session_turns("t")
        assert sorted(t.request_id for t in saved) == ["a-1", "a-2"]
        (conversation,) = due(saved, GAP, 340)
        texts = state.session_texts("t", conversation.turns)
        assert texts[("app", "a", "a-1")].question == "hello"
        verdicts = counts_at(40)
        judged = plan(saved, {conversation.key: verdicts}, {}, [], CONFIG, window_size=WINDOW,
                      final_before=0.0)
        state.apply_cycle(
            "t",
            CycleOutcome(
                windows=verdicts,
                offsets={0: 3},
                closed_before=0.0,
                sessions=judged,
            ),
        )
        assert state.judged_sessions("t", [("app", "a")]) == {("app", "a", 40.0): verdicts}
        late = plan(state.session_turns("t"), {}, state.judged_sessions("t", [("app", "a")]),
                    [event("a", 3, 100)], CONFIG, window_size=WINDOW, final_before=0.0)
        state.apply_cycle(
            "t",
            CycleOutcome(
                offsets={0: 4},
                counts=late.counts,
                closed_before=0.0,
                sessions=late,
            ),
        )
        (row,) = state.windows("user_frustration")
        assert (row["yes"], row["no"]) == (0, 0)  # taken back out, to be judged again
        assert state.judged_sessions("t", [("app", "a")]) == {}
        # The window is final now: taking counts out of it again is refused, nothing saved.
        state.apply_cycle("t", CycleOutcome(windows=verdicts, offsets={0: 5}, closed_before=200.0))
        again = plan([], {}, {}, [], CONFIG, window_size=WINDOW, final_before=None)
        again.retracted = verdicts
        with pytest.raises(StateError, match="it is final"):
            state.apply_cycle(
                "t",
                CycleOutcome(
                    offsets={0: 6},
                    closed_before=200.0,
                    sessions=again,
                ),
            )
        assert state.offsets("t") == {0: 5}


def saved_book(state: StateStore, max_open: int = 100, max_due: int = 100) -> SavedConversations:
    return SavedConversations(state, "t", CONFIG, window_size=WINDOW, max_open=max_open,
                              max_due=max_due)


def cycle(state: StateStore, book: SavedConversations, offset: int, watermark: float | None,
          fresh: list[tuple[str, InferenceRecord]], final_before: float | None = None,
          ) -> tuple[DueSessions, SessionChanges]:
    """One cycle's conversation work as serve does it: due, changes, saved."""
    found = book.due(watermark)
    changes = book.changes(found, {}, fresh, final_before)
    state.apply_cycle("t", CycleOutcome(offsets={0: offset}, counts=changes.counts,
                                        closed_before=final_before, sessions=changes))
    return found, changes


def test_the_saved_index_gives_the_due_sessions_and_the_hold_a_full_read_of_the_turns_gives(
    tmp_path: Path,
) -> None:
    with StateStore(tmp_path / "state.sqlite") as state:
        book = saved_book(state)
        cycle(state, book, 1, None, [event("a", 1, 0), event("a", 2, 299), event("a", 3, 599),
                                     event("b", 1, 100), event("c", 1, 1000)])
        for watermark in (None, 398, 399, 598, 599, 899, 1300):
            everything = state.session_turns("t")
            expected = sorted(c.key for c in due(everything, GAP, watermark))
            assert sorted(session_key(x) for x in book.due(watermark).sessions) == expected
            assert book.hold() == hold(everything, GAP, WINDOW)
        # b is judged; a turn of c arrives: only b's and c's turns change, and the index follows.
        found, changes = cycle(state, book, 2, 400, [event("c", 2, 1010)])
        assert [session_key(x) for x in found.sessions] == [("app", "b", 100.0)]
        assert {t.session_id for t in changes.after} == {"b", "c"}
        assert changes.open_after == 3  # a's two windows (its turns 300 s apart) and c
        assert state.open_session_count("t") == 3
        everything = state.session_turns("t")
        assert book.hold() == hold(everything, GAP, WINDOW) == 240.0  # a's first: 299 s
        assert sorted(session_key(x) for x in book.due(10_000).sessions) == sorted(
            c.key for c in due(everything, GAP, 10_000))


def test_beyond_max_open_the_oldest_sessions_are_judged_early_and_counted(
    tmp_path: Path,
) -> None:
    with StateStore(tmp_path / "state.sqlite") as state:
        book = saved_book(state, max_open=3)
        cycle(state, book, 1, None, [event(s, 1, t) for s, t in
                                     (("a", 50), ("b", 10), ("c", 30), ("d", 40), ("e", 20))])
        found, changes = cycle(state, book, 2, 100, [])  # none is due at 100
        assert sorted(session_key(x) for x in found.sessions) == [("app", "b", 10.0),
                                                                  ("app", "e", 20.0)]
        assert found.early == {("app", "b", 10.0), ("app", "e", 20.0)}
        assert changes.counts[("ragpulse_sessions_closed_early_total", (("app", "app"),))] == 2
        assert changes.counts[("ragpulse_sessions_judged_total",
                               (("app", "app"), ("model", "m")))] == 2
        assert state.open_session_count("t") == 3
        # A later turn of an early-judged session re-opens it, as any late turn does.
        _, late = cycle(state, book, 3, 100, [event("b", 2, 60)], final_before=0.0)
        assert late.counts[("ragpulse_session_rejudged_total", (("app", "app"),))] == 1


def test_at_most_max_due_sessions_are_judged_a_cycle_the_oldest_first(tmp_path: Path) -> None:
    with StateStore(tmp_path / "state.sqlite") as state:
        book = saved_book(state, max_due=2)
        cycle(state, book, 1, None, [event(s, 1, t) for s, t in
                                     (("a", 30), ("b", 10), ("c", 20))])
        first, _ = cycle(state, book, 2, 10_000, [])
        second, _ = cycle(state, book, 3, 10_000, [])
        assert [session_key(x) for x in first.sessions] == [("app", "b", 10.0),
                                                            ("app", "c", 20.0)]
        assert [session_key(x) for x in second.sessions] == [("app", "a", 30.0)]
        assert first.early == second.early == frozenset()


def test_the_index_is_built_again_when_the_gap_changes(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    with StateStore(path) as state:
        book = saved_book(state)
        cycle(state, book, 1, None, [event("a", 1, 0), event("a", 2, 200)])
        assert state.open_session_count("t") == 1  # one session under a 300 s gap
    with StateStore(path) as state:
        shorter = SessionConfig(CONFIG.judges, 100.0, CONFIG.max_turns, CONFIG.max_bytes)
        book = SavedConversations(state, "t", shorter, window_size=WINDOW, max_open=10,
                                  max_due=10)
        assert book.hold() == 0.0
        assert state.open_session_count("t") == 2  # two under a 100 s gap
