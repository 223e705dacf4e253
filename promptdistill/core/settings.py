"""A stage's settings declared once: each field's default, the values it accepts and its help.

A settings class declares its fields with :func:`setting` and calls :func:`check` from
``__post_init__``: a bad value is refused naming the class, the field and why. Settings
two stages share are declared on one class both inherit (``SearchBudget``,
``RaceKnobs``); a stage that wants another default restates only that
(:func:`restated`), never the help. The CLI
adds its flags with :func:`add_setting_options`, whose ``--help`` is the declared help
with the declared default, so a command's help cannot state another default than the code.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import numbers
import types
import typing
from typing import Any, Mapping

__all__ = ["DeclaredHelp", "SettingError", "SettingsHelpFormatter", "add_setting_options", "check", "restated",
           "setting", "setting_values"]

_KEY = "setting"


@dataclasses.dataclass(frozen=True)
class Setting:
    """What one field accepts besides its declared type; bounds apply to a number or to
    every value of a tuple."""

    help: str
    at_least: float | None = None
    above: float | None = None
    at_most: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] = ()

    def bounds(self) -> str:
        """The accepted range in words: 'at least 1', 'positive', 'in (0, 0.5)'."""
        low = f"[{self.at_least:g}" if self.at_least is not None else None if self.above is None else f"({self.above:g}"
        high = f"{self.at_most:g}]" if self.at_most is not None else None if self.below is None else f"{self.below:g})"
        if low and high:
            return f"in {low}, {high}"
        if self.above == 0:
            return "positive"
        words = {"at least": self.at_least, "above": self.above, "at most": self.at_most, "below": self.below}
        return next(f"{word} {bound:g}" for word, bound in words.items() if bound is not None)

    def admits(self, number: Any) -> bool:
        """Within every bound (NaN is within none)."""
        return ((self.at_least is None or number >= self.at_least) and (self.above is None or number > self.above)
                and (self.at_most is None or number <= self.at_most) and (self.below is None or number < self.below))


class SettingError(ValueError):
    """A refused value: the message names class and field; ``field_message`` the field only,
    for the command line, whose flags name no class."""

    def __init__(self, owner: str, field: str, message: str) -> None:
        super().__init__(f"{owner}.{field} {message}")
        self.field_message = f"{field} {message}"


def setting(default: Any, help: str, *, at_least: float | None = None, above: float | None = None,
            at_most: float | None = None, below: float | None = None, choices: tuple[Any, ...] = ()) -> Any:
    """A dataclass field with its default, the values it accepts and its one-line help."""
    return dataclasses.field(default=default, metadata={_KEY: Setting(help, at_least, above, at_most, below, choices)})


def restated(owner: type, name: str, default: Any) -> Any:
    """An inherited field of the settings class ``owner`` with another default: its help and
    bounds stay ``owner``'s declaration, written once (a stage whose search is smaller than
    another's states only its own number)."""
    declared = {f.name: f for f in dataclasses.fields(owner)}[name]
    if _KEY not in declared.metadata:
        raise TypeError(f"{owner.__name__}.{name} is not a declared setting")
    return dataclasses.field(default=default, metadata=declared.metadata)


def check(obj: Any) -> None:
    """Refuse any field of ``obj`` (a settings dataclass) outside its declaration; lists
    given for tuple fields become tuples.

    Raises:
        SettingError: ``Class.field must be ..., got value.``
    """
    cls = type(obj)
    hints = _hints(cls)
    for f in dataclasses.fields(obj):
        declared = f.metadata.get(_KEY)
        if declared is None:
            continue
        value = getattr(obj, f.name)
        if isinstance(value, list) and typing.get_origin(_without_none(hints[f.name])) is tuple:
            value = tuple(value)
            object.__setattr__(obj, f.name, value)
        reason = _reason(declared, value, hints[f.name])
        if reason:
            raise SettingError(cls.__name__, f.name, f"{reason}, got {value!r}.")


