"""A fetch on standalone Redis visits only the partitions with work (``fetch_many.lua``):
one script call, whatever the partition count, with the limit put where the work is;
fairness across the partitions with work holds; every script that makes work due keeps
the group's summaries exact; and data written without summaries (an earlier release)
is found by the first fetch.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import redis.asyncio as aioredis

from rheo_flow import NewEvent, Rheo
from rheo_flow._backends.redis import _scripts
from rheo_flow.backends import RedisBackend

HOUR_MS = 3_600_000
WaitUntil = Callable[..., Awaitable[None]]


@pytest.fixture
async def rheo(redis_url: str) -> AsyncIterator[Rheo]:
    """An opened instance on a fresh prefix; its keys are deleted after the test."""
    backend = RedisBackend.from_url(redis_url, prefix=f"rheo-sum-{uuid.uuid4().hex[:10]}")
    async with Rheo(backend) as instance:
        yield instance
    await backend.drop_all()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The script names of every round trip the backends make, in order."""
    trips: list[list[str]] = []
    pipeline, run_one = _scripts.ScriptRunner._pipeline, _scripts.ScriptRunner._run_one

    async def spy_pipeline(self: Any, batch: Sequence[Any], *args: Any, **kwargs: Any) -> Any:
        reads = kwargs.get("reads", ())
        trips.append([call[0] for call in batch] + [read[0] for read in reads])
        return await pipeline(self, batch, *args, **kwargs)

    async def spy_one(self: Any, name: str, *args: Any) -> Any:
        trips.append([name])
        return await run_one(self, name, *args)

    monkeypatch.setattr(_scripts.ScriptRunner, "_pipeline", spy_pipeline)
    monkeypatch.setattr(_scripts.ScriptRunner, "_run_one", spy_one)
    return trips


async def _fill(rheo: Rheo, stream: str, partition: int, count: int) -> None:
    await rheo.append(stream, [NewEvent("t", {"n": n}) for n in range(count)],
                      partition=partition)


def _backend(rheo: Rheo) -> RedisBackend:
    backend = rheo.backend
    assert isinstance(backend, RedisBackend)
    return backend


async def test_one_busy_partition_of_many_fills_the_limit_in_one_call(
    rheo: Rheo, calls: list[list[str]]
) -> None:
    await rheo.create_stream("s", partitions=64)
    await _fill(rheo, "s", 37, 500)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    for _ in range(3):
        calls.clear()
        leases = await rheo.fetch("s", "g", consumer_id="a", limit=100, lease_ms=HOUR_MS)
        assert len(leases) == 100
        assert {lease.event.partition for lease in leases} == {37}
        seqs = [lease.event.sequence for lease in leases]
        assert seqs == sorted(seqs)
        # One round trip, one script: no call per partition, no second round.
        assert len(calls) == 1
        assert [name for name in calls[0] if name != "XRANGE"] == ["fetch_many"]
        await rheo.ack(leases)


async def test_an_empty_stream_of_many_partitions_answers_in_one_call(
    rheo: Rheo, calls: list[list[str]]
) -> None:
    await rheo.create_stream("s", partitions=256)
    await rheo.fetch("s", "g", consumer_id="a", limit=1)
    calls.clear()
    assert await rheo.fetch("s", "g", consumer_id="a", limit=100) == []
    assert calls == [["fetch_many"]]


async def test_the_limit_is_shared_fairly_among_the_partitions_with_work(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=16)
    for partition, count in ((2, 10), (9, 50), (13, 50)):
        await _fill(rheo, "s", partition, count)
    leases = await rheo.fetch("s", "g", consumer_id="a", limit=60, lease_ms=HOUR_MS)
    # Partition 2 gives all it has; the other two split the rest evenly.
    assert Counter(lease.event.partition for lease in leases) == {2: 10, 9: 25, 13: 25}
    # Round-robin across partitions, each in sequence order.
    assert [lease.event.partition for lease in leases[:3]] in (
        [2, 9, 13], [9, 13, 2], [13, 2, 9])
    for partition in (2, 9, 13):
        seqs = [lease.event.sequence for lease in leases if lease.event.partition == partition]
        assert seqs == sorted(seqs)
    # A limit below the partitions with work: fetches take turns (fetch.fair), so
    # within as many fetches as there are partitions each one with work is served.
    more = [await rheo.fetch("s", "g", consumer_id="a", limit=1) for _ in range(16)]
    assert {leases[0].event.partition for leases in more} == {9, 13}


