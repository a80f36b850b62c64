"""Throwaway servers: a SIGKILL and a restart keep what was acknowledged as written.

Each test runs its own PostgreSQL / Redis (never the shared ones): without the
binaries it is skipped, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import asyncpg
import pytest
import redis.asyncio as aioredis

from _throwaway import throwaway
from rheo_flow import NewEvent, Rheo
from rheo_flow._faults._servers import PostgresServer, RedisServer

pytestmark = pytest.mark.slow


async def test_postgres_kill_and_restart_keeps_appended_events(
        throwaway_postgres: PostgresServer) -> None:
    url = f"{throwaway_postgres.url}?schema=kill&listen=false"
    async with Rheo(url) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", {"n": n}) for n in range(50)])
    throwaway_postgres.kill()
    assert not throwaway_postgres.running
    with pytest.raises(OSError, match=str(throwaway_postgres.port)):
        await asyncpg.connect(throwaway_postgres.url, timeout=5)
    throwaway_postgres.start()
    async with Rheo(url) as rheo:
        assert await rheo.high_water("s") == {0: 50}
    assert throwaway_postgres.kills == 1


async def test_redis_kill_with_appendfsync_always_keeps_appended_events(
        throwaway_redis: RedisServer) -> None:
    assert throwaway_redis.appendfsync == "always"
    async with Rheo(throwaway_redis.url) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", {"n": n}) for n in range(50)])
    throwaway_redis.restart()
    async with Rheo(throwaway_redis.url) as rheo:
        assert await rheo.high_water("s") == {0: 50}
    client = aioredis.Redis.from_url(throwaway_redis.url)
    try:
        assert await client.config_get("appendonly") == {"appendonly": "yes"}
    finally:
        await client.aclose()


def test_servers_never_take_the_shared_ports_and_clean_up(ci: bool) -> None:
    with _redis(ci) as server:
        root = server.root
        assert server.port not in (5432, 6379)
        assert server.running
    assert not server.running
    assert not root.exists()


def _redis(ci: bool) -> RedisServer:
    return throwaway(RedisServer, ci)
