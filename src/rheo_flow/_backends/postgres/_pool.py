"""Connections of the PostgreSQL backend: the driver, the pool and how operations use it.

asyncpg is imported only when a backend is built (:func:`driver`), so importing
rheo_flow never needs it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import parse_qsl, urlsplit

from ..._model._errors import BackendUnavailable
from .._guard import mark_sent, masked_cause
from .._urls import require_driver, scrub_secrets, unreachable

if TYPE_CHECKING:
    import asyncpg

__all__ = ["Fetches", "PoolCalls", "connect", "connect_listener", "create_pool", "driver"]


def driver() -> Any:
    """The asyncpg module, or the error naming the ``postgres`` extra when it is missing."""
    require_driver("PostgreSQL", "postgres", "asyncpg")
    import asyncpg

    return asyncpg


class Fetches(Protocol):
    """What runs one statement and returns its rows: :class:`PoolCalls`, or the caller's
    connection in the outbox (checked by :class:`~._outbox.CallerConnections`)."""

    async def fetch(self, sql: str, *args: Any) -> list[Any]: ...


class PoolCalls:
    """The asyncpg pool as operations use it.

    Each call marks its request as sent once it holds a connection (see
    :func:`~rheo_flow._backends._guard.mark_sent`), and a call cancelled mid-way
    (the operation timeout, or its caller) terminates its connection: asyncpg
    would otherwise cancel the statement over a new connection and hold the old
    one until the server confirms, which never happens while the network stalls.
    """

    __slots__ = ("_pool",)

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for several statements."""
        pool = self._pool
        conn = await pool.acquire()
        mark_sent()
        try:
            yield conn
        except asyncio.CancelledError:
            conn.terminate()
            raise
        finally:
            await pool.release(conn)

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """``Connection.fetch`` on a pooled connection."""
        rows: list[Any] = await self._call("fetch", sql, args)
        return rows

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        """``Connection.fetchrow`` on a pooled connection."""
        return await self._call("fetchrow", sql, args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """``Connection.fetchval`` on a pooled connection."""
        return await self._call("fetchval", sql, args)

    async def _call(self, method: str, sql: str, args: tuple[Any, ...]) -> Any:
        # Not through acquire(): one call is the hot path, a context manager costs.
        pool = self._pool
        conn = await pool.acquire()
        mark_sent()
        try:
            return await getattr(conn, method)(sql, *args)
        except asyncio.CancelledError:
            conn.terminate()
            raise
        finally:
            await pool.release(conn)


def _server_settings(url: str, settings: dict[str, str], name: str) -> dict[str, str]:
    """``settings`` plus ``application_name=name`` unless the URL names the application."""
    if not any(key == "application_name" for key, _ in parse_qsl(urlsplit(url).query)):
        settings["application_name"] = name
    return settings


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release hook of an owned pool: nothing to reset.

    asyncpg's default runs ``RESET ALL; UNLISTEN *; ...`` on every release: a
    round trip per operation. This backend never changes session state on pooled
    connections (LISTEN has its own connection, transactions are scoped), and
    asyncpg still rolls back a transaction left open before calling this.
    """


@contextlib.contextmanager
def _reaching(url: str) -> Iterator[None]:
    """Connecting: a server that cannot be reached raises the unreachable error naming ``url``."""
    asyncpg = driver()
    try:
        yield
    except (TimeoutError, OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        error = unreachable("PostgreSQL", url, exc)
        if "unsupported startup parameter" in str(exc):
            # PgBouncer's answer to a session setting it does not pass on (jit).
            error = BackendUnavailable(
                f"{error} (a connection pooler such as PgBouncer is in front: add "
                "pooler=transaction to the URL, or pass pooler='transaction')")
        # asyncpg's message may quote the URL: the cause kept is a masked copy.
        raise error from masked_cause(exc, lambda text: scrub_secrets(text, url))


def _pooled_options(pooler: str | None) -> dict[str, Any]:
    """The asyncpg options of connections through a pooler (none for a direct one).

    Behind a transaction-pooling proxy each transaction may run on another server
    session: asyncpg's statement cache is off (it would name prepared statements
    that the next session does not have; an uncached statement is prepared
    unnamed and parsed again with its execution), and no startup parameter beyond
    those a proxy passes on (PgBouncer refuses others, such as ``jit``).
    """
    return {} if pooler is None else {"statement_cache_size": 0}


async def create_pool(url: str, min_size: int, max_size: int, timeout_ms: int,
                      pooler: str | None = None) -> asyncpg.Pool:
    """A pool of the backend's own, direct or through ``pooler`` (see :func:`_pooled_options`)."""
    # JIT compiling the claim statements would cost more than running them; a session
    # setting, so only on direct connections (through a pooler: the server's default).
    settings = {"jit": "off"} if pooler is None else {}
    with _reaching(url):
        pool: asyncpg.Pool = await driver().create_pool(
            url,
            min_size=min_size,
            max_size=max_size,
            timeout=timeout_ms / 1000,
            server_settings=_server_settings(url, settings, "rheo_flow"),
            reset=_keep_session,
            **_pooled_options(pooler),
        )
    return pool


async def connect(url: str, shown: str, pooler: str | None = None) -> asyncpg.Connection:
    """One connection outside any pool (to migrate a schema); errors name the URL ``shown``."""
    with _reaching(shown):
        conn: asyncpg.Connection = await driver().connect(url, **_pooled_options(pooler))
    return conn


async def connect_listener(url: str, timeout_ms: int) -> asyncpg.Connection:
    """The dedicated LISTEN connection of a backend that owns its pool.

    Errors propagate as asyncpg raised them: the listener reports them and polls.
    """
    conn: asyncpg.Connection = await driver().connect(
        url, server_settings=_server_settings(url, {}, "rheo_flow.listen"),
        timeout=timeout_ms / 1000,
    )
    return conn
