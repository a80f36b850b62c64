"""The :class:`SQLiteBackend` class: settings, lifecycle, and the contract's operations.

Each operation is one function of this package run in the backend thread
(:mod:`._writer`) inside one transaction: reads open with ``BEGIN``, writes
with ``BEGIN IMMEDIATE``.
"""

from __future__ import annotations

import functools
import os
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Concatenate, Final, ParamSpec, TypeVar
from urllib.parse import parse_qsl, unquote

from ..._backend import AppendRecord, Backend
from ..._model._capabilities import Capabilities
from ..._model._errors import BackendError, InvalidArgument
from ..._model._event import Event
from ..._model._failure import describe
from ..._model._lag import LagReport
from ..._model._lease import Lease
from ..._model._query import Query
from ..._model._settle_results import SettleKind, SettleResult
from ..._model._stream import (
    PAUSED_UNTIL_RESUMED,
    DeadLetter,
    GroupInfo,
    Retention,
    StartPosition,
    StreamInfo,
)
from ..._support._blocking import call_blocking
from ..._support._clock import Clock, system_clock
from .._guard import DEFAULT_TIMEOUT_MS, check_timeout_ms, guard_operations
from .._issued_runs import IssuedRuns, Run
from .._shared import Waiters
from .._transitions import Op
from .._urls import redact_url, url_flag
from . import _catalog, _events, _lag, _progress, _settle
from ._errors import classify_error, is_locked
from ._fetch import Fetcher, FreshRange, leases_of
from ._outbox import in_transaction
from ._ranges import range_token
from ._schema import connect
from ._writer import Writer

__all__ = ["DEFAULT_BUSY_TIMEOUT_MS", "SQLiteBackend"]

P = ParamSpec("P")
T = TypeVar("T")

DEFAULT_BUSY_TIMEOUT_MS: Final = 5_000
_SYNCHRONOUS: Final = ("NORMAL", "FULL", "EXTRA")
_URL_OPTIONS: Final = ("busy_timeout_ms", "migrate", "synchronous", "timeout_ms")

# In-process wake-ups: an append through any backend on a file wakes the waiters
# of every backend on that file in this process (whatever their loop). Appends by
# other processes are not seen here; callers wait with a timeout (``poll_ms``),
# which is the cross-process fallback.
_APPEND_WAITERS: Final = Waiters()


