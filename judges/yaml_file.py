"""The one reader of the operator's YAML files, bounded so that a hostile file is one line.

Every YAML file ragpulse reads goes through `load_yaml`: `--config`, `--sampling-rules`,
`--judge-price-table`, `--custom-judge`, `--judge-prompts` files and `--web-config-file`. It lives
in `judges` (the lower layer) because the prompt and custom judge files are read here too.

A file is refused, with a `YamlFileError` whose message is one line without the path (the
caller names the file and its flag), when it is larger than `MAX_BYTES`, not UTF-8, nested
deeper than `MAX_DEPTH`, uses aliases (`*name`, whose expansion is unbounded: "billion laughs")
is not YAML, or holds a key twice in one mapping (PyYAML keeps the last silently: a setting
written twice would be half-applied). A message never quotes the file's text beyond a key that
looks like a name: pointed at a file that is not ragpulse's (`--config /etc/shadow`), the error
must not print its lines. Depth and aliases are checked on PyYAML's event stream, which is read
without recursion, before a document is built: building a 5,000-deep document raised
RecursionError (a traceback) in every loader.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

# Far above any real settings file (ours are a few KB); a rules file of ~20,000 rules fits.
MAX_BYTES = 1 << 20
MAX_DEPTH = 64

# libyaml's parser when PyYAML was built with it (the wheels are): the same documents, faster.
_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# A key an error may name: it looks like a setting's name, not like a line of someone's file.
_NAME_LIKE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,63}")


def shown_key(key: object) -> str:
    """`key` quoted when it looks like a name, else "(text not shown)": an error never prints
    a line of someone's file."""
    if isinstance(key, str) and _NAME_LIKE.fullmatch(key):
        return repr(key)
    return "(text not shown)"


class YamlFileError(ValueError):
    """A YAML file that cannot be used; one line, without the path. `line`: 1-based, if known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line


class _NoDuplicateKeysLoader(_LOADER):
    """The safe loader, refusing a key written twice in one mapping."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_lines: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                first = first_lines.get(key)
            except TypeError:
                continue  # an unhashable key: the base constructor words that error
            if first is not None:
                raise YamlFileError(
                    f"the key {shown_key(key)} is written twice (lines {first} and {line}): "
                    "write each key once",
                    line,
                )
            first_lines[key] = line
        return super().construct_mapping(node, deep)


def load_yaml(path: Path, *, max_bytes: int = MAX_BYTES) -> Any:
    """The document in the YAML file at `path` (None when empty).

    OSError when it cannot be read (callers word that themselves); YamlFileError otherwise.
    """
    return loads(read_text(path, max_bytes=max_bytes))


def read_text(path: Path, *, max_bytes: int = MAX_BYTES) -> str:
    """The text of the file at `path`, at most `max_bytes` of UTF-8; OSError, YamlFileError."""
    with path.open("rb") as f:
        raw = f.read(max_bytes + 1)
    if len(raw) > max_bytes:
        raise YamlFileError(f"larger than {max_bytes:,} bytes, the most ragpulse reads")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise YamlFileError(
            f"not UTF-8 (byte 0x{raw[exc.start]:02x} on line {line})", line
        ) from None
    return text


def loads(text: str) -> Any:
    """The YAML document `text`, with the checks of `load_yaml` but the size."""
    try:
        _check_shape(text)
        return yaml.load(text, Loader=_NoDuplicateKeysLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        at = f" (line {line})" if line is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise YamlFileError(f"not valid YAML{at}: {problem}", line) from None


def _check_shape(text: str) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else None
                raise YamlFileError(f"nested deeper than {MAX_DEPTH} levels", line)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
        elif isinstance(event, yaml.AliasEvent):
            line = event.start_mark.line + 1 if event.start_mark else None
            raise YamlFileError(
                f"aliases (*{event.anchor}) are not supported: write the value out", line
            )