async def test_work_made_due_by_other_scripts_is_found(
    rheo: Rheo, wait_until: WaitUntil
) -> None:
    await rheo.create_stream("s", partitions=32)
    await _fill(rheo, "s", 5, 20)
    leases = await rheo.fetch("s", "g", consumer_id="a", limit=20, lease_ms=HOUR_MS)
    assert await rheo.fetch("s", "g", consumer_id="a", limit=20) == []
    # A nack without delay: due at once.
    await rheo.nack(leases[:3], "retry")
    again = await rheo.fetch("s", "g", consumer_id="a", limit=20, lease_ms=HOUR_MS)
    assert [(lease.event.sequence, lease.attempt) for lease in again] == [
        (1, 2), (2, 2), (3, 2)]

    async def expired() -> list[Any]:
        return await rheo.fetch("s", "g", consumer_id="a", limit=20, lease_ms=HOUR_MS)

    # A renew shorter than before: due when the new deadline passes, not the old one.
    assert all(result.ok for result in await rheo.renew(leases[3:5], lease_ms=10))
    got: list[Any] = []

    async def both_expired() -> bool:
        got.extend(await expired())
        return len(got) >= 2

    await wait_until(both_expired, message="the renewed leases expire")
    assert sorted(lease.event.sequence for lease in got) == [4, 5]
    # Dead letters redriven, a replay and a reset move work back.
    await rheo.reject(leases[5:6], "bad")
    assert await rheo.redrive("s", "g") == 1
    assert [lease.event.sequence for lease in await expired()] == [6]
    await rheo.ack([*again, *got, *leases[6:]])
    await rheo.replay("s", "g", from_sequence=18, partitions=[5])
    assert [lease.event.sequence for lease in await expired()] == [18, 19, 20]
    await rheo.reset("s", "g", to="earliest", partitions=[5])
    assert len(await rheo.fetch("s", "g", consumer_id="a", limit=100)) == 20


async def test_a_key_released_by_an_ack_is_found(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=8)
    await rheo.create_group("s", "g", ordering="key")
    await rheo.append("s", [NewEvent("t", {"n": n}, key="k", partition=3) for n in range(3)])
    first = await rheo.fetch("s", "g", consumer_id="a", limit=10)
    assert [lease.event.sequence for lease in first] == [1]
    await rheo.ack(first)
    second = await rheo.fetch("s", "g", consumer_id="a", limit=10)
    assert [lease.event.sequence for lease in second] == [2]


async def test_data_without_summaries_is_found_by_the_first_fetch(
    rheo: Rheo, redis_url: str
) -> None:
    """What a release before the summaries wrote (events, nacked and expired leases, no
    summary key) is found by the first fetch of a backend of this one, and by a backend
    already running once it rewrites them (``_SWEEP_S``)."""
    backend = _backend(rheo)
    await rheo.create_stream("s", partitions=16)
    await _fill(rheo, "s", 4, 10)
    leases = await rheo.fetch("s", "g", consumer_id="a", limit=10, lease_ms=HOUR_MS)
    await rheo.nack(leases[:2], "retry")
    await _fill(rheo, "s", 11, 5)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        await admin.delete(*backend._keys.summary_keys("s", "g"))
    finally:
        await admin.aclose()
    async with Rheo(RedisBackend.from_url(redis_url, prefix=backend.prefix)) as fresh:
        got = await fresh.fetch("s", "g", consumer_id="b", limit=100)
    assert sorted((lease.event.partition, lease.event.sequence) for lease in got) == [
        (4, 1), (4, 2), *((11, n) for n in range(1, 6))]
    await _fill(rheo, "s", 7, 3)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        await admin.delete(*backend._keys.summary_keys("s", "g"))
    finally:
        await admin.aclose()
    assert await rheo.fetch("s", "g", consumer_id="a", limit=100) == []
    backend._swept.clear()  # as when _SWEEP_S has passed
    got = await rheo.fetch("s", "g", consumer_id="a", limit=100)
    assert sorted(lease.event.sequence for lease in got) == [1, 2, 3]


async def test_deleting_a_group_or_stream_drops_its_summaries(
    rheo: Rheo, redis_url: str
) -> None:
    backend = _backend(rheo)
    await rheo.create_stream("s", partitions=4)
    await _fill(rheo, "s", 1, 3)
    await rheo.fetch("s", "g", consumer_id="a", limit=1, lease_ms=HOUR_MS)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        assert await admin.exists(*backend._keys.summary_keys("s", "g")) == 2
        await rheo.delete_group("s", "g")
        assert await admin.exists(*backend._keys.summary_keys("s", "g")) == 0
        await rheo.fetch("s", "g", consumer_id="a", limit=1, lease_ms=HOUR_MS)
        await rheo.delete_stream("s")
        assert await admin.exists(*backend._keys.summary_keys("s", "g")) == 0
    finally:
        await admin.aclose()
