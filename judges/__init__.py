"""Judges: grade one inference-log event each, offline (`local`) or through an LLM (`openai`)."""

from __future__ import annotations

import atexit
import dataclasses
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from ragpulse.judges.base import (
    ERROR_CAUSES,
    RATINGS,
    Chunk,
    ErrorCause,
    Guideline,
    Judge,
    JudgeInput,
    Rating,
    ToolCall,
    Turn,
    Verdict,
    prompt_version,
)
from ragpulse.judges.composite import Composite, check_composites
from ragpulse.judges.endpoint.retry import ReplyFormat
from ragpulse.judges.llm.ensemble import Ensemble
from ragpulse.judges.panel import JudgePanel
from ragpulse.judges.redaction import TextPolicy
from ragpulse.judges.registry import (
    DEFAULT_JUDGES,
    JUDGE_NAMES,
    JUDGES,
    Backend,
    JudgeEntry,
    check_judge_names,
    judge_entry,
    session_judge_entry,
)

if TYPE_CHECKING:
    from ragpulse.judges.llm.custom import CustomJudge


@dataclasses.dataclass(frozen=True)
class JudgeSpec:
    """Everything needed to build a judge panel inside a Beam worker (picklable, built lazily).

    Built from the settings (`pipeline.settings.models.JudgeSettings.spec`), which hold the
    defaults.

    `api_key` is kept out of `repr` so that it never reaches a log line.
    """

    names: tuple[str, ...]
    backend: Backend
    base_url: str | None
    model: str
    api_key: str | None = dataclasses.field(repr=False)
    concurrency: int
    timeout_seconds: float
    max_retries: int
    temperature: float
    prompts_dir: str | None  # replaces the shipped LLM prompt files
    reply_format: ReplyFormat
    max_tokens: int
    breaker_failures: int
    breaker_cooldown_seconds: float
    batch_deadline_seconds: float | None
    rpm: int | None
    tpm: int | None
    # PII redaction of prompts and of stored verdict text (judges.redaction).
    text_policy: TextPolicy
    # --guideline: added to every event's own guidelines (guideline_adherence).
    guidelines: tuple[Guideline, ...]
    # --custom-judge: the operator's LLM judges, loaded and validated in main() (judges.llm.custom).
    custom_judges: tuple[CustomJudge, ...]
    # Verdicts kept for identical inputs (judges.verdict_cache); size 0: no cache.
    cache_size: int
    cache_ttl_seconds: float
    # --judge-combine: one call per event for the judges that can share it (judges.llm.combined).
    combine: bool
    # The scored judges' pass mark, and answer_correctness's embeddings model (None: off).
    score_threshold: float
    embeddings_model: str | None
    # --composite: weighted composites of the judges' grades (judges.composite).
    composites: tuple[Composite, ...] = ()
    # --ensemble: judges graded by the majority of several models (judges.llm.ensemble).
    ensembles: tuple[Ensemble, ...] = ()
    # --judge-logprobs: ask for token logprobs; verdicts carry P(yes) (judges.endpoint.logprobs).
    logprobs: bool = False
    # The session judges' panel (--session-judges, judges.sessions): `names` are session
    # judges, each graded once per conversation on its transcript.
    sessions: bool = False

    def __post_init__(self) -> None:
        custom = tuple(c.entry for c in self.custom_judges)
        if self.sessions:
            for name in self.names:
                entry = session_judge_entry(name, custom)
                if self.backend not in entry.backends:
                    raise ValueError(
                        f"session judge {name} has no {self.backend} implementation"
                    )
            return
        check_judge_names(self.names, self.backend, custom)
        check_composites(self.composites, self.names)

    def for_sessions(self, names: tuple[str, ...]) -> JudgeSpec:
        """The spec of the session judges `names` on this spec's backend and endpoint."""
        return dataclasses.replace(
            self, names=names, sessions=True, composites=(), ensembles=(), combine=False
        )

    def prompt_versions(self) -> dict[str, str]:
        """Each judge's prompt version, as its metric series and calibration files label it
        (`judges.base.prompt_version`), without building a panel or calling anything."""
        if self.sessions:
            panel = self.build()
            try:
                return dict(zip(self.names, panel.prompt_versions, strict=True))
            finally:
                panel.close()
        if self.backend == "local":
            from ragpulse.judges.local.judge import build_local_judges

            return {j.name: prompt_version(j) for j in build_local_judges(self.names)}
        from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
        from ragpulse.judges.llm.build import build_llm_judges

        endpoint = OpenAIJudgeEndpoint(
            base_url=self.base_url, api_key=self.api_key, model=self.model,
            reply_format=self.reply_format, max_tokens=self.max_tokens,
            logprobs=self.logprobs, breaker_failures=self.breaker_failures,
            breaker_cooldown_seconds=self.breaker_cooldown_seconds, rpm=self.rpm, tpm=self.tpm,
        )
        judges = build_llm_judges(
            self.names, endpoint, Path(self.prompts_dir) if self.prompts_dir else None,
            guidelines=self.guidelines, custom=self.custom_judges,
            score_threshold=self.score_threshold, embeddings_model=self.embeddings_model,
            ensembles=self.ensembles,
        )
        return {name: prompt_version(j) for name, j in zip(self.names, judges, strict=True)}

    def build(self) -> JudgePanel:
        """A panel of the named judges on this backend."""
        if self.sessions and self.backend == "local":
            from ragpulse.judges.llm.build import build_session_judges

            return JudgePanel(
                build_session_judges(self.names, None, custom=self.custom_judges),
                self.batch_deadline_seconds,
            )
        if self.backend == "local":
            from ragpulse.judges.local.judge import build_local_judges

            # No verdict cache: a local judge grades an event faster than the cache finds it
            # (tests/bench/bench_verdict_cache.py).
            return JudgePanel(
                build_local_judges(self.names), self.batch_deadline_seconds,
                composites=self.composites,
            )
        from ragpulse.judges.verdict_cache import shared_verdict_cache

        cache = (
            shared_verdict_cache(self.cache_size, self.cache_ttl_seconds)
            if self.cache_size
            else None
        )
        from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
        from ragpulse.judges.llm.build import build_llm_judges

        endpoint = OpenAIJudgeEndpoint(
            base_url=self.base_url,
            api_key=self.api_key,
            model=self.model,
            concurrency=self.concurrency,
            timeout_seconds=self.timeout_seconds,
            max_retries=self.max_retries,
            temperature=self.temperature,
            reply_format=self.reply_format,
            max_tokens=self.max_tokens,
            breaker_failures=self.breaker_failures,
            breaker_cooldown_seconds=self.breaker_cooldown_seconds,
            rpm=self.rpm,
            tpm=self.tpm,
            logprobs=self.logprobs,
        )
        prompts = Path(self.prompts_dir) if self.prompts_dir else None
        policy = self.text_policy
        redact = policy.redactor().judge_input if policy.redacts_prompts else None
        if self.sessions:
            from ragpulse.judges.llm.build import build_session_judges

            return JudgePanel(
                build_session_judges(self.names, endpoint, prompts, redact, self.custom_judges),
                self.batch_deadline_seconds,
                cache,
            )
        return JudgePanel(
            build_llm_judges(
                self.names,
                endpoint,
                prompts,
                redact,
                self.guidelines,
                self.custom_judges,
                self.score_threshold,
                self.embeddings_model,
                self.ensembles,
                self.combine,
            ),
            self.batch_deadline_seconds,
            cache,
            self.composites,
        )


