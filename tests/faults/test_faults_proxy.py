"""The fault-injection proxy, observed from real asyncpg and redis-py clients.

The proxy forwards to the shared test servers; only connections through the
proxy are broken, so nothing else using those servers notices.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from rheo_flow import InvalidArgument
from rheo_flow._faults._proxy import FaultProxy


@pytest.fixture
async def pg_proxy(postgres_url: str) -> AsyncIterator[FaultProxy]:
    async with FaultProxy.for_url(postgres_url) as proxy:
        yield proxy


@pytest.fixture
async def redis_proxy(redis_url: str) -> AsyncIterator[FaultProxy]:
    async with FaultProxy.for_url(redis_url) as proxy:
        yield proxy


def _redis(url: str) -> aioredis.Redis:
    """A client that does not retry, so every fault reaches the caller."""
    return aioredis.Redis.from_url(url, retry=Retry(NoBackoff(), 0))


def test_url_points_at_the_proxy_and_keeps_the_rest() -> None:
    proxy = FaultProxy.for_url("postgresql://u:secret@db.example:6543/app?schema=x")
    assert (proxy.target_host, proxy.target_port) == ("db.example", 6543)
    assert FaultProxy.for_url("redis://cache/2").target_port == 6379
    proxy._port, proxy._server = 40000, object()  # type: ignore[assignment]
    assert proxy.url("postgresql://u:secret@db.example:6543/app?schema=x") == \
        "postgresql://u:secret@127.0.0.1:40000/app?schema=x"
    with pytest.raises(InvalidArgument, match="sqlite"):
        FaultProxy.for_url("sqlite:///x.db")
    with pytest.raises(InvalidArgument, match=r"\*\*\*") as info:
        FaultProxy.for_url("postgresql://u:secret@h1,h2/app")
    assert "secret" not in str(info.value)


async def test_postgres_traffic_passes(pg_proxy: FaultProxy, postgres_url: str) -> None:
    conn = await asyncpg.connect(pg_proxy.url(postgres_url))
    try:
        assert await conn.fetchval("SELECT 41 + 1") == 42
        assert pg_proxy.connections == 1
    finally:
        await conn.close()


async def test_postgres_drop_breaks_open_connections_only(
        pg_proxy: FaultProxy, postgres_url: str) -> None:
    conn = await asyncpg.connect(pg_proxy.url(postgres_url))
    try:
        assert pg_proxy.drop() == 1
        with pytest.raises((asyncpg.ConnectionDoesNotExistError, ConnectionError)):
            await conn.fetchval("SELECT 1")
    finally:
        conn.terminate()
    fresh = await asyncpg.connect(pg_proxy.url(postgres_url))
    try:
        assert await fresh.fetchval("SELECT 1") == 1
    finally:
        await fresh.close()
    assert pg_proxy.stats.dropped == 1


async def test_postgres_blackhole_holds_queries_then_drops(
        pg_proxy: FaultProxy, postgres_url: str) -> None:
    conn = await asyncpg.connect(pg_proxy.url(postgres_url))
    try:
        hole = pg_proxy.blackhole(0.5, then="drop")
        query = asyncio.create_task(conn.fetchval("SELECT 1"))
        connecting = asyncio.create_task(asyncpg.connect(pg_proxy.url(postgres_url)))
        await hole
        # Nothing crossed the proxy while it held the traffic.
        assert not query.done()
        assert not connecting.done()
        with pytest.raises((asyncpg.ConnectionDoesNotExistError, ConnectionError)):
            await query
        with pytest.raises((asyncpg.ConnectionDoesNotExistError, ConnectionError)):
            await connecting
    finally:
        conn.terminate()


async def test_postgres_blackhole_that_heals_delivers_late(
        pg_proxy: FaultProxy, postgres_url: str) -> None:
    conn = await asyncpg.connect(pg_proxy.url(postgres_url))
    try:
        hole = pg_proxy.blackhole(0.3, then="resume")
        assert pg_proxy.blackholed
        query = asyncio.create_task(conn.fetchval("SELECT 7"))
        await hole
        assert not query.done()
        assert await query == 7
        assert not pg_proxy.blackholed
    finally:
        await conn.close()


async def test_postgres_partial_blackhole_holds_some_connections_only(
        pg_proxy: FaultProxy, postgres_url: str) -> None:
    url = pg_proxy.url(postgres_url)
    conns = [await asyncpg.connect(url), await asyncpg.connect(url)]
    try:
        hole = pg_proxy.blackhole(2.0, then="resume", share=0.5)
        queries = [asyncio.create_task(c.fetchval("SELECT $1::int", i))
                   for i, c in enumerate(conns)]
        _, [held] = await asyncio.wait(queries, return_when=asyncio.FIRST_COMPLETED)
        assert pg_proxy.blackholed  # one query passed while the other connection was held
        await hole
        assert not held.done()
        assert await held == queries.index(held)
    finally:
        for conn in conns:
            await conn.close()


async def test_postgres_silent_open_connections_while_new_ones_pass(
        pg_proxy: FaultProxy, postgres_url: str) -> None:
    url = pg_proxy.url(postgres_url)
    old = await asyncpg.connect(url)
    try:
        hole = pg_proxy.blackhole(60, then="resume", hold_new=False)
        query = asyncio.create_task(old.fetchval("SELECT 5"))
        new = await asyncpg.connect(url)
        try:
            assert await new.fetchval("SELECT 6") == 6
        finally:
            await new.close()
        assert not query.done()  # the old connection is silent meanwhile
        pg_proxy.pass_traffic()
        assert hole.cancelled() or not pg_proxy.blackholed
        assert await query == 5
    finally:
        await old.close()


async def test_postgres_delay_applies_to_every_round_trip(
        pg_proxy: FaultProxy, postgres_url: str) -> None:
    conn = await asyncpg.connect(pg_proxy.url(postgres_url))
    try:
        pg_proxy.set_delay(0.1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await conn.fetchval("SELECT 3") == 3
        # A query and its answer each crossed the proxy once: two delays at least.
        assert loop.time() - started >= 0.2
        pg_proxy.pass_traffic()
        assert await conn.fetchval("SELECT 4") == 4
    finally:
        await conn.close()


async def test_redis_drop_blackhole_and_delay(redis_proxy: FaultProxy, redis_url: str) -> None:
    client = _redis(redis_proxy.url(redis_url))
    try:
        assert await client.ping()
        assert redis_proxy.drop() == 1
        with pytest.raises(RedisConnectionError):
            await client.ping()
        assert await client.ping()  # a new connection passes

        hole = redis_proxy.blackhole(0.3, then="drop")
        ping = asyncio.create_task(client.ping())
        await hole
        assert not ping.done()
        with pytest.raises(RedisConnectionError):
            await ping

        hole = redis_proxy.blackhole(0.3, then="resume")
        echo = asyncio.create_task(client.echo("late"))
        await hole
        assert not echo.done()
        assert await echo == b"late"

        redis_proxy.set_delay(0.1)
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await client.echo("slow") == b"slow"
        assert loop.time() - started >= 0.2
    finally:
        await client.aclose()


async def test_postgres_lost_reply_means_the_work_was_done(
        pg_proxy: FaultProxy, postgres_url: str) -> None:
    conn = await asyncpg.connect(pg_proxy.url(postgres_url))
    direct = await asyncpg.connect(postgres_url)
    try:
        await direct.execute("CREATE SEQUENCE IF NOT EXISTS proxy_test_lost_reply")
        # asyncpg prepares a statement in a round trip of its own: prepare it first,
        # so that the answer lost is the one to the execution.
        await conn.fetchval("SELECT nextval('proxy_test_lost_reply')")
        before = await direct.fetchval("SELECT nextval('proxy_test_lost_reply')")
        pg_proxy.lose_replies(1)
        with pytest.raises((asyncpg.ConnectionDoesNotExistError, ConnectionError)):
            await conn.fetchval("SELECT nextval('proxy_test_lost_reply')")
        # The statement ran although its answer never arrived.
        assert await direct.fetchval("SELECT nextval('proxy_test_lost_reply')") == before + 2
        assert pg_proxy.stats.replies_lost == 1
    finally:
        conn.terminate()
        await direct.execute("DROP SEQUENCE IF EXISTS proxy_test_lost_reply")
        await direct.close()


async def test_redis_lost_reply_means_the_write_was_done(
        redis_proxy: FaultProxy, redis_url: str) -> None:
    client = _redis(redis_proxy.url(redis_url))
    direct = _redis(redis_url)
    key = "proxy-test:lost-reply"
    try:
        await direct.delete(key)
        await client.ping()  # connected: the answer lost is not the handshake's
        redis_proxy.lose_replies(1)
        with pytest.raises(RedisConnectionError):
            await client.incr(key)
        assert await direct.get(key) == b"1"
        assert await client.incr(key) == 2  # the next answer passes
    finally:
        await direct.delete(key)
        await client.aclose()
        await direct.aclose()


async def test_a_server_that_is_down_gets_its_clients_reset() -> None:
    async with FaultProxy("127.0.0.1", 1) as proxy:
        with pytest.raises((ConnectionError, OSError, asyncpg.PostgresError)):
            await asyncpg.connect(f"postgresql://x@127.0.0.1:{proxy.port}/x", timeout=5)
        assert proxy.stats.upstream_failures == 1


async def test_bad_fault_arguments_are_refused(pg_proxy: FaultProxy) -> None:
    with pytest.raises(InvalidArgument):
        pg_proxy.set_delay(-1)
    with pytest.raises(InvalidArgument):
        pg_proxy.blackhole(0)
    with pytest.raises(InvalidArgument):
        pg_proxy.lose_replies(-1)
    with pytest.raises(InvalidArgument):
        pg_proxy.blackhole(1, share=0)
    with pytest.raises(InvalidArgument):
        pg_proxy.blackhole(1, then="later")  # type: ignore[arg-type]
