"""What a judge reads, what it returns, and the protocol every judge follows.

The pipeline turns an inference-log event into a `JudgeInput`; each judge turns a `JudgeInput`
into a `Verdict`. `error` is a rating of its own ("could not grade"), never a failing grade:
it is left out of pass ratios and counted by cause so a broken judge is visible.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import dataclasses
import logging
import math
import re
import threading
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, get_args, runtime_checkable

if TYPE_CHECKING:
    from judges.composite import Composite
    from judges.verdict_cache import CacheKey, VerdictCache

log = logging.getLogger(__name__)

Rating = Literal["yes", "no", "error", "skipped"]
# The ratings a verdict counter and a window count. `skipped` is not one of them: a judge that
# is not meant to run on an event (it lacks the judge's required field, e.g. correctness
# without an expected answer) neither passes nor fails nor errs; it is counted apart
# (ragpulse_judge_skipped_total) and stays out of every window and ratio.
RATINGS: tuple[Rating, ...] = ("yes", "no", "error")

# Why a verdict is `error`; a closed set so it can label a metric (ragpulse_judge_errors_total).
#   timeout        the endpoint did not answer within --judge-timeout
#   rate_limited   HTTP 429, or a wait (Retry-After, --judge-rpm/--judge-tpm) past the deadline
#   server_error   HTTP 5xx
#   client_error   any other HTTP 4xx (the request is wrong: key, model, response_format ...)
#   connection     the endpoint could not be reached
#   malformed      the endpoint's reply is not a chat completion (HTML, wrong shape, not JSON)
#   unparsable     a well-formed reply whose text holds no yes/no verdict
#   truncated      the reply was cut off at --judge-max-tokens (finish_reason "length")
#   circuit_open   the endpoint's circuit breaker is open: not called, failed fast
#   deadline       the batch's --judge-batch-deadline passed before the call finished
#   internal       the judge itself raised (a bug): the panel kept the batch going
#   input          the event holds what the judge needs in a form it cannot grade (both
#                  expected_response and expected_facts, an empty answer ...); an event that
#                  lacks a required field altogether is `skipped`, not an error
ErrorCause = Literal[
    "timeout",
    "rate_limited",
    "server_error",
    "client_error",
    "connection",
    "malformed",
    "unparsable",
    "truncated",
    "circuit_open",
    "deadline",
    "internal",
    "input",
]
ERROR_CAUSES: tuple[ErrorCause, ...] = get_args(ErrorCause)


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    """One retrieved passage, as the chatbot's retriever returned it."""

    content: str
    doc_uri: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    """One earlier message of the conversation (`role` is user, assistant or system)."""

    role: str
    content: str


@dataclasses.dataclass(frozen=True, slots=True)
class Guideline:
    """One named set of rules the answer must follow (the event's `guidelines`: a plain list
    is one set named "guidelines")."""

    name: str
    rules: tuple[str, ...]


# The name of the one set a plain list of guidelines forms: graded as one verdict.
LIST_GUIDELINES = "guidelines"
# A guideline's name labels its verdicts' series (`guideline`), so it is short and plain.
GUIDELINE_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")


def global_guidelines(flags: Sequence[str]) -> tuple[Guideline, ...]:
    """Guidelines for every event from `--guideline NAME=RULE` values, grouped by name in the
    order first given; ValueError (one line) for a value without a name or a rule."""
    grouped: dict[str, list[str]] = {}
    for flag in flags:
        name, sep, rule = flag.partition("=")
        if not sep or not GUIDELINE_NAME.fullmatch(name.strip()) or not rule.strip():
            raise ValueError(
                f"{flag!r} is not NAME=RULE (NAME of 1-64 letters, digits, _ . -), e.g. "
                "'english=The response must be in English'"
            )
        grouped.setdefault(name.strip(), []).append(rule.strip())
    return tuple(Guideline(name, tuple(rules)) for name, rules in grouped.items())


# The parts of a `JudgeInput`, by name: what a judge requires (judges.registry) and what an LLM
# judge's prompt shows (judges.llm). The ground truth of the input schema: "expected" is the
# expected answer (`expected_response` or `expected_facts`), "expected_chunks" the
# `expected_retrieved_context`, "guidelines" the event's guidelines.
InputName = Literal[
    "history", "question", "chunks", "answer", "expected", "expected_chunks", "guidelines"
]


