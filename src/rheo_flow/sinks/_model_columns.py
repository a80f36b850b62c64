"""A sink's columns taken from a model: one column per field (docs/typed-events.md).

:func:`model_columns` reads the fields of a pydantic v2 model, a msgspec Struct or
a dataclass, with their types, and makes a :class:`~rheo_flow.sinks.Column` of
each: the SQL type from the annotation (``Optional`` fields nullable, required
ones ``NOT NULL``), the value read from the message's data, a model instance (a
pipeline with ``models``) or a dict. The event columns (``event_id``, ``stream``,
``part``, ``seq``, ``type``, ``appended_at``) come first, so that the key is there.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import sys
import types
import typing
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, Literal

from .._model._errors import InvalidArgument
from .._model._typed import model_kind
from ._mapping import Column, event_columns

if TYPE_CHECKING:
    from ..pipeline import Message

__all__ = ["model_columns"]

Dialect = Literal["duckdb", "postgres"]

_SQL_TYPES: Final[dict[type, tuple[str, str]]] = {
    # Python type: (DuckDB, PostgreSQL); bool before int (a bool is an int).
    bool: ("BOOLEAN", "BOOLEAN"),
    int: ("BIGINT", "BIGINT"),
    float: ("DOUBLE", "DOUBLE PRECISION"),
    str: ("VARCHAR", "TEXT"),
    decimal.Decimal: ("DECIMAL(38, 9)", "NUMERIC"),
    dt.datetime: ("TIMESTAMPTZ", "TIMESTAMPTZ"),
    dt.date: ("DATE", "DATE"),
    uuid.UUID: ("UUID", "UUID"),
    bytes: ("BLOB", "BYTEA"),
}
_JSON: Final = {"duckdb": "JSON", "postgres": "JSONB"}


def model_columns(model: type, *, dialect: Dialect = "duckdb", event: bool = True,
                  exclude: typing.Collection[str] = ()) -> list[Column]:
    """The columns of a sink's table for events whose data is ``model``: the event columns
    (with ``event=True``: ``event_id``, ``stream``, ``part``, ``seq``, ``type``,
    ``appended_at``), then one column per field of the model not in ``exclude``, typed for
    ``dialect`` (``"duckdb"`` or ``"postgres"``; lists, dicts and nested models are JSON).

    Pass them as the ``columns`` of :class:`~rheo_flow.sinks.DuckDBSink` or
    :class:`~rheo_flow.sinks.PostgresSink`; add, drop or retype columns as for any list."""
    if dialect not in _JSON:
        raise InvalidArgument(f'dialect must be "duckdb" or "postgres", got {dialect!r}')
    kind = model_kind(model)
    if kind is None:
        raise InvalidArgument(f"model must be a pydantic model, msgspec Struct or dataclass "
                              f"class, got {model!r}")
    columns = ([c for c in event_columns(json_type=_JSON[dialect])
                if c.name not in ("key", "data")] if event else [])
    taken = {c.name for c in columns}
    for name, annotation, required in _fields(model, kind):
        if name in exclude:
            continue
        if name in taken:
            raise InvalidArgument(f"field {name!r} of {model.__name__} clashes with an event "
                                  "column: exclude it or pass event=False")
        sql, optional = _sql_type(annotation, dialect)
        columns.append(Column(name, sql, _reader(name, sql == _JSON[dialect]),
                              nullable=optional or not required))
    return columns


def _fields(model: type, kind: str) -> list[tuple[str, Any, bool]]:
    """(name, annotation, required) of each field."""
    if kind == "pydantic":
        return [(name, info.annotation, info.is_required())
                for name, info in model.model_fields.items()]  # type: ignore[attr-defined]
    if kind == "msgspec":
        fields = sys.modules["msgspec"].structs.fields(model)
        return [(f.name, f.type, f.required) for f in fields]
    hints = typing.get_type_hints(model)
    return [(f.name, hints.get(f.name, Any),
             f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
            for f in dataclasses.fields(model)]


def _sql_type(annotation: Any, dialect: Dialect) -> tuple[str, bool]:
    """The SQL type of a field and whether ``None`` is among its values."""
    optional = False
    origin = typing.get_origin(annotation)
    if origin is typing.Union or origin is types.UnionType:
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        optional = len(members) < len(typing.get_args(annotation))
        annotation = members[0] if len(members) == 1 else object
    index = 0 if dialect == "duckdb" else 1
    if isinstance(annotation, type):
        for python, sql in _SQL_TYPES.items():
            if issubclass(annotation, python):
                return sql[index], optional
    return _JSON[dialect], optional


def _reader(name: str, json: bool) -> Callable[[Message], Any]:
    """What reads field ``name`` of a message's data: a model's attribute, a dict's key
    (for a JSON column, nested models as JSON values)."""

    def read(message: Message) -> Any:
        data = message.data
        value = data.get(name) if type(data) is dict else getattr(data, name, None)
        return _jsonable(value) if json else value

    read.__name__ = f"field_{name}"
    return read


def _jsonable(value: Any) -> Any:
    """``value`` with the pydantic models and msgspec Structs in it as JSON values."""
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    kind = model_kind(type(value))
    if kind == "pydantic":
        return value.model_dump(mode="json")
    if kind == "msgspec":
        return sys.modules["msgspec"].to_builtins(value)
    return value
