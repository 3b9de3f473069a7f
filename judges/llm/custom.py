"""Custom LLM judges: an operator's YAML file, validated at start-up, graded like a shipped judge.

For operators (`--custom-judge FILE`, repeatable) and for `JudgeSettings`, which loads each file
once in `main()` and carries the result in the `JudgeSpec` (so a Beam worker in another process
or on another machine needs no copy of the file). A file has the keys of a shipped prompt file
(judges/prompts/*.yaml: name, version, ratings, subject, inputs, task, rubric, one example per
rating), plus what the registry says of a shipped judge:

    requires: [question, answer]      # inputs an event must have (JudgeInput.lacks); default none
    when_missing: "no pricing text"   # optional: rate such an event "no" with this rationale;
                                      # without it the judge is skipped for such an event
    assessment: RETRIEVAL             # optional, Agent Evaluation's assessment type: ANSWER
                                      # (one verdict per event, the default) or RETRIEVAL (one
                                      # per retrieved chunk, aggregated as precision); it must
                                      # agree with `subject` (passage for RETRIEVAL)
    assessment: SESSION               # a session judge (judges.sessions): one verdict per
                                      # conversation, named in --session-judges; with
                                      # subject: conversation and inputs: [transcript]

A file may grade on a scale (`scale: "0-3"` or `"1-5"`, a `pass_score` on it, and one example
per score, as deploy/samples/comprehensiveness.yaml; judges.llm.judge): its verdict is "yes" at or
above the pass score, and its score is counted for the mean (ragpulse_judge_score).

`name` ([a-z0-9_]+) must not be a shipped judge's. The judge runs on the openai backend only,
when `--judges` names it; its prompt is built, fenced and redacted like every LLM judge's
(judges.llm.judge), and its verdicts are counted under its name like any judge's.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ragpulse.judges.base import InputName
from ragpulse.judges.llm.judge import JudgePrompt
from ragpulse.judges.registry import JudgeEntry, judge_table
from ragpulse.judges.yaml_file import YamlFileError, loads, read_text

_OWN_KEYS = ("requires", "when_missing", "assessment")


@dataclasses.dataclass(frozen=True, slots=True)
class CustomJudge:
    """One operator-defined judge: its registry entry and its validated prompt (picklable)."""

    entry: JudgeEntry
    prompt: JudgePrompt


class _RegistryKeys(BaseModel):
    """The keys a custom judge's file adds to a prompt file (what the registry says of it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    requires: tuple[InputName, ...] = ()
    when_missing: str | None = Field(None, min_length=1)
    assessment: Literal["ANSWER", "RETRIEVAL", "SESSION"] | None = None


class CustomJudgeError(ValueError):
    """A custom judge file that cannot be used; the message is one line naming file and key."""


def load_custom_judge(path: Path) -> CustomJudge:
    """Read and validate one custom judge file; CustomJudgeError names the file, the key and
    (when known) its line."""
    try:
        text = read_text(path)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CustomJudgeError(f"custom judge file {path}: cannot read it ({reason})") from None
    except YamlFileError as exc:
        raise CustomJudgeError(f"custom judge file {path}: {exc}") from None
    try:
        data = loads(text)
        root = yaml.compose(text, Loader=yaml.SafeLoader)  # for the line of a bad key
    except YamlFileError as exc:
        raise CustomJudgeError(f"custom judge file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise CustomJudgeError(
            f"custom judge file {path}: must be a mapping of keys (name, version, ratings, "
            "inputs, task, rubric, examples, requires)"
        )

    def fail(loc: tuple[Any, ...], message: str) -> CustomJudgeError:
        if not loc:
            return CustomJudgeError(f"custom judge file {path}: {message}")
        key = ".".join(str(p) for p in loc)
        line = _line_of(root, loc)
        at = f" (line {line})" if line is not None else ""
        return CustomJudgeError(f"custom judge file {path}: key {key!r}{at}: {message}")

    own = {k: data.pop(k) for k in _OWN_KEYS if k in data}
    try:
        keys = _RegistryKeys.model_validate(own)
        prompt = JudgePrompt.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise fail(tuple(first["loc"]), first["msg"].removeprefix("Value error, ")) from None
    unshown = [r for r in keys.requires if r not in prompt.inputs]
    if unshown:
        raise fail(
            ("requires",),
            f"{', '.join(unshown)} is required but not shown to the judge (add it to inputs)",
        )
    if (keys.assessment == "SESSION") != (prompt.subject == "conversation"):
        fix = "conversation" if keys.assessment == "SESSION" else "answer (or leave it out)"
        raise fail(
            ("subject",),
            f"a judge of the whole conversation has assessment SESSION and subject conversation:"
            f" set subject: {fix}" + ("" if keys.assessment == "SESSION" else
                                      " or assessment: SESSION"),
        )
    if keys.assessment not in (None, "SESSION") and (keys.assessment == "RETRIEVAL") != (
        prompt.subject == "passage"
    ):
        fix = "passage" if keys.assessment == "RETRIEVAL" else "answer (or leave it out)"
        raise fail(
            ("subject",),
            f"assessment {keys.assessment} grades "
            f"{'each retrieved chunk' if keys.assessment == 'RETRIEVAL' else 'the answer'}: "
            f"set subject: {fix}",
        )
    if prompt.subject == "passage" and "chunks" not in keys.requires:
        # One call per chunk: an event without chunks would otherwise get no verdict at all.
        raise fail(("requires",), "a judge of each passage (subject: passage) requires chunks")
    entry = JudgeEntry(
        prompt.name,
        prompt=str(path),
        requires=keys.requires,
        optional=tuple(i for i in prompt.inputs if i not in keys.requires),
        when_missing=keys.when_missing,
        per_chunk=prompt.subject == "passage",
        default=False,
        session=keys.assessment == "SESSION",
    )
    try:
        judge_table((entry,))
    except ValueError as exc:
        raise fail(("name",), str(exc)) from None
    return CustomJudge(entry, prompt)


def load_custom_judges(paths: tuple[Path, ...]) -> tuple[CustomJudge, ...]:
    """Every file of `--custom-judge`, validated; CustomJudgeError when two take one name."""
    judges = tuple(load_custom_judge(p) for p in paths)
    try:
        judge_table(tuple(j.entry for j in judges))
    except ValueError as exc:
        raise CustomJudgeError(f"--custom-judge files: {exc}") from None
    return judges


def _line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """The 1-based line of the value at `loc` (keys and list indexes) in a composed YAML tree,
    or of the deepest part of it that exists."""
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            found = next((kv for kv in node.value if kv[0].value == part), None)
            if found is None:
                break
            line, node = found[0].start_mark.line + 1, found[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
