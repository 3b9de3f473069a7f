"""The serve state file: one transaction per cycle, additive window counts, restart safety."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ragpulse.pipeline.cli import main
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.service.state import SCHEMA_VERSION, CycleOutcome, StateError, StateStore
from ragpulse.pipeline.windows import RatingCounts, WindowKey

T0 = 1_700_000_000.0  # 2023-11-14T22:13:20Z
Partial = tuple[WindowKey, RatingCounts]


def partial(start: float, yes: int, no: int, error: int = 0, judge: str = "safety") -> Partial:
    return WindowKey(start, start + 300, judge, "hr-bot", "m1"), RatingCounts(yes, no, error)


def windows(*parts: Partial) -> dict[WindowKey, RatingCounts]:
    return dict(parts)


def events_total(outcome: str, n: float) -> counting.Counts:
    return counting.merge({counting.key("ragpulse_events_total", outcome=outcome): n})


class _Exploding(dict[WindowKey, RatingCounts]):
    """Window counts whose reading stops midway with an exception (or a dead process)."""

    def __init__(self, first: Partial, explode: Callable[[], None]) -> None:
        super().__init__([first])
        self._explode = explode

    def items(self) -> Iterator[Partial]:  # type: ignore[override]
        yield from super().items()
        self._explode()


def test_first_open_creates_the_current_schema(tmp_path: Path) -> None:
    with StateStore(tmp_path / "state.db") as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.windows() == [] and store.offsets("t") == {} and store.counters() == {}


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    StateStore(tmp_path / "state.db").close()
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()
    with pytest.raises(StateError, match="newer ragpulse"):
        StateStore(tmp_path / "state.db")


def test_partials_from_several_cycles_add_up_to_one_pass(tmp_path: Path) -> None:
    with StateStore(tmp_path / "a.db") as split, StateStore(tmp_path / "b.db") as whole:
        split.apply_cycle("t", CycleOutcome(windows=windows(partial(T0, 3, 1)), offsets={0: 10}))
        later = partial(T0 + 300, 1, 1)
        split.apply_cycle(
            "t",
            CycleOutcome(
                windows=windows(partial(T0, 2, 0, 1), later),
                offsets={0: 20},
            ),
        )
        whole.apply_cycle(
            "t",
            CycleOutcome(
                windows=windows(partial(T0, 5, 1, 1), later),
                offsets={0: 20},
            ),
        )
        assert split.windows() == whole.windows()
        first = split.windows()[0]
        assert (first["yes"], first["no"], first["error"]) == (5, 1, 1)
        assert first["percentage"] == pytest.approx(5 / 6)
        assert first["ci_low"] < 5 / 6 < first["ci_high"]
        assert first["window_start"] == "2023-11-14T22:13:20Z"
        assert first["complete"] is False


def test_windows_before_the_closing_time_become_complete_once(tmp_path: Path) -> None:
    with StateStore(tmp_path / "s.db") as store:
        store.apply_cycle(
            "t",
            CycleOutcome(
                windows=windows(partial(T0, 1, 0), partial(T0 + 300, 1, 0)),
            ),
        )
        done = store.apply_cycle("t", CycleOutcome(closed_before=T0 + 300))
        assert done == windows(partial(T0, 1, 0))
        assert store.apply_cycle("t", CycleOutcome(closed_before=T0 + 300)) == {}
        assert [w["complete"] for w in store.windows()] == [True, False]


def test_counts_for_a_complete_window_are_refused(tmp_path: Path) -> None:
    with StateStore(tmp_path / "s.db") as store:
        store.apply_cycle(
            "t",
            CycleOutcome(
                windows=windows(partial(T0, 1, 0)),
                offsets={0: 1},
                closed_before=T0 + 300,
            ),
        )
        with pytest.raises(StateError, match="already complete"):
            store.apply_cycle("t", CycleOutcome(windows=windows(partial(T0, 1, 0)), offsets={0: 2}))
        assert store.offsets("t") == {0: 1}


def test_a_cycle_that_raises_midway_leaves_nothing_applied(tmp_path: Path) -> None:
    def crash() -> None:
        raise RuntimeError("judge panel crashed")

    c = counting.key("c", a="x")
    with StateStore(tmp_path / "s.db") as store:
        store.apply_cycle(
            "t",
            CycleOutcome(
                windows=windows(partial(T0, 1, 0)),
                offsets={0: 5},
                counts=counting.merge({c: 1}),
                watermark=T0,
            ),
        )
        before = (store.windows(), store.offsets("t"), store.counters(), store.watermark("t"))
        with pytest.raises(RuntimeError, match="crashed"):
            store.apply_cycle(
                "t",
                CycleOutcome(
                    windows=_Exploding(partial(T0, 7, 7), crash),
                    offsets={0: 9},
                    counts=counting.merge({c: 5}),
                    closed_before=T0 + 900,
                    watermark=T0 + 999,
                ),
            )
        after = (store.windows(), store.offsets("t"), store.counters(), store.watermark("t"))
        assert after == before


def _crash_in_the_middle_of_a_cycle(path: str) -> None:
    def die() -> None:
        os._exit(3)  # the process dies with the transaction open

    StateStore(path).apply_cycle(
        "t",
        CycleOutcome(
            windows=_Exploding(partial(T0, 7, 7), die),
            offsets={0: 99},
        ),
    )


def test_a_process_killed_mid_transaction_leaves_the_last_cycle_intact(tmp_path: Path) -> None:
    path = str(tmp_path / "s.db")
    with StateStore(path) as store:
        store.apply_cycle("t", CycleOutcome(windows=windows(partial(T0, 1, 0)), offsets={0: 5}))
    child = multiprocessing.get_context("fork").Process(
        target=_crash_in_the_middle_of_a_cycle, args=(path,)
    )
    child.start()
    child.join(30)
    assert child.exitcode == 3
    with StateStore(path) as store:
        assert store.offsets("t") == {0: 5}
        assert [(w["yes"], w["no"]) for w in store.windows()] == [(1, 0)]


def test_offsets_may_not_move_backwards(tmp_path: Path) -> None:
    with StateStore(tmp_path / "s.db") as store:
        store.apply_cycle("t", CycleOutcome(offsets={0: 10, 1: 4}))
        with pytest.raises(StateError, match="move back"):
            store.apply_cycle(
                "t",
                CycleOutcome(
                    windows=windows(partial(T0, 1, 0)),
                    offsets={1: 5, 0: 9},
                ),
            )
        assert store.offsets("t") == {0: 10, 1: 4}
        assert store.windows() == []


def test_reopening_restores_everything(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with StateStore(path) as store:
        store.apply_cycle(
            "events",
            CycleOutcome(
                windows=windows(partial(T0, 4, 1), partial(T0, 2, 2, judge="groundedness")),
                offsets={0: 40, 1: 12},
                counts=events_total("accepted", 50) + events_total("invalid", 2),
                closed_before=T0 + 300,
                watermark=T0 + 400,
                latest_event_times={0: T0 + 420, 1: T0 + 400},
            ),
        )
        store.apply_cycle(
            "events",
            CycleOutcome(
                offsets={0: 41},
                counts=events_total("accepted", 1),
                watermark=T0 + 350,
            ),
        )
        saved = store.windows()
    with StateStore(path) as store:
        assert store.windows() == saved
        assert store.windows(judge="groundedness")[0]["yes"] == 2
        assert store.windows(since=T0 + 1) == []
        assert store.offsets("events") == {0: 41, 1: 12}
        assert store.offsets("other") == {}
        assert store.counters() == events_total("accepted", 51) + events_total("invalid", 2)
        assert store.watermark("events") == T0 + 400
        assert store.latest_event_times("events") == {0: T0 + 420, 1: T0 + 400}


def _safety_windows_and_one_groundedness_window(
    store: StateStore, count: int, counts: counting.Counts | None = None
) -> None:
    """One cycle: `count` 5-minute safety windows from T0 on and a groundedness window at T0,
    closing the windows that end by T0 + 900 (safety windows 0-2 and the groundedness one)."""
    store.apply_cycle(
        "t",
        CycleOutcome(
            windows=windows(
                *(partial(T0 + i * 300, 1, 0) for i in range(count)),
                partial(T0, 0, 1, judge="groundedness"),
            ),
            counts=counts or {},
            closed_before=T0 + 900,
        ),
    )


def test_current_windows_are_the_open_ones_and_the_latest_complete_one_per_series(
    tmp_path: Path,
) -> None:
    with StateStore(tmp_path / "s.db") as store:
        _safety_windows_and_one_groundedness_window(store, 5)  # safety 3 and 4 open
        complete, in_progress = store.current_windows()
    assert complete == windows(
        partial(T0 + 600, 1, 0),  # the latest complete safety window
        partial(T0, 0, 1, judge="groundedness"),
    )
    assert in_progress == windows(partial(T0 + 900, 1, 0), partial(T0 + 1200, 1, 0))


def test_pruning_drops_old_complete_windows_but_keeps_each_series_latest_and_open_ones(
    tmp_path: Path,
) -> None:
    with StateStore(tmp_path / "s.db") as store:
        _safety_windows_and_one_groundedness_window(store, 4, events_total("accepted", 5))
        assert store.prune_windows(ended_before=T0 + 10_000) == 2  # safety windows 0 and 1
        left = {(w["judge"], w["window_start"], w["complete"]) for w in store.windows()}
        counters = store.counters()
    assert left == {
        ("safety", "2023-11-14T22:23:20Z", True),  # latest complete safety window kept
        ("safety", "2023-11-14T22:28:20Z", False),  # open windows are never pruned
        ("groundedness", "2023-11-14T22:13:20Z", True),  # its series' only window
    }
    assert counters == events_total("accepted", 5)


# --- state files that cannot be used ---


def _good_state(path: Path) -> Path:
    with StateStore(path) as store:
        store.apply_cycle("t", CycleOutcome(windows=windows(partial(T0, 3, 1)), offsets={0: 10}))
    return path


def _empty(path: Path) -> None:
    path.write_bytes(b"")


def _garbage(path: Path) -> None:
    path.write_bytes(b"this is not a database\n" * 100)


def _truncated(path: Path) -> None:
    _good_state(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])


def _newer(path: Path) -> None:
    _good_state(path)
    db = sqlite3.connect(path)
    db.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    db.close()


def _other_database(path: Path) -> None:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE customers (id INTEGER)")
    db.commit()
    db.close()


def _directory(path: Path) -> None:
    path.mkdir()


def _symlink_loop(path: Path) -> None:
    path.symlink_to(path.name)  # unreadable even by root: every open fails with ELOOP


BAD_STATE_FILES = {
    "empty": (_empty, "is empty"),
    "garbage": (_garbage, "not a SQLite database"),
    "truncated": (_truncated, "damaged"),
    "newer schema": (_newer, "newer ragpulse"),
    "another database": (_other_database, "not a ragpulse state file"),
    "directory": (_directory, "is a directory"),
    "unreadable": (_symlink_loop, "cannot be read"),
}


@pytest.fixture(name="bad_state_file", params=sorted(BAD_STATE_FILES))
def bad_state_file_fixture(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, str]:
    """A state file that cannot be used, of each kind in turn, and what its refusal must say."""
    make, why = BAD_STATE_FILES[request.param]
    path = tmp_path / "state.sqlite"
    make(path)
    return path, why


def test_a_state_file_that_cannot_be_used_is_refused_naming_it_and_the_way_out(
    bad_state_file: tuple[Path, str],
) -> None:
    path, why = bad_state_file
    before = path.read_bytes() if path.is_file() else None
    with pytest.raises(StateError) as refused:
        StateStore(path)
    message = str(refused.value)
    assert why in message and str(path) in message
    assert "`ragpulse serve` with --state-reset" in message
    assert "\n" not in message
    # Refused, never replaced: sqlite3 alone would have made the empty file a new database.
    assert (path.read_bytes() if path.is_file() else None) == before


def test_a_missing_file_is_a_fresh_start_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    with StateStore(tmp_path / "state.db") as store:
        assert store.offsets("t") == {}
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        "state.db"
    ]


def test_moving_a_bad_file_aside_keeps_it_and_the_next_open_starts_fresh(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    _truncated(path)
    damaged = path.read_bytes()
    moved = StateStore.move_aside(path)
    assert moved.name.startswith("state.db.corrupt-") and moved.read_bytes() == damaged
    with StateStore(path) as store:
        assert store.offsets("t") == {} and store.windows() == []


def test_windows_on_an_unusable_state_file_names_the_serve_flag_that_resets_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `ragpulse windows` has no --state-reset: the hint must say whose flag it is.
    path = tmp_path / "state.db"
    path.write_bytes(b"not a database at all")
    assert main(["windows", "--state", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("ragpulse windows: ") and "`ragpulse serve` with --state-reset" in line
