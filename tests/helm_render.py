"""Render the Helm chart in deploy/helm/ragpulse without Helm, for tests on machines without it.

No package from the registries this project uses ships the `helm` binary, so the tests render
the chart with this small interpreter of the Go-template subset the chart is written in:
actions `{{ pipeline }}` with `{{-`/`-}}` trimming and comments; `if`/`else if`/`else`, `range`
(over lists and maps, with `$v :=` or `$k, $v :=`), `with`; `.Values`, `.Release`, `.Chart`,
`$`, `$var`; `.Files.Get`; the functions quote, toYaml, indent, nindent, default, printf
(%s, %v, %d), trimSuffix, eq, ne, not, and, or, required, empty. Anything else raises
`TemplateError`, so a template that strays outside the subset fails its test instead of
rendering wrong. The chart must still be checked with `helm lint` and `helm template` where Helm
is installed; this is a stand-in, not Helm.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml


class TemplateError(Exception):
    """The template uses something outside the supported subset, or fails (`required`)."""


_ACTION = re.compile(r"\{\{(-?)(\s*)(.*?)(\s*)(-?)\}\}", re.DOTALL)


@dataclasses.dataclass
class _Node:
    kind: str  # text | action | if | range | with
    text: str = ""
    branches: list[tuple[str | None, list[_Node]]] = dataclasses.field(default_factory=list)
    variables: tuple[str, ...] = ()


def _tokens(source: str) -> Iterator[tuple[str, str]]:
    """("text", s) and ("action", s) pieces, with Go's whitespace trimming applied."""
    pos = 0
    pending_trim = False
    for match in _ACTION.finditer(source):
        text = source[pos:match.start()]
        if pending_trim:
            text = text.lstrip(" \t\r\n")
        if match.group(1) == "-":
            text = text.rstrip(" \t\r\n")
        yield "text", text
        yield "action", match.group(3).strip()
        pending_trim = match.group(5) == "-"
        pos = match.end()
    text = source[pos:]
    yield "text", text.lstrip(" \t\r\n") if pending_trim else text


def parse(source: str) -> list[_Node]:
    root: list[_Node] = []
    stack: list[tuple[_Node, list[_Node]]] = []
    current = root
    for kind, text in _tokens(source):
        if kind == "text":
            if text:
                current.append(_Node("text", text))
            continue
        if text.startswith("/*"):
            continue
        word = text.split(None, 1)[0] if text else ""
        rest = text[len(word):].strip()
        if word in ("if", "with", "range"):
            node = _Node(word)
            if word == "range" and ":=" in rest:
                names, rest = rest.split(":=", 1)
                node.variables = tuple(n.strip() for n in names.split(","))
                rest = rest.strip()
            body: list[_Node] = []
            node.branches.append((rest, body))
            current.append(node)
            stack.append((node, current))
            current = body
        elif word == "else":
            node, _ = stack[-1]
            body = []
            condition = rest[2:].strip() if rest.startswith("if ") else None
            node.branches.append((condition, body))
            current = body
        elif word == "end":
            _, current = stack.pop()
        elif word in ("define", "template", "block", "include", "tpl"):
            raise TemplateError(f"{word} is outside the supported subset")
        else:
            current.append(_Node("action", text))
    if stack:
        raise TemplateError("missing {{ end }}")
    return root


class _Files:
    def __init__(self, chart: Path) -> None:
        self._chart = chart

    def Get(self, name: str) -> str:
        return (self._chart / name).read_text(encoding="utf-8")


def _go_str(value: Any) -> str:
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return _go_float(float(value))
    if isinstance(value, (dict, list)):
        raise TemplateError(f"printing a {type(value).__name__}: use toYaml")
    return str(value)


