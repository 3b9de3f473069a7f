"""A local stand-in for an OpenAI-compatible chat endpoint, for tests and benchmarks.

The paid LLM API is the one part of ragpulse that tests may not use for real, so this module
serves `POST /v1/chat/completions` over real HTTP on 127.0.0.1 (stdlib `ThreadingHTTPServer`,
one thread per connection, so a slow reply never blocks another request) and lets a test script
what the "model" does:

* `reply_mode`: "json" (a structured `{"rationale", "rating"}` reply, as with `response_format`
  json_schema), "plain" (`rationale: ...` / `rating: ...` lines, a server that ignores the
  schema) or "garbage" (prose with no verdict);
* `latency`: seconds every reply takes;
* a queue of one-shot `Fault`s served before normal replies: an HTTP status (429 with
  Retry-After, 500, 401 ..., with the error message given), a hang longer than the client's
  timeout, a malformed JSON body, an HTML page with status 200, a 200 whose body is given
  verbatim (any shape), or a 200 whose message content, finish_reason and usage are given.
  `{authorization}` in a fault's text is replaced by the request's Authorization header, to
  play an endpoint that echoes the API key;
* `response_formats`: the `response_format` types it accepts ("text" = none sent); others get
  the 400 (or `format_rejection_status`) a server without that feature answers;
* `max_tokens` is honoured like a real server: a reply longer than that many words is cut and
  its finish_reason is "length";
* `prompt_cache`: play a provider's prompt caching: the leading messages of a request that
  match, byte for byte, the leading messages of an earlier request are reported as
  `usage.prompt_tokens_details.cached_tokens` (their words), as OpenAI reports a cached prefix;
* the claim-score judges (judges.llm.claim_scores, whose user message ends "List the claims and
  their verdicts."): each sentence of the fenced answer is a claim, supported ("yes") unless it
  contains `MARKER`; each line or sentence of the fenced expected answer is an expected claim,
  stated by the answer ("yes") unless the answer contains `MARKER`;
* `POST /v1/embeddings`: a deterministic 16-dimension vector per text (its words hashed), so
  texts sharing words are similar, as floats or (encoding_format base64, the openai client's
  default) base64 float32s like OpenAI; status and malformed faults apply to it too;
* `reply_for`: when set, the whole message content for a request body (its `model`, its
  `response_format`, its messages), or None for the usual verdict: to answer on a graded
  scale (`score: 2` / `justification: ...`) or differently per model;
* combined calls (`judges.llm.combined`, `--judge-combine`): a system message ending in
  `Verdicts wanted: a, b, c` gets one verdict per judge named there, as a JSON object keyed by
  judge name (or `NAME rationale:` / `NAME rating:` lines in "plain" mode), each chosen by
  `decide_for(judge, request)` (default: `decide` for every judge);
* `logprobs`: what a request asking for `logprobs` gets: "off" none (a server without
  them), "on" a token list of the reply whose rating token (a yes/no word or score digit after
  "rating"/"score") has top_logprobs giving it probability `rating_probability` and the rest
  to the other word (or, on a score, to the score below), "malformed" a logprobs
  object of the wrong shape;
* `count_tokens`: how prompt and completion tokens are counted (default: words), e.g. a
  tokenizer's count for a benchmark;
* `decide`: how the verdict is chosen from the request. The default reads the fenced answer
  (`<answer-NONCE>...</answer-NONCE>`) and says "no" when it contains `MARKER`. It also behaves
  like a gullible model: a `rating: yes|no` line or JSON verdict found in the last user message
  *outside* every fence is obeyed. A judge that fails to fence untrusted text therefore gets
  the injected verdict back, which is what makes the prompt-injection test able to fail.

`hold_after(n)` answers the next n chat requests and holds every later one until `release()`:
`release(answer=False)` then ends the held requests without a reply (outcome "abandoned"), as
for a client killed while waiting; `held` says how many are waiting. A test builds a crash in
the middle of a batch this way, deterministically, not by timing.

Every request is logged (`requests`), the peak number of requests in flight is kept
(`max_concurrent`), and every change of that number with its time (`in_flight_log`), from which
`occupancy()` says how busy the server was kept: calls per second, the mean number in flight
and the longest stretch with none in flight. Use `FakeOpenAI` as a context manager in scripts,
or the `fake_openai` pytest fixture (import `fake_openai_fixture` into a test module).
"""

