"""Each flag declared once, with the settings field it sets; a command's parser generated from it.

A `Flag` names the field of the command's settings model it sets, its help, parser and --help
group. Flags that together make one value of a lower layer (the judge panel, the cascade, the
budget, the label limits, Kafka security) form a `Block`, whose `build` turns their values into
that field. A command's `FlagTable` lists its model and its flags in --help order: `add_flags`
builds the argparse groups from it and `fields_from_flags` turns the parsed namespace back into
the model's fields. So a command takes exactly the flags its model reads
(tests/test_flags_read.py), and no module outside settings/ adds one (tests/test_flags_home.py).

A flag's default is its field's (`default_of`), shown in its help as `%(default)s`, or as
`{default}` for a DURATION; a field without a default gives a flag without one (None: the model
derives the value, or the flag is required).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from ragpulse.pipeline.errors import SettingsError
from ragpulse.pipeline.windows import parse_duration


class _FromModel:
    def __repr__(self) -> str:
        return "FROM_MODEL"


FROM_MODEL: Any = _FromModel()


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag (or positional argument) and the settings field it sets.

    `field`: the field of the table's model, or within a `Block` the key its `build` reads.
    `group`: the --help group (None: the parser's own). `one_of`: the mutually exclusive set
    the flag is in (within its group; required when its flags are). `text`: the model's default
    as the flag takes it (e.g. a tuple of judges as "a,b"); `read`: the parsed value as the
    field takes it.
    """

    name: str
    field: str
    help: str
    group: str | None = None
    type: Callable[[str], Any] | None = None
    metavar: str | None = None
    choices: Sequence[Any] | None = None
    action: Literal["store", "store_true", "append"] = "store"
    default: Any = FROM_MODEL
    required: bool = False
    dest: str | None = None
    one_of: str | None = None
    text: Callable[[Any], Any] | None = None
    read: Callable[[Any], Any] | None = None

    @property
    def key(self) -> str:
        """The flag's attribute on the parsed namespace."""
        return self.dest or self.name.lstrip("-").replace("-", "_")

    @property
    def shown(self) -> str:
        """The flag as --help and errors show it: its name, or a positional's metavar (else its
        name in upper case)."""
        if self.name.startswith("-"):
            return self.name
        return self.metavar or self.name.upper()

    def in_group(self, group: str) -> Flag:
        return dataclasses.replace(self, group=group)


@dataclasses.dataclass(frozen=True)
class Block:
    """Flags that together set one field through `build(values by key, fields built so far)`;
    `model`: the settings model whose fields the keys are (their defaults are the flags')."""

    field: str
    flags: tuple[Flag, ...]
    build: Callable[[dict[str, Any], dict[str, Any]], Any]
    model: type[BaseModel] | None = None

    def flag_names(self) -> dict[str, str]:
        """The flag that sets each field of `model`, as errors name it."""
        return {flag.field: flag.shown for flag in self.flags}


M = TypeVar("M", bound=BaseModel)


@dataclasses.dataclass(frozen=True)
class FlagTable(Generic[M]):
    """A command's flags, in --help order, and the settings model they set (None: a command
    that reads its flags itself)."""

    model: type[M] | None
    items: tuple[Flag | Block, ...]

    def flag_names(self) -> dict[str, str]:
        """The flag that sets each field of the model, as errors name it (a block's field: by
        its first flag)."""
        return {
            item.field: (item.flags[0] if isinstance(item, Block) else item).shown
            for item in self.items
        }

    def flags(self) -> list[tuple[Flag, type[BaseModel] | None]]:
        """Every flag with the model its default comes from."""
        out: list[tuple[Flag, type[BaseModel] | None]] = []
        for item in self.items:
            if isinstance(item, Block):
                out += [(f, item.model) for f in item.flags]
            else:
                out.append((item, self.model))
        return out


def default_of(model: type[BaseModel], field: str) -> Any:
    """The default of `model.field`, for the flag that sets it."""
    default = model.model_fields[field].default
    if default is PydanticUndefined:
        raise ValueError(f"{model.__name__}.{field} has no default")
    return default


