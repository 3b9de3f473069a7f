"""The settings models of the commands: typed, validated once, in `main()`.

`RunSettings`, `ServeSettings` and `StreamSettings` share `EventSettings` (judges, sample rate,
window, event limits, Beam options, the stage configuration); run and serve add `BatchSettings`
(sampling strata, cascade, labels, runner, calibrations). Each field's default lives here, on
the model; the flags that set the fields are declared in pipeline.settings.command_flags and
take their defaults from here (`pipeline.settings.flags.default_of`), so help texts and
behaviour cannot disagree. Beam workers import these modules in other processes, so nothing
here reads the environment or the command line until a command asks for it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from datetime import UTC, datetime
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    InstanceOf,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ragpulse.judges import DEFAULT_JUDGES, JudgeSpec, ReplyFormat, check_judge_names
from ragpulse.judges.base import global_guidelines
from ragpulse.judges.composite import parse_composite
from ragpulse.judges.llm.ensemble import parse_ensemble
from ragpulse.judges.redaction import (
    RedactMode,
    StoreText,
    TextPolicy,
    compile_user_patterns,
    endpoint_for_log,
    is_loopback_url,
)
from ragpulse.judges.registry import (
    DEFAULT_SCORE_THRESHOLD,
    SESSION_JUDGES,
    judge_entry,
    session_judge_entry,
)
from ragpulse.judges.sessions import (
    DEFAULT_SESSION_GAP_SECONDS,
    DEFAULT_SESSION_MAX_BYTES,
    DEFAULT_SESSION_MAX_TURNS,
)
from ragpulse.pipeline.costs.budget import BudgetSettings
from ragpulse.pipeline.costs.cascade import CascadeSettings
from ragpulse.pipeline.costs.sampling import SamplingPlan, load_plan
from ragpulse.pipeline.errors import SettingsError, without_value
from ragpulse.pipeline.formats.events import MAX_EVENT_TIME, MIN_EVENT_TIME
from ragpulse.pipeline.formats.otlp import InputFormat
from ragpulse.pipeline.formats.review import TARGETED_REASONS, TargetedReason
from ragpulse.pipeline.kafka_security import PLAINTEXT, KafkaSecurity
from ragpulse.pipeline.metrics.labels import LabelLimits
from ragpulse.pipeline.settings.blocks import DEFAULT_LABEL_LIMITS
from ragpulse.pipeline.settings.flags import format_duration
from ragpulse.pipeline.windows import parse_time

if TYPE_CHECKING:
    from ragpulse.pipeline.graphs.bounded import StageConfig
    from ragpulse.pipeline.stages.labels import LabelsConfig
    from ragpulse.pipeline.stages.review import ReviewQueueConfig
    from ragpulse.pipeline.stages.sessions import SessionConfig

log = logging.getLogger(__name__)

SettingsModel = TypeVar("SettingsModel", bound=BaseModel)

# The Beam runners `--runner` takes. The graph needs windows, timestamps, tagged outputs,
# finish_bundle output, several sinks and metrics back in this process; these runners have all.
RUNNERS = ("FnApiRunner", "PortableRunner", "FlinkRunner", "SparkRunner", "DataflowRunner")
_TRIES_PRISM = "it first tries Prism, downloaded at run time, then falls back to FnApiRunner"
# The runners Beam knows that ragpulse refuses, and why (shown by --help and in the error).
REFUSED_RUNNERS = {
    "DirectRunner": _TRIES_PRISM,
    "SwitchingDirectRunner": _TRIES_PRISM,
    "PrismRunner": "it downloads the Prism binary at run time",
    "BundleBasedDirectRunner": "Beam's legacy local runner, untested; FnApiRunner replaces it",
    "TestDirectRunner": "a runner for Beam's own tests",
    "TestDataflowRunner": "a runner for Beam's own tests",
    "InteractiveRunner": "a runner for notebooks",
    "DaskRunner": "it drops windows, timestamps, tagged outputs and all but the last sink",
    "KafkaStreamsRunner": "experimental; its job server is in no Beam release",
}
# Upper bounds of the size settings: a cycle holds up to MAX_BATCH_EVENTS records in memory,
# each up to --max-event-bytes (Kafka's own default record limit is 1 MiB).
MAX_BATCH_EVENTS = 1_000_000
MAX_EVENT_BYTES = 64 * 1_048_576
# A judge batch holds enough events to keep every concurrent judge call busy: this many per
# call, and never fewer than the floor (`JudgeSettings.batch_events`).
BATCH_EVENTS_PER_CALL = 16
MIN_BATCH_EVENTS = 256


def existing_file(what: str) -> AfterValidator:
    """The check of a Path field naming an input file: "`what` not found: PATH" unless it is a
    file."""

    def check(path: Path) -> Path:
        if not path.is_file():
            raise ValueError(f"{what} not found: {path}")
        return path

    return AfterValidator(check)


class JudgeSettings(BaseModel):
    """The judge panel: which judges, on which backend, against which endpoint.

    Errors name a field by the flag that sets it, from the command's flag table (the operator
    never sees the field names); a field the environment sets has that in its title.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["local", "openai"]  # `names` reads it
    # judges.llm.custom.CustomJudge values, loaded from the --custom-judge files at validation;
    # `names` reads them. Typed Any so that importing the settings imports no LLM client.
    custom_judges: tuple[Any, ...] = ()
    names: tuple[str, ...] = DEFAULT_JUDGES
    base_url: str | None = Field(None, title="--judge-base-url / OPENAI_BASE_URL")
    model: str = "gpt-4o-mini"
    api_key: SecretStr | None = Field(None, title="OPENAI_API_KEY")
    concurrency: int = Field(16, ge=1, le=1024)
    timeout_seconds: float = Field(30.0, gt=0, le=600)
    max_retries: int = Field(4, ge=0, le=20)
    temperature: float = Field(0.1, ge=0, le=2)
    prompts_dir: Path | None = None
    reply_format: ReplyFormat = "json_schema"
    max_tokens: int = Field(256, ge=1, le=65536)
    breaker_failures: int = Field(5, ge=0, le=10_000)
    breaker_cooldown_seconds: float = Field(30.0, gt=0, le=86400)
    batch_deadline_seconds: float = Field(120.0, gt=0, le=86400)
    rpm: int | None = Field(None, ge=1)
    tpm: int | None = Field(None, ge=1)
    redact_pii: RedactMode = "auto"
    # The operator vouches that the endpoint keeps prompts in house: "auto" then sends raw text.
    endpoint_trusted: bool = False
    redact_patterns: tuple[str, ...] = ()
    store_text: StoreText = "redacted"
    # NAME=RULE guidelines every event must follow, added to its own (guideline_adherence).
    guidelines: tuple[str, ...] = ()
    # Identical inputs judged once per TTL by the LLM judges (judges.verdict_cache); 0: no cache.
    cache_size: int = Field(10_000, ge=0, le=10_000_000)
    cache_ttl_seconds: float = Field(600.0, gt=0, le=7 * 86400)
    # The scored judges (faithfulness, answer_correctness): "yes" at this score or above.
    score_threshold: float = Field(DEFAULT_SCORE_THRESHOLD, ge=0, le=1)
    embeddings_model: str | None = Field(None, min_length=1)
    # NAME=JUDGE:WEIGHT,... weighted composites of the judges' grades (judges.composite).
    composites: tuple[str, ...] = ()
    # JUDGE=MODEL,MODEL,MODEL or JUDGE=N: a judge graded by a majority vote (judges.llm.ensemble).
    ensembles: tuple[str, ...] = ()
    # One call per event for the LLM judges that can share it (judges.llm.combined).
    combine: bool = False
    # Ask the endpoint for token logprobs: verdicts carry P(yes) as their score
    # (judges.endpoint.logprobs).
    logprobs: bool = False

    @field_validator("logprobs")
    @classmethod
    def _logprobs_need_an_llm(cls, logprobs: bool, info: ValidationInfo) -> bool:
        if logprobs and info.data.get("backend") != "openai":
            raise ValueError("token logprobs come from an LLM: use it with --judge-backend openai")
        return logprobs

    @field_validator("redact_patterns")
    @classmethod
    def _patterns_compile(cls, patterns: tuple[str, ...]) -> tuple[str, ...]:
        compile_user_patterns(patterns)  # ValueError names the pattern
        return patterns

    @field_validator("custom_judges", mode="before")
    @classmethod
    def _custom_judges_load(cls, files: object) -> object:
        # Fail at start-up, not inside a Beam worker; the workers get the loaded judges.
        from ragpulse.judges.llm.custom import CustomJudge, load_custom_judges

        if not isinstance(files, (list, tuple)):
            raise ValueError("must be a list of files")
        if all(isinstance(f, CustomJudge) for f in files):
            return tuple(files)
        return load_custom_judges(tuple(Path(f) for f in files))  # ValueError: one line

    @field_validator("names")
    @classmethod
    def _known_judges(cls, names: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        if "custom_judges" not in info.data:
            return names  # a custom judge file is invalid, and that is the error to read
        custom = tuple(c.entry for c in info.data["custom_judges"])
        check_judge_names(names, info.data.get("backend"), custom)  # ValueError: one line
        # Custom session judges are named in --session-judges (BatchSettings checks those).
        unused = [
            f"{e.name} ({e.prompt})" for e in custom if e.name not in names and not e.session
        ]
        if unused:
            # A judge defined and never run is a forgotten step, not a choice: say so at start.
            raise ValueError(
                f"custom judge(s) {', '.join(unused)} from --custom-judge are not listed; "
                "add them to --judges"
            )
        return names

    @field_validator("guidelines")
    @classmethod
    def _guidelines_read(cls, flags: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        global_guidelines(flags)  # ValueError: one line
        if flags and "guideline_adherence" not in info.data.get("names", ()):
            raise ValueError("only the guideline_adherence judge reads it; add it to --judges")
        return flags

    @field_validator("embeddings_model")
    @classmethod
    def _embeddings_read(cls, model: str | None, info: ValidationInfo) -> str | None:
        if model is not None and "answer_correctness" not in info.data.get("names", ()):
            raise ValueError("only the answer_correctness judge reads it; add it to --judges")
        return model

    @field_validator("composites")
    @classmethod
    def _composites_read(cls, flags: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        from ragpulse.judges.composite import check_composites, parse_composite

        check_composites([parse_composite(f) for f in flags], info.data.get("names", ()))
        return flags

    @field_validator("ensembles")
    @classmethod
    def _ensembles_read(cls, flags: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        from ragpulse.judges.llm.ensemble import parse_ensemble

        ensembles = [parse_ensemble(f) for f in flags]  # ValueError: one line
        if ensembles and info.data.get("backend") != "openai":
            raise ValueError("an ensemble asks LLMs: use it with --judge-backend openai")
        judges = [e.judge for e in ensembles]
        for judge in judges:
            if judge not in info.data.get("names", ()):
                raise ValueError(f"judge {judge} is not among --judges; add it")
            if judges.count(judge) > 1:
                raise ValueError(f"judge {judge} has more than one ensemble")
            if judge_entry(judge).scored is not None:
                raise ValueError(f"judge {judge} grades claims, not one verdict: no ensemble")
        return flags

    @field_validator("prompts_dir")
    @classmethod
    def _prompt_files_load(cls, folder: Path | None) -> Path | None:
        # Fail at start-up, not inside a Beam worker, when a prompt file is missing or invalid.
        if folder is not None:
            from ragpulse.judges.llm.judge import available_prompts, load_prompt

            if not folder.is_dir():
                raise ValueError(f"{folder} is not a directory")
            for name in available_prompts():
                load_prompt(name, folder)
        return folder

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, url: str | None) -> str | None:
        return http_url(url)

    @property
    def batch_events(self) -> int:
        """Events judged per batch (run, serve, stream, calibrate)."""
        return max(MIN_BATCH_EVENTS, self.concurrency * BATCH_EVENTS_PER_CALL)

    def text_policy(self) -> TextPolicy:
        """What prompts and stored verdict text keep of the users' text."""
        return TextPolicy(
            self.redact_pii, self.redact_patterns, self.store_text, self.endpoint_trusted
        )

    def spec(self) -> JudgeSpec:
        """The picklable spec Beam workers build their panel from."""
        return JudgeSpec(
            names=self.names,
            backend=self.backend,
            base_url=self.base_url,
            model=self.model,
            api_key=self.api_key.get_secret_value() if self.api_key else None,
            concurrency=self.concurrency,
            timeout_seconds=self.timeout_seconds,
            max_retries=self.max_retries,
            temperature=self.temperature,
            prompts_dir=str(self.prompts_dir) if self.prompts_dir else None,
            reply_format=self.reply_format,
            max_tokens=self.max_tokens,
            breaker_failures=self.breaker_failures,
            breaker_cooldown_seconds=self.breaker_cooldown_seconds,
            batch_deadline_seconds=self.batch_deadline_seconds,
            rpm=self.rpm,
            tpm=self.tpm,
            text_policy=self.text_policy(),
            guidelines=global_guidelines(self.guidelines),
            custom_judges=self.custom_judges,
            cache_size=self.cache_size,
            cache_ttl_seconds=self.cache_ttl_seconds,
            score_threshold=self.score_threshold,
            embeddings_model=self.embeddings_model,
            composites=tuple(parse_composite(f) for f in self.composites),
            ensembles=tuple(parse_ensemble(f) for f in self.ensembles),
            combine=self.combine,
            logprobs=self.logprobs,
        )


class EventSettings(BaseModel):
    """What `run`, `serve` and `stream` share: the judges, which events are admitted and judged
    (sample rate, size, future skew), the window size and the Beam options; and the stage
    configuration built from them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    judges: JudgeSettings
    sample_rate: float = Field(1.0, ge=0, le=1)
    window_seconds: float = Field(300.0, gt=0)
    max_event_bytes: int = Field(1_048_576, ge=1024, le=MAX_EVENT_BYTES)
    # Events dated further ahead of their record time or the clock are refused (stages.py).
    max_future_skew_seconds: float = Field(300.0, gt=0)
    beam_args: tuple[str, ...] = ()

    @field_validator("beam_args")
    @classmethod
    def _runner_not_in_beam_args(cls, args: tuple[str, ...]) -> tuple[str, ...]:
        # One way to choose the runner, so that every choice is checked by `runner_name`.
        if any(a == "--runner" or a.startswith("--runner=") for a in args):
            raise ValueError("choose the runner with --runner NAME, not as a Beam option")
        return args

    def stage_config(self, closed_before: float | None = None) -> StageConfig:
        """The picklable configuration of the Beam stages; `closed_before`: the windows serve
        has closed (the stream has none: Beam decides lateness with panes)."""
        # Imported here: building settings (e.g. for --help) must not pay Beam's import.
        from ragpulse.pipeline.graphs.bounded import StageConfig
        from ragpulse.pipeline.stages.parse import AdmissionRules

        return StageConfig(
            judges=self.judges.spec(),
            admission=AdmissionRules(
                sample_rate=self.sample_rate,
                window_size=self.window_seconds,
                max_bytes=self.max_event_bytes,
                max_future_skew_s=self.max_future_skew_seconds,
                closed_before=closed_before,
            ),
            judge_batch_size=self.judges.batch_events,
            sessions=self.session_config(),
            review=self.review_config(),
        )

    def session_config(self) -> SessionConfig | None:
        """How conversations are judged; None: this command judges none (`SessionFields`)."""
        return None

    def review_config(self) -> ReviewQueueConfig | None:
        """The review queue; None: this command queues nothing (`ReviewFields`)."""
        return None


class BatchSettings(EventSettings):
    """What `run` and `serve` add: sampling strata, the judge cascade, label limits, the Beam
    runner, judge calibrations and the input format."""

    # Strata from --sampling-rules FILE (a path is loaded and checked here, once); None: none.
    sampling: InstanceOf[SamplingPlan] | None = None
    cascade: InstanceOf[CascadeSettings] | None = None
    labels: LabelLimits = DEFAULT_LABEL_LIMITS
    runner: str | None = None  # None: FnApiRunner in this process
    # pipeline.calibration.JudgeCalibration values, loaded from the --judge-calibration files
    # at validation (typed Any, like custom_judges).
    judge_calibrations: tuple[Any, ...] = ()
    @field_validator("judge_calibrations", mode="before")
    @classmethod
    def _calibrations_load(cls, files: object, info: ValidationInfo) -> object:
        from ragpulse.pipeline.calibration import check_calibrations

        loaded = _calibrations(files)
        judges = info.data.get("judges")
        if judges is not None:
            check_calibrations(loaded, judges.names, judges.backend, judges.model,
                               lambda: judges.spec().prompt_versions())
        return loaded
    # What a record is: ragpulse's event (pipeline/formats/events.py) or an OTLP
    # ExportTraceServiceRequest of the Collector's Kafka exporter, assembled into one event per
    # trace (pipeline/formats/otlp.py).
    input_format: InputFormat = "ragpulse"

    @field_validator("sampling", mode="before")
    @classmethod
    def _load_sampling_rules(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, (str, Path)):
            # Unmatched events keep --sample-rate unless the file sets default_rate.
            return load_plan(Path(value), info.data.get("sample_rate", 1.0))
        return value

    @field_validator("runner")
    @classmethod
    def _runner_works_here(cls, name: str | None) -> str | None:
        return None if name is None else runner_name(name)

    def stage_config(self, closed_before: float | None = None) -> StageConfig:
        """The stages' configuration, with the sampling strata and the judge cascade."""
        config = super().stage_config(closed_before).admitting(sampling=self.sampling)
        return dataclasses.replace(config, cascade=self.cascade)


class SessionFields(BaseModel):
    """The conversation settings of the commands that judge sessions (run, serve, stream): the
    session judges, the idle gap that ends a conversation, and the cap on what one
    conversation's judge reads (pipeline.stages.sessions). Mixed into a settings model that has
    `judges: JudgeSettings`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    session_judges: tuple[str, ...] = ()
    session_gap_seconds: float = Field(DEFAULT_SESSION_GAP_SECONDS, gt=0, le=7 * 86400)
    session_max_turns: int = Field(DEFAULT_SESSION_MAX_TURNS, ge=1, le=10_000)
    session_max_bytes: int = Field(DEFAULT_SESSION_MAX_BYTES, ge=1024, le=16 * 1_048_576)

    @model_validator(mode="after")
    def _known_session_judges(self) -> SessionFields:
        judges: JudgeSettings = getattr(self, "judges")  # noqa: B009 (a field of the model)
        names = self.session_judges
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(
                f"--session-judges: {', '.join(repeated)} listed more than once; name each once"
            )
        custom = tuple(c.entry for c in judges.custom_judges)
        for name in names:
            try:
                entry = session_judge_entry(name, custom)
            except ValueError as exc:
                raise ValueError(f"--session-judges: {exc}") from None
            if judges.backend not in entry.backends:
                raise ValueError(
                    f"--session-judges: session judge {name} has no {judges.backend} "
                    f"implementation (it has: {', '.join(entry.backends)})"
                )
            if judges.backend == "openai" and judges.prompts_dir is not None and (
                name in SESSION_JUDGES
            ):
                from ragpulse.judges.llm.judge import load_prompt

                # Fail at start-up, not in a Beam worker, when --judge-prompts lacks it.
                try:
                    load_prompt(name, judges.prompts_dir)
                except ValueError as exc:
                    raise ValueError(f"--judge-prompts: {exc}") from None
        unused = [f"{e.name} ({e.prompt})" for e in custom if e.session and e.name not in names]
        if unused:
            raise ValueError(
                f"--custom-judge: custom session judge(s) {', '.join(unused)} are not listed; "
                "add them to --session-judges"
            )
        return self

    def session_config(self) -> SessionConfig | None:
        """How conversations are judged, or None without --session-judges."""
        if not self.session_judges:
            return None
        from ragpulse.pipeline.stages.sessions import SessionConfig

        judges: JudgeSettings = getattr(self, "judges")  # noqa: B009
        return SessionConfig(
            judges.spec().for_sessions(self.session_judges),
            self.session_gap_seconds,
            self.session_max_turns,
            self.session_max_bytes,
        )


class WatermarkFields(BaseModel):
    """How the watermark follows a Kafka topic's record times, the same in serve
    (pipeline/service/watermark.py) and stream (java/kafka-read, PartitionWatermarkPolicy): per
    partition, the latest record time read minus the out-of-orderness; a partition with nothing
    to read for `partition_idle_after_seconds` stops holding it back (0: at once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    out_of_orderness_seconds: float = Field(30.0, ge=0)
    partition_idle_after_seconds: float = Field(60.0, ge=0)


class ReviewFields(BaseModel):
    """The review queue of the commands that publish to Kafka (serve, stream): which judged
    events go to the review topic for a person to check (pipeline.stages.review, docs/review.md).
    Off by default: the queue copies the chatbot users' text to a new topic, which is the
    operator's decision to make. Mixed into a settings model with `judges`, `bootstrap`,
    `kafka_security` and `kafka_timeout_seconds`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Named after the input topic (TOPIC.review) by the model's topic validator.
    review_topic: str | None = Field(None, min_length=1)
    # The uniform random slice of the judged events; 0: no review queue at all.
    review_rate: float = Field(0.0, ge=0, le=1)
    review_targets: tuple[TargetedReason, ...] = TARGETED_REASONS
    review_unsure_band: float = Field(0.1, gt=0, le=0.5)
    review_max_per_hour: int = Field(200, ge=1, le=1_000_000)

    @field_validator("review_targets", mode="before")
    @classmethod
    def _targets_once(cls, value: Any) -> Any:
        if isinstance(value, (list, tuple)) and len(set(value)) != len(value):
            raise ValueError("name each target once")
        return value

    def review_config(self) -> ReviewQueueConfig | None:
        """The review queue's configuration, or None when --review-rate is 0."""
        if self.review_rate == 0:
            return None
        from ragpulse.pipeline.sinks.kafka import KafkaTopic
        from ragpulse.pipeline.stages.review import ReviewQueueConfig

        judges: JudgeSettings = getattr(self, "judges")  # noqa: B009 (a field of the model)
        scales = _judge_scales(judges)
        topic = self.review_topic or getattr(self, "topic") + ".review"  # noqa: B009
        bootstrap = getattr(self, "bootstrap")  # noqa: B009
        security = getattr(self, "kafka_security")  # noqa: B009
        timeout = getattr(self, "kafka_timeout_seconds")  # noqa: B009
        return ReviewQueueConfig(
            target=KafkaTopic(bootstrap, security, topic, timeout),
            dead_letters=KafkaTopic(bootstrap, security, f"{topic}.dlq", timeout),
            rate=self.review_rate,
            targets=self.review_targets,
            unsure_band=self.review_unsure_band,
            max_per_hour=self.review_max_per_hour,
            window_seconds=getattr(self, "window_seconds"),  # noqa: B009
            policy=judges.text_policy(),
            p_yes_judges=frozenset(
                name for name, scale in scales.items() if scale is None and judges.logprobs
            ),
            scales={name: scale for name, scale in scales.items() if scale is not None},
        )


def _judge_prompts(judges: JudgeSettings) -> dict[str, Any]:
    """Each LLM judge's prompt (`judges.llm.judge.JudgePrompt`); the local judges have none (an
    empty mapping on the local backend), nor do judges of computed scores."""
    if judges.backend != "openai":
        return {}
    from ragpulse.judges.llm.judge import load_prompt

    custom = {c.entry.name: c.prompt for c in judges.custom_judges}
    prompts: dict[str, Any] = {}
    for name in judges.names:
        try:
            prompts[name] = (
                custom[name] if name in custom else load_prompt(name, judges.prompts_dir)
            )
        except ValueError:  # a judge without a prompt (computed scores): no scale to offer
            continue
    return prompts


def _judge_scales(judges: JudgeSettings) -> dict[str, tuple[int, ...] | None]:
    """Each LLM judge's graded scale (None: binary), from its prompt."""
    return {name: prompt.scores for name, prompt in _judge_prompts(judges).items()}


def judge_pass_scores(judges: JudgeSettings) -> dict[str, float]:
    """The pass score of each judge on a graded scale (its lowest score rated "yes"): what a
    reviewer's correct score is mapped to pass or fail by."""
    return {
        name: float(prompt.pass_score) for name, prompt in _judge_prompts(judges).items()
        if prompt.scores is not None and prompt.pass_score is not None
    }


def _calibrations(files: object) -> tuple[Any, ...]:
    """The JudgeCalibration values of --judge-calibration `files` (pipeline.calibration), one
    per judge; CalibrationError (a ValueError): one line naming the file and key."""
    from ragpulse.pipeline.calibration import load_calibrations

    if not isinstance(files, (list, tuple)):
        raise ValueError("must be a list of files")
    return load_calibrations(files)


class RunSettings(SessionFields, BatchSettings):
    """Validated settings of `ragpulse run`."""

    input: Annotated[Path, existing_file("input file")]
    output: Path = Path("out")


# The runners `ragpulse stream` takes: they run unbounded pipelines with Beam's cross-language
# Kafka source. FnApiRunner and SparkRunner's portable mode do not run unbounded reads.
STREAM_RUNNERS = ("PortableRunner", "FlinkRunner", "DataflowRunner")


class StreamSettings(WatermarkFields, ReviewFields, SessionFields, EventSettings):
    """Validated settings of `ragpulse stream`: one unbounded pipeline on a distributed runner.

    Judges, sampling and windows mean what they mean for `serve`; lateness is Beam's (allowed
    lateness and panes, `pipeline.graphs.unbounded`) instead of serve's watermark.
    """

    bootstrap: str = Field(min_length=3)
    topic: str = Field(min_length=1)
    dead_letter_topic: str = Field(min_length=1)
    ratings_topic: str = Field(min_length=1)
    kafka_timeout_seconds: float = Field(30.0, gt=0)
    kafka_security: KafkaSecurity = PLAINTEXT
    # Java Kafka consumer properties of ReadFromKafka (it does not use kafka-python).
    consumer_config: tuple[tuple[str, str], ...] = ()
    expansion_service: str | None = None
    allowed_lateness_seconds: float = Field(600.0, ge=0)
    early_firing_seconds: float = Field(60.0, ge=1)
    runner: str
    wait: bool = False  # wait for the job to end instead of returning once it is submitted
    # The reviewers' labels, read back with the review queue on (pipeline.stages.labels).
    labels_topic: str = Field(min_length=1)
    # How long (event time) a queued verdict is remembered for its labels: a label of an item
    # queued longer ago is `unknown_event`.
    review_label_horizon_seconds: float = Field(30 * 86400.0, gt=0)

    @field_validator("runner")
    @classmethod
    def _streaming_runner(cls, name: str) -> str:
        known = runner_name(name)
        if known not in STREAM_RUNNERS:
            raise ValueError(
                f"{known} does not run unbounded pipelines; choose one of "
                f"{', '.join(STREAM_RUNNERS)} (or `ragpulse serve` on one machine)"
            )
        return known

    @model_validator(mode="before")
    @classmethod
    def _topics_named_after_the_input(cls, data: Any) -> Any:
        return _derived_topics(
            data, dead_letter_topic=".dlq", ratings_topic=".ratings", review_topic=".review",
            labels_topic=".labels",
        )

    def labels_config(self) -> LabelsConfig | None:
        """The labels branch's configuration, or None when no review queue runs (every label
        would be of an item this job never queued)."""
        if self.review_rate == 0:
            return None
        from ragpulse.pipeline.stages.labels import LabelsConfig

        return LabelsConfig(
            versions=self.judges.spec().prompt_versions(),
            horizon_seconds=self.review_label_horizon_seconds,
            early_firing_seconds=self.early_firing_seconds,
            pass_scores=judge_pass_scores(self.judges),
        )

    @model_validator(mode="after")
    def _group_commits_need_checkpoints(self) -> StreamSettings:
        # With a group.id the Kafka reader commits offsets when a bundle is finalized, which
        # Beam marks @RequiresStableInput: Flink refuses such a job at invocation unless it
        # checkpoints, after the submission has already been reported as running.
        grouped = any(key == "group.id" for key, _ in self.consumer_config)
        checkpoints = any(
            arg.startswith("--checkpointing_interval") for arg in self.beam_args
        )
        if grouped and self.runner != "DataflowRunner" and not checkpoints:
            raise ValueError(
                "--kafka-consumer-config group.id commits the group's offsets at Flink "
                "checkpoints: add --beam-arg=--checkpointing_interval=MS (e.g. 60000); "
                "without it Flink refuses the job when it starts"
            )
        return self

    @model_validator(mode="after")
    def _offsets_commit_only_with_checkpoints(self) -> StreamSettings:
        # The Kafka consumer's own auto-commit moves the group's offsets past records that no
        # checkpoint holds yet (measured: 248 committed while nothing had left the read), so a
        # restart from the group would skip them. The reader commits at checkpoints instead.
        auto_commit = [
            value for key, value in self.consumer_config if key == "enable.auto.commit"
        ]
        if any(value.strip().lower() != "false" for value in auto_commit):
            raise ValueError(
                "--kafka-consumer-config enable.auto.commit must stay false: the stream "
                "commits the group's offsets only when the runner finalizes a checkpoint, and "
                "an auto-commit would skip records a restart has to read again"
            )
        return self

    @model_validator(mode="after")
    def _sessions_land_within_lateness(self) -> StreamSettings:
        # A session is judged when the watermark passes its last turn + the gap, and counted
        # in the window of its last turn: a late pane of that window, so it must still be open.
        if self.session_judges and self.session_gap_seconds > self.allowed_lateness_seconds:
            raise ValueError(
                f"--session-gap ({format_duration(self.session_gap_seconds)}) must not exceed "
                f"--allowed-lateness ({format_duration(self.allowed_lateness_seconds)}): a "
                "session's verdicts are counted in the window of its last turn, once the gap "
                "has passed"
            )
        return self


class ExporterSettings(BaseModel):
    """Validated settings of `ragpulse exporter`: the ratings topic served as /metrics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(min_length=3)
    ratings_topic: str = Field(min_length=1)
    kafka_timeout_seconds: float = Field(30.0, gt=0)
    kafka_security: KafkaSecurity = PLAINTEXT
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65535)
    # The health listener: /healthz alone, plain HTTP (pipeline/metrics/http.py).
    health_port: int = Field(9465, ge=0, le=65535)
    web_config_file: Path | None = None
    unhealthy_after_seconds: float = Field(300.0, gt=0)
    # Windows older than this behind the newest one are folded into the counters; keep it
    # above the stream's --allowed-lateness, after which no pane of a window comes.
    retention_seconds: float = Field(86400.0, gt=0)
    # Panes of windows starting further ahead of the clock are ignored (service/panes.py).
    max_future_skew_seconds: float = Field(300.0, gt=0)
    labels: LabelLimits = DEFAULT_LABEL_LIMITS
    # pipeline.calibration.JudgeCalibration values of --judge-calibration FILEs, as serve's: the
    # seed each judge's corrected pass ratio starts from, the stream's labels added to it
    # (service/labels.py `label_figures`). The stream's judges are not known here: a seed
    # applies to the judge's windows of the prompt version it measured.
    judge_calibrations: tuple[Any, ...] = ()

    @field_validator("judge_calibrations", mode="before")
    @classmethod
    def _calibrations_load(cls, files: object) -> object:
        from ragpulse.pipeline.calibration import describe_calibration

        loaded = _calibrations(files)
        for c in loaded:
            describe_calibration(c)
        return loaded

    @field_validator("health_port")
    @classmethod
    def _health_port_apart(cls, port: int, info: ValidationInfo) -> int:
        return health_port_apart(port, info)


class ServeSettings(WatermarkFields, ReviewFields, SessionFields, BatchSettings):
    """Validated settings of `ragpulse serve`."""

    bootstrap: str = Field(min_length=3)
    topic: str = Field(min_length=1)
    dead_letter_topic: str = Field(min_length=1)
    verdicts_topic: str = Field(min_length=1)
    publish_verdicts: Literal["failing", "all", "none"] = "failing"
    group_id: str = Field("ragpulse", min_length=1)
    state: Path = Path("ragpulse-state.sqlite")
    allowed_lateness_seconds: float = Field(600.0, ge=0)
    trigger_interval_seconds: float = Field(15.0, gt=0)
    # Bounded: a cycle holds its records in memory (1e20 was accepted, issue 19).
    max_batch_events: int = Field(50_000, ge=1, le=MAX_BATCH_EVENTS)
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9464, ge=0, le=65535)
    # The health listener: /healthz alone, plain HTTP (pipeline/metrics/http.py).
    health_port: int = Field(9465, ge=0, le=65535)
    web_config_file: Path | None = None
    unhealthy_after_seconds: float = Field(300.0, gt=0)
    retention_seconds: float = Field(30 * 86400.0, gt=0)
    kafka_timeout_seconds: float = Field(30.0, gt=0)
    kafka_security: KafkaSecurity = PLAINTEXT
    canary_file: Path | None = None
    canary_rate_per_minute: float = Field(1.0, gt=0, le=10_000)
    on_offset_reset: Literal["earliest", "latest", "fail"] = "earliest"
    undeliverable_after_seconds: float = Field(600.0, gt=0)
    state_reset: bool = False
    # Partitions split across serve instances: this one reads partition p when
    # p % instances == instance (see the README, "Scaling out"). Declared in this order so
    # that the check of `instance` sees `instances`.
    instances: int = Field(1, ge=1, le=100_000)
    instance: int = Field(0, ge=0)
    # The judge budget governor (pipeline/costs/budget.py); None: no budget.
    budget: InstanceOf[BudgetSettings] | None = None
    trace_assembly_wait_seconds: float = Field(30.0, ge=0)
    # Open conversations kept in the state file (--session-judges; pipeline/service/
    # conversations.py): beyond it the ones with the oldest last turn are judged early, counted.
    # 100,000 is what about 1,000 turns/s of 4-turn conversations keeps open under the default
    # 5m gap; a cycle's work no longer grows with it (docs/sessions.md), it bounds the state file
    # (each open session keeps up to --session-max-bytes of text) and a cycle's burst of due
    # sessions when the watermark jumps.
    session_max_open: int = Field(100_000, ge=1, le=10_000_000)
    # OTLP/HTTP logs URL for gen_ai.evaluation.result events (pipeline/sinks/otlp_evaluations.py).
    evaluation_events_endpoint: str | None = None
    # The reviewers' labels read back into the numbers (pipeline/service/labels.py); named
    # TOPIC.labels by the topic validator, as `ragpulse review` names it.
    labels_topic: str | None = Field(None, min_length=1)

    @model_validator(mode="before")
    @classmethod
    def _topics_named_after_the_input(cls, data: Any) -> Any:
        return _derived_topics(
            data, dead_letter_topic=".dlq", verdicts_topic=".verdicts", review_topic=".review",
            labels_topic=".labels",
        )

    @field_validator("health_port")
    @classmethod
    def _health_port_apart(cls, port: int, info: ValidationInfo) -> int:
        return health_port_apart(port, info)

    @field_validator("evaluation_events_endpoint")
    @classmethod
    def _evaluation_url(cls, url: str | None) -> str | None:
        return http_url(url)

    @field_validator("instance")
    @classmethod
    def _instance_in_range(cls, instance: int, info: ValidationInfo) -> int:
        instances = info.data.get("instances")
        if instances is not None and instance >= instances:
            raise ValueError(
                f"must be below --instances ({instances}): instances are numbered 0 to "
                f"{instances - 1}"
            )
        return instance

    def owns(self, partition: int) -> bool:
        """Whether this instance reads, counts and commits `partition` (partitions added to
        the topic later are owned by the same rule)."""
        return partition % self.instances == self.instance


class ReviewSettings(BaseModel):
    """Validated settings of `ragpulse review`: the review page over the review topic, labels to
    the labels topic (pipeline/review/, docs/review.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    bootstrap: str = Field(min_length=3)
    topic: str | None = None  # the inference-log topic the other two are named after
    review_topic: str = Field(min_length=1)
    labels_topic: str = Field(min_length=1)
    kafka_timeout_seconds: float = Field(10.0, gt=0)
    kafka_security: KafkaSecurity = PLAINTEXT
    host: str = "127.0.0.1"
    port: int = Field(9470, ge=0, le=65535)
    # TLS and basic-auth reviewers (pipeline/metrics/http.py), and/or reviewers' bearer tokens
    # (pipeline/review/access.py): one of the two names every reviewer.
    web_config_file: Path | None = None
    bearer_token_file: Path | None = None

    @model_validator(mode="before")
    @classmethod
    def _topics_named_after_the_input(cls, data: Any) -> Any:
        data = _derived_topics(data, review_topic=".review", labels_topic=".labels")
        if isinstance(data, dict) and not (data.get("review_topic") and data.get("labels_topic")):
            raise SettingsError(
                "give --topic TOPIC (the review and labels topics are TOPIC.review and "
                "TOPIC.labels), or both --review-topic and --labels-topic"
            )
        if isinstance(data, dict) and not (data.get("web_config_file")
                                           or data.get("bearer_token_file")):
            raise SettingsError(
                "give --web-config-file (basic_auth_users) or --bearer-token-file, or both: a "
                "reviewer's login or token is the name on their labels"
            )
        return data

    @property
    def dead_letter_topic(self) -> str:
        """Where review-topic records the page cannot show go, with their reason."""
        return f"{self.review_topic}.dlq"


class CalibrateSettings(BaseModel):
    """Validated settings of `ragpulse calibrate`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    judges: JudgeSettings  # one judge
    input: Annotated[Path, existing_file("labelled file")]
    output: Path | None = None
    pass_threshold: int | None = None
    show: int = Field(20, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _output_named_after_the_judge(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("output") is None:
            judges = data.get("judges")
            if isinstance(judges, JudgeSettings) and judges.names:
                return {**data, "output": Path(f"calibration-{judges.names[0]}.json")}
        return data


class AlignSettings(BaseModel):
    """Validated settings of `ragpulse align`: the judge, where its labels and review items are
    read (the topics, or two JSON Lines files), and what is written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    judges: JudgeSettings  # one judge
    labels_file: Path | None = None
    items_file: Path | None = None
    bootstrap: str | None = None
    topic: str | None = None
    review_topic: str | None = None
    labels_topic: str | None = None
    kafka_timeout_seconds: float = Field(10.0, gt=0)
    kafka_security: KafkaSecurity = PLAINTEXT
    output: Path | None = None
    examples: int = Field(6, ge=2, le=50)
    folds: int = Field(5, ge=2, le=20)

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = _derived_topics(data, review_topic=".review", labels_topic=".labels")
        if data.get("labels_file") is not None:
            if data.get("items_file") is None:
                raise SettingsError("--labels FILE needs --items FILE: the review items the "
                                    "labels are of (their text becomes the examples)")
            for path, flag in ((data["labels_file"], "--labels"), (data["items_file"],
                                                                   "--items")):
                if not Path(path).is_file():
                    raise SettingsError(f"{flag} {path}: no such file")
        elif data.get("items_file") is not None:
            raise SettingsError("--items goes with --labels; with --kafka-bootstrap the items "
                                "are read from the review topic")
        elif not (data.get("review_topic") and data.get("labels_topic")):
            raise SettingsError("give --topic TOPIC (the review and labels topics are "
                                "TOPIC.review and TOPIC.labels), or both --review-topic and "
                                "--labels-topic")
        if data.get("output") is None:
            judges = data.get("judges")
            if isinstance(judges, JudgeSettings) and judges.names:
                data = {**data, "output": Path(f"aligned-{judges.names[0]}")}
        return data


class ImportLabelsSettings(BaseModel):
    """Validated settings of `ragpulse import-labels`: the file, its format, and the topics."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    input: Annotated[Path, existing_file("labels file")]
    format: Literal["mlflow", "csv", "jsonl"]
    reviewer: str | None = Field(None, min_length=1, max_length=200)
    bootstrap: str = Field(min_length=3)
    topic: str | None = None
    review_topic: str = Field(min_length=1)
    labels_topic: str = Field(min_length=1)
    dead_letter_topic: str = Field(min_length=1)
    kafka_timeout_seconds: float = Field(10.0, gt=0)
    kafka_security: KafkaSecurity = PLAINTEXT

    @model_validator(mode="before")
    @classmethod
    def _topics(cls, data: Any) -> Any:
        data = _derived_topics(data, review_topic=".review", labels_topic=".labels")
        if isinstance(data, dict) and not (data.get("review_topic") and data.get("labels_topic")):
            raise SettingsError("give --topic TOPIC (the review and labels topics are "
                                "TOPIC.review and TOPIC.labels), or both --review-topic and "
                                "--labels-topic")
        if isinstance(data, dict) and not data.get("dead_letter_topic"):
            data = {**data, "dead_letter_topic": f"{data['labels_topic']}.dlq"}
        if isinstance(data, dict) and data.get("reviewer") and data.get("format") == "mlflow":
            raise SettingsError("--reviewer is for csv and jsonl files: an MLflow assessment "
                                "names its reviewer (source.source_id)")
        return data


# --- the commands around the service: windows, explain, simulate -----------------------------


class WindowsSettings(BaseModel):
    """Validated settings of `ragpulse windows`: which windows of serve's state file to print."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    state: Path
    judge: str | None = None
    since: float | None = None  # epoch seconds, from ISO 8601 or epoch seconds

    @field_validator("state")
    @classmethod
    def _state_file_exists(cls, path: Path) -> Path:
        if not os.path.lexists(path):
            raise SettingsError(f"state file not found: {path}")
        return path

    @field_validator("since", mode="before")
    @classmethod
    def _since_is_a_time(cls, text: Any) -> Any:
        return None if text is None else parse_time(text)


class ExplainSettings(BaseModel):
    """Validated settings of `ragpulse explain`: where the verdict rows are read (a run's output
    directory, or serve's verdicts topic), which window of event time and which verdicts.

    Its errors are the command's own lines (SettingsError, not "invalid settings"), checked in
    the order it always checked them: --limit, the window, then the source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_output: Path | None = None
    kafka_bootstrap: str | None = None
    topic: str | None = None
    verdicts_topic: str | None = None
    kafka_timeout_seconds: float = Field(30.0, gt=0)
    # Epoch seconds: --window-start with --window, or --since and --until.
    window_start: float | None = None
    window_seconds: float | None = Field(None, gt=0)
    since: float | None = None
    until: float | None = None
    judge: str | None = None
    app: str | None = None
    model: str | None = None
    rating: Literal["no", "error"] | None = None  # None: both
    limit: int = 50  # 0: all
    as_json: bool = False

    @model_validator(mode="before")
    @classmethod
    def _one_window_and_one_source(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        limit = data.get("limit")
        if limit is not None and limit < 0:
            raise SettingsError(f"--limit must be 0 (all) or more, got {limit}")
        return _explain_source(_explain_window(data))

    def window(self, now: float) -> tuple[float | None, float | None]:
        """[start, end) of event time; --window alone is the last DURATION up to `now`."""
        if self.window_seconds is None:
            return self.since, self.until
        if self.window_start is None:
            return now - self.window_seconds, None
        return self.window_start, self.window_start + self.window_seconds

    @property
    def topic_to_read(self) -> str | None:
        """The verdicts topic, named after --topic unless --verdicts-topic names it."""
        if self.kafka_bootstrap is None:
            return None
        return self.verdicts_topic or f"{self.topic}.verdicts"


def _explain_window(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with its times in epoch seconds; SettingsError if the window is given twice or
    in part."""
    start, window, since, until = (
        data.get(k) for k in ("window_start", "window_seconds", "since", "until")
    )
    if start is not None or window is not None:
        if since is not None or until is not None:
            raise SettingsError("give --window-start/--window or --since/--until, not both")
        if start is None:
            return data
        if window is None:
            raise SettingsError("--window-start needs --window DURATION (e.g. 5m)")
        return {**data, "window_start": parse_time(start, "--window-start")}
    begin = None if since is None else parse_time(since, "--since")
    end = None if until is None else parse_time(until, "--until")
    if begin is not None and end is not None and end <= begin:
        raise SettingsError(f"--until {until} is not after --since {since}")
    return {**data, "since": begin, "until": end}


def _explain_source(data: dict[str, Any]) -> dict[str, Any]:
    """`data` when it names one source of verdict rows; SettingsError otherwise."""
    kafka = data.get("kafka_bootstrap") is not None
    if (data.get("run_output") is not None) == kafka:
        raise SettingsError("give one source: --run-output DIR, or --kafka-bootstrap with --topic")
    if not kafka:
        if data.get("topic") or data.get("verdicts_topic"):
            raise SettingsError("--topic and --verdicts-topic go with --kafka-bootstrap")
    elif (data.get("topic") is None) == (data.get("verdicts_topic") is None):
        raise SettingsError("--kafka-bootstrap needs --topic TOPIC or --verdicts-topic TOPIC")
    return data


# The simulated chatbot's defaults (pipeline.commands.simulate): its apps and models, the
# share of answers from an agent that called tools, and the agent's tools in the order it calls
# them (an answer calls the first 1-3): name -> what the tool does (the tool_arguments judge
# reads it).
DEFAULT_APPS = ("support-bot", "hr-assistant")
DEFAULT_MODELS = ("gpt-4o-mini", "llama-3.1-8b")
TOOL_CALL_SHARE = 0.3
SIMULATED_TOOLS: dict[str, str] = {
    "search_knowledge_base": "Searches the company knowledge base. parameters: query (string).",
    "get_document": "Fetches one knowledge-base document. parameters: doc_uri (string).",
    "lookup_account": "Looks up the user's account: plan, seats, billing contact. "
    "parameters: user_id (string).",
}


class Incidents(BaseModel):
    """The faults `ragpulse simulate` plays in its traffic (pipeline.commands.simulate.simulate);
    times are seconds after the start of the traffic, None: never. A burst happens only when its
    time is given."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    groundedness_drop_at: float | None = None
    groundedness_recover_at: float | None = None
    drop_to: float = 0.6  # share of grounded answers during the drop
    unsafe_burst_at: float | None = None
    unsafe_burst_count: int = 10
    malformed_burst_at: float | None = None
    malformed_burst_count: int = 10
    late_events: int = 0
    late_by_seconds: float = 900.0
    no_context_share: float = 0.0
    tool_call_share: float = TOOL_CALL_SHARE
    # From tool_failure_at until tool_recover_at, every call of `failing_tool` fails.
    tool_failure_at: float | None = None
    tool_recover_at: float | None = None
    failing_tool: str = "get_document"
    # A model that forgets earlier turns of a conversation (needs conversation turns).
    forgetting_at: float | None = None

    @field_validator("failing_tool")
    @classmethod
    def _known_tool(cls, name: str) -> str:
        if name not in SIMULATED_TOOLS:
            raise SettingsError(f"--failing-tool {name!r}: one of {', '.join(SIMULATED_TOOLS)}")
        return name


class SimulateSettings(Incidents):
    """Validated settings of `ragpulse simulate`: where the synthetic traffic goes, how much,
    and which incidents it plays (the fields of `Incidents`).

    A check that fails raises SettingsError with the command's own message (not "invalid
    settings")."""

    # One of the two: produce to Kafka, or write JSON lines.
    kafka_bootstrap: str | None = None
    output: Path | None = None
    topic: str = "inference-logs"
    partitions: int | None = None  # create the topic with this many when it does not exist
    rate: float = 10.0  # events per second
    duration_seconds: float = 60.0
    seed: int = 0
    kafka_security: KafkaSecurity = PLAINTEXT
    start_time: datetime | None = None  # --start-time, ISO 8601 (no zone: UTC); None: now
    apps: tuple[str, ...] = DEFAULT_APPS
    models: tuple[str, ...] = DEFAULT_MODELS
    conversation_turns: int = 0  # 0: no conversations

    @field_validator("start_time", mode="before")
    @classmethod
    def _iso_time(cls, text: Any) -> Any:
        if not isinstance(text, str):
            return text
        try:
            start = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise SettingsError(
                f"--start-time {text!r}: not an ISO 8601 time (e.g. 2025-01-15T09:00:00Z)"
            ) from None
        start = start if start.tzinfo else start.replace(tzinfo=UTC)
        if not MIN_EVENT_TIME <= start.timestamp() < MAX_EVENT_TIME:
            # Events outside these years are dead-lettered; 9999-12-31 overflowed (a traceback).
            raise SettingsError(
                f"--start-time {text!r}: must be between 2000-01-01 and 2100-01-01, the event"
                " times ragpulse accepts"
            )
        return start

    @model_validator(mode="after")
    def _plays(self) -> SimulateSettings:
        if self.rate <= 0 or self.duration_seconds <= 0:
            raise SettingsError("--rate and --duration must be positive")
        if not all(
            0 <= x <= 1 for x in (self.drop_to, self.no_context_share, self.tool_call_share)
        ):
            raise SettingsError(
                "--drop-to, --no-context-share and --tool-call-share are shares between 0 and 1"
            )
        if self.conversation_turns < 0 or (
            self.forgetting_at is not None and self.conversation_turns < 2
        ):
            raise SettingsError("--conversation-turns must be >= 0, and >= 2 with --forgetting-at")
        return self

    @property
    def events(self) -> int:
        """How many events: --rate x --duration, at least one."""
        return max(1, round(self.rate * self.duration_seconds))

    def start_epoch(self, now: float) -> float:
        """The first event's time: --start-time, else `now`."""
        return now if self.start_time is None else self.start_time.timestamp()


def _derived_topics(data: Any, **suffixes: str) -> Any:
    """`data` with each topic not given named after the input topic (TOPIC + suffix)."""
    if not isinstance(data, dict) or not isinstance(data.get("topic"), str):
        return data
    derived = {name: data["topic"] + suffix for name, suffix in suffixes.items()}
    return {**data, **{name: t for name, t in derived.items() if not data.get(name)}}
def health_port_apart(health_port: int, info: ValidationInfo) -> int:
    """--health-port, refused when it is --metrics-port (0 is any free port, so two of them are
    two ports): the probes would wait behind the metrics listener's clients again."""
    metrics_port = info.data.get("metrics_port")
    if health_port and health_port == metrics_port:
        raise ValueError(
            f"must differ from --metrics-port ({metrics_port}): /healthz has a listener of its "
            "own so that no crowd of clients on the metrics port keeps a probe from being "
            "answered"
        )
    return health_port


def http_url(url: str | None) -> str | None:
    """`url` when it is an http(s) URL (or None); ValueError otherwise."""
    if url is not None and not url.startswith(("http://", "https://")):
        raise ValueError("must start with http:// or https:// (value not shown)")
    return url


def runner_name(name: str) -> str:
    """Beam's name of the runner `name` (matched as Beam does: any case, `Runner` optional, a
    module path allowed); ValueError when Beam does not know it or ragpulse cannot run on it."""
    short = name.rsplit(".", 1)[-1].lower()
    wanted = short if short.endswith("runner") else short + "runner"
    for known in RUNNERS:
        if known.lower() == wanted:
            if known == "DataflowRunner" and find_spec("apitools") is None:
                raise ValueError("DataflowRunner needs apache-beam[gcp], which is not installed")
            return known
    for refused, why in REFUSED_RUNNERS.items():
        if refused.lower() == wanted:
            raise ValueError(f"ragpulse does not run on {refused}: {why}")
    raise ValueError(f"unknown Beam runner {name!r}; choose one of {', '.join(RUNNERS)}")


def build(
    model: type[SettingsModel], flag_names: Mapping[str, str] | None = None, /, **fields: Any
) -> SettingsModel:
    """`model(**fields)`, with a validation error turned into a SettingsError that names each
    setting by its flag: `flag_names` (field -> flag, from the command's flag table), see
    `setting_flag`."""
    try:
        return model(**fields)
    except ValidationError as exc:
        raise SettingsError(describe_validation_error(exc, model, flag_names or {})) from None


def judge_settings_from(
    flags: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    flag_names: Mapping[str, str] | None = None,
) -> JudgeSettings:
    """Judge settings from the judge flags' values (by field) and the environment, which gives
    the endpoint and the key; logs which backend was chosen and why. `flag_names`: the flag of
    each field, for errors (see `build`)."""
    env = os.environ if env is None else env
    base_url = flags["base_url"] or env.get("OPENAI_BASE_URL") or None
    api_key = env.get("OPENAI_API_KEY") or None
    backend = flags["backend"]
    if backend is None:
        if base_url or api_key:
            backend = "openai"
            log.info("judge backend: openai (an endpoint or API key is configured)")
        else:
            backend = "local"
            log.info(
                "judge backend: local (no --judge-base-url, OPENAI_BASE_URL or OPENAI_API_KEY set)"
            )
    else:
        log.info("judge backend: %s (from --judge-backend)", backend)
    if backend == "openai" and not (base_url or api_key):
        raise SettingsError(
            "--judge-backend openai needs an endpoint: set OPENAI_API_KEY (for api.openai.com) "
            "or --judge-base-url / OPENAI_BASE_URL (for a compatible server)"
        )
    settings = build(
        JudgeSettings,
        flag_names,
        **{
            **flags,
            "backend": backend,
            "base_url": base_url,
            "api_key": SecretStr(api_key) if api_key else None,
        },
    )
    if settings.endpoint_trusted and settings.redact_pii != "auto":
        raise SettingsError(
            f"--judge-endpoint-trusted has no effect with --redact-pii {settings.redact_pii}: "
            "it only turns --redact-pii auto off"
        )
    if backend == "openai":
        _log_redaction(settings, base_url)
    return settings


def _log_redaction(settings: JudgeSettings, base_url: str | None) -> None:
    """Say whether the users' PII reaches the judge endpoint; at WARNING when it does."""
    endpoint = endpoint_for_log(base_url)
    why = f"--redact-pii {settings.redact_pii}" + (
        ", --judge-endpoint-trusted" if settings.endpoint_trusted else ""
    )
    if not settings.text_policy().redacts_prompts:
        log.warning(
            "PII redaction of judge prompts: off (%s): e-mails, phone, card and IBAN numbers, "
            "IP addresses and API keys in the users' text are sent to %s",
            why,
            endpoint,
        )
    elif settings.redact_pii == "auto" and is_loopback_url(base_url):
        log.info(
            "PII redaction of judge prompts: on (%s) for %s, although it is on loopback: a "
            "local proxy may forward to a hosted model; --judge-endpoint-trusted sends raw text",
            why,
            endpoint,
        )
    else:
        log.info("PII redaction of judge prompts: on (%s) for %s", why, endpoint)


# Values that are names ragpulse itself knows (Beam's runners), no one's secret: an error that
# names them stays readable ("ragpulse does not run on DirectRunner: ...").
_PUBLIC_NAMES = frozenset({*RUNNERS, *REFUSED_RUNNERS})


def describe_validation_error(
    exc: ValidationError, model: type[BaseModel], flag_names: Mapping[str, str]
) -> str:
    """One line per invalid setting of `model`, named by the flag that sets it (see
    `setting_flag`), without echoing values that may be secret."""
    parts = []
    for err in exc.errors():
        field = str(err["loc"][0]) if err["loc"] else None
        where = setting_flag(model, field, flag_names) if field is not None else "settings"
        # pydantic prefixes the message of a ValueError raised by a validator; a text value in
        # it may be a secret (errors.without_value; a file's path is no secret and stays).
        message = err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        if isinstance(value, str) and value not in _PUBLIC_NAMES:
            message = without_value(message, value)
        parts.append(f"{where}: {message}")
    return "invalid settings: " + "; ".join(parts)


def setting_flag(
    model: type[BaseModel], field: str, flag_names: Mapping[str, str] | None = None
) -> str:
    """What sets `field` of `model`, as its errors name it: the field's title (a setting the
    environment gives, alone or besides its flag), else its flag in `flag_names` (the command's
    flag table), else the field's name as a flag."""
    info = model.model_fields.get(field)
    if info is not None and info.title:
        return info.title
    if flag_names and field in flag_names:
        return flag_names[field]
    return "--" + field.replace("_", "-")
