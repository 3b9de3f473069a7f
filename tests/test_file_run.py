"""`ragpulse run` end to end on the FnApiRunner, with the local judges and malformed input."""

from pathlib import Path

import orjson
import pytest
from cli import one_line_error
from prometheus_client.parser import text_string_to_metric_families

from ragpulse.pipeline.cli import main

pytestmark = pytest.mark.slow  # each runs a Beam pipeline

T0 = 1_763_632_800  # 2025-11-20T10:00:00Z, a multiple of 300


def event(i: int, *, grounded: bool = True, minute: int = 0, app: str = "help-bot") -> bytes:
    answer = (
        "Refunds are accepted within 30 days of purchase."
        if grounded
        else "Refunds are accepted within 90 days at the Zurich office of Globex."
    )
    return orjson.dumps(
        {
            "request_id": f"req-{i}",
            "timestamp": (T0 + minute * 60 + i % 50) * 1000,
            "app": app,
            "model": "m1",
            "request": {
                "messages": [{"role": "user", "content": "How many days do refunds take?"}]
            },
            "response": answer,
            "retrieved_context": [
                {"content": "Refunds are accepted within 30 days of purchase.", "doc_uri": "kb/1"}
            ],
        }
    )


@pytest.fixture()
def run_output(tmp_path: Path) -> Path:
    lines = [event(i) for i in range(40)]  # window 1: all grounded
    lines += [event(100 + i, grounded=i % 2 == 0, minute=5) for i in range(20)]  # window 2: half
    lines += [
        b"{not json",
        b'{"request": 42, "response": "x", "timestamp": "2025-11-20T10:00:00Z"}',
        b"\xff\xfe not utf-8",
        b'{"request": "q", "response": "a"}',
        b"[1, 2, 3]",
        b'{"timestamp": "2025-11-20T10:00:00Z", "request": "q" ,"response": "a", "x": "'
        + b"y" * (10 * 1024 * 1024)
        + b'"}',
    ]
    return judged(events_file(tmp_path, lines), tmp_path / "out",
                  "--judges", "groundedness,relevance_to_query", "--window", "5m")


def events_file(folder: Path, lines: list[bytes]) -> Path:
    src = folder / "events.jsonl"
    src.write_bytes(b"\n".join(lines) + b"\n")
    return src


def judged(src: Path, out: Path, *flags: str) -> Path:
    """`ragpulse run SRC --output OUT FLAGS` with the local judges, which must succeed; OUT."""
    assert main(["run", str(src), "--output", str(out), "--judge-backend", "local", *flags]) == 0
    return out


def rows(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_every_valid_event_gets_one_verdict_row_with_agent_evaluation_fields(
    run_output: Path,
) -> None:
    verdicts = rows(run_output / "verdicts.jsonl")
    assert len(verdicts) == 60
    row = next(v for v in verdicts if v["request_id"] == "req-101")
    assert row["response/llm_judged/groundedness/rating"] == "no"
    assert "90" in row["response/llm_judged/groundedness/rationale"]
    assert row["response/llm_judged/groundedness/error_message"] is None
    assert row["response/llm_judged/relevance_to_query/rating"] in {"yes", "no"}
    assert row["app"] == "help-bot" and row["model"] == "m1"
    assert row["event_time"].startswith("2025-11-20T10:0")


def test_windows_hold_the_pass_ratio_of_their_own_events(run_output: Path) -> None:
    windows = {(w["window_start"], w["judge"]): w for w in rows(run_output / "windows.jsonl")}
    first = windows[("2025-11-20T10:00:00Z", "groundedness")]
    second = windows[("2025-11-20T10:05:00Z", "groundedness")]
    assert (first["yes"], first["no"], first["percentage"]) == (40, 0, 1.0)
    assert (second["yes"], second["no"], second["percentage"]) == (10, 10, 0.5)
    assert second["ci_low"] < 0.5 < second["ci_high"]
    assert second["window_end"] == "2025-11-20T10:10:00Z"


def test_malformed_lines_are_dead_lettered_with_line_number_and_reason(run_output: Path) -> None:
    dead = {d["position"]: d for d in rows(run_output / "dead_letter.jsonl")}
    assert sorted(dead) == [61, 62, 63, 64, 65, 66]
    assert "JSON" in dead[61]["reason"]
    assert "request" in dead[62]["reason"]
    assert "UTF-8" in dead[63]["reason"]
    assert "no event time" in dead[64]["reason"]
    assert "object" in dead[65]["reason"]
    assert "limit" in dead[66]["reason"]
    assert len(dead[66]["raw"]) <= 4096  # truncated, not 10 MB


def test_metrics_textfile_counts_match_the_outputs(run_output: Path) -> None:
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families((run_output / "metrics.prom").read_text())
        for s in f.samples
    }
    assert samples[("ragpulse_events_total", (("outcome", "accepted"),))] == 60
    assert samples[("ragpulse_events_total", (("outcome", "invalid"),))] == 6
    assert samples[("ragpulse_events_sampled_total", ())] == 60
    no = (
        "ragpulse_judge_verdicts_total",
        (("app", "help-bot"), ("judge", "groundedness"), ("model", "m1"), ("rating", "no"),
         ("version", "local")),
    )
    assert samples[no] == 10
    ratio = (
        "ragpulse_judge_pass_ratio",
        (("app", "help-bot"), ("judge", "groundedness"), ("model", "m1"), ("version", "local")),
    )
    assert samples[ratio] == 0.5  # the latest complete window
    n = (
        "ragpulse_judge_window_samples",
        (("app", "help-bot"), ("judge", "groundedness"), ("model", "m1"), ("version", "local")),
    )
    assert samples[n] == 20


def test_sampling_keeps_the_same_events_on_every_run(tmp_path: Path) -> None:
    src = events_file(tmp_path, [event(i) for i in range(200)])
    kept = []
    for attempt in range(2):
        out = judged(src, tmp_path / f"out{attempt}", "--judges", "safety", "--sample-rate", "0.3")
        kept.append(sorted(v["request_id"] for v in rows(out / "verdicts.jsonl")))
    assert kept[0] == kept[1]
    assert 40 < len(kept[0]) < 80


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--judges", "groundednes"], "groundednes"),
        (["--judge-backend", "openai"], "OPENAI_API_KEY"),
    ],
    ids=["unknown judge", "openai backend without endpoint or key"],
)
def test_judge_settings_that_cannot_work_are_a_clear_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    flags: list[str], named: str,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    src = events_file(tmp_path, [event(1)])
    code = main(["run", str(src), "--output", str(tmp_path / "o"), *flags])
    assert named in one_line_error(code, capsys.readouterr().err, allow_info=True)