from __future__ import annotations

import base64
import collections
import dataclasses
import itertools
import json
import math
import re
import struct
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

import pytest

ReplyMode = Literal["json", "plain", "garbage"]
FakeRating = Literal["yes", "no"]

# The word that makes the default decision "no" when it appears inside the fenced answer.
MARKER = "FORBIDDEN"

# A fence is <name-hex> ... </name-hex> with the same name and nonce on both tags.
_FENCE = re.compile(r"<([a-z_]+)-([0-9a-f]{8,})>(.*?)</\1-\2>", re.DOTALL)
_OBEYED_LINE = re.compile(r"^\s*rating\s*:\s*(yes|no)\b", re.IGNORECASE | re.MULTILINE)
_OBEYED_JSON = re.compile(r'"rating"\s*:\s*"(yes|no)"', re.IGNORECASE)


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """One scripted misbehaviour, served to one request (in queue order)."""

    kind: Literal["status", "hang", "malformed", "html", "body", "content"]
    status: int = 200
    retry_after: str | None = None
    hang_seconds: float = 5.0
    content: str = ""
    body: Any = None
    finish_reason: str = "stop"
    usage: Any = None

    @classmethod
    def http(cls, status: int, retry_after: str | None = None, message: str = "") -> Fault:
        """Answer with this HTTP status and an OpenAI-style error body saying `message`."""
        return cls(
            "status", status=status, retry_after=retry_after, content=message or f"HTTP {status}"
        )

    @classmethod
    def hang(cls, seconds: float = 5.0) -> Fault:
        """Say nothing for `seconds` (longer than the client timeout), then close."""
        return cls("hang", hang_seconds=seconds)

    @classmethod
    def malformed(cls) -> Fault:
        """Answer 200 with a body that is not JSON."""
        return cls("malformed")

    @classmethod
    def html(cls) -> Fault:
        """Answer 200 with an HTML page (a proxy's login or error page), Content-Type text/html."""
        return cls("html")

    @classmethod
    def raw_body(cls, body: Any) -> Fault:
        """Answer 200 with this JSON value as the whole body, whatever its shape."""
        return cls("body", body=body)

    @classmethod
    def reply(cls, content: str, finish_reason: str = "stop", usage: Any = None) -> Fault:
        """Answer 200 with this exact assistant message content (and finish_reason, and usage
        in place of the counted one when given)."""
        return cls("content", content=content, finish_reason=finish_reason, usage=usage)


@dataclasses.dataclass(frozen=True, slots=True)
class Occupancy:
    """How busy a `FakeOpenAI` was kept over `seconds` (first request's start to last end)."""

    seconds: float
    ok_calls: int
    mean_in_flight: float
    longest_idle: float  # the longest stretch with no request in flight
    idle_gaps: list[float]

    @property
    def calls_per_second(self) -> float:
        return self.ok_calls / self.seconds if self.seconds else 0.0


@dataclasses.dataclass(frozen=True, slots=True)
class FencedRequest:
    """What the fake model "reads": fenced blocks by name, and the user text outside fences."""

    fenced: dict[str, list[str]]
    unfenced: str
    user_message: str


