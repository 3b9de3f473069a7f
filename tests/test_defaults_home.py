"""Each setting's default has one home, pipeline/settings/models.py; the other places that
repeat one (the judge endpoint's signature, the Helm chart's values, every flag table of the
docs with a default column, the plain Kubernetes manifest's arguments and ports) are checked
against it here, so changing a default in one place and not the others fails. (The judges
package cannot import the settings, a layer above it: the endpoint's literal defaults are
checked, not derived.)"""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from ragpulse.judges.endpoint.client import OpenAIJudgeEndpoint
from ragpulse.pipeline.cli import _subparser, build_parser
from ragpulse.pipeline.settings.flags import duration
from ragpulse.pipeline.settings.models import EventSettings, JudgeSettings, ServeSettings

ROOT = Path(__file__).resolve().parents[1]
VALUES = yaml.safe_load((ROOT / "deploy/helm/ragpulse/values.yaml").read_text())


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


def _flags() -> dict[str, argparse.Action]:
    """Every flag of the commands the docs' tables describe, as its parser takes it (its
    default comes from the settings model: pipeline/settings/flags.py)."""
    parser = build_parser()
    found: dict[str, argparse.Action] = {}
    for command in ("serve", "run", "stream", "review"):
        for action in _subparser(parser, command)._actions:
            for option in action.option_strings:
                found.setdefault(option, action)
    return found


FLAGS = _flags()
# What the docs write for a flag without a value by default.
NO_VALUE: dict[str, tuple[Any, ...]] = {
    "none": (None, []), "no limit": (None,), "off": (False, None),
}


def _as_parsed(action: argparse.Action, text: Any) -> Any:
    return action.type(text) if isinstance(text, str) and callable(action.type) else text


def _documented_defaults() -> list[tuple[str, str, str]]:
    """(doc, flag, default as written) for every row of a docs table with a default column:
    `| `--flag ...` | default | meaning |`; a row of several flags gives each its default."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        if "| flag | default |" not in doc.read_text():
            continue  # no flag table (figures.md's tables are results)
        for flags, default in re.findall(
            r"^\| (`--(?:[^|\\]|\\\|)+?)\s*\| ((?:[^|\\]|\\\|)+?) \|", doc.read_text(), re.M
        ):
            names = re.findall(r"`(--[a-z0-9-]+)", flags)
            texts = [t.strip(" `") for t in default.split(",")] if len(names) > 1 else [
                default.strip(" `")
            ]
            if len(texts) == len(names):
                found += [(doc.name, n, t) for n, t in zip(names, texts, strict=True)]
    return found


DOCUMENTED_DEFAULTS = _documented_defaults()


def test_the_docs_flag_tables_are_found() -> None:
    assert len(DOCUMENTED_DEFAULTS) >= 25


@pytest.mark.parametrize(("doc", "flag", "text"), DOCUMENTED_DEFAULTS,
                         ids=[f"{d}:{f}" for d, f, _ in DOCUMENTED_DEFAULTS])
def test_each_default_a_docs_table_writes_as_a_value_equals_the_flags(
    doc: str, flag: str, text: str
) -> None:
    """A default written as a value (16, 30s, gpt-4o-mini, none, off) must be the flag's; one
    written as a sentence (`$OPENAI_BASE_URL`, else api.openai.com) is a description."""
    action = FLAGS.get(flag)
    assert action is not None, f"{doc} documents {flag}, which no command takes"
    default = _as_parsed(action, action.default)
    if text in NO_VALUE:
        assert default in NO_VALUE[text], f"{doc}: {flag} says {text!r}, the flag {default!r}"
        return
    if re.search(r"\s|\$|[A-Z]{3,}", text):
        return  # a description, or a name made from another flag's (TOPIC.review)
    written = _as_parsed(action, text)
    assert written == default, f"{doc}: {flag} says {text!r}, the flag's default is {default!r}"


KUBERNETES = (ROOT / "deploy/kubernetes/deployment.yaml").read_text()
# The manifest's arguments that are choices of that deployment, not the defaults restated.
CHOSEN = {"--kafka-bootstrap", "--topic", "--metrics-host", "--state", "--judge-backend"}


def _kubernetes_args() -> list[tuple[str, str]]:
    [container] = yaml.safe_load(KUBERNETES)["spec"]["template"]["spec"]["containers"]
    return [tuple(a.split("=", 1)) for a in container["args"] if a.startswith("--")]


@pytest.mark.parametrize(("flag", "text"), _kubernetes_args())
def test_each_argument_of_the_kubernetes_manifest_is_a_choice_or_the_default(
    flag: str, text: str
) -> None:
    if flag in CHOSEN:
        return
    action = FLAGS[flag]
    assert _as_parsed(action, text) == _as_parsed(action, action.default), (
        f"deploy/kubernetes/deployment.yaml passes {flag}={text}, the default is "
        f"{action.default!r}: change both, or add it to CHOSEN with why"
    )


def test_the_kubernetes_container_ports_are_the_ports_serve_listens_on() -> None:
    [container] = yaml.safe_load(KUBERNETES)["spec"]["template"]["spec"]["containers"]
    args = dict(_kubernetes_args())
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"metrics": int(args["--metrics-port"]), "health": int(args["--health-port"])}
    assert int(VALUES["service"]["healthPort"]) == model_default(ServeSettings, "health_port")