def _reason(declared: Setting, value: Any, hint: Any) -> str | None:
    if not _fits(value, hint):
        return f"must be {_type_name(hint)}"
    if value is None:
        return None
    tuple_field = typing.get_origin(_without_none(hint)) is tuple
    values = value if tuple_field else (value,)
    if declared.choices and any(v not in declared.choices for v in values):
        return f"must be one of {declared.choices}"
    if not all(declared.admits(v) for v in values if isinstance(v, numbers.Real)):
        return ("must hold values " if tuple_field else "must be ") + declared.bounds()
    return None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _without_none(hint: Any) -> Any:
    """``X`` of ``X | None``; any other hint as it is."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if _is_union(hint) and len(args) == 1 else hint


def _is_union(hint: Any) -> bool:
    return typing.get_origin(hint) in (typing.Union, types.UnionType)


def _fits(value: Any, hint: Any) -> bool:
    if _is_union(hint):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if typing.get_origin(hint) is tuple:
        args = typing.get_args(hint)
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_fits(v, args[0]) for v in value)
        return len(value) == len(args) and all(_fits(v, h) for v, h in zip(value, args))
    if hint in (int, float):  # a bool is no count; an int is a float's value too
        return isinstance(value, numbers.Integral if hint is int else numbers.Real) and not isinstance(value, bool)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint)


def _default_text(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(_default_text(v) for v in value) or "none"
    return format(value, "g") if isinstance(value, float) else str(value)


# ------------------------------------------------------------------ command line
@functools.cache
def _declared_class(owner: str) -> type:
    """``"package.module:Class"`` imported: only when help is shown or a flag is given."""
    module, _, name = owner.partition(":")
    return getattr(importlib.import_module(module), name)


def _field(owner: str, name: str) -> dataclasses.Field:
    return {f.name: f for f in dataclasses.fields(_declared_class(owner))}[name]


class DeclaredHelp(str):
    """A flag's help read from its setting's declaration when ``--help`` is shown (the
    settings' modules load pandas and the engine, which building the parser must not).
    Shown by :class:`SettingsHelpFormatter`; usable as any argparse ``help=``."""

    def __new__(cls, owner: str, name: str) -> "DeclaredHelp":
        self = super().__new__(cls, f"{owner}.{name}")
        self.owner, self.name = owner, name
        return self

    def text(self) -> str:
        f = _field(self.owner, self.name)
        declared: Setting = f.metadata[_KEY]
        notes = [f"one of {', '.join(map(str, declared.choices))}"] if declared.choices else []
        if f.default is not None:
            notes.append(f"default {_default_text(f.default)}")
        return declared.help + (f" ({'; '.join(notes)})" if notes else "")


class SettingsHelpFormatter(argparse.HelpFormatter):
    """Argparse's formatter, showing a :class:`DeclaredHelp` as its declared text."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if isinstance(action.help, DeclaredHelp):
            return action.help.text().replace("%", "%%")
        return super()._get_help_string(action)


class _ParseAs:
    """Reads a flag's text as its field's declared type (a tuple from comma-separated values)."""

    def __init__(self, owner: str, name: str) -> None:
        self.owner, self.__name__ = owner, name

    def __call__(self, text: str) -> Any:
        hint = _without_none(_hints(_declared_class(self.owner))[self.__name__])
        if typing.get_origin(hint) is tuple:
            item = typing.get_args(hint)[0]
            return tuple(item(part) for part in text.split(",") if part.strip())
        choices = _field(self.owner, self.__name__).metadata[_KEY].choices
        if choices and hint(text) not in choices:  # refused while parsing, as argparse's own choices are
            raise argparse.ArgumentTypeError(f"must be one of {', '.join(map(str, choices))}, got {text!r}")
        return hint(text)


def add_setting_options(parser: argparse.ArgumentParser, owner: str, flags: Mapping[str, str]) -> None:
    """Add a flag per field of the settings class ``owner`` (``"package.module:Class"``),
    ``flags`` mapping flag to field name. A flag left out is None (:func:`setting_values`
    leaves it out, so the class's default applies); its help is the declared one."""
    for flag, name in flags.items():
        parser.add_argument(flag, dest=name, type=_ParseAs(owner, name), help=DeclaredHelp(owner, name),
                            metavar=flag.lstrip("-").replace("-", "_").upper())


def setting_values(args: argparse.Namespace, flags: Mapping[str, str]) -> dict[str, Any]:
    """The fields of the ``flags`` that were given, by field name."""
    return {name: getattr(args, name) for name in flags.values() if getattr(args, name, None) is not None}
