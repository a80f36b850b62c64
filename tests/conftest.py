"""Shared fixtures: test servers, an in-memory instance, and waiting on conditions.

Servers are named by environment variables (with local defaults):

* ``RHEO_POSTGRES_URL`` (``postgresql://postgres@127.0.0.1:5432/test``)
* ``RHEO_REDIS_URL`` (``redis://127.0.0.1:6379/0``)
* ``RHEO_MONGO_URL`` (``mongodb://127.0.0.1:37017/rheo_test``: the emulator that
  ``.ci/mongo-emulator.sh`` starts)
* ``RHEO_PGBOUNCER_URL`` (``postgresql://postgres@127.0.0.1:6432/test?pooler=transaction``:
  the PgBouncer in transaction pooling that ``.ci/pgbouncer.sh`` starts)
* ``RHEO_REDIS_CLUSTER_URL`` (``redis+cluster://127.0.0.1:7000``: the three-primary
  cluster that ``.ci/redis-cluster.sh`` starts)

A test that needs a server it cannot reach is skipped with a message naming the
variable, except under ``CI=true``, where it fails: CI starts every server.
Setting a variable to the empty string disables those tests explicitly.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from _throwaway import throwaway
from rheo_flow import ManualClock, Rheo
from rheo_flow._faults._servers import PostgresServer, RedisServer
from rheo_flow.backends import MemoryBackend

SERVERS: dict[str, tuple[str, str, int]] = {
    # kind: (variable, default URL, default port)
    "postgres": ("RHEO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test", 5432),
    "redis": ("RHEO_REDIS_URL", "redis://127.0.0.1:6379/0", 6379),
    "mongo": ("RHEO_MONGO_URL", "mongodb://127.0.0.1:37017/rheo_test", 37017),
    "pgbouncer": ("RHEO_PGBOUNCER_URL",
                  "postgresql://postgres@127.0.0.1:6432/test?pooler=transaction", 6432),
    "redis-cluster": ("RHEO_REDIS_CLUSTER_URL", "redis+cluster://127.0.0.1:7000", 7000),
}

_reachable: dict[str, str | None] = {}


def in_ci() -> bool:
    """Whether the suite runs under CI (where every server must be up)."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def server_url(kind: str) -> str:
    """The URL of a test server (a key of :data:`SERVERS`), or skip / fail.

    Skips with a message naming the variable when the server cannot be reached;
    fails instead under ``CI=true``.
    """
    variable, default, port = SERVERS[kind]
    url = os.environ.get(variable, default)
    if not url:
        pytest.skip(f"{variable} is set empty: {kind} tests are disabled")
    if kind not in _reachable:
        _reachable[kind] = _probe(url, port)
    problem = _reachable[kind]
    if problem is not None:
        message = f"{kind} test server unreachable ({problem}); set {variable} to its URL"
        if in_ci():
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return url


def _probe(url: str, default_port: int) -> str | None:
    """A TCP connect to the URL's host: None when it answers, else what went wrong."""
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    try:
        port = parts.port or default_port
    except ValueError:
        return "the URL has an invalid port"
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


@pytest.fixture(scope="session")
def ci() -> bool:
    """Whether the suite runs under ``CI=true``."""
    return in_ci()


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of the PostgreSQL test server (``RHEO_POSTGRES_URL``)."""
    return server_url("postgres")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the Redis test server (``RHEO_REDIS_URL``)."""
    return server_url("redis")


@pytest.fixture(scope="session")
def pgbouncer_url() -> str:
    """URL of PgBouncer in front of the PostgreSQL test server (``RHEO_PGBOUNCER_URL``)."""
    return server_url("pgbouncer")


@pytest.fixture(scope="session")
def redis_cluster_url() -> str:
    """URL of the Redis Cluster test server (``RHEO_REDIS_CLUSTER_URL``)."""
    return server_url("redis-cluster")


@pytest.fixture(scope="session")
def mongo_url() -> str:
    """URL of the MongoDB test server (``RHEO_MONGO_URL``)."""
    return server_url("mongo")


