"""Key-ordered groups on the Redis backend, single server and Redis Cluster.

The rule itself is the conformance kit's (``ordering.*`` cases, and the
stateful machine with key-ordered groups); these are the Redis specifics: the
group record's ordering field (records written before it read as unordered),
the per-(group, partition) state of blocked keys (``:k``, key -> ``head|tail``;
``:n``, the deliveries a fetch passed over linked by key), which must be empty
once every key is released, a fetch that fills its batch past a long run of
one blocked key, and the events a fetch passed over inside the range of a block
of new leases (which does not lease them). The multi-process run is
tests/runtime/test_key_ordering_processes.py's, on both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

import test_redis_backend as shared
from rheo_flow import InvalidArgument, Lease, NewEvent, Rheo
from rheo_flow.backends import RedisBackend


@pytest.fixture(params=["redis", "redis-cluster"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[RedisBackend]:
    """A backend under a fresh prefix, on the server and on the cluster."""
    url = request.getfixturevalue("redis_url" if request.param == "redis"
                                  else "redis_cluster_url")
    async with shared.scratch_backend(url) as b:
        yield b


rheo = shared.rheo
"""The instance over :func:`backend` (tests/backends/redis/test_redis_backend.py's fixture)."""


def _group_key(backend: RedisBackend, stream: str, group: str, suffix: str,
               partition: int = 0) -> str:
    return f"{{{backend.prefix}:{stream}:{partition}}}:g:{group}{suffix}"


async def _key_state(backend: RedisBackend, stream: str, group: str,
                     partition: int = 0) -> tuple[dict[str, str], dict[str, str]]:
    """The partition's blocked keys (key -> ``head|tail``) and links (seq -> next seq)."""
    client = backend.client
    blocked = await client.hgetall(_group_key(backend, stream, group, ":k", partition))
    links = await client.hgetall(_group_key(backend, stream, group, ":n", partition))

    def text(d: dict[bytes, bytes]) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in d.items()}

    return text(blocked), text(links)


async def _append(rheo: Rheo, stream: str, keys: list[str | None]) -> None:
    await rheo.append(stream, [NewEvent("t", {"n": i}, key=k, partition=0)
                               for i, k in enumerate(keys)])


def _seqs(leases: list[Lease]) -> list[int]:
    return [lease.sequence for lease in leases]


async def test_the_capability_and_the_group_record(rheo: Rheo, backend: RedisBackend) -> None:
    assert backend.capabilities.key_ordering
    await rheo.create_stream("s", partitions=2)
    await rheo.create_group("s", "keyed", ordering="key")
    await rheo.create_group("s", "plain")
    records = {k.decode(): v.decode() for k, v in
               (await backend.client.hgetall(f"{backend.prefix}:groups:s")).items()}
    assert records["keyed"].endswith("|earliest|key")
    assert records["plain"].endswith("|earliest")  # the format of earlier versions
    for p in range(2):
        flags = await backend.client.hmget(_group_key(backend, "s", "keyed", "", p), "o")
        assert flags == [b"k"]
        assert await backend.client.hget(_group_key(backend, "s", "plain", "", p), "o") is None


async def test_old_group_records_read_as_unordered(rheo: Rheo, backend: RedisBackend) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "old")
    # A record as versions before key ordering wrote it (no fourth field).
    await backend.client.hset(f"{backend.prefix}:groups:s", "old", "7|1700000000000|earliest")
    info = await rheo.group_info("s", "old")
    assert (info.max_attempts, info.created_at_ms, info.ordering) == (7, 1700000000000, "none")
    assert [(g.group, g.ordering) for g in await rheo.groups("s")] == [("old", "none")]
    with pytest.raises(InvalidArgument) as caught:
        await rheo.create_group("s", "old", ordering="key", max_attempts=3)
    assert "'none'" in str(caught.value)
    assert "'key'" in str(caught.value)
    # Refused: nothing changed, not even max_attempts.
    raw = await backend.client.hget(f"{backend.prefix}:groups:s", "old")
    assert raw == b"7|1700000000000|earliest"
    assert (await rheo.create_group("s", "old", max_attempts=4)).ordering == "none"
    await _append(rheo, "s", ["a", "a"])
    assert _seqs(await rheo.fetch("s", "old")) == [1, 2]  # unordered: both at once


