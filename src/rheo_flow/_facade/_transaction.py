"""Read, process, write exactly once (docs/outbox.md): :meth:`Rheo.transaction
<rheo_flow.Rheo.transaction>` acks a handler's leases, its own writes and the events it
derives in one commit of the application's transaction, or none of them.

The acks go last, just before the commit: a lease found stale then (its event leased
again elsewhere, or settled already) rolls the whole transaction back and raises
:class:`~rheo_flow.StaleLease`. Half of it is never committed:

* a driver connection outside a transaction (asyncpg, ``sqlite3``): the helper begins
  the transaction, commits it, or rolls it back;
* one inside a transaction (the caller's ``async with conn.transaction():``, a
  SQLAlchemy ``session.begin()``): the caller commits; after a failed ack the helper
  rolls SQLite's transaction back, and makes PostgreSQL's fail (a commit then rolls it
  back), before it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import weakref
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol, Self

from .._model._errors import BackendError, InvalidArgument, StaleLease
from .._model._event import Event, NewEvent
from .._model._lease import Lease
from .._model._settle_results import SettleKind, SettleResult
from ._in_transaction import check_in_transaction, driver_connection

__all__ = ["Transaction"]

_DOOM = ("DO $$ BEGIN RAISE EXCEPTION 'rheo_flow: an ack of this transaction did not take "
         "effect (stale lease): it can only roll back'; END $$")
"""Makes a PostgreSQL transaction fail: its ``COMMIT`` then rolls it back."""

_LOST = (SettleKind.STALE_LEASE, SettleKind.RECEIPT_MISMATCH)

_SQLITE_TURNS: weakref.WeakKeyDictionary[Any, asyncio.Lock] = weakref.WeakKeyDictionary()
"""One lock per SQLite backend: the SQLite transactions this helper begins in a process
take turns. sqlite3 waits for the write lock synchronously, in the event loop's thread:
a second handler's ``BEGIN IMMEDIATE`` would block the loop while the first, holding the
lock, waits in an ``await`` the loop never resumes."""


class _Facade(Protocol):
    """What the transaction uses of :class:`~rheo_flow.Rheo` (named structurally: the
    facade imports this module)."""

    @property
    def backend(self) -> Any: ...

    async def append(self, stream: str, events: Any, *, key: str | None = None,
                     partition: int | None = None, connection: Any = None) -> list[Event]: ...

    async def ack(self, leases: Any, *, connection: Any = None) -> list[SettleResult]: ...


class Transaction:
    """One read-process-write step in the application's transaction: ``async with
    rheo.transaction(conn, leases) as tx:``. Write your rows on ``conn`` and append the
    derived events with :meth:`append`; at the end of the block the leases are acked in
    the same transaction, before it commits.

    An ack that fails rolls everything back and raises :class:`~rheo_flow.StaleLease`
    when its lease was lost (stale, or acked already by an earlier commit), else a
    :class:`~rheo_flow.BackendError` of its kind; an exception raised in the block rolls
    it back too.
    After the block, :attr:`results` holds the acks' results and :attr:`events` the
    events appended.
    """

    __slots__ = ("_connection", "_driver", "_leases", "_owned", "_rheo", "_turn", "events",
                 "results")

    def __init__(self, rheo: _Facade, connection: Any,
                 leases: Lease | Iterable[Lease]) -> None:
        check_in_transaction(rheo.backend, "transaction")
        if connection is None:
            raise InvalidArgument("transaction() needs the application's connection")
        unique: dict[str, Lease] = {}
        for lease in [leases] if isinstance(leases, Lease) else leases:
            if not isinstance(lease, Lease):
                raise InvalidArgument(f"expected Lease objects, got {type(lease).__name__}")
            unique.setdefault(lease.lease_id, lease)
        items = list(unique.values())
        self._rheo = rheo
        self._connection = connection
        self._leases = items
        self._driver: Any = None
        self._owned: Any = None
        self._turn: asyncio.Lock | None = None
        self.events: list[Event] = []
        """The events :meth:`append` stored, in order."""
        self.results: list[SettleResult] = []
        """The acks' results, one per lease (set at the end of the block)."""

    @property
    def connection(self) -> Any:
        """The driver connection the statements run on (under a SQLAlchemy object, its
        asyncpg or ``sqlite3`` connection)."""
        if self._driver is None:
            raise InvalidArgument("the transaction is not open: use it in `async with`")
        return self._driver

    async def append(
        self, stream: str,
        events: NewEvent | Mapping[str, Any] | Iterable[NewEvent | Mapping[str, Any]],
        *, key: str | None = None, partition: int | None = None,
    ) -> list[Event]:
        """:meth:`Rheo.append <rheo_flow.Rheo.append>` in this transaction: the events
        are visible once it commits, and never if it rolls back."""
        stored = await self._rheo.append(stream, events, key=key, partition=partition,
                                         connection=self.connection)
        self.events.extend(stored)
        return stored

    async def __aenter__(self) -> Self:
        connection = self._connection
        if _is_sqlalchemy(connection):
            if not connection.in_transaction():
                raise InvalidArgument(
                    "transaction(): begin the SQLAlchemy transaction first and commit it "
                    "yourself: `async with session.begin(), rheo.transaction(session, "
                    "leases) as tx:`")
            self._driver = await driver_connection(connection)
            return self
        self._driver = connection
        if not _in_transaction(connection):
            if _is_sqlite(connection):
                turn = _SQLITE_TURNS.setdefault(self._rheo.backend, asyncio.Lock())
                await turn.acquire()
                self._turn = turn
            try:
                self._owned = await _begin(connection)
            except BaseException:
                self._release()
                raise
        return self

    def _release(self) -> None:
        turn, self._turn = self._turn, None
        if turn is not None:
            turn.release()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            await self._end(exc)
        finally:
            self._release()

    async def _end(self, exc: BaseException | None) -> None:
        driver = self.connection
        if exc is not None:
            if self._owned is not None:
                await _rollback(driver, self._owned)
            return
        results = await self._rheo.ack(self._leases, connection=driver) if self._leases else []
        self.results = results
        # A repeated ack means an earlier transaction committed this one's work already.
        failed = [(lease, r) for lease, r in zip(self._leases, results, strict=True)
                  if not r.ok or r.repeated]
        if failed:
            await self._undo(driver)
            raise _failure(failed, results)
        if self._owned is not None:
            await _commit(driver, self._owned)

    async def _undo(self, driver: Any) -> None:
        """Roll back (owned), or leave the caller's transaction able only to roll back."""
        if self._owned is not None:
            await _rollback(driver, self._owned)
        elif _is_sqlite(driver):
            with contextlib.suppress(_sqlite3().Error):
                driver.rollback()
        elif _is_asyncpg(driver):
            with contextlib.suppress(Exception):
                await driver.execute(_DOOM)


