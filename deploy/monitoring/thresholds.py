"""Read deploy/prometheus/thresholds.yml: the one place for alert thresholds, windows and SLOs.

For the renderer (render.py) and its tests: the rules and the dashboards both start from the
mapping ``load_thresholds`` returns, so a floor drawn on a panel is the floor an alert uses.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_THRESHOLDS = REPO / "deploy" / "prometheus" / "thresholds.yml"


def parse_override(item: str) -> tuple[list[str], Any]:
    """Split ``a.b.c=value`` into a key path and a YAML-typed value (``0.9`` -> float)."""
    if "=" not in item:
        raise ValueError(f"override {item!r} must look like dotted.key=value")
    key, raw = item.split("=", 1)
    path = [part for part in key.strip().split(".") if part]
    if not path:
        raise ValueError(f"override {item!r} has an empty key")
    return path, yaml.safe_load(raw) if raw.strip() else ""


def apply_overrides(config: Mapping[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Return a copy of ``config`` with each ``dotted.key=value`` override applied.

    Unknown keys are rejected, so a typo cannot silently leave the default in place.
    """
    result: dict[str, Any] = copy.deepcopy(dict(config))
    for item in overrides:
        path, value = parse_override(item)
        node: Any = result
        for part in path[:-1]:
            if not isinstance(node, dict) or part not in node:
                raise KeyError(f"override {item!r}: no key {part!r} in thresholds")
            node = node[part]
        if not isinstance(node, dict) or path[-1] not in node:
            raise KeyError(f"override {item!r}: no key {path[-1]!r} in thresholds")
        node[path[-1]] = value
    return result


def wilson_bounds(passed: float, judged: float, z: float) -> tuple[float, float]:
    """The Wilson score interval of passed/judged; the recording rules compute the same."""
    p, z2 = passed / judged, z * z
    centre = (p + z2 / (2 * judged)) / (1 + z2 / judged)
    half = z * math.sqrt(p * (1 - p) / judged + z2 / (4 * judged**2)) / (1 + z2 / judged)
    return centre - half, centre + half


def check_thresholds(config: Mapping[str, Any]) -> None:
    """Reject settings under which the warnings would fire on healthy traffic.

    The slow path warns when the LOWER Wilson bound is under the floor; on too few answers that
    bound is low even for a series at its SLO objective, so its minimum sample must be large
    enough for such a series to stay quiet.
    """
    z = float(config["confidence_z"])
    for judge, spec in config["quality_alerts"].items():
        objective = config["slo"]["objectives"].get(judge)
        n = int(spec["slow"]["min_samples"])
        if objective is None:
            continue
        low, _ = wilson_bounds(float(objective) * n, n, z)
        if low < float(spec["floor"]):
            raise ValueError(
                f"quality_alerts.{judge}.slow.min_samples={n} is too small: a series at its "
                f"objective {objective:g} has a lower bound of {low:.3f} on {n} answers, "
                f"under the floor {spec['floor']:g}, so healthy traffic would warn"
            )


def load_thresholds(
    path: Path = DEFAULT_THRESHOLDS, overrides: Iterable[str] = ()
) -> dict[str, Any]:
    """Read thresholds.yml, apply ``dotted.key=value`` overrides and check the result."""
    with path.open(encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    config = apply_overrides(config, overrides)
    check_thresholds(config)
    return config
