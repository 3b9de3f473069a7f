"""The judge endpoint: the I/O edge between the LLM judges and an OpenAI-compatible server.

For `judges.llm.judge` (which builds the messages and reads the verdict) and `JudgeSpec.build`. One
`OpenAIJudgeEndpoint` sends chat requests for every LLM judge of a panel and guarantees that
whatever the server does, each call ends, in bounded time, as either a well-formed
`EndpointReply` or an `EndpointFailure` with a cause from `judges.base.ERROR_CAUSES`:

* the reply body is validated here (`ChatCompletionBody`): an HTML page, a string where an
  object belongs, a missing field are `malformed`, never an exception; token counts that are
  not plausible non-negative integers are counted as 0 and logged, so token counters only grow;
* `judges.endpoint.retry` is the one retry layer; a circuit breaker per endpoint
(`judges.endpoint.breaker`) fails
  calls fast while the endpoint is down; `--judge-rpm/--judge-tpm` quotas (`judges.endpoint.quota`)
  pace requests; the batch deadline published by `JudgePanel` bounds every wait (a queue slot, a
  quota, a Retry-After, a hung request);
* every text that leaves (reply content, refusal, error messages, log lines) has the API key
  scrubbed from it, also when the server echoes the key back.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
import math
import os
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from ragpulse.judges.base import ErrorCause, ThrottledLog
from ragpulse.judges.endpoint.breaker import CircuitBreaker, Refusal
from ragpulse.judges.endpoint.logprobs import TOP_LOGPROBS, TokenLogprob, read_logprobs
from ragpulse.judges.endpoint.quota import RateQuota, estimate_tokens
from ragpulse.judges.endpoint.retry import (
    CallFailure,
    ReplyFormat,
    RetryPolicy,
    decide_retry,
    failure_message,
    is_retryable,
    over_budget_note,
    parse_retry_after,
)
from ragpulse.judges.panel import batch_deadline

# The client library is imported where a call is made or fails, not with the judges: every
# command's settings (and a refused flag's one-line error) load this module, and importing
# openai takes most of a second.
if TYPE_CHECKING:
    import openai

log = logging.getLogger(__name__)

# Placeholder key for local OpenAI-compatible servers, which ignore the Authorization header
# but the client refuses to start without some key.
PLACEHOLDER_API_KEY = "unused"

# Keys shorter than this are placeholders ("EMPTY" for vLLM, "ollama", "unused"), not secrets;
# scrubbing them would mangle ordinary words in rationales.
MIN_SECRET_LENGTH = 8

FAILURE_LOG_INTERVAL_SECONDS = 10.0

# -- secrets ------------------------------------------------------------------------------------


def secret_scrubber(secret: str | None) -> Callable[[str], str]:
    """A function replacing `secret` and its obvious encodings with "[redacted]" in a text.

    The forms: as is, URL-encoded, JSON-escaped and base64 (with or without padding), so an
    endpoint that echoes the Authorization header in a reply or an error body cannot make the
    key reach a verdict row or a log line. Placeholder keys (shorter than 8 characters) are
    left alone.
    """
    if not secret or len(secret) < MIN_SECRET_LENGTH:
        return lambda text: text
    encoded = base64.b64encode(secret.encode()).decode()
    forms = {
        secret,
        urllib.parse.quote(secret, safe=""),
        json.dumps(secret)[1:-1],
        encoded,
        encoded.rstrip("="),
        base64.urlsafe_b64encode(secret.encode()).decode().rstrip("="),
    }
    pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))
    return lambda text: pattern.sub("[redacted]", text)


def _redacted_url(url: str | None) -> str:
    return re.sub(r"//[^/@]*@", "//", url) if url else "(openai default)"


# -- the reply body (a boundary: validated with pydantic) ---------------------------------------


class _ReplyMessage(BaseModel):
    model_config = ConfigDict(frozen=True)

    content: StrictStr | None  # required, may be null (then `refusal` may say why)
    refusal: StrictStr | None = None


class _ReplyChoice(BaseModel):
    model_config = ConfigDict(frozen=True)

    message: _ReplyMessage
    finish_reason: StrictStr | None = None
    # Read leniently (judges.endpoint.logprobs): a bad one only loses P(yes).
    logprobs: object = None


class ChatCompletionBody(BaseModel):
    """The part of a chat completion body the judges read; anything else is `malformed`.

    `usage` is read leniently afterwards (`usage_counts`): a reply with a verdict but odd token
    counts still grades the event.
    """

    model_config = ConfigDict(frozen=True)

    choices: list[_ReplyChoice] = Field(min_length=1)
    usage: object = None


class MalformedReply(ValueError):
    """The endpoint answered 200 with something that is not a chat completion."""


_Body = TypeVar("_Body", bound=BaseModel)


def _read_body(body: bytes, content_type: str | None, model: type[_Body]) -> _Body:
    """A 200 reply body validated as `model`; raises `MalformedReply` saying why not."""
    try:
        data = json.loads(body)
    except ValueError:
        excerpt = body[:80].decode("utf-8", "replace")
        raise MalformedReply(
            f"the body is not JSON (Content-Type {content_type or 'missing'}), "
            f"it began {excerpt!r}"
        ) from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors()[:3]
        )
        raise MalformedReply(problems) from None


def read_completion(body: bytes, content_type: str | None) -> ChatCompletionBody:
    """The validated chat completion in a 200 reply body; raises `MalformedReply` saying why."""
    return _read_body(body, content_type, ChatCompletionBody)


class _Embedding(BaseModel):
    model_config = ConfigDict(frozen=True)

    embedding: list[float] = Field(min_length=1)
    index: int = Field(ge=0)


class EmbeddingsBody(BaseModel):
    """The part of an embeddings body the judges read; anything else is `malformed`."""

    model_config = ConfigDict(frozen=True)

    data: list[_Embedding] = Field(min_length=1)
    usage: object = None


def read_embeddings(body: bytes, content_type: str | None, count: int) -> EmbeddingsBody:
    """The validated embeddings of `count` texts in a 200 reply; raises `MalformedReply`."""
    parsed = _read_body(body, content_type, EmbeddingsBody)
    indexes = sorted(d.index for d in parsed.data)
    sizes = {len(d.embedding) for d in parsed.data}
    if indexes != list(range(count)) or len(sizes) != 1:
        raise MalformedReply(
            f"expected {count} embeddings of one size, got indexes {indexes[:5]} of sizes "
            f"{sorted(sizes)[:3]}"
        )
    return parsed


def _count(value: object, bound: int) -> int | None:
    """`value` as a token count if it is a whole number within 0..bound, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not (math.isfinite(value) and value == int(value) and 0 <= value <= bound):
        return None
    return int(value)


