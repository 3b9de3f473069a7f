"""The judge registry is the one list of judges: the CLI, the settings, the canaries, the local
factory and the LLM prompt lookup all follow it, and a bad `--judges` is a one-line usage error."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ragpulse import judges
from ragpulse.judges import JUDGES, Backend, Chunk, JudgeEntry, JudgeInput, check_judge_names
from ragpulse.judges.llm.judge import available_prompts, load_prompt
from ragpulse.judges.local.judge import build_local_judges
from ragpulse.judges.registry import SESSION_JUDGES
from ragpulse.pipeline.settings.command_flags import add_judge_arguments, judge_settings
from ragpulse.pipeline.settings.models import JudgeSettings, SettingsError

SAMPLE = Path(__file__).resolve().parents[1] / "deploy" / "samples" / "events.jsonl"
PROMPTS = Path(judges.__file__).parent / "prompts"


def ragpulse(*args: str) -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).with_name("ragpulse")
    prog = [str(script)] if script.is_file() else [sys.executable, "-m", "ragpulse.pipeline.cli"]
    return subprocess.run(
        [*prog, *args], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize(
    ("judges_flag", "says"),
    [
        ("safety,safety", "safety listed more than once"),
        ("safety,tone", "unknown judge name(s) at position 2 of 2; known judges: groundedness"),
        (" , ", "no judge given; known judges: groundedness, safety"),
    ],
)
def test_run_refuses_a_repeated_unknown_or_missing_judge_with_one_line_and_exit_2(
    tmp_path: Path, judges_flag: str, says: str
) -> None:
    done = ragpulse(
        "--log-level", "WARNING", "run", str(SAMPLE), "--output", str(tmp_path / "out"),
        "--judges", judges_flag,
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("ragpulse run: ") and says in line
    assert not (tmp_path / "out").exists()


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    return parser.parse_args(list(argv))


def test_judge_settings_refuse_repeated_judges_as_a_settings_error() -> None:
    with pytest.raises(SettingsError, match="groundedness listed more than once"):
        judge_settings(parse("--judges", "groundedness,safety,groundedness"), env={})


def test_the_judges_flag_help_lists_every_registered_judge_with_its_backends() -> None:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    text = " ".join(parser.format_help().split())
    for name, entry in JUDGES.items():
        backends = "any backend, no model" if entry.deterministic else ", ".join(entry.backends)
        assert f"{name} ({backends})" in text


def test_a_judge_that_needs_no_model_is_accepted_on_every_backend() -> None:
    assert JUDGES["document_recall"].backends == ("local", "openai")
    for backend in ("local", "openai"):
        check_judge_names(("groundedness", "document_recall"), backend)


def test_every_registered_prompt_file_is_shipped_and_every_shipped_one_is_registered() -> None:
    entries = [*JUDGES.values(), *SESSION_JUDGES.values()]
    named = {entry.prompt for entry in entries if entry.prompt is not None}
    assert named == {p.name for p in PROMPTS.glob("*.yaml")}
    for name in (*available_prompts(), *SESSION_JUDGES):
        assert load_prompt(name).name == name


def test_every_registered_local_judge_builds_under_its_own_name() -> None:
    local = [name for name, entry in JUDGES.items() if "local" in entry.backends]
    assert [j.name for j in build_local_judges(local)] == local


@pytest.mark.parametrize("backend", ["local", "openai"])
@pytest.mark.parametrize("chunks", [(), (Chunk(" \n"), Chunk(""))], ids=["none", "blank"])
def test_an_event_without_retrieved_text_is_ungrounded_on_either_backend(
    backend: Backend, chunks: tuple[Chunk, ...]
) -> None:
    # The LLM judge decides this before calling the endpoint, so no server is needed.
    spec = JudgeSettings(
        names=("groundedness",), backend=backend, base_url="http://127.0.0.1:9/v1"
    ).spec()
    panel = spec.build()
    try:
        ((verdict,),) = panel.judge_batch([JudgeInput("How tall is it?", "It is 330 m.", chunks)])
    finally:
        panel.close()
    assert (verdict.rating, verdict.rationale) == (
        "no",
        "no retrieved context to support the answer",
    )


def test_a_prompt_that_does_not_show_what_its_judge_requires_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load((PROMPTS / "groundedness.yaml").read_text())
    data["inputs"] = ["question", "answer"]
    (tmp_path / "groundedness.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="does not show chunks, which groundedness requires"):
        load_prompt("groundedness", tmp_path)


def test_a_judge_added_to_the_registry_is_accepted_and_refused_on_a_backend_it_lacks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entry = JudgeEntry("tone", prompt="tone.yaml")
    monkeypatch.setitem(JUDGES, "tone", entry)
    assert entry.backends == ("openai",)
    check_judge_names(("safety", "tone"), "openai")
    with pytest.raises(ValueError, match="tone have no local implementation; judges on local: "):
        check_judge_names(("safety", "tone"), "local")
    with pytest.raises(SettingsError, match="tone have no local implementation"):
        judge_settings(parse("--judges", "tone", "--judge-backend", "local"), env={})


def test_a_prompt_file_still_saying_what_its_judge_requires_is_refused_saying_why(
    tmp_path: Path,
) -> None:
    data = yaml.safe_load((PROMPTS / "groundedness.yaml").read_text())
    data["requires"] = ["chunks"]
    (tmp_path / "groundedness.yaml").write_text(yaml.safe_dump(data))
    with pytest.raises(ValueError, match="'requires' is no longer read from prompt files"):
        load_prompt("groundedness", tmp_path)
