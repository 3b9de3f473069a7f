"""Settings are validated at start-up, with messages that say what to fix."""

import argparse
import logging
import shutil
from pathlib import Path

import pytest
import yaml

from judges import JudgeSpec
from judges.llm import LLMJudge
from pipeline.config import SettingsError, add_judge_arguments, judge_settings

SHIPPED = Path(__file__).resolve().parents[1] / "judges" / "prompts"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_judge_arguments(parser)
    return parser.parse_args(list(argv))


def test_backend_defaults_to_local_without_endpoint_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO):
        settings = judge_settings(parse(), env={})
    assert settings.backend == "local"
    assert "judge backend: local" in caplog.text


def test_backend_defaults_to_openai_when_a_key_is_set_and_the_key_is_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG):
        settings = judge_settings(parse(), env={"OPENAI_API_KEY": "sk-secret-123"})
    assert settings.backend == "openai"
    assert "sk-secret-123" not in caplog.text
    assert "sk-secret-123" not in repr(settings) and "sk-secret-123" not in repr(settings.spec())


def test_a_concurrency_of_zero_is_refused_naming_the_setting() -> None:
    with pytest.raises(SettingsError, match="concurrency"):
        judge_settings(parse("--judge-concurrency", "0"), env={})


def test_a_prompts_folder_missing_a_judge_file_is_refused_at_start_up(tmp_path: Path) -> None:
    shutil.copy(SHIPPED / "safety.yaml", tmp_path)
    with pytest.raises(SettingsError, match=r"groundedness\.yaml"):
        judge_settings(parse("--judge-prompts", str(tmp_path)), env={})


def test_prompts_from_a_folder_replace_the_shipped_ones(tmp_path: Path) -> None:
    for path in SHIPPED.glob("*.yaml"):
        data = yaml.safe_load(path.read_text())
        data["version"] = 907
        (tmp_path / path.name).write_text(yaml.safe_dump(data))
    settings = judge_settings(
        parse("--judge-prompts", str(tmp_path), "--judge-base-url", "http://127.0.0.1:9/v1"),
        env={},
    )
    panel = settings.spec().build()
    try:
        versions = {j.prompt.version for j in panel.judges if isinstance(j, LLMJudge)}
    finally:
        panel.close()
    assert versions == {907}


def test_judge_spec_refuses_an_unknown_judge_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match="known judges: groundedness, safety"):
        JudgeSpec(names=("groundedness", "tone"))
