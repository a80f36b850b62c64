"""Backends under network faults: typed errors, one operation timeout, nothing left open.

Every server backend is driven against its real server, through a loopback
proxy (rheo_flow._faults._proxy) that refuses, stalls or drops connections on demand.
"""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import pytest

from rheo_flow import (
    BackendError,
    BackendUnavailable,
    InvalidArgument,
    NewEvent,
    OutcomeUnknown,
    Rheo,
    SettleKind,
)
from rheo_flow._backend import Backend
from rheo_flow._backends._urls import backend_from_url
from rheo_flow._faults._proxy import FaultProxy
from rheo_flow._model._append_records import make_append_record
from rheo_flow.backends import SQLiteBackend

WaitUntil = Callable[..., Awaitable[None]]

SECRET = "hunter2"
_BOUND = 60.0
"""A bound on any one faulty call: reaching it means a hang, not a slow answer."""


def _url(url: str, *, port: int | None = None, password: str | None = None,
         **options: str) -> str:
    """``url`` pointed at 127.0.0.1:``port`` (with ``password``), plus query options."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if port is not None:
        user = parts.username or ("app" if password and parts.scheme.startswith("mongodb") else "")
        auth = f"{user}:{password}@" if password is not None else (f"{user}@" if user else "")
        netloc = f"{auth}127.0.0.1:{port}"
    query = [*parse_qsl(parts.query), *options.items()]
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(query)))


def _server_url(kind: str, request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue(f"{kind}_url")
    return url


def _names() -> dict[str, str]:
    """Names of this test only (PostgreSQL's schema is conftest's ``postgres_schema``)."""
    tag = uuid.uuid4().hex[:10]
    return {"redis": f"hbfaults{tag}", "mongo": f"hbfaults{tag}_"}


def _scoped(kind: str, url: str, name: str) -> str:
    option = {"postgres": "schema", "redis": "prefix", "mongo": "collection_prefix"}[kind]
    return _url(url, **{option: name})


async def _cleanup(url: str) -> None:
    """Drop what a test created under its own prefix or collection prefix."""
    backend = backend_from_url(url)
    drop: Callable[[], Awaitable[Any]] = backend.drop_all  # type: ignore[attr-defined]
    await drop()
    await backend.close()


@pytest.fixture(params=["postgres", "redis", "mongo"])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, str]]:
    """(kind, URL) of a server backend, in a namespace of its own (dropped afterwards)."""
    kind: str = request.param
    if kind == "postgres":  # a schema dropped afterwards
        yield kind, _scoped(kind, _server_url(kind, request),
                            request.getfixturevalue("postgres_schema"))
        return
    url = _scoped(kind, _server_url(kind, request), _names()[kind])
    yield kind, url
    await _cleanup(url)


def _record(event_id: str) -> Any:
    return make_append_record(0, event_id, "t", None, None, "null", {})


async def _ops(backend: Backend) -> dict[str, Callable[[], Awaitable[object]]]:
    """One call of each kind, straight to the backend (no facade in between)."""
    return {
        "create_stream": lambda: backend.create_stream("s", 1),
        "stream_info": lambda: backend.stream_info("s"),
        "list_streams": backend.list_streams,
        "append": lambda: backend.append("s", [_record("e1")]),
        "fetch": lambda: backend.fetch("s", "g", "c", 10, 30_000, None),
        "frontier": lambda: backend.frontier("s", "g"),
    }


# Unreachable servers ----------------------------------------------------------


@pytest.mark.parametrize("kind", ["postgres", "redis", "mongo"])
async def test_an_unreachable_server_raises_backend_unavailable_from_every_operation(
    kind: str, request: pytest.FixtureRequest
) -> None:
    url = _url(_server_url(kind, request), port=refusing_port(), password=SECRET,
               timeout_ms="1000")
    backend = backend_from_url(url)
    try:
        for name, call in (await _ops(backend)).items():
            async with asyncio.timeout(_BOUND):
                with pytest.raises(BackendUnavailable) as raised:
                    await call()
            assert raised.value.kind == "backend_unavailable", name
            assert SECRET not in str(raised.value), name
        async with Rheo(backend) as rheo:
            pass
    except BackendUnavailable:
        pass  # open() itself cannot reach the server: the same typed error
    finally:
        await backend.close()
    rheo = Rheo(url)
    with pytest.raises(BackendUnavailable):
        await rheo.append("s", NewEvent("t"))
    await rheo.close()


# Connections dropped mid-call ---------------------------------------------------


async def _hold(proxy: FaultProxy, call: Awaitable[object]) -> asyncio.Task[object]:
    """Start ``call`` while the proxy stalls, and return once its request is held there."""
    proxy.blackhole(3600, then="resume")
    task: asyncio.Task[object] = asyncio.ensure_future(call)
    async with asyncio.timeout(_BOUND):
        await proxy.held.wait()
    return task


async def test_a_connection_dropped_mid_call_makes_a_write_ambiguous_and_a_read_unavailable(
    server: tuple[str, str]
) -> None:
    kind, url = server
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port
    assert port is not None
    async with FaultProxy(host, port) as proxy:
        # A replica set member would tell the client its own address, past the proxy.
        direct = {"directConnection": "true"} if kind == "mongo" else {}
        rheo = Rheo(_url(url, port=proxy.port, password=urlsplit(url).password,
                         timeout_ms="2000", **direct))
        try:
            await rheo.create_stream("s")
            [first] = await rheo.append("s", NewEvent("t", id="e1"))
            (lease,) = await rheo.fetch("s", "g", consumer_id="c", limit=1)

            task = await _hold(proxy, rheo.append("s", NewEvent("t", id="e2")))
            proxy.drop()
            with pytest.raises(OutcomeUnknown) as raised:
                async with asyncio.timeout(_BOUND):
                    await task
            assert raised.value.kind == "ambiguous"

            task = await _hold(proxy, rheo.ack([lease]))
            proxy.drop()
            async with asyncio.timeout(_BOUND):
                [result] = await task  # type: ignore[misc]
            assert result.kind in (SettleKind.AMBIGUOUS, SettleKind.BACKEND_UNAVAILABLE), result

            task = await _hold(proxy, rheo.stream_info("s"))
            proxy.drop()
            with pytest.raises(BackendUnavailable):
                async with asyncio.timeout(_BOUND):
                    await task

            proxy.pass_traffic()
            # The ambiguous append is retried with the same id: stored once.
            events = await rheo.append("s", [NewEvent("t", id="e1"), NewEvent("t", id="e2")])
            assert events[0].sequence == first.sequence
            assert [e.sequence for e in events] == [1, 2]
        finally:
            proxy.pass_traffic()
            await rheo.close()


# The operation timeout -------------------------------------------------------------


async def test_a_postgres_stall_times_out_within_timeout_ms(
        postgres_url: str, postgres_schema: str) -> None:
    url = _scoped("postgres", postgres_url, postgres_schema)
    host, port = urlsplit(url).hostname or "127.0.0.1", urlsplit(url).port or 5432
    async with FaultProxy(host, port) as proxy:
        rheo = Rheo(_url(url, port=proxy.port, timeout_ms="500", pool_max_size="1",
                         listen="false"))
        try:
            await rheo.create_stream("s")
            await rheo.append("s", NewEvent("t"))
            (lease,) = await rheo.fetch("s", "g", consumer_id="c", limit=1)
            proxy.blackhole(3600, then="resume")
            async with asyncio.timeout(_BOUND):
                [result] = await rheo.ack([lease])
            assert result.kind is SettleKind.AMBIGUOUS
            assert "timeout_ms=500" in result.error.reason  # type: ignore[union-attr]
            async with asyncio.timeout(_BOUND):
                with pytest.raises(BackendUnavailable, match="nothing was sent"):
                    # The stalled connection was closed: a new one cannot be made.
                    await rheo.append("s", NewEvent("t"))
            proxy.pass_traffic()
            # Once the network is back, the backend works again (the ack may have
            # committed: a repeat either settles or finds it done).
            [again] = await rheo.ack([lease])
            assert again.ok
            assert (await rheo.frontier("s", "g")) == {0: 1}
        finally:
            proxy.pass_traffic()
            await rheo.close()


@pytest.mark.parametrize("url", [
    "postgresql://u@h/db?timeout_ms=0", "postgresql://u@h/db?timeout_ms=soon",
    "redis://h/0?timeout_ms=-1", "mongodb://h/db?timeout_ms=x", "sqlite:///x.db?timeout_ms=0",
])
def test_timeout_ms_is_validated(url: str) -> None:
    with pytest.raises(InvalidArgument, match="timeout_ms"):
        backend_from_url(url)


# SQLite ----------------------------------------------------------------------------


async def test_sqlite_errors_are_typed(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "events.db"
    rheo = Rheo(SQLiteBackend(db, busy_timeout_ms=0))
    await rheo.create_stream("s")
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(BackendError, match="locked") as raised:
            await rheo.append("s", NewEvent("t"))
        assert raised.value.kind == "failed"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        await rheo.close()
    (tmp_path / "garbage.db").write_bytes(b"not a database" * 100)
    broken = Rheo(SQLiteBackend(tmp_path / "garbage.db"))
    with pytest.raises(BackendUnavailable):
        await broken.create_stream("s")
    await broken.close()


# close() without open() ----------------------------------------------------------


async def test_close_without_open_leaves_no_postgres_connection(
    postgres_url: str, postgres_schema: str, wait_until: WaitUntil
) -> None:
    import asyncpg

    app = f"hb_close_{uuid.uuid4().hex[:10]}"
    url = _url(_scoped("postgres", postgres_url, postgres_schema), application_name=app)
    admin = await asyncpg.connect(postgres_url)

    async def connections() -> int:
        count: int = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app)
        return count

    try:
        await _close_without_open_closes_everything(url, connections, wait_until)
    finally:
        await admin.close()


async def test_close_without_open_leaves_no_redis_connection(
    redis_url: str, wait_until: WaitUntil
) -> None:
    import redis.asyncio as aioredis

    name = f"hbclose{uuid.uuid4().hex[:10]}"
    url = _url(_scoped("redis", redis_url, _names()["redis"]), client_name=name)
    admin = aioredis.Redis.from_url(redis_url)

    async def connections() -> int:
        return sum(1 for c in await admin.client_list() if c.get("name") == name)

    try:
        await _close_without_open_closes_everything(url, connections, wait_until)
    finally:
        await admin.aclose()
        await _cleanup(url)


async def _close_without_open_closes_everything(
    url: str, connections: Callable[[], Awaitable[int]], wait_until: WaitUntil
) -> None:
    """A Rheo never opened (its first operation opens the backend) leaves no
    connection counted by ``connections`` once closed."""
    rheo = Rheo(url)
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    assert await connections() >= 1
    await rheo.close()

    async def none_left() -> bool:
        return await connections() == 0

    await wait_until(none_left, message="every connection closed")


async def test_close_without_open_releases_the_sqlite_file(tmp_path: Path) -> None:
    db = tmp_path / "events.db"

    def open_files() -> int:
        fds = Path("/proc/self/fd")
        if not fds.is_dir():
            pytest.skip("needs /proc/self/fd")
        count = 0
        for fd in fds.iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            count += target.startswith(str(db))
        return count

    rheo = Rheo(f"sqlite:///{db}")
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    assert open_files() >= 1
    await rheo.close()
    assert open_files() == 0


def refusing_port() -> int:
    """A loopback port nothing listens on (connecting to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
