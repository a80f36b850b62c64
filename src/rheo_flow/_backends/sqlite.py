"""The SQLite backend: single-node durable storage in one file, on the stdlib ``sqlite3``.

Semantics are those of the in-memory reference backend, kept in tables:

* ``events`` — one row per event, keyed by (stream, partition, sequence), with a
  unique (stream, event id) for idempotent appends;
* ``partitions`` — high and low water per stream partition;
* ``group_partitions`` — per (group, partition): the *cursor* (highest sequence
  whose delivery row exists) and the stored contiguous *frontier*;
* ``deliveries`` — materialised deliveries. Rows are created lazily when fetch
  leases a sequence past the cursor, so an event nobody fetched costs no row.

Terminal (acked, rejected) rows stay until replay, reset or trim, exactly like the
reference: they answer a repeated settle with ``repeated=True``. Fetch never reads
them: it walks a partial index holding only available and leased rows, so its
cost does not grow with the number of acked events. The frontier is advanced
from its stored value by walking forward from it, never by counting acked rows.

Concurrency: every write (fetch included) is one ``BEGIN IMMEDIATE``
transaction, which takes SQLite's single writer lock before reading anything,
so processes sharing the file serialise their claims and can never lease one
delivery twice. WAL mode lets readers proceed while a writer works.

Batches: an operation is one hop to the backend thread and one transaction (or a
share of one: operations queued while the thread is busy commit together), with
a few statements per batch rather than per event. A fetch reads the group and
every partition's progress in one statement, leases a partition's new sequences
with one ``INSERT ... SELECT`` and re-leases with one ``executemany``; a settle
or renew is one ``executemany`` of a fenced primary-key update, and the frontier
moves with one statement per partition; an append inserts the whole batch with
one ``executemany``. Events keep their stored JSON text and decode ``data`` on
first access.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, Final, Generic, Literal, ParamSpec, TypeVar
from urllib.parse import parse_qsl, unquote

import orjson
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_exponential

from .._backend import DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_REASON, AppendRecord, Backend
from .._capabilities import Capabilities
from .._clock import Clock, system_clock
from .._errors import (
    BackendError,
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    UnknownGroup,
    UnknownStream,
)
from .._event import Event, decode_json, make_event_json
from .._lease import Lease, make_lease
from .._query import Query
from .._settle_results import SettleKind, SettleResult, settle_ok
from .._stream import DeadLetter, GroupInfo, StartPosition, StreamInfo
from .._urls import redact_url, url_flag
from ._guard import DEFAULT_TIMEOUT_MS, check_timeout_ms, guard_operations
from ._shared import (
    Waiters,
    fence,
    missing_delivery,
    query_window,
    round_robin,
    start_position,
)

__all__ = ["SQLiteBackend"]

P = ParamSpec("P")
T = TypeVar("T")

Op = Literal["ack", "nack", "reject"]

SCHEMA_VERSION: Final = 3
"""Stored in ``PRAGMA user_version``; bump it (with a migration) on any schema change.

1: first schema. 2: the ``deliveries`` state CHECK is written with ``OR`` instead
of ``IN (...)``: SQLite evaluates a CHECK on every inserted and updated row, and
an ``IN`` list of four builds a temporary lookup table each time, which made
every delivery write about twice as dear. 3: ``deliveries.last_error``, the last
error recorded by a nack or reject."""

DEFAULT_BUSY_TIMEOUT_MS: Final = 5_000
_SYNCHRONOUS: Final = ("NORMAL", "FULL", "EXTRA")
_URL_OPTIONS: Final = ("busy_timeout_ms", "migrate", "synchronous", "timeout_ms")


# In-process wake-ups: an append through any backend on a file wakes the waiters
# of every backend on that file in this process (whatever their loop). Appends by
# other processes are not seen here; callers wait with a timeout (``poll_ms``),
# which is the cross-process fallback.
_APPEND_WAITERS: Final = Waiters()
_TERMINAL: Final = ("acked", "rejected")

# SQLite's default variable limit was 999 before 3.32; stay below it. IN lists are
# padded to a few fixed sizes so the statement cache keeps hitting.
_IN_SIZES: Final = (1, 8, 64, 256, 900)

_DELIVERIES_TABLE: Final = """CREATE TABLE IF NOT EXISTS {name} (
    group_id INTEGER NOT NULL,
    part INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state = 'available' OR state = 'leased' OR state = 'acked'
                              OR state = 'rejected'),
    attempt INTEGER NOT NULL,
    lease_id TEXT,
    receipt TEXT,
    consumer_id TEXT,
    deadline_ms INTEGER NOT NULL DEFAULT 0,
    available_at_ms INTEGER NOT NULL DEFAULT 0,
    settled_by TEXT,
    reason TEXT NOT NULL DEFAULT '',
    rejected_at_ms INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    PRIMARY KEY (group_id, part, seq)
) WITHOUT ROWID"""

_DELIVERIES_INDEXES: Final = (
    # Only non-terminal rows, and every column fetch reads (covering): fetch cost
    # follows the inflight and redeliverable rows, never the acked ones.
    """CREATE INDEX IF NOT EXISTS deliveries_active
        ON deliveries (group_id, part, seq, state, available_at_ms, deadline_ms, attempt)
        WHERE state IN ('available', 'leased')""",
    """CREATE INDEX IF NOT EXISTS deliveries_rejected
        ON deliveries (group_id, part, seq) WHERE state = 'rejected'""",
)

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS streams (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL UNIQUE,
        partitions INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS partitions (
        stream_id INTEGER NOT NULL,
        part INTEGER NOT NULL,
        high_water INTEGER NOT NULL DEFAULT 0,
        low_water INTEGER NOT NULL DEFAULT 1,
        PRIMARY KEY (stream_id, part)
    ) WITHOUT ROWID""",
    # A rowid table (not WITHOUT ROWID): payloads can be large, and SQLite keeps
    # large rows out of the key b-tree only in rowid tables.
    """CREATE TABLE IF NOT EXISTS events (
        stream_id INTEGER NOT NULL,
        part INTEGER NOT NULL,
        seq INTEGER NOT NULL,
        event_id TEXT NOT NULL,
        type TEXT NOT NULL,
        key TEXT,
        data TEXT NOT NULL,
        headers TEXT,
        appended_at_ms INTEGER NOT NULL,
        PRIMARY KEY (stream_id, part, seq),
        UNIQUE (stream_id, event_id)
    )""",
    """CREATE TABLE IF NOT EXISTS groups (
        id INTEGER PRIMARY KEY,
        stream_id INTEGER NOT NULL,
        name TEXT NOT NULL,
        max_attempts INTEGER NOT NULL,
        created_at_ms INTEGER NOT NULL,
        UNIQUE (stream_id, name)
    )""",
    """CREATE TABLE IF NOT EXISTS group_partitions (
        group_id INTEGER NOT NULL,
        part INTEGER NOT NULL,
        cursor INTEGER NOT NULL,
        frontier INTEGER NOT NULL,
        PRIMARY KEY (group_id, part)
    ) WITHOUT ROWID""",
    _DELIVERIES_TABLE.format(name="deliveries"),
    *_DELIVERIES_INDEXES,
)

# The per-partition scan of fetch: eligible existing deliveries in sequence order.
# INDEXED BY makes a missing or unusable partial index an error instead of a
# silent fall back to the primary key (which also walks acked rows).
_ELIGIBLE_SQL: Final = """
    SELECT seq, attempt FROM deliveries INDEXED BY deliveries_active
    WHERE group_id = ? AND part = ? AND state IN ('available', 'leased')
      AND ((state = 'available' AND available_at_ms <= ?)
           OR (state = 'leased' AND deadline_ms <= ?))
    ORDER BY seq"""

