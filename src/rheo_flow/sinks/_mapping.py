"""Schema mapping: how one pipeline message becomes one row of a sink's table.

A :class:`Column` names a target column, its SQL type and the source of its
value: an event field (``"event.id"``, ``"event.partition"``, ...), the JSON
data or a path into it (``"data"``, ``"data.customer.id"``), a header, or any
function of the message. A :class:`RowMapping` compiles the columns into one
function producing a row tuple per message.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from .._model._errors import InvalidArgument
from ._json import dumps

if TYPE_CHECKING:
    from ..pipeline import Message

__all__ = [
    "EVENT_SOURCES",
    "Column",
    "MappingError",
    "RowMapping",
    "event_columns",
    "quote_ident",
    "quote_table",
]

IDENTIFIER: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
JSON_TYPES: Final = frozenset({"JSON", "JSONB"})

# source -> the expression computing it, over `m` (the message), `ev` (its event)
# and `d` (its data).
EVENT_SOURCES: Final[dict[str, str]] = {
    "event.id": "ev.id",
    "event.stream": "ev.stream",
    "event.partition": "ev.partition",
    "event.sequence": "ev.sequence",
    "event.type": "ev.type",
    "event.key": "ev.key",
    "event.appended_at": "_utc(ev.appended_at_ms)",
    "event.appended_at_ms": "ev.appended_at_ms",
    "event.headers": "dict(ev.headers)",
    "lease.attempt": "m.lease.attempt",
    "data": "d",
}
"""The named sources a :class:`Column` can read (plus ``data.PATH``, ``event.headers.NAME``
and functions)."""

_NEVER_NULL: Final = frozenset(
    {"event.id", "event.stream", "event.partition", "event.sequence", "event.type",
     "event.appended_at", "event.appended_at_ms", "event.headers", "lease.attempt"}
)

Source = str | Callable[["Message"], Any]


class MappingError(ValueError):
    """A message cannot be mapped to a row (a required value is missing, a source raised)."""


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def quote_table(name: str, what: str = "table") -> str:
    """A ``table`` or ``schema.table`` name, checked and quoted."""
    parts = name.split(".") if isinstance(name, str) else [name]
    if not 1 <= len(parts) <= 2 or not all(isinstance(p, str) and IDENTIFIER.match(p)
                                            for p in parts):
        raise InvalidArgument(
            f"invalid {what} name {name!r}: use table or schema.table, each 1-63 characters "
            "of A-Z a-z 0-9 _ starting with a letter or underscore"
        )
    return ".".join(quote_ident(p) for p in parts)


@dataclass(frozen=True, slots=True)
class Column:
    """One column of a sink's table.

    ``type`` is the column's SQL type in the target database's dialect (e.g.
    ``"BIGINT"``, ``"VARCHAR"``, ``"TIMESTAMPTZ"``, ``"JSON"``; ``"JSONB"`` on
    PostgreSQL). ``source`` is where the value comes from:

    * an event field: ``event.id``, ``event.stream``, ``event.partition``,
      ``event.sequence``, ``event.type``, ``event.key``, ``event.appended_at`` (an
      aware UTC datetime), ``event.appended_at_ms``, ``event.headers``,
      ``event.headers.NAME`` (one header), ``lease.attempt``;
    * the message's data (after the pipeline's ``handle_message``): ``data``, or
      a path into it, ``data.customer.id`` (missing keys give ``NULL``);
    * a function of the :class:`~rheo_flow.pipeline.Message`.

    A column of a JSON type (``JSON``, ``JSONB``) receives its value as JSON
    text; every other column receives the value as it is and the database
    converts it (a value it cannot convert makes the row invalid). ``nullable=False``
    makes a missing value an invalid row before anything is written (and adds
    ``NOT NULL`` when the sink creates the table); ``check`` is an SQL ``CHECK``
    expression added when the sink creates the table.
    """

    name: str
    type: str
    source: Source
    nullable: bool = True
    check: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not IDENTIFIER.match(self.name):
            raise InvalidArgument(
                f"invalid column name {self.name!r}: use 1-63 characters of A-Z a-z 0-9 _ "
                "starting with a letter or underscore"
            )
        if not isinstance(self.type, str) or not self.type.strip() or ";" in self.type:
            raise InvalidArgument(f"column {self.name}: type must be an SQL type such as "
                                  f"BIGINT or VARCHAR, got {self.type!r}")
        if self.check is not None and (not isinstance(self.check, str) or not self.check.strip()
                                       or ";" in self.check):
            raise InvalidArgument(f"column {self.name}: check must be an SQL expression, "
                                  f"got {self.check!r}")
        source = self.source
        if callable(source):
            return
        if not isinstance(source, str) or not (
            source in EVENT_SOURCES
            or _path(source, "data.") is not None
            or _path(source, "event.headers.") is not None
        ):
            raise InvalidArgument(
                f"column {self.name}: unknown source {source!r}; use one of "
                f"{', '.join(EVENT_SOURCES)}, data.PATH, event.headers.NAME or a function "
                "of the message"
            )

    @property
    def is_json(self) -> bool:
        """Whether the column has a JSON type (its values are sent as JSON text)."""
        return self.type.strip().upper() in JSON_TYPES

    @property
    def may_be_null(self) -> bool:
        """Whether the source can produce ``None``."""
        return callable(self.source) or self.source not in _NEVER_NULL

    def definition(self) -> str:
        """The column's SQL definition for ``CREATE TABLE``."""
        sql = f"{quote_ident(self.name)} {self.type}"
        if not self.nullable:
            sql += " NOT NULL"
        if self.check is not None:
            sql += f" CHECK ({self.check})"
        return sql


def _path(source: str, prefix: str) -> tuple[str, ...] | None:
    if not source.startswith(prefix):
        return None
    keys = tuple(source[len(prefix):].split("."))
    return keys if all(keys) else None


def event_columns(*, json_type: str = "JSON") -> list[Column]:
    """The default columns: every event field and the data as JSON.

    ``event_id`` (the idempotence key), ``stream``, ``part``, ``seq``, ``type``,
    ``key``, ``appended_at`` and ``data`` (of ``json_type``: ``JSON`` for DuckDB,
    ``JSONB`` for PostgreSQL).
    """
    return [
        Column("event_id", "VARCHAR", "event.id", nullable=False),
        Column("stream", "VARCHAR", "event.stream", nullable=False),
        Column("part", "INTEGER", "event.partition", nullable=False),
        Column("seq", "BIGINT", "event.sequence", nullable=False),
        Column("type", "VARCHAR", "event.type", nullable=False),
        Column("key", "VARCHAR", "event.key"),
        Column("appended_at", "TIMESTAMPTZ", "event.appended_at", nullable=False),
        Column("data", json_type, "data"),
    ]


@functools.lru_cache(maxsize=4096)
def _utc(ms: int) -> datetime:
    # Events appended together share their millisecond: one datetime serves them all.
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def _dig(value: Any, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if type(value) is not dict:
            return None
        value = value.get(k)
    return value


class RowMapping:
    """Columns compiled into one function from a message to a row tuple.

    ``key`` names the column holding the idempotence key (the event id by
    default): the sink keeps one row per key.
    """

    def __init__(self, columns: Sequence[Column], key: str = "event_id") -> None:
        cols = list(columns)
        if not cols or not all(isinstance(c, Column) for c in cols):
            raise InvalidArgument("columns must be a non-empty list of Column")
        names = [c.name for c in cols]
        seen: set[str] = set()
        for n in names:
            if n.lower() in seen:
                raise InvalidArgument(f"column {n!r} appears twice")
            seen.add(n.lower())
        if key not in names:
            raise InvalidArgument(f"key column {key!r} is not one of the columns {names}")
        key_column = cols[names.index(key)]
        if key_column.nullable:
            # An idempotence key must exist for every row.
            key_column = Column(key_column.name, key_column.type, key_column.source,
                                nullable=False, check=key_column.check)
            cols[names.index(key)] = key_column
        self.columns: tuple[Column, ...] = tuple(cols)
        self.names: tuple[str, ...] = tuple(names)
        self.key = key
        self.key_index = names.index(key)
        self._row = _compile(self.columns)

    def row(self, message: Message) -> tuple[Any, ...]:
        """The row of one message; :class:`MappingError` when it cannot be built."""
        try:
            return self._row(message)
        except _Missing as missing:
            raise MappingError(
                f"column {missing.column} is required but its source "
                f"{_describe_source(self.columns, missing.column)} gave no value"
            ) from None
        except Exception as exc:
            raise MappingError(f"mapping failed: {type(exc).__name__}: {exc}") from None

    def rows(self, messages: Sequence[Message]) -> list[tuple[Any, ...]]:
        """The rows of many messages; raises (any exception) at the first that fails.

        The fast path of :meth:`Sink.write`, which falls back to :meth:`row` per
        message to find out which ones fail and why.
        """
        row = self._row
        return [row(m) for m in messages]

    def create_table(self, table_sql: str) -> str:
        """``CREATE TABLE IF NOT EXISTS`` with every column and the key as primary key."""
        body = ", ".join(c.definition() for c in self.columns)
        return (f"CREATE TABLE IF NOT EXISTS {table_sql} ({body}, "
                f"PRIMARY KEY ({quote_ident(self.key)}))")

    @property
    def column_list(self) -> str:
        """The quoted, comma separated column names."""
        return ", ".join(quote_ident(n) for n in self.names)


class _Missing(Exception):
    def __init__(self, column: str) -> None:
        super().__init__(column)
        self.column = column


def _describe_source(columns: Sequence[Column], name: str) -> str:
    for c in columns:
        if c.name == name:
            return repr(c.source) if isinstance(c.source, str) else "(function)"
    return "?"


def _compile(columns: Sequence[Column]) -> Callable[[Message], tuple[Any, ...]]:
    """Generate ``def row(m): ... return (v1, v2, ...)`` for the columns.

    Mapping runs once per row on the sink's hot path: one generated function
    with inlined attribute reads costs a fraction of a loop over per-column
    getter closures. Only fixed expression templates are generated; user
    values (data keys, header names, functions) are passed as constants.
    """
    namespace: dict[str, Any] = {"_dig": _dig, "_enc": dumps, "_Missing": _Missing,
                                 "_utc": _utc}
    exprs: list[str] = []
    checks: list[str] = []
    for i, c in enumerate(columns):
        source = c.source
        if callable(source):
            namespace[f"_f{i}"] = source
            expr = f"_f{i}(m)"
        elif source in EVENT_SOURCES:
            expr = EVENT_SOURCES[source]
        elif (keys := _path(source, "data.")) is not None:
            namespace[f"_k{i}"] = keys if len(keys) > 1 else keys[0]
            expr = (f"_dig(d, _k{i})" if len(keys) > 1
                    else f"(d.get(_k{i}) if type(d) is dict else None)")
        else:
            header = source[len("event.headers."):]
            namespace[f"_k{i}"] = header
            expr = f"ev.headers.get(_k{i})"
        if c.is_json:
            expr = f"(None if (_v{i} := {expr}) is None else _enc(_v{i}))"
        exprs.append(expr)
        if not c.nullable and c.may_be_null:
            namespace[f"_n{i}"] = c.name
            checks.append(f"    if r[{i}] is None:\n        raise _Missing(_n{i})\n")
    code = (
        "def row(m):\n"
        "    ev = m.lease.event\n"
        "    d = m.data\n"
        f"    r = ({', '.join(exprs)},)\n"
        + "".join(checks)
        + "    return r\n"
    )
    exec(compile(code, "<rheo_flow.sinks row mapping>", "exec"), namespace)
    fn: Callable[[Message], tuple[Any, ...]] = namespace["row"]
    return fn