def usage_counts(
    usage: object, prompt_bound: int, completion_bound: int
) -> tuple[int, int, int, str | None]:
    """(prompt, completion, cached prompt) tokens from a reply's `usage`, and what was wrong
    with it if anything.

    Missing usage is (0, 0, 0) without complaint (some servers do not report it), and so is a
    missing `prompt_tokens_details.cached_tokens` (the provider's prompt cache, a part of the
    prompt tokens). A count that is not a whole number within 0..bound (a string, negative,
    1e30; cached tokens above the prompt tokens) is taken as 0 and reported, because these
    counts feed counters that must only grow.
    """
    if usage is None:
        return 0, 0, 0, None
    if not isinstance(usage, Mapping):
        return 0, 0, 0, f"usage is {type(usage).__name__}, not an object"
    problems: list[str] = []

    def read(field: str, value: object, bound: int) -> int:
        count = _count(value, bound) if value is not None else 0
        if count is None:
            problems.append(f"{field}={str(value)[:40]!r} (expected a whole number 0..{bound})")
            return 0
        return count

    prompt = read("prompt_tokens", usage.get("prompt_tokens"), prompt_bound)
    completion = read("completion_tokens", usage.get("completion_tokens"), completion_bound)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    # The cached tokens are a part of the prompt tokens.
    cached_prompt = read("prompt_tokens_details.cached_tokens", cached, prompt)
    return prompt, completion, cached_prompt, "; ".join(problems) or None


