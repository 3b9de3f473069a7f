"""The judge panel: runs every judge over batches of inputs on an event loop of its own, with
the verdict cache, composites and serve's journal of answered calls around the judges' calls.

`judges.base` holds the types the panel moves (JudgeInput, Verdict, the Judge protocol); this
module is the runtime that calls them, so the types never import the cache or the composites.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import logging
import threading
import traceback
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Protocol

from ragpulse.judges.base import (
    Judge,
    JudgeInput,
    SyncJudge,
    ThrottledLog,
    Verdict,
    judge_version,
    prompt_version,
)
from ragpulse.judges.composite import Composite, composite_graders
from ragpulse.judges.verdict_cache import CacheKey, VerdictCache, as_cached, input_digest

log = logging.getLogger(__name__)

# The loop time (`loop.time()`) by which the batch being judged must be finished, or None. Set
# by `JudgePanel` for the tasks of one batch; read by judges that wait on I/O (the LLM endpoint)
# so that they can stop retrying, waiting for a quota or sleeping on a Retry-After that would
# outlast the batch, and report why themselves.
_BATCH_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "ragpulse.judges.panel.batch_deadline", default=None
)

# How long after the deadline the panel waits for judges to report on their own (with their
# own cause) before cancelling what is left as `deadline`.
DEADLINE_GRACE_SECONDS = 1.0


def batch_deadline() -> float | None:
    """The running loop's time by which the current batch must be judged (None: no deadline)."""
    return _BATCH_DEADLINE.get()



class CallJournal(Protocol):
    """Where a panel journals the calls it paid for, and finds answers it need not pay for again
    (serve's `pipeline.service.journal.AnsweredCalls`, kept in the state file)."""

    def answered(self, key: CacheKey | None, verdict: Verdict) -> None: ...

    def take(self, key: CacheKey) -> Verdict | None: ...

    def holds(self, key: CacheKey) -> bool: ...



