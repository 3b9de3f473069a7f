"""The local (offline, deterministic, model-free) judge backend.

For deployments without an LLM endpoint, or as a cheap always-on screen: three lexical judges
that keep up with thousands of events per second on one core. Their agreement with human
labels is measured by tests/bench/eval_local_judges.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from judges.base import Judge
from judges.local_groundedness import GroundednessJudge
from judges.local_relevance import RelevanceToQueryJudge
from judges.local_safety import SafetyJudge

__all__ = ["GroundednessJudge", "RelevanceToQueryJudge", "SafetyJudge", "build_local_judges"]

_FACTORIES: dict[str, Callable[[], Judge]] = {
    "groundedness": GroundednessJudge,
    "safety": SafetyJudge,
    "relevance_to_query": RelevanceToQueryJudge,
}


def build_local_judges(names: Sequence[str]) -> list[Judge]:
    """One local judge per name, in the order given (used by `JudgeSpec.build`)."""
    unknown = [n for n in names if n not in _FACTORIES]
    if unknown:
        raise ValueError(
            f"no local judge named {', '.join(unknown)}; local judges: {', '.join(_FACTORIES)}"
        )
    return [_FACTORIES[n]() for n in names]
