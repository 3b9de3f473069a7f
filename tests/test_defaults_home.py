"""Each setting's default has one home, pipeline/settings/models.py; the other places that
repeat one (the judge endpoint's signature, the Helm chart's values, docs/configuration.md) are
checked against it here, so changing a default in one place and not the others fails."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.pipeline.settings.flags import duration
from ragpulse.pipeline.settings.models import EventSettings, JudgeSettings, ServeSettings

ROOT = Path(__file__).resolve().parents[1]
VALUES = yaml.safe_load((ROOT / "deploy/helm/ragpulse/values.yaml").read_text())
CONFIGURATION_DOC = (ROOT / "docs/configuration.md").read_text()


def model_default(model: Any, field: str) -> Any:
    return model.model_fields[field].default


def test_the_judge_endpoint_takes_its_defaults_from_the_judge_settings() -> None:
    shared = [
        (name, p.default)
        for name, p in inspect.signature(OpenAIJudgeEndpoint.__init__).parameters.items()
        if name in JudgeSettings.model_fields and p.default is not inspect.Parameter.empty
    ]
    assert len(shared) >= 8
    assert [(n, d) for n, d in shared if d != model_default(JudgeSettings, n)] == []


# Helm value (block, key) -> (settings model, field, how the chart writes it).
HELM: list[tuple[str, str, Any, str, Any]] = [
    ("judges", "model", JudgeSettings, "model", str),
    ("judges", "concurrency", JudgeSettings, "concurrency", int),
    ("judges", "timeout", JudgeSettings, "timeout_seconds", duration),
    ("judges", "maxRetries", JudgeSettings, "max_retries", int),
    ("judges", "temperature", JudgeSettings, "temperature", float),
    ("windows", "sampleRate", EventSettings, "sample_rate", float),
    ("windows", "window", EventSettings, "window_seconds", duration),
    ("windows", "maxEventBytes", EventSettings, "max_event_bytes", int),
    ("windows", "allowedLateness", ServeSettings, "allowed_lateness_seconds", duration),
    ("windows", "outOfOrderness", ServeSettings, "out_of_orderness_seconds", duration),
    ("windows", "triggerInterval", ServeSettings, "trigger_interval_seconds", duration),
    ("service", "metricsPort", ServeSettings, "metrics_port", int),
    ("service", "unhealthyAfter", ServeSettings, "unhealthy_after_seconds", duration),
    ("service", "retention", ServeSettings, "retention_seconds", duration),
]


@pytest.mark.parametrize(("block", "key", "model", "field", "read"), HELM,
                         ids=[f"{b}.{k}" for b, k, *_ in HELM])
def test_each_helm_value_that_repeats_a_default_equals_it(
    block: str, key: str, model: Any, field: str, read: Any
) -> None:
    assert read(str(VALUES[block][key])) == model_default(model, field)


# Flag -> (settings model, field): defaults written in docs/configuration.md's flag table.
DOCUMENTED: dict[str, tuple[Any, str, Any]] = {
    "--judge-concurrency": (JudgeSettings, "concurrency", int),
    "--judge-model": (JudgeSettings, "model", str),
    "--judge-max-retries": (JudgeSettings, "max_retries", int),
    "--judge-timeout": (JudgeSettings, "timeout_seconds", duration),
    "--judge-temperature": (JudgeSettings, "temperature", float),
}


@pytest.mark.parametrize("flag", sorted(DOCUMENTED))
def test_each_default_in_the_configuration_doc_equals_the_settings_default(flag: str) -> None:
    model, field, read = DOCUMENTED[flag]
    row = re.search(rf"^\| `{flag}[ `][^|]*\| `?([^|`]+?)`? \|", CONFIGURATION_DOC, re.MULTILINE)
    assert row is not None, f"{flag} has no row with a default in docs/configuration.md"
    assert read(row.group(1).strip()) == model_default(model, field)
