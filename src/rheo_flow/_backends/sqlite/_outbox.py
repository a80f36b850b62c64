"""Writing in the application's transaction (docs/outbox.md): an operation run on the
caller's own ``sqlite3`` connection, inside the transaction it has open.

The operation is the very function the backend thread runs (``_events.append``,
``_settle.settle``): one home for the rules. It runs in the caller's thread, on
the caller's connection, synchronously: nothing is awaited between taking
SQLite's write lock and returning, so the caller's event loop never waits on the
backend thread while its transaction holds the lock.

What is checked first, each an :class:`~rheo_flow.InvalidArgument`: the connection
is a ``sqlite3.Connection`` usable in this thread, it is inside a transaction
(``in_transaction``), and its main database is the backend's file (a private
``:memory:`` database is refused: no other connection reaches it). The operation
then takes the write lock with a write statement that changes nothing, before it
reads anything: a deferred ``BEGIN`` waits for the lock (the connection's own
timeout) instead of reading a snapshot another writer may outdate. The schema
must be the backend's (it created or checked it on opening). The statements run
inside a savepoint: an error undoes them and leaves the caller's own writes
(SQLite's errors that end the whole transaction aside). The caller's
``row_factory`` and ``text_factory`` are set aside for the call.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable
from typing import TypeVar

from ..._model._errors import BackendError, BackendUnavailable, InvalidArgument
from ..._model._failure import describe
from ..._model._settle_results import SettleKind
from . import _sql as sql
from ._errors import classify_error, is_locked
from ._schema import SCHEMA_VERSION

__all__ = ["in_transaction"]

T = TypeVar("T")


def in_transaction(connection: object, path: str,
                   work: Callable[[sqlite3.Connection], T]) -> T:
    """``work`` run on the application's ``connection`` to the database at ``path``,
    inside the transaction it has open; its result. SQLite's errors become
    :class:`~rheo_flow.BackendError` (nothing is committed: the application's
    transaction decides)."""
    if not isinstance(connection, sqlite3.Connection):
        kind = type(connection)
        raise InvalidArgument(
            "connection= on the SQLite backend takes a sqlite3.Connection (the standard "
            "library's, or a subclass) to the backend's database file, got "
            f"{kind.__module__}.{kind.__qualname__}")
    conn = connection
    if path == ":memory:":
        raise InvalidArgument(
            "the SQLite backend's database is a private in-memory one (:memory:), which no "
            "other connection reaches: writing in the application's transaction needs a "
            "database file")
    saved = conn.row_factory, conn.text_factory
    conn.row_factory, conn.text_factory = None, str
    try:
        _check(conn, path)
        return _in_savepoint(conn, work)
    except sqlite3.Error as exc:
        raise _translated(exc, path, conn) from exc
    finally:
        with contextlib.suppress(sqlite3.ProgrammingError):
            conn.row_factory, conn.text_factory = saved


def _check(conn: sqlite3.Connection, path: str) -> None:
    """The connection is in a transaction on the backend's file, holds the write
    lock (taken here) and has the backend's schema."""
    try:
        open_transaction = conn.in_transaction
        databases = conn.execute(sql.DATABASE_LIST).fetchall()
    except sqlite3.ProgrammingError as exc:  # closed, or bound to another thread
        raise InvalidArgument(f"connection cannot be used here: {exc}") from exc
    if not open_transaction:
        raise InvalidArgument(
            "connection is not inside a transaction: begin one first "
            "(conn.execute('BEGIN IMMEDIATE'), or a write of the application's such as an "
            "INSERT under sqlite3's default isolation_level), then commit it after this call")
    main = next((str(row[2]) for row in databases if row[1] == "main"), "")
    if not main or not _same_file(main, path):
        reached = repr(main) if main else "a private in-memory or temporary database"
        raise InvalidArgument(
            f"connection reaches {reached}, not the backend's database file {path!r} "
            "(its main database must be that file)")
    try:
        conn.execute(sql.TAKE_WRITE_LOCK)
    except sqlite3.OperationalError as exc:
        if "no such table" not in str(exc):
            raise
        raise InvalidArgument(
            f"SQLite database {path!r} has no rheo_flow schema yet: open the backend "
            "(any operation of it does) before writing in the application's transaction"
        ) from exc
    version = conn.execute(sql.GET_VERSION).fetchone()[0]
    if version != SCHEMA_VERSION:
        raise InvalidArgument(
            f"SQLite database {path!r} has schema version {version}, this rheo-flow "
            f"writes {SCHEMA_VERSION}: open the backend (or run  rheo-flow migrate) first")


def _in_savepoint(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], T]) -> T:
    conn.execute(sql.SAVEPOINT_OUTBOX)
    try:
        result = work(conn)
    except BaseException:
        if conn.in_transaction:  # else SQLite ended the whole transaction
            with contextlib.suppress(sqlite3.Error):
                conn.execute(sql.ROLLBACK_TO_SAVEPOINT_OUTBOX)
                conn.execute(sql.RELEASE_SAVEPOINT_OUTBOX)
        raise
    conn.execute(sql.RELEASE_SAVEPOINT_OUTBOX)
    return result


@functools.lru_cache(maxsize=64)
def _same_file(found: str, path: str) -> bool:
    """Whether the paths name one file (remembered: otherwise every append in the
    application's transaction resolves both paths again)."""
    if os.path.realpath(found) == os.path.realpath(path):
        return True
    try:
        return os.path.samefile(found, path)
    except OSError:
        return False


def _translated(exc: sqlite3.Error, path: str, conn: sqlite3.Connection) -> BackendError:
    """SQLite's error in the application's transaction, as rheo_flow's (with what to do)."""
    reason = describe(exc)
    if is_locked(exc):
        reason += (
            " (the application's transaction could not take SQLite's write lock: another "
            "connection held it past this connection's timeout, or the transaction had "
            "read before another connection committed; begin it with BEGIN IMMEDIATE, "
            "roll back and retry)")
    with contextlib.suppress(sqlite3.ProgrammingError):
        if not conn.in_transaction:
            reason += "; SQLite rolled the application's whole transaction back"
    message = f"SQLite database {path!r}: {reason}"
    if classify_error(exc) is SettleKind.BACKEND_UNAVAILABLE:
        return BackendUnavailable(message)
    # Nothing is committed until the application commits: never ambiguous here.
    return BackendError(message, SettleKind.FAILED.value)
