"""`ragpulse run --input-format otlp_json|otlp_proto` on a file of SDK-made spans, shuffled:
one verdict row per whole trace, dead letters for the rest."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
from otlp_spans import openinference_trace, otlp_json, otlp_proto, trace_id

from ragpulse.pipeline.cli import main

pytestmark = pytest.mark.slow  # each runs a Beam pipeline

GROUNDED = "QP-1457 quality records are retained for ten years."
UNGROUNDED = "Refunds take 90 days at the Zurich office."


def _file(path: Path, encoding: str, messages: list[bytes]) -> Path:
    if encoding == "otlp_json":  # OTLP JSON lines (the Collector's file exporter, json)
        path.write_bytes(b"".join(m + b"\n" for m in messages))
    else:  # protobuf messages each behind a 4-byte big-endian length (format: proto)
        path.write_bytes(b"".join(len(m).to_bytes(4, "big") + m for m in messages))
    return path


@pytest.mark.parametrize("encoding", ["otlp_json", "otlp_proto"])
def test_a_file_of_shuffled_spans_gives_one_verdict_per_trace_and_dead_letters_the_rest(
    tmp_path: Path, encoding: str, capsys: pytest.CaptureFixture[str]
) -> None:
    encode = otlp_json if encoding == "otlp_json" else otlp_proto
    grounded, ungrounded, rootless = (
        openinference_trace(answer=GROUNDED),
        openinference_trace(answer=UNGROUNDED, service="other-bot"),
        [s for s in openinference_trace() if s.parent is not None],
    )
    messages = [encode([s]) for s in (*grounded, *ungrounded, *rootless)]
    random.Random(7).shuffle(messages)
    messages.append(b"\x0a\xff garbage" if encoding == "otlp_proto" else b"{garbage")
    src = _file(tmp_path / f"spans.{encoding}", encoding, messages)

    out = tmp_path / "out"
    flags = ["--input-format", encoding, "--judges", "groundedness", "--judge-backend", "local"]
    assert main(["run", str(src), "--output", str(out), *flags]) == 0
    assert "read 4 traces and unreadable records" in capsys.readouterr().out

    lines = (out / "verdicts.jsonl").read_bytes().splitlines()
    verdicts = {r["request_id"]: r for r in map(orjson.loads, lines)}
    assert set(verdicts) == {trace_id(grounded), trace_id(ungrounded)}
    row = verdicts[trace_id(grounded)]
    assert (row["app"], row["model"]) == ("support-bot", "gpt-4o-mini")
    # Grounded in the retriever span's documents: the chunks were assembled with the answer.
    assert row["response/llm_judged/groundedness/rating"] == "yes"
    assert verdicts[trace_id(ungrounded)]["app"] == "other-bot"
    assert verdicts[trace_id(ungrounded)]["response/llm_judged/groundedness/rating"] == "no"
    letters = [orjson.loads(x) for x in (out / "dead_letter.jsonl").read_bytes().splitlines()]
    reasons = sorted(x["reason"] for x in letters)
    assert len(reasons) == 2
    assert any(r.startswith(f"trace {trace_id(rootless)}: no root span") for r in reasons)
    assert any("not" in r and "OTLP" in r for r in reasons)
