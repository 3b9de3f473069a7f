"""Fuzzing the event boundary with hypothesis: random and mutated events never crash ragpulse.

Mutations start from the valid sample events of deploy/samples/events.jsonl: keys deleted at any
depth, values replaced by other JSON types, huge and odd unicode (lone surrogates, control and
bidi characters, astral planes), deep nesting, bytes truncated, flipped or not UTF-8, non-JSON
numbers (NaN). `parse_event` may only raise `InvalidEvent`; a file of such lines run through
`ragpulse run` (FnApiRunner, local judges) never crashes, and every line is either accepted or
in dead_letter.jsonl with a reason. Examples are derandomized so CI sees the same inputs.
"""

from __future__ import annotations

import copy
import json
import random
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragpulse.pipeline.commands.run import run_file
from ragpulse.pipeline.formats.events import InvalidEvent, parse_event
from ragpulse.pipeline.metrics import counting
from ragpulse.pipeline.settings.models import JudgeSettings, RunSettings
from ragpulse.pipeline.sinks.files import DEAD_LETTER_FILE

pytestmark = pytest.mark.slow  # ~10,000 events through parse_event, then a Beam run

def _valid_samples() -> list[Any]:
    """The sample events that parse (the file also holds malformed lines on purpose)."""
    path = Path(__file__).resolve().parent.parent / "deploy" / "samples" / "events.jsonl"
    valid = []
    for line in path.read_bytes().splitlines():
        try:
            parse_event(line)
        except InvalidEvent:
            continue
        valid.append(orjson.loads(line))
    return valid


SAMPLES = _valid_samples()
MAX_BYTES = 64 * 1024  # small, so that huge values cross it cheaply
EVENTS_PER_EXAMPLE = 100

ODD_CHARS = ["\x00", "\x1f", "\u202e", "\ufeff", "\u0301", "\u2028", "\U0001f4a9", "\U000e0001",
             "\n", "\r", '"', "\\", "é", "ß", "中", "a", " "]
ENVELOPE_KEYS = ["request_id", "timestamp", "app", "model", "request", "response",
                 "retrieved_context", "trace", "expected_response"]


def odd_text(rnd: random.Random) -> str:
    """Up to 40 characters: lone surrogates, controls, bidi overrides, combining marks, astral."""
    text = "".join(
        rnd.choice(ODD_CHARS) if rnd.random() < 0.7 else chr(rnd.randrange(0x110000))
        for _ in range(rnd.randrange(41))
    )
    # A lone surrogate makes the whole line invalid: rare enough to let the rest be parsed.
    return text + rnd.choice(["\ud800", "\udfff"]) if rnd.random() < 0.05 else text


