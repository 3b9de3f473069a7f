"""Document recall: the share of the expected documents among the retrieved chunks.

Deterministic, as in Agent Evaluation (no model): recall = the expected `doc_uri`s
(`expected_retrieved_context`) found among the retrieved chunks' `doc_uri`s / the expected ones.
ragpulse counts one yes/no per event: "yes" when the recall reaches `min_recall` (every
expected document, by default); the rationale gives the recall and the documents missed. The
verdict's `score` is the recall in [0, 1] (the reference's `retrieval/ground_truth/
document_recall`), so the window's mean recall and its count are exported
(`ragpulse_judge_score_sum` / `_count`, `score_mean` in windows.jsonl), as chunk_relevance's
precision is.
"""

from __future__ import annotations

import dataclasses

from ragpulse.judges.base import JudgeInput, Rating
from ragpulse.judges.local.judge import CannotGrade, LocalJudge

DEFAULT_MIN_RECALL = 1.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class DocumentRecallJudge(LocalJudge):
    """`document_recall`: "yes" when the retriever returned the expected documents."""

    name = "document_recall"

    min_recall: float = DEFAULT_MIN_RECALL

    def decide(self, item: JudgeInput) -> tuple[Rating, str, float]:
        expected = list(dict.fromkeys(c.doc_uri.strip() for c in item.expected_chunks if c.doc_uri))
        expected = [uri for uri in expected if uri]
        retrieved = {c.doc_uri.strip() for c in item.chunks if c.doc_uri}
        if item.chunks and not retrieved:
            raise CannotGrade(
                "no retrieved chunk has a doc_uri, so document_recall cannot match the "
                "expected documents"
            )
        missed = [uri for uri in expected if uri not in retrieved]
        found = len(expected) - len(missed)
        recall = found / len(expected)
        summary = f"recall {found}/{len(expected)} = {recall:.2f}"
        if not item.chunks:
            return "no", f"{summary}: nothing was retrieved.", recall
        if missed:
            shown = ", ".join(repr(u) for u in missed[:3])
            more = f" and {len(missed) - 3} more" if len(missed) > 3 else ""
            rating: Rating = "yes" if recall >= self.min_recall else "no"
            return rating, f"{summary}; not retrieved: {shown}{more}.", recall
        return "yes", f"{summary}: every expected document was retrieved.", recall
