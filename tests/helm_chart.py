"""The ragpulse Helm chart (deploy/helm/ragpulse) rendered and linted by the real Helm, the one
`make helm` builds from helm.sh/helm/v3 (tests/pinned_tools.py)."""

from __future__ import annotations

import json
import subprocess
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pinned_tools import REPO, helm

CHART = REPO / "deploy" / "helm" / "ragpulse"
RELEASE, NAMESPACE = "ragpulse", "monitoring"


def _helm(*args: str, values: dict[str, Any] | None) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as tmp:
        files: list[str] = []
        if values:
            path = Path(tmp) / "values.yaml"
            path.write_text(yaml.safe_dump(values), encoding="utf-8")
            files = ["--values", str(path)]
        return subprocess.run([str(helm()), *args, *files], capture_output=True, text=True,
                              check=False, timeout=120)


@lru_cache(maxsize=64)
def _rendered(values_json: str) -> str:
    done = _helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                 values=json.loads(values_json))
    assert done.returncode == 0, f"helm template failed: {done.stderr}"
    return done.stdout


def template_text(values: dict[str, Any] | None = None) -> str:
    """`helm template` output for these values over the chart's values.yaml."""
    return _rendered(json.dumps(values or {}, sort_keys=True))


def manifests(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rendered objects (fresh copies: a test may change them)."""
    return [doc for doc in yaml.safe_load_all(template_text(values)) if doc]


def lint(values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """`helm lint --strict` (warnings fail too) for these values."""
    return _helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, values=values)