# What fetch needs of the group: its settings and every partition's cursor and
# high water, in one statement.
_PROGRESS_SQL: Final = """
    SELECT g.id, g.max_attempts, s.id, s.partitions, gp.part, gp.cursor, p.high_water
    FROM streams AS s
    JOIN groups AS g ON g.stream_id = s.id AND g.name = ?
    JOIN group_partitions AS gp ON gp.group_id = g.id
    JOIN partitions AS p ON p.stream_id = s.id AND p.part = gp.part
    WHERE s.name = ?"""

# Settles and renews of a batch of leases of one group: one fenced UPDATE run by
# executemany, each row found by its primary key. ?1..?5 are the batch's constants,
# ?6..?10 the lease's group, part, seq, lease id and receipt; ?11 a settle's error.
_FENCED_WHERE: Final = (
    " WHERE group_id = ?6 AND part = ?7 AND seq = ?8 AND state = 'leased'"
    " AND lease_id = ?9 AND receipt = ?10"
)

_SETTLE_SQL: Final[dict[str, str]] = {
    # ?1 reason, ?2 now, ?3 available at, ?4 max attempts, ?5 the max attempts reason
    "ack": "UPDATE deliveries SET state = 'acked', settled_by = 'ack', reason = ''"
    + _FENCED_WHERE,
    "reject": "UPDATE deliveries SET state = 'rejected', settled_by = 'reject', "
    "reason = ?1, rejected_at_ms = ?2, last_error = COALESCE(?11, last_error)"
    + _FENCED_WHERE,
    # A nack of the last allowed attempt dead-letters the delivery.
    "nack": "UPDATE deliveries SET settled_by = 'nack', "
    "last_error = COALESCE(?11, last_error), "
    "state = CASE WHEN attempt >= ?4 THEN 'rejected' ELSE 'available' END, "
    "reason = CASE WHEN attempt >= ?4 THEN ?5 ELSE ?1 END, "
    "rejected_at_ms = CASE WHEN attempt >= ?4 THEN ?2 ELSE rejected_at_ms END, "
    "available_at_ms = CASE WHEN attempt >= ?4 THEN available_at_ms ELSE ?3 END"
    + _FENCED_WHERE,
}
_RENEW_SQL: Final = "UPDATE deliveries SET deadline_ms = ?1" + _FENCED_WHERE

# New deliveries of one partition's sequence range, leased at once; ?2 is the
# fetch's lease id prefix, ?4 the number of the range's first lease in the fetch.
_LEASE_NEW_SQL: Final = """
    INSERT INTO deliveries (group_id, part, seq, state, attempt, lease_id, receipt,
                            consumer_id, deadline_ms)
    SELECT ?1, part, seq, 'leased', 1, ?2 || printf('%08x', seq - ?3 + ?4),
           part || '-' || seq || '-1', ?5, ?6
    FROM events WHERE stream_id = ?7 AND part = ?8 AND seq BETWEEN ?3 AND ?9"""

# The frontier moved over the settled run after it (see _advance_frontier).
_ADVANCE_SQL: Final = """
    UPDATE group_partitions SET frontier = MAX(frontier, COALESCE((
        SELECT MIN(seq) - 1 FROM deliveries INDEXED BY deliveries_active
        WHERE group_id = ?1 AND part = ?2 AND state IN ('available', 'leased')), cursor))
    WHERE group_id = ?1 AND part = ?2"""

_MAX_SEQUENCE: Final = 2**63 - 1
"""The largest SQLite integer."""