async def test_a_blocked_key_among_many_still_fills_the_batch(
        rheo: Rheo, backend: RedisBackend) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    keys: list[str | None] = ["hot"]
    for i in range(40):
        keys += ["hot", f"k{i}"]
    await _append(rheo, "s", keys)
    [hot] = await rheo.fetch("s", "g", limit=1)
    batch = await rheo.fetch("s", "g", limit=10)
    assert _seqs(batch) == [3 + 2 * i for i in range(10)]
    assert {lease.event.key for lease in batch} == {f"k{i}" for i in range(10)}
    # A run of the blocked key longer than one script's scan budget: the fetch reads on.
    await _append(rheo, "s", ["hot"] * 2500 + ["c1", None, "c2"])
    rest = await rheo.fetch("s", "g", limit=33)
    assert [lease.event.key for lease in rest] == [f"k{i}" for i in range(10, 40)] + [
        "c1", None, "c2"]
    blocked, links = await _key_state(backend, "s", "g")
    assert blocked["hot"] == f"1|{len(keys) + 2500}"
    assert len(links) == 40 + 2500  # every later "hot" event, once
    assert await rheo.fetch("s", "g", limit=10) == []
    await rheo.ack([hot])
    [second] = await rheo.fetch("s", "g", limit=10)
    assert (second.sequence, second.attempt) == (2, 1)


async def test_the_key_state_is_empty_once_every_key_is_released(
        rheo: Rheo, backend: RedisBackend) -> None:
    await rheo.create_stream("s", partitions=2)
    await rheo.create_group("s", "g", ordering="key", max_attempts=2)
    await rheo.append("s", [NewEvent("t", {"n": i}, key=f"ключ-{i % 7}" if i % 5 else None)
                            for i in range(300)])
    turn = 0
    async with asyncio.timeout(60):
        while sum((await rheo.lag("s", "g")).values()):
            leases = await rheo.fetch("s", "g", limit=25)
            turn += 1
            # Settle every way there is: ack, nack (then dead letters), reject.
            if turn % 3 == 0:
                await rheo.nack(leases, "again")
            elif turn % 7 == 0:
                await rheo.reject(leases, "no")
            else:
                await rheo.ack(leases)
            # Never two deliveries of one key of one partition at once.
            held = [(x.partition, x.event.key) for x in leases if x.event.key is not None]
            assert len(held) == len(set(held))
    for p in range(2):
        assert await _key_state(backend, "s", "g", p) == ({}, {})
    # Re-driven dead letters take part again, and leave nothing behind either.
    assert await rheo.redrive("s", "g") > 0
    async with asyncio.timeout(60):
        while leases := await rheo.fetch("s", "g", limit=50):
            await rheo.ack(leases)
    for p in range(2):
        assert await _key_state(backend, "s", "g", p) == ({}, {})
    assert sum((await rheo.lag("s", "g")).values()) == 0


async def test_trim_releases_the_keys_whose_head_it_removes(
        rheo: Rheo, backend: RedisBackend) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    await _append(rheo, "s", ["a"] * 5 + ["b", "b"])
    assert _seqs(await rheo.fetch("s", "g")) == [1, 6]
    await rheo.trim("s", up_to=3, force=True)
    blocked, links = await _key_state(backend, "s", "g")
    assert blocked == {"a": "4|5", "b": "6|7"}
    assert links == {"4": "5", "6": "7"}
    assert _seqs(await rheo.fetch("s", "g")) == [4]


async def test_replay_and_reset_forget_what_they_deliver_again(
        rheo: Rheo, backend: RedisBackend) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    await _append(rheo, "s", ["a", "b", "a", "b", "a"])
    first = await rheo.fetch("s", "g")
    assert _seqs(first) == [1, 2]
    await rheo.replay("s", "g", from_sequence=2)
    # a keeps its leased head and its passed-over event before 2; b's head is replayed.
    assert await _key_state(backend, "s", "g") == ({"a": "1|1"}, {})
    assert _seqs(await rheo.fetch("s", "g")) == [2]
    await rheo.reset("s", "g", to="earliest")
    assert await _key_state(backend, "s", "g") == ({}, {})
    assert _seqs(await rheo.fetch("s", "g")) == [1, 2]