@dataclasses.dataclass(frozen=True, slots=True)
class JudgeInput:
    """The part of an inference-log event that judges look at.

    The last four fields are the optional ground truth of the Agent Evaluation input schema,
    present in evaluation sets and golden canaries, rarely in production traffic.
    """

    question: str
    answer: str
    chunks: tuple[Chunk, ...] = ()
    history: tuple[Turn, ...] = ()
    expected_response: str | None = None
    expected_facts: tuple[str, ...] = ()
    expected_chunks: tuple[Chunk, ...] = ()  # `content` may be empty: only doc_uri is required
    guidelines: tuple[Guideline, ...] = ()

    def lacks(self, names: Sequence[InputName]) -> list[InputName]:
        """Those of `names` this event does not have: blank text, no chunk with text, no turns,
        no expected answer, no expected doc_uri, no guideline rule."""
        return [name for name in names if not self._has(name)]

    @property
    def facts(self) -> tuple[str, ...]:
        """The expected facts that are not blank."""
        return tuple(f for f in self.expected_facts if f.strip())

    @property
    def both_expected(self) -> bool:
        """Whether the event gives both `expected_response` and `expected_facts`, which the
        input schema forbids (a judge reading the expected answer rates it `error`)."""
        return bool(self.expected_response and self.expected_response.strip() and self.facts)

    def _has(self, name: InputName) -> bool:
        if name == "chunks":
            return any(c.content and not c.content.isspace() for c in self.chunks)
        if name == "history":
            return bool(self.history)
        if name == "expected":
            return bool((self.expected_response or "").strip() or self.facts)
        if name == "expected_chunks":
            return any(c.doc_uri and c.doc_uri.strip() for c in self.expected_chunks)
        if name == "guidelines":
            return any(rule.strip() for g in self.guidelines for rule in g.rules)
        return bool((self.question if name == "question" else self.answer).strip())


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """One judge's grade of one event, in Agent Evaluation terms (rating, rationale, error)."""

    judge: str
    rating: Rating
    rationale: str | None = None
    error_message: str | None = None
    error_cause: ErrorCause | None = None
    latency_seconds: float = 0.0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # Of `prompt_tokens`, those the provider read from its prompt cache (billed for less).
    cached_prompt_tokens: int = 0
    # Given earlier to an identical input and taken from the panel's verdict cache
    # (judges.verdict_cache): no call was made, no tokens spent, latency 0.
    cached: bool = False
    # Of a `skipped` verdict: the required inputs the event lacks (JudgeInput.lacks).
    missing: tuple[InputName, ...] = ()
    # Of a judge on a graded scale (0-3, 1-5, a composite): the score; `rating` is then "yes"
    # when it is at or above the judge's pass score. None on the binary scale.
    score: float | None = None
    # Computed from other verdicts of the event (a composite, judges.composite): no call.
    derived: bool = False
    # Of an ensemble (judges.ensemble): each member's rating, whose majority is `rating`.
    votes: tuple[Rating, ...] = ()
    # Of a judge that grades each named guideline on its own (guideline_adherence): one verdict
    # per name, judged "<judge>/<name>"; the pipeline counts and stores these in its place.
    parts: tuple[Verdict, ...] = ()

    def __post_init__(self) -> None:
        if (self.rating == "error") != (self.error_message is not None):
            raise ValueError("a verdict has an error_message exactly when its rating is 'error'")
        if (self.rating == "skipped") != bool(self.missing):
            raise ValueError("a verdict names missing inputs exactly when its rating is 'skipped'")
        # These feed Prometheus counters, which must only grow: checked here, where every
        # verdict is made, so the pipeline can add them up without looking.
        prompt, completion = self.prompt_tokens, self.completion_tokens
        if type(prompt) is not int or type(completion) is not int or prompt < 0 or completion < 0:
            raise ValueError(f"token counts must be ints >= 0, got {prompt!r}, {completion!r}")
        cached = self.cached_prompt_tokens
        if type(cached) is not int or not 0 <= cached <= prompt:
            raise ValueError(f"cached prompt tokens must be an int in 0..{prompt}, got {cached!r}")
        if self.score is not None and (
            self.rating not in ("yes", "no") or not math.isfinite(self.score)
        ):
            raise ValueError(f"a score must be finite, on a yes or no verdict, got {self.score!r}")
        if not 0.0 <= self.latency_seconds < math.inf:
            raise ValueError(f"latency must be finite and >= 0, got {self.latency_seconds!r}")


class Judge(Protocol):
    """A judge grades one input; `name` is the Agent Evaluation judge name."""

    name: str

    async def judge(self, item: JudgeInput) -> Verdict: ...


@runtime_checkable
class SyncJudge(Protocol):
    """A judge that computes without waiting on I/O may also offer `grade`, the same as
    `judge` but synchronous; the panel then calls it directly (see `JudgePanel`)."""

    name: str

    def grade(self, item: JudgeInput) -> Verdict: ...


# The loop time (`loop.time()`) by which the batch being judged must be finished, or None. Set
# by `JudgePanel` for the tasks of one batch; read by judges that wait on I/O (the LLM endpoint)
# so that they can stop retrying, waiting for a quota or sleeping on a Retry-After that would
# outlast the batch, and report why themselves.
_BATCH_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "ragpulse_batch_deadline", default=None
)

