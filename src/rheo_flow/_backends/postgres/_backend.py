"""The PostgreSQL backend's public face: :class:`PostgresBackend` (its operations
gathered from the modules of their concerns) and :func:`migrate`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..._model._errors import InvalidArgument
from .._guard import guard_operations
from ._config import DEFAULT_SCHEMA, check_schema
from ._groups import GroupOps
from ._lag import LagOps
from ._leases import LeaseOps
from ._migrations import ensure_schema
from ._pool import connect, driver
from ._retention import RetentionOps
from ._streams import StreamOps

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresBackend", "migrate"]


@guard_operations(tracks_sending=True)
class PostgresBackend(StreamOps, GroupOps, LeaseOps, RetentionOps, LagOps):
    """Durable, distributed backend on PostgreSQL through an asyncpg pool.

    Build it from a URL (``PostgresBackend.from_url("postgresql://user@host/db?schema=app")``,
    or ``Rheo("postgresql://...")``): it then creates and owns its pool and closes
    it in :meth:`close`. Or hand it the host's own pool
    (``PostgresBackend(pool=pool, schema="app")``), which it uses but never closes.

    ``schema`` (default ``"rheo_flow"``) holds every table; :meth:`open` creates
    or upgrades it (see :func:`migrate`) unless ``migrate=False``, in which case a
    schema that is missing or behind is an error naming ``rheo-flow migrate``.
    ``listen`` enables push wake-ups through ``LISTEN/NOTIFY``: one dedicated
    connection (for a host pool, one connection held from it) while anything
    waits; without it idle consumers poll.

    ``timeout_ms`` (default 10,000) bounds every operation, connecting included:
    one that runs longer is abandoned (its connection closed) and raises
    :class:`~rheo_flow.BackendUnavailable` when nothing was sent yet, else
    :class:`~rheo_flow.OutcomeUnknown` for a write (a settle reports ``ambiguous``).

    ``pooler="transaction"`` says that the connections go through a proxy pooling
    server sessions per transaction (PgBouncer's ``pool_mode = transaction``): the
    owned pool then keeps no prepared statements across calls and sends no
    ``jit`` setting, and nothing relies on session state. A LISTEN through such a
    proxy hears nothing, so wake-ups need ``listen_url``, a URL of the server
    itself for the one LISTEN connection; without it idle consumers poll (and
    ``capabilities.push_wakeups`` is false). A host's pool behind such a proxy
    must be made with ``statement_cache_size=0``. ``listen_url`` also serves
    without a pooler: the LISTEN connection then goes there.

    URL options (query string): ``schema``, ``pool_min_size``, ``pool_max_size``,
    ``listen``, ``migrate``, ``timeout_ms``, ``pooler``, ``listen_url``
    (percent-encoded); anything else is passed on to asyncpg.
    """

    name = "postgres"


async def migrate(url_or_pool: str | asyncpg.Pool | asyncpg.Connection,
                  schema: str = DEFAULT_SCHEMA) -> int:
    """Create or upgrade the rheo_flow schema; returns the schema version now in place.

    ``url_or_pool`` is a ``postgresql://`` URL (its ``schema`` query option, when
    present, wins over ``schema``), an asyncpg pool or a connection. Safe to run
    from several processes at once: migrations apply under a transaction-scoped
    advisory lock, each exactly once. A schema newer than this code is refused.
    """
    asyncpg = driver()
    if isinstance(url_or_pool, str):
        backend = PostgresBackend.from_url(url_or_pool)
        schema = backend.schema if "schema=" in url_or_pool else check_schema(schema)
        conn = await connect(backend._owned_url(), shown=url_or_pool, pooler=backend.pooler)
        try:
            return await ensure_schema(conn, schema, apply=True)
        finally:
            await conn.close()
    schema = check_schema(schema)
    if isinstance(url_or_pool, asyncpg.Pool):
        async with url_or_pool.acquire() as pooled:
            return await ensure_schema(pooled, schema, apply=True)
    if isinstance(url_or_pool, asyncpg.Connection):
        return await ensure_schema(url_or_pool, schema, apply=True)
    raise InvalidArgument(
        f"migrate() needs a postgresql:// URL, an asyncpg pool or a connection, "
        f"got {type(url_or_pool).__name__}"
    )