def flag_default(flag: Flag, model: type[BaseModel] | None) -> Any:
    """The flag's default: its own, else its field's as the flag takes it, else None."""
    if flag.default is not FROM_MODEL:
        return flag.default
    if flag.action == "store_true" and model is None:
        return False
    if model is None or flag.required:
        return None
    info = model.model_fields[flag.field]
    if info.default is PydanticUndefined:
        return None
    if flag.text is not None:
        return flag.text(info.default)
    if flag.action == "append":
        return list(info.default)
    return info.default


def add_flags(parser: argparse.ArgumentParser, table: FlagTable[Any]) -> None:
    """The table's flags on `parser`, each group (and mutually exclusive set) created where its
    first flag comes."""
    groups: dict[str | None, Any] = {None: parser}
    exclusive: dict[str, Any] = {}
    for flag, model in table.flags():
        if flag.group not in groups:
            groups[flag.group] = parser.add_argument_group(flag.group)
        container = groups[flag.group]
        if flag.one_of is not None:
            if flag.one_of not in exclusive:
                exclusive[flag.one_of] = container.add_mutually_exclusive_group(
                    required=flag.required
                )
            container = exclusive[flag.one_of]
        default = flag_default(flag, model)
        help = flag.help
        if flag.type in (duration, positive_duration) and "{default}" in help:
            help = help.replace("{default}", format_duration(default))
        options: dict[str, Any] = {"help": help}
        if flag.action != "store":
            options["action"] = flag.action
        for name in ("type", "metavar", "choices", "dest"):
            if getattr(flag, name) is not None:
                options[name] = getattr(flag, name)
        if flag.name.startswith("-"):
            options["default"] = default
            if flag.required and flag.one_of is None:
                options["required"] = True
        container.add_argument(flag.name, **options)


def _value(flag: Flag, args: argparse.Namespace) -> Any:
    value = getattr(args, flag.key)
    if flag.read is not None:
        try:
            return flag.read(value)
        except ValueError as exc:  # a value argparse took but the field cannot: one line, exit 2
            raise SettingsError(f"{flag.name}: {exc}") from None
    if flag.action == "append":
        return tuple(value)
    return value


def values_of(flags: Sequence[Flag], args: argparse.Namespace) -> dict[str, Any]:
    """The values of `flags` in `args`, by the field (or key) each sets."""
    return {flag.field: _value(flag, args) for flag in flags}


def fields_from_flags(table: FlagTable[Any], args: argparse.Namespace) -> dict[str, Any]:
    """The model's fields from the parsed flags; blocks are built in the model's field order
    (the cascade and the budget read the judges built before them)."""
    if table.model is None:
        raise ValueError("this table sets no settings model")
    unknown = {item.field for item in table.items} - set(table.model.model_fields)
    if unknown:
        raise ValueError(f"{table.model.__name__} has no field {', '.join(sorted(unknown))}")
    blocks = {item.field: item for item in table.items if isinstance(item, Block)}
    fields = {
        item.field: _value(item, args) for item in table.items if not isinstance(item, Block)
    }
    for name in table.model.model_fields:
        if name in blocks:
            fields[name] = blocks[name].build(values_of(blocks[name].flags, args), fields)
    return fields


def duration_flag(
    name: str, field: str, help: str, *, group: str | None = None, positive: bool = True
) -> Flag:
    """A DURATION flag (seconds in the field); `{default}` in `help` is the default as the
    flag takes it (e.g. 10m). `positive`: zero is refused."""
    return Flag(
        name, field, help, group=group, metavar="DURATION",
        type=positive_duration if positive else duration,
    )


def comma_list(text: str) -> tuple[str, ...]:
    """A comma-separated flag's names, blanks left out."""
    return tuple(n.strip() for n in text.split(",") if n.strip())


def joined(names: Sequence[str]) -> str:
    return ",".join(names)


# --- the flags' parsers (argparse types) -------------------------------------------------------


def unit_interval(text: str) -> float:
    """A share or rate within [0, 1] (--sample-rate, the cascade's and the budget's rates)."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be within [0, 1], got {text}")
    return value


def positive_duration(text: str) -> float:
    """argparse type for durations that must be > 0."""
    seconds = duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0, got {text}")
    return seconds


def duration(text: str) -> float:
    """argparse type for durations that may be 0."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return seconds


def format_duration(seconds: float) -> str:
    """`seconds` as the shortest duration text `parse_duration` reads back (300 -> 5m)."""
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("m", 60.0), ("s", 1.0)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
