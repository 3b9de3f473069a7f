"""Verdicts already given, so that identical judge inputs are judged once within a time bound.

For the judge panel (`judges.panel.JudgePanel`): a chatbot's traffic repeats itself (the same
question answered from the same passages, retries of a request, canaries), and an LLM judge
asked twice about the same input spends the same tokens for the same verdict. A verdict is kept
under (judge name, judge version, digest of the input) for `ttl_seconds`, at most `size` of them,
least recently used first out. The version says what produced the verdict: for an LLM judge its
prompt version, a digest of its fixed prompt, the model and the request settings
(`LLMJudge.version`); for a local judge its implementation (module and class). The digest covers
everything a `JudgeInput` carries (question, answer, chunks, history, expected answer, expected
chunks, guidelines), so inputs that differ in any of them never share a verdict.

Only verdicts "yes" and "no" are kept: an `error` (a timeout, a 429, an unparsable reply) says
nothing about the input and is asked again next time.

`JudgeSpec.build` gives the LLM judges a cache; the local judges grade an event faster than
the cache looks it up (tests/bench/bench_verdict_cache.py), so theirs is judged again.

`serve` builds a new Beam pipeline, and so a new panel, every cycle; `shared_verdict_cache` keeps
one cache per (size, ttl) for the whole process so that it spans cycles. Its memory is bounded
by `size` entries of a 16-byte digest, a short key and a verdict (about 1 KB with a rationale).
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import threading
import time
from collections.abc import Callable

from ragpulse.judges.base import JudgeInput, Verdict

__all__ = [
    "CacheKey",
    "VerdictCache",
    "as_cached",
    "forget_shared_verdict_caches",
    "input_digest",
    "shared_verdict_cache",
]

# (judge name, judge version, input digest)
CacheKey = tuple[str, str, bytes]


def input_digest(item: JudgeInput) -> bytes:
    """A 128-bit digest of everything `item` carries (its dataclass repr quotes every field,
    strings escaped, in a fixed order), the same in every process."""
    return hashlib.blake2b(repr(item).encode("utf-8", "surrogatepass"), digest_size=16).digest()


def as_cached(verdict: Verdict) -> Verdict:
    """`verdict` as given again from the cache: marked `cached`, no latency, no tokens."""
    return dataclasses.replace(
        verdict,
        cached=True,
        latency_seconds=0.0,
        prompt_tokens=0,
        completion_tokens=0,
        cached_prompt_tokens=0,
    )


class VerdictCache:
    """At most `size` verdicts, each for `ttl_seconds` after it was given; thread-safe (Beam may
    run several judging DoFns of one process in threads). `clock` is for tests."""

    def __init__(
        self, size: int, ttl_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if size < 1 or not ttl_seconds > 0:
            raise ValueError(f"a verdict cache needs size >= 1 and ttl > 0, got {size}, "
                             f"{ttl_seconds}")
        self.size = size
        self.ttl_seconds = ttl_seconds
        self._clock = clock
        self._entries: collections.OrderedDict[CacheKey, tuple[float, Verdict]] = (
            collections.OrderedDict()
        )
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def get(self, key: CacheKey) -> Verdict | None:
        """The verdict kept under `key`, marked `cached`, costing nothing; None when there is
        none or it expired."""
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            expires, verdict = entry
            if now >= expires:
                del self._entries[key]
                return None
            self._entries.move_to_end(key)
        return verdict

    def put(self, key: CacheKey, verdict: Verdict) -> None:
        """Keep `verdict` if it is a yes or a no (errors are never kept)."""
        if verdict.rating == "error":
            return
        kept = as_cached(verdict)
        expires = self._clock() + self.ttl_seconds
        with self._lock:
            self._entries[key] = (expires, kept)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)


_SHARED: dict[tuple[int, float], VerdictCache] = {}
_SHARED_LOCK = threading.Lock()


def shared_verdict_cache(size: int, ttl_seconds: float) -> VerdictCache:
    """The process-wide cache of this size and TTL (see the module docstring for why)."""
    with _SHARED_LOCK:
        cache = _SHARED.get((size, ttl_seconds))
        if cache is None:
            cache = _SHARED[size, ttl_seconds] = VerdictCache(size, ttl_seconds)
        return cache


def forget_shared_verdict_caches() -> None:
    """Drop every process-wide cache (tests that judge the same inputs start afresh)."""
    with _SHARED_LOCK:
        _SHARED.clear()