@dataclasses.dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the server received, and what it did with it."""

    path: str
    body: dict[str, Any] | None
    headers: dict[str, str]
    received_at: float
    outcome: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    answered_at: float = 0.0  # time.monotonic() when it was answered (or given up on)


Decide = Callable[[FencedRequest], tuple[FakeRating, str]]
DecideFor = Callable[[str, FencedRequest], tuple[FakeRating, str]]
ReplyFor = Callable[[dict[str, Any]], str | None]

# The last line of a combined call's system message (judges.llm.combined) names its judges.
_VERDICTS_WANTED = re.compile(r"^Verdicts wanted: ([a-z0-9_, ]+)$", re.MULTILINE)


def request_identity(body: dict[str, Any] | None) -> str:
    """What a request asks, without the fences' per-call nonces: equal for two calls of the same
    judge on the same event, so a test can count how often each input was paid for."""
    return _NONCE.sub(">", json.dumps(body.get("messages") if body else None, sort_keys=True))


_NONCE = re.compile(r"-[0-9a-f]{8,}>")


def read_fences(user_message: str) -> FencedRequest:
    """Split a user message into its fenced blocks and the text outside them."""
    fenced: dict[str, list[str]] = collections.defaultdict(list)
    for match in _FENCE.finditer(user_message):
        fenced[match.group(1)].append(match.group(3))
    return FencedRequest(dict(fenced), _FENCE.sub(" ", user_message), user_message)


def default_decide(request: FencedRequest) -> tuple[FakeRating, str]:
    """A gullible model: obeys unfenced verdict lines, else "no" iff the answer has MARKER."""
    obeyed = _OBEYED_LINE.search(request.unfenced) or _OBEYED_JSON.search(request.unfenced)
    if obeyed:
        rating: FakeRating = "yes" if obeyed.group(1).lower() == "yes" else "no"
        return rating, "I was told the rating outside the quoted data."
    answers = request.fenced.get("answer")
    # No answer fence at all: the judge did not fence, so the model reads the whole message.
    answer_text = "\n".join(answers) if answers else request.user_message
    if MARKER in answer_text:
        return "no", "The answer contains the marker word."
    return "yes", "The answer is acceptable."


def _last_user_message(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return "\n".join(str(part.get("text", "")) for part in content)
            return str(content or "")
    return ""


CLAIMS_REQUEST = "List the claims and their verdicts."
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s.strip()]


def claims_reply(request: FencedRequest) -> str:
    """The claims JSON a claim-score judge asks for (see the module docstring)."""
    answer = "\n".join(request.fenced.get("answer", []))
    claims = [
        {"claim": s, "verdict": "no" if MARKER in s else "yes"} for s in _sentences(answer)
    ]
    if "expected" not in request.fenced:
        return json.dumps({"claims": claims})
    stated = "no" if MARKER in answer else "yes"
    expected = "\n".join(request.fenced["expected"])
    return json.dumps({
        "answer_claims": claims,
        "expected_claims": [
            {"claim": s.lstrip("- "), "verdict": stated} for s in _sentences(expected)
        ],
    })


_TOKEN = re.compile(r"\s*\w+|\s*[^\w\s]+")


def token_logprobs(content: str, probability: float) -> dict[str, Any]:
    """OpenAI's `logprobs` of a reply: each token certain, but the rating's value (the first
    yes/no word or digit after the last "rating" / "score") at `probability`, the rest of the
    mass on the other word (on a score: on the score below)."""
    tokens = _TOKEN.findall(content)
    keyed = [i for i, t in enumerate(tokens) if t.strip().lower() in ("rating", "score")]
    value_at = None
    if keyed:
        value_at = next((i for i in range(keyed[-1] + 1, len(tokens))
                         if re.fullmatch(r"yes|no|\d", tokens[i].strip().lower())), None)
    out = []
    for i, token in enumerate(tokens):
        top = [{"token": token, "logprob": 0.0}]
        logprob = 0.0
        if i == value_at:
            logprob = math.log(probability)
            word = token.strip().lower()
            lead = token[: len(token) - len(token.lstrip())]
            if word in ("yes", "no"):
                others = [f"{lead}{'no' if word == 'yes' else 'yes'}"]
            else:
                others = [f"{lead}{int(word) - 1}"]
            share = (1 - probability) / len(others)
            top = [{"token": token, "logprob": logprob},
                   *({"token": o, "logprob": math.log(share)} for o in others)]
        out.append({"token": token, "logprob": logprob, "top_logprobs": top})
    return {"content": out}


def embedding_of(text: str, size: int = 16) -> list[float]:
    """A deterministic vector: the text's lower-cased words hashed into `size` buckets."""
    vector = [0.0] * size
    for word in re.findall(r"\w+", text.lower()):
        vector[zlib.crc32(word.encode()) % size] += 1.0
    return vector


def word_count(text: str) -> int:
    """The default token count: words separated by white space."""
    return len(text.split())


def _system_message(body: dict[str, Any]) -> str:
    for message in body.get("messages") or []:
        if message.get("role") == "system":
            return str(message.get("content") or "")
    return ""


class _Server(ThreadingHTTPServer):
    # The default listen backlog (5) refuses connections when a client opens 16+ at once.
    request_queue_size = 256


