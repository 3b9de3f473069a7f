"""Extract every PromQL query of a Grafana dashboard, template variables substituted.

For test authors who run the dashboards' queries against a real Prometheus::

    from dashboard_queries import grafana_panel_queries
    for title, expr in grafana_panel_queries(path, {"app": "shop", "model": "m1",
                                                     "judge": "groundedness"}):
        prom.query(expr)

Grafana's built-in interval variables get fixed defaults (BUILTIN_VARIABLES), which callers
may override (e.g. ``{"__rate_interval": "20s"}`` for a fast test scrape interval).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

BUILTIN_VARIABLES: dict[str, str] = {
    "__rate_interval": "1m",
    "__interval": "30s",
    "__range": "1h",
    "__range_s": "3600",
    "__interval_ms": "30000",
    # The time range in epoch ms (text panels format them, e.g. ${__from:date:seconds}).
    "__from": "1763632800000",
    "__to": "1763654400000",
}

# $name, ${name}, ${name:format[:arg]} and the deprecated [[name]].
VARIABLE_PATTERN = re.compile(
    r"\$\{(?P<braced>\w+)(?::[^}]*)?\}|\[\[(?P<bracketed>\w+)\]\]|\$(?P<plain>\w+)"
)


def load_dashboard(path: Path | str) -> dict[str, Any]:
    """The dashboard JSON as a dict."""
    with Path(path).open(encoding="utf-8") as handle:
        dashboard: dict[str, Any] = json.load(handle)
    return dashboard


def iter_panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, including panels nested in collapsed rows; row panels themselves too."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def variables_used(text: str) -> set[str]:
    """Names of the template variables referenced in ``text``."""
    return {
        m.group("braced") or m.group("bracketed") or m.group("plain")
        for m in VARIABLE_PATTERN.finditer(text)
    }


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace variable references by ``values``; a missing value raises KeyError naming it."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("braced") or match.group("bracketed") or match.group("plain")
        if name not in values:
            raise KeyError(f"no value for template variable ${name} in: {text}")
        return values[name]

    return VARIABLE_PATTERN.sub(replace, text)


def default_variable_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Current values saved in the dashboard's templating (skipping 'All' and empty ones)."""
    values: dict[str, str] = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        current = variable.get("current") or {}
        value = current.get("value")
        if isinstance(value, list):
            value = value[0] if len(value) == 1 else None
        if isinstance(value, str) and value and value != "$__all":
            values[variable["name"]] = value
    return values


def grafana_panel_queries(
    path: Path | str, variables: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, variables substituted.

    Values come from ``variables``, else the dashboard's saved current values, else
    BUILTIN_VARIABLES; a variable without any value raises KeyError.  Titles are substituted
    too (repeated panels have ``$judge`` in their title).
    """
    dashboard = load_dashboard(path)
    values = {**BUILTIN_VARIABLES, **default_variable_values(dashboard), **(variables or {})}
    queries: list[tuple[str, str]] = []
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            expr = target.get("expr")
            if expr:
                title = substitute(panel.get("title", ""), values)
                queries.append((title, substitute(expr, values)))
    return queries
