"""Settings from a YAML config file and the environment, under the flags (`--config`,
`RAGPULSE_<FLAG>`, `--print-config`), through the real `ragpulse` command line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragpulse.pipeline import cli

SAMPLES = Path(__file__).resolve().parents[1] / "deploy" / "samples" / "events.jsonl"
UNREACHABLE = "127.0.0.1:1"  # nothing listens there: --print-config must not connect


def printed(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, object]:
    """The settings `--print-config` prints, as a mapping."""
    assert cli.main([*argv, "--print-config"]) == 0
    out = capsys.readouterr().out
    data = yaml.safe_load(out)
    assert isinstance(data, dict)
    return data


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "ragpulse.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_flags_override_the_environment_which_overrides_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write(
        tmp_path,
        f"kafka-bootstrap: {UNREACHABLE}\ntopic: from-file\nwindow: 1m\nsample-rate: 0.25\n"
        "judges: [groundedness, safety]\nallowed-lateness: 90s\nstate-reset: true\n",
    )
    monkeypatch.setenv("RAGPULSE_SAMPLE_RATE", "0.5")
    monkeypatch.setenv("RAGPULSE_WINDOW", "2m")
    got = printed(capsys, "serve", "--config", str(config), "--window", "10m")
    assert got["window"] == "10m"  # the flag
    assert got["sample-rate"] == 0.5  # the environment
    assert got["topic"] == "from-file" and got["allowed-lateness"] == "90s"  # the file
    assert got["judges"] == "groundedness,safety"
    assert got["state-reset"] is True
    assert got["trigger-interval"] == "15s"  # the settings model's default


def test_printed_settings_are_a_config_file_that_gives_the_same_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = printed(
        capsys, "serve", "--kafka-bootstrap", UNREACHABLE, "--topic", "t",
        "--redact-pattern", "ACME-[0-9]+", "--allowed-apps", "b,a", "--out-of-orderness", "250ms",
    )
    again = printed(capsys, "serve", "--config", str(write(tmp_path, yaml.safe_dump(first))))
    assert again == first
    assert first["redact-pattern"] == ["ACME-[0-9]+"] and first["allowed-apps"] == "a,b"


def test_required_flags_may_come_from_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGPULSE_KAFKA_BOOTSTRAP", UNREACHABLE)
    monkeypatch.setenv("RAGPULSE_TOPIC", "from-env")
    assert printed(capsys, "serve")["topic"] == "from-env"


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        ("windw: 5m\n", {}, "config {path}: 1 unknown key(s) 'windw'"),
        ("window: 5 minutes\n", {}, "config {path}: window: (value not shown) is not a duration"),
        ("sample-rate: 2\n", {}, "config {path}: sample-rate: must be within [0, 1]"),
        ("publish-verdicts: some\n", {}, "config {path}: publish-verdicts: must be one of"),
        ("- a\n- b\n", {}, "config {path}: must be a mapping of flag names to values"),
        ("window: [1m\n", {}, "config {path}: not valid YAML"),
        ("", {"RAGPULSE_STATE_RESET": "maybe"}, "environment RAGPULSE_STATE_RESET: must be true"),
        ("", {"RAGPULSE_KAFKA_BOOTSTRAP": ""}, "missing --kafka-bootstrap"),
        ("judge-concurrency: 0\n", {}, "--judge-concurrency:"),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_it_and_exit_code_2(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    env: dict[str, str],
    message: str,
) -> None:
    path = write(tmp_path, text)
    monkeypatch.setenv("RAGPULSE_TOPIC", "t")
    if "RAGPULSE_KAFKA_BOOTSTRAP" not in env:
        monkeypatch.setenv("RAGPULSE_KAFKA_BOOTSTRAP", UNREACHABLE)
    for name, value in env.items():
        if value:
            monkeypatch.setenv(name, value)
        else:
            monkeypatch.delenv(name, raising=False)
    assert cli.main(["serve", "--config", str(path), "--print-config"]) == 2
    err = capsys.readouterr().err
    # Log lines (the judge backend chosen) may come first; the error is one line of its own.
    errors = [line for line in err.splitlines() if line.startswith("ragpulse serve: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert message.format(path=path) in errors[0]


def test_a_missing_config_file_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", str(SAMPLES), "--config", "/nonexistent/ragpulse.yaml"]) == 2
    assert "config /nonexistent/ragpulse.yaml: cannot read it" in capsys.readouterr().err


@pytest.mark.slow
def test_ragpulse_run_takes_its_settings_from_the_file_named_by_ragpulse_config(
    tmp_path: Path,
) -> None:
    out = tmp_path / "out"
    config = write(tmp_path, f"output: {out}\njudges: safety\nwindow: 1h\n")
    done = subprocess.run(
        [sys.executable, "-m", "ragpulse.pipeline.cli", "run", str(SAMPLES)],
        env={**os.environ, "RAGPULSE_CONFIG": str(config)},
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = [yaml.safe_load(line) for line in (out / "windows.jsonl").read_text().splitlines()]
    assert {r["judge"] for r in rows} == {"safety"}
    assert all(r["window_end"] != r["window_start"] for r in rows)
    assert {r["window_start"][14:] for r in rows} == {"00:00Z"}  # hourly windows
