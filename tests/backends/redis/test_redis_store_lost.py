"""A Redis server that lost its data (restart without persistence, FLUSHDB) is detected.

Each partition carries a marker written with its stream and checked inside the
append and fetch scripts: after a loss they raise StoreLost instead of numbering
events from 1 again, and a running group stops with it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from rheo_flow import ACK, Event, NewEvent, Rheo, StoreLost, consumer
from rheo_flow.backends import RedisBackend

WaitUntil = Callable[..., Awaitable[None]]

aioredis = pytest.importorskip("redis.asyncio")

_DB: int = 11
"""A database index only this module uses: the FLUSHDB test empties it."""


def _on_db(url: str, db: int) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{db}"))


async def _wipe(url: str, prefix: str) -> None:
    """Delete every key of ``prefix``: what the server keeps of it after losing its data."""
    admin = aioredis.Redis.from_url(url)
    try:
        for pattern in (f"{prefix}:*", f"{{{prefix}:*"):
            keys = [key async for key in admin.scan_iter(match=pattern, count=1000)]
            if keys:
                await admin.unlink(*keys)
    finally:
        await admin.aclose()


@pytest.fixture
async def lost(redis_url: str) -> AsyncIterator[tuple[Rheo, str, str]]:
    """A Rheo on its own prefix, with that prefix's URL; its keys are dropped afterwards."""
    prefix = f"hblost{uuid.uuid4().hex[:10]}"
    rheo = Rheo(RedisBackend.from_url(redis_url, prefix=prefix))
    yield rheo, redis_url, prefix
    await rheo.close()
    await _wipe(redis_url, prefix)


@pytest.mark.parametrize("partitions", [1, 3])
async def test_appends_and_fetches_refuse_a_wiped_store(
    lost: tuple[Rheo, str, str], partitions: int
) -> None:
    rheo, url, prefix = lost
    await rheo.create_stream("s", partitions=partitions)
    await rheo.append("s", [NewEvent("t", id=f"e{i}", key=f"k{i}") for i in range(6)])
    leases = await rheo.fetch("s", "g", limit=10)
    assert len(leases) == 6
    await _wipe(url, prefix)

    with pytest.raises(StoreLost, match="lost its data") as raised:
        await rheo.append("s", NewEvent("t", id="after"))
    assert raised.value.stream == "s"
    assert raised.value.kind == "failed"
    with pytest.raises(StoreLost):
        await rheo.fetch("s", "g", limit=10)
    with pytest.raises(StoreLost):
        await rheo.stream_info("s")
    # Still refused on the next call: nothing numbers events from 1 again.
    with pytest.raises(StoreLost):
        await rheo.append("s", NewEvent("t", id="again"))
    admin = aioredis.Redis.from_url(url)
    try:
        partition_keys = [k async for k in admin.scan_iter(match=f"{{{prefix}:*")]
    finally:
        await admin.aclose()
    assert partition_keys == [], "no event or delivery was written after the loss"


async def test_a_fresh_backend_sees_a_lost_stream_as_unknown_until_recreated(
    lost: tuple[Rheo, str, str]
) -> None:
    rheo, url, prefix = lost
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    await _wipe(url, prefix)
    async with Rheo(RedisBackend.from_url(url, prefix=prefix)) as other:
        # This process never saw the stream: the store is simply empty to it.
        with pytest.raises(LookupError):
            await other.append("s", NewEvent("t"))
        # Recreating the stream is the explicit way back; it starts over at 1.
        await other.create_stream("s")
        [event] = await other.append("s", NewEvent("t"))
        assert event.sequence == 1
    [event] = await rheo.append("s", NewEvent("t"))  # the marker is back
    assert event.sequence == 2


async def test_streams_created_before_the_markers_get_them_on_first_use(
    lost: tuple[Rheo, str, str]
) -> None:
    rheo, url, prefix = lost
    await rheo.create_stream("s", partitions=2)
    admin = aioredis.Redis.from_url(url)
    try:
        for p in range(2):  # what an earlier version left: no marker
            await admin.hdel(f"{{{prefix}:s:{p}}}:m", "mk")
    finally:
        await admin.aclose()
    async with Rheo(RedisBackend.from_url(url, prefix=prefix)) as other:
        events = await other.append("s", [NewEvent("t", partition=p) for p in range(2)])
        assert [e.sequence for e in events] == [1, 1]
        assert len(await other.fetch("s", "g", limit=10)) == 2


async def test_flushdb_stops_a_running_group_with_store_lost(
    redis_url: str, wait_until: WaitUntil
) -> None:
    url = _on_db(redis_url, _DB)
    seen: list[int] = []

    @consumer(stream="s", group="g", poll_ms=50)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        seen.append(event.sequence)
        return ACK

    rheo = Rheo(url)
    try:
        await rheo.create_stream("s")
        await rheo.append("s", NewEvent("t"))
        group = handle.start(rheo)
        runner = asyncio.ensure_future(group.run())
        await wait_until(lambda: seen == [1], message="the first event handled")
        admin = aioredis.Redis.from_url(url)
        try:
            await admin.flushdb()  # only the database this module owns
        finally:
            await admin.aclose()
        with pytest.raises(StoreLost):
            async with asyncio.timeout(30):
                await runner
        with pytest.raises(StoreLost):
            await rheo.append("s", NewEvent("t"))
        assert seen == [1]
    finally:
        await rheo.close()
        admin = aioredis.Redis.from_url(url)
        try:
            await admin.flushdb()
        finally:
            await admin.aclose()


async def test_a_pipeline_stops_fetching_and_its_drain_raises_store_lost(
    lost: tuple[Rheo, str, str], wait_until: WaitUntil
) -> None:
    from rheo_flow.pipeline import Message, Pipeline, PipelineHandler

    rheo, url, prefix = lost
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    handled: list[int] = []

    class Record(PipelineHandler):
        async def handle_message(self, processor: str, message: Message, context: Any
                                 ) -> Message:
            handled.append(message.lease.event.sequence)
            return message

    pipeline = Pipeline(rheo, stream="s", group="g", handler=Record())
    await pipeline.start()
    await wait_until(lambda: handled == [1], message="the first message handled")
    await _wipe(url, prefix)
    dispatcher = pipeline._dispatcher
    assert dispatcher is not None
    # The next fetch (after the idle wait) meets the loss and ends the fetch loop.
    await wait_until(dispatcher.done, timeout=30, message="fetching stopped")
    with pytest.raises(StoreLost):
        async with asyncio.timeout(30):
            await pipeline.drain()
    await pipeline.stop()
