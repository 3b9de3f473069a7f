"""Building the LLM judges of a run: one per judge name, sharing one endpoint, with the
operator's custom judges, ensembles and combined calls around the plain `LLMJudge`.

Apart from `judges.llm.judge` (the prompt, the reply and the one-call judge) so that the prompt and
reply code never imports the judges built on it (combined calls, ensembles, custom judges).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from pathlib import Path

from ragpulse.judges.base import Guideline, Judge, JudgeInput
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.llm.combined import group_judges
from ragpulse.judges.llm.custom import CustomJudge
from ragpulse.judges.llm.ensemble import Ensemble, EnsembleJudge
from ragpulse.judges.llm.judge import JudgePrompt, LLMJudge, load_prompt
from ragpulse.judges.registry import (
    DEFAULT_SCORE_THRESHOLD,
    JudgeEntry,
    judge_entry,
    session_judge_entry,
)


def build_llm_judges(
    names: Sequence[str],
    endpoint: OpenAIJudgeEndpoint,
    prompts_dir: Path | None = None,
    redact: Callable[[JudgeInput], JudgeInput] | None = None,
    guidelines: tuple[Guideline, ...] = (),
    custom: Sequence[CustomJudge] = (),
    score_threshold: float = DEFAULT_SCORE_THRESHOLD,
    embeddings_model: str | None = None,
    ensembles: Sequence[Ensemble] = (),
    combine: bool = False,
) -> list[Judge]:
    """One LLM judge per name, all sharing `endpoint`; ValueError names an unknown judge.

    `prompts_dir` replaces the shipped prompt files (e.g. a mounted ConfigMap); `redact`
    (e.g. `judges.redaction.Redactor.judge_input`) rewrites each event before it is prompted;
    `guidelines` are added to every event's own (for the judges whose prompt shows them);
    `custom` are the operator's judges (`--custom-judge`), already loaded and validated. The
    scored judges (judges.llm.claim_scores) rate "yes" at `score_threshold` or above, and
    answer_correctness blends in the similarity of `embeddings_model`'s embeddings when given;
    `ensembles` (`--ensemble`) make a judge the majority of several models (judges.llm.ensemble).
    A deterministic judge (no model, e.g. document_recall) is its local implementation.
    With `combine` (`--judge-combine`), the judges that can be graded together get one call
    per event between them (`judges.llm.combined`); the others (ensembles, scored, per-chunk and
    graded-scale judges, those reading ground truth) are asked on their own.
    """
    by_name = {c.entry.name: c for c in custom}
    members = {e.judge: e.models for e in ensembles}
    built: dict[str, Judge] = {}
    # The plain one-verdict judges, the ones a combined call may take over.
    plain: list[tuple[JudgePrompt, JudgeEntry]] = []
    for name in names:
        mine = by_name.get(name)
        if mine is not None:
            prompt, entry = mine.prompt, mine.entry
        elif judge_entry(name).deterministic:
            # Needs no model (document_recall): the same judge as on the local backend.
            built[name] = judge_entry(name).build_local()
            continue
        elif (scored := judge_entry(name).scored) is not None:
            module, _, cls = scored.partition(":")
            built[name] = getattr(importlib.import_module(module), cls)(
                endpoint, redact, threshold=score_threshold, embeddings_model=embeddings_model
            )
            continue
        else:
            prompt, entry = load_prompt(name, prompts_dir), judge_entry(name)
        judge = LLMJudge(prompt, endpoint, redact, guidelines, entry)
        models = members.get(name)
        if models is None:
            built[name] = judge
            plain.append((prompt, entry))
        else:
            built[name] = EnsembleJudge(judge, models)
    if combine:
        built.update(group_judges(plain, endpoint, redact))
    return [built[name] for name in names]


def build_session_judges(
    names: Sequence[str],
    endpoint: OpenAIJudgeEndpoint | None,
    prompts_dir: Path | None = None,
    redact: Callable[[JudgeInput], JudgeInput] | None = None,
    custom: Sequence[CustomJudge] = (),
) -> list[Judge]:
    """One session judge per name (judges.sessions): on the openai backend (`endpoint` given)
    an `LLMJudge` of the judge's conversation prompt, one call per session with the transcript
    fenced and `redact`ed; on the local backend (`endpoint` None) the local implementation.
    `custom` are the operator's judges; those with assessment SESSION are session judges.
    ValueError names an unknown session judge or one without an implementation on the backend.
    """
    mine = {c.entry.name: c for c in custom if c.entry.session}
    built: list[Judge] = []
    for name in names:
        entry = session_judge_entry(name, tuple(c.entry for c in mine.values()))
        if endpoint is None:
            if entry.local is None:
                raise ValueError(f"session judge {name} has no local implementation")
            built.append(entry.build_local())
            continue
        prompt = mine[name].prompt if name in mine else load_prompt(name, prompts_dir)
        built.append(LLMJudge(prompt, endpoint, redact, entry=entry))
    return built
