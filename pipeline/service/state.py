"""What `ragpulse serve` remembers between cycles and restarts, in one SQLite file.

Window counts, the Kafka offsets they cover, cumulative Prometheus counter values and the
watermark are saved by `StateStore.apply_cycle` in a single transaction, so after a crash the
store holds either all of a cycle or none of it; offsets are committed to Kafka only afterwards.
Restarting from the saved offsets therefore never counts an event twice nor skips one.

Only a MISSING file means a fresh start: a new file is built under a temporary name and renamed
into place, so a crash during creation never leaves a half-made file behind. Any file that is
there but cannot be used (empty, truncated, garbage, a newer schema, a directory, unreadable) is
refused with a `StateError` naming the file and the way out (`StateStore.move_aside`, which
`ragpulse serve --state-reset` uses): such a file is never silently replaced, since that would
restart every count from zero.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ragpulse.judges.sessions import SessionTurn
from ragpulse.pipeline.costs.budget import HourSpend
from ragpulse.pipeline.formats.otlp import Arrival, SpanPart
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.service.conversations import SessionChanges, StoredTurn, spans_of
from ragpulse.pipeline.stages.sessions import SessionKey
from ragpulse.pipeline.windows import RatingCounts, WindowKey, isoformat_utc, window_row

# 2: windows gained the judge's prompt `version` (in the key) and the score sums of graded
# scales; a schema-1 file is migrated when opened (`_migrate_to_2`).
SCHEMA_VERSION = 2
_SQLITE_HEADER = b"SQLite format 3\x00"
_TABLES = {"windows", "offsets", "counters", "watermarks", "partition_event_times"}
RECOVERY_HINT = (
    "move it aside, or start `ragpulse serve` with --state-reset to start from scratch (serve "
    "then re-reads the topic from the consumer group's committed offsets, or from the beginning)"
)

_WINDOWS_SCHEMA = """
CREATE TABLE IF NOT EXISTS windows (
    window_start REAL NOT NULL,
    window_end REAL NOT NULL,
    judge TEXT NOT NULL,
    app TEXT NOT NULL,
    model TEXT NOT NULL,
    yes INTEGER NOT NULL DEFAULT 0,
    no INTEGER NOT NULL DEFAULT 0,
    error INTEGER NOT NULL DEFAULT 0,
    complete INTEGER NOT NULL DEFAULT 0,
    version TEXT NOT NULL DEFAULT '',
    scored INTEGER NOT NULL DEFAULT 0,
    score_milli INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (window_start, window_end, judge, version, app, model)
);
CREATE INDEX IF NOT EXISTS windows_open ON windows (complete, window_end);
CREATE INDEX IF NOT EXISTS windows_series ON windows (complete, judge, app, model, window_end);
"""
_SCHEMA = _WINDOWS_SCHEMA + """
CREATE TABLE IF NOT EXISTS offsets (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    next_offset INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (name, labels)
);
CREATE TABLE IF NOT EXISTS watermarks (
    topic TEXT PRIMARY KEY,
    watermark REAL
);
CREATE TABLE IF NOT EXISTS partition_event_times (
    topic TEXT NOT NULL,
    partition INTEGER NOT NULL,
    latest_event_time REAL NOT NULL,
    PRIMARY KEY (topic, partition)
);
"""


# Exemplar pointers came after schema 1; a file without the table gets it at open, and older
# ragpulse versions ignore it, so no schema bump is needed.
_EXEMPLARS_TABLE = """
CREATE TABLE IF NOT EXISTS exemplars (
    name TEXT NOT NULL,
    labels TEXT NOT NULL,
    request_id TEXT NOT NULL,
    timestamp REAL NOT NULL,
    PRIMARY KEY (name, labels)
)
"""


# Spans of traces still being assembled (--input-format otlp_*, pipeline/formats/otlp.py), saved
# with the offsets that read them, and the traces assembled or refused lately, so that spans of
# theirs arriving later are not judged again; added like the exemplars table, no schema bump.
_TRACE_SPANS_TABLE = """
CREATE TABLE IF NOT EXISTS trace_spans (
    topic TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    position INTEGER NOT NULL,
    span_id TEXT NOT NULL,
    seen REAL NOT NULL,
    part BLOB NOT NULL,
    PRIMARY KEY (topic, trace_id, partition, position, span_id)
);
CREATE TABLE IF NOT EXISTS finished_traces (
    topic TEXT NOT NULL,
    trace_id TEXT NOT NULL,
    finished_at REAL NOT NULL,
    PRIMARY KEY (topic, trace_id)
);
CREATE INDEX IF NOT EXISTS finished_traces_age ON finished_traces (finished_at)
"""


# Money across crashes (added like the exemplars table, no schema bump: an older ragpulse
# ignores both tables, and only loses what they add). `judge_spend` holds the judge budget's
# spend of the current clock hour (pipeline/costs/budget.py), saved with each cycle's counters,
# and its pace (the arrival rate it budgets the rest of the hour for, and when and over how many
# records the last cycle was planned: columns added to files from before, `_add_pace_columns`);
# `answered_calls` is the journal of judge calls answered and not yet settled by a committed
# cycle (pipeline/service/journal.py), written as the answers arrive: a restart takes their
# verdicts instead of paying again, and every call's tokens are counted once.
_MONEY_TABLES = """
CREATE TABLE IF NOT EXISTS judge_spend (
    hour INTEGER PRIMARY KEY,
    unit TEXT NOT NULL,
    spent REAL NOT NULL,
    arrivals REAL,
    planned_at REAL,
    planned_records INTEGER
);
CREATE TABLE IF NOT EXISTS answered_calls (
    id INTEGER PRIMARY KEY,
    judge TEXT NOT NULL,
    version TEXT NOT NULL,
    digest BLOB,
    verdict TEXT NOT NULL,
    counted INTEGER NOT NULL DEFAULT 0
)
"""


# Conversations (--session-judges, pipeline/service/conversations.py), added like the exemplars
# table, no schema bump: the turns of sessions still open, or judged and still joinable by a
# late turn (`judged`: the judged session's last turn time; `turn`: the turn's text as JSON,
# NULL when the cap or lateness left it out), and each judged session's verdict counts per
# window, to take back out if a late turn re-opens it. Saved with the cycle's offsets.
# `session_spans` indexes the session windows of those turns (one row per window: its last
# turn's time, open or judged), so that a cycle finds the sessions due, the oldest open ones and
# the hold by index and loads only the turns of the sessions it touches; it is rewritten for
# the (app, session id)s a cycle touches, and built again from the turns when serve starts
# with another --session-gap than the one it was built with (`session_spans_gap`), or on a
# file that predates it.
_SESSION_TABLES = """
CREATE TABLE IF NOT EXISTS session_turns (
    topic TEXT NOT NULL,
    app TEXT NOT NULL,
    session_id TEXT NOT NULL,
    request_id TEXT NOT NULL,
    event_time REAL NOT NULL,
    model TEXT NOT NULL,
    size INTEGER NOT NULL,
    judged REAL,
    turn BLOB,
    PRIMARY KEY (topic, app, session_id, request_id)
);
CREATE TABLE IF NOT EXISTS judged_sessions (
    topic TEXT NOT NULL,
    app TEXT NOT NULL,
    session_id TEXT NOT NULL,
    last REAL NOT NULL,
    counts BLOB NOT NULL,
    PRIMARY KEY (topic, app, session_id, last)
);
CREATE TABLE IF NOT EXISTS session_spans (
    topic TEXT NOT NULL,
    app TEXT NOT NULL,
    session_id TEXT NOT NULL,
    last REAL NOT NULL,
    open INTEGER NOT NULL,
    PRIMARY KEY (topic, app, session_id, last)
);
CREATE INDEX IF NOT EXISTS session_spans_by_last ON session_spans (topic, open, last);
CREATE TABLE IF NOT EXISTS session_spans_gap (gap REAL NOT NULL)
"""


# The reviewers' labels counted (pipeline/service/labels.py), added like the exemplars table, no
# schema bump: the id of each label whose verdict is in the `ragpulse_review_labels_total`
# counters, saved with the labels topic's offsets (in `offsets`, under that topic's name), so a
# label read again after a crash, or published twice, is counted once.
#
# With them, the record of the verdicts queued for review (read back from the review topic, its
# offsets in `offsets` too): a label of a verdict not in it is `unknown_event`. It keeps the
# newest QUEUED_KEPT verdicts (`seq` orders them), so it stays bounded.
_LABELS_TABLE = """
CREATE TABLE IF NOT EXISTS review_labels (
    label_id TEXT PRIMARY KEY,
    judge TEXT NOT NULL,
    version TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS review_queued (
    event_id TEXT NOT NULL,
    judge TEXT NOT NULL,
    version TEXT NOT NULL,
    seq INTEGER NOT NULL,
    PRIMARY KEY (event_id, judge)
);
CREATE INDEX IF NOT EXISTS review_queued_by_seq ON review_queued (seq)
"""
QUEUED_KEPT = 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class CallsSettled:
    """What a committed cycle does to the journal of answered calls (`answered_calls` ids):
    `counted` now have their tokens in the cycle's counters; `dropped` are done with."""

    counted: Sequence[int] = ()
    dropped: Sequence[int] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class CycleOutcome:
    """What one serve cycle saves, in one transaction (`StateStore.apply_cycle`).

    `windows`: the cycle's partial counts, added to the saved ones; `offsets`: where each
    partition it read goes on from; `counts`: its counter increments; windows with window_end
    <= `closed_before` (watermark - allowed lateness) are marked complete. `watermark` and
    `latest_event_times` (per partition) only ever move forward. `reset_offsets` are saved
    first and may move backwards: the partitions whose topic was recreated or truncated, at the
    offset the cycle went on from. `spans_added` are the cycle's spans of traces still
    pending, `traces_finished` the traces it assembled or dead-lettered (their saved spans are
    dropped, and the trace is remembered as finished at `finished_at` until
    `forget_finished_before` passes it). `hour_spend` replaces the judge budget's saved spend
    (older hours are dropped); `calls_settled` marks journaled calls as counted (their tokens
    are in `counts`) and deletes the ones done with. `sessions`: the cycle's changes to the
    saved conversations; the verdict counts of re-opened sessions (`retracted`) are taken out
    of their windows after `windows` is added. `labels`: the labels topic's offsets and the
    ids of the labels counted (their counts are in `counts`), the review topic's offsets and
    the verdicts queued there.
    """

    windows: Mapping[WindowKey, RatingCounts] = dataclasses.field(default_factory=dict)
    offsets: Mapping[int, int] = dataclasses.field(default_factory=dict)
    counts: Mapping[counting.CounterKey, float] = dataclasses.field(default_factory=dict)
    closed_before: float | None = None
    watermark: float | None = None
    latest_event_times: Mapping[int, float] = dataclasses.field(default_factory=dict)
    reset_offsets: Mapping[int, int] = dataclasses.field(default_factory=dict)
    spans_added: Sequence[Arrival] = ()
    traces_finished: Iterable[str] = ()
    finished_at: float = 0.0
    forget_finished_before: float | None = None
    hour_spend: HourSpend | None = None
    calls_settled: CallsSettled | None = None
    sessions: SessionChanges | None = None
    labels: LabelsTaken | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class LabelsTaken:
    """What a cycle took from the labels topic (pipeline/service/labels.py): where each of its
    partitions goes on from, and the ids of the labels it counted (`review_labels`: a label
    read again, or published twice, is known by its id and counted once)."""

    topic: str
    offsets: Mapping[int, int] = dataclasses.field(default_factory=dict)
    counted: Sequence[tuple[str, str, str]] = ()  # (label_id, judge, prompt version)
    # The review topic read with them: where it goes on from, and the verdicts queued there,
    # (event id, judge, prompt version), kept for the labels to come (`review_queued`).
    review_topic: str = ""
    review_offsets: Mapping[int, int] = dataclasses.field(default_factory=dict)
    queued: Sequence[tuple[str, str, str]] = ()


class StateError(RuntimeError):
    """The state file cannot be used (missing pieces, damaged, newer schema, not a file...),
    or a cycle contradicts it."""


def _labels_key(labels: counting.Labels) -> str:
    return json.dumps(dict(labels), sort_keys=True, separators=(",", ":"))


def _epoch(value: float | datetime) -> float:
    return value.timestamp() if isinstance(value, datetime) else float(value)


class StateStore:
    """The SQLite state file of one `serve` deployment (WAL mode; one writer)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not os.path.lexists(self.path):
            _create(self.path)
        self._db = _open_checked(self.path)
        self._db.execute(_EXEMPLARS_TABLE)
        for statement in _TRACE_SPANS_TABLE.split(";"):
            self._db.execute(statement)
        for statement in _MONEY_TABLES.split(";"):
            self._db.execute(statement)
        _add_pace_columns(self._db)
        for statement in _SESSION_TABLES.split(";"):
            self._db.execute(statement)
        for statement in _LABELS_TABLE.split(";"):
            self._db.execute(statement)

    @staticmethod
    def move_aside(path: str | Path) -> Path:
        """Rename an unusable state file (and its -wal / -shm files) to
        `FILE.corrupt-<UTC time>`; returns the new name. The next open starts fresh."""
        path = Path(path)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        target = path.with_name(f"{path.name}.corrupt-{stamp}")
        for suffix in ("-wal", "-shm"):
            side = path.with_name(path.name + suffix)
            if os.path.lexists(side):
                os.replace(side, target.with_name(target.name + suffix))
        os.replace(path, target)
        return target

    @property
    def schema_version(self) -> int:
        return int(self._db.execute("PRAGMA user_version").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> StateStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def apply_cycle(self, topic: str, outcome: CycleOutcome) -> dict[WindowKey, RatingCounts]:
        """Save one cycle's `outcome` on `topic` atomically; returns the windows this cycle
        completed, with their counts.

        Raises StateError, leaving the store unchanged, if an offset would move backwards, a
        partial lands in a window that is already complete (late events must be left out
        before this point), or a re-opened session's counts are taken out of a final window or
        would go below 0.
        """
        o = outcome
        db = self._db
        with write_transaction(db):
            for partition, next_offset in o.reset_offsets.items():
                db.execute(
                    "INSERT INTO offsets (topic, partition, next_offset) VALUES (?, ?, ?) "
                    "ON CONFLICT (topic, partition) DO UPDATE SET next_offset=excluded.next_offset",
                    (topic, partition, next_offset),
                )
            for part, c in o.windows.items():
                if min(c.yes, c.no, c.error, c.scored) < 0:
                    raise StateError(f"negative count in {part}: {c}")
                row = db.execute(
                    "SELECT complete FROM windows WHERE window_start=? AND window_end=? "
                    "AND judge=? AND version=? AND app=? AND model=?",
                    (part.window_start, part.window_end, part.judge, part.version, part.app,
                     part.model),
                ).fetchone()
                if row is not None and row["complete"]:
                    raise StateError(
                        f"counts for window {isoformat_utc(part.window_start)} ({part.judge}, "
                        f"{part.app}, {part.model}) which is already complete; late events must "
                        "be excluded before they are judged (ParseEvents(closed_before=...))"
                    )
                db.execute(
                    "INSERT INTO windows (window_start, window_end, judge, version, app, model, "
                    "yes, no, error, scored, score_milli) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (window_start, window_end, judge, version, app, model) DO UPDATE "
                    "SET yes = yes + excluded.yes, no = no + excluded.no, "
                    "error = error + excluded.error, scored = scored + excluded.scored, "
                    "score_milli = score_milli + excluded.score_milli",
                    (part.window_start, part.window_end, part.judge, part.version, part.app,
                     part.model, c.yes, c.no, c.error, c.scored, c.score_milli),
                )
            if o.sessions is not None:
                _save_sessions(db, topic, o.sessions)
            for partition, next_offset in o.offsets.items():
                saved = db.execute(
                    "SELECT next_offset FROM offsets WHERE topic=? AND partition=?",
                    (topic, partition),
                ).fetchone()
                if saved is not None and next_offset < saved["next_offset"]:
                    raise StateError(
                        f"{topic}/{partition}: offset would move back from "
                        f"{saved['next_offset']} to {next_offset}"
                    )
                db.execute(
                    "INSERT INTO offsets (topic, partition, next_offset) VALUES (?, ?, ?) "
                    "ON CONFLICT (topic, partition) DO UPDATE SET next_offset=excluded.next_offset",
                    (topic, partition, next_offset),
                )
            for (name, labels), amount in o.counts.items():
                if amount < 0:
                    raise StateError(f"counter {name} cannot decrease (by {amount})")
                db.execute(
                    "INSERT INTO counters (name, labels, value) VALUES (?, ?, ?) "
                    "ON CONFLICT (name, labels) DO UPDATE SET value = value + excluded.value",
                    (name, _labels_key(labels), amount),
                )
            if o.watermark is not None:
                db.execute(
                    "INSERT INTO watermarks (topic, watermark) VALUES (?, ?) ON CONFLICT (topic) "
                    "DO UPDATE SET watermark = max(coalesce(watermark, excluded.watermark), "
                    "excluded.watermark)",
                    (topic, o.watermark),
                )
            for partition, event_time in o.latest_event_times.items():
                db.execute(
                    "INSERT INTO partition_event_times (topic, partition, latest_event_time) "
                    "VALUES (?, ?, ?) ON CONFLICT (topic, partition) DO UPDATE SET "
                    "latest_event_time = max(latest_event_time, excluded.latest_event_time)",
                    (topic, partition, event_time),
                )
            finished = [(topic, t) for t in o.traces_finished]
            db.executemany("DELETE FROM trace_spans WHERE topic = ? AND trace_id = ?", finished)
            db.executemany(
                "INSERT OR REPLACE INTO finished_traces (topic, trace_id, finished_at) "
                "VALUES (?, ?, ?)",
                [(topic, t, o.finished_at) for _, t in finished],
            )
            if o.forget_finished_before is not None:
                db.execute(
                    "DELETE FROM finished_traces WHERE topic = ? AND finished_at < ?",
                    (topic, o.forget_finished_before),
                )
            db.executemany(
                "INSERT OR IGNORE INTO trace_spans (topic, trace_id, partition, position, "
                "span_id, seen, part) VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        topic,
                        a.part.trace_id,
                        a.partition or 0,
                        a.position,
                        a.part.span_id,
                        a.seen,
                        a.part.to_json(),
                    )
                    for a in o.spans_added
                ],
            )
            if o.hour_spend is not None:
                db.execute("DELETE FROM judge_spend WHERE hour <> ?", (o.hour_spend.hour,))
                h = o.hour_spend
                db.execute(
                    "INSERT OR REPLACE INTO judge_spend (hour, unit, spent, arrivals, "
                    "planned_at, planned_records) VALUES (?, ?, ?, ?, ?, ?)",
                    (h.hour, h.unit, h.spent, h.arrivals, h.planned_at, h.planned_records),
                )
            if o.labels is not None:
                _save_labels(db, o.labels)
            if o.calls_settled is not None:
                db.executemany(
                    "UPDATE answered_calls SET counted = 1 WHERE id = ?",
                    [(i,) for i in o.calls_settled.counted],
                )
                db.executemany(
                    "DELETE FROM answered_calls WHERE id = ?",
                    [(i,) for i in o.calls_settled.dropped],
                )
            completed: dict[WindowKey, RatingCounts] = {}
            if o.closed_before is not None:
                rows = db.execute(
                    "SELECT * FROM windows WHERE complete = 0 AND window_end <= ? "
                    "ORDER BY window_start, judge, version, app, model",
                    (o.closed_before,),
                ).fetchall()
                db.execute(
                    "UPDATE windows SET complete = 1 WHERE complete = 0 AND window_end <= ?",
                    (o.closed_before,),
                )
                completed = dict(_window(r) for r in rows)
        return completed

    def windows(
        self, judge: str | None = None, since: float | datetime | None = None
    ) -> list[dict[str, Any]]:
        """Saved windows as `windows.jsonl` rows plus `complete`, oldest first.

        `since` keeps windows starting at or after it (epoch seconds or an aware datetime).
        """
        sql = "SELECT * FROM windows WHERE 1=1"
        args: list[Any] = []
        if judge is not None:
            sql += " AND judge = ?"
            args.append(judge)
        if since is not None:
            sql += " AND window_start >= ?"
            args.append(_epoch(since))
        sql += " ORDER BY window_start, judge, version, app, model"
        return [_row(r, complete=bool(r["complete"])) for r in self._db.execute(sql, args)]

    def prune_windows(self, ended_before: float) -> int:
        """Delete complete windows that ended before `ended_before`; returns how many.

        Counters are cumulative and kept whole, so no `_total` series changes; only the
        history `ragpulse windows` can print gets shorter. The latest complete window of each
        series is always kept, so /metrics still shows it after a long quiet spell.
        """
        with self._db:
            cursor = self._db.execute(
                "DELETE FROM windows WHERE complete = 1 AND window_end < ? AND EXISTS ("
                "SELECT 1 FROM windows newer WHERE newer.complete = 1 "
                "AND newer.judge = windows.judge AND newer.app = windows.app "
                "AND newer.model = windows.model AND newer.window_end > windows.window_end)",
                (ended_before,),
            )
        return cursor.rowcount

    def current_windows(
        self,
    ) -> tuple[dict[WindowKey, RatingCounts], dict[WindowKey, RatingCounts]]:
        """What /metrics shows: the latest complete window of each (judge, app, model) series
        (one row per prompt version in it), and every open one.

        Reads O(series) rows however long the service has run, unlike `windows()`.
        """
        sql = (
            "SELECT * FROM windows WHERE complete = 0 UNION ALL "
            "SELECT w.* FROM windows w JOIN (SELECT judge, app, model, MAX(window_end) AS e "
            "FROM windows WHERE complete = 1 GROUP BY judge, app, model) m "
            "ON w.complete = 1 AND w.judge = m.judge AND w.app = m.app AND w.model = m.model "
            "AND w.window_end = m.e"
        )
        complete: dict[WindowKey, RatingCounts] = {}
        in_progress: dict[WindowKey, RatingCounts] = {}
        for r in self._db.execute(sql):
            key, c = _window(r)
            (complete if r["complete"] else in_progress)[key] = c
        return complete, in_progress

    def offsets(self, topic: str) -> dict[int, int]:
        """Next offset to read per partition of `topic` (partitions never read are absent)."""
        rows = self._db.execute(
            "SELECT partition, next_offset FROM offsets WHERE topic = ?", (topic,)
        )
        return {int(r["partition"]): int(r["next_offset"]) for r in rows}

    def labels_counted(self, label_ids: Iterable[str]) -> set[str]:
        """Which of `label_ids` are counted already."""
        ids = list(label_ids)
        found: set[str] = set()
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            rows = self._db.execute(
                "SELECT label_id FROM review_labels WHERE label_id IN "
                f"({','.join('?' * len(chunk))})", chunk,
            )
            found.update(r["label_id"] for r in rows)
        return found

    def queued_versions(
        self, keys: Iterable[tuple[str, str]]
    ) -> dict[tuple[str, str], str]:
        """The prompt version of each (event id, judge) of `keys` queued for review, among the
        newest QUEUED_KEPT queued verdicts."""
        found: dict[tuple[str, str], str] = {}
        for event_id, judge in set(keys):
            row = self._db.execute(
                "SELECT version FROM review_queued WHERE event_id=? AND judge=?",
                (event_id, judge),
            ).fetchone()
            if row is not None:
                found[(event_id, judge)] = row["version"]
        return found

    def counters(self) -> counting.Counts:
        """Cumulative counter values, to seed Prometheus counters at start-up."""
        rows = self._db.execute("SELECT name, labels, value FROM counters ORDER BY name, labels")
        return Counter(
            {counting.key(r["name"], **json.loads(r["labels"])): r["value"] for r in rows}
        )

    def save_exemplars(
        self, exemplars: Mapping[counting.CounterKey, counting.FailingExample]
    ) -> None:
        """Keep, per counter series, the failing answer with the latest event time.

        Saved after the cycle's own transaction: they are pointers for people, not counts, and
        a crash in between loses only that cycle's pointers.
        """
        rows = [
            (name, _labels_key(labels), e.request_id, e.timestamp)
            for (name, labels), e in exemplars.items()
        ]
        if not rows:
            return
        with write_transaction(self._db):
            self._db.executemany(
                "INSERT INTO exemplars (name, labels, request_id, timestamp) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (name, labels) DO UPDATE SET request_id = excluded.request_id, "
                "timestamp = excluded.timestamp WHERE (excluded.timestamp, excluded.request_id) "
                "> (exemplars.timestamp, exemplars.request_id)",
                rows,
            )

    def exemplars(self) -> dict[counting.CounterKey, counting.FailingExample]:
        """The saved exemplar of every failing verdict series."""
        rows = self._db.execute("SELECT * FROM exemplars ORDER BY name, labels")
        return {
            counting.key(r["name"], **json.loads(r["labels"])): counting.FailingExample(
                r["request_id"], r["timestamp"]
            )
            for r in rows
        }

    def watermark(self, topic: str) -> float | None:
        row = self._db.execute(
            "SELECT watermark FROM watermarks WHERE topic = ?", (topic,)
        ).fetchone()
        return None if row is None else row["watermark"]

    def pending_spans(self, topic: str) -> list[Arrival]:
        """The saved spans of traces still being assembled (see `apply_cycle`)."""
        rows = self._db.execute(
            "SELECT partition, position, seen, part FROM trace_spans WHERE topic = ?", (topic,)
        )
        return [
            Arrival(SpanPart.from_json(r["part"]), r["partition"], r["position"], r["seen"])
            for r in rows
        ]

    def finished_traces(self, topic: str, trace_ids: Iterable[str]) -> set[str]:
        """Those of `trace_ids` that were assembled or refused lately (see `apply_cycle`)."""
        ids = list(trace_ids)
        found: set[str] = set()
        for i in range(0, len(ids), 500):  # SQLite's limit on bound parameters is 999+
            chunk = ids[i : i + 500]
            rows = self._db.execute(
                "SELECT trace_id FROM finished_traces WHERE topic = ? AND trace_id IN "
                f"({','.join('?' * len(chunk))})",
                (topic, *chunk),
            )
            found.update(r["trace_id"] for r in rows)
        return found

    def pending_trace_count(self, topic: str) -> int:
        """How many traces have spans saved, waiting to be assembled."""
        row = self._db.execute(
            "SELECT COUNT(DISTINCT trace_id) FROM trace_spans WHERE topic = ?", (topic,)
        ).fetchone()
        return int(row[0])

    def session_turns(
        self, topic: str, apps_sessions: Iterable[tuple[str, str]] | None = None
    ) -> list[StoredTurn]:
        """The saved turns of open sessions and of judged ones a late turn may still join: all
        of them, or those of these (app, session id)s (by the table's key)."""
        columns = (
            "SELECT app, session_id, request_id, event_time, model, size, judged, "
            "turn IS NOT NULL AS turn FROM session_turns WHERE topic = ?"
        )
        if apps_sessions is None:
            rows: Iterable[sqlite3.Row] = self._db.execute(columns, (topic,))
        else:
            rows = (
                r
                for app, session_id in set(apps_sessions)
                for r in self._db.execute(
                    columns + " AND app = ? AND session_id = ?", (topic, app, session_id)
                )
            )
        return [
            StoredTurn(
                r["app"], r["session_id"], r["request_id"], r["event_time"], r["model"],
                r["size"], bool(r["turn"]), r["judged"],
            )
            for r in rows
        ]

    def index_sessions(self, gap: float) -> bool:
        """Make `session_spans` the session windows of the saved turns under `gap`: kept as it
        is if it was built with that gap, else built again from every saved turn, once (a file
        that predates it, or serve started with another --session-gap). True if it was built."""
        db = self._db
        row = db.execute("SELECT gap FROM session_spans_gap").fetchone()
        if row is not None and row[0] == gap:
            return False
        with write_transaction(db):
            db.execute("DELETE FROM session_spans")
            db.execute("DELETE FROM session_spans_gap")
            db.execute("INSERT INTO session_spans_gap (gap) VALUES (?)", (gap,))
            topics = [r[0] for r in db.execute("SELECT DISTINCT topic FROM session_turns")]
            for topic in topics:
                db.executemany(
                    "INSERT INTO session_spans (topic, app, session_id, last, open) "
                    "VALUES (?, ?, ?, ?, ?)",
                    [
                        (topic, app, session_id, span.last, span.open)
                        for (app, session_id), spans in spans_of(
                            self.session_turns(topic), gap
                        ).items()
                        for span in spans
                    ],
                )
        return True

    def open_session_count(self, topic: str) -> int:
        """How many sessions are open (not judged yet)."""
        row = self._db.execute(
            "SELECT COUNT(*) FROM session_spans WHERE topic = ? AND open = 1", (topic,)
        ).fetchone()
        return int(row[0])

    def open_sessions_by_last(self, topic: str) -> Iterator[tuple[str, str, float]]:
        """The open sessions as (app, session id, last turn's time), earliest last turn first,
        read lazily from the index: a caller takes only the few it needs."""
        cursor = self._db.execute(
            "SELECT app, session_id, last FROM session_spans WHERE topic = ? AND open = 1 "
            "ORDER BY last, app, session_id",
            (topic,),
        )
        for r in cursor:
            yield r["app"], r["session_id"], r["last"]

    def judged_sessions_before(self, topic: str, last_before: float) -> set[tuple[str, str]]:
        """The (app, session id)s of judged sessions whose last turn is before `last_before`."""
        return {
            (r["app"], r["session_id"])
            for r in self._db.execute(
                "SELECT app, session_id FROM session_spans WHERE topic = ? AND open = 0 "
                "AND last < ?",
                (topic, last_before),
            )
        }

    def session_texts(
        self, topic: str, turns: Iterable[StoredTurn]
    ) -> dict[tuple[str, str, str], SessionTurn]:
        """The kept text of `turns` (to judge their sessions)."""
        out: dict[tuple[str, str, str], SessionTurn] = {}
        for t in turns:
            row = self._db.execute(
                "SELECT turn FROM session_turns WHERE topic = ? AND app = ? AND session_id = ? "
                "AND request_id = ? AND turn IS NOT NULL",
                (topic, t.app, t.session_id, t.request_id),
            ).fetchone()
            if row is not None:
                request_id, event_time, question, answer, feedback = json.loads(row["turn"])
                out[t.key] = SessionTurn(request_id, event_time, question, answer, feedback)
        return out

    def judged_sessions(
        self, topic: str, apps_sessions: Iterable[tuple[str, str]]
    ) -> dict[SessionKey, dict[WindowKey, RatingCounts]]:
        """The saved verdict counts per window of the judged sessions of these
        (app, session id)s."""
        out: dict[SessionKey, dict[WindowKey, RatingCounts]] = {}
        for app, session_id in set(apps_sessions):
            for r in self._db.execute(
                "SELECT last, counts FROM judged_sessions WHERE topic = ? AND app = ? "
                "AND session_id = ?",
                (topic, app, session_id),
            ):
                out[(app, session_id, r["last"])] = {
                    WindowKey(ws, we, judge, a, model, version): RatingCounts(*c)
                    for ws, we, judge, a, model, version, *c in json.loads(r["counts"])
                }
        return out

    def hour_spend(self) -> HourSpend | None:
        """The judge budget's saved spend (of the clock hour of the last cycle that had one)."""
        row = self._db.execute(
            "SELECT hour, unit, spent, arrivals, planned_at, planned_records FROM judge_spend"
        ).fetchone()
        if row is None:
            return None
        return HourSpend(
            int(row[0]), row[1], float(row[2]),
            arrivals=row[3], planned_at=row[4], planned_records=row[5],
        )

    def latest_event_times(self, topic: str) -> dict[int, float]:
        """Latest event time read per partition (the watermark's inputs)."""
        rows = self._db.execute(
            "SELECT partition, latest_event_time FROM partition_event_times WHERE topic = ?",
            (topic,),
        )
        return {int(r["partition"]): float(r["latest_event_time"]) for r in rows}


@contextlib.contextmanager
def write_transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One write transaction on `db` (connected with isolation_level=None): the write lock is
    taken at the start (BEGIN IMMEDIATE: a second writer waits there, not at the commit), the
    block's writes are committed when it ends and rolled back if it raises."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise


def _connect(path: Path) -> sqlite3.Connection:
    # isolation_level=None: transactions are opened explicitly with BEGIN IMMEDIATE.
    db = sqlite3.connect(path, isolation_level=None, timeout=30)
    db.row_factory = sqlite3.Row
    return db


def _create(path: Path) -> None:
    """Build an empty state file of the current schema at `path`, atomically."""
    tmp = path.with_name(f".{path.name}.new-{os.getpid()}")
    for leftover in (tmp, tmp.with_name(tmp.name + "-journal")):
        if leftover.exists():
            leftover.unlink()
    try:
        db = _connect(tmp)
    except sqlite3.Error as exc:
        raise StateError(f"state file {path} cannot be created: {exc}") from None
    try:
        with write_transaction(db):
            # Statement by statement: executescript() would commit the open transaction first.
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    finally:
        db.close()
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a power cut
    finally:
        os.close(dir_fd)


def _open_checked(path: Path) -> sqlite3.Connection:
    """Open an existing state file, or raise StateError saying why it cannot be used.

    SQLite opens a 0-byte file, or any file at all, without complaint and fails only at the
    first query (or, for an empty file, quietly treats it as a new database): each way a file
    can be unusable is checked here, before anything is read from it or written to it.
    """

    def refuse(why: str) -> StateError:
        return StateError(f"state file {path} {why}; {RECOVERY_HINT}")

    if path.is_dir():
        raise refuse("is a directory, not a file")
    try:
        with open(path, "rb") as f:
            header = f.read(len(_SQLITE_HEADER))
    except OSError as exc:
        raise refuse(f"cannot be read ({exc.strerror or exc})") from None
    if not header:
        raise refuse("is empty (0 bytes)")
    if header != _SQLITE_HEADER:
        raise refuse("is not a SQLite database (garbage, or another kind of file)")
    db: sqlite3.Connection | None = None
    try:
        db = _connect(path)
        version = int(db.execute("PRAGMA user_version").fetchone()[0])
        if version > SCHEMA_VERSION:
            raise StateError(
                f"state file {path} was written by a newer ragpulse (schema {version}, this one "
                f"reads up to {SCHEMA_VERSION}); upgrade ragpulse, or {RECOVERY_HINT}"
            )
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if version < 1 or not tables >= _TABLES:
            raise refuse("is a SQLite database but not a ragpulse state file")
        problems = [r[0] for r in db.execute("PRAGMA quick_check")]
        if problems != ["ok"]:
            raise refuse(f"is damaged (SQLite integrity check: {problems[0]})")
        if version == 1:
            _migrate_to_2(db)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
    except sqlite3.Error as exc:
        if db is not None:
            db.close()
        raise refuse(f"is damaged or truncated ({exc})") from None
    except StateError:
        if db is not None:
            db.close()
        raise
    return db


def _save_sessions(db: sqlite3.Connection, topic: str, changes: SessionChanges) -> None:
    """`StateStore.apply_cycle`'s part for the conversations (inside its transaction)."""
    for part, c in changes.retracted.items():
        row = db.execute(
            "SELECT * FROM windows WHERE window_start=? AND window_end=? AND judge=? "
            "AND version=? AND app=? AND model=?",
            (part.window_start, part.window_end, part.judge, part.version, part.app, part.model),
        ).fetchone()
        left = None if row is None else (
            row["yes"] - c.yes, row["no"] - c.no, row["error"] - c.error,
            row["scored"] - c.scored, row["score_milli"] - c.score_milli,
        )
        if left is None or row["complete"] or min(left[:4]) < 0:
            raise StateError(
                f"a re-opened session's counts cannot be taken out of window "
                f"{isoformat_utc(part.window_start)} ({part.judge}, {part.app}, {part.model}): "
                f"{'it is final' if row is not None and row['complete'] else 'not counted'}"
            )
        db.execute(
            "UPDATE windows SET yes=?, no=?, error=?, scored=?, score_milli=? "
            "WHERE window_start=? AND window_end=? AND judge=? AND version=? AND app=? "
            "AND model=?",
            (*left, part.window_start, part.window_end, part.judge, part.version, part.app,
             part.model),
        )
    db.executemany(
        "INSERT INTO session_turns (topic, app, session_id, request_id, event_time, model, "
        "size, judged, turn) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        [
            (topic, t.app, t.session_id, t.request_id, t.event_time, t.model, t.size, t.judged,
             None if text is None or not t.kept else json.dumps(dataclasses.astuple(text)))
            for t, text in changes.added
        ],
    )
    db.executemany(
        "UPDATE session_turns SET judged = ?, turn = CASE WHEN ? THEN turn END "
        "WHERE topic = ? AND app = ? AND session_id = ? AND request_id = ?",
        [(t.judged, t.kept, topic, t.app, t.session_id, t.request_id) for t in changes.updated],
    )
    db.executemany(
        "DELETE FROM session_turns WHERE topic = ? AND app = ? AND session_id = ? "
        "AND request_id = ?",
        [(topic, *k) for k in changes.forgotten],
    )
    db.executemany(
        "DELETE FROM judged_sessions WHERE topic = ? AND app = ? AND session_id = ? AND last = ?",
        [(topic, *k) for k in changes.judged_removed],
    )
    db.executemany(
        "DELETE FROM session_spans WHERE topic = ? AND app = ? AND session_id = ?",
        [(topic, *k) for k in changes.spans],
    )
    db.executemany(
        "INSERT INTO session_spans (topic, app, session_id, last, open) VALUES (?, ?, ?, ?, ?)",
        [
            (topic, app, session_id, span.last, span.open)
            for (app, session_id), spans in changes.spans.items()
            for span in spans
        ],
    )
    db.executemany(
        "INSERT OR REPLACE INTO judged_sessions (topic, app, session_id, last, counts) "
        "VALUES (?, ?, ?, ?, ?)",
        [
            (topic, *k, json.dumps([
                [w.window_start, w.window_end, w.judge, w.app, w.model, w.version,
                 *dataclasses.astuple(c)]
                for w, c in counts.items()
            ]))
            for k, counts in changes.judged_added.items()
        ],
    )


def _save_labels(db: sqlite3.Connection, taken: LabelsTaken) -> None:
    """`StateStore.apply_cycle`'s part for the labels topic (inside its transaction). An
    offset may move back (the labels topic recreated): the labels read again are known by their
    ids."""
    offsets = [(taken.topic, p, o) for p, o in taken.offsets.items()]
    offsets += [(taken.review_topic, p, o) for p, o in taken.review_offsets.items()]
    for topic, partition, next_offset in offsets:
        db.execute(
            "INSERT INTO offsets (topic, partition, next_offset) VALUES (?, ?, ?) "
            "ON CONFLICT (topic, partition) DO UPDATE SET next_offset=excluded.next_offset",
            (topic, partition, next_offset),
        )
    if taken.queued:
        (last,) = db.execute("SELECT COALESCE(MAX(seq), 0) FROM review_queued").fetchone()
        db.executemany(
            "INSERT INTO review_queued (event_id, judge, version, seq) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (event_id, judge) DO UPDATE SET version=excluded.version, "
            "seq=excluded.seq",
            [(e, j, v, last + i) for i, (e, j, v) in enumerate(taken.queued, 1)],
        )
        db.execute("DELETE FROM review_queued WHERE seq <= ?",
                   (last + len(taken.queued) - QUEUED_KEPT,))
    try:
        db.executemany(
            "INSERT INTO review_labels (label_id, judge, version) VALUES (?, ?, ?)",
            list(taken.counted),
        )
    except sqlite3.IntegrityError:
        raise StateError("a label already counted would be counted again") from None


def _add_pace_columns(db: sqlite3.Connection) -> None:
    """Files from before the budget's pace was saved get its columns (empty: no pace known,
    as before); an older ragpulse reads and writes the other columns as it did."""
    columns = {r[1] for r in db.execute("PRAGMA table_info(judge_spend)")}
    with write_transaction(db):
        for name, kind in (
            ("arrivals", "REAL"), ("planned_at", "REAL"), ("planned_records", "INTEGER")
        ):
            if name not in columns:
                db.execute(f"ALTER TABLE judge_spend ADD COLUMN {name} {kind}")


def _migrate_to_2(db: sqlite3.Connection) -> None:
    """Schema 1 to 2, in one transaction: the windows table is rebuilt with the `version`
    column in its key (SQLite cannot change a key in place); old windows get version ""."""
    columns = "window_start, window_end, judge, app, model, yes, no, error, complete"
    with write_transaction(db):
        db.execute("DROP INDEX IF EXISTS windows_open")
        db.execute("DROP INDEX IF EXISTS windows_series")
        db.execute("ALTER TABLE windows RENAME TO windows_v1")
        for statement in _WINDOWS_SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        db.execute(f"INSERT INTO windows ({columns}) SELECT {columns} FROM windows_v1")
        db.execute("DROP TABLE windows_v1")
        db.execute("PRAGMA user_version=2")


def _window(r: sqlite3.Row) -> tuple[WindowKey, RatingCounts]:
    key = WindowKey(
        r["window_start"], r["window_end"], r["judge"], r["app"], r["model"], r["version"]
    )
    counts = RatingCounts(
        int(r["yes"]), int(r["no"]), int(r["error"]), int(r["scored"]), int(r["score_milli"])
    )
    return key, counts


def _row(r: sqlite3.Row, *, complete: bool) -> dict[str, Any]:
    return {**window_row(*_window(r)), "complete": complete}


class StateLock:
    """An exclusive lock on a state file, held by one `ragpulse serve` for its whole life.

    Two processes given one --state would both read the same partitions and save over each
    other's offsets (1,200 of 1,500 events counted twice, issue 19); the second is refused.
    The lock is `flock` on FILE.lock (SQLite's own locks are per transaction, and a lock on
    the database file itself would not survive --state-reset moving it aside); the kernel
    drops it when the process dies, however it dies. The lock file holds the id of the
    process that holds it, so the next holder knows whose Kafka commits were its predecessor's.
    """

    def __init__(self, path: str | Path, owner: str) -> None:
        """Take the lock for `owner` (an id); StateError when another process holds it."""
        import fcntl  # POSIX only, like the rest of serve's deployment

        self.path = Path(f"{path}.lock")
        try:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StateError(
                f"state file {path}: cannot create its lock file: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._fd, 512, 0).decode("utf-8", "replace").strip()
            os.close(self._fd)
            raise StateError(
                f"state file {path} is in use by another ragpulse serve ({holder or 'unknown'}, "
                f"lock {self.path}): give each instance its own --state"
            ) from None
        before = os.pread(self._fd, 512, 0).decode("utf-8", "replace").strip()
        self.previous_owner: str | None = before or None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, owner.encode("utf-8"), 0)
        os.fsync(self._fd)

    def release(self) -> None:
        os.close(self._fd)  # closing the last descriptor drops the flock
