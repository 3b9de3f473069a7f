"""The values that flow through ragpulse: a raw record as a reader found it, a record that
is not judged and why, an accepted event, and an event with its verdicts.

Typed data only; how a record becomes an event is pipeline/formats/ (events.py for ragpulse's
own events, otlp.py for traces), and the stages that move them are pipeline/stages/.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ragpulse.judges.base import JudgeInput, ToolCall, Verdict
from ragpulse.judges.sessions import Session

# What a reader (file or Kafka) keeps of a record over the size limit: enough to recognise it
# in a dead letter, never the whole value (a 10 MB record would also exceed the dead-letter
# producer's limit).
HEAD_BYTES = 4096


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One raw record as a reader found it, with where it came from.

    `partition` is the Kafka partition (None for a file): the watermark is kept per partition.
    """

    raw: bytes
    origin: str  # a file path, or the topic
    partition: int | None  # Kafka partition; None for a file
    position: int  # 1-based line number, or Kafka offset
    record_time: float | None = None  # Kafka record time (epoch seconds), used without `timestamp`
    oversize_bytes: int | None = None  # set when the reader refused to load an over-long record
    # Set when the reader already found the record unusable (pipeline.formats.otlp: a trace that
    # cannot be assembled, a malformed OTLP request): the dead-letter reason.
    refused: str | None = None

    @property
    def source(self) -> str:
        """Where the record came from, as dead-letter rows name it: a path, or topic/partition."""
        return self.origin if self.partition is None else f"{self.origin}/{self.partition}"


@dataclass(frozen=True, slots=True)
class Rejected:
    """A record that is not judged (invalid, over the size limit, or late), with the reason."""

    record: SourceRecord
    reason: str


@dataclass(frozen=True, slots=True)
class InferenceRecord:
    """One accepted event: its identity, event time (epoch seconds, UTC), labels, judge input."""

    request_id: str
    event_time: float
    app: str
    model: str
    judge_input: JudgeInput
    feedback: str | None = None
    # Set by sampling (pipeline/stages/parse.py) under --sampling-rules or a judge budget: the
    # event's stratum and its weight, 1 / the rate it was sampled at. None: not stratified.
    stratum: str | None = None
    weight: float = 1.0
    span_id: str | None = None  # OpenTelemetry span of the answer, when it came from a trace
    # The chatbot's own cost and latency for this answer, when the event gives them.
    usage: AgentUsage | None = None
    latency_seconds: float | None = None
    session_id: str | None = None  # the conversation of this turn, when the event names one
    # Set on the record a session judge grades (pipeline.stages.sessions): the whole conversation.
    session: Session | None = None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The agent's tool calls for this answer (empty when none): they are part of what the
        judges read, so they live on `judge_input`."""
        return self.judge_input.tool_calls


@dataclass(frozen=True, slots=True)
class AgentUsage:
    """The chatbot's token counts for one answer (Agent Evaluation's agent/*_token_count);
    None where the event does not say."""

    input_tokens: int | None
    output_tokens: int | None
    total_tokens: int | None


@dataclass(frozen=True, slots=True)
class JudgedEvent:
    """An event and one verdict per judge of the panel, with each judge's prompt version."""

    record: InferenceRecord
    verdicts: tuple[Verdict, ...]
    # The `version` label of each verdict (the panel's `prompt_versions`, one shared tuple).
    versions: tuple[str, ...] = ()

    def versioned(self) -> Iterator[tuple[Verdict, str]]:
        """Each verdict with its judge's prompt version ("" when none was recorded)."""
        versions = self.versions or ("",) * len(self.verdicts)
        return zip(self.verdicts, versions, strict=True)


@dataclass(frozen=True, slots=True)
class QueuedVerdict:
    """One judge's verdict published in a review item (stages/review.py): what a reviewer's
    label of it is checked against (stages/labels.py)."""

    event_id: str
    judge: str
    prompt_version: str


def with_parts(
    verdicts: tuple[Verdict, ...], versions: tuple[str, ...]
) -> tuple[tuple[Verdict, ...], tuple[str, ...]]:
    """The verdicts with each one that has `parts` (a judge graded per named guideline)
    replaced by its parts, judged "<judge>/<name>", and the versions to match: what the
    counts, windows and verdict rows hold (counting.key makes the name a `guideline` label)."""
    if not any(v.parts for v in verdicts):
        return verdicts, versions
    flat: list[Verdict] = []
    flat_versions: list[str] = []
    for v, version in zip(verdicts, versions or ("",) * len(verdicts), strict=True):
        for part in v.parts or (v,):
            flat.append(part)
            flat_versions.append(version)
    return tuple(flat), tuple(flat_versions) if versions else ()