@pytest.fixture
def postgres_schema(postgres_url: str) -> Iterator[str]:
    """A PostgreSQL schema name of this test only; dropped (with what it holds) afterwards."""
    import asyncpg

    schema = f"rheo_test_{uuid.uuid4().hex[:12]}"
    yield schema

    async def drop() -> None:
        conn = await asyncpg.connect(postgres_url)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    asyncio.run(drop())


@pytest.fixture
def postgres_schema_url(postgres_url: str, postgres_schema: str) -> str:
    """The PostgreSQL test URL on the schema of this test only (``postgres_schema``)."""
    separator = "&" if "?" in postgres_url else "?"
    return f"{postgres_url}{separator}schema={postgres_schema}"


@pytest.fixture
async def postgres_rheo(postgres_schema_url: str) -> AsyncIterator[Rheo]:
    """An opened instance owning its pool, on the schema of this test only."""
    async with Rheo(postgres_schema_url) as instance:
        yield instance


@pytest.fixture
async def postgres_admin(postgres_url: str) -> AsyncIterator[Any]:
    """A plain asyncpg connection to the PostgreSQL test server, to look at what was stored."""
    import asyncpg

    conn = await asyncpg.connect(postgres_url)
    try:
        yield conn
    finally:
        await conn.close()


@pytest.fixture
def throwaway_postgres(ci: bool) -> Iterator[PostgresServer]:
    """A PostgreSQL of this test only, that it may kill; stopped and removed afterwards."""
    server = throwaway(PostgresServer, ci)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def throwaway_redis(ci: bool) -> Iterator[RedisServer]:
    """A Redis (AOF, ``appendfsync always``) of this test only; stopped and removed afterwards."""
    server = throwaway(RedisServer, ci)
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when told to."""
    return ManualClock()


@pytest.fixture
async def rheo(clock: ManualClock) -> AsyncIterator[Rheo]:
    """An opened instance over an in-memory backend driven by ``clock``."""
    async with Rheo(MemoryBackend(clock=clock)) as instance:
        yield instance


WaitUntil = Callable[..., Awaitable[None]]


async def _wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout: float = 5.0,
    interval: float = 0.01,
    message: str = "condition",
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return
        if loop.time() >= deadline:
            raise AssertionError(f"{message} not reached within {timeout} s")
        await asyncio.sleep(interval)  # polling a predicate against a deadline


@pytest.fixture
def wait_until() -> WaitUntil:
    """``await wait_until(predicate, timeout=5.0)``: poll until true or fail at the deadline."""
    return _wait_until


# Every backend ---------------------------------------------------------------------


@pytest.fixture(params=["memory", "sqlite", "postgres", "redis", "mongo"])
async def any_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rheo]:
    """An instance over each backend, in a namespace of its own (dropped afterwards)."""
    kind = request.param
    tag = f"rheo_any_{uuid.uuid4().hex[:10]}"
    cleanup: Callable[[], Awaitable[None]] | None = None
    if kind == "memory":
        url = "memory://"
    elif kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'any.db'}"
    elif kind == "postgres":
        url = request.getfixturevalue("postgres_schema_url")  # a schema dropped afterwards
    else:
        base = request.getfixturevalue(f"{kind}_url")
        option = {"redis": "prefix", "mongo": "collection_prefix"}[kind]
        url = f"{base}{'&' if '?' in base else '?'}{option}={tag}"
        cleanup = _cleanup(kind, base, tag)
    try:
        async with Rheo(url) as rheo:
            yield rheo
    finally:
        if cleanup is not None:
            await cleanup()


def _cleanup(kind: str, base: str, tag: str) -> Callable[[], Awaitable[None]]:
    async def drop() -> None:
        if kind == "redis":
            from redis.asyncio import Redis

            client = Redis.from_url(base)
            try:
                keys = [k async for k in client.scan_iter(match=f"*{tag}*")]
                if keys:
                    await client.delete(*keys)
            finally:
                await client.aclose()
        else:
            from pymongo import AsyncMongoClient

            mongo: Any = AsyncMongoClient(base)
            try:
                database = mongo.get_default_database()
                for name in await database.list_collection_names():
                    if name.startswith(tag):
                        await database.drop_collection(name)
            finally:
                await mongo.close()

    return drop
