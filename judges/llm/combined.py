"""One call, several verdicts: the LLM judges that read the same event graded in one request.

For `build_llm_judges` (`--judge-combine`). Groundedness, relevance_to_query and safety each send
the same question and answer (groundedness the retrieved chunks too); asked separately, an
event costs three requests, and the question, the answer and the frame every judge's prompt
repeats (fence rules, reply format) are paid for three times.
A `CombinedJudges` group sends one request per event: the system message holds every member's
rubric and one shared set of worked examples (fixed, so a provider's prompt cache serves it;
written to cost about half the prompt tokens of the separate calls), the user
message holds the event once, fenced as in `judges.llm.judge` (the union of the members' inputs),
and the reply is one JSON object with a `{"rationale", "rating"}` verdict per judge (or, with
`--judge-reply-format text`, `NAME rationale:` / `NAME rating:` lines).

Each member stays a judge of the panel (`CombinedMember`, with its own name, verdict and cache
entry): the first member asked about an event starts the group's call and the others await the
same call. So the panel, the verdict cache, the endpoint (its client, retries, breaker, quotas,
deadline) and redaction are the ones the separate judges use. A reply that is cut off, is not a
chat completion, or holds no readable object makes every verdict of the call `error` with that
cause; a reply that lacks one judge's verdict, or has a bad one, makes that verdict alone
`error` (unparsable). The call's token counts are shared out among the verdicts it gave, so the
per-judge token counters add up to what was spent.

A judge can be combined when it grades the answer as a whole from the question, history, chunks
and answer (`combinable`): not per-chunk judges (one call per chunk), not judges reading the
expected answer or guidelines (which vary per event in kind and length and would pull every
member's prompt along).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib.resources
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml

from ragpulse.judges.base import InputName, JudgeInput, Verdict
from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.judges.llm.fencing import new_nonce
from ragpulse.judges.llm.judge import (
    VERDICT_PROPERTIES,
    FewShotExample,
    JudgePrompt,
    JudgeReply,
    ReadVerdict,
    UnparsableReply,
    fence_rules,
    fenced_inputs,
    object_schema,
    reply_body,
    reply_verdicts,
    settings_digest,
    strict_schema,
    validate_reply,
    with_prompt_cut,
)
from ragpulse.judges.registry import JudgeEntry
from ragpulse.judges.verdict_cache import input_digest

# Bumped when the combined frame below changes (the members' files have their own versions).
# 3: the fence rules are judges.llm.judge's `fence_rules`, word for word.
# 4: an example on the question and passages of the one before shows them once; the opening
# and reply lines shorter (issue 33).
COMBINED_FRAME_VERSION = 4

# The inputs a combined call may show, in the order the user message shows them.
_COMBINABLE_INPUTS: tuple[InputName, ...] = ("history", "question", "chunks", "answer")


def combinable(prompt: JudgePrompt, entry: JudgeEntry) -> bool:
    """Whether a judge can be graded in a combined call (see the module docstring)."""
    return (
        not entry.per_chunk
        and prompt.scores is None  # the combined reply holds yes/no verdicts only
        and prompt.subject == "answer"
        and all(name in _COMBINABLE_INPUTS for name in prompt.inputs)
    )


# -- the prompt (pure) ----------------------------------------------------------------------------


def _example_line(name: InputName, example: FewShotExample) -> str | None:
    if name == "question":
        return f"question: {example.question}" if example.question else None
    if name == "answer":
        return f"answer: {example.answer}" if example.answer else None
    if name == "chunks":
        shown = " ".join(f"[{i}] {c}" for i, c in enumerate(example.chunks, start=1))
        return f"passages: {shown}" if shown else None
    if name == "history":
        return ("history: " + " / ".join(example.history)) if example.history else None
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class SharedExample:
    """One worked example of a combined call: its data once, and a verdict per judge."""

    question: str
    chunks: tuple[str, ...]
    answer: str
    verdicts: Mapping[str, tuple[str, str]]  # judge -> (rating, rationale)


@functools.lru_cache(maxsize=1)
def shared_examples() -> tuple[int, tuple[SharedExample, ...]]:
    """The version and the examples of judges/prompts/combined/shared_examples.yaml."""
    path = importlib.resources.files("ragpulse.judges") / "prompts" / "combined"
    return parse_shared_examples((path / "shared_examples.yaml").read_text(encoding="utf-8"))


def parse_shared_examples(text: str) -> tuple[int, tuple[SharedExample, ...]]:
    """The version and the examples of a shared-examples file's text.

    Raises ValueError on a verdict that is not exactly a rating and a rationale: an unquoted
    rationale with a comma ends at the comma in a YAML flow mapping, the rest becoming a key
    of its own, and half a rationale would be sent without a word."""
    data = yaml.safe_load(text)
    for example in data["examples"]:
        for name, verdict in example["verdicts"].items():
            if set(verdict) != {"rating", "rationale"}:
                raise ValueError(
                    f"shared example verdict of {name}: keys {sorted(verdict)}; expected rating "
                    "and rationale (quote a rationale that has a comma)"
                )
    return int(data["version"]), tuple(
        SharedExample(
            e["question"], tuple(e.get("chunks") or ()), e["answer"],
            {name: (v["rating"], v["rationale"]) for name, v in e["verdicts"].items()},
        )
        for e in data["examples"]
    )


def combined_system_prompt(prompts: Sequence[JudgePrompt]) -> str:
    """The fixed instructions of a combined call: each judge's rubric, one shared set of
    worked examples, the fence rules and the reply format. Depends only on the members, so it
    is byte-identical on every call (a provider's prompt cache serves it).

    Written to cost few tokens (it is most of a combined call's prompt): each rubric once,
    without its task line (the rubric says the same); one set of examples whose data is shown
    once with every judge's verdict (judges/prompts/combined/shared_examples.yaml), and an
    example on the question and passages of the one before without them again; a judge the
    set does not cover (a custom judge) keeping its own examples; the reply shape said once
    for all judges.
    """
    _, examples = shared_examples()
    covered = {p.name for p in prompts if all(p.name in e.verdicts for e in examples)}
    sections = []
    for prompt in prompts:
        own = []
        if prompt.name not in covered:
            for example in prompt.examples:
                shown = [_example_line(n, example) for n in prompt.inputs]
                data = "; ".join(s for s in shown if s)
                own.append(f"Example, {example.rating}: {data} -> {example.rationale}")
        sections.append("\n".join([f"## {prompt.name}", prompt.rubric.strip(), *own]))
    worked = []
    if covered:
        before: tuple[str, tuple[str, ...]] | None = None
        for i, shared in enumerate(examples, start=1):
            verdicts = "; ".join(
                f"{p.name} {shared.verdicts[p.name][0]}: {shared.verdicts[p.name][1]}"
                for p in prompts if p.name in covered
            )
            # An example asking the question of the one before, on its passages, shows them once.
            if (shared.question, shared.chunks) == before:
                data = ", same question and passages:"
            else:
                passages = " ".join(f"[{k}] {c}" for k, c in enumerate(shared.chunks, start=1))
                data = f": question: {shared.question}; passages: {passages};"
                before = (shared.question, shared.chunks)
            worked.append(f"Example {i}{data} answer: {shared.answer}\n  -> {verdicts}")
    names = [p.name for p in prompts]
    return (
        "You are an impartial judge grading one answer of a retrieval-augmented chatbot on "
        f"{len(prompts)} checks, each by its own rubric.\n\n"
        + "\n\n".join(sections)
        + ("\n\n" + "\n".join(worked) if worked else "")
        + f"\n\n{fence_rules(_shown_inputs(prompts))}\n\n"
        "Reply with only a JSON object, one key per check, each "
        '{"rationale": "<one sentence>", "rating": "yes" or "no"}; without JSON, per check '
        '"NAME rationale: ..." then "NAME rating: yes|no".\n'
        f"Verdicts wanted: {', '.join(names)}"
    )


def _shown_inputs(prompts: Sequence[JudgePrompt]) -> list[InputName]:
    """The inputs any member reads, in the order the user message shows them."""
    return [n for n in _COMBINABLE_INPUTS if any(n in p.inputs for p in prompts)]


def combined_user_prompt(prompts: Sequence[JudgePrompt], item: JudgeInput, nonce: str) -> str:
    """The per-event message: each input any member reads, once, in its own fence."""
    blocks = fenced_inputs(_shown_inputs(prompts), item, nonce)
    return f"{blocks}\nGrade the answer above on each check."


def combined_schema(names: Sequence[str]) -> dict[str, Any]:
    """The strict json_schema of a combined reply: one verdict object per judge."""
    verdict = object_schema(VERDICT_PROPERTIES)
    return strict_schema("judge_verdicts", {name: verdict for name in names})


# -- parsing the reply (pure) ---------------------------------------------------------------------

_NAMED_LABEL = re.compile(
    r"^[\s*#>_-]*([a-z0-9_]+)[\s*_.:-]*\b(rationale|rating)[\s*_]*:[\s*_]*(.*)$", re.IGNORECASE
)


def parse_combined_reply(
    text: str | None, names: Sequence[str]
) -> dict[str, JudgeReply | UnparsableReply]:
    """Each judge's verdict in a combined reply: a JSON object keyed by judge name, or
    `NAME rationale:` / `NAME rating:` lines.

    Raises `UnparsableReply` when the reply as a whole is unreadable (empty, broken JSON, no
    verdict line at all); a judge whose verdict is missing or invalid gets an `UnparsableReply`
    of its own in the result, and the others keep theirs.
    """
    body = reply_body(text)
    found: dict[str, object] = {}
    if isinstance(body, dict):
        found = {name: body[name] for name in names if name in body}
    else:
        lines: dict[str, dict[str, list[str]]] = {}
        for line in body.splitlines():
            labelled = _NAMED_LABEL.match(line)
            if labelled and labelled.group(1).lower() in names:
                fields = lines.setdefault(labelled.group(1).lower(), {})
                fields.setdefault(labelled.group(2).lower(), []).append(labelled.group(3))
        if not lines:
            raise UnparsableReply("the reply has neither a JSON object nor 'NAME rating:' lines")
        for name, fields in lines.items():
            ratings = fields.get("rating", [])
            if len(ratings) > 1:
                found[name] = f"{len(ratings)} '{name} rating:' lines; expected one"
            elif ratings:
                found[name] = {
                    "rationale": " ".join(fields.get("rationale", [])),
                    "rating": ratings[0],
                }
    verdicts: dict[str, JudgeReply | UnparsableReply] = {}
    for name in names:
        if name not in found:
            verdicts[name] = UnparsableReply(f"the combined reply has no verdict for {name}")
        elif isinstance(found[name], str):
            verdicts[name] = UnparsableReply(str(found[name]))
        elif not isinstance(found[name], dict):
            verdicts[name] = UnparsableReply(f"the verdict for {name} is not an object")
        else:
            try:
                verdicts[name] = validate_reply(JudgeReply, found[name])
            except UnparsableReply as exc:
                verdicts[name] = exc
    return verdicts


# -- the group and its members --------------------------------------------------------------------


class CombinedJudges:
    """The judges graded together: one endpoint call per event for all of them.

    `members` are the panel's judges (`CombinedMember`), in the order of `prompts`.
    """

    def __init__(
        self,
        prompts: Sequence[tuple[JudgePrompt, JudgeEntry]],
        endpoint: OpenAIJudgeEndpoint,
        redact: Callable[[JudgeInput], JudgeInput] | None = None,
    ) -> None:
        if len(prompts) < 2:
            raise ValueError("a combined call needs at least two judges")
        for prompt, entry in prompts:
            if not combinable(prompt, entry):
                raise ValueError(f"judge {prompt.name} cannot be graded in a combined call")
        self.prompts = tuple(p for p, _ in prompts)
        self.entries = {p.name: e for p, e in prompts}
        self.endpoint = endpoint
        self.redact = redact
        self._system = combined_system_prompt(self.prompts)
        self.version = self._version()
        self.members = tuple(CombinedMember(self, p.name) for p in self.prompts)
        # Calls under way, by event: the members asked about the same event share one.
        self._calls: dict[bytes, asyncio.Task[dict[str, Verdict]]] = {}

    def _version(self) -> str:
        digest = settings_digest(self._system, self.endpoint, self.redact is not None)
        versions = "+".join(f"{p.name} v{p.version}" for p in self.prompts)
        examples = shared_examples()[0]
        return f"combined v{COMBINED_FRAME_VERSION} ({versions}, examples v{examples}) {digest}"

    def messages(
        self, prompts: Sequence[JudgePrompt], item: JudgeInput, nonce: str
    ) -> list[dict[str, str]]:
        """The chat messages of one combined call (redacted when configured)."""
        if self.redact is not None:
            item = self.redact(item)
        return [
            {"role": "system", "content": self._system},
            {"role": "user", "content": combined_user_prompt(prompts, item, nonce)},
        ]

    async def verdict(self, name: str, item: JudgeInput) -> Verdict:
        """Member `name`'s verdict on `item`, from the group's one call about it."""
        missing = self.entries[name].verdict_if_missing(item)
        if missing is not None:
            return missing
        key = input_digest(item)
        call = self._calls.get(key)
        if call is None:
            call = asyncio.get_running_loop().create_task(self._grade(item))
            self._calls[key] = call
            call.add_done_callback(lambda _: self._calls.pop(key, None))
        return (await call)[name]

    async def _grade(self, item: JudgeInput) -> dict[str, Verdict]:
        # Members that lack an input have their verdict without a call; the call asks for
        # the others' (the system message stays the same, so the prompt cache still serves it).
        graded = [p for p in self.prompts if self.entries[p.name].verdict_if_missing(item) is None]
        names = [p.name for p in graded]
        outcome = await self.endpoint.complete(
            "+".join(names),
            self.messages(self.prompts, item, new_nonce()),
            json_schema=combined_schema(names),
            max_tokens=self.endpoint.max_tokens * len(names),
        )
        verdicts = reply_verdicts(
            names, outcome, self.endpoint.max_tokens * len(names), _reader(names)
        )
        # Each member's cut is that of its own inputs, as its single call's would be.
        return {p.name: with_prompt_cut(verdicts[p.name], p.inputs, item) for p in graded}


def _reader(
    names: Sequence[str],
) -> Callable[[str | None], dict[str, ReadVerdict | UnparsableReply]]:
    """The `read` of `reply_verdicts` for a combined reply asking for `names`' verdicts."""

    def read(text: str | None) -> dict[str, ReadVerdict | UnparsableReply]:
        return {
            name: reply if isinstance(reply, UnparsableReply) else (reply.rating, reply.rationale)
            for name, reply in parse_combined_reply(text, names).items()
        }

    return read


@dataclasses.dataclass(eq=False)
class CombinedMember:
    """One judge of a `CombinedJudges` group, as the panel sees it: its own name, version
    (for the verdict cache) and verdict."""

    group: CombinedJudges
    name: str

    @property
    def version(self) -> str:
        return self.group.version

    async def judge(self, item: JudgeInput) -> Verdict:
        """This judge's verdict on `item`, from the group's call about it."""
        return await self.group.verdict(self.name, item)

    async def aclose(self) -> None:
        """Close the shared endpoint's client on this loop (a no-op when already closed)."""
        await self.group.endpoint.aclose()


def group_judges(
    prompts: Sequence[tuple[JudgePrompt, JudgeEntry]],
    endpoint: OpenAIJudgeEndpoint,
    redact: Callable[[JudgeInput], JudgeInput] | None,
) -> Mapping[str, CombinedMember]:
    """The members of one group of the combinable judges among `prompts`, by name; empty when
    fewer than two can be combined (then each runs on its own)."""
    eligible = [(p, e) for p, e in prompts if combinable(p, e)]
    if len(eligible) < 2:
        return {}
    return {m.name: m for m in CombinedJudges(eligible, endpoint, redact).members}
