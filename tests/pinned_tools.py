"""Where the pinned tools that `make tools` builds live: the tests run exactly those binaries.

The versions are read from the Makefile (one place to bump them), the cache folder is
$RAGPULSE_CACHE or .cache/ at the repo root, as in the Makefile. A missing tool fails the test
with the make target that builds it (never a skip: `make test` builds every tool first)."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    configured = os.environ.get("RAGPULSE_CACHE") or ""
    return Path(configured).resolve() if configured else REPO / ".cache"


def makefile_pin(variable: str) -> str:
    """The value of `VARIABLE := value` in the Makefile."""
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    found = re.search(rf"^{re.escape(variable)} := (\S+)$", text, re.MULTILINE)
    assert found, f"Makefile has no {variable} := ..."
    return found.group(1)


def _built(path: Path, target: str) -> Path:
    if not os.access(path, os.X_OK):
        pytest.fail(f"{path} is missing: run `make {target}` (make test builds it first)",
                    pytrace=False)
    return path


def helm() -> Path:
    return _built(cache_dir() / "helm" / makefile_pin("HELM_VERSION") / "helm", "helm")


OTELCOL_MANIFEST = REPO / "deploy" / "otel-collector" / "builder-config.yaml"


def otelcol() -> Path:
    """The Collector built from deploy/otel-collector/builder-config.yaml (folder: its hash)."""
    digest = hashlib.sha256(OTELCOL_MANIFEST.read_bytes()).hexdigest()[:16]
    return _built(cache_dir() / "otelcol" / digest / "build" / "ragpulse-otelcol", "otelcol")
