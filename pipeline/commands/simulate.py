"""`ragpulse simulate`: synthetic chatbot inference logs, to Kafka or to a JSON-lines file.

For demos, load tests and the samples in deploy/samples: questions over a small built-in
knowledge base (product docs, HR policy, billing), 1-5 retrieved chunks, answers that reuse the
chunk's wording (so a lexical groundedness judge finds them supported) and the question's words
(so a relevance judge finds them on topic). Every request/response shape of the Agent Evaluation
schema appears, including MLflow traces. Some answers (`tool_call_share`) come from an agent
that called 1-3 tools (a knowledge-base search, a document fetch, an account lookup): as the
event's `tool_calls`, or as TOOL spans when the event carries an MLflow trace. Incidents can be
switched on: a groundedness drop (answers inventing numbers and names), a burst of unsafe
answers, a burst of malformed records, late events, answers without retrieved context, and a
tool that starts failing (its calls error, and the agent often repeats the failed call). With
`--conversation-turns N`, events come in conversations of N turns sharing a `session_id` (and
an app), for the session judges (docs/sessions.md); `--forgetting-at T` then plays a model that
starts forgetting earlier turns: from T on, every later turn's answer asks again for what the
conversation already established, and the user's next turn says so.

Everything is drawn from one seeded RNG, so a seed and the options give the same bytes. The
tool calls are drawn from an RNG seeded with the event's request id, so adding them left every
other field of every event as it was.
"""

from __future__ import annotations

import dataclasses
import json
import random
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ragpulse.pipeline.kafka_security import PLAINTEXT, KafkaSecurity, check_access, connect
from ragpulse.pipeline.settings.models import (
    DEFAULT_APPS,
    DEFAULT_MODELS,
    TOOL_CALL_SHARE,
    Incidents,
    SimulateSettings,
)
from ragpulse.pipeline.settings.models import SIMULATED_TOOLS as TOOLS
from ragpulse.pipeline.windows import isoformat_utc


@dataclasses.dataclass(frozen=True, slots=True)
class Fact:
    """One knowledge-base passage, a question it answers and answers grounded or not in it."""

    doc_uri: str
    chunk: str
    question: str
    answer: str  # reuses the chunk's wording and the question's words
    invented: str  # same topic, but with {n} and {name} that no chunk contains


_PRODUCT = (
    Fact(
        "docs/nimbus-router/setup.md#reset",
        "To factory reset the Nimbus router, hold the recessed reset button for 12 seconds "
        "until the status light blinks amber. The router restarts with the default admin "
        "password printed on the label.",
        "How do I factory reset the Nimbus router?",
        "To factory reset the Nimbus router, hold the recessed reset button for 12 seconds until "
        "the status light blinks amber; it restarts with the default admin password.",
        "To factory reset the Nimbus router, hold the power button for {n} seconds and call "
        "{name} from the support desk for a new password.",
    ),
    Fact(
        "docs/nimbus-router/wifi.md#bands",
        "The Nimbus router broadcasts on the 2.4 GHz and 5 GHz bands. The 5 GHz band supports "
        "up to 64 connected devices; the 2.4 GHz band supports up to 32 devices.",
        "How many devices can connect to the Nimbus router on the 5 GHz band?",
        "The Nimbus router 5 GHz band supports up to 64 connected devices.",
        "The Nimbus router 5 GHz band supports up to {n} connected devices, as {name} confirmed.",
    ),
    Fact(
        "docs/nimbus-router/firmware.md#updates",
        "Firmware updates for the Nimbus router are downloaded automatically every night at "
        "03:00 local time and installed after a restart. Automatic updates can be disabled in "
        "the Maintenance tab.",
        "When does the Nimbus router download firmware updates?",
        "The Nimbus router downloads firmware updates automatically every night at 03:00 local "
        "time and installs them after a restart.",
        "The Nimbus router downloads firmware updates every {n} days, scheduled by {name}.",
    ),
    Fact(
        "docs/nimbus-router/warranty.md",
        "The Nimbus router comes with a 2 year limited warranty covering hardware defects. "
        "Water damage and opened cases are not covered.",
        "How long is the Nimbus router warranty?",
        "The Nimbus router warranty is a 2 year limited warranty covering hardware defects.",
        "The Nimbus router warranty lasts {n} months and {name} can extend it for free.",
    ),
)

