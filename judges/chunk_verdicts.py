"""One event verdict from the verdicts of its retrieved chunks (per-chunk judges).

For the judges the registry marks `per_chunk` (chunk_relevance, local and LLM): Agent Evaluation
rates every retrieved chunk and reports precision = relevant / retrieved, while ragpulse counts
one yes/no/error per judge per event. The mapping, for both backends:

* "yes" when at least one chunk is rated "yes": the retriever found something relevant. A chunk
  that could not be rated changes nothing then (one relevant chunk settles it);
* "error" when no chunk is rated "yes" and some could not be rated (their absence of a "yes" is
  unknown), with the cause of the first such chunk;
* "no" when every chunk is rated "no".

The rationale starts with the precision and every chunk's rating, e.g.
`precision 1/3: [1] yes, [2] no, [3] no. [1] The passage gives the opening hours.`, so the
per-chunk ratings survive in the verdict rows (`ragpulse explain`). The verdict's `score` is
the event's precision (relevant / chunks rated), so the window aggregate is the mean precision,
exported with its count (`ragpulse_judge_score_sum` / `_count`, `score_mean` in windows.jsonl).
"""

from __future__ import annotations

from collections.abc import Sequence

from ragpulse.judges.base import Verdict

__all__ = ["event_verdict"]

# Each chunk's rationale is cut to this many characters in the event's rationale.
_RATIONALE_CHARS = 160


def event_verdict(name: str, chunks: Sequence[Verdict], latency_seconds: float) -> Verdict:
    """The verdict of judge `name` on an event whose chunks were rated `chunks`, in order.

    Token counts are the sums over the chunks; `latency_seconds` is the caller's (the chunks
    may have been rated concurrently).
    """
    if not chunks:
        raise ValueError("a per-chunk verdict needs at least one chunk verdict")
    prompt_tokens = sum(v.prompt_tokens for v in chunks)
    completion_tokens = sum(v.completion_tokens for v in chunks)
    cached_prompt_tokens = sum(v.cached_prompt_tokens for v in chunks)
    relevant = [i for i, v in enumerate(chunks, start=1) if v.rating == "yes"]
    rated = [v for v in chunks if v.rating != "error"]
    ratings = ", ".join(f"[{i}] {v.rating}" for i, v in enumerate(chunks, start=1))
    summary = f"precision {len(relevant)}/{len(chunks)}: {ratings}."
    failed = [(i, v) for i, v in enumerate(chunks, start=1) if v.rating == "error"]
    if not relevant and failed:
        i, first = failed[0]
        return Verdict(
            name,
            "error",
            error_message=f"{len(failed)} of {len(chunks)} chunks could not be rated and none "
            f"of the {len(rated)} rated is relevant; chunk [{i}]: {first.error_message}",
            error_cause=first.error_cause,
            latency_seconds=latency_seconds,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            cached_prompt_tokens=cached_prompt_tokens,
        )
    shown = relevant[:1] or [1]
    reasons = " ".join(
        f"[{i}] {_cut(chunks[i - 1].rationale or '')}" for i in shown if chunks[i - 1].rationale
    )
    rationale = f"{summary} {reasons}".strip()
    return Verdict(
        name,
        "yes" if relevant else "no",
        rationale,
        # The event's precision over the chunks that could be rated: summed and counted in
        # ragpulse_judge_score, so a window's mean precision and its count are exported.
        score=len(relevant) / len(rated),
        latency_seconds=latency_seconds,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cached_prompt_tokens=cached_prompt_tokens,
    )


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _RATIONALE_CHARS else text[: _RATIONALE_CHARS - 1] + "…"
