"""The classes of the ``rheo-flow`` app and commands: typer's, converting plain values.

typer converts each parameter's value to its annotated type with a pydantic
``TypeAdapter`` built when the parameter is first processed (``--help`` included,
given or not), and building the first one imports pydantic: about 0.1 s, a third
of a whole ``rheo-flow streams``. :class:`Command` and :class:`Group` give their
parameters annotated ``str``, ``int``, ``float`` or ``bool`` a conversion that
returns what typer's would for the plain cases — no value; a string as it is; a
number, or a string of ASCII digits (and one decimal point for a float), within
the parameter's ``min``/``max`` — and hand every other value (a sign, an
exponent, a value out of range that typer refuses or clamps) to typer's own
conversion, built then as before, so that its answers and error messages stay the
same. A typer whose parameters lack the attributes this uses (``type_descriptor``,
``_runtime_param``, ``get_runtime_param``) keeps its own conversion throughout.
"""

from __future__ import annotations

import re
from typing import Any, cast

import typer.core

__all__ = ["Command", "Group", "plain_value"]

_DIGITS = re.compile(r"[0-9]{1,18}")
_DECIMAL = re.compile(r"[0-9]{1,18}(?:\.[0-9]{1,18})?")
_TYPES = (str, int, float, bool)
_UNSURE = object()


def plain_value(kind: type, value: object, low: float | None, high: float | None) -> object:
    """``value`` converted to ``kind`` (str, int or float) as typer converts it, or
    ``_UNSURE`` (this module's sentinel) when only typer's conversion can tell."""
    if kind is str:
        return value if isinstance(value, str) else _UNSURE
    if kind is bool:  # typer takes a bool as it is without converting it
        return _UNSURE
    number: int | float
    if isinstance(value, str):
        if not (_DIGITS if kind is int else _DECIMAL).fullmatch(value):
            return _UNSURE
        number = kind(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if kind is int and not isinstance(value, int):
            return _UNSURE
        number = kind(value)
    else:
        return _UNSURE
    if (low is not None and number < low) or (high is not None and number > high):
        return _UNSURE
    return number


class _PlainConversion:
    """Stands in for typer's conversion of one parameter until a value needs it."""

    __slots__ = ("_kind", "_param")

    def __init__(self, param: Any, kind: type) -> None:
        self._param = param
        self._kind = kind

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        if value is None:  # typer's answer for a single-valued parameter without one
            return None
        param_info = self._param.type_descriptor.parameter_info
        low, high = self._param.min, self._param.max
        converted = _UNSURE if getattr(param_info, "clamp", False) else plain_value(
            self._kind, value, low, high)
        if converted is not _UNSURE:
            return converted
        self._param._runtime_param = None  # typer builds its own and keeps it
        return self._param.get_runtime_param().coerce(value, param=param, ctx=ctx)


def _convert_plainly(params: list[Any]) -> None:
    """Give each single-valued ``str``/``int``/``float``/``bool`` parameter of typer's
    that has no conversion yet the plain one."""
    for param in params:
        kind = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        if (kind in _TYPES and getattr(param, "_runtime_param", False) is None
                and param.nargs == 1 and not param.multiple
                and hasattr(param, "min") and hasattr(param, "max")
                and hasattr(param, "get_runtime_param")):
            param._runtime_param = _PlainConversion(param, kind)


class _ConvertsPlainly:
    """What :class:`Command` and :class:`Group` add to typer's classes (placed before
    them): their parameters, and the help option click builds on demand, convert plain
    values without pydantic."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        cast(Any, super()).__init__(*args, **kwargs)
        _convert_plainly(self.params)

    def get_help_option(self, ctx: Any) -> Any:
        option = cast(Any, super()).get_help_option(ctx)
        _convert_plainly([option] if option is not None else [])
        return option


class Command(_ConvertsPlainly, typer.core.TyperCommand):
    """A typer command converting plain values without pydantic (see the module)."""


class Group(_ConvertsPlainly, typer.core.TyperGroup):
    """The typer app's group converting plain values without pydantic (see the module)."""