# -- outcomes -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointReply:
    """A successful call: the assistant message text, why it ended, and token usage."""

    content: str | None
    prompt_tokens: int
    completion_tokens: int
    latency_seconds: float
    cached_prompt_tokens: int = 0  # of prompt_tokens, read from the provider's prompt cache
    refusal: str | None = None
    finish_reason: str | None = None
    # With --judge-logprobs, the reply's tokens and their alternatives, when the endpoint
    # returned well-formed ones (judges.endpoint.logprobs).
    logprobs: tuple[TokenLogprob, ...] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointFailure:
    """A call that failed for good: the last failure, a sentence for people, and the cost."""

    cause: ErrorCause
    message: str
    attempts: int
    latency_seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class EndpointEmbeddings:
    """A successful embeddings call: one vector per text, in order, and its prompt tokens."""

    vectors: tuple[tuple[float, ...], ...]
    prompt_tokens: int
    latency_seconds: float


_Outcome = TypeVar("_Outcome", EndpointReply, EndpointEmbeddings)


class _QuotaPastDeadline(Exception):
    def __init__(self, wait: float) -> None:
        super().__init__(f"{wait:.1f} s")
        self.wait = wait


def _failure_from(
    exc: BaseException, now: float, scrub: Callable[[str], str]
) -> CallFailure | None:
    """Map a client exception to a library-neutral failure (None: not a call failure)."""
    import openai

    if isinstance(exc, openai.APITimeoutError | TimeoutError):
        return CallFailure("timeout")
    if isinstance(exc, openai.APIConnectionError):
        return CallFailure("connection")
    if isinstance(exc, openai.APIStatusError):
        retry_after = parse_retry_after(dict(exc.response.headers.items()), now)
        said = " ".join(exc.response.text.split())[:300]
        return CallFailure("status", exc.status_code, retry_after, scrub(said) or None)
    if isinstance(exc, MalformedReply):
        return CallFailure("malformed", detail=scrub(str(exc)))
    return None


# -- state shared by every endpoint object of a process -----------------------------------------


@dataclasses.dataclass(frozen=True)
class SharedEndpointState:
    """The breaker and quotas of one endpoint (base_url + model), for the whole process."""

    breaker: CircuitBreaker
    requests: RateQuota | None
    tokens: RateQuota | None


_SHARED: dict[tuple[Any, ...], SharedEndpointState] = {}
_SHARED_LOCK = threading.Lock()


def shared_endpoint_state(
    base_url: str | None,
    model: str,
    *,
    breaker_failures: int,
    breaker_cooldown_seconds: float,
    rpm: int | None,
    tpm: int | None,
) -> SharedEndpointState:
    """The process-wide breaker and quotas of the endpoint `base_url` + `model`.

    Process-wide on purpose: `serve` builds a new Beam pipeline every cycle, and with it a new
    judge panel and a new `OpenAIJudgeEndpoint` in each `DoFn.setup`. A breaker kept in the
    endpoint object would forget every cycle that the endpoint is down (and spend a round of
    timeouts to learn it again), and a quota would start each cycle full. The key also holds the
    settings, so two configurations never share state by accident.
    """
    key = (base_url, model, breaker_failures, breaker_cooldown_seconds, rpm, tpm)
    with _SHARED_LOCK:
        state = _SHARED.get(key)
        if state is None:
            state = SharedEndpointState(
                CircuitBreaker(
                    breaker_failures,
                    breaker_cooldown_seconds,
                    name=f"judge endpoint {_redacted_url(base_url)} model {model}",
                ),
                RateQuota(rpm) if rpm else None,
                RateQuota(tpm) if tpm else None,
            )
            _SHARED[key] = state
        return state


def forget_shared_endpoint_states() -> None:
    """Drop every endpoint's breaker and quotas (tests that reuse an address start afresh)."""
    with _SHARED_LOCK:
        _SHARED.clear()


