"""Settings are validated at start-up, with messages that say what to fix."""

import argparse
import dataclasses
import logging
import re
import shutil
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from ragpulse.judges.llm.judge import LLMJudge
from ragpulse.pipeline import cli
from ragpulse.pipeline.cli import _subparser, build_parser
from ragpulse.pipeline.settings.command_flags import (
    JUDGES,
    SERVE,
    add_judge_arguments,
    judge_settings,
)
from ragpulse.pipeline.settings.models import (
    JudgeSettings,
    ServeSettings,
    SettingsError,
    setting_flag,
)

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
        dataclasses.replace(JudgeSettings(backend="local").spec(), names=("groundedness", "tone"))


def test_endpoint_reliability_flags_reach_the_spec_with_their_defaults() -> None:
    defaults = judge_settings(parse(), env={}).spec()
    assert (defaults.reply_format, defaults.max_tokens) == ("json_schema", 256)
    assert (defaults.breaker_failures, defaults.breaker_cooldown_seconds) == (5, 30.0)
    assert defaults.batch_deadline_seconds == 120.0
    assert (defaults.rpm, defaults.tpm) == (None, None)
    spec = judge_settings(
        parse(
            "--judge-reply-format", "text", "--judge-max-tokens", "64",
            "--judge-breaker-failures", "0", "--judge-breaker-cooldown", "2m",
            "--judge-batch-deadline", "45s", "--judge-rpm", "500", "--judge-tpm", "200000",
        ),
        env={},
    ).spec()
    assert (spec.reply_format, spec.max_tokens, spec.breaker_failures) == ("text", 64, 0)
    assert (spec.breaker_cooldown_seconds, spec.batch_deadline_seconds) == (120.0, 45.0)
    assert (spec.rpm, spec.tpm) == (500, 200000)


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--judge-max-tokens", "0"),
        ("--judge-rpm", "0"),
        ("--judge-tpm", "-5"),
        ("--judge-breaker-failures", "-1"),
    ],
)
def test_out_of_range_endpoint_limits_are_refused_naming_the_flag(flag: str, value: str) -> None:
    with pytest.raises(SettingsError, match=f"invalid settings: {flag}: "):
        judge_settings(parse(flag, value), env={})


def test_an_unknown_reply_format_is_refused_listing_the_ones_servers_take(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        parse("--judge-reply-format", "xml")
    assert "json_schema, json_object, text" in capsys.readouterr().err.replace("'", "")


def _serve_flags() -> set[str]:
    parser = _subparser(build_parser(), "serve")
    return set(re.findall(r"--[a-z][a-z0-9-]*", parser.format_help()))


@pytest.mark.parametrize("model", [JudgeSettings, ServeSettings])
def test_every_setting_an_error_can_name_is_a_flag_of_serve_or_an_environment_variable(
    model: type[BaseModel],
) -> None:
    flags = _serve_flags()
    names = SERVE.flag_names() if model is ServeSettings else JUDGES.flag_names()
    composite = {"judges", "kafka_security", "labels"}  # built from flags checked on their own
    for field in set(model.model_fields) - composite:
        named = setting_flag(model, field, names)
        flags_named = set(re.findall(r"--[a-z][a-z0-9-]*", named))
        assert flags_named <= flags, (field, named)
        assert flags_named or re.fullmatch(r"[A-Z_]+", named), (field, named)


def test_an_invalid_judge_setting_is_named_by_the_flag_that_sets_it() -> None:
    with pytest.raises(SettingsError) as refused:
        judge_settings(parse("--judge-concurrency", "0", "--judges", "safety,tone"), env={})
    message = str(refused.value)
    assert message.startswith("invalid settings: ")
    assert "--judge-concurrency: Input should be greater than or equal to 1" in message
    assert "--judges: unknown judge name(s) at position 2 of 2; known judges: " in message
    assert "tone" not in message  # a value is never shown: it may be a misplaced secret
    assert "concurrency:" not in message.replace("--judge-concurrency:", "")
    assert "Value error" not in message


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "/nonexistent/events.jsonl"],
         "ragpulse run: invalid settings: INPUT: input file not found: /nonexistent/events.jsonl"),
        (["calibrate", "/nonexistent/labels.jsonl", "--judge", "groundedness"],
         "ragpulse calibrate: invalid settings: LABELLED: labelled file not found: "
         "/nonexistent/labels.jsonl"),
    ],
)
def test_a_missing_input_file_is_refused_naming_the_argument_and_the_file(
    argv: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main([*argv, "--judge-backend", "local"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == said
