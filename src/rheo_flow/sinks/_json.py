"""JSON text of the values of JSON columns: orjson, with the standard library as fallback.

Sinks encode every row's JSON columns on their hot path; orjson does it several
times faster than the standard library. What orjson refuses and the standard
library encodes exactly (integers beyond 64 bits, non-string keys, float
subclasses) falls back to the standard library, so no value changes on the way.
Values the standard library cannot encode at all but orjson can (dates, datetimes,
UUIDs, dataclasses, enums) are written the way orjson writes them, on either path;
times of day without a time zone as ``time.isoformat()`` writes them (orjson drops
a digit of microseconds between 10000 and 99999, writing another time).

A float that is not finite is refused (ValueError), as the standard library refuses
it: orjson would write it as ``null``. Whether a value holds one is decided from the
value, by walking it, and only when orjson's text has a ``null`` token (a text
without one cannot come from a non-finite float), so data without ``null`` pays for
no walk. Anything else JSON has no form for (decimals, bytes, sets, timedeltas, times
with a time zone, ...) is a TypeError, ``Object of type Decimal is not JSON
serializable``, as the standard library words it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Iterator
from datetime import date, time
from typing import Any

import orjson

__all__ = ["dumps"]

_orjson_dumps = orjson.dumps
_Fragment = orjson.Fragment
_PASSTHROUGH_DATETIME = orjson.OPT_PASSTHROUGH_DATETIME


def dumps(value: Any) -> str:
    """Compact JSON text of ``value`` (UTF-8, not ASCII-escaped).

    Raises TypeError for a value JSON has no form for, ValueError for a float that
    is not finite.
    """
    try:
        text = _orjson_dumps(value, default=_orjson_default, option=_PASSTHROUGH_DATETIME)
    except orjson.JSONEncodeError:
        # e.g. an integer beyond 64 bits, a non-string key, a float subclass, or a type
        # neither encoder writes (the standard library raises the TypeError then).
        return _stdlib_dumps(value)
    if b"null" in text and _holds_non_finite(value):
        # orjson wrote the non-finite float as null: the strict encoder raises ValueError.
        return _stdlib_dumps(value)
    return text.decode()


def _orjson_default(o: Any) -> Any:
    """orjson's ``default`` (it hands over dates, datetimes and times, and what it
    cannot write): dates and datetimes as orjson writes them, naive times as
    ``isoformat()``; a TypeError for the rest (the standard library's turn then)."""
    if isinstance(o, date):
        return _Fragment(_orjson_dumps(o))
    if isinstance(o, time) and o.tzinfo is None:
        return o.isoformat()
    raise TypeError


def _stdlib_default(o: Any) -> Any:
    """What the standard library encodes in place of ``o``, a value it has no form for.

    The fields of a dataclass and the value of an enum (encoded in turn, so big
    integers and non-finite floats inside them are treated as anywhere else), the
    text the orjson path writes for dates, datetimes, times and UUIDs; a TypeError
    for the rest.
    """
    if _is_dataclass_instance(o):
        return dict(_dataclass_items(o))
    if isinstance(o, enum.Enum):
        return o.value
    try:
        return orjson.loads(_orjson_dumps(o, default=_orjson_default,
                                          option=_PASSTHROUGH_DATETIME))
    except orjson.JSONEncodeError:
        raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable") from None


_stdlib_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False,
                                 default=_stdlib_default).encode


def _is_dataclass_instance(o: Any) -> bool:
    return dataclasses.is_dataclass(o) and not isinstance(o, type)


def _dataclass_items(o: Any) -> Iterator[tuple[str, Any]]:
    """The attributes orjson writes for a dataclass instance: those of its ``__dict__``
    (or, with slots, its fields) whose names do not start with an underscore."""
    attributes = getattr(o, "__dict__", None)
    if attributes is not None:
        for name, v in attributes.items():
            if not name.startswith("_"):
                yield name, v
        return
    for f in dataclasses.fields(o):
        if not f.name.startswith("_"):
            yield f.name, getattr(o, f.name)


def _holds_non_finite(value: Any) -> bool:
    """Whether orjson's encoding of ``value`` wrote a non-finite float (as ``null``).

    Walks what orjson walks: dict values (its keys are strings), list and tuple
    items, enum values, dataclass attributes. Float subclasses never get here:
    orjson refuses them.
    """
    t = type(value)
    if t is float:
        return not math.isfinite(value)
    if t is str or t is int or t is bool or value is None:
        return False
    if isinstance(value, dict):
        return any(_holds_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_holds_non_finite(v) for v in value)
    if isinstance(value, enum.Enum):
        return _holds_non_finite(value.value)
    if _is_dataclass_instance(value):
        return any(_holds_non_finite(v) for _, v in _dataclass_items(value))
    return False  # dates, times, UUIDs, subclasses of str and int
