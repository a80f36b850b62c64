"""``connection=`` on :class:`~rheo_flow.Rheo`'s ``append`` and ``ack``: writing in the
application's own transaction (docs/outbox.md), on a backend declaring
``capabilities.in_transaction``.

The connection may also be SQLAlchemy's (``AsyncConnection``, ``AsyncSession``,
``Connection``, ``Session``) on a driver a backend takes (:data:`SUPPORTED_DRIVERS`), or
Django's (``django.db.connection``, through the synchronous client):
:func:`driver_connection` unwraps it to the driver connection. Neither library is
imported here: an object is one of their types only if their modules are loaded
already (``sys.modules``)."""

from __future__ import annotations

import sys
from collections.abc import Awaitable, Callable
from typing import Any

from .._backend import Backend
from .._model._errors import InvalidArgument
from .._model._lease import Lease
from .._model._settle_results import SettleResult

__all__ = ["ack_in_transaction", "check_in_transaction", "driver_connection",
           "open_in_transaction", "sync_driver_connection"]

SettleCall = Callable[[str, list[Lease], Callable[[], Awaitable[list[SettleResult]]]],
                      Awaitable[list[SettleResult]]]
"""The facade's settle call: the operation, the leases, the backend call to classify."""


def check_in_transaction(backend: Backend, operation: str) -> None:
    """Refuse ``connection=`` on a backend that cannot write in a caller's transaction."""
    if not backend.capabilities.in_transaction:
        raise InvalidArgument(
            f"{operation}(connection=...) needs a backend that writes in the "
            f"application's transaction; backend {backend.name!r} does not "
            f"(capabilities.in_transaction is false)")


SUPPORTED_DRIVERS = {"postgresql": ("asyncpg", "psycopg"), "sqlite": ("pysqlite",)}
"""SQLAlchemy dialect name -> the drivers whose connection a backend takes: asyncpg's
``Connection`` or psycopg 3's ``AsyncConnection``/``Connection`` (PostgreSQL), the
standard library's ``sqlite3.Connection`` (SQLite)."""


def _check_dialect(dialect: Any) -> None:
    name, driver = dialect.name, dialect.driver
    if driver not in SUPPORTED_DRIVERS.get(name, ()):
        raise InvalidArgument(
            f"connection=: a SQLAlchemy connection of dialect {name}+{driver} is not "
            f"supported; use postgresql+asyncpg (asyncpg) or postgresql+psycopg (psycopg 3) "
            f"for PostgreSQL, or sqlite:// (sqlite+pysqlite, the standard library's "
            f"sqlite3) for SQLite")


def _check_begun(connection: Any) -> None:
    """Refuse a SQLAlchemy connection outside a transaction on psycopg: psycopg's own
    connection, outside autocommit, cannot tell (it begins one at its next statement,
    which SQLAlchemy would roll back when the connection goes back to its pool)."""
    if connection.dialect.driver == "psycopg" and not connection.in_transaction():
        raise InvalidArgument(
            "connection= needs a SQLAlchemy connection inside a transaction "
            "(with engine.begin() as conn: ..., or a session's)")


def _is_django(connection: Any) -> bool:
    """Whether ``connection`` is Django's ``django.db.connection`` or one of
    ``django.db.connections`` (Django is never imported here either)."""
    # django.db.connection is a proxy; the wrapper's module loads at its first use.
    proxy = sys.modules.get("django.utils.connection")
    if proxy is not None and isinstance(connection, proxy.ConnectionProxy):
        return True
    base = sys.modules.get("django.db.backends.base.base")
    return base is not None and isinstance(connection, base.BaseDatabaseWrapper)


def _django_connection(connection: Any) -> Any:
    """The driver connection under Django's connection, connecting it if it is not yet;
    ``None`` for anything else."""
    if not _is_django(connection):
        return None
    if connection.vendor not in ("postgresql", "sqlite"):
        raise InvalidArgument(
            f"connection=: a Django connection to {connection.vendor} is not supported; "
            "use Django's postgresql backend (with psycopg 3) or its sqlite3 backend")
    connection.ensure_connection()
    return connection.connection


def sync_driver_connection(connection: Any) -> Any:
    """The driver connection under a SQLAlchemy ``Session`` or ``Connection``, or under
    Django's connection (blocking: a session's ``connection()`` may check out a
    connection and begin its transaction); any other object as it is."""
    django = _django_connection(connection)
    if django is not None:
        return django
    orm = sys.modules.get("sqlalchemy.orm")
    if orm is not None and isinstance(connection, orm.Session):
        connection = connection.connection()
    engine = sys.modules.get("sqlalchemy.engine")
    if engine is not None and isinstance(connection, engine.Connection):
        _check_dialect(connection.dialect)
        _check_begun(connection)
        return connection.connection.driver_connection
    return connection


async def driver_connection(connection: Any) -> Any:
    """The driver connection under a SQLAlchemy ``AsyncSession``, ``AsyncConnection``,
    ``Session`` or ``Connection``; any other object is returned as it is (the backend
    checks it). A session's ``connection()`` begins its transaction if none is open.
    SQLAlchemy's asyncpg dialect sends ``BEGIN`` with its first statement: if the
    SQLAlchemy connection is in a transaction the driver has not begun yet, a
    ``SELECT 1`` through it begins it, so the backend finds it open (psycopg begins
    one itself with the backend's first statement)."""
    if _is_django(connection):
        raise InvalidArgument(
            "connection=: Django's connection is synchronous; append and ack with it "
            "through rheo_flow.sync.Rheo (from a synchronous view, or sync_to_async)")
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    if asyncio_ext is not None:
        if isinstance(connection, asyncio_ext.AsyncSession):
            connection = await connection.connection()
        if isinstance(connection, asyncio_ext.AsyncConnection):
            _check_dialect(connection.dialect)
            _check_begun(connection)
            driver = (await connection.get_raw_connection()).driver_connection
            if (connection.dialect.driver == "asyncpg" and connection.in_transaction()
                    and not driver.is_in_transaction()):
                await connection.exec_driver_sql("SELECT 1")
            return driver
    return sync_driver_connection(connection)


async def open_in_transaction(backend: Backend, operation: str, connection: Any) -> Any:
    """:func:`check_in_transaction`, then the driver connection to hand the backend."""
    check_in_transaction(backend, operation)
    return await driver_connection(connection)


async def ack_in_transaction(backend: Backend, settle_call: SettleCall, leases: list[Lease],
                             connection: Any) -> list[SettleResult]:
    """Ack ``leases`` on ``connection``: results classified as every ack's, except that a
    connection the backend refuses raises its :class:`InvalidArgument` (a mistake of the
    call, not an outcome of the leases)."""
    connection = await open_in_transaction(backend, "ack", connection)
    refused: list[InvalidArgument] = []

    async def call() -> list[SettleResult]:
        try:
            return await backend.ack_in_transaction(connection, leases)
        except InvalidArgument as exc:
            refused.append(exc)
            raise

    results = await settle_call("ack", leases, call)
    if refused:
        raise refused[0]
    return results