_BILLING = (
    Fact(
        "kb/billing/refunds.md",
        "Refunds are issued to the original payment method within 14 days of approval. "
        "Annual plans cancelled within 30 days of purchase are refunded in full.",
        "How long does a refund take to reach my payment method?",
        "Refunds are issued to the original payment method within 14 days of approval.",
        "Refunds reach your payment method within {n} hours once {name} signs them off.",
    ),
    Fact(
        "kb/billing/invoices.md",
        "Invoices are emailed on the first business day of each month and can be downloaded "
        "as PDF from the Billing page of the account settings.",
        "Where can I download my invoices?",
        "You can download your invoices as PDF from the Billing page of the account settings; "
        "they are also emailed on the first business day of each month.",
        "You can download invoices only by asking {name}, who sends them every {n} days.",
    ),
    Fact(
        "kb/billing/plans.md#team",
        "The Team plan costs 18 euros per user per month and includes 200 GB of shared storage "
        "and priority email support.",
        "How much does the Team plan cost per user?",
        "The Team plan costs 18 euros per user per month and includes 200 GB of shared storage.",
        "The Team plan costs {n} euros per user per month, according to {name}.",
    ),
)

_HR = (
    Fact(
        "policies/hr/annual-leave.pdf#p2",
        "Full-time employees accrue 25 days of paid annual leave per calendar year. Up to 5 "
        "unused days carry over and must be taken before 31 March of the following year.",
        "How many days of paid annual leave do full-time employees accrue?",
        "Full-time employees accrue 25 days of paid annual leave per calendar year, and up to "
        "5 unused days carry over.",
        "Full-time employees accrue {n} days of paid annual leave, approved by {name}.",
    ),
    Fact(
        "policies/hr/parental-leave.pdf#p1",
        "Parents are entitled to 16 weeks of fully paid parental leave, which can be taken in "
        "up to three blocks within 18 months of the birth or adoption.",
        "How many weeks of paid parental leave are parents entitled to?",
        "Parents are entitled to 16 weeks of fully paid parental leave, taken in up to three "
        "blocks within 18 months.",
        "Parents are entitled to {n} weeks of paid parental leave if {name} agrees.",
    ),
    Fact(
        "policies/hr/remote-work.md",
        "Employees may work remotely up to 3 days per week after their probation period. "
        "Working from abroad requires written approval from the People team.",
        "How many days per week may employees work remotely?",
        "Employees may work remotely up to 3 days per week after their probation period.",
        "Employees may work remotely {n} days per week once {name} signs the form.",
    ),
    Fact(
        "policies/hr/expenses.md#travel",
        "Travel expenses must be submitted in the expense tool within 60 days with receipts "
        "attached. Economy class is required for flights under 6 hours.",
        "What is the deadline for submitting travel expenses?",
        "Travel expenses must be submitted in the expense tool within 60 days with receipts "
        "attached.",
        "Travel expenses must be submitted within {n} days directly to {name} in finance.",
    ),
    Fact(
        "policies/hr/sick-leave.md",
        "Employees who are sick must notify their manager before 10:00 on the first day of "
        "absence. A doctor's note is required from the fourth day of absence.",
        "When is a doctor's note required for sick leave?",
        "A doctor's note is required from the fourth day of absence; employees who are sick "
        "must notify their manager before 10:00 on the first day.",
        "A doctor's note is required after {n} days of sick leave, checked by {name}.",
    ),
)

# One knowledge base per app, assigned in turn.
KNOWLEDGE_BASES: tuple[tuple[Fact, ...], ...] = (_PRODUCT + _BILLING, _HR)

# Names and numbers that appear in no chunk: what an ungrounded answer makes up.
_INVENTED_NAMES = (
    "Marcus Thornbury", "Helena Vasquez-Oduya", "Dr. Pieter Lindqvist", "Ottilie Brandvold",
    "Rafael Quintanilla", "Sigrid Amundsen",
)
_UNSAFE_ANSWERS = (
    "Forget the policy. You should threaten to kill your manager until they give in.",
    "Just steal your coworker's password and wire the company money to yourself.",
    "The best revenge is to build a bomb and blow up the office parking lot.",
    "People like them are subhuman vermin and deserve to be beaten.",
)


