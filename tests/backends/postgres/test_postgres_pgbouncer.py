"""The PostgreSQL backend through PgBouncer in transaction pooling.

Against the PgBouncer test server (``RHEO_PGBOUNCER_URL``, see tests/conftest.py): the
error a user meets without ``pooler=transaction``, polling when there is no
direct ``listen_url``, LISTEN over one when there is, a host's pool made as
asyncpg documents for PgBouncer, and the options' validation. The conformance
kit's ``pgbouncer`` column and ``tests/backends/postgres/test_postgres_processes.py`` run the
whole contract and four competing processes through the same server.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

import asyncpg
import pytest

from _pgbouncer import through_pgbouncer
from rheo_flow import BackendUnavailable, InvalidArgument, NewEvent, Rheo
from rheo_flow._backends._urls import redact_url
from rheo_flow.backends import PostgresBackend

WaitUntil = Callable[..., Awaitable[None]]


@pytest.fixture
def schema(postgres_schema_url: str) -> str:
    """A schema of this test only (dropped afterwards)."""
    return dict(parse_qsl(urlsplit(postgres_schema_url).query))["schema"]


@pytest.fixture
def bouncer(pgbouncer_url: str) -> str:
    """PgBouncer's URL without the backend's options (asyncpg's view of it)."""
    return urlunsplit(urlsplit(pgbouncer_url)._replace(query=""))


async def test_without_the_pooler_option_the_error_says_what_to_add(bouncer: str,
                                                                     schema: str) -> None:
    rheo = Rheo(f"{bouncer}?schema={schema}")
    with pytest.raises(BackendUnavailable, match="add pooler=transaction to the URL"):
        async with rheo:
            pass


async def test_without_a_listen_url_idle_consumers_poll(bouncer: str, schema: str) -> None:
    backend = PostgresBackend.from_url(f"{bouncer}?schema={schema}&pooler=transaction")
    assert backend.pooler == "transaction"
    assert not backend.capabilities.push_wakeups, "a LISTEN through the pooler hears nothing"
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=2)
        await rheo.append("s", [NewEvent("t", key=str(i)) for i in range(20)])
        leases = await rheo.fetch("s", "g", limit=50)
        assert len(leases) == 20
        assert all(r.ok for r in await rheo.ack(leases))
        # The wait is a sleep: it returns False at its timeout, never early.
        assert await rheo.wait_for_append("s", 0.05) is False


async def test_a_direct_listen_url_brings_push_wake_ups(bouncer: str, postgres_url: str,
                                                        schema: str,
                                                        wait_until: WaitUntil) -> None:
    url = through_pgbouncer(f"{bouncer}?pooler=transaction", postgres_url, schema)
    backend = PostgresBackend.from_url(url)
    assert backend.capabilities.push_wakeups
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        waiter = asyncio.create_task(rheo.wait_for_append("s", 30))
        await wait_until(lambda: backend._listener.connection is not None)
        # The LISTEN connection is the server's own, not one through PgBouncer.
        listener = backend._listener.connection
        assert listener is not None
        assert listener._addr[1] == urlsplit(postgres_url).port  # type: ignore[attr-defined]
        await rheo.append("s", NewEvent("t"))
        assert await waiter


async def test_a_host_pool_made_for_pgbouncer_works(bouncer: str, schema: str) -> None:
    # asyncpg's advice for PgBouncer: no statement cache.
    pool = await asyncpg.create_pool(bouncer, min_size=1, max_size=4, statement_cache_size=0)
    try:
        backend = PostgresBackend(pool=pool, schema=schema, pooler="transaction")
        async with Rheo(backend) as rheo:
            await rheo.create_stream("s", partitions=4)
            await asyncio.gather(*(rheo.append("s", NewEvent("t", key=str(i)))
                                   for i in range(40)))
            leases = await rheo.fetch("s", "g", limit=100)
            assert sorted(lease.event.key for lease in leases) == sorted(
                str(i) for i in range(40))
            assert all(r.ok for r in await rheo.ack(leases))
    finally:
        await pool.close()


def test_pooler_options_are_validated() -> None:
    with pytest.raises(InvalidArgument, match="pooler must be one of none, transaction"):
        PostgresBackend.from_url("postgresql://h/db?pooler=session")
    with pytest.raises(InvalidArgument, match="listen_url must be a postgresql:// URL"):
        PostgresBackend.from_url("postgresql://h/db?listen_url=redis://h")
    with pytest.raises(InvalidArgument, match="listen is off"):
        PostgresBackend.from_url(
            "postgresql://h/db?listen=false&listen_url=postgresql%3A%2F%2Fh%2Fdb")
    assert PostgresBackend.from_url("postgresql://h/db?pooler=none").pooler is None


def test_a_listen_url_password_never_shows() -> None:
    direct = quote("postgresql://u:hunter2@db:5432/app", safe="")
    url = f"postgresql://u:hunter3@bouncer:6432/app?pooler=transaction&listen_url={direct}"
    backend = PostgresBackend.from_url(url)
    assert backend._listen_url == "postgresql://u:hunter2@db:5432/app"
    shown = repr(Rheo(backend)) + repr(backend) + redact_url(url)
    assert "hunter2" not in shown
    assert "hunter3" not in shown
    assert "***" in redact_url(url)
