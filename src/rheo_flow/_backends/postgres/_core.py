"""What every operation of the PostgreSQL backend builds on: its options, its pool
opened on first use (the schema checked or migrated), cached ids, and wake-ups.

:class:`PostgresCore` holds that state; the operations are mixins over it (see
:mod:`._backend`), each in the module of its concern.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Self

from ..._backend import Backend
from ..._model._capabilities import Capabilities
from ..._model._errors import InvalidArgument, UnknownGroup, UnknownStream
from ..._model._settle_results import SettleKind
from .._guard import DEFAULT_TIMEOUT_MS, check_timeout_ms
from .._issued import Issued
from .._shared import Rotation
from .._urls import check_hosts, redact_url
from . import _errors
from ._config import (
    DEFAULT_SCHEMA,
    channel,
    check_listen_url,
    check_pooler,
    check_schema,
    check_size,
    split_url,
)
from ._listener import Listener
from ._migrations import ensure_schema
from ._outbox import CallerConnections
from ._pool import Fetches, PoolCalls, connect_listener, create_pool, driver
from ._sql import Statements

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresCore", "StreamMeta"]

log = logging.getLogger("rheo_flow.postgres")


@dataclass(frozen=True, slots=True)
class StreamMeta:
    """A stream's row: its id, partition count and creation time."""

    id: int
    partitions: int
    created_at_ms: int


