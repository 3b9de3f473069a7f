"""The journal of answered judge calls (pipeline/service/journal.py) on a real state file: each
paid call's tokens are counted once, whichever cycle commits them; an answer journaled before a
crash is taken instead of paid again; a committed cycle leaves at most the next cycle's calls."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ragpulse.judges.base import Verdict
from ragpulse.judges.redaction import TextPolicy
from ragpulse.judges.verdict_cache import CacheKey
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.service.journal import AnsweredCalls
from ragpulse.pipeline.service.state import CycleOutcome, StateStore

TOKENS = "ragpulse_judge_tokens_total"


def key(n: int) -> CacheKey:
    return ("safety", "v1", n.to_bytes(16, "big"))


def yes(prompt: int = 100, completion: int = 10) -> Verdict:
    return Verdict("safety", "yes", "fine", prompt_tokens=prompt, completion_tokens=completion)


def commit(state: StateStore, journal: AnsweredCalls) -> counting.Counts:
    """One cycle's commit as serve makes it: the journal's settlement in the cycle's
    transaction; returns the tokens it counted."""
    settlement = journal.settle()
    state.apply_cycle("t", CycleOutcome(counts=settlement.tokens, calls_settled=settlement.calls))
    journal.settled(settlement)
    return settlement.tokens


def prompt_tokens(counts: counting.Counts) -> float:
    return counts[counting.key(TOKENS, judge="safety", kind="prompt")]


def test_an_answer_journaled_before_a_crash_is_taken_once_and_its_tokens_counted_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite"
    with StateStore(path) as state:
        crashed = AnsweredCalls(path)
        crashed.begin_attempt()
        crashed.answered(key(1), yes(prompt=100))
        crashed.answered(key(2), yes(prompt=50))
        crashed.settle()  # waits for the writer; a kill would come here, before the commit
        # No close(): the process died.
        journal = AnsweredCalls(path)
        journal.begin_attempt()
        taken = journal.take(key(1))
        assert taken == yes(prompt=100)  # as answered: a call the replayed cycle counts
        assert journal.take(key(1)) is None  # once per attempt
        assert journal.take(key(3)) is None
        # The commit counts both calls' tokens, the one taken and the one no cycle used yet.
        assert prompt_tokens(commit(state, journal)) == 150
        assert state.counters()[counting.key(TOKENS, judge="safety", kind="prompt")] == 150
        # The untaken answer stays one more cycle, counted: given then as a cached verdict.
        journal.begin_attempt()
        again = journal.take(key(2))
        assert again is not None and again.cached and again.prompt_tokens == 0
        assert prompt_tokens(commit(state, journal)) == 0
        assert len(journal) == 0
        journal.close()
        assert len(AnsweredCalls(path)) == 0


def test_errors_and_canaries_are_counted_but_never_taken(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    with StateStore(path) as state:
        journal = AnsweredCalls(path)
        journal.begin_attempt()
        unparsable = Verdict(
            "safety", "error", error_message="no verdict", error_cause="unparsable",
            prompt_tokens=70, completion_tokens=5,
        )
        timeout = Verdict("safety", "error", error_message="timeout", error_cause="timeout")
        journal.answered(key(1), unparsable)
        journal.answered(None, yes(prompt=30))  # a canary's call
        journal.answered(key(2), timeout)  # nothing paid: not journaled
        journal.answered(key(3), Verdict("safety", "yes", cached=True))  # a cache hit
        assert len(journal) == 2
        journal.begin_attempt()
        assert journal.take(key(1)) is None
        assert prompt_tokens(commit(state, journal)) == 100
        assert len(journal) == 0
        journal.close()


def test_a_call_answered_in_a_failed_attempt_is_taken_by_the_retry_and_counted_once(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite"
    with StateStore(path) as state:
        journal = AnsweredCalls(path)
        journal.begin_attempt()
        journal.answered(key(1), yes(prompt=40))
        assert journal.take(key(1)) is None  # not within the attempt that paid for it
        # The attempt fails before its commit; the retry takes the answer.
        journal.begin_attempt()
        assert journal.take(key(1)) == yes(prompt=40)
        assert prompt_tokens(commit(state, journal)) == 40
        assert len(journal) == 0
        journal.close()


def test_within_one_process_a_committed_answer_is_not_given_again(tmp_path: Path) -> None:
    # The verdict cache is the process's cache, and --judge-cache-size 0 turns it off; the
    # journal only stands in for calls whose cycle did not commit.
    path = tmp_path / "state.sqlite"
    with StateStore(path) as state:
        journal = AnsweredCalls(path)
        journal.begin_attempt()
        journal.answered(key(1), yes(prompt=40))
        assert prompt_tokens(commit(state, journal)) == 40
        journal.begin_attempt()
        assert journal.take(key(1)) is None and not journal.holds(key(1))
        journal.close()


def test_rationales_are_kept_in_the_state_file_as_store_text_says(tmp_path: Path) -> None:
    path = tmp_path / "state.sqlite"
    with StateStore(path):
        for store, kept in (("redacted", "mail [EMAIL]"), ("none", None)):
            journal = AnsweredCalls(path, TextPolicy(store_text=store))  # type: ignore[arg-type]
            journal.begin_attempt()
            journal.answered(key(1), Verdict("safety", "yes", "mail ann@example.com",
                                             prompt_tokens=5))
            journal.settle()  # written
            journal.close()
            reopened = AnsweredCalls(path)
            reopened.begin_attempt()
            taken = reopened.take(key(1))
            assert taken is not None and taken.rationale == kept
            reopened.close()
            sqlite3.connect(path).execute("DELETE FROM answered_calls").connection.commit()


def test_a_verdict_with_parts_scores_and_votes_comes_back_whole_after_a_restart(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.sqlite"
    part = Verdict("guideline_adherence", "no", "not in English", score=0.0)
    verdict = Verdict(
        "guideline_adherence", "no", "one guideline failed", prompt_tokens=80,
        completion_tokens=9, cached_prompt_tokens=40, score=0.5, votes=("no", "yes", "no"),
        parts=(part,), latency_seconds=1.25,
    )
    with StateStore(path):
        journal = AnsweredCalls(path)
        journal.begin_attempt()
        journal.answered(key(1), verdict)
        journal.settle()
        reopened = AnsweredCalls(path)
        reopened.begin_attempt()
        assert reopened.take(key(1)) == verdict
        reopened.close()
        journal.close()
