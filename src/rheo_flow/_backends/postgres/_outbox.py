"""The application's own connection (the outbox, docs/outbox.md): which connections the
PostgreSQL backend writes on, and how its statements run inside their transactions.

The backend takes an asyncpg ``Connection``, or the proxy a pool's ``acquire()``
hands out, or a psycopg 3 ``AsyncConnection`` or ``Connection`` (:mod:`._psycopg`),
that is inside a transaction and reaches the backend's database: the same server
(its start time), the same database, and the backend's schema in it. That last
check is one round trip on the first use of a connection, remembered for as long
as the connection lives.

A statement that fails aborts the transaction it runs in: the append, which
meets event ids already stored by failing, runs there inside a function whose
exception block is a subtransaction (functions/append_guarded.sql), so that such a
failure is undone alone, in the same round trip, and the caller's transaction goes on.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

from ..._model._errors import InvalidArgument
from ._pool import Fetches, PoolCalls, driver
from ._psycopg import AsyncPsycopg, SyncPsycopg, check_psycopg, psycopg_kind

if TYPE_CHECKING:
    import asyncpg

__all__ = ["CallerConnections"]


class CallerConnections:
    """Checks an application's connection before the backend writes on it."""

    __slots__ = ("_checked", "_identity", "_schema", "_sql")

    def __init__(self, schema: str, identity_sql: str) -> None:
        self._schema = schema
        self._sql = identity_sql
        self._identity: tuple[str, str, str | None] | None = None
        # The driver's connections found on the backend's database (a proxy's own
        # connection: a pool hands out a new proxy on every acquire).
        self._checked: weakref.WeakSet[Any] = weakref.WeakSet()

    async def check(self, conn: Any, operation: str, pool: PoolCalls) -> Fetches:
        """The statements' way onto ``conn``, in its transaction;
        :class:`~rheo_flow.InvalidArgument` unless it is an asyncpg or psycopg connection
        inside a transaction on the backend's database (``pool``'s)."""
        caller, raw = _caller(conn, operation)
        if raw is not None and raw in self._checked:
            return caller
        theirs = await self._identify(caller)
        ours = self._identity
        if ours != theirs:
            # Once more from the pool: a restarted server has another start time.
            ours = self._identity = await self._identify(pool)
        _compare(operation, self._schema, ours, theirs)
        if raw is not None:
            self._checked.add(raw)
        return caller

    async def _identify(self, on: Fetches) -> tuple[str, str, str | None]:
        rows = await on.fetch(self._sql, self._schema)
        database, started, schema_oid = rows[0]
        return database, started, schema_oid


def _caller(conn: Any, operation: str) -> tuple[Fetches, Any]:
    """The statements' way onto ``conn``, and the connection to remember it checked by."""
    kind = psycopg_kind(conn)
    if kind is not None:
        check_psycopg(conn, operation)
        if kind == "async":
            return AsyncPsycopg(conn), conn
        return SyncPsycopg(conn), conn
    asyncpg = driver()
    if not isinstance(conn, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        raise InvalidArgument(
            f"{operation}(connection=...) on PostgreSQL takes an asyncpg Connection (or "
            "one acquired from an asyncpg pool) or a psycopg 3 Connection or "
            f"AsyncConnection, got {type(conn).__module__}.{type(conn).__qualname__}")
    if not conn.is_in_transaction():
        raise InvalidArgument(
            f"{operation}(connection=...) needs a connection inside a transaction "
            "(async with conn.transaction(): ...)")
    return conn, _raw(conn)


def _raw(conn: Any) -> asyncpg.Connection | None:
    """The driver's connection under a pool's proxy (asyncpg keeps it in ``_con``)."""
    raw = getattr(conn, "_con", conn)
    return raw if isinstance(raw, driver().Connection) else None


def _compare(operation: str, schema: str, ours: tuple[str, str, str | None],
             theirs: tuple[str, str, str | None]) -> None:
    """Refuse a connection whose identity is not the backend's: no URL, no password."""
    prefix = f"{operation}(connection=...) needs a connection to the backend's database"
    if theirs[1] != ours[1]:
        raise InvalidArgument(f"{prefix}: this one reaches another PostgreSQL server")
    if theirs[0] != ours[0]:
        raise InvalidArgument(
            f"{prefix} ({ours[0]!r}): this one reaches database {theirs[0]!r}")
    if theirs[2] is None:
        raise InvalidArgument(
            f"{prefix}: schema {schema!r} does not exist on the database this one reaches")
    if theirs[2] != ours[2]:  # pragma: no cover - same server and database, same oid
        raise InvalidArgument(f"{prefix}: schema {schema!r} is another one there")