_PANELS: list[tuple[JudgeSpec, JudgePanel]] = []
_PANELS_LOCK = threading.Lock()


def shared_panel(spec: JudgeSpec) -> JudgePanel:
    """The one panel of this process for `spec` (equal specs share it), built on first use
    and kept until the process exits.

    Kept for the process on purpose: `serve` builds a new Beam pipeline every cycle, and the
    judge stage of each finds the same panel here, so its loop, HTTP connections and calls in
    flight outlive a cycle, and calls that serve started ahead for the next cycle's events
    (`pipeline.service.lookahead`) are there for that cycle's judge stage to take over.
    """
    with _PANELS_LOCK:
        for known, panel in _PANELS:
            if known == spec:
                return panel
        panel = spec.build()
        _PANELS.append((spec, panel))
        return panel


@atexit.register
def close_shared_panels() -> None:
    """Close every shared panel (their HTTP clients); the next `shared_panel` builds anew."""
    with _PANELS_LOCK:
        panels = [panel for _, panel in _PANELS]
        _PANELS.clear()
    for panel in panels:
        panel.close()


__all__ = [
    "DEFAULT_JUDGES",
    "ERROR_CAUSES",
    "JUDGES",
    "JUDGE_NAMES",
    "RATINGS",
    "Backend",
    "Chunk",
    "ErrorCause",
    "Guideline",
    "Judge",
    "JudgeEntry",
    "JudgeInput",
    "JudgePanel",
    "JudgeSpec",
    "Rating",
    "ReplyFormat",
    "TextPolicy",
    "ToolCall",
    "Turn",
    "Verdict",
    "check_judge_names",
    "close_shared_panels",
    "judge_entry",
    "shared_panel",
]
