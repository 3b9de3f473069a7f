"""Offline chunk-relevance judge: is each retrieved chunk about what the user asked?

For operators who want to tell retrieval failures from generation failures without an LLM. A
chunk is relevant when it holds at least half of the question's key words (content-word
Snowball stems, the same key words the local relevance_to_query judge uses). The event's
verdict is "yes" when at least one chunk is relevant, with every chunk's rating and the
precision in the rationale (judges/chunk_verdicts.py).

Lexical, so it misses relevance by paraphrase or synonym; no labelled set of chunk relevance is
at hand to measure it (see tests/bench/eval_local_judges.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ragpulse.judges.base import Chunk, JudgeInput, Rating, Verdict
from ragpulse.judges.chunk_verdicts import event_verdict
from ragpulse.judges.local.judge import CannotGrade, LocalJudge
from ragpulse.judges.local.relevance import key_stems
from ragpulse.judges.local.text import bag_of

DEFAULT_MIN_SHARE = 0.5


def chunk_verdict(
    name: str, asked: Mapping[str, str], chunk: Chunk, min_share: float
) -> Verdict:
    """Whether one chunk holds at least `min_share` of the question's key stems `asked`."""
    if not chunk.content.strip():
        return Verdict(name, "no", "The chunk has no text.")
    stems = bag_of(chunk.content).stems
    found = [surface for s, surface in asked.items() if s in stems]
    share = len(found) / len(asked)
    words = ", ".join(repr(w) for w in (found or list(asked.values()))[:4])
    if share >= min_share:
        return Verdict(name, "yes", f"It holds {len(found)} of {len(asked)} key words ({words}).")
    return Verdict(name, "no", f"It holds {len(found)} of {len(asked)} key words ({words}).")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChunkRelevanceJudge(LocalJudge):
    """Local `chunk_relevance` judge: "yes" when some chunk holds the question's key words."""

    name = "chunk_relevance"

    min_share: float = DEFAULT_MIN_SHARE

    def decide(self, item: JudgeInput) -> tuple[Rating, str, float]:
        asked = key_stems(item.question)
        if not asked:
            raise CannotGrade(
                "the question has no key word to look for in the chunks; "
                "chunk_relevance cannot grade it offline"
            )
        chunks = [chunk_verdict(self.name, asked, c, self.min_share) for c in item.chunks]
        # Local chunk verdicts are never errors, so neither is the event's.
        verdict = event_verdict(self.name, chunks, 0.0)
        return verdict.rating, verdict.rationale or "", verdict.score or 0.0