def _go_float(value: float) -> str:
    """How Go's text/template prints a float64, as Helm holds every number of values.yaml:
    shortest digits, with an exponent from 1e+06 up (so 1048576 prints as 1.048576e+06)."""
    number = Decimal(repr(float(value))).normalize()
    if number == 0:
        return "0"
    sign, digits, exponent = number.as_tuple()
    assert isinstance(exponent, int)
    exp = len(digits) - 1 + exponent
    if exp < -4 or exp >= 6:
        text = "".join(map(str, digits))
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{'-' if sign else ''}{mantissa}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    return format(number, "f")


def _truthy(value: Any) -> bool:
    return not (value is None or value is False or value == 0 or value == "" or value == []
                or value == {})


def _to_yaml(value: Any) -> str:
    return yaml.safe_dump(value, default_flow_style=False, sort_keys=True).rstrip("\n")


def _indent(n: int, text: str) -> str:
    pad = " " * n
    return pad + text.replace("\n", "\n" + pad)


def _printf(fmt: str, *args: Any) -> str:
    values = iter(args)
    return re.sub(r"%[svd]", lambda _: _go_str(next(values)), fmt)


def _required(message: str, value: Any) -> Any:
    if not _truthy(value):
        raise TemplateError(message)
    return value


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quote": lambda *v: " ".join('"' + _go_str(x).replace('"', '\\"') + '"' for x in v),
    "toYaml": _to_yaml,
    "indent": _indent,
    "nindent": lambda n, text: "\n" + _indent(n, text),
    "default": lambda fallback, value=None: value if _truthy(value) else fallback,
    "printf": _printf,
    "trimSuffix": lambda suffix, text: text[: -len(suffix)] if text.endswith(suffix) else text,
    "eq": lambda a, b: a == b,
    "ne": lambda a, b: a != b,
    "not": lambda v: not _truthy(v),
    "and": lambda *v: all(_truthy(x) for x in v),
    "or": lambda *v: next((x for x in v if _truthy(x)), v[-1]),
    "required": _required,
    "empty": lambda v: not _truthy(v),
}

_OPERAND = re.compile(
    r'\s*(?:(?P<pipe>\|)|(?P<str>"(?:[^"\\]|\\.)*")|(?P<paren>\()|(?P<num>-?\d+(?:\.\d+)?)'
    r"|(?P<path>\$\w*(?:\.\w+)*|\.(?:\w+(?:\.\w+)*)?|[A-Za-z_]\w*))"
)


class _Scope:
    def __init__(self, root: Mapping[str, Any], dot: Any, variables: dict[str, Any]) -> None:
        self.root, self.dot, self.variables = root, dot, variables

    def child(self, dot: Any, **variables: Any) -> _Scope:
        return _Scope(self.root, dot, {**self.variables, **variables})