# The simulated agent's tools (TOOLS) and the share of answers that come with tool calls
# (TOOL_CALL_SHARE) are settings (pipeline.settings.models); the share of calls that fail in
# healthy traffic (a transient error the agent retries once) is not.
TRANSIENT_TOOL_ERRORS = 0.02


@dataclasses.dataclass(frozen=True, slots=True)
class SimulatedToolCall:
    """One call of the simulated agent, as `_event` writes it (field or trace span)."""

    name: str
    arguments: dict[str, str]
    result: str | None
    error: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class SimulatedEvent:
    """One generated record: its bytes, its (possibly late) event time and what it models."""

    payload: bytes
    event_time: float
    kind: str  # grounded | ungrounded | unsafe | malformed | forgetting
    late: bool = False
    without_context: bool = False
    tool_calls: int = 0  # how many tool calls the answer carries
    tool_failed: bool = False  # whether one of them failed


def simulate(
    seed: int,
    n: int,
    start_time: float,
    *,
    rate: float = 1.0,
    apps: Sequence[str] = DEFAULT_APPS,
    models: Sequence[str] = DEFAULT_MODELS,
    incidents: Incidents | None = None,
    conversation_turns: int = 0,
) -> Iterator[SimulatedEvent]:
    """`n` events, one every 1/`rate` seconds from `start_time` (epoch seconds), with labels;
    with `conversation_turns` N > 0, in conversations of N consecutive turns (one session id
    and one app each)."""
    if not apps or not models:
        raise ValueError("at least one app and one model are needed")
    inc = incidents or Incidents()
    rng = random.Random(seed)
    late_at = set(rng.sample(range(n), min(inc.late_events, n)))
    unsafe_left = inc.unsafe_burst_count
    malformed_left = inc.malformed_burst_count
    for i in range(n):
        offset = i / rate
        scheduled = start_time + offset
        if inc.malformed_burst_at is not None and offset >= inc.malformed_burst_at and (
            malformed_left > 0
        ):
            malformed_left -= 1
            yield SimulatedEvent(_malformed(rng, scheduled), scheduled, "malformed")
            continue
        late = i in late_at
        event_time = scheduled - inc.late_by_seconds if late else scheduled
        unsafe = (
            inc.unsafe_burst_at is not None and offset >= inc.unsafe_burst_at and unsafe_left > 0
        )
        if unsafe:
            unsafe_left -= 1
        dropping = (
            inc.groundedness_drop_at is not None
            and offset >= inc.groundedness_drop_at
            and (inc.groundedness_recover_at is None or offset < inc.groundedness_recover_at)
        )
        grounded = not dropping or rng.random() < inc.drop_to
        without_context = rng.random() < inc.no_context_share
        app_index = rng.randrange(len(apps))
        tool_failing = (
            inc.tool_failure_at is not None
            and offset >= inc.tool_failure_at
            and (inc.tool_recover_at is None or offset < inc.tool_recover_at)
        )
        conversation = i // conversation_turns if conversation_turns > 0 else None
        if conversation is not None:
            # Drawn above all the same, so that the random stream stays as without conversations.
            app_index = (seed + conversation) % len(apps)
        event, calls = _event(
            rng,
            app=apps[app_index],
            model=rng.choice(models),
            kb=KNOWLEDGE_BASES[app_index % len(KNOWLEDGE_BASES)],
            event_time=event_time,
            grounded=grounded,
            unsafe=unsafe,
            without_context=without_context,
            tool_call_share=inc.tool_call_share,
            failing_tool=inc.failing_tool if tool_failing else None,
            # A conversation asks about a different passage at each turn (as a user would),
            # so that its turns do not repeat one question.
            turn_of=None if conversation is None else (conversation, i % conversation_turns),
        )
        kind = "unsafe" if unsafe else ("grounded" if grounded else "ungrounded")
        if conversation is not None:
            event["session_id"] = f"conv-{seed}-{conversation}"
            turn = i % conversation_turns
            forgetting = inc.forgetting_at is not None and offset >= inc.forgetting_at
            if forgetting and turn > 0:
                _forget(event, turn)
                kind = "forgetting"
        yield SimulatedEvent(
            _dumps(event), event_time, kind, late, without_context, len(calls),
            any(c.error is not None for c in calls),
        )


_FORGETTING_ANSWER = (
    "Could you tell me again which product or policy you are asking about? I do not have "
    "anything from earlier in our conversation."
)


def _forget(event: dict[str, Any], turn: int) -> None:
    """Turn `turn` (> 0) of a conversation whose model forgot the earlier turns: the user says
    it was already told (from the second forgotten turn on), and the answer asks again."""
    if turn > 1:
        event["request"] = "I already told you that earlier. Please answer my question."
    event["response"] = _FORGETTING_ANSWER
    event.pop("trace", None)
    event.pop("retrieved_context", None)


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _event(
    rng: random.Random,
    *,
    app: str,
    model: str,
    kb: Sequence[Fact],
    event_time: float,
    grounded: bool,
    unsafe: bool,
    without_context: bool,
    tool_call_share: float = TOOL_CALL_SHARE,
    failing_tool: str | None = None,
    turn_of: tuple[int, int] | None = None,
) -> tuple[dict[str, Any], tuple[SimulatedToolCall, ...]]:
    fact = rng.choice(kb)
    if turn_of is not None:
        conversation, turn = turn_of
        fact = kb[(conversation * 3 + turn) % len(kb)]
    if unsafe:
        answer = rng.choice(_UNSAFE_ANSWERS)
    elif grounded:
        answer = fact.answer
    else:
        answer = fact.invented.format(n=rng.randint(113, 987), name=rng.choice(_INVENTED_NAMES))
    chunks: list[Fact] = []
    if not without_context:
        others = [f for f in kb if f is not fact]
        chunks = rng.sample(others, rng.randint(0, min(4, len(others))))
        chunks.insert(rng.randint(0, len(chunks)), fact)
    others = [f for f in kb if f is not fact]
    earlier = rng.choice(others)
    request_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    event: dict[str, Any] = {
        "request_id": request_id,
        "timestamp": (
            isoformat_utc(round(event_time, 3))
            if rng.random() < 0.5
            else round(event_time * 1000)
        ),
        "app": app,
        "model": model,
        # The chatbot's own latency (the overview's latency panel), from the request id so that
        # the random stream, and with it every other field, stays as it was.
        "latency_seconds": 0.2 + int(request_id[:4], 16) % 2000 / 1000,
    }
    calls = _tool_calls(request_id, fact, tool_call_share, failing_tool)
    request_kind = rng.randrange(4)
    if request_kind == 0:
        event["request"] = fact.question
    elif request_kind == 1:
        event["request"] = {
            "messages": [
                {"role": "system", "content": "You answer from the company knowledge base."},
                {"role": "user", "content": earlier.question},
                {"role": "assistant", "content": earlier.answer},
                {"role": "user", "content": fact.question},
            ]
        }
    elif request_kind == 2:
        event["request"] = {
            "query": fact.question,
            "history": [
                {"role": "user", "content": earlier.question},
                {"role": "assistant", "content": earlier.answer},
            ],
        }
    else:
        event["request"] = {"question": fact.question, "user_id": f"u-{rng.randrange(10_000)}"}
    response_kind = rng.randrange(3)
    if response_kind == 0:
        event["response"] = answer
    elif response_kind == 1:
        event["response"] = {
            "id": f"chatcmpl-{rng.getrandbits(48):012x}",
            "object": "chat.completion",
            "model": model,
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": answer},
                 "finish_reason": "stop"}
            ],
            # The chatbot's own token counts (the overview's token panels), from the texts so
            # that the random stream, and with it every other field, stays as it was.
            "usage": _usage(fact.question, answer),
        }
    if response_kind == 2:
        trace = _trace(rng, fact.question, answer, chunks, event_time, calls)
        # The Agent Evaluation schema allows the trace as an object or as a JSON string.
        event["trace"] = json.dumps(trace) if rng.random() < 0.3 else trace
    else:
        if chunks or rng.random() < 0.5:
            event["retrieved_context"] = [
                {"content": c.chunk, "doc_uri": c.doc_uri} for c in chunks
            ]
        if calls:
            event["tool_calls"] = [_tool_call_field(c) for c in calls]
    return event, calls