class PostgresCore(Backend):
    """The backend's configuration, connections, id caches and wake-ups (see
    :class:`~rheo_flow.backends.PostgresBackend` for the options)."""

    def __init__(
        self,
        *,
        pool: asyncpg.Pool | None = None,
        url: str | None = None,
        schema: str = DEFAULT_SCHEMA,
        listen: bool = True,
        migrate: bool = True,
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        pooler: str | None = None,
        listen_url: str | None = None,
    ) -> None:
        if (pool is None) == (url is None):
            raise InvalidArgument("PostgresBackend needs exactly one of pool= or url=")
        self._timeout_ms = check_timeout_ms(timeout_ms)
        self._deadline_grace_ms = 0
        if url is not None and (not isinstance(url, str) or "://" not in url):
            raise InvalidArgument(f"not a PostgreSQL URL: {redact_url(str(url))!r}")
        if url is not None:
            check_hosts(url, "PostgreSQL")
        self._schema = check_schema(schema)
        self._pool_min = check_size("pool_min_size", pool_min_size, 0)
        self._pool_max = check_size("pool_max_size", pool_max_size, 1)
        if self._pool_min > self._pool_max:
            raise InvalidArgument(
                f"pool_min_size ({pool_min_size}) is larger than pool_max_size ({pool_max_size})"
            )
        driver()
        self._url = url
        self._pool: asyncpg.Pool | None = pool
        self._calls: PoolCalls | None = None if pool is None else PoolCalls(pool)
        self._owns_pool = pool is None
        self._pooler = check_pooler(pooler)
        self._listen_url = check_listen_url(listen_url)
        if self._listen_url is not None and not listen:
            raise InvalidArgument("listen_url names a LISTEN connection, but listen is off")
        # Through a transaction pooler a LISTEN on a pooled session would hear nothing
        # once the transaction ends: push wake-ups only over a direct listen_url.
        self._listen = bool(listen) and (self._pooler is None or self._listen_url is not None)
        self._migrate = bool(migrate)
        self._capabilities = Capabilities(
            durable=True, distributed=True, push_wakeups=self._listen, skip_locked=True,
            server_clock=True, key_ordering=True, last_error=True, in_transaction=True, pause=True,
            delayed_delivery=True, retention=True,
        )
        self._sql = Statements.for_schema(self._schema)
        self._channel = channel(self._schema)
        self._callers = CallerConnections(self._schema, self._sql.database_identity)
        self._open_lock = asyncio.Lock()
        self._opened = False
        self._streams: dict[str, StreamMeta] = {}
        self._scheduled_streams: set[int] = set()
        """The ids of the streams known to be flagged as holding scheduled events."""
        self._groups: dict[tuple[str, str], int] = {}
        self._issued = Issued()  # the leases fetches built: acks of those skip checks
        self._rotation: Rotation[int] = Rotation()
        self._listener = Listener(self._channel, self._listen_connection,
                                  self._release_listen_connection)

    @classmethod
    def from_url(cls, url: str) -> Self:
        """Build a backend that owns its pool from ``postgresql://`` / ``postgres://``."""
        driver_url, options = split_url(url)
        return cls(url=driver_url, **options)

    @property
    def capabilities(self) -> Capabilities:
        """Durable, distributed, SKIP LOCKED claims, server clock, key-ordered groups,
        appends and acks in the application's transaction (asyncpg, psycopg 3); LISTEN/NOTIFY
        wake-ups unless built with ``listen=False``, or through a pooler without
        ``listen_url``."""
        return self._capabilities

    @property
    def pooler(self) -> str | None:
        """``"transaction"`` when connections go through a transaction-pooling proxy."""
        return self._pooler

    @property
    def schema(self) -> str:
        """The schema holding this backend's tables."""
        return self._schema

    # Lifecycle ---------------------------------------------------------------

    async def open(self) -> None:
        await self._ready()

    async def _ready(self) -> PoolCalls:
        """The pool, created (when owned) and the schema checked on first use."""
        calls = self._calls
        if self._opened and calls is not None:
            return calls
        async with self._open_lock:
            if self._pool is None:
                self._pool = await create_pool(self._owned_url(), self._pool_min, self._pool_max,
                                               self._timeout_ms, self._pooler)
                self._calls = PoolCalls(self._pool)
            pool = self._pool
            calls = self._calls or PoolCalls(pool)
            self._calls = calls
            if not self._opened:
                try:
                    async with calls.acquire() as conn:
                        await ensure_schema(conn, self._schema, apply=self._migrate)
                except BaseException:
                    if self._owns_pool:
                        self._pool = self._calls = None
                        pool.terminate()
                    raise
                self._opened = True
            return calls

    async def close(self) -> None:
        await self._listener.stop()
        async with self._open_lock:
            self._opened = False
            pool = self._pool
            if pool is not None and self._owns_pool:
                self._pool = self._calls = None
                try:
                    # A graceful close waits on every connection: not through a stall.
                    await asyncio.wait_for(pool.close(), self._timeout_ms / 1000)
                except Exception as exc:
                    log.debug("closing the pool failed (%s); terminating it", exc)
                    pool.terminate()

    async def _check_caller(self, conn: object, operation: str) -> Fetches:
        """The statements' way onto an application's connection; refuse one the backend
        cannot write on (see :class:`~._outbox.CallerConnections`)."""
        return await self._callers.check(conn, operation, await self._ready())

    # Errors ------------------------------------------------------------------

    def _error_prefix(self) -> str:
        return _errors.error_prefix(self._url)

    def _scrub(self, text: str) -> str:
        return _errors.scrub(self._url, text)

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        """Map asyncpg errors to settle kinds (see :func:`._errors.classify_error`)."""
        return _errors.classify_error(exc)

    # Lookups -----------------------------------------------------------------

    async def _stream(self, name: str) -> StreamMeta:
        """The stream's row (cached), or :class:`~rheo_flow.UnknownStream`."""
        meta = self._streams.get(name)
        if meta is None:
            pool = await self._ready()
            row = await pool.fetchrow(self._sql.stream, name)
            if row is None:
                raise UnknownStream(name)
            meta = StreamMeta(row["id"], row["partitions"], row["created_at_ms"])
            self._streams[name] = meta
        return meta

    async def _group_id(self, stream: str, group: str) -> int:
        """The group's id (cached), or :class:`~rheo_flow.UnknownGroup`."""
        gid = self._groups.get((stream, group))
        if gid is None:
            meta = await self._stream(stream)
            pool = await self._ready()
            row = await pool.fetchrow(self._sql.group, meta.id, group)
            if row is None:
                raise UnknownGroup(stream, group)
            gid = row["id"]
            self._groups[(stream, group)] = gid
        return gid

    def _forget(self) -> None:
        """Drop cached ids (they outlive nothing but a dropped schema)."""
        self._streams.clear()
        self._groups.clear()

    # Wake-ups ----------------------------------------------------------------

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Wait for a ``NOTIFY`` from an append to ``stream``, or ``timeout`` seconds.

        Falls back to sleeping when ``listen`` is off (or there is a pooler and no
        ``listen_url``) or no LISTEN connection can be had. A notification that
        arrived after this backend's latest fetch of the stream started (so that
        fetch may have missed its events) returns at once instead of being lost
        between the fetch and the wait.
        """
        await self._stream(stream)
        if not self._listen or not await self._listener.ensure():
            await asyncio.sleep(timeout)
            return False
        return await self._listener.wait(stream, timeout)

    async def _listen_connection(self) -> asyncpg.Connection:
        if self._listen_url is not None:
            return await connect_listener(self._listen_url, self._timeout_ms)
        if self._owns_pool:
            return await connect_listener(self._owned_url(), self._timeout_ms)
        await self._ready()
        held: asyncpg.Connection = await self._opened_pool().acquire(
            timeout=self._timeout_ms / 1000)
        return held

    def _owned_url(self) -> str:
        """The URL of a pool this backend makes (the backend was built from one)."""
        if self._url is None:
            raise RuntimeError("a PostgresBackend built on a pool makes no pool of its own")
        return self._url

    def _opened_pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise RuntimeError("the PostgreSQL backend is not open")
        return self._pool

    async def _release_listen_connection(self, conn: asyncpg.Connection) -> None:
        if self._owns_pool or self._listen_url is not None:
            await conn.close(timeout=5)
        else:
            await self._opened_pool().release(conn)