def _failure(failed: list[tuple[Lease, SettleResult]],
             results: list[SettleResult]) -> BackendError:
    """The error of acks that did not take effect (the transaction is rolled back):
    :class:`~rheo_flow.StaleLease` when leases were lost (stale, or acked already),
    else a :class:`~rheo_flow.BackendError` of the first failure's kind."""
    lost = [(lease, r) for lease, r in failed if r.error is None or r.error.kind in _LOST]
    lease, first = (lost or failed)[0]
    error = first.error
    kind = error.kind if error is not None else SettleKind.STALE_LEASE
    reason = error.reason if error is not None else (
        "acked already, by an earlier transaction that committed")
    what = "lost (stale)" if lost else f"not acked ({kind.value})"
    message = (f"{len(lost or failed)} of {len(results)} leases {what}, first {lease.stream}/"
               f"{lease.group} p{lease.partition} s{lease.sequence}: {reason}; the "
               "application's transaction was rolled back")
    if not lost:
        return BackendError(message, kind.value)
    return StaleLease(message, [lease for lease, _ in lost], results, kind.value)


def _is_sqlalchemy(connection: object) -> bool:
    return type(connection).__module__.startswith("sqlalchemy.") and (
        "sqlalchemy" in sys.modules)


def _sqlite3() -> Any:
    """The standard library's sqlite3, once loaded (a ``sqlite3.Connection`` exists only
    then: importing it here would load it for every program using rheo_flow)."""
    return sys.modules["sqlite3"]


def _is_sqlite(connection: object) -> bool:
    module = sys.modules.get("sqlite3")
    return module is not None and isinstance(connection, module.Connection)


def _is_asyncpg(connection: object) -> bool:
    return type(connection).__module__.startswith("asyncpg")


def _in_transaction(connection: Any) -> bool:
    if _is_sqlite(connection):
        try:
            return bool(connection.in_transaction)
        except _sqlite3().ProgrammingError as exc:
            raise InvalidArgument(f"connection cannot be used here: {exc}") from exc
    if _is_asyncpg(connection):
        return bool(connection.is_in_transaction())
    return True  # another kind: the backend checks it at the first call


async def _begin(connection: Any) -> Any:
    """Begin a transaction on a driver connection; its handle for commit and rollback."""
    if _is_sqlite(connection):
        # The write lock at once: a deferred BEGIN that reads first may not get it later.
        connection.execute("BEGIN IMMEDIATE")
        return connection
    transaction = connection.transaction()
    await transaction.start()
    return transaction


async def _commit(driver: Any, owned: Any) -> None:
    if _is_sqlite(driver):
        driver.commit()
    else:
        await owned.commit()


async def _rollback(driver: Any, owned: Any) -> None:
    if _is_sqlite(driver):
        with contextlib.suppress(_sqlite3().Error):
            driver.rollback()
    else:
        with contextlib.suppress(Exception):
            await owned.rollback()