_INSERT_EVENT_SQL: Final = (
    "INSERT INTO events (stream_id, part, seq, event_id, type, key, data, headers, "
    "appended_at_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)

_EVENT_COLUMNS: Final = "part, seq, event_id, type, key, data, headers, appended_at_ms"
_DELIVERY_COLUMNS: Final = (
    "seq, state, attempt, lease_id, receipt, settled_by, reason, "
    "available_at_ms, rejected_at_ms, deadline_ms, last_error"
)


@dataclass(slots=True)
class _Stream:
    id: int
    name: str
    partitions: int
    created_at_ms: int


@dataclass(slots=True)
class _Group:
    id: int
    stream: _Stream
    name: str
    max_attempts: int
    created_at_ms: int

    def info(self) -> GroupInfo:
        return GroupInfo(self.stream.name, self.name, self.max_attempts, self.created_at_ms)


@dataclass(slots=True)
class _Row:
    """A delivery row loaded for a settle or renew, changed in Python, written back once."""

    seq: int
    state: str
    attempt: int
    lease_id: str | None
    receipt: str | None
    settled_by: str | None
    reason: str
    available_at_ms: int
    rejected_at_ms: int
    deadline_ms: int
    last_error: str | None
    dirty: bool = False


def _enable_wal(conn: sqlite3.Connection, timeout_s: float) -> None:
    """Switch the file to WAL, retrying while another connection holds it.

    Changing the journal mode takes an exclusive lock without going through
    SQLite's busy handler: two processes opening a new file at once get
    "database is locked" at once instead of waiting ``busy_timeout_ms``.
    """
    for attempt in Retrying(
        retry=retry_if_exception(_is_locked),
        wait=wait_exponential(multiplier=0.002, max=0.05),
        stop=stop_after_delay(timeout_s),
        reraise=True,
    ):
        with attempt:
            conn.execute("PRAGMA journal_mode = WAL")


def _migrate_1_to_2(conn: sqlite3.Connection) -> None:
    """Rebuild ``deliveries`` with schema 2's CHECK (a CHECK cannot be altered in
    place); runs inside the opening ``BEGIN IMMEDIATE``, so all or nothing."""
    conn.execute(_DELIVERIES_TABLE.format(name="deliveries_v2"))
    columns = (
        "group_id, part, seq, state, attempt, lease_id, receipt, consumer_id, deadline_ms, "
        "available_at_ms, settled_by, reason, rejected_at_ms"
    )
    conn.execute(f"INSERT INTO deliveries_v2 ({columns}) SELECT {columns} FROM deliveries")
    conn.execute("DROP TABLE deliveries")  # and its indexes
    conn.execute("ALTER TABLE deliveries_v2 RENAME TO deliveries")
    for statement in _DELIVERIES_INDEXES:
        conn.execute(statement)


def _migrate_2_to_3(conn: sqlite3.Connection) -> None:
    """Add ``deliveries.last_error`` (NULL on existing rows: no error was recorded)."""
    conn.execute("ALTER TABLE deliveries ADD COLUMN last_error TEXT")


def _is_locked(exc: BaseException) -> bool:
    return isinstance(exc, sqlite3.OperationalError) and (
        "locked" in str(exc) or "busy" in str(exc))


class _Job(Generic[T]):
    """One operation queued for the backend thread, and the future of its caller."""

    __slots__ = ("call", "future", "loop", "write")

    def __init__(
        self,
        write: bool,
        call: Callable[[sqlite3.Connection], T],
        future: asyncio.Future[T],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.write = write
        self.call = call
        self.future = future
        self.loop = loop

    @property
    def begin(self) -> str:
        # IMMEDIATE takes the write lock before reading anything.
        return "BEGIN IMMEDIATE" if self.write else "BEGIN"

    def settle(self, outcome: tuple[bool, Any]) -> None:
        """Runs in the caller's loop: hand the result (``(True, value)``) or the
        error (``(False, exception)``) over, unless the caller stopped waiting."""
        if not self.future.done():
            ok, value = outcome
            if ok:
                self.future.set_result(value)
            else:
                self.future.set_exception(value)


def _hand_over(done: list[tuple[_Job[Any], tuple[bool, Any]]]) -> None:
    """Resolve finished jobs: one wake-up of each caller loop for the whole batch
    (each ``call_soon_threadsafe`` writes to the loop's self-pipe)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job[Any], tuple[bool, Any]]]] = {}
    for item in done:
        by_loop.setdefault(item[0].loop, []).append(item)
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed
            loop.call_soon_threadsafe(_settle_all, items)


def _settle_all(items: list[tuple[_Job[Any], tuple[bool, Any]]]) -> None:
    for job, outcome in items:
        job.settle(outcome)


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

    ``timeout_ms`` bounds how long a caller waits for its operation (by default
    ``busy_timeout_ms`` plus 10 s). An operation given up on may still commit in
    the backend thread: a write then raises :class:`~rheo_flow.OutcomeUnknown`.
    """

    name = "sqlite"
    _CAPABILITIES = Capabilities(
        durable=True, distributed=False, push_wakeups=True, server_clock=False
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
        self._busy_timeout_ms = busy_timeout_ms
        self._synchronous = mode
        self._migrate = bool(migrate)
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._open_lock = asyncio.Lock()
        self._rotation: dict[int, int] = {}
        # Operations waiting for the backend thread, and whether a drain of them is
        # queued there; both guarded by ``_pending_lock`` (the loop and the thread
        # touch them).
        self._pending: deque[_Job[Any]] = deque()
        self._draining = False
        self._pending_lock = threading.Lock()

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
        return cls(path, clock=clock, **options)

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

    # Lifecycle ---------------------------------------------------------------

    async def open(self) -> None:
        await self._open()

    async def _open(self) -> ThreadPoolExecutor:
        async with self._open_lock:
            if self._executor is not None:
                return self._executor
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rheo-sqlite")
            try:
                conn = await asyncio.get_running_loop().run_in_executor(executor, self._connect)
            except BaseException:
                executor.shutdown(wait=False)
                raise
            # Set before any operation is queued: the executor's queue orders the two.
            self._conn = conn
            self._executor = executor
            return executor

    async def close(self) -> None:
        async with self._open_lock:
            executor, self._executor = self._executor, None
            if executor is None:
                return
            try:
                await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
            finally:
                executor.shutdown(wait=True)

    def _error_prefix(self) -> str:
        return f"SQLite database {self._path!r}"

    def _scrub(self, text: str) -> str:
        return text

    def _connect(self) -> sqlite3.Connection:
        """Runs in the backend thread: connect, configure, create or check the schema."""
        target, uri = self._path, False
        if not self._migrate and self._path != ":memory:":
            if not os.path.isfile(self._path):
                raise BackendError(f"SQLite database {self._path!r} does not exist "
                                   "(create it with  rheo-flow migrate --url URL)")
            # mode=rw: a file removed meanwhile is an error instead of a new database.
            target, uri = f"{Path(self._path).resolve().as_uri()}?mode=rw", True
        try:
            conn = sqlite3.connect(
                target,
                timeout=self._busy_timeout_ms / 1000,
                isolation_level=None,  # transactions are explicit: BEGIN IMMEDIATE / COMMIT
                uri=uri,
            )
        except sqlite3.Error as exc:
            raise BackendUnavailable(f"cannot open SQLite database {self._path!r}: {exc}") from exc
        try:
            if not self._migrate:
                # Checked before WAL is switched on: a file that is not ours stays untouched.
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version < SCHEMA_VERSION:
                    raise BackendError(
                        f"SQLite database {self._path!r} has "
                        + ("no rheo_flow schema" if version == 0 else f"schema version {version}")
                        + f" (this rheo-flow needs {SCHEMA_VERSION}): "
                        "run  rheo-flow migrate --url URL"
                    )
            conn.execute(f"PRAGMA busy_timeout = {self._busy_timeout_ms}")
            if self._path != ":memory:":
                # Persistent in the file; WAL lets readers run beside the one writer.
                _enable_wal(conn, self._busy_timeout_ms / 1000)
            conn.execute(f"PRAGMA synchronous = {self._synchronous}")
            # IMMEDIATE: two processes opening a new file at once create the schema once.
            conn.execute("BEGIN IMMEDIATE")
            try:
                version = conn.execute("PRAGMA user_version").fetchone()[0]
                if version > SCHEMA_VERSION:
                    raise BackendError(
                        f"SQLite database {self._path!r} has schema version {version}, newer "
                        f"than this rheo-flow supports ({SCHEMA_VERSION}): upgrade rheo-flow"
                    )
                if version == 1:
                    _migrate_1_to_2(conn)  # rebuilt as the current table: last_error too
                elif version == 2:
                    _migrate_2_to_3(conn)
                elif version < SCHEMA_VERSION:
                    for statement in _SCHEMA:
                        conn.execute(statement)
                if version < SCHEMA_VERSION:
                    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                conn.execute("COMMIT")
            except BaseException:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            conn.close()
            raise BackendUnavailable(f"cannot open SQLite database {self._path!r}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    # Every operation is ONE hop to the backend thread running a whole transaction.
    # aiosqlite instead hops to its thread and back for every execute and every
    # fetch: a fetch of ten statements would cost ten queue round trips and
    # event-loop wake-ups, and the write lock would stay held across event-loop
    # turns while unrelated coroutines run, stretching the time other processes
    # wait on it. Here the transaction runs start to finish in the thread at C
    # speed, the lock is held only for the work itself, and the event loop sees a
    # single future per operation.
    #
    # Operations that queue up while the thread is busy (a Group's next fetch
    # arriving while the last batch's ack commits) run together in ONE transaction
    # and one commit: with synchronous=FULL each commit is a sync of the log, the
    # dominant cost of a small write. Every caller still resumes only after the
    # commit holding its work, so a lease change is durable when the call returns.

    async def _read(
        self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        return await self._run(False, lambda conn: fn(conn, *args, **kw))

    async def _write(
        self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        return await self._run(True, lambda conn: fn(conn, *args, **kw))

    async def _run(self, write: bool, call: Callable[[sqlite3.Connection], T]) -> T:
        executor = self._executor
        if executor is None:
            executor = await self._open()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        job = _Job(write, call, future, loop)
        with self._pending_lock:
            self._pending.append(job)
            submit = not self._draining
            self._draining = True
        if submit:
            try:
                executor.submit(self._drain)
            except BaseException as exc:  # the backend was closed meanwhile
                # No drain will come for what queued behind this job: fail it all.
                with self._pending_lock:
                    stranded = [j for j in self._pending if j is not job]
                    self._pending.clear()
                    self._draining = False
                _hand_over([(j, (False, exc)) for j in stranded])
                raise
        return await future

    def _drain(self) -> None:
        """Runs in the backend thread: every queued operation, in queue order, each
        batch of them in one transaction."""
        while True:
            with self._pending_lock:
                if not self._pending:
                    self._draining = False
                    return
                jobs = list(self._pending)
                self._pending.clear()
            if len(jobs) == 1:
                _hand_over([(jobs[0], self._run_alone(jobs[0]))])
            else:
                _hand_over(self._run_together(jobs))

    def _run_alone(self, job: _Job[Any]) -> tuple[bool, Any]:
        try:
            return True, self._transaction(job.begin, job.call)
        except BaseException as exc:  # handed to the caller
            return False, exc

    def _run_together(self, jobs: list[_Job[Any]]) -> list[tuple[_Job[Any], tuple[bool, Any]]]:
        begin = "BEGIN IMMEDIATE" if any(j.write for j in jobs) else "BEGIN"
        try:
            results = self._transaction(begin, lambda conn: [job.call(conn) for job in jobs])
        except BaseException:
            # Nothing of the batch stayed: run each operation in a transaction of
            # its own, so an error reaches only the caller whose operation raised.
            return [(job, self._run_alone(job)) for job in jobs]
        return [(job, (True, result)) for job, result in zip(jobs, results, strict=True)]

    def _transaction(self, begin: str, call: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise BackendUnavailable(f"SQLite database {self._path!r} is closed")
        conn.execute(begin)
        try:
            result = call(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                # The original error says more; SQLite rolls back on its own anyway.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise
        return result

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        """Map ``sqlite3`` errors by their primary result code.

        * busy / locked (another process held the lock past ``busy_timeout_ms``),
          disk full, read-only file, constraint: the transaction was rolled back,
          nothing committed → ``failed``.
        * cannot open, corrupt or not a database, closed connection: the store
          cannot be used → ``backend_unavailable``.
        * I/O error: SQLite may have written part of the commit to the log before
          the error, so whether it committed is unknown → ``ambiguous``.
        """
        if isinstance(exc, sqlite3.ProgrammingError):
            return SettleKind.BACKEND_UNAVAILABLE if "closed" in str(exc) else None
        if not isinstance(exc, sqlite3.Error):
            return None
        code = getattr(exc, "sqlite_errorcode", None)
        primary = code & 0xFF if isinstance(code, int) else None
        if primary is None:
            text = str(exc).lower()
            if "locked" in text or "busy" in text:
                return SettleKind.FAILED
            if "disk i/o" in text:
                return SettleKind.AMBIGUOUS
            if "unable to open" in text or "not a database" in text or "malformed" in text:
                return SettleKind.BACKEND_UNAVAILABLE
            return SettleKind.FAILED
        return _CODE_KINDS.get(primary, SettleKind.FAILED)

    # Streams -----------------------------------------------------------------

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        return await self._write(self._create_stream, name, partitions)

    def _create_stream(self, conn: sqlite3.Connection, name: str, partitions: int) -> StreamInfo:
        existing = _find_stream(conn, name)
        if existing is not None:
            if existing.partitions != partitions:
                raise ConflictError(
                    f"stream {name!r} exists with {existing.partitions} partitions, "
                    f"not {partitions}"
                )
            return _stream_info(conn, existing)
        now = self._clock()
        cur = conn.execute(
            "INSERT INTO streams (name, partitions, created_at_ms) VALUES (?, ?, ?)",
            (name, partitions, now),
        )
        stream_id = cur.lastrowid
        assert stream_id is not None
        conn.executemany(
            "INSERT INTO partitions (stream_id, part) VALUES (?, ?)",
            [(stream_id, p) for p in range(partitions)],
        )
        return _stream_info(conn, _Stream(stream_id, name, partitions, now))

    async def stream_info(self, name: str) -> StreamInfo:
        return await self._read(lambda conn: _stream_info(conn, _stream(conn, name)))

    async def list_streams(self) -> list[str]:
        return await self._read(
            lambda conn: [r[0] for r in conn.execute("SELECT name FROM streams ORDER BY name")]
        )

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        events = await self._write(self._append, stream, list(records))
        if events:
            _APPEND_WAITERS.wake((self._wake_key, stream))
        return events

    @property
    def _wake_key(self) -> str:
        # A private :memory: database is only visible to this backend object.
        if self._path == ":memory:":
            return f":memory:{id(self)}"
        return os.path.realpath(self._path)

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Wait for an append made in this process, or ``timeout`` seconds."""
        return await _APPEND_WAITERS.wait((self._wake_key, stream), timeout)

    def _append(
        self, conn: sqlite3.Connection, stream: str, records: list[AppendRecord]
    ) -> list[Event]:
        s = _stream(conn, stream)
        if not records:
            return []
        now = self._clock()
        high: dict[int, int] = dict(conn.execute(
            "SELECT part, high_water FROM partitions WHERE stream_id = ?", (s.id,)
        ).fetchall())
        if len({r.id for r in records}) == len(records):
            # Usually no id is stored yet: insert the batch as it is, skipping ids the
            # unique (stream, event id) index already holds. If one was skipped, the
            # batch's rows are removed and it is redone knowing the stored events.
            events = _insert_events(conn, s, records, now, dict(high), {}, optimistic=True)
            if events is not None:
                return events
        rows: list[tuple[Any, ...]] = []
        for sql, params in _in_lists(
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE stream_id = ? AND event_id IN ",
            (s.id,), list({r.id for r in records}),
        ):
            rows.extend(conn.execute(sql, params))
        known = {event.id: event for event in _events(stream, rows)}
        events = _insert_events(conn, s, records, now, high, known)
        assert events is not None  # not optimistic: every stored id is known
        return events

    # Groups ------------------------------------------------------------------

    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None
    ) -> GroupInfo:
        return await self._write(self._create_group, stream, group, start, max_attempts)

    def _create_group(
        self,
        conn: sqlite3.Connection,
        stream: str,
        group: str,
        start: StartPosition,
        max_attempts: int | None,
    ) -> GroupInfo:
        s = _stream(conn, stream)
        g = _find_group(conn, s, group)
        if g is not None:
            if max_attempts is not None and max_attempts != g.max_attempts:
                conn.execute(
                    "UPDATE groups SET max_attempts = ? WHERE id = ?", (max_attempts, g.id)
                )
                g.max_attempts = max_attempts
            return g.info()
        now = self._clock()
        cur = conn.execute(
            "INSERT INTO groups (stream_id, name, max_attempts, created_at_ms) "
            "VALUES (?, ?, ?, ?)",
            (s.id, group, max_attempts or DEFAULT_MAX_ATTEMPTS, now),
        )
        group_id = cur.lastrowid
        assert group_id is not None
        rows = []
        for part, high, low in conn.execute(
            "SELECT part, high_water, low_water FROM partitions WHERE stream_id = ?", (s.id,)
        ).fetchall():
            position = start_position(start, high, low)
            rows.append((group_id, part, position, position))
        conn.executemany(
            "INSERT INTO group_partitions (group_id, part, cursor, frontier) VALUES (?, ?, ?, ?)",
            rows,
        )
        return GroupInfo(stream, group, max_attempts or DEFAULT_MAX_ATTEMPTS, now)

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        return await self._read(lambda conn: _group(conn, stream, group).info())

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        def run(conn: sqlite3.Connection) -> list[GroupInfo]:
            s = _stream(conn, stream)
            return [
                GroupInfo(stream, name, max_attempts, created)
                for name, max_attempts, created in conn.execute(
                    "SELECT name, max_attempts, created_at_ms FROM groups WHERE stream_id = ? "
                    "ORDER BY name",
                    (s.id,),
                )
            ]

        return await self._read(run)

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
        return await self._write(self._fetch, stream, group, consumer_id, limit, lease_ms, ids)

    def _fetch(
        self,
        conn: sqlite3.Connection,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: list[int] | None,
    ) -> list[Lease]:
        # The group and every partition's cursor and high water, in one statement.
        rows = conn.execute(_PROGRESS_SQL, (group, stream)).fetchall()
        if not rows:
            _group(conn, stream, group)  # raises UnknownStream or UnknownGroup
            return []
        group_id, max_attempts, stream_id, count = rows[0][:4]
        progress = {part: (cursor, high) for *_, part, cursor, high in rows}
        now = self._clock()
        ids = list(range(count)) if partitions is None else partitions
        if not ids:
            return []
        # Where the round-robin starts rotates per call, as in the reference. It is kept
        # per backend object, not stored: a fetch that finds nothing then writes nothing.
        rotation = (self._rotation.get(group_id, 0) + 1) % len(ids)
        self._rotation[group_id] = rotation
        ids = ids[rotation:] + ids[:rotation]

        # Per partition, the candidates in order: eligible existing deliveries, then
        # new sequences past the cursor (materialised only if actually leased).
        existing: list[list[tuple[int, int]]] = []
        sizes: list[int] = []
        expired: list[tuple[int, int]] = []
        for part in ids:
            found: list[tuple[int, int]] = []
            cur = conn.execute(_ELIGIBLE_SQL, (group_id, part, now, now))
            try:
                for seq, attempt in cur:
                    if len(found) >= limit:
                        break
                    if attempt >= max_attempts:
                        expired.append((part, seq))
                        continue
                    found.append((seq, attempt))
            finally:
                cur.close()
            cursor, high = progress[part]
            existing.append(found)
            sizes.append(len(found) + max(0, min(limit - len(found), high - cursor)))

        if expired:
            conn.executemany(
                "UPDATE deliveries SET state = 'rejected', reason = ?, settled_by = NULL, "
                "rejected_at_ms = ? WHERE group_id = ? AND part = ? AND seq = ?",
                [(MAX_ATTEMPTS_REASON, now, group_id, part, seq) for part, seq in expired],
            )
            for part in sorted({part for part, _ in expired}):
                _advance_frontier(conn, group_id, part)

        if len(ids) == 1:
            order = [(0, d) for d in range(min(sizes[0], limit))]
        else:
            order = round_robin(sizes, limit)  # (index into ids, depth)
        if not order:
            return []
        deadline = now + lease_ms
        # Lease ids: one random prefix per fetch, then the lease's number in the fetch.
        prefix = os.urandom(12).hex()
        picked = [0] * len(ids)
        for i, _ in order:
            picked[i] += 1
        # A partition's picks are its eligible deliveries first, then new sequences.
        updates: list[tuple[Any, ...]] = []
        fresh: list[tuple[int, int, int, int]] = []  # part, first, last, first lease number
        number = 0
        for i, part in enumerate(ids):
            again = min(picked[i], len(existing[i]))
            for seq, attempt in existing[i][:again]:
                updates.append((attempt + 1, f"{prefix}{number:08x}",
                                f"{part}-{seq}-{attempt + 1}", consumer_id, deadline,
                                group_id, part, seq))
                number += 1
            new = picked[i] - again
            if new:
                cursor = progress[part][0]
                fresh.append((part, cursor + 1, cursor + new, number))
                number += new

        if updates:
            conn.executemany(
                "UPDATE deliveries SET state = 'leased', attempt = ?, lease_id = ?, receipt = ?, "
                "consumer_id = ?, deadline_ms = ?, settled_by = NULL "
                "WHERE group_id = ? AND part = ? AND seq = ?",
                updates,
            )
        for part, first, last, base in fresh:
            # The lease id and receipt are built by SQLite exactly as below in Python.
            inserted = conn.execute(_LEASE_NEW_SQL, (
                group_id, prefix, first, base, consumer_id, deadline, stream_id, part, last
            )).rowcount
            if inserted != last - first + 1:  # events past the cursor are never removed
                raise BackendError(
                    f"SQLite database {self._path!r}: events {first}..{last} of partition "
                    f"{part} of stream {stream!r} are missing")
        if fresh:
            conn.executemany(
                "UPDATE group_partitions SET cursor = ? WHERE group_id = ? AND part = ?",
                [(last, group_id, part) for part, _, last, _ in fresh],
            )
        events = _load_events(
            conn, stream_id, stream, {part: (first, last) for part, first, last, _ in fresh},
            updates)
        made = {
            (part, seq): make_lease(lease_id, receipt, group, consumer_id, events[(part, seq)],
                                    attempt, deadline)
            for attempt, lease_id, receipt, _, _, _, part, seq in updates
        }
        for part, first, last, base in fresh:
            offset = base - first
            for seq in range(first, last + 1):
                made[(part, seq)] = make_lease(
                    f"{prefix}{seq + offset:08x}", f"{part}-{seq}-1", group, consumer_id,
                    events[(part, seq)], 1, deadline)
        if len(ids) == 1:
            return list(made.values())  # re-deliveries, then new ones: the order picked
        out: list[Lease] = []
        for i, d in order:
            found = existing[i]
            part = ids[i]
            seq = found[d][0] if d < len(found) else progress[part][0] + d - len(found) + 1
            out.append(made[(part, seq)])
        return out

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return await self._write(self._settle, list(leases), "ack", "", 0)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return await self._write(self._settle, list(leases), "nack", reason, delay_ms, error)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return await self._write(self._settle, list(leases), "reject", reason, 0, error)

    def _settle(
        self, conn: sqlite3.Connection, leases: list[Lease], op: Op, reason: str, delay_ms: int,
        error: str | None = None,
    ) -> list[SettleResult]:
        now = self._clock()
        changed = _fenced_update(conn, leases, _SETTLE_SQL[op], (reason, now, now + delay_ms),
                                 () if op == "ack" else (error,))
        if changed is None:
            return self._settle_rows(conn, leases, op, reason, delay_ms, now, error)
        group_id, parts = changed
        # Every delivery of an ack or reject is settled; a nack's may be dead-lettered.
        for part in sorted(parts):
            _advance_frontier(conn, group_id, part)
        return [settle_ok(lease.lease_id) for lease in leases]

    def _settle_rows(
        self,
        conn: sqlite3.Connection,
        leases: list[Lease],
        op: Op,
        reason: str,
        delay_ms: int,
        now: int,
        error: str | None = None,
    ) -> list[SettleResult]:
        """Settle row by row on Python copies: any batch, including several streams or
        groups and one delivery named twice."""
        found = _Deliveries(conn, leases)
        terminal: set[tuple[int, int]] = set()
        results: list[SettleResult] = []
        for lease in leases:
            hit = found.find(lease)
            if isinstance(hit, SettleResult):
                results.append(hit)
                continue
            g, d = hit
            if d.state != "leased":
                if d.settled_by == op:
                    results.append(SettleResult.success(lease.lease_id, repeated=True))
                else:
                    results.append(SettleResult.failure(
                        lease.lease_id, SettleKind.STALE_LEASE, f"already settled by {d.settled_by}"
                    ))
                continue
            d.dirty = True
            d.settled_by = op
            if error is not None:
                d.last_error = error
            if op == "ack":
                d.state, d.reason = "acked", ""
            elif op == "reject" or d.attempt >= g.max_attempts:
                d.state, d.rejected_at_ms = "rejected", now
                d.reason = reason if op == "reject" else MAX_ATTEMPTS_REASON
            else:
                d.state, d.reason, d.available_at_ms = "available", reason, now + delay_ms
            if d.state in _TERMINAL:
                terminal.add((g.id, lease.partition))
            results.append(SettleResult.success(lease.lease_id))
        found.write_back()
        for group_id, part in sorted(terminal):
            _advance_frontier(conn, group_id, part)
        return results

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        return await self._write(self._renew, list(leases), lease_ms)

    def _renew(
        self, conn: sqlite3.Connection, leases: list[Lease], lease_ms: int
    ) -> list[SettleResult]:
        deadline = self._clock() + lease_ms
        if _fenced_update(conn, leases, _RENEW_SQL, (deadline, None, None)) is None:
            return self._renew_rows(conn, leases, deadline)
        return [SettleResult(lease.lease_id, None, False, deadline) for lease in leases]

    def _renew_rows(
        self, conn: sqlite3.Connection, leases: list[Lease], deadline: int
    ) -> list[SettleResult]:
        found = _Deliveries(conn, leases)
        results: list[SettleResult] = []
        for lease in leases:
            hit = found.find(lease)
            if isinstance(hit, SettleResult):
                results.append(hit)
                continue
            _, d = hit
            if d.state != "leased":
                results.append(SettleResult.failure(
                    lease.lease_id, SettleKind.STALE_LEASE, f"already settled by {d.settled_by}"
                ))
                continue
            d.deadline_ms = deadline
            d.dirty = True
            results.append(SettleResult.success(lease.lease_id, deadline_ms=deadline))
        found.write_back()
        return results

    # Progress ----------------------------------------------------------------

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        def run(conn: sqlite3.Connection) -> dict[int, int]:
            g = _group(conn, stream, group)
            return dict(conn.execute(
                "SELECT part, frontier FROM group_partitions WHERE group_id = ? ORDER BY part",
                (g.id,),
            ).fetchall())

        return await self._read(run)

    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        def run(conn: sqlite3.Connection) -> list[DeadLetter]:
            g = _group(conn, stream, group)
            part, seq = after if after is not None else (-1, -1)
            return [
                DeadLetter(stream, group, *row)
                for row in conn.execute(
                    "SELECT d.part, d.seq, e.event_id, d.attempt, d.reason, d.rejected_at_ms, "
                    "d.last_error "
                    "FROM deliveries AS d INDEXED BY deliveries_rejected "
                    "JOIN events AS e ON e.stream_id = ? AND e.part = d.part AND e.seq = d.seq "
                    "WHERE d.group_id = ? AND d.state = 'rejected' AND (d.part, d.seq) > (?, ?) "
                    "ORDER BY d.part, d.seq LIMIT ?",
                    (g.stream.id, g.id, part, seq, limit),
                )
            ]

        return await self._read(run)

    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        wanted = None if positions is None else sorted(set(positions))
        return await self._write(self._redrive, stream, group, wanted)

    def _redrive(
        self,
        conn: sqlite3.Connection,
        stream: str,
        group: str,
        positions: list[tuple[int, int]] | None,
    ) -> int:
        g = _group(conn, stream, group)
        now = self._clock()
        update = (
            "UPDATE deliveries SET state = 'available', attempt = 0, lease_id = NULL, "
            "receipt = NULL, settled_by = NULL, available_at_ms = ?, reason = '', "
            "last_error = NULL "
            "WHERE group_id = ? AND state = 'rejected' AND EXISTS (SELECT 1 FROM events AS e "
            "WHERE e.stream_id = ? AND e.part = deliveries.part AND e.seq = deliveries.seq)"
        )
        if positions is None:
            count = conn.execute(update, (now, g.id, g.stream.id)).rowcount
        else:
            count = conn.executemany(
                update + " AND part = ? AND seq = ?",
                [(now, g.id, g.stream.id, part, seq) for part, seq in positions],
            ).rowcount
        if count:
            # Redriven deliveries are pending again: the frontier cannot stay past them.
            conn.execute(
                "UPDATE group_partitions SET frontier = MIN(frontier, COALESCE(("
                "SELECT MIN(d.seq) - 1 FROM deliveries AS d INDEXED BY deliveries_active "
                "WHERE d.group_id = group_partitions.group_id AND d.part = group_partitions.part "
                "AND d.state IN ('available', 'leased')), frontier)) WHERE group_id = ?",
                (g.id,),
            )
        return count

    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        await self._write(self._replay, stream, group, from_sequence, list(partitions))

    def _replay(
        self,
        conn: sqlite3.Connection,
        stream: str,
        group: str,
        from_sequence: int,
        partitions: list[int],
    ) -> None:
        g = _group(conn, stream, group)
        low = dict(conn.execute(
            "SELECT part, low_water FROM partitions WHERE stream_id = ?", (g.stream.id,)
        ).fetchall())
        # Trimmed events are gone and count as settled: replay starts at the low water.
        starts = [(part, max(from_sequence, low[part])) for part in partitions]
        # Deleting a delivery fences its lease; it is materialised again, attempt 1.
        conn.executemany(
            "DELETE FROM deliveries WHERE group_id = ? AND part = ? AND seq >= ?",
            [(g.id, part, start) for part, start in starts],
        )
        conn.executemany(
            "UPDATE group_partitions SET cursor = MIN(cursor, ?), frontier = MIN(frontier, ?) "
            "WHERE group_id = ? AND part = ?",
            [(start - 1, start - 1, g.id, part) for part, start in starts],
        )

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        await self._write(self._reset, stream, group, to, list(partitions))

    def _reset(
        self,
        conn: sqlite3.Connection,
        stream: str,
        group: str,
        to: StartPosition,
        partitions: list[int],
    ) -> None:
        g = _group(conn, stream, group)
        waters = {
            part: (high, low)
            for part, high, low in conn.execute(
                "SELECT part, high_water, low_water FROM partitions WHERE stream_id = ?",
                (g.stream.id,),
            )
        }
        conn.executemany(
            "DELETE FROM deliveries WHERE group_id = ? AND part = ?",
            [(g.id, part) for part in partitions],
        )
        moves = []
        for part in partitions:
            position = start_position(to, *waters[part])
            moves.append((position, position, g.id, part))
        conn.executemany(
            "UPDATE group_partitions SET cursor = ?, frontier = ? WHERE group_id = ? AND part = ?",
            moves,
        )

    # Reads and retention -----------------------------------------------------

    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        return await self._read(self._query, query, limit, after)

    def _query(
        self, conn: sqlite3.Connection, query: Query, limit: int, after: tuple[int, int] | None
    ) -> list[Event]:
        s = _stream(conn, query.stream)
        waters = {
            part: (high, low)
            for part, high, low in conn.execute(
                "SELECT part, high_water, low_water FROM partitions WHERE stream_id = ?", (s.id,)
            )
        }
        filters = ""
        extra: list[Any] = []
        for clause, value in (
            ("key = ?", query.key),
            ("type = ?", query.type),
            ("appended_at_ms >= ?", query.since_ms),
            ("appended_at_ms < ?", query.until_ms),
        ):
            if value is not None:
                filters += f" AND {clause}"
                extra.append(value)
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE stream_id = ? AND part = ? "
            f"AND seq BETWEEN ? AND ?{filters} ORDER BY seq LIMIT ?"
        )
        parts = range(s.partitions) if query.partitions is None else sorted(query.partitions)
        out: list[Event] = []
        for part in parts:
            high, low = waters[part]
            window = query_window(query, part, after, low, high)
            if window is None:
                continue
            lo, hi = window
            out.extend(_events(s.name, conn.execute(
                sql, (s.id, part, lo, hi, *extra, limit - len(out))).fetchall()))
            if len(out) >= limit:
                break
        return out

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        return await self._write(self._trim, stream, dict(up_to))

    async def delete_stream(self, stream: str) -> None:
        await self._write(_delete_stream, stream)

    async def delete_group(self, stream: str, group: str) -> None:
        await self._write(_delete_group, stream, group)

    def _trim(
        self, conn: sqlite3.Connection, stream: str, up_to: dict[int, int]
    ) -> dict[int, int]:
        s = _stream(conn, stream)
        waters = {
            part: (high, low)
            for part, high, low in conn.execute(
                "SELECT part, high_water, low_water FROM partitions WHERE stream_id = ?", (s.id,)
            )
        }
        group_ids = [
            r[0] for r in conn.execute("SELECT id FROM groups WHERE stream_id = ?", (s.id,))
        ]
        removed: dict[int, int] = {}
        for part, wanted in up_to.items():
            high, low = waters[part]
            bound = min(wanted, high)
            removed[part] = conn.execute(
                "DELETE FROM events WHERE stream_id = ? AND part = ? AND seq <= ?",
                (s.id, part, bound),
            ).rowcount
            if bound + 1 > low:
                conn.execute(
                    "UPDATE partitions SET low_water = ? WHERE stream_id = ? AND part = ?",
                    (bound + 1, s.id, part),
                )
            # Deliveries of removed events are dropped (fencing their leases) and count
            # as settled.
            for group_id in group_ids:
                conn.execute(
                    "DELETE FROM deliveries WHERE group_id = ? AND part = ? AND seq <= ?",
                    (group_id, part, bound),
                )
                conn.execute(
                    "UPDATE group_partitions SET cursor = MAX(cursor, ?), "
                    "frontier = MAX(frontier, ?) WHERE group_id = ? AND part = ?",
                    (bound, bound, group_id, part),
                )
                _advance_frontier(conn, group_id, part)
        return removed


_CODE_KINDS: Final[dict[int, SettleKind]] = {
    5: SettleKind.FAILED,  # SQLITE_BUSY
    6: SettleKind.FAILED,  # SQLITE_LOCKED
    8: SettleKind.FAILED,  # SQLITE_READONLY
    9: SettleKind.FAILED,  # SQLITE_INTERRUPT
    13: SettleKind.FAILED,  # SQLITE_FULL
    19: SettleKind.FAILED,  # SQLITE_CONSTRAINT
    10: SettleKind.AMBIGUOUS,  # SQLITE_IOERR
    11: SettleKind.BACKEND_UNAVAILABLE,  # SQLITE_CORRUPT
    14: SettleKind.BACKEND_UNAVAILABLE,  # SQLITE_CANTOPEN
    15: SettleKind.BACKEND_UNAVAILABLE,  # SQLITE_PROTOCOL
    26: SettleKind.BACKEND_UNAVAILABLE,  # SQLITE_NOTADB
}


def _delete_stream(conn: sqlite3.Connection, stream: str) -> None:
    s = _stream(conn, stream)
    groups = conn.execute("SELECT id FROM groups WHERE stream_id = ?", (s.id,)).fetchall()
    for (group_id,) in groups:
        _delete_group_rows(conn, group_id)
    conn.execute("DELETE FROM events WHERE stream_id = ?", (s.id,))
    conn.execute("DELETE FROM partitions WHERE stream_id = ?", (s.id,))
    conn.execute("DELETE FROM streams WHERE id = ?", (s.id,))


def _delete_group(conn: sqlite3.Connection, stream: str, group: str) -> None:
    _delete_group_rows(conn, _group(conn, stream, group).id)


def _delete_group_rows(conn: sqlite3.Connection, group_id: int) -> None:
    for table, column in (("deliveries", "group_id"), ("group_partitions", "group_id"),
                          ("groups", "id")):
        conn.execute(f"DELETE FROM {table} WHERE {column} = ?", (group_id,))


class _Deliveries:
    """The delivery rows a batch of leases names, loaded in a few IN queries.

    Settling happens on these Python copies (so two leases on one delivery in one
    batch behave as if settled one after the other) and changed rows are written
    back with one ``executemany``.
    """

    def __init__(self, conn: sqlite3.Connection, leases: list[Lease]) -> None:
        self._conn = conn
        self._groups: dict[tuple[str, str], _Group | None] = {}
        self._rows: dict[tuple[int, int, int], _Row] = {}
        self._high: dict[int, dict[int, int]] = {}
        wanted: dict[tuple[int, int], set[int]] = {}
        for lease in leases:
            g = self._group(lease.stream, lease.group)
            if g is not None and 0 <= lease.partition < g.stream.partitions:
                wanted.setdefault((g.id, lease.partition), set()).add(lease.sequence)
        for (group_id, part), seqs in wanted.items():
            for sql, params in _in_lists(
                f"SELECT {_DELIVERY_COLUMNS} FROM deliveries "
                "WHERE group_id = ? AND part = ? AND seq IN ",
                (group_id, part), sorted(seqs),
            ):
                for row in conn.execute(sql, params):
                    self._rows[(group_id, part, row[0])] = _Row(*row)

    def _group(self, stream: str, group: str) -> _Group | None:
        key = (stream, group)
        if key not in self._groups:
            s = _find_stream(self._conn, stream)
            self._groups[key] = None if s is None else _find_group(self._conn, s, group)
        return self._groups[key]

    def find(self, lease: Lease) -> tuple[_Group, _Row] | SettleResult:
        g = self._group(lease.stream, lease.group)
        if g is None or not 0 <= lease.partition < g.stream.partitions:
            return SettleResult.failure(
                lease.lease_id, SettleKind.INVALID, "lease names no group of this backend"
            )
        d = self._rows.get((g.id, lease.partition, lease.sequence))
        if d is None:
            return missing_delivery(lease, self._high_water(g.stream, lease.partition))
        return fence(lease, d.lease_id, d.receipt) or (g, d)

    def _high_water(self, s: _Stream, part: int) -> int:
        if s.id not in self._high:
            self._high[s.id] = dict(self._conn.execute(
                "SELECT part, high_water FROM partitions WHERE stream_id = ?", (s.id,)
            ).fetchall())
        return self._high[s.id].get(part, 0)

    def write_back(self) -> None:
        changed = [
            (d.state, d.reason, d.settled_by, d.available_at_ms, d.rejected_at_ms, d.deadline_ms,
             d.last_error, group_id, part, seq)
            for (group_id, part, seq), d in self._rows.items()
            if d.dirty
        ]
        if changed:
            self._conn.executemany(
                "UPDATE deliveries SET state = ?, reason = ?, settled_by = ?, "
                "available_at_ms = ?, rejected_at_ms = ?, deadline_ms = ?, last_error = ? "
                "WHERE group_id = ? AND part = ? AND seq = ?",
                changed,
            )


def _insert_events(
    conn: sqlite3.Connection,
    s: _Stream,
    records: list[AppendRecord],
    now: int,
    high: dict[int, int],
    known: dict[str, Event],
    *,
    optimistic: bool = False,
) -> list[Event] | None:
    """Insert the records whose id is not in ``known`` with the next sequences of
    their partitions (``high``: the high waters, updated); the stored events in order.

    ``optimistic``: ``known`` may miss stored ids. When one turns up, nothing stays
    inserted and ``None`` is returned.
    """
    start = dict(high) if optimistic else high
    out: list[Event] = []
    rows: list[tuple[Any, ...]] = []
    for r in records:
        existing = known.get(r.id)
        if existing is not None:
            out.append(existing)
            continue
        part = r.partition
        seq = high[part] + 1
        high[part] = seq
        headers = dict(r.headers) if r.headers else {}
        event = make_event_json(s.name, part, seq, r.id, r.type, r.data_json, r.key, headers, now)
        known[r.id] = event
        out.append(event)
        rows.append((
            s.id, part, seq, r.id, r.type, r.key, r.data_json,
            orjson.dumps(headers).decode() if headers else None, now,
        ))
    if rows:
        touched = {row[1] for row in rows}
        if optimistic:
            before = conn.total_changes
            conn.executemany(_INSERT_EVENT_SQL + " ON CONFLICT (stream_id, event_id) DO NOTHING",
                             rows)
            if conn.total_changes - before != len(rows):
                # The write lock is held and the high waters are not moved yet: the
                # rows past them are exactly this batch's.
                conn.executemany(
                    "DELETE FROM events WHERE stream_id = ? AND part = ? AND seq > ?",
                    [(s.id, part, start[part]) for part in touched],
                )
                return None
        else:
            conn.executemany(_INSERT_EVENT_SQL, rows)
        conn.executemany(
            "UPDATE partitions SET high_water = ? WHERE stream_id = ? AND part = ?",
            [(high[part], s.id, part) for part in sorted(touched)],
        )
    return out


def _fenced_update(
    conn: sqlite3.Connection, leases: list[Lease], sql: str, constants: tuple[Any, ...],
    tail: tuple[Any, ...] = (),
) -> tuple[int, set[int]] | None:
    """Run a fenced settle or renew ``sql`` over ``leases`` in one ``executemany``.

    Returns the group id and the partitions changed when every lease was current
    (the usual batch). Otherwise nothing is changed and ``None`` is returned: the
    batch spans several groups, names no group here, or some lease is stale,
    forged, repeated or named twice, and the row-by-row path classifies each one.
    """
    if not leases:
        return None
    first = leases[0]
    stream, group = first.event.stream, first.group
    row = conn.execute(
        "SELECT g.id, g.max_attempts, s.partitions FROM streams AS s "
        "JOIN groups AS g ON g.stream_id = s.id AND g.name = ? WHERE s.name = ?",
        (group, stream),
    ).fetchone()
    if row is None:
        return None
    group_id, max_attempts, count = row
    head = (*constants, max_attempts, MAX_ATTEMPTS_REASON, group_id)
    params: list[tuple[Any, ...]] = []
    for lease in leases:
        event = lease.event
        part, seq = event.partition, event.sequence
        lease_id, receipt = lease.lease_id, lease.receipt
        # Anything a fetch here cannot have produced goes to the row-by-row path,
        # which answers it lease by lease instead of failing the whole batch.
        if (lease.group != group or event.stream != stream
                or part.__class__ is not int or not 0 <= part < count
                or seq.__class__ is not int or not 0 < seq <= _MAX_SEQUENCE
                or lease_id.__class__ is not str or receipt.__class__ is not str):
            return None
        params.append((*head, part, seq, lease_id, receipt, *tail))
    conn.execute("SAVEPOINT rheo_settle")
    before = conn.total_changes
    conn.executemany(sql, params)  # an error rolls the whole transaction back
    if conn.total_changes - before != len(leases):
        conn.execute("ROLLBACK TO rheo_settle")
        conn.execute("RELEASE rheo_settle")
        return None
    conn.execute("RELEASE rheo_settle")
    return group_id, {lease.event.partition for lease in leases}


def _find_stream(conn: sqlite3.Connection, name: str) -> _Stream | None:
    row = conn.execute(
        "SELECT id, name, partitions, created_at_ms FROM streams WHERE name = ?", (name,)
    ).fetchone()
    return None if row is None else _Stream(*row)


def _stream(conn: sqlite3.Connection, name: str) -> _Stream:
    s = _find_stream(conn, name)
    if s is None:
        raise UnknownStream(name)
    return s


def _find_group(conn: sqlite3.Connection, s: _Stream, name: str) -> _Group | None:
    row = conn.execute(
        "SELECT id, max_attempts, created_at_ms FROM groups WHERE stream_id = ? AND name = ?",
        (s.id, name),
    ).fetchone()
    return None if row is None else _Group(row[0], s, name, row[1], row[2])


def _group(conn: sqlite3.Connection, stream: str, name: str) -> _Group:
    """The group, in one statement; UnknownStream or UnknownGroup names what is missing."""
    row = conn.execute(
        "SELECT s.id, s.partitions, s.created_at_ms, g.id, g.max_attempts, g.created_at_ms "
        "FROM streams AS s LEFT JOIN groups AS g ON g.stream_id = s.id AND g.name = ? "
        "WHERE s.name = ?",
        (name, stream),
    ).fetchone()
    if row is None:
        raise UnknownStream(stream)
    if row[3] is None:
        raise UnknownGroup(stream, name)
    return _Group(row[3], _Stream(row[0], stream, row[1], row[2]), name, row[4], row[5])


def _stream_info(conn: sqlite3.Connection, s: _Stream) -> StreamInfo:
    high: dict[int, int] = {}
    low: dict[int, int] = {}
    for part, h, lw in conn.execute(
        "SELECT part, high_water, low_water FROM partitions WHERE stream_id = ? ORDER BY part",
        (s.id,),
    ):
        high[part] = h
        low[part] = lw
    return StreamInfo(s.name, s.partitions, s.created_at_ms, high, low)


def _event(stream: str, row: tuple[Any, ...]) -> Event:
    part, seq, event_id, type_, key, data, headers, appended_at_ms = row
    return make_event_json(stream, part, seq, event_id, type_, data, key,
                           decode_json(headers) if headers else {}, appended_at_ms)


def _events(stream: str, rows: list[tuple[Any, ...]]) -> list[Event]:
    """Events of ``rows`` (:data:`_EVENT_COLUMNS`); ``data`` is decoded on first access."""
    return [
        make_event_json(stream, part, seq, event_id, type_, data, key,
                        decode_json(headers) if headers else {}, appended_at_ms)
        for part, seq, event_id, type_, key, data, headers, appended_at_ms in rows
    ]


def _load_events(
    conn: sqlite3.Connection,
    stream_id: int,
    stream: str,
    fresh: dict[int, tuple[int, int]],
    updates: list[tuple[Any, ...]],
) -> dict[tuple[int, int], Event]:
    """The events of a fetch's leases: one range per partition for new deliveries
    (always contiguous), IN lists for redeliveries (``updates`` rows end with part, seq)."""
    rows: list[tuple[Any, ...]] = []
    for part, (first, last) in fresh.items():
        rows.extend(conn.execute(
            f"SELECT {_EVENT_COLUMNS} FROM events "
            "WHERE stream_id = ? AND part = ? AND seq BETWEEN ? AND ?",
            (stream_id, part, first, last),
        ))
    if updates:
        by_part: dict[int, list[int]] = {}
        for *_, part, seq in updates:
            by_part.setdefault(part, []).append(seq)
        for part, seqs in by_part.items():
            seqs.sort()
            for sql, params in _in_lists(
                f"SELECT {_EVENT_COLUMNS} FROM events WHERE stream_id = ? AND part = ? AND seq IN ",
                (stream_id, part), seqs,
            ):
                rows.extend(conn.execute(sql, params))
    return {(event.partition, event.sequence): event for event in _events(stream, rows)}


def _advance_frontier(conn: sqlite3.Connection, group_id: int, part: int) -> None:
    """Move the stored frontier up to the first pending delivery, or to the cursor.

    Every sequence up to the cursor has a delivery row (fetch creates them in
    order; replay, reset and trim move the cursor with what they delete), so the
    settled run after the frontier ends right before the lowest available or
    leased row: one probe of the partial index, whatever the acked history.
    """
    conn.execute(_ADVANCE_SQL, (group_id, part))


def _in_lists(
    prefix: str, params: tuple[Any, ...], values: list[Any]
) -> Iterator[tuple[str, tuple[Any, ...]]]:
    """``prefix + "(?, ?, ...)"`` statements covering ``values``, padded to fixed sizes."""
    for start in range(0, len(values), _IN_SIZES[-1]):
        chunk = values[start:start + _IN_SIZES[-1]]
        size = next(n for n in _IN_SIZES if n >= len(chunk))
        padded = chunk + [chunk[-1]] * (size - len(chunk))
        yield prefix + "(" + ", ".join("?" * size) + ")", (*params, *padded)
