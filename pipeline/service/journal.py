"""The journal of answered judge calls: what serve has paid for is never paid for, nor lost, twice.

A cycle's counts reach the state file only when the cycle commits, but its judge calls are paid
as they are answered. Without this journal a crash (or a failed cycle) before the commit threw
away the answers of every call made so far: the replayed cycle paid for them again, and the
tokens of the first payment were never counted (with 32 SIGKILLs, 77 % more calls than needed;
`ragpulse_judge_tokens_total` covered 7,280 of 12,917 paid calls).

So each answered call (a verdict that cost tokens, or a yes/no from the endpoint) is written to
the `answered_calls` table of the state file as it arrives, by a writer thread, one transaction
(fsynced: WAL, synchronous=FULL) per batch of arrivals, under its judge, judge version and input
digest (the verdict cache's key, `judges.verdict_cache`). The judge panel asks the journal before
calling (`take`): a yes/no answered by an earlier process, or by an earlier attempt of this
cycle, is taken instead of paying again.

Tokens are counted from the journal, not from the cycle's verdicts: every cycle that commits
adds the tokens of every journaled call not counted yet to its counters, and marks those calls
counted in the same transaction (`settle`, `CycleOutcome.calls_settled`). Each
paid call's tokens are therefore counted exactly once, whichever cycle used its verdict, or
none did (a call started ahead for events a later cycle judges, a canary, an error reply).

A committed cycle drops the calls it took and those counted at an earlier commit; a yes/no
counted now but not taken stays one more cycle (a call started ahead for the next cycle), then
goes: the journal holds at most about two cycles' calls. A taken call counted already is given
as a cached verdict (no call, no tokens), like a verdict cache hit.

The journal keeps rationales and error messages as verdict rows do (--store-text: redacted by
default), since they can quote the answer: a verdict taken from it carries them in that form.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import queue
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any

from ragpulse.judges.base import Verdict
from ragpulse.judges.redaction import TextPolicy
from ragpulse.judges.verdict_cache import CacheKey, as_cached
from ragpulse.pipeline.costs.budget import TOKENS
from ragpulse.pipeline.costs.controls import Charge, CostControl, CycleStart
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.service.state import CallsSettled, write_transaction

log = logging.getLogger(__name__)

__all__ = ["AnsweredCalls", "Settlement", "pays"]

# The attempt of calls answered by an earlier process.
_EARLIER_PROCESS = -1


def pays(verdict: Verdict) -> bool:
    """Whether `verdict` stands for an answered, paid call: it cost tokens, or it is the
    endpoint's yes or no (not taken from a cache, not computed from other verdicts)."""
    if verdict.cached or verdict.derived:
        return False
    tokens = verdict.prompt_tokens + verdict.completion_tokens
    return tokens > 0 or verdict.rating in ("yes", "no")


@dataclasses.dataclass(frozen=True, slots=True)
class Settlement:
    """What a cycle's commit does with the journal: `tokens` are the counter increments of the
    calls it counts, `calls` the journal rows it marks counted or drops."""

    tokens: counting.Counts
    calls: CallsSettled


@dataclasses.dataclass(slots=True)
class _Call:
    key: CacheKey | None  # None: not to be taken again (a canary's)
    verdict: Verdict
    attempt: int
    counted: bool

    @property
    def reusable(self) -> bool:
        return self.key is not None and self.verdict.rating in ("yes", "no")