# How long after the deadline the panel waits for judges to report on their own (with their
# own cause) before cancelling what is left as `deadline`.
DEADLINE_GRACE_SECONDS = 1.0


def batch_deadline() -> float | None:
    """The running loop's time by which the current batch must be judged (None: no deadline)."""
    return _BATCH_DEADLINE.get()


class ThrottledLog:
    """At most one warning per key per interval on `logger`, then how many were held back.

    A judge outage fails every call; one line per call would bury everything else in the log
    (the counts are in ragpulse_judge_errors_total).
    """

    def __init__(self, logger: logging.Logger, interval_seconds: float) -> None:
        self._log = logger
        self._interval = interval_seconds
        self._last: dict[tuple[str, ...], float] = {}
        self._held: dict[tuple[str, ...], int] = {}

    def warning(self, key: tuple[str, ...], msg: str, *args: object) -> None:
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._interval:
            self._held[key] = self._held.get(key, 0) + 1
            return
        held = self._held.pop(key, 0)
        self._last[key] = now
        suffix = (
            f" (and {held} more like it in the last {now - last:.0f} s)" if held and last else ""
        )
        self._log.warning(msg + suffix, *args)


def judge_version(judge: Judge) -> str:
    """What produced a judge's verdicts, for the verdict cache: the judge's `version` when it
    has one (LLM judges: prompt, model and request settings), else its implementation."""
    version = getattr(judge, "version", None)
    if isinstance(version, str):
        return version
    return f"{type(judge).__module__}.{type(judge).__qualname__}"


def prompt_version(judge: Judge) -> str:
    """The short version of a judge's prompt, for the `version` label of its metric series: the
    judge's `prompt_version` when it has one (LLM judges: the prompt file's `version` and the
    frame's, "v1f2"), else "local" (the local judges, whose method is the release's).

    Few values by design (one per prompt edit): a prompt change starts new series, so rates of
    two prompts are never added up, and a dashboard shows when the prompt changed.
    """
    version = getattr(judge, "prompt_version", None)
    return version if isinstance(version, str) else "local"


class JudgePanel:
    """Runs several judges over batches of inputs on one event loop of its own.

    Concurrency bounds live with the judges that need them (the LLM endpoint's semaphore);
    the panel only starts every (input, judge) pair and waits for all of them. When every judge
    also offers a synchronous `grade` (the local judges), the panel calls that instead: a
    coroutine, a task and two event-loop callbacks per (input, judge) pair cost about as much as
    a local judge itself, and they buy nothing when there is no I/O to overlap.

    The loop runs in a thread of its own, for as long as the panel lives, so that calls keep
    flowing between batches: `submit` hands a batch over and returns at once, and a caller that
    submits the next batch before waiting for the last one (`pipeline.stages.JudgeEvents`) keeps
    the endpoint's slots busy across the boundary. `judge_batch` is `submit` and wait; any
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
    TTL: repeats get the kept verdict marked `cached` (no call, no tokens, latency 0).
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
        from judges.composite import composite_graders

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

    @property
    def names(self) -> tuple[str, ...]:
        """The names of each verdict of a row: the judges', then the composites'."""
        return tuple(j.name for j in self.judges) + tuple(c.name for c in self._composites)

    @property
    def waits_on_io(self) -> bool:
        """Whether judging waits on I/O (an LLM endpoint): only then is starting ahead useful."""
        return self._graders is None

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
        cache = self.cache
        pairs = [
            (j, item)
            for item in items
            for j, (judge, version) in enumerate(zip(self.judges, self._versions, strict=True))
            if cache is None or cache.get((judge.name, version, _digest(item))) is None
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
        from judges.verdict_cache import as_cached

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
                verdict = None if key is None else cache.get(key)
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

        def assemble(judged: list[Verdict]) -> list[tuple[Verdict, ...]]:
            for key, (first, *repeats), verdict in zip(keys, places, judged, strict=True):
                if key is not None:
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

    def _call(self, j: int, item: JudgeInput) -> asyncio.Task[Verdict]:
        self.calls_in_flight += 1
        task = asyncio.get_running_loop().create_task(self._judged(self.judges[j], item))
        task.add_done_callback(self._call_ended)
        return task

    def _call_ended(self, _: asyncio.Task[Verdict]) -> None:
        self.calls_in_flight -= 1

    def _take_over(self, j: int, item: JudgeInput) -> asyncio.Task[Verdict]:
        """The call of judge number j on `item` started ahead, or a new one."""
        if self._ahead:
            key = (j, _digest(item))
            tasks = self._ahead.get(key)
            if tasks:
                task = tasks.pop(0)
                if not tasks:
                    del self._ahead[key]
                return task
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
            self._call(j, item) if n in own else self._take_over(j, item)
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


def _digest(item: JudgeInput) -> bytes:
    # Imported here: judges.verdict_cache reads this module's types.
    from judges.verdict_cache import input_digest

    return input_digest(item)