# -- the endpoint -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Call:
    """What one call asks of the model: its model (None: the endpoint's), the reply's JSON
    schema and its token cap."""

    model: str | None
    json_schema: Mapping[str, Any]
    max_tokens: int


@dataclasses.dataclass(slots=True)
class _LoopState:
    loop: asyncio.AbstractEventLoop
    client: openai.AsyncOpenAI
    semaphore: asyncio.Semaphore


class OpenAIJudgeEndpoint:
    """One OpenAI-compatible chat endpoint shared by all LLM judges of a panel.

    Settings: `base_url` and `api_key` fall back to OPENAI_BASE_URL / OPENAI_API_KEY. Local
    servers need no key: when none is configured but a base URL is, the placeholder "unused"
    is sent; with neither, construction fails with a ValueError saying what to set. The key is
    never logged, kept out of `repr`, and scrubbed from every text this class returns.

    `reply_format` is what `response_format` asks for: "json_schema" (the call's reply schema,
    strict), "json_object" (any JSON object; the prompt gives the shape) or "text" (no
    `response_format`; the prompt's `rationale:` / `rating:` lines are read). `max_tokens` caps
    each reply. Calls are bounded by one semaphore (`concurrency`) across every judge using this
    endpoint, and retried by `judges.endpoint.retry` only (the client's own retries are off). The
    client and the semaphore are made lazily inside the running event loop, and remade if the loop
    changes, because `JudgePanel` runs its own private loop; the breaker and the quotas are
    process-wide (`shared_endpoint_state`). The numbers are trusted: they come from flags that
    `pipeline.settings.models.JudgeSettings` has validated, the one place their bounds are written.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        model: str = "gpt-4o-mini",
        temperature: float = 0.1,
        timeout_seconds: float = 30.0,
        max_retries: int = 4,
        concurrency: int = 16,
        reply_format: ReplyFormat = "json_schema",
        max_tokens: int = 256,
        breaker_failures: int = 5,
        breaker_cooldown_seconds: float = 30.0,
        rpm: int | None = None,
        tpm: int | None = None,
        logprobs: bool = False,
        backoff_base_seconds: float = 0.5,
        backoff_max_seconds: float = 8.0,
        max_retry_after_seconds: float = 60.0,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self.base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if not key:
            if self.base_url is None:
                raise ValueError(
                    "no API key for the judge endpoint: set OPENAI_API_KEY, or the base URL "
                    "(--judge-base-url, OPENAI_BASE_URL) of a local OpenAI-compatible server "
                    "that needs no key"
                )
            key = PLACEHOLDER_API_KEY
        self._api_key = key
        self.scrub = secret_scrubber(key)
        self.model = model
        self.temperature = temperature
        self.timeout_seconds = timeout_seconds
        self.concurrency = concurrency
        self.reply_format: ReplyFormat = reply_format
        self.max_tokens = max_tokens
        self.logprobs = logprobs
        self.policy = RetryPolicy(
            max_retries=max_retries,
            base_delay=backoff_base_seconds,
            max_delay=backoff_max_seconds,
            max_retry_after=max_retry_after_seconds,
        )
        self.shared = shared_endpoint_state(
            self.base_url,
            model,
            breaker_failures=breaker_failures,
            breaker_cooldown_seconds=breaker_cooldown_seconds,
            rpm=rpm,
            tpm=tpm,
        )
        self._jitter = jitter
        self._failure_log = ThrottledLog(log, FAILURE_LOG_INTERVAL_SECONDS)
        self._state: _LoopState | None = None

    def __repr__(self) -> str:
        return (
            f"OpenAIJudgeEndpoint(base_url={_redacted_url(self.base_url)!r}, "
            f"model={self.model!r}, concurrency={self.concurrency})"
        )

    def _loop_state(self) -> _LoopState:
        loop = asyncio.get_running_loop()
        if self._state is None or self._state.loop is not loop:
            import openai

            client = openai.AsyncOpenAI(
                base_url=self.base_url,
                api_key=self._api_key,
                timeout=self.timeout_seconds,
                max_retries=0,  # judges.endpoint.retry is the one retry layer
            )
            self._state = _LoopState(loop, client, asyncio.Semaphore(self.concurrency))
            log.info(
                "LLM judge endpoint %s, model %s, concurrency %d, reply format %s",
                _redacted_url(self.base_url),
                self.model,
                self.concurrency,
                self.reply_format,
            )
        return self._state

    async def aclose(self) -> None:
        """Close the HTTP client of the current loop (optional; for tidy shutdowns)."""
        if self._state is not None and self._state.loop is asyncio.get_running_loop():
            await self._state.client.close()
            self._state = None

    def _request_options(self, call: _Call) -> dict[str, Any]:
        options: dict[str, Any] = {"max_tokens": call.max_tokens}
        if self.logprobs:
            options["logprobs"] = True
            options["top_logprobs"] = TOP_LOGPROBS
        if self.reply_format == "json_schema":
            options["response_format"] = {"type": "json_schema", "json_schema": call.json_schema}
        elif self.reply_format == "json_object":
            # Only the type: OpenAI refuses unknown keys here, so no schema rides along.
            options["response_format"] = {"type": "json_object"}
        return options

    async def _wait_for_quota(self, tokens: int, deadline: float | None) -> None:
        """Wait for this request's share of the rpm/tpm quotas; raises `_QuotaPastDeadline`
        (having given the share back) when the wait would end past the deadline."""
        taken = [
            (quota, units)
            for quota, units in ((self.shared.requests, 1), (self.shared.tokens, tokens))
            if quota is not None
        ]
        if not taken:
            return
        wait = max(quota.reserve(units) for quota, units in taken)
        try:
            if deadline is not None and asyncio.get_running_loop().time() + wait >= deadline:
                raise _QuotaPastDeadline(wait)
            await asyncio.sleep(wait)
        except BaseException:
            for quota, units in taken:
                quota.give_back(units)
            raise

    async def _attempt(
        self, state: _LoopState, send: Callable[[], Awaitable[_Outcome]]
    ) -> _Outcome | Refusal:
        """One request (`send`), or the breaker's refusal; records the outcome with the
        breaker."""
        async with state.semaphore:
            # Asked once a slot is free, not before queueing: calls queued behind a hung
            # endpoint then fail fast as soon as the breaker opens.
            permit = self.shared.breaker.acquire()
            if isinstance(permit, Refusal):
                return permit
            try:
                reply = await send()
            except Exception as exc:
                failure = _failure_from(exc, time.time(), self.scrub)
                if failure is None:  # over quota, a bug: says nothing about the endpoint
                    self.shared.breaker.abandoned(permit)
                elif is_retryable(failure):
                    self.shared.breaker.failed(permit, _short_description(failure))
                else:  # it answered: the request was wrong, the endpoint is up
                    self.shared.breaker.succeeded(permit)
                raise
            except BaseException:  # cancelled (the batch deadline)
                self.shared.breaker.abandoned(permit)
                raise
            self.shared.breaker.succeeded(permit)
            return reply

    async def _send(
        self,
        state: _LoopState,
        messages: Sequence[Mapping[str, str]],
        deadline: float | None,
        call: _Call,
    ) -> EndpointReply:
        estimate = estimate_tokens(messages, call.max_tokens)
        tokens = self.shared.tokens
        # Paced inside the semaphore, so that requests leave when their quota says, not in a
        # burst when slots free up.
        await self._wait_for_quota(estimate, deadline)
        started = time.perf_counter()
        try:
            # A wall-clock bound per attempt as well: the client's timeout is per read, so a
            # server trickling bytes could otherwise hold a slot far longer.
            async with asyncio.timeout(self.timeout_seconds):
                raw = await state.client.chat.completions.with_raw_response.create(
                    model=call.model or self.model,
                    messages=messages,  # type: ignore[arg-type]
                    temperature=self.temperature,
                    **self._request_options(call),
                )
            latency = time.perf_counter() - started
            # Parsed here rather than by the client: its models accept any shape without
            # complaint (a `message` that is a string, `usage` of 1e30) and hand back a str
            # for an HTML page.
            completion = read_completion(raw.content, raw.headers.get("content-type"))
        except BaseException:
            if tokens is not None:
                tokens.give_back(estimate)  # refused, unreadable or never answered
            raise
        sent = sum(len((m.get("content") or "").encode()) for m in messages)
        prompt_tokens, completion_tokens, cached_prompt_tokens, problem = usage_counts(
            completion.usage, 2 * sent + 1024, 2 * call.max_tokens + 1024
        )
        if problem:
            self._failure_log.warning(
                ("usage",),
                "judge endpoint reported unusable token usage, counted as 0: %s",
                self.scrub(problem),
            )
        if tokens is not None and completion.usage is not None and not problem:
            used = prompt_tokens + completion_tokens
            if used < estimate:
                tokens.give_back(estimate - used)
            else:
                tokens.charge(used - estimate)
        choice = completion.choices[0]
        message = choice.message
        logprobs, bad = read_logprobs(choice.logprobs) if self.logprobs else (None, None)
        if bad:
            self._failure_log.warning(
                ("logprobs",), "judge endpoint returned unusable logprobs, verdicts keep no "
                "probability: %s", bad,
            )
        return EndpointReply(
            content=self.scrub(message.content) if message.content is not None else None,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            latency_seconds=latency,
            cached_prompt_tokens=cached_prompt_tokens,
            refusal=self.scrub(message.refusal) if message.refusal else None,
            finish_reason=choice.finish_reason,
            logprobs=logprobs,
        )

    async def complete(
        self,
        judge: str,
        messages: Sequence[Mapping[str, str]],
        json_schema: Mapping[str, Any],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
    ) -> EndpointReply | EndpointFailure:
        """Send one chat request, retrying as `judges.endpoint.retry` decides; never raises for I/O.

        Ends by the batch deadline (`judges.panel.batch_deadline`) when there is one. With the
        json_schema reply format, `json_schema` (OpenAI's `{"name", "strict", "schema"}`, from
        `judges.llm.judge.strict_schema`) is the shape the reply must have (a verdict, a score,
        claims, several verdicts at once); `model` replaces the endpoint's model (an ensemble's
        member) and `max_tokens` its reply cap.
        """
        call = _Call(model, json_schema, self.max_tokens if max_tokens is None else max_tokens)
        state = self._loop_state()
        deadline = batch_deadline()
        return await self._call(
            judge, state, deadline, lambda: self._send(state, messages, deadline, call)
        )

    async def embed(
        self, judge: str, texts: Sequence[str], model: str
    ) -> EndpointEmbeddings | EndpointFailure:
        """The embeddings of `texts` from the endpoint's /embeddings with `model`, through the
        same retry layer, breaker, quotas and deadline as chat requests; never raises for I/O."""
        state = self._loop_state()
        deadline = batch_deadline()
        return await self._call(
            judge, state, deadline, lambda: self._send_embeddings(state, texts, model, deadline)
        )

    async def _send_embeddings(
        self, state: _LoopState, texts: Sequence[str], model: str, deadline: float | None
    ) -> EndpointEmbeddings:
        estimate = estimate_tokens([{"content": t} for t in texts], 0)
        tokens = self.shared.tokens
        await self._wait_for_quota(estimate, deadline)
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.timeout_seconds):
                # Floats asked for explicitly: the client asks for base64 by default, which
                # it would decode itself, but the body is read here (`read_embeddings`).
                raw = await state.client.embeddings.with_raw_response.create(
                    model=model, input=list(texts), encoding_format="float"
                )
            latency = time.perf_counter() - started
            body = read_embeddings(raw.content, raw.headers.get("content-type"), len(texts))
        except BaseException:
            if tokens is not None:
                tokens.give_back(estimate)
            raise
        sent = sum(len(t.encode()) for t in texts)
        prompt_tokens, _, _, problem = usage_counts(body.usage, 2 * sent + 1024, 0)
        if problem:
            self._failure_log.warning(
                ("usage",),
                "embeddings endpoint reported unusable token usage, counted as 0: %s",
                self.scrub(problem),
            )
        vectors = tuple(tuple(d.embedding) for d in sorted(body.data, key=lambda d: d.index))
        return EndpointEmbeddings(vectors, prompt_tokens, latency)

    async def _call(
        self,
        judge: str,
        state: _LoopState,
        deadline: float | None,
        send: Callable[[], Awaitable[_Outcome]],
    ) -> _Outcome | EndpointFailure:
        """`send` until it succeeds or `judges.endpoint.retry` says stop (see `complete`)."""
        loop = state.loop
        spent = 0.0
        attempt = 0
        # The cause and message of the last failed attempt, when a retry of it is pending.
        retried: tuple[ErrorCause, str] | None = None

        def give_up(cause: ErrorCause, message: str) -> EndpointFailure:
            message = self.scrub(message)
            self._failure_log.warning((judge, cause), "judge %s: %s", judge, message)
            return EndpointFailure(cause, message, attempt, spent)

        while True:
            attempt += 1
            started = loop.time()
            try:
                async with asyncio.timeout_at(deadline) as budget:
                    outcome = await self._attempt(state, send)
            except _QuotaPastDeadline as exc:
                return give_up(
                    "rate_limited",
                    f"the --judge-rpm/--judge-tpm quota would hold this call {exc.wait:.0f} s, "
                    "past the batch deadline (--judge-batch-deadline); not sent",
                )
            except Exception as exc:
                spent += loop.time() - started
                if budget.expired():
                    return give_up(
                        "deadline",
                        f"the batch deadline (--judge-batch-deadline) passed during attempt "
                        f"{attempt}; the call was cancelled",
                    )
                failure = _failure_from(exc, time.time(), self.scrub)
                if failure is None:
                    raise
                message = failure_message(
                    failure, attempt, self.timeout_seconds, self.reply_format
                )
                remaining = math.inf if deadline is None else deadline - loop.time()
                decision = decide_retry(failure, attempt, self.policy, self._jitter(), remaining)
                if not decision.retry:
                    if decision.over_budget:
                        message += over_budget_note(decision, remaining)
                    return give_up(failure.cause, message)
                log.debug(
                    "judge %s: attempt %d of %d failed (%s); retrying in %.2f s",
                    judge,
                    attempt,
                    self.policy.max_attempts,
                    self.scrub(message),
                    decision.delay,
                )
                retried = (failure.cause, message)
                await asyncio.sleep(decision.delay)
            else:
                if isinstance(outcome, Refusal):
                    attempt -= 1  # not sent
                    if retried is not None:  # it was called, and failed: say how
                        cause, message = retried
                        return give_up(
                            cause,
                            f"{message}; not retried: the circuit breaker opened "
                            f"(--judge-breaker-failures)",
                        )
                    return give_up(
                        "circuit_open", _circuit_message(outcome, self.shared.breaker)
                    )
                return dataclasses.replace(outcome, latency_seconds=spent + outcome.latency_seconds)


def _short_description(failure: CallFailure) -> str:
    """What went wrong, in a few words, for the breaker's messages."""
    if failure.kind == "status":
        return f"HTTP {failure.status}"
    return {"timeout": "no answer in time", "connection": "connection failed"}.get(
        failure.kind, "malformed reply"
    )


def _circuit_message(refusal: Refusal, breaker: CircuitBreaker) -> str:
    when = (
        f"the next probe goes out in {refusal.retry_in:.0f} s"
        if refusal.retry_in > 0
        else "a probe is under way"
    )
    last = f" (the last: {refusal.last_failure})" if refusal.last_failure else ""
    return (
        f"not called: the judge endpoint's circuit breaker is open after {refusal.failures} "
        f"consecutive failures{last}; {when} (--judge-breaker-cooldown "
        f"{breaker.cooldown_seconds:g}s)"
    )