class JudgePanel:
    """Runs several judges over batches of inputs on one event loop of its own.

    Concurrency bounds live with the judges that need them (the LLM endpoint's semaphore);
    the panel only starts every (input, judge) pair and waits for all of them. When every judge
    also offers a synchronous `grade` (the local judges), the panel calls that instead: a
    coroutine, a task and two event-loop callbacks per (input, judge) pair cost about as much as
    a local judge itself, and they buy nothing when there is no I/O to overlap.

    The loop runs in a thread of its own, for as long as the panel lives, so that calls keep
    flowing between batches: `submit` hands a batch over and returns at once, and a caller that
    submits the next batch before waiting for the last one (`pipeline.stages.judge.JudgeEvents`)
    keeps the endpoint's slots busy across the boundary. `judge_batch` is `submit` and wait; any
    thread may call either. `start_ahead` starts calls for inputs that a later batch will bring
    (`pipeline.service.lookahead`, in serve): that batch takes their outcome over as its own.

    A batch always comes back whole: a judge that raises on one input gets an `error` verdict
    with cause `internal` for it (the exception type in the message, never its text, which may
    quote anything), and with `deadline_seconds` every call still running that long after the
    batch started (after `start_ahead` for one started ahead) is cancelled and rated `error`
    with cause `deadline`. The deadline is also published to the judges (`batch_deadline`) so
    the ones that wait on I/O can stop in time and say why. (The synchronous path has no I/O to
    wait on, and no deadline.)

    With a `cache` (judges.verdict_cache), a judge is asked about each distinct input once per
    TTL: repeats get the kept verdict marked `cached` (no call, no tokens, latency 0). Each
    verdict is kept as its call is answered, not when its batch ends, so a later batch (or a
    call started ahead) never pays for an input already answered.

    With a `journal` (set by serve, `CallJournal`), every answered call is handed to it as it
    arrives, and a call is made only when the journal holds no answer for it.
    """

    # Calls started ahead and not yet taken over are kept for at most this many distinct
    # pairs; the oldest are cancelled beyond it (serve's lookahead stays far below).
    AHEAD_LIMIT = 20_000

    def __init__(
        self,
        judges: Sequence[Judge],
        deadline_seconds: float | None = None,
        cache: VerdictCache | None = None,
        composites: Sequence[Composite] = (),
    ) -> None:
        if not judges:
            raise ValueError("a judge panel needs at least one judge")
        if deadline_seconds is not None and not deadline_seconds > 0:
            raise ValueError(f"deadline_seconds must be positive, got {deadline_seconds}")
        self.judges = tuple(judges)
        self.deadline_seconds = deadline_seconds
        self.cache = cache
        self._versions = tuple(judge_version(j) for j in self.judges)
        # Imported here: judges.composite reads this module's types.

        self._composites = composite_graders(composites, self.judges)
        # The `version` label of each verdict of a row: the judges', then the composites'.
        self.prompt_versions = tuple(prompt_version(j) for j in self.judges) + tuple(
            c.prompt_version for c in self._composites
        )
        graders = tuple(j.grade for j in self.judges if isinstance(j, SyncJudge))
        self._graders: tuple[Callable[[JudgeInput], Verdict], ...] | None = (
            graders if len(graders) == len(self.judges) else None
        )
        self._failure_log = ThrottledLog(log, 10.0)
        # Made on first use: a panel of local judges never needs a loop or a thread.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()
        # Read and written on the loop's thread only.
        # Calls started ahead by (judge number, input digest): one per event, or one per
        # distinct input with a cache (which answers the repeats).
        self._ahead: collections.OrderedDict[tuple[int, bytes], list[asyncio.Task[Verdict]]] = (
            collections.OrderedDict()
        )
        self.calls_in_flight = 0  # calls started and not finished (read from any thread)
        self.journal: CallJournal | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The names of each verdict of a row: the judges', then the composites'."""
        return tuple(j.name for j in self.judges) + tuple(c.name for c in self._composites)

    def judge_batch(
        self, items: Sequence[JudgeInput], fresh: Collection[int] = ()
    ) -> list[tuple[Verdict, ...]]:
        """One tuple of verdicts per input, in the order of `self.judges`; never raises for
        one judge's failure on one input.

        With a cache, a (judge, input) pair judged within its TTL, or earlier in this batch,
        gets that verdict back marked `cached` instead of being judged again. The inputs at
        the positions in `fresh` are always judged and their verdicts not kept (canaries,
        which are there to test the judges themselves). Each composite's verdict follows the
        judges' (`judges.composite`).
        """
        return self.submit(items, fresh).result()

    def submit(
        self, items: Sequence[JudgeInput], fresh: Collection[int] = ()
    ) -> concurrent.futures.Future[list[tuple[Verdict, ...]]]:
        """`judge_batch` without waiting: the calls start now, the verdicts come in the future
        (at once on the synchronous path)."""
        if self._graders is not None and self.cache is None:
            done: concurrent.futures.Future[list[tuple[Verdict, ...]]] = concurrent.futures.Future()
            done.set_result(self._with_composites(self._grade_every_pair(self._graders, items)))
            return done
        n = len(self.judges)
        # Pairs of the `fresh` inputs never take over a call started ahead.
        own = {i * n + j for i in fresh for j in range(n)}
        if self.cache is not None:
            pairs, assemble, own = self._through_cache(self.cache, items, fresh)
        else:
            pairs = [(j, item) for item in items for j in range(n)]

            def assemble(flat: list[Verdict]) -> list[tuple[Verdict, ...]]:
                return [tuple(flat[i * n : (i + 1) * n]) for i in range(len(items))]

        rows: concurrent.futures.Future[list[tuple[Verdict, ...]]] = concurrent.futures.Future()
        if self._graders is not None:
            graded = assemble(self._grade_pairs(self._graders, pairs))
            rows.set_result(self._with_composites(graded))
            return rows
        verdicts = asyncio.run_coroutine_threadsafe(
            self._judge_all(pairs, own), self._running_loop()
        )

        def finished(f: concurrent.futures.Future[list[Verdict]]) -> None:
            try:
                rows.set_result(self._with_composites(assemble(f.result())))
            except BaseException as exc:  # a bug in assembling; the caller sees it
                rows.set_exception(exc)

        verdicts.add_done_callback(finished)
        return rows

    def _with_composites(self, rows: list[tuple[Verdict, ...]]) -> list[tuple[Verdict, ...]]:
        """Each row with its composites' verdicts after the judges' (`judges.composite`)."""
        if not self._composites:
            return rows
        return [row + tuple(c.grade(row) for c in self._composites) for row in rows]

    def start_ahead(self, items: Sequence[JudgeInput]) -> None:
        """Start every judge's call on each input now, for a later batch holding the same input
        to take over (judged once, counted by that batch). Inputs the cache holds are skipped;
        nothing happens on the synchronous path."""
        if self._graders is not None or not items:
            return
        cache, journal = self.cache, self.journal
        pairs = [
            (j, item)
            for item in items
            for j, (judge, version) in enumerate(zip(self.judges, self._versions, strict=True))
            if (cache is None and journal is None)
            or not _answered_before(cache, journal, (judge.name, version, _digest(item)))
        ]
        asyncio.run_coroutine_threadsafe(self._start(pairs), self._running_loop())

    def _running_loop(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="ragpulse-judge-panel", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _through_cache(
        self, cache: VerdictCache, items: Sequence[JudgeInput], fresh: Collection[int]
    ) -> tuple[
        list[tuple[int, JudgeInput]],
        Callable[[list[Verdict]], list[tuple[Verdict, ...]]],
        set[int],
    ]:
        """The pairs to judge, how to make the rows from their verdicts (keeping them), and
        the pairs of `fresh` inputs."""
        # Imported here: judges.verdict_cache reads this module's types.

        keyed = [(self.judges[j].name, version) for j, version in enumerate(self._versions)]
        rows: list[list[Verdict | None]] = []
        # The pairs to judge, each with its cache key (None: not kept) and its places in
        # `rows`: a pair repeated within the batch is judged once.
        pairs: list[tuple[int, JudgeInput]] = []
        keys: list[CacheKey | None] = []
        places: list[list[tuple[int, int]]] = []
        pending: dict[CacheKey, int] = {}
        for i, item in enumerate(items):
            digest = None if i in fresh else _digest(item)
            row: list[Verdict | None] = []
            for j, (name, version) in enumerate(keyed):
                key = None if digest is None else (name, version, digest)
                # A call started ahead for this pair (serve's lookahead) is this batch's to take
                # over and count as a call, even once its answer is in the cache: read from the
                # cache, it would count as a hit and the call that paid for it as nobody's.
                taken_over = digest is not None and (j, digest) in self._ahead
                verdict = None if key is None or taken_over else cache.get(key)
                if verdict is None:
                    n = None if key is None else pending.get(key)
                    if n is None:
                        if key is not None:
                            pending[key] = len(pairs)
                        pairs.append((j, item))
                        keys.append(key)
                        places.append([(i, j)])
                    else:
                        places[n].append((i, j))
                row.append(verdict)
            rows.append(row)

        # Calls keep their verdicts as they are answered (`_call`); graded ones here.
        keep = self._graders is not None

        def assemble(judged: list[Verdict]) -> list[tuple[Verdict, ...]]:
            for key, (first, *repeats), verdict in zip(keys, places, judged, strict=True):
                if key is not None and keep:
                    cache.put(key, verdict)
                rows[first[0]][first[1]] = verdict
                # Repeats within the batch share the one call's outcome, an error included
                # (it is not kept for later batches): no call of their own, so no cost.
                for i, j in repeats:
                    rows[i][j] = as_cached(verdict)
            return [tuple(v for v in row if v is not None) for row in rows]

        return pairs, assemble, {n for n, key in enumerate(keys) if key is None}

    def _grade_pairs(
        self,
        graders: Sequence[Callable[[JudgeInput], Verdict]],
        pairs: Sequence[tuple[int, JudgeInput]],
    ) -> list[Verdict]:
        """The verdict of judge number j on each (j, input), in order (synchronous path)."""
        return [self._graded(self.judges[j].name, graders[j], item) for j, item in pairs]

    def _grade_every_pair(
        self, graders: Sequence[Callable[[JudgeInput], Verdict]], items: Sequence[JudgeInput]
    ) -> list[tuple[Verdict, ...]]:
        try:
            return [tuple(grade(item) for grade in graders) for item in items]
        except Exception:
            # Rare; grade again pair by pair so only the failing pairs become errors
            # (local judges are pure, so grading twice changes nothing). The fast path
            # above stays free of a wrapper call per pair.
            pairs = list(zip(self.judges, graders, strict=True))
            return [tuple(self._graded(j.name, g, item) for j, g in pairs) for item in items]

    def _graded(
        self, name: str, grade: Callable[[JudgeInput], Verdict], item: JudgeInput
    ) -> Verdict:
        try:
            return grade(item)
        except Exception as exc:
            return self._internal_error(name, exc)

    async def _judged(self, judge: Judge, item: JudgeInput) -> Verdict:
        try:
            return await judge.judge(item)
        except Exception as exc:
            return self._internal_error(judge.name, exc)

    def _internal_error(self, name: str, exc: Exception) -> Verdict:
        where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
        at = f" at {Path(where.filename).name}:{where.lineno} in {where.name}" if where else ""
        kind = type(exc).__name__
        self._failure_log.warning(
            (name, "internal", kind),
            "judge %s raised %s%s; rated error (internal), the batch goes on",
            name,
            kind,
            at,
        )
        return Verdict(
            name,
            "error",
            error_message=f"judge {name} failed with {kind}{at} (a bug; see the log)",
            error_cause="internal",
        )

    def _set_deadline(self) -> None:
        """Publish the deadline of calls started now to the tasks this coroutine creates."""
        budget = self.deadline_seconds
        # Copied into each task's context as the task is created.
        _BATCH_DEADLINE.set(None if budget is None else asyncio.get_running_loop().time() + budget)

    def _call(self, j: int, item: JudgeInput, fresh: bool = False) -> asyncio.Task[Verdict]:
        """Call judge number j on `item`; its verdict is kept (cache, journal) as it arrives,
        under its key unless the input is `fresh` (a canary: journaled for its tokens only)."""
        self.calls_in_flight += 1
        task = asyncio.get_running_loop().create_task(self._judged(self.judges[j], item))
        key = None
        if not fresh and (self.cache is not None or self.journal is not None):
            key = self._key(j, item)

        def ended(done: asyncio.Task[Verdict]) -> None:
            self.calls_in_flight -= 1
            if done.cancelled() or done.exception() is not None:
                return
            verdict = done.result()
            if key is not None and self.cache is not None:
                self.cache.put(key, verdict)
            if self.journal is not None:
                self.journal.answered(key, verdict)

        task.add_done_callback(ended)
        return task

    def _key(self, j: int, item: JudgeInput) -> CacheKey:
        return self.judges[j].name, self._versions[j], _digest(item)

    def _take_over(self, j: int, item: JudgeInput) -> asyncio.Future[Verdict]:
        """The call of judge number j on `item` started ahead, the journal's answer, or a new
        call."""
        if self._ahead:
            ahead = (j, _digest(item))
            tasks = self._ahead.get(ahead)
            if tasks:
                task = tasks.pop(0)
                if not tasks:
                    del self._ahead[ahead]
                return task
        if self.journal is not None:
            key = self._key(j, item)
            verdict = self.journal.take(key)
            if verdict is not None:
                if self.cache is not None:
                    self.cache.put(key, verdict)
                answer: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
                answer.set_result(verdict)
                return answer
        return self._call(j, item)

    async def _start(self, pairs: Sequence[tuple[int, JudgeInput]]) -> None:
        self._set_deadline()
        ahead = self._ahead
        for j, item in pairs:
            key = (j, _digest(item))
            tasks = ahead.setdefault(key, [])
            if not tasks or self.cache is None:
                tasks.append(self._call(j, item))
        while len(ahead) > self.AHEAD_LIMIT:
            for stale in ahead.popitem(last=False)[1]:
                stale.cancel()

    async def _judge_all(
        self, pairs: Sequence[tuple[int, JudgeInput]], own: Collection[int] = ()
    ) -> list[Verdict]:
        """The verdict of judge number j on each (j, input), in order; a pair whose call was
        started ahead takes that call over, except the pairs numbered in `own`."""
        self._set_deadline()
        tasks = [
            self._call(j, item, fresh=True) if n in own else self._take_over(j, item)
            for n, (j, item) in enumerate(pairs)
        ]
        if not tasks:
            return []
        budget = self.deadline_seconds
        timeout = None if budget is None else budget + DEADLINE_GRACE_SECONDS
        _, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        return [
            task.result()
            if not task.cancelled()
            else Verdict(
                self.judges[j].name,
                "error",
                error_message=f"not finished within the batch deadline of "
                f"{self.deadline_seconds:g} s (--judge-batch-deadline); cancelled",
                error_cause="deadline",
            )
            for task, (j, _) in zip(tasks, pairs, strict=True)
        ]

    def close(self) -> None:
        """Let judges release what they hold on the panel's loop (HTTP clients), then stop it.

        A judge may offer `async aclose()`; pooled connections left to a closed loop raise
        "Event loop is closed" when they are collected.
        """
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        for judge in self.judges:
            aclose = getattr(judge, "aclose", None)
            if aclose is not None:
                asyncio.run_coroutine_threadsafe(aclose(), loop).result()
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
        self._loop = self._thread = None


def _answered_before(
    cache: VerdictCache | None, journal: CallJournal | None, key: CacheKey
) -> bool:
    return (cache is not None and cache.get(key) is not None) or (
        journal is not None and journal.holds(key)
    )


def _digest(item: JudgeInput) -> bytes:
    return input_digest(item)
