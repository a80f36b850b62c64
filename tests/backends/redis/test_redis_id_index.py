"""The event-id index of standalone Redis (``append_many.lua``): one field per event, the
first 8 bytes of the SHA-1 of its id -> ``partition:seq``, checked against the entry's id;
ids whose digest another id holds, and ids a release before the digest index stored
(in ``{P:s:p}:i`` and ``P:ids:<s>``), are found in the exact indexes.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from hashlib import sha1

import pytest
import redis.asyncio as aioredis

from rheo_flow import NewEvent, Query, Rheo
from rheo_flow.backends import RedisBackend


@pytest.fixture
async def backend(redis_url: str) -> AsyncIterator[RedisBackend]:
    """A backend on a fresh prefix; its keys are deleted after the test."""
    built = RedisBackend.from_url(redis_url, prefix=f"rheo-eid-{uuid.uuid4().hex[:10]}")
    yield built
    await built.drop_all()
    await built.close()


@pytest.fixture
async def admin(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


def _events(ids: list[str]) -> list[NewEvent]:
    return [NewEvent("t", {"id": event_id}, id=event_id, key=event_id) for event_id in ids]


@pytest.mark.parametrize("partitions", [1, 4])
async def test_one_digest_field_per_event_and_no_hash_field_per_id(
    backend: RedisBackend, admin: aioredis.Redis, partitions: int
) -> None:
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=partitions)
        ids = [str(uuid.uuid4()) for _ in range(2_000)]
        stored = await rheo.append("s", _events(ids))
        again = await rheo.append("s", _events(ids[:10]))
    assert [(e.partition, e.sequence) for e in again] == [
        (e.partition, e.sequence) for e in stored[:10]]
    layout = backend._keys
    assert await admin.hlen(layout.digests("s")) == 2_000
    assert not await admin.exists(layout.ids("s"))
    for p in range(partitions):
        assert not await admin.exists(layout.partition("s", p).ids)
    # About 60 bytes an event: the two hashes of full ids took about 180.
    usage = await admin.memory_usage(layout.digests("s"), samples=0)
    assert usage / 2_000 < 100


async def test_ids_stored_by_the_release_before_are_found(
    backend: RedisBackend, admin: aioredis.Redis
) -> None:
    """Data of the previous release's layout (``P:ids:<s>`` and ``{P:s:p}:i``, no digest
    index, as a Cluster still writes) is read: an id stored there is not stored again, and
    a trim forgets it."""
    layout = backend._keys
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=3)
        layout.summaries = False  # the release before: claim_ids and append.lua
        old_ids = [f"old-{n}" for n in range(30)]
        old = await rheo.append("s", _events(old_ids))
        assert await admin.exists(layout.ids("s"))
        assert not await admin.exists(layout.digests("s"))
        layout.summaries = True
        layout.script_cache.clear()
        again = await rheo.append("s", _events([*old_ids, "new-1"]))
        assert [(e.partition, e.sequence, e.id) for e in again[:-1]] == [
            (e.partition, e.sequence, e.id) for e in old]
        info = await rheo.stream_info("s")
        assert sum(info.high_water.values()) == 31
        # A trim forgets them: the ids are new again.
        await rheo.trim("s", up_to=info.high_water, force=True)
        assert await admin.hlen(layout.ids("s")) == 0
        fresh = await rheo.append("s", _events(old_ids[:2]))
        assert all(e.sequence > info.high_water[e.partition] for e in fresh)


async def test_an_id_whose_digest_another_id_holds_is_kept_exactly(
    backend: RedisBackend, admin: aioredis.Redis
) -> None:
    layout = backend._keys
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=2)
        [first] = await rheo.append("s", _events(["a"]))
        # As if "b" had the digest of "a": its field names a's event.
        digest_b = sha1(b"b").digest()[:8]
        await admin.hset(layout.digests("s"), digest_b,
                         f"{first.partition}:{first.sequence}")
        [second] = await rheo.append("s", _events(["b"]))
        assert second.id == "b"
        assert (second.partition, second.sequence) != (first.partition, first.sequence)
        # Both are found again, each as stored.
        again = await rheo.append("s", _events(["b", "a"]))
        assert [(e.id, e.partition, e.sequence) for e in again] == [
            ("b", second.partition, second.sequence), ("a", first.partition, first.sequence)]
        assert await admin.hget(layout.ids("s"), "b") == str(second.partition).encode()
        # A trim of b leaves the field it did not hold.
        await rheo.trim("s", up_to={second.partition: second.sequence}, force=True)
        assert await admin.hget(layout.digests("s"), digest_b) == (
            f"{first.partition}:{first.sequence}".encode())
        assert await admin.hget(layout.partition("s", second.partition).ids, "b") is None


async def test_a_10_mb_event_is_stored_apart_and_round_trips(
    backend: RedisBackend, admin: aioredis.Redis
) -> None:
    """Large data goes by a SET of its own in the append's MULTI (never through Lua):
    the entry names its blob; fetch, query and a repeat of the id read it back; a repeat
    leaves no blob of its own; trim and delete_stream remove the blob."""
    data = {"blob": "x" * (10 * 2**20), "n": [1, "é", None]}
    tag = backend._keys.tag

    async def blobs(partitions: int) -> list[bytes]:
        found = []
        for p in range(partitions):
            found += [k async for k in admin.scan_iter(match=f"{tag('s', p)}:b:*")]
        return found

    async with Rheo(backend, max_event_bytes=16 * 2**20) as rheo:
        await rheo.create_stream("s", partitions=2)
        [stored] = await rheo.append("s", NewEvent("big", data, id="big-1"))
        [small] = await rheo.append("s", NewEvent("small", {"a": 1}, id="small-1"))
        [entry] = await admin.xrange(f"{tag('s', stored.partition)}:x",
                                     f"{stored.sequence}-0", f"{stored.sequence}-0")
        assert len(entry[1][b"data"]) == 17
        assert len(await blobs(2)) == 1
        [lease, other] = await rheo.fetch("s", "g", limit=2)
        assert {lease.event.id: lease.event.data, other.event.id: other.event.data} == {
            "big-1": data, "small-1": {"a": 1}}
        page = await rheo.query_page(Query(stream="s"))
        assert {e.id: e.data for e in page.events} == {"big-1": data, "small-1": {"a": 1}}
        [again] = await rheo.append("s", NewEvent("big", {"other": "y" * 2**20}, id="big-1"))
        assert (again.partition, again.sequence, again.data) == (
            stored.partition, stored.sequence, data)
        assert len(await blobs(2)) == 1
        await rheo.trim("s", up_to={stored.partition: stored.sequence}, force=True)
        assert await blobs(2) == []
        await rheo.append("s", NewEvent("big", data, id="big-2"))
        assert len(await blobs(2)) == 1
        await rheo.delete_stream("s")
        assert await blobs(2) == []
    assert small.data == {"a": 1}