async def test_a_redriven_dead_letter_goes_before_a_later_leased_one(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key", max_attempts=3)
    await _append(rheo, "s", ["a", "a", "a"])
    [first] = await rheo.fetch("s", "g")
    await rheo.reject(first, "bad")
    [second] = await rheo.fetch("s", "g", lease_ms=50)
    assert second.sequence == 2
    assert await rheo.redrive("s", "g") == 1
    [again] = await rheo.fetch("s", "g")
    assert (again.sequence, again.attempt) == (1, 1)
    await asyncio.sleep(0.1)  # the lease of 2 expired: it waits (parked) behind 1
    assert await rheo.fetch("s", "g") == []
    await rheo.ack(again)
    [retried] = await rheo.fetch("s", "g")
    assert (retried.sequence, retried.attempt) == (2, 2)
    await rheo.ack(retried)
    assert _seqs(await rheo.fetch("s", "g")) == [3]


async def test_an_expired_block_leases_again_only_what_it_leased(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    await _append(rheo, "s", ["a", "a", None, "b", "a"])
    # One block of new leases covers 1..4; 2 (and 5) were passed over, not leased.
    assert _seqs(await rheo.fetch("s", "g", lease_ms=50)) == [1, 3, 4]
    await asyncio.sleep(0.1)
    again = await rheo.fetch("s", "g")
    assert [(x.sequence, x.attempt) for x in again] == [(1, 2), (3, 2), (4, 2)]
    await rheo.ack(again)
    assert [(x.sequence, x.attempt) for x in await rheo.fetch("s", "g")] == [(2, 1)]


async def test_leases_with_records_of_their_own_as_earlier_versions_wrote(
        rheo: Rheo, backend: RedisBackend) -> None:
    """Versions before blocks of key-ordered leases gave every lease its own record
    (``:d``, ``:z``): those are settled, and release their keys, as before."""
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    await _append(rheo, "s", ["a", "b", "a", "b"])
    leases = await rheo.fetch("s", "g")
    assert _seqs(leases) == [1, 2]
    client = backend.client
    for lease in leases:
        await client.hset(_group_key(backend, "s", "g", ":d"), str(lease.sequence),
                          f"L|1|{lease.lease_id}|||")
        await client.zadd(_group_key(backend, "s", "g", ":z"),
                          {str(lease.sequence): lease.deadline_ms})
    await client.delete(_group_key(backend, "s", "g", ":b"),
                        _group_key(backend, "s", "g", ":y"))
    assert [r.ok for r in await rheo.ack(leases)] == [True, True]
    assert _seqs(await rheo.fetch("s", "g")) == [3, 4]


async def test_a_redriven_dead_letter_before_a_block_lease_keeps_that_lease(
        rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key", max_attempts=3)
    await _append(rheo, "s", ["a"])
    [first] = await rheo.fetch("s", "g")
    await rheo.reject(first, "bad")
    await _append(rheo, "s", ["a"])
    # 2 is leased by its fetch's block (no record of its own) when 1 is re-driven.
    [second] = await rheo.fetch("s", "g", lease_ms=50)
    assert (second.sequence, second.attempt) == (2, 1)
    assert await rheo.redrive("s", "g") == 1
    [again] = await rheo.fetch("s", "g")
    assert (again.sequence, again.attempt) == (1, 1)
    await asyncio.sleep(0.1)
    assert await rheo.fetch("s", "g") == []
    await rheo.ack(again)
    [retried] = await rheo.fetch("s", "g")
    assert (retried.sequence, retried.attempt) == (2, 2)


async def test_releasing_a_key_wakes_a_wait_on_its_stream(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=2)
    await rheo.create_group("s", "g", ordering="key")
    await _append(rheo, "s", ["a", "a"])
    [first] = await rheo.fetch("s", "g")
    assert await rheo.fetch("s", "g") == []
    waiting = asyncio.create_task(rheo.wait_for_append("s", 30))
    await asyncio.sleep(0.1)
    assert not waiting.done()
    await rheo.ack(first)  # 2 is due now: no append, but a fetch would find it
    async with asyncio.timeout(5):
        assert await waiting
    assert _seqs(await rheo.fetch("s", "g")) == [2]
    # Once: the next wait blocks again until something happens.
    assert await rheo.wait_for_append("s", 0.1) is False