@guard_operations(tracks_sending=False)
class SQLiteBackend(Backend):
    """Durable single-node backend in one SQLite file (``sqlite:///events.db``).

    Several processes on one machine may share the file: claims and settles run in
    ``BEGIN IMMEDIATE`` transactions, so no delivery is ever leased twice. It is
    still ``distributed=False``: SQLite is not a network store, so competing
    consumers on several machines need PostgreSQL, Redis or MongoDB.

    ``synchronous`` is SQLite's durability setting. ``"FULL"`` (the default, and
    SQLite's own) syncs the write-ahead log on every commit, so an acknowledged
    write survives a power loss; ``"NORMAL"`` skips that sync and is much faster,
    still surviving a crash of the process but possibly losing the last commits
    on a crash of the machine. ``busy_timeout_ms`` bounds how long a write waits for
    another process's transaction. ``clock`` returns epoch milliseconds (lease
    deadlines use it); tests pass a :class:`~rheo_flow.ManualClock`.

    The connection lives in one dedicated thread; operations open the backend on
    first use when :meth:`open` was not called.

    ``migrate=False`` (URL option ``?migrate=false``) opens an existing database
    only: a missing file, or one without the current rheo_flow schema, is an error
    naming ``rheo-flow migrate``, and nothing is created (the CLI's read-only
    commands open so).

    ``append`` and ``ack`` also write in the application's own transaction, on its
    ``sqlite3.Connection`` to the same file (``connection=``; docs/outbox.md).

    ``timeout_ms`` bounds how long a caller waits for its operation (by default
    ``busy_timeout_ms`` plus 10 s). An operation given up on may still commit in
    the backend thread: a write then raises :class:`~rheo_flow.OutcomeUnknown`.
    """

    name = "sqlite"
    _CAPABILITIES = Capabilities(
        durable=True, distributed=False, push_wakeups=True, server_clock=False, pause=True,
        key_ordering=True, last_error=True, in_transaction=True, delayed_delivery=True,
        retention=True,
    )

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Clock | None = None,
        busy_timeout_ms: int = DEFAULT_BUSY_TIMEOUT_MS,
        synchronous: str = "FULL",
        timeout_ms: int | None = None,
        migrate: bool = True,
    ) -> None:
        if not isinstance(path, str | os.PathLike) or not os.fspath(path):
            raise InvalidArgument(f"SQLite database path must be a non-empty path, got {path!r}")
        if isinstance(busy_timeout_ms, bool) or not isinstance(busy_timeout_ms, int) or (
            busy_timeout_ms < 0
        ):
            raise InvalidArgument(
                f"busy_timeout_ms must be a non-negative integer, got {busy_timeout_ms!r}"
            )
        mode = synchronous.upper() if isinstance(synchronous, str) else synchronous
        if mode not in _SYNCHRONOUS:
            raise InvalidArgument(
                f"synchronous must be one of {', '.join(_SYNCHRONOUS)}, got {synchronous!r}"
            )
        self._timeout_ms = (busy_timeout_ms + DEFAULT_TIMEOUT_MS if timeout_ms is None
                            else check_timeout_ms(timeout_ms))
        self._deadline_grace_ms = 0
        self._path = os.fspath(path)
        self._clock: Clock = clock or system_clock
        self._writer = Writer(
            functools.partial(connect, self._path, busy_timeout_ms, mode, bool(migrate)),
            self._path)
        self._issued = IssuedRuns(range_token)
        self._lent = False  # wrote in an application's transaction (the lock hint)
        self._fetcher = Fetcher(self._clock, self._path, self._issued)

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> SQLiteBackend:
        """Build from ``sqlite:///relative.db``, ``sqlite:////absolute/path.db`` or
        ``sqlite:///:memory:`` (one private in-memory database, gone on close).

        Options go in the query string: ``?synchronous=normal&busy_timeout_ms=10000``,
        ``?migrate=false`` (open an existing database only).
        """
        prefix = "sqlite://"
        if not isinstance(url, str) or not url.lower().startswith(prefix):
            raise InvalidArgument(f"not an SQLite URL: {url!r} (expected sqlite:///path.db)")
        rest, _, query = url[len(prefix):].partition("?")
        if not rest.startswith("/"):
            raise InvalidArgument(
                f"SQLite URL {redact_url(url)!r} names a host; use sqlite:///relative.db "
                "or sqlite:////absolute/path.db"
            )
        path = unquote(rest[1:])
        if not path:
            raise InvalidArgument(f"SQLite URL {redact_url(url)!r} has no database path")
        return cls(path, clock=clock, **_url_options(query))

    @property
    def capabilities(self) -> Capabilities:
        """Durable, single-node, client clock; in-process push wake-ups.

        Appends made in this process wake its idle consumers at once; appends by
        other processes on the same file are seen at the consumers' next poll.
        """
        return self._CAPABILITIES

    @property
    def path(self) -> str:
        """The database file (``":memory:"`` for a private in-memory database)."""
        return self._path

    # Lifecycle and errors ----------------------------------------------------

    async def open(self) -> None:
        await self._writer.open()

    async def close(self) -> None:
        await self._writer.close()

    def _error_prefix(self) -> str:
        return f"SQLite database {self._path!r}"

    def _scrub(self, text: str) -> str:
        return text  # SQLite's messages hold no credentials

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        """Map ``sqlite3`` errors by their primary result code (see ``_errors.classify_error``)."""
        return classify_error(exc)

    async def _read(
        self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        return await self._run(False, lambda conn: fn(conn, *args, **kw))

    async def _write(
        self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        return await self._run(True, lambda conn: fn(conn, *args, **kw))

    async def _run(self, write: bool, call: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return await self._writer.run(write, call)
        except sqlite3.OperationalError as exc:
            if not (self._lent and is_locked(exc)):
                raise
            # The likeliest holder of the lock is then an application's transaction
            # of this process awaiting this very operation (docs/outbox.md, "SQLite").
            raise BackendError(
                f"{self._error_prefix()}: {describe(exc)} (the write lock stayed held past "
                "busy_timeout_ms; this backend wrote in an application's transaction "
                "(connection=...): if that transaction is still open while its task awaits "
                "the backend, it waits for itself. Commit or roll back before awaiting other "
                "operations of the backend, see docs/outbox.md)",
                SettleKind.FAILED.value) from exc

    # Streams -----------------------------------------------------------------

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        return await self._write(_catalog.create_stream, self._clock, name, partitions)

    async def stream_info(self, name: str) -> StreamInfo:
        return await self._read(
            lambda conn: _catalog.stream_info(conn, _catalog.get_stream(conn, name)))

    async def list_streams(self) -> list[str]:
        return await self._read(_catalog.list_streams)

    async def set_retention(self, stream: str, retention: Retention | None) -> None:
        await self._write(_catalog.set_retention, stream, retention)

    async def now_ms(self) -> int:
        return self._clock()

    async def describe_streams(self) -> list[tuple[StreamInfo, list[GroupInfo]]]:
        return await self._read(_catalog.describe_streams, self._clock())

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        events = await self._write(_events.append, self._clock, stream, list(records))
        if events:
            _APPEND_WAITERS.wake((self._wake_key, stream))
            if self._clock is system_clock:  # the timers run on the system's clock
                _APPEND_WAITERS.wake_at((self._wake_key, stream), records, self._clock())
        return events

    async def append_in_transaction(self, connection: Any, stream: str,
                                    records: Sequence[AppendRecord]) -> list[Event]:
        """:meth:`append` on the application's ``sqlite3.Connection`` to this database
        file, inside the transaction it has open (docs/outbox.md, "SQLite").

        Runs in the caller's thread, on that connection, awaiting nothing. Waiters of
        this process are not woken (the events are not visible before the commit):
        consumers find them at their next poll, or at once after
        :meth:`notify_appended`.
        """
        clock, items = self._clock, list(records)
        return await self._in_transaction(
            connection, lambda conn: _events.append(conn, clock, stream, items))

    async def ack_in_transaction(self, connection: Any, leases: Sequence[Lease]
                                 ) -> list[SettleResult]:
        """:meth:`ack` on the application's connection, as for
        :meth:`append_in_transaction`: one result per lease; a stale lease's ack
        fails and does not abort the application's transaction."""
        clock, items = self._clock, list(leases)
        # Full checks (no lease vouched for): the identity registry of _issued_runs is
        # the backend thread's shortcut, not needed here.
        return await self._in_transaction(
            connection, lambda conn: _settle.settle(conn, clock, items, "ack", "", 0))

    async def _in_transaction(self, connection: Any,
                              call: Callable[[sqlite3.Connection], T]) -> T:
        """``call`` on the application's connection, in the thread it belongs to: this one
        (awaiting nothing), or the thread waiting on the synchronous client
        (:mod:`~rheo_flow._support._blocking`)."""
        def work(conn: sqlite3.Connection) -> T:
            self._lent = True  # the application's transaction holds the write lock now
            return call(conn)

        return await call_blocking(lambda: in_transaction(connection, self._path, work),
                                   in_thread=False)

    def notify_appended(self, stream: str) -> None:
        """Wake this process's consumers idle on ``stream``, on every backend object on
        this file: call it after committing a transaction that appended to ``stream``
        with ``connection=`` (else they find the events at their next poll). A call
        after a rollback only wakes them for nothing."""
        _APPEND_WAITERS.wake((self._wake_key, stream))

    @property
    def _wake_key(self) -> str:
        # A private :memory: database is only visible to this backend object.
        if self._path == ":memory:":
            return f":memory:{id(self)}"
        return os.path.realpath(self._path)

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Wait for an append made in this process, or ``timeout`` seconds."""
        return await _APPEND_WAITERS.wait((self._wake_key, stream), timeout)

    # Groups ------------------------------------------------------------------

    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None,
        *, ordering: str = "none",
    ) -> GroupInfo:
        return await self._write(_catalog.create_group, self._clock, stream, group, start,
                                 max_attempts, ordering)

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        return await self._read(
            lambda conn: _catalog.get_group(conn, stream, group).info(self._clock()))

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        return await self._read(_catalog.list_groups, stream, self._clock())

    async def pause_group(self, stream: str, group: str, until_ms: int | None) -> GroupInfo:
        """Store the pause with the group: every process's next fetch of it finds it."""
        until = PAUSED_UNTIL_RESUMED if until_ms is None else until_ms
        return await self._write(_catalog.pause_group, stream, group, until, self._clock())

    async def resume_group(self, stream: str, group: str) -> GroupInfo:
        """End the pause, and wake this process's consumers idle on the stream (the
        others find it at their next poll)."""
        info = await self._write(_catalog.pause_group, stream, group, 0, self._clock())
        _APPEND_WAITERS.wake((self._wake_key, stream))
        return info

    # Leases ------------------------------------------------------------------

    async def fetch(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> list[Lease]:
        ids = None if partitions is None else list(partitions)
        return leases_of(await self._write(self._fetcher.fetch, stream, group, consumer_id,
                                           limit, lease_ms, ids))

    one_call_ack_and_fetch = True

    async def ack_and_fetch(
        self,
        acks: Sequence[Lease],
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> tuple[list[SettleResult], list[Lease]]:
        """Ack ``acks`` and fetch the next batch in ONE transaction and commit (the
        fetch sees the acks)."""
        ids = None if partitions is None else list(partitions)
        fetch, acked = self._fetcher.fetch, list(acks)
        ack, runs, vouched = self._acker(acked)

        def both(conn: sqlite3.Connection) -> tuple[list[SettleResult], list[Lease] | FreshRange]:
            return ack(conn), fetch(conn, stream, group, consumer_id, limit, lease_ms, ids)

        try:
            results, fetched = await self._run(True, both)
        finally:
            self._settled(acked, runs, vouched)
        return results, leases_of(fetched)

    def _acker(self, leases: list[Lease]) -> tuple[
            Callable[[sqlite3.Connection], list[SettleResult]], list[Run] | None, set[int]]:
        """The ack of ``leases`` in the backend thread: as runs of the new ranges this
        backend leased when they are (:mod:`.._issued_runs`), else lease by lease (the
        leases of those ranges vouched for); the runs and the positions vouched for come
        beside it."""
        if not leases:
            return (lambda conn: []), None, _settle.NOT_VOUCHED
        clock = self._clock
        runs = self._issued.runs(leases)
        vouched = self._issued.vouch(leases) if runs is None else _settle.NOT_VOUCHED

        def ack(conn: sqlite3.Connection) -> list[SettleResult]:
            if runs is not None:
                results = _settle.ack_runs(conn, leases, runs)
                if results is not None:
                    return results
            return _settle.settle(conn, clock, leases, "ack", "", 0, None, vouched)

        return ack, runs, vouched

    def _settled(self, leases: list[Lease], runs: list[Run] | None, vouched: set[int]) -> None:
        """Leases settled (or their settle failed: a repeat is answered all the same) leave
        the registry of ranges, which keeps only what is still to settle."""
        if runs is not None:
            self._issued.acked(runs)
        elif vouched:
            self._issued.settled(leases, vouched)

    async def _settle(self, leases: Sequence[Lease], op: Op, reason: str,
                      delay_ms: int, error: str | None) -> list[SettleResult]:
        items = list(leases)
        if op == "ack":
            ack, runs, vouched = self._acker(items)
            try:
                return await self._run(True, ack)
            finally:
                self._settled(items, runs, vouched)
        vouched = self._issued.vouch(items)
        try:
            return await self._write(_settle.settle, self._clock, items, op, reason, delay_ms,
                                     error, vouched)
        finally:
            self._settled(items, None, vouched)

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return await self._settle(leases, "ack", "", 0, None)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return await self._settle(leases, "nack", reason, delay_ms, error)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return await self._settle(leases, "reject", reason, 0, error)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        items = list(leases)
        return await self._write(_settle.renew, self._clock, items, lease_ms,
                                 self._issued.vouch(items))

    # Progress ----------------------------------------------------------------

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        return await self._read(_progress.frontier, stream, group)

    async def scheduled(self, stream: str, after: Mapping[int, int]) -> dict[int, int]:
        return await self._read(_events.scheduled, stream, dict(after), self._clock())

    async def frontiers(self, stream: str) -> dict[str, dict[int, int]]:
        return await self._read(_progress.frontiers, stream)

    async def lag_report(self, streams: Sequence[str] | None) -> LagReport:
        return await self._read(_lag.lag_report, streams, self._clock())

    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        return await self._read(_progress.dead_letters, stream, group, limit, after)

    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        wanted = None if positions is None else sorted(set(positions))
        return await self._write(_progress.redrive, self._clock, stream, group, wanted)

    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        await self._write(_progress.replay, stream, group, from_sequence, list(partitions))

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        await self._write(_progress.reset, stream, group, to, list(partitions))

    # Reads and retention -----------------------------------------------------

    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        return await self._read(_events.query, query, limit, after)

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        return await self._write(_events.trim, stream, dict(up_to))

    async def delete_stream(self, stream: str) -> None:
        await self._write(_catalog.delete_stream, stream)

    async def delete_group(self, stream: str, group: str) -> None:
        await self._write(_catalog.delete_group, stream, group)


def _url_options(query: str) -> dict[str, Any]:
    """The keyword arguments of an SQLite URL's query string, checked."""
    options: dict[str, Any] = {}
    for name, value in parse_qsl(query, keep_blank_values=True):
        if name not in _URL_OPTIONS:
            raise InvalidArgument(
                f"unknown SQLite URL option {name!r}; known: {', '.join(_URL_OPTIONS)}"
            )
        if name == "timeout_ms":
            options[name] = check_timeout_ms(value)
        elif name == "migrate":
            options[name] = url_flag(name, value)
        elif name == "busy_timeout_ms":
            if not value.isdigit():
                raise InvalidArgument(
                    f"busy_timeout_ms must be a non-negative integer, got {value!r}"
                )
            options[name] = int(value)
        else:
            options[name] = value
    return options