class AnsweredCalls(CostControl):
    """The journal of one state file; `answered` and `take` are called by the judge panel
    (any thread), `begin_attempt`, `settle` and `settled` by the serve loop, through its
    hooks as a cost control (`pipeline.costs.controls`): it counts the tokens of paid calls
    itself, once per call, and settles them in the cycle's transaction."""

    counts_tokens = True

    def __init__(self, state_path: str | Path, policy: TextPolicy | None = None) -> None:
        """`policy`: how rationales and error messages are kept (None: in full)."""
        # Its own connection, to the file StateStore has opened and given the table: the writer
        # thread's, which must not wait on the loop's (one transaction at a time either way).
        self._db = sqlite3.connect(
            state_path, isolation_level=None, timeout=30, check_same_thread=False
        )
        self._db.execute("PRAGMA synchronous=FULL")
        self._store = "full" if policy is None else policy.store_text
        self._redact = None if policy is None else policy.redactor().redact
        self._lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._by_key: dict[CacheKey, list[int]] = {}
        self._taken: set[int] = set()
        self._written: set[int] = set()
        self._attempt = 0
        self._next_id = 1
        self._settlement: Settlement | None = None  # the cycle in flight's, once charged
        self._load()
        self._queue: queue.Queue[tuple[int, _Call] | None] = queue.Queue()
        self._writer = threading.Thread(
            target=self._write_forever, name="ragpulse-call-journal", daemon=True
        )
        self._writer.start()

    def __len__(self) -> int:
        with self._lock:
            return len(self._calls)

    # ----- the judge panel's side ------------------------------------------------------------
    def answered(self, key: CacheKey | None, verdict: Verdict) -> None:
        """Journal a call's verdict as it arrives (when it was paid for, see `pays`)."""
        if not pays(verdict):
            return
        with self._lock:
            call_id = self._next_id
            self._next_id += 1
            call = _Call(key, verdict, self._attempt, counted=False)
            self._calls[call_id] = call
            if call.reusable and key is not None:
                self._by_key.setdefault(key, []).append(call_id)
        self._queue.put((call_id, call))

    def take(self, key: CacheKey) -> Verdict | None:
        """A yes/no answered for `key` and not taken yet in this attempt: answered by an
        earlier attempt and not committed (a call to count, once its tokens are settled), or
        by an earlier process (then, if a committed cycle counted it already, as a cached
        verdict). Within one process the journal is no cache: the verdict cache is, when it
        is on (--judge-cache-size)."""
        with self._lock:
            for call_id in self._by_key.get(key, ()):
                if self._takeable(call_id):
                    self._taken.add(call_id)
                    call = self._calls[call_id]
                    return as_cached(call.verdict) if call.counted else call.verdict
        return None

    def holds(self, key: CacheKey) -> bool:
        """Whether a verdict for `key` could be taken (calls started ahead skip those)."""
        with self._lock:
            return any(self._takeable(i) for i in self._by_key.get(key, ()))

    def _takeable(self, call_id: int) -> bool:
        call = self._calls[call_id]
        return (
            call.attempt < self._attempt
            and call_id not in self._taken
            and (not call.counted or call.attempt == _EARLIER_PROCESS)
        )

    # ----- the serve loop's side -------------------------------------------------------------
    def begin_attempt(self) -> None:
        """A cycle (or its retry) starts: what was answered before it may be taken, once."""
        with self._lock:
            self._attempt += 1
            self._taken.clear()

    def settle(self) -> Settlement:
        """The journal's part of the commit of the cycle in flight: every call written and not
        counted is counted; the calls taken, those counted before, and those that cannot be
        taken again are dropped. Waits for the writer first: a call is settled only once it
        is in the file (else a crash could bring it back uncounted)."""
        self._queue.join()
        tokens: counting.Counts = Counter()
        counted: list[int] = []
        dropped: list[int] = []
        with self._lock:
            for call_id, call in self._calls.items():
                if call_id not in self._written:
                    continue
                if not call.counted:
                    _add_tokens(tokens, call.verdict)
                if call.counted or call_id in self._taken or not call.reusable:
                    dropped.append(call_id)
                else:
                    counted.append(call_id)
        return Settlement(tokens, CallsSettled(tuple(counted), tuple(dropped)))

    def settled(self, settlement: Settlement) -> None:
        """The cycle committed `settlement`: the same in memory."""
        with self._lock:
            for call_id in settlement.calls.counted:
                self._calls[call_id].counted = True
            for call_id in settlement.calls.dropped:
                call = self._calls.pop(call_id)
                self._written.discard(call_id)
                if call.reusable and call.key is not None:
                    ids = self._by_key[call.key]
                    ids.remove(call_id)
                    if not ids:
                        del self._by_key[call.key]

    # ----- a serve cost control (pipeline.costs.controls) ----------------------------------
    def cycle_started(self, cycle: CycleStart) -> None:
        self.begin_attempt()

    def charge(self, paid: counting.Counts) -> Charge:
        self._settlement = settlement = self.settle()
        return Charge(
            counting.merge(paid, settlement.tokens),
            Counter(settlement.tokens),
            {"calls_settled": settlement.calls},
        )

    def committed(self) -> None:
        if self._settlement is not None:
            self.settled(self._settlement)
            self._settlement = None

    def close(self) -> None:
        self._queue.put(None)
        self._writer.join()
        self._db.close()

    # ----- the file --------------------------------------------------------------------------
    def _load(self) -> None:
        """The calls an earlier process answered and no committed cycle dropped."""
        rows = self._db.execute(
            "SELECT id, judge, version, digest, verdict, counted FROM answered_calls ORDER BY id"
        ).fetchall()
        bad = 0
        for call_id, judge, version, digest, text, counted in rows:
            self._next_id = max(self._next_id, call_id + 1)
            try:
                verdict = _decode(text)
            except (TypeError, ValueError):
                bad += 1  # written by another ragpulse version: its tokens cannot be read
                continue
            key = None if digest is None else (judge, version, bytes(digest))
            call = _Call(key, verdict, _EARLIER_PROCESS, bool(counted))
            self._calls[call_id] = call
            self._written.add(call_id)
            if call.reusable and key is not None:
                self._by_key.setdefault(key, []).append(call_id)
        if rows:
            log.info(
                "%d judge calls answered before the restart and not yet settled are taken "
                "from the state file instead of being paid again%s",
                len(rows) - bad,
                f" ({bad} unreadable rows left in place)" if bad else "",
            )

    def _write_forever(self) -> None:
        while True:
            batch = [self._queue.get()]
            while True:
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            calls = [item for item in batch if item is not None]
            try:
                if calls:
                    self._write(calls)
            except Exception as exc:  # the writer must live on, or settle() would wait forever
                # Those calls stay in memory (taken, and counted while this process lives),
                # but a crash now would lose them: say so, and go on.
                log.error("could not journal %d answered judge calls: %s", len(calls), exc)
            finally:
                for _ in batch:
                    self._queue.task_done()
            if len(calls) < len(batch):
                return

    def _write(self, calls: list[tuple[int, _Call]]) -> None:
        rows = [
            (
                call_id,
                call.verdict.judge if call.key is None else call.key[0],
                "" if call.key is None else call.key[1],
                None if call.key is None else call.key[2],
                _encode(self._stored(call.verdict)),
            )
            for call_id, call in calls
        ]
        with write_transaction(self._db):
            self._db.executemany(
                "INSERT INTO answered_calls (id, judge, version, digest, verdict) "
                "VALUES (?, ?, ?, ?, ?)",
                rows,
            )
        with self._lock:
            self._written.update(call_id for call_id, _ in calls)


    def _stored(self, verdict: Verdict) -> Verdict:
        """`verdict` with its text as --store-text keeps it (pipeline.formats.verdict_rows)."""
        if self._store == "full" or self._redact is None:
            return verdict
        if self._store == "none":
            error = verdict.error_message
            return dataclasses.replace(
                verdict,
                rationale=None,
                error_message=None if error is None
                else f"{verdict.error_cause or 'error'} (message not stored: --store-text none)",
            )
        redact = self._redact
        return dataclasses.replace(
            verdict,
            rationale=redact(verdict.rationale) if verdict.rationale else verdict.rationale,
            error_message=(
                redact(verdict.error_message) if verdict.error_message else verdict.error_message
            ),
        )


def _add_tokens(tokens: counting.Counts, verdict: Verdict) -> None:
    """The token counter increments of one paid call, as the judge stage counts them."""
    for kind, n in (
        ("prompt", verdict.prompt_tokens),
        ("completion", verdict.completion_tokens),
        ("cached_prompt", verdict.cached_prompt_tokens),
    ):
        if n:
            tokens[counting.key(TOKENS, judge=verdict.judge, kind=kind)] += n


def _encode(verdict: Verdict) -> str:
    return json.dumps(dataclasses.asdict(verdict), separators=(",", ":"))


def _decode(text: str) -> Verdict:
    return _verdict(json.loads(text))


def _verdict(fields: dict[str, Any]) -> Verdict:
    """A verdict from `dataclasses.asdict`'s fields (lists back to tuples, parts nested)."""
    fields["missing"] = tuple(fields.get("missing", ()))
    fields["votes"] = tuple(fields.get("votes", ()))
    fields["parts"] = tuple(_verdict(part) for part in fields.get("parts", ()))
    return Verdict(**fields)
