"""The judge registry: every judge ragpulse knows, in one table that everything else reads.

For whoever adds a judge: add one `JudgeEntry` to `_ENTRIES`, with its implementations (a local
class, an LLM prompt file in judges/prompts/, or both). Operators add LLM judges without code
(`--custom-judge FILE`, judges.llm.custom): `judge_table` is the shipped entries plus theirs. The
`--judges` flag and its help, the settings validation, the canaries' labels, the local judge
factory and the LLM prompt lookup all read this table, so nothing else lists judge names.

Importing this module imports no judge implementation: Beam workers and the CLI read names here,
and a local judge's module (lexicons, stemmer) is imported when the judge is built.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
from collections.abc import Mapping, Sequence
from typing import Literal, get_args

from ragpulse.judges.base import InputName, Judge, JudgeInput, Verdict

Backend = Literal["local", "openai"]
BACKENDS: tuple[Backend, ...] = get_args(Backend)


@dataclasses.dataclass(frozen=True, slots=True)
class JudgeEntry:
    """One judge: its name, its implementations, and what an event must hold for it to grade.

    `local` is the offline implementation as "module:Class" (a class taking no arguments),
    `prompt` the LLM implementation's file in judges/prompts/, `scored` an LLM implementation
    that computes a 0..1 score and rates "yes" at --judge-score-threshold or above
    ("module:Class", see judges.llm.claim_scores); a judge has at least one of them.
    `requires` are the inputs without which the judge does not grade (see `JudgeInput.lacks`):
    the judge is `skipped` for such an event (counted in ragpulse_judge_skipped_total, never a
    yes, no or error, never in a window), or, with `when_missing`, rated "no" with that
    rationale, where the absence itself fails the check (nothing retrieved grounds nothing).
    `optional` are inputs the judge reads when the event has them. A judge that reads the
    expected answer ("expected", required or optional) rates an event giving both
    `expected_response` and `expected_facts` `error` with cause `input`, as the input schema
    says. `per_chunk` judges rate each retrieved chunk on its own (Agent Evaluation's
    chunk_relevance); the event's one verdict is "yes" when at least one chunk is rated "yes"
    (judges.chunk_verdicts). `default` judges run when `--judges` is not given.
    A `deterministic` judge needs no model: its local implementation is the judge's definition
    (document_recall counts documents), so it runs the same whatever the backend.
    A `session` judge grades a whole conversation (judges.sessions), once per session: its input
    is the session's transcript, and it is named in --session-judges, never in --judges.
    """

    name: str
    local: str | None = None
    prompt: str | None = None
    scored: str | None = None
    requires: tuple[InputName, ...] = ()
    optional: tuple[InputName, ...] = ()
    when_missing: str | None = None
    per_chunk: bool = False
    default: bool = True
    deterministic: bool = False
    session: bool = False

    def __post_init__(self) -> None:
        if self.local is None and self.prompt is None and self.scored is None:
            raise ValueError(f"judge {self.name} has no implementation (local, prompt, scored)")
        if self.deterministic and (self.local is None or self.prompt or self.scored):
            raise ValueError(f"deterministic judge {self.name} has exactly a local implementation")

    @property
    def backends(self) -> tuple[Backend, ...]:
        """The backends that implement this judge (all of them for a deterministic judge)."""
        if self.deterministic:
            return BACKENDS
        made = {
            "local": self.local is not None,
            "openai": self.prompt is not None or self.scored is not None,
        }
        return tuple(b for b in BACKENDS if made[b])

    def build_local(self) -> Judge:
        """A new instance of the offline implementation (its module is imported now)."""
        if self.local is None:
            raise ValueError(f"judge {self.name} has no local implementation")
        module, _, cls = self.local.partition(":")
        judge: Judge = getattr(importlib.import_module(module), cls)()
        return judge

    def verdict_if_missing(self, item: JudgeInput) -> Verdict | None:
        """The verdict of an event that lacks a required input (or gives two exclusive ones),
        or None when the judge can grade it."""
        if item.both_expected and "expected" in self.requires + self.optional:
            return Verdict(
                self.name,
                "error",
                error_message="the event gives both expected_response and expected_facts; "
                "the input schema allows one of them",
                error_cause="input",
            )
        missing = item.lacks(self.requires) if self.requires else None
        if not missing:
            return None
        if self.when_missing is not None:
            return Verdict(self.name, "no", self.when_missing)
        fields = " and ".join(_FIELDS.get(name, name) for name in missing)
        # Not an error: most production events carry no ground truth, and a judge against it
        # that "failed" on each of them would drown its real errors and bend no ratio.
        return Verdict(
            self.name,
            "skipped",
            f"skipped: {self.name} needs {fields}; the event has none",
            missing=tuple(missing),
        )


# Inputs whose event field has another name, as rationales name them.
_FIELDS: Mapping[str, str] = {
    "expected": "expected_response or expected_facts",
    "expected_chunks": "expected_retrieved_context with doc_uri",
    "tool_calls": "tool calls (tool_calls, or tool spans in its trace)",
}


_ENTRIES = (
    JudgeEntry(
        "groundedness",
        local="ragpulse.judges.local.groundedness:GroundednessJudge",
        prompt="groundedness.yaml",
        requires=("chunks",),
        # A retrieval outage shows on the retrieval panels, not as a judge error.
        when_missing="no retrieved context to support the answer",
    ),
    JudgeEntry("safety", local="ragpulse.judges.local.safety:SafetyJudge", prompt="safety.yaml"),
    JudgeEntry(
        "relevance_to_query",
        local="ragpulse.judges.local.relevance:RelevanceToQueryJudge",
        prompt="relevance_to_query.yaml",
    ),
    # The retrieval judges and the judges against ground truth are opt-in (--judges): most
    # production events carry no ground truth, and chunk_relevance costs a call per chunk.
    JudgeEntry(
        "chunk_relevance",
        local="ragpulse.judges.local.chunk_relevance:ChunkRelevanceJudge",
        prompt="chunk_relevance.yaml",
        requires=("question", "chunks"),
        when_missing="nothing was retrieved, so no retrieved chunk is relevant",
        per_chunk=True,
        default=False,
    ),
    JudgeEntry(
        "context_sufficiency",
        local="ragpulse.judges.local.context_sufficiency:ContextSufficiencyJudge",
        prompt="context_sufficiency.yaml",
        requires=("question", "chunks"),
        # Without an expected answer the question alone says what the context must hold, so
        # the judge also runs on production traffic (the reference judge requires one).
        optional=("expected",),
        when_missing="nothing was retrieved, so the context cannot be sufficient",
        default=False,
    ),
    JudgeEntry(
        "correctness",
        local="ragpulse.judges.local.correctness:CorrectnessJudge",
        prompt="correctness.yaml",
        requires=("expected",),
        default=False,
    ),
    JudgeEntry(
        "document_recall",
        local="ragpulse.judges.local.document_recall:DocumentRecallJudge",
        requires=("expected_chunks",),
        default=False,
        deterministic=True,
    ),
    JudgeEntry(
        "guideline_adherence",
        prompt="guideline_adherence.yaml",
        requires=("guidelines",),
        default=False,
    ),
    # Ragas' claim-based scores (judges.llm.claim_scores): one call splits the answer into claims
    # and checks each, against the retrieved context or against the expected answer.
    JudgeEntry(
        "faithfulness",
        scored="ragpulse.judges.llm.claim_scores:FaithfulnessJudge",
        requires=("chunks",),
        when_missing="no retrieved context to support the answer",
        default=False,
    ),
    JudgeEntry(
        "answer_correctness",
        scored="ragpulse.judges.llm.claim_scores:AnswerCorrectnessJudge",
        requires=("expected",),
        default=False,
    ),
    # The agent's tool calls (pipeline.formats.events `tool_calls`): opt-in, and skipped for an
    # event without tool calls, so a chatbot that calls no tool pays nothing for them.
    JudgeEntry(
        "tool_call_errors",
        local="ragpulse.judges.local.tool_calls:ToolCallErrorsJudge",
        requires=("tool_calls",),
        default=False,
        deterministic=True,
    ),
    JudgeEntry(
        "tool_selection",
        prompt="tool_selection.yaml",
        requires=("tool_calls",),
        default=False,
    ),
    JudgeEntry(
        "tool_arguments",
        prompt="tool_arguments.yaml",
        requires=("tool_calls",),
        default=False,
    ),
)

# The session judges (judges.sessions): each grades one whole conversation in one call (or, the
# local user_frustration, from its lexical signals). Apart from `JUDGES`, so that --judges and
# everything that lists the per-answer judges never offers them.
_SESSION_ENTRIES = (
    JudgeEntry(
        "conversation_completeness",
        prompt="conversation_completeness.yaml",
        requires=("transcript",),
        default=False,
        session=True,
    ),
    JudgeEntry(
        "knowledge_retention",
        prompt="knowledge_retention.yaml",
        requires=("transcript",),
        default=False,
        session=True,
    ),
    JudgeEntry(
        "user_frustration",
        local="ragpulse.judges.local.frustration:UserFrustrationJudge",
        prompt="user_frustration.yaml",
        requires=("transcript",),
        default=False,
        session=True,
    ),
)
SESSION_JUDGES: Mapping[str, JudgeEntry] = {e.name: e for e in _SESSION_ENTRIES}

# A scored judge's rating is "yes" when its score is at least this (--judge-score-threshold):
# for faithfulness, 7 claims of 10 supported; for answer_correctness, a claim F1 of 0.7.
DEFAULT_SCORE_THRESHOLD = 0.7

JUDGES: Mapping[str, JudgeEntry] = {e.name: e for e in _ENTRIES}
JUDGE_NAMES: tuple[str, ...] = tuple(JUDGES)
DEFAULT_JUDGES: tuple[str, ...] = tuple(e.name for e in _ENTRIES if e.default)


def judge_table(custom: Sequence[JudgeEntry] = ()) -> Mapping[str, JudgeEntry]:
    """The shipped judges, then the operator's custom ones (`--custom-judge`, judges.llm.custom).

    Custom entries are passed in rather than registered in a global, so that a Beam worker in
    another process knows them from its `JudgeSpec` alone. ValueError when a custom judge
    takes a name that is already used.
    """
    if not custom:
        return JUDGES
    table = dict(JUDGES)
    for entry in custom:
        if entry.name in table or entry.name in SESSION_JUDGES:
            shipped = entry.name in JUDGES or entry.name in SESSION_JUDGES
            taken = "a shipped judge" if shipped else "another custom judge"
            raise ValueError(f"custom judge name {entry.name!r} is taken by {taken}")
        table[entry.name] = entry
    return table


def session_judge_entry(name: str, custom: Sequence[JudgeEntry] = ()) -> JudgeEntry:
    """The entry of session judge `name` (shipped, or a custom one with assessment SESSION);
    ValueError lists the session judges."""
    table = dict(SESSION_JUDGES) | {e.name: e for e in custom if e.session}
    entry = table.get(name)
    if entry is None:
        raise ValueError(f"unknown session judge {name!r}; session judges: {', '.join(table)}")
    return entry


def judge_entry(name: str, custom: Sequence[JudgeEntry] = ()) -> JudgeEntry:
    """The registry entry of judge `name`; ValueError lists the known judges."""
    table = judge_table(custom)
    entry = table.get(name)
    if entry is None:
        raise ValueError(f"unknown judge {name!r}; known judges: {', '.join(table)}")
    return entry


def check_judge_names(
    names: Sequence[str], backend: Backend | None = None, custom: Sequence[JudgeEntry] = ()
) -> None:
    """Raise a one-line ValueError unless `names` lists known judges (shipped or `custom`),
    each once, at least one, all implemented on `backend` (when given)."""
    table = judge_table(custom)
    if not names:
        raise ValueError(f"no judge given; known judges: {', '.join(table)}")
    sessions = [n for n in names if n in SESSION_JUDGES or (n in table and table[n].session)]
    if sessions:
        raise ValueError(
            f"{', '.join(sessions)} grade(s) whole conversations: name them in --session-judges,"
            " not in --judges"
        )
    unknown = [i for i, n in enumerate(names, 1) if n not in table]
    if unknown:
        # Which ones by position, not by name: a value from a config file or the environment
        # may be a secret in the wrong place, and errors never show one.
        close = {m for n in names if n not in table
                 for m in difflib.get_close_matches(n, list(table), n=1, cutoff=0.75)}
        hint = f" (did you mean {', '.join(sorted(close))}?)" if close else ""
        raise ValueError(
            f"unknown judge name(s) at position {', '.join(map(str, unknown))} of "
            f"{len(names)}{hint}; known judges: {', '.join(table)}"
        )
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"judge(s) {', '.join(repeated)} listed more than once; name each once")
    if backend is not None:
        missing = [n for n in names if backend not in table[n].backends]
        if missing:
            on = [n for n, e in table.items() if backend in e.backends]
            raise ValueError(
                f"judge(s) {', '.join(missing)} have no {backend} implementation; judges on "
                f"{backend}: {', '.join(on)}"
            )


def judges_help() -> str:
    """The judges and their backends, for help texts: "groundedness (local, openai), ...",
    "document_recall (any backend, no model)"."""
    return ", ".join(
        f"{e.name} ({'any backend, no model' if e.deterministic else ', '.join(e.backends)})"
        for e in JUDGES.values()
    )