def _tool_calls(
    request_id: str, fact: Fact, share: float, failing_tool: str | None
) -> tuple[SimulatedToolCall, ...]:
    """The agent's calls for one answer: none for most, else the first 1-3 of TOOLS. Drawn
    from the request id (not the event's RNG), so every other field stays as it was. A call
    of `failing_tool` fails, and the agent repeats it with the same arguments half the time;
    in healthy traffic a few calls fail once and are retried."""
    tool_rng = random.Random(request_id)
    if tool_rng.random() >= share:
        return ()
    arguments = {
        "search_knowledge_base": {"query": fact.question},
        "get_document": {"doc_uri": fact.doc_uri},
        "lookup_account": {"user_id": f"u-{tool_rng.randrange(10_000)}"},
    }
    results = {
        "search_knowledge_base": json.dumps([fact.doc_uri]),
        "get_document": fact.chunk,
        "lookup_account": json.dumps({"plan": "Team", "seats": 12}),
    }
    calls: list[SimulatedToolCall] = []
    for name in list(TOOLS)[: tool_rng.randint(1, 3)]:
        if name == failing_tool:
            failed = SimulatedToolCall(name, arguments[name], None, f"HTTP 503 from {name}")
            calls.append(failed)
            if tool_rng.random() < 0.5:
                calls.append(failed)  # the agent tries the same call again, in vain
        elif tool_rng.random() < TRANSIENT_TOOL_ERRORS:
            calls.append(SimulatedToolCall(name, arguments[name], None, "timed out after 10 s"))
            calls.append(SimulatedToolCall(name, arguments[name], results[name], None))
        else:
            calls.append(SimulatedToolCall(name, arguments[name], results[name], None))
    return tuple(calls)


def _tool_call_field(call: SimulatedToolCall) -> dict[str, Any]:
    field: dict[str, Any] = {
        "name": call.name,
        "arguments": call.arguments,
        "description": TOOLS[call.name],
        "status": "ok" if call.error is None else "error",
    }
    if call.error is None:
        field["result"] = call.result
    else:
        field["error"] = call.error
    return field


def _usage(question: str, answer: str) -> dict[str, int]:
    """OpenAI-style token counts for a chat completion: about one token per word, plus the
    system prompt and the retrieved chunks the chatbot sent."""
    prompt, completion = 180 + 2 * len(question.split()), 1 + len(answer.split())
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _trace(
    rng: random.Random,
    question: str,
    answer: str,
    chunks: Sequence[Fact],
    event_time: float,
    calls: Sequence[SimulatedToolCall] = (),
) -> dict[str, Any]:
    """An MLflow 2.x serialized trace: a CHAIN root span, a RETRIEVER child span and a TOOL
    child span per tool call (their ids numbered from the root's, not drawn)."""
    trace_id = f"0x{rng.getrandbits(128):032x}"
    root_id, retriever_id = f"0x{rng.getrandbits(64):016x}", f"0x{rng.getrandbits(64):016x}"
    start_ns = int((event_time - 1.2) * 1e9)
    documents = [
        {"page_content": c.chunk, "metadata": {"doc_uri": c.doc_uri, "chunk_id": str(k)}}
        for k, c in enumerate(chunks)
    ]

    def span(
        name: str, span_id: str, parent: str | None, kind: str, inputs: Any, outputs: Any,
        start: int, end: int, error: str | None = None,
    ) -> dict[str, Any]:
        return {
            "name": name,
            "context": {"span_id": span_id, "trace_id": trace_id},
            "parent_id": parent,
            "start_time": start,
            "end_time": end,
            "status_code": "OK" if error is None else "ERROR",
            "status_message": error or "",
            "attributes": {
                "mlflow.traceRequestId": json.dumps(f"tr-{trace_id[2:]}"),
                "mlflow.spanType": json.dumps(kind),
                "mlflow.spanInputs": json.dumps(inputs),
                "mlflow.spanOutputs": json.dumps(outputs),
            },
            "events": [],
        }

    return {
        "info": {
            "request_id": f"tr-{trace_id[2:]}",
            "experiment_id": "0",
            "timestamp_ms": start_ns // 1_000_000,
            "execution_time_ms": 1200,
            "status": "OK",
        },
        "data": {
            "spans": [
                span("chat", root_id, None, "CHAIN", {"question": question}, answer,
                     start_ns, start_ns + 1_200_000_000),
                span("retrieve", retriever_id, root_id, "RETRIEVER", {"query": question},
                     documents, start_ns + 10_000_000, start_ns + 200_000_000),
                *(
                    span(c.name, f"0x{int(root_id, 16) + k + 1:016x}", root_id, "TOOL",
                         c.arguments, c.result, start_ns + (210 + 100 * k) * 1_000_000,
                         start_ns + (300 + 100 * k) * 1_000_000, c.error)
                    for k, c in enumerate(calls)
                ),
            ]
        },
    }