def json_value(rnd: random.Random, depth: int = 0) -> Any:
    """A random JSON value of any type (floats include NaN and infinities)."""
    kind = rnd.randrange(8 if depth < 3 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rnd.random() < 0.5
    if kind == 2:
        return rnd.choice([0, -1, 2**63, -(2**64), 10**30, rnd.randrange(-(10**15), 10**15)])
    if kind == 3:
        return rnd.choice([0.5, -0.0, 1e308, float("nan"), float("inf"), rnd.uniform(-1e18, 1e18)])
    if kind in (4, 5):
        return odd_text(rnd)
    if kind == 6:
        return [json_value(rnd, depth + 1) for _ in range(rnd.randrange(4))]
    return {odd_text(rnd): json_value(rnd, depth + 1) for _ in range(rnd.randrange(4))}


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every key path into `value` (the root included)."""
    found = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*prefix, i))
    return found


def _set(root: Any, path: tuple[Any, ...], value: Any, *, delete: bool = False) -> Any:
    if not path:
        return value
    parent = root
    for step in path[:-1]:
        parent = parent[step]
    if delete:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return root


def mutate(rnd: random.Random) -> bytes:
    """A sample event with a few mutations, encoded, and maybe damaged as bytes."""
    event: Any = copy.deepcopy(rnd.choice(SAMPLES))
    for _ in range(rnd.randrange(5)):
        path = rnd.choice(_paths(event))
        kind = rnd.choice(["delete", "replace", "odd", "huge", "nest"])
        if kind == "delete" and path:
            event = _set(event, path, None, delete=True)
        elif kind == "replace":
            event = _set(event, path, json_value(rnd))
        elif kind == "odd":
            event = _set(event, path, odd_text(rnd))
        elif kind == "huge":
            size = rnd.choice([MAX_BYTES // 2, MAX_BYTES + 1, 4 * MAX_BYTES])
            event = _set(event, path, rnd.choice(["x", "é", "\U0001f4a9"]) * size)
        elif kind == "nest":
            nested: Any = "deep"
            as_lists = rnd.random() < 0.5
            for _ in range(rnd.choice([10, 200, 600])):  # json.dumps recurses
                nested = [nested] if as_lists else {"a": nested}
            event = _set(event, path, nested)
    # json, not orjson: it writes NaN and lone surrogates (as \ud800 escapes), as bad loggers do.
    raw = json.dumps(event, ensure_ascii=rnd.random() < 0.8).encode("utf-8", "surrogatepass")
    damage = rnd.choice(["none", "none", "none", "none", "truncate", "flip", "prefix"])
    if damage == "truncate":
        raw = raw[: rnd.randrange(len(raw) + 1)]
    elif damage == "flip" and raw:
        at = rnd.randrange(len(raw))
        raw = raw[:at] + bytes([rnd.randrange(256)]) + raw[at + 1 :]
    elif damage == "prefix":
        raw = rnd.choice([b"\xef\xbb\xbf", b"\xff", b" ", b"[", b"null"]) + raw
    return raw


def random_event(rnd: random.Random) -> bytes:
    """An object of envelope keys with random values, or nesting deeper than encoders write."""
    if rnd.random() < 0.1:
        depth = rnd.randrange(1_000, 30_000)
        return b'{"response": "a", "request": ' + b"[" * depth + b"]" * depth + b"}"
    keys = rnd.sample(ENVELOPE_KEYS, rnd.randrange(len(ENVELOPE_KEYS) + 1))
    return json.dumps({k: json_value(rnd) for k in keys}).encode("utf-8", "surrogatepass")


def events(rnd: random.Random, n: int) -> list[bytes]:
    """`n` fuzzed events: mostly mutated samples, some random objects, some random bytes."""
    out = []
    for _ in range(n):
        roll = rnd.random()
        if roll < 0.75:
            out.append(mutate(rnd))
        elif roll < 0.92:
            out.append(random_event(rnd))
        else:
            out.append(rnd.randbytes(rnd.randrange(200)))
    return out


# Hypothesis drives the seeds (derandomized: the same inputs in every run) and shrinks a failing
# batch; the mutations themselves draw from that seeded Random, which is ~10x faster than drawing
# every choice through hypothesis.
SEEDED = st.randoms(use_true_random=True)


def check_parse(raw: bytes) -> None:
    try:
        parse_event(raw, record_time=1_736_931_600.0, max_bytes=MAX_BYTES)
    except InvalidEvent as exc:
        assert exc.reason and "\n" not in exc.reason


@settings(
    max_examples=10_000 // EVENTS_PER_EXAMPLE,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.large_base_example],
)
@given(SEEDED)
def test_parse_event_rejects_ten_thousand_random_and_mutated_events_only_with_invalid_event(
    rnd: random.Random,
) -> None:
    for raw in events(rnd, EVENTS_PER_EXAMPLE):
        check_parse(raw)


@settings(
    max_examples=1,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(SEEDED)
def test_a_file_of_mutated_events_runs_through_and_every_rejected_line_is_dead_lettered_with_why(
    tmp_path_factory: pytest.TempPathFactory, rnd: random.Random
) -> None:
    tmp = tmp_path_factory.mktemp("fuzz-run")
    lines = [*(orjson.dumps(s) for s in SAMPLES[:50]), *events(rnd, 1_000)]
    content = b"\n".join(lines) + b"\n"
    source = tmp / "events.jsonl"
    source.write_bytes(content)
    expected_lines = content.count(b"\n")  # mutations may have added line breaks

    started = time.monotonic()
    result = run_file(RunSettings(
        input=source,
        output=tmp / "out",
        judges=JudgeSettings(backend="local", names=("groundedness", "safety")),
        max_event_bytes=MAX_BYTES,
    ))
    print(f"{expected_lines} lines through ragpulse run in {time.monotonic() - started:.1f}s")

    accepted = result.counts[counting.key("ragpulse_events_total", outcome="accepted")]
    rejected = result.counts[counting.key("ragpulse_events_total", outcome="invalid")]
    letters = [orjson.loads(r) for r in (tmp / "out" / DEAD_LETTER_FILE).read_bytes().splitlines()]
    assert accepted + rejected == expected_lines
    assert accepted >= 50  # the untouched samples at least
    assert len(letters) == rejected == result.dead_letters
    assert all(isinstance(r["reason"], str) and r["reason"] for r in letters)
    assert len({r["position"] for r in letters}) == rejected  # one row per rejected line
