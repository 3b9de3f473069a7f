"""`ragpulse explain` on a real file run of the bundled sample events, and its input errors.

The failing verdicts it lists are checked against windows.jsonl, which the same run wrote from a
different branch of the pipeline: per window and judge, the `no` rows explain shows must be
exactly the window's `no` count. (The Kafka source is tested with a real serve in
test_explain_serve.py.)
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

import orjson
import pytest
from cli import one_line_error

from ragpulse.pipeline.cli import main as ragpulse
from ragpulse.pipeline.commands.run import run_file
from ragpulse.pipeline.settings.models import JudgeSettings, RunSettings
from ragpulse.pipeline.windows import isoformat_utc

SAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "samples" / "events.jsonl"


@pytest.fixture(scope="module")
def run_output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sample-run")
    run_file(RunSettings(input=SAMPLE, output=out, judges=JudgeSettings(backend="local")))
    return out


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = ragpulse(["explain", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def json_rows(text: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.slow
def test_failing_verdicts_of_each_window_match_the_windows_no_and_error_counts(
    run_output: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lines = (run_output / "windows.jsonl").read_bytes().splitlines()
    windows = [orjson.loads(line) for line in lines]
    expected: Counter[tuple[str, str, str]] = Counter()
    for w in windows:
        expected[(w["window_start"], w["judge"], "no")] += w["no"]
        expected[(w["window_start"], w["judge"], "error")] += w["error"]
    starts = sorted({w["window_start"] for w in windows})
    assert len(starts) == 10  # 40 minutes of 5-minute windows, and two of the late events
    for start in starts:
        code, out, err = explain(
            capsys, "--run-output", str(run_output), "--window-start", start, "--window", "5m",
            "--limit", "0", "--json",
        )
        assert code == 0, err
        shown = Counter((start, r["judge"], r["rating"]) for r in json_rows(out))
        assert +shown == +Counter({k: n for k, n in expected.items() if k[0] == start})
        assert f"{sum(shown.values())} failing verdicts" in err


@pytest.mark.slow
def test_the_groundedness_dip_shows_its_ungrounded_answers_with_rationales_newest_first(
    run_output: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = explain(
        capsys, "--run-output", str(run_output), "--since", "2025-01-15T09:15:00Z",
        "--until", "2025-01-15T09:25:00Z", "--judge", "groundedness", "--app", "hr-assistant",
        "--limit", "0", "--json",
    )
    assert code == 0
    rows = json_rows(out)
    assert len(rows) > 10
    assert {(r["judge"], r["rating"], r["app"]) for r in rows} == {
        ("groundedness", "no", "hr-assistant")
    }
    assert all(r["rationale"] for r in rows)
    times = [r["event_time"] for r in rows]
    assert times == sorted(times, reverse=True)
    assert times[-1] >= "2025-01-15T09:15:00Z" and times[0] < "2025-01-15T09:25:00Z"
    # The same request ids, as the verdicts file has them.
    source = {
        v["request_id"]
        for v in map(orjson.loads, (run_output / "verdicts.jsonl").read_bytes().splitlines())
        if v["app"] == "hr-assistant"
        and v["response/llm_judged/groundedness/rating"] == "no"
        and "2025-01-15T09:15:00Z" <= v["event_time"] < "2025-01-15T09:25:00Z"
    }
    assert {r["request_id"] for r in rows} == source


@pytest.mark.slow
def test_table_shows_whole_request_ids_and_cuts_the_rationale_to_the_terminal(
    run_output: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "150")
    code, out, _ = explain(
        capsys, "--run-output", str(run_output), "--window-start", "1736932500", "--window",
        "5m", "--limit", "5",
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["event_time", "request_id", "app", "model", "judge", "rating",
                                "rationale"]
    assert len(lines) == 1 + 5 + 1
    assert all(len(line) <= 150 for line in lines[1:6])
    assert any(line.endswith("…") for line in lines[1:6])
    ids = [line.split()[1] for line in lines[1:6]]
    assert all(len(i) == 36 for i in ids)  # uuids, uncut
    assert "the 5 most recent shown (--limit 0 for all)" in lines[-1]


def test_control_characters_in_a_rationale_cannot_reach_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    row = {
        "request_id": "r1",
        "event_time": "2025-01-15T09:00:00Z",
        "app": "bot",
        "model": "m",
        "response/llm_judged/groundedness/rating": "no",
        "response/llm_judged/groundedness/rationale": "The claim '\x1b[2J\x1b[31mboom\rX\nY' ...",
        "response/llm_judged/groundedness/error_message": None,
    }
    (tmp_path / "verdicts.jsonl").write_bytes(orjson.dumps(row) + b"\n")
    code, out, _ = explain(capsys, "--run-output", str(tmp_path))
    assert code == 0
    assert "\x1b" not in out and "\r" not in out
    assert "[31mboom X Y" in out.splitlines()[1]


def test_rows_that_are_not_verdict_rows_are_skipped_with_a_warning_naming_the_line(
    tmp_path: Path, run_output: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    shutil.copy(run_output / "verdicts.jsonl", out_dir / "verdicts.jsonl")
    with (out_dir / "verdicts.jsonl").open("ab") as f:
        f.write(b'{"truncated": \n[1, 2]\n')
    code, out, err = explain(capsys, "--run-output", str(out_dir), "--json", "--limit", "0")
    lines = (out_dir / "verdicts.jsonl").read_bytes().splitlines()
    assert code == 0
    assert f"verdicts.jsonl:{len(lines) - 1}: not a verdict row" in err
    assert f"verdicts.jsonl:{len(lines)}: not a verdict row" in err
    assert len(json_rows(out)) > 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give one source: --run-output DIR, or --kafka-bootstrap with --topic"),
        (["--run-output", "x", "--kafka-bootstrap", "h:1", "--topic", "t"], "give one source"),
        (["--kafka-bootstrap", "h:1"], "--kafka-bootstrap needs --topic TOPIC or --verdicts-topic"),
        (["--run-output", "x", "--topic", "t"], "--topic and --verdicts-topic go with --kafka"),
        (["--run-output", "x", "--since", "yesterday"],
         "--since 'yesterday' is neither ISO 8601 nor epoch seconds"),
        (["--run-output", "x", "--window-start", "2025-01-15T09:00:00Z"],
         "--window-start needs --window DURATION"),
        (["--run-output", "x", "--window", "5m", "--since", "0"],
         "give --window-start/--window or --since/--until, not both"),
        (["--run-output", "x", "--since", "100", "--until", "50"], "--until 50 is not after"),
        (["--run-output", "x", "--limit", "-1"], "--limit must be 0 (all) or more"),
    ],
)
def test_bad_arguments_get_a_one_line_error_and_exit_code_2(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    code, out, err = explain(capsys, *args)
    line = one_line_error(code, err)
    assert out == ""
    assert line.startswith("ragpulse explain: ") and message in line


def test_an_output_directory_without_verdicts_is_named_in_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = explain(capsys, "--run-output", str(tmp_path))
    assert code == 1
    assert err.strip() == (
        f"ragpulse explain: no verdicts.jsonl in {tmp_path}: is it the --output directory of "
        "`ragpulse run`?"
    )
    code, _, err = explain(capsys, "--run-output", str(tmp_path / "missing"))
    assert (code, err.strip()) == (
        1, f"ragpulse explain: --run-output {tmp_path / 'missing'} is not a directory"
    )


def test_window_alone_means_the_last_duration_up_to_now(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    now = time.time()
    rows = [
        {
            "request_id": request_id,
            "event_time": isoformat_utc(now - age),
            "app": "bot",
            "model": "m",
            "response/llm_judged/safety/rating": "no",
            "response/llm_judged/safety/rationale": "unsafe",
            "response/llm_judged/safety/error_message": None,
        }
        for request_id, age in (("recent", 30.0), ("two-hours-ago", 7200.0))
    ]
    (tmp_path / "verdicts.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in rows) + b"\n")
    code, out, _ = explain(capsys, "--run-output", str(tmp_path), "--window", "1h", "--json")
    assert code == 0
    assert [r["request_id"] for r in json_rows(out)] == ["recent"]