def _malformed(rng: random.Random, event_time: float) -> bytes:
    """A record the parser must reject, each kind of mistake in turn at random."""
    ms = round(event_time * 1000)
    kind = rng.randrange(6)
    if kind == 0:  # cut off mid-way
        return b'{"request": "How do I reset the router?", "response": "Hold the'
    if kind == 1:  # wrong type for request
        return _dumps({"request": 42, "response": "yes", "timestamp": ms})
    if kind == 2:  # neither response nor trace
        return _dumps({"request": "Where are my invoices?", "timestamp": ms, "app": "support-bot"})
    if kind == 3:  # not UTF-8 (Latin-1 bytes)
        return b'{"request": "Caf\xe9 opening hours?", "response": "8 to 18", "timestamp": 1}'
    if kind == 4:  # JSON, but not an object
        return b'["request", "response"]'
    return _dumps({"response": "Refunds take 14 days.", "timestamp": ms})  # no request


# --- command line ---


def main(settings: SimulateSettings) -> int:
    """Generate the traffic; 0 when every record was written/acknowledged, 1 otherwise."""
    n = settings.events
    events = simulate(
        settings.seed, n, settings.start_epoch(time.time()), rate=settings.rate,
        apps=settings.apps, models=settings.models, incidents=settings,  # an Incidents
        conversation_turns=settings.conversation_turns,
    )
    if settings.output is not None:
        with settings.output.open("wb") as out:
            for event in events:
                out.write(event.payload + b"\n")
        print(f"simulate: wrote {n} events to {settings.output}", file=sys.stderr)
        return 0
    assert settings.kafka_bootstrap is not None  # one of the two (argparse)
    # Fails here, naming the setting, when the broker refuses the certificate or password.
    check_access(settings.kafka_bootstrap, settings.kafka_security, timeout_s=30.0)
    return produce_paced(
        settings.kafka_bootstrap, settings.topic, events, settings.rate, settings.partitions,
        security=settings.kafka_security,
    )


def produce_paced(
    bootstrap: str,
    topic: str,
    events: Iterator[SimulatedEvent],
    rate: float,
    partitions: int | None = None,
    *,
    security: KafkaSecurity = PLAINTEXT,
) -> int:
    """Send `events` at `rate` per second (record timestamp = event time); 1 if any failed."""
    from kafka import KafkaAdminClient, KafkaProducer
    from kafka.admin import NewTopic

    from ragpulse.pipeline.sinks.kafka import close_producer

    if partitions is not None:
        admin = connect(KafkaAdminClient, bootstrap, security)
        try:
            if topic not in admin.list_topics():
                admin.create_topics([NewTopic(topic, partitions, 1)])
        finally:
            admin.close()
    producer = connect(
        KafkaProducer, bootstrap, security, linger_ms=20, batch_size=256 * 1024, acks=1, retries=5
    )
    failures: list[Exception] = []
    sent = 0
    started = time.monotonic()
    try:
        for i, event in enumerate(events):
            wait = started + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            future = producer.send(
                topic, value=event.payload, timestamp_ms=round(event.event_time * 1000)
            )
            future.add_errback(failures.append)
            sent += 1
        producer.flush(timeout=60)
    finally:
        close_producer(producer, 10)
    elapsed = time.monotonic() - started
    print(
        f"simulate: sent {sent} events to {topic} in {elapsed:.1f}s "
        f"({sent / max(elapsed, 1e-9):.1f}/s), {len(failures)} failed",
        file=sys.stderr,
    )
    if failures:
        print(f"simulate: first delivery failure: {failures[0]!r}", file=sys.stderr)
        return 1
    return 0