class FakeOpenAI:
    """A scriptable OpenAI-compatible chat server on 127.0.0.1 (see the module docstring)."""

    def __init__(
        self,
        *,
        reply_mode: ReplyMode = "json",
        latency: float = 0.0,
        decide: Decide = default_decide,
        response_formats: tuple[str, ...] = ("json_schema", "json_object", "text"),
        format_rejection_status: int = 400,
        prompt_cache: bool = False,
        decide_for: DecideFor | None = None,
        count_tokens: Callable[[str], int] = word_count,
        reply_for: ReplyFor | None = None,
        logprobs: Literal["off", "on", "malformed"] = "off",
        rating_probability: float = 0.9,
    ) -> None:
        self.logprobs = logprobs
        self.rating_probability = rating_probability
        self.reply_mode: ReplyMode = reply_mode
        self.latency = latency
        self.decide = decide
        self.decide_for = decide_for
        self.count_tokens = count_tokens
        self.reply_for = reply_for
        self.response_formats = response_formats
        self.format_rejection_status = format_rejection_status
        self.prompt_cache = prompt_cache
        self._prefixes: set[tuple[str, ...]] = set()
        self.requests: list[RecordedRequest] = []
        self.max_concurrent = 0
        self._in_flight = 0
        # (time.monotonic(), requests in flight just after) at every request's start and end.
        self.in_flight_log: list[tuple[float, int]] = []
        self._faults: collections.deque[Fault] = collections.deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        # hold_after / release: replies still given before holding (None: never hold).
        self._replies_left: int | None = None
        self._released = threading.Event()
        self._answer_held = True
        self.held = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- scripting ---------------------------------------------------------------------------

    def push_faults(self, *faults: Fault) -> None:
        """Queue faults; each is served to exactly one request, before normal replies resume."""
        with self._lock:
            self._faults.extend(faults)

    def hold_after(self, n: int) -> None:
        """Answer the next `n` chat requests, then hold every later one until `release`."""
        with self._lock:
            self._replies_left = n
            self._released.clear()

    def release(self, *, answer: bool = True) -> None:
        """Let the held requests go on (answered, or, with answer=False, ended unanswered) and
        stop holding."""
        with self._lock:
            self._replies_left = None
            self._answer_held = answer
            self._released.set()

    def _holds(self) -> bool:
        """Whether this request is to be held (counts it against `hold_after`)."""
        with self._lock:
            if self._replies_left is None:
                return False
            if self._replies_left > 0:
                self._replies_left -= 1
                return False
            self.held += 1
            return True

    def reset_log(self) -> None:
        """Forget the request log and the concurrency peak (e.g. between benchmark rounds)."""
        with self._lock:
            self.requests.clear()
            self.max_concurrent = 0
            self.in_flight_log = [(time.monotonic(), self._in_flight)] if self._in_flight else []

    @property
    def base_url(self) -> str:
        """The `base_url` to give an OpenAI client (ends in /v1)."""
        if self._server is None:
            raise RuntimeError("the fake server is not running")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> FakeOpenAI:
        """Bind a free port on 127.0.0.1 and serve in a daemon thread."""
        server = _Server(("127.0.0.1", 0), self._handler_class())
        server.daemon_threads = True
        self._server = server
        # A short poll interval so that stop() (and each test's teardown) takes milliseconds.
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-openai"
        )
        self._thread.daemon = True
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; hanging requests are released at once."""
        self._stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def __enter__(self) -> FakeOpenAI:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- serving -----------------------------------------------------------------------------

    def _next_fault(self) -> Fault | None:
        with self._lock:
            return self._faults.popleft() if self._faults else None

    def _enter(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.max_concurrent = max(self.max_concurrent, self._in_flight)
            self.in_flight_log.append((time.monotonic(), self._in_flight))

    def _leave(self) -> None:
        with self._lock:
            self._in_flight -= 1
            self.in_flight_log.append((time.monotonic(), self._in_flight))

    def occupancy(self) -> Occupancy:
        """How busy the server was kept from the first request's start to the last one's end
        (since the last `reset_log`)."""
        with self._lock:
            changes = list(self.in_flight_log)
            done = sum(1 for r in self.requests if r.outcome == "ok")
        if len(changes) < 2:
            return Occupancy(0.0, done, 0.0, 0.0, [])
        area = 0.0
        idle: list[float] = []
        for (t, n), (t_next, _) in itertools.pairwise(changes):
            area += n * (t_next - t)
            if n == 0:
                idle.append(t_next - t)
        span = changes[-1][0] - changes[0][0]
        return Occupancy(span, done, area / span if span else 0.0, max(idle, default=0.0), idle)

    def _record(self, entry: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(entry)

    def _cached_words(self, body: dict[str, Any]) -> int:
        """The words of the longest run of leading messages seen before, then remembers this
        request's leading runs (the last message, the event, is never a prefix)."""
        messages = [json.dumps(m, sort_keys=True) for m in body.get("messages") or []]
        words = [self.count_tokens(str(m.get("content") or "")) for m in body.get("messages") or []]
        cached = 0
        with self._lock:
            for k in range(1, len(messages)):
                prefix = tuple(messages[:k])
                if prefix in self._prefixes:
                    cached = sum(words[:k])
                self._prefixes.add(prefix)
        return cached

    def _prompt_tokens(self, body: dict[str, Any]) -> int:
        messages = body.get("messages") or []
        return sum(self.count_tokens(str(m.get("content") or "")) for m in messages)

    def _content_for(self, body: dict[str, Any]) -> str:
        if self.reply_for is not None:
            routed = self.reply_for(body)
            if routed is not None:
                return routed
        request = read_fences(_last_user_message(body))
        if request.user_message.endswith(CLAIMS_REQUEST):
            return claims_reply(request)
        wanted = _VERDICTS_WANTED.search(_system_message(body))
        if wanted and self.reply_mode != "garbage":
            names = [n.strip() for n in wanted.group(1).split(",") if n.strip()]
            decide_for = self.decide_for or (lambda _, request: self.decide(request))
            verdicts = {name: decide_for(name, request) for name in names}
            if self.reply_mode == "json":
                return json.dumps(
                    {n: {"rationale": why, "rating": r} for n, (r, why) in verdicts.items()}
                )
            return "\n".join(
                f"{n} rationale: {why}\n{n} rating: {r}" for n, (r, why) in verdicts.items()
            )
        rating, rationale = self.decide(request)
        if self.reply_mode == "json":
            return json.dumps({"rationale": rationale, "rating": rating})
        if self.reply_mode == "plain":
            return f"Rationale: {rationale}\nRating: {rating}"
        return "Well, it is hard to say; there are many ways to look at this."

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out as separate writes; without TCP_NODELAY, Nagle's
            # algorithm and the client's delayed ACK add ~40 ms to every reply.
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                pass  # keep test output quiet

            def _send(
                self,
                status: int,
                payload: bytes,
                headers: dict[str, str],
                content_type: str = "application/json",
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

            def do_POST(self) -> None:
                received_at = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                try:
                    body: dict[str, Any] | None = json.loads(raw)
                except ValueError:
                    body = None
                fake._enter()
                try:
                    self._serve(body, headers, received_at)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout); nothing to answer
                finally:
                    fake._leave()

            def _serve(
                self, body: dict[str, Any] | None, headers: dict[str, str], received_at: float
            ) -> None:
                def record(outcome: str, prompt: int = 0, completion: int = 0) -> None:
                    fake._record(
                        RecordedRequest(
                            self.path, body, headers, received_at, outcome, prompt, completion,
                            time.monotonic(),
                        )
                    )

                if self.path.rstrip("/") == "/v1/embeddings" and body is not None:
                    self._embeddings(body, record)
                    return
                if self.path.rstrip("/") != "/v1/chat/completions" or body is None:
                    record("404")
                    self._send(404, b'{"error": {"message": "not found"}}', {})
                    return
                if fake._holds():
                    while not (fake._released.wait(0.05) or fake._stopping.is_set()):
                        pass
                    with fake._lock:
                        fake.held -= 1
                        answer = fake._answer_held
                    if not answer:
                        record("abandoned")
                        self.close_connection = True
                        return
                fault = fake._next_fault()
                if fault is not None and fault.kind == "hang":
                    record("hang")
                    fake._stopping.wait(fault.hang_seconds)
                    self.close_connection = True
                    return
                if fake.latency:
                    time.sleep(fake.latency)
                echo = headers.get("authorization", "")
                if fault is not None and fault.kind == "status":
                    record(f"status {fault.status}")
                    extra = {"Retry-After": fault.retry_after} if fault.retry_after else {}
                    message = fault.content.replace("{authorization}", echo)
                    error = {"error": {"message": message, "type": "fake"}}
                    self._send(fault.status, json.dumps(error).encode(), extra)
                    return
                if fault is not None and fault.kind == "malformed":
                    record("malformed")
                    self._send(200, b'{"id": "chatcmpl-broken", "choices": [', {})
                    return
                if fault is not None and fault.kind == "html":
                    record("html")
                    page = b"<html><head><title>Sign in</title></head><body>proxy</body></html>"
                    self._send(200, page, {}, "text/html; charset=utf-8")
                    return
                if fault is not None and fault.kind == "body":
                    record("body")
                    self._send(200, json.dumps(fault.body).encode(), {})
                    return
                requested = (body.get("response_format") or {}).get("type", "text")
                if requested not in fake.response_formats:
                    record(f"rejected {requested}")
                    message = f"response_format type {requested} is not supported by this server"
                    error = {"error": {"message": message, "type": "invalid_request_error"}}
                    self._send(fake.format_rejection_status, json.dumps(error).encode(), {})
                    return
                if fault is not None:
                    content = fault.content.replace("{authorization}", echo)
                    finish_reason = fault.finish_reason
                else:
                    content, finish_reason = fake._content_for(body), "stop"
                words = content.split(" ")
                cap = body.get("max_tokens")
                if isinstance(cap, int) and len(words) > cap:
                    content, finish_reason = " ".join(words[:cap]), "length"
                prompt_tokens = fake._prompt_tokens(body)
                completion_tokens = fake.count_tokens(content)
                record("ok", prompt_tokens, completion_tokens)
                usage: dict[str, Any] = {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                }
                if fake.prompt_cache:
                    usage["prompt_tokens_details"] = {"cached_tokens": fake._cached_words(body)}
                if fault is not None and fault.usage is not None:
                    usage = fault.usage
                choice: dict[str, Any] = {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish_reason,
                }
                if body.get("logprobs") and fake.logprobs != "off":
                    choice["logprobs"] = (
                        token_logprobs(content, fake.rating_probability)
                        if fake.logprobs == "on"
                        else {"content": [{"token": "yes", "logprob": "very likely"}]}
                    )
                reply = {
                    "id": f"chatcmpl-fake-{len(fake.requests)}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", "fake"),
                    "choices": [choice],
                    "usage": usage,
                }
                self._send(200, json.dumps(reply).encode(), {})

            def _embeddings(self, body: dict[str, Any], record: Callable[..., None]) -> None:
                fault = fake._next_fault()
                if fault is not None and fault.kind == "status":
                    record(f"status {fault.status}")
                    error = {"error": {"message": fault.content, "type": "fake"}}
                    self._send(fault.status, json.dumps(error).encode(), {})
                    return
                if fault is not None and fault.kind == "malformed":
                    record("malformed")
                    self._send(200, b'{"object": "list", "data": [', {})
                    return
                texts = body.get("input")
                texts = [texts] if isinstance(texts, str) else list(texts or [])
                # After the same latency as a chat reply (a benchmark's peers also embed).
                if fake.latency:
                    time.sleep(fake.latency)
                words = sum(fake.count_tokens(str(t)) for t in texts)
                record("ok", words, 0)
                vectors: list[Any] = [embedding_of(str(t)) for t in texts]
                if body.get("encoding_format", "float") == "base64":
                    # As OpenAI does: little-endian float32s, base64-encoded.
                    vectors = [
                        base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() for v in vectors
                    ]
                reply = {
                    "object": "list",
                    "model": body.get("model", "fake"),
                    "data": [
                        {"object": "embedding", "index": i, "embedding": v}
                        for i, v in enumerate(vectors)
                    ],
                    "usage": {"prompt_tokens": words, "total_tokens": words},
                }
                self._send(200, json.dumps(reply).encode(), {})

        return Handler


@pytest.fixture(name="fake_openai")
def fake_openai_fixture() -> Iterator[FakeOpenAI]:
    """A running `FakeOpenAI` (json replies, no latency) for one test; stopped afterwards."""
    with FakeOpenAI() as server:
        yield server