def _field(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    if hasattr(value, name):
        return getattr(value, name)
    if value is None:
        return None
    raise TemplateError(f"no field {name} on {type(value).__name__}")


def _resolve(path: str, scope: _Scope) -> Any:
    if path == ".":
        return scope.dot
    if path.startswith("$"):
        head, _, tail = path.partition(".")
        value = scope.root if head == "$" else scope.variables[head]
        parts = [p for p in tail.split(".") if p]
    else:
        value = scope.dot
        parts = [p for p in path.split(".") if p]
    for part in parts:
        value = _field(value, part)
    return value


def _split_commands(text: str) -> list[list[Any]]:
    """A pipeline as commands, each a list of operands: ("lit", v), ("path", p), ("fn", name),
    ("sub", text)."""
    commands: list[list[Any]] = [[]]
    pos = 0
    while pos < len(text):
        match = _OPERAND.match(text, pos)
        if match is None or match.end() == pos:
            raise TemplateError(f"cannot parse {text[pos:]!r}")
        pos = match.end()
        if match["str"]:
            literal = bytes(match["str"][1:-1], "utf-8").decode("unicode_escape")
            commands[-1].append(("lit", literal))
        elif match["paren"]:
            depth, start = 1, pos
            while depth:
                if pos >= len(text):
                    raise TemplateError(f"unbalanced ( in {text!r}")
                depth += {"(": 1, ")": -1}.get(text[pos], 0)
                pos += 1
            commands[-1].append(("sub", text[start:pos - 1]))
        elif match["num"]:
            number = match["num"]
            commands[-1].append(("lit", float(number) if "." in number else int(number)))
        elif match["pipe"]:
            commands.append([])
        elif match["path"]:
            word = match["path"]
            if word in ("true", "false"):
                commands[-1].append(("lit", word == "true"))
            elif word in ("nil",):
                commands[-1].append(("lit", None))
            elif word.startswith((".", "$")):
                commands[-1].append(("path", word))
            else:
                if word not in FUNCTIONS:
                    raise TemplateError(f"function {word} is outside the supported subset")
                commands[-1].append(("fn", word))
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return commands


def _evaluate(text: str, scope: _Scope) -> Any:
    result: Any = None
    for index, command in enumerate(_split_commands(text)):
        args = [_operand(op, scope) for op in command[1:]]
        if index:
            args.append(result)
        head = command[0]
        if head[0] == "fn":
            result = FUNCTIONS[head[1]](*args)
        else:
            value = _operand(head, scope)
            result = value(*args) if callable(value) else value
    return result


def _operand(op: tuple[str, Any], scope: _Scope) -> Any:
    kind, value = op
    if kind == "lit":
        return value
    if kind == "sub":
        return _evaluate(value, scope)
    if kind == "fn":
        return FUNCTIONS[value]()
    return _resolve(value, scope)


def _render(nodes: list[_Node], scope: _Scope, out: list[str]) -> None:
    for node in nodes:
        if node.kind == "text":
            out.append(node.text)
        elif node.kind == "action":
            if ":=" in node.text or (node.text.startswith("$") and "=" in node.text):
                raise TemplateError("variable assignment is outside the supported subset")
            out.append(_go_str(_evaluate(node.text, scope)))
        elif node.kind == "if":
            for condition, body in node.branches:
                if condition is None or _truthy(_evaluate(condition, scope)):
                    _render(body, scope, out)
                    break
        elif node.kind == "with":
            value = _evaluate(node.branches[0][0] or "", scope)
            if _truthy(value):
                _render(node.branches[0][1], scope.child(value), out)
            elif len(node.branches) > 1:
                _render(node.branches[1][1], scope, out)
        elif node.kind == "range":
            items = _evaluate(node.branches[0][0] or "", scope)
            pairs = sorted(items.items()) if isinstance(items, Mapping) else enumerate(items or [])
            names = node.variables
            for key, value in pairs:
                variables = {}
                if len(names) == 1:
                    variables[names[0]] = value
                elif len(names) == 2:
                    variables[names[0]], variables[names[1]] = key, value
                _render(node.branches[0][1], scope.child(value, **variables), out)


def render_chart(
    chart: Path,
    values: Mapping[str, Any] | None = None,
    release: str = "ragpulse",
    namespace: str = "monitoring",
) -> dict[str, str]:
    """templates/NAME -> rendered text, with values.yaml deep-merged with `values`."""
    defaults = yaml.safe_load((chart / "values.yaml").read_text(encoding="utf-8")) or {}
    meta = yaml.safe_load((chart / "Chart.yaml").read_text(encoding="utf-8"))
    root = {
        "Values": _merge(defaults, values or {}),
        "Release": {"Name": release, "Namespace": namespace, "Service": "Helm"},
        "Chart": {"Name": meta["name"], "Version": meta["version"],
                  "AppVersion": meta.get("appVersion", "")},
        "Files": _Files(chart),
    }
    rendered = {}
    for path in sorted((chart / "templates").glob("*.yaml")):
        out: list[str] = []
        _render(parse(path.read_text(encoding="utf-8")), _Scope(root, root, {}), out)
        rendered[path.name] = "".join(out)
    return rendered


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def manifests(chart: Path, values: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every rendered Kubernetes object (empty documents dropped)."""
    docs: list[dict[str, Any]] = []
    for text in render_chart(chart, values).values():
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs
