"""psycopg 3 connections of the application (the outbox, docs/outbox.md), as the
PostgreSQL backend's statements run on them.

The backend's SQL is asyncpg's, with ``$1`` placeholders: psycopg's raw cursors
(``RawCursor``, ``AsyncRawCursor``, psycopg 3.2 and later) take it as it is, so
one text of each statement serves both drivers. Every parameter the outbox sends
is a number, a text, a list of texts or NULL, and each statement casts what needs
a type (``$2::text::integer[]``): psycopg's own adaptation of those suffices.
Rows come back as :class:`Row`, read by position and by column name as asyncpg's
records are.

psycopg is never imported here: a connection is one of its types only if the
application loaded it (``sys.modules``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any, Final

from ..._model._errors import InvalidArgument
from ..._support._blocking import call_blocking

__all__ = ["AsyncPsycopg", "Row", "SyncPsycopg", "check_psycopg", "psycopg_kind"]

_NOT_IN_TRANSACTION: Final = (
    "(with conn.transaction(): ..., or a statement of the application's first on a "
    "connection that is not in autocommit)")


def psycopg_kind(conn: object) -> str | None:
    """``"async"`` for a psycopg 3 ``AsyncConnection``, ``"sync"`` for a ``Connection``,
    else None."""
    psycopg = sys.modules.get("psycopg")
    if psycopg is None:
        return None
    if isinstance(conn, psycopg.AsyncConnection):
        return "async"
    return "sync" if isinstance(conn, psycopg.Connection) else None


def check_psycopg(conn: Any, operation: str) -> None:
    """Refuse a psycopg connection that is not in a transaction the application ends.

    In a transaction (``INTRANS``), or idle outside autocommit: psycopg then begins
    one with the backend's first statement (as the DB-API says), and the
    application's ``commit()`` or ``rollback()`` ends it with its own writes.
    """
    from psycopg.pq import TransactionStatus

    status = conn.info.transaction_status
    if status == TransactionStatus.INTRANS:
        return
    if status == TransactionStatus.IDLE and not conn.autocommit:
        return
    if status == TransactionStatus.INERROR:
        raise InvalidArgument(
            f"{operation}(connection=...): the connection's transaction has failed; roll "
            "it back first")
    if status == TransactionStatus.IDLE:
        raise InvalidArgument(
            f"{operation}(connection=...) needs a connection inside a transaction "
            f"{_NOT_IN_TRANSACTION}; this one is in autocommit, outside any")
    raise InvalidArgument(
        f"{operation}(connection=...) needs a connection inside a transaction "
        f"{_NOT_IN_TRANSACTION}; this one is {status.name}")


class Row(tuple[Any, ...]):
    """A row: a tuple, also read by column name (``row["bad_idx"]``)."""

    names: dict[str, int]

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return tuple.__getitem__(self, self.names[key])
        return tuple.__getitem__(self, key)


def _row_factory(cursor: Any) -> Any:
    names = {column.name: i for i, column in enumerate(cursor.description or ())}

    def make(values: Sequence[Any]) -> Row:
        row = Row(values)
        row.names = names
        return row

    return make


class AsyncPsycopg:
    """A psycopg ``AsyncConnection`` as the backend's statements use it."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """The rows of ``sql`` with ``args`` for its ``$n`` placeholders."""
        from psycopg import AsyncRawCursor

        async with AsyncRawCursor(self._conn, row_factory=_row_factory) as cursor:
            await cursor.execute(sql, args)
            rows: list[Any] = await cursor.fetchall()
        return rows


class SyncPsycopg:
    """A sync psycopg ``Connection`` as the backend's statements use it: each
    :meth:`fetch` is one blocking call (:func:`~rheo_flow._support._blocking.call_blocking`)."""

    __slots__ = ("_conn",)

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """The rows of ``sql`` with ``args`` for its ``$n`` placeholders."""
        rows: list[Any] = await call_blocking(lambda: self._fetch(sql, args), in_thread=True)
        return rows

    def _fetch(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        from psycopg import RawCursor

        with RawCursor(self._conn, row_factory=_row_factory) as cursor:
            cursor.execute(sql, args)
            rows: list[Any] = cursor.fetchall()
        return rows
