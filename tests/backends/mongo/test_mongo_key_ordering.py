"""Key-ordered groups on the MongoDB backend, beyond the conformance kit's ``ordering.*``
cases: how the ordering and the blocked deliveries are stored, old group documents,
a blocked key among many, releases by settle, trim and redrive, both client types,
and races between backend objects (the race between OS processes is
tests/runtime/test_key_ordering_processes.py, which runs on MongoDB too).

Runs against ``RHEO_MONGO_URL`` (default: the emulator ``.ci/mongo-emulator.sh``
starts); every test works in collections of its own prefix (the ``backends``
fixture of tests/backends/mongo/conftest.py), dropped afterwards.
"""

from __future__ import annotations

import asyncio
import random
from collections import defaultdict
from typing import Any

import pytest
from bson import ObjectId

from _mongo_backends import Backends
from rheo_flow import InvalidArgument, Lease, NewEvent, Rheo
from rheo_flow._backends.mongo._keys import BLOCKED_MS
from rheo_flow.backends import MongoBackend


def _collection(backends: Backends, backend: MongoBackend, name: str) -> Any:
    """A collection of the prefix of ``backends``, through ``backend``'s (opened) client."""
    return backend._db[f"{backends.prefix}{name}"]


async def _group_id(backends: Backends, backend: MongoBackend, group: str = "g") -> Any:
    doc = await _collection(backends, backend, "groups").find_one({"n": group}, {"_id": 1})
    return doc["_id"]


async def _unsettled(backends: Backends, backend: MongoBackend, key: str) -> list[tuple[int, bool]]:
    """(sequence, blocked) of the unsettled deliveries of ``key`` in group g, in order."""
    docs = await _collection(backends, backend, "deliveries").find(
        {"g": await _group_id(backends, backend), "k": key, "r": {"$exists": True}},
        {"s": 1, "r": 1},
    ).sort("s", 1).to_list(None)
    return [(d["s"], d["r"] == BLOCKED_MS) for d in docs]


def _seqs(leases: list[Lease]) -> list[int]:
    return [lease.sequence for lease in leases]


# Capabilities and the group document ---------------------------------------------------


@pytest.mark.parametrize("client", ["pymongo", "motor"])
async def test_key_ordering_is_declared_and_open_makes_its_index(backends: Backends,
                                                                  client: str) -> None:
    backend = backends.make() if client == "pymongo" else backends.motor()
    assert backend.capabilities.key_ordering is True  # before open too
    await backend.open()
    assert backend.capabilities.key_ordering is True
    deliveries = await _collection(backends, backend, "deliveries").index_information()
    assert deliveries["keyed"]["key"] == [("g", 1), ("p", 1), ("k", 1), ("s", 1)]
    assert deliveries["keyed"]["partialFilterExpression"] == {"k": {"$gte": ""}}


async def test_ordering_is_stored_with_the_group(backends: Backends) -> None:
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        assert (await rheo.create_group("s", "g", ordering="key")).ordering == "key"
        assert (await rheo.create_group("s", "plain")).ordering == "none"
        groups = _collection(backends, backend, "groups")
        assert (await groups.find_one({"n": "g"}))["o"] == "key"
        assert "o" not in await groups.find_one({"n": "plain"})
        # Only a key-ordered group's deliveries store their key, and only keyed events.
        await rheo.append("s", [NewEvent("t", key="a"), NewEvent("t")])
        leased = await rheo.fetch("s", "g")
        await rheo.fetch("s", "plain")
        deliveries = _collection(backends, backend, "deliveries")
        keyed = {d["s"]: d.get("k") for d in await deliveries.find(
            {"g": await _group_id(backends, backend)}).to_list(None)}
        assert keyed == {1: "a", 2: None}
        assert await deliveries.count_documents({"k": {"$exists": True}}) == 1
        # Settled for good, the key is kept as "sk": the index holds unsettled ones only.
        await rheo.reject(leased[0], "bad")
        stored = await deliveries.find_one({"g": await _group_id(backends, backend), "s": 1})
        assert (stored.get("k"), stored["sk"]) == (None, "a")
        await rheo.redrive("s", "g")
        stored = await deliveries.find_one({"_id": stored["_id"]})
        assert (stored["k"], stored.get("sk")) == ("a", None), "unsettled again: k is back"


async def test_a_group_document_without_ordering_reads_as_unordered(backends: Backends) -> None:
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        # As written by a rheo-flow without key ordering: no "o" field.
        await _collection(backends, backend, "groups").insert_one({
            "_id": ObjectId(), "s": "s", "n": "old", "ma": 5, "at": 1,
            "parts": [{"c": 0, "f": 0, "e": 0}]})
        assert (await rheo.group_info("s", "old")).ordering == "none"
        assert [(g.group, g.ordering) for g in await rheo.groups("s")] == [("old", "none")]
        with pytest.raises(InvalidArgument, match=r"'old'.*'none', not 'key'"):
            await rheo.create_group("s", "old", ordering="key")
        info = await rheo.create_group("s", "old", max_attempts=7)
        assert (info.ordering, info.max_attempts) == ("none", 7)
        await rheo.append("s", [NewEvent("t", key="a"), NewEvent("t", key="a")])
        assert _seqs(await rheo.fetch("s", "old")) == [1, 2]


# Blocked keys --------------------------------------------------------------------------


async def test_a_blocked_key_among_many_still_fills_the_batch(backends: Backends) -> None:
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g", ordering="key")
        # Sequences 1-40 are the hot key, then 30 other keys, each twice.
        await rheo.append("s", [NewEvent("t", key="hot", partition=0) for _ in range(40)])
        await rheo.append("s", [NewEvent("t", key=f"k{i % 30}", partition=0)
                                for i in range(60)])
        [hot] = await rheo.fetch("s", "g", limit=1)
        assert hot.sequence == 1
        batch = await rheo.fetch("s", "g", limit=25)
        assert _seqs(batch) == list(range(41, 66)), "past the 39 blocked events of the hot key"
        rest = await rheo.fetch("s", "g", limit=25)
        assert _seqs(rest) == list(range(66, 71)), "the other keys' first events, then blocked"
        assert await rheo.fetch("s", "g", limit=25) == []
        # The blocked events are stored once (nothing re-reads them) and the cursor is past.
        assert await _unsettled(backends, backend, "hot") == [(1, False)] + [
            (s, True) for s in range(2, 41)]
        group = await _collection(backends, backend, "groups").find_one({"n": "g"})
        assert group["parts"][0]["c"] == 100
        await rheo.ack([*batch, *rest])
        again = await rheo.fetch("s", "g", limit=100)
        assert _seqs(again) == list(range(71, 101)), "each other key's second event"


async def test_blocked_state_is_removed_when_the_key_is_released(backends: Backends) -> None:
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g", ordering="key", max_attempts=2)
        await rheo.append("s", [NewEvent("t", key="a", partition=0) for _ in range(4)])
        [first] = await rheo.fetch("s", "g")
        assert await _unsettled(backends, backend, "a") == [(1, False), (2, True), (3, True),
                                                         (4, True)]
        await rheo.ack(first)  # settled for good: the next is ready, no longer blocked
        assert await _unsettled(backends, backend, "a") == [(2, False), (3, True), (4, True)]
        [second] = await rheo.fetch("s", "g")
        await rheo.nack(second, "again")  # not settled: the key stays held
        assert await _unsettled(backends, backend, "a") == [(2, False), (3, True), (4, True)]
        [again] = await rheo.fetch("s", "g")
        assert (again.sequence, again.attempt) == (2, 2)
        await rheo.nack(again, "no")  # at max attempts: a dead letter, which releases it
        assert [d.sequence for d in await rheo.dead_letters("s", "g")] == [2]
        assert await _unsettled(backends, backend, "a") == [(3, False), (4, True)]
        [third] = await rheo.fetch("s", "g", lease_ms=100)
        backends.clock.advance(101)
        [third] = await rheo.fetch("s", "g")  # an expired lease re-leases the same one
        assert (third.sequence, third.attempt) == (3, 2)
        backends.clock.advance(60_001)  # expired at max attempts: this fetch dead-letters it
        assert await rheo.fetch("s", "g") == []
        assert await _unsettled(backends, backend, "a") == [(4, False)]
        [fourth] = await rheo.fetch("s", "g")
        await rheo.ack(fourth)
        assert await _unsettled(backends, backend, "a") == []
        assert await rheo.frontier("s", "g") == {0: 4}


async def test_trim_releases_the_keys_of_the_deliveries_it_removes(backends: Backends) -> None:
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g", ordering="key")
        await rheo.append("s", [NewEvent("t", key=k, partition=0) for k in "abab"])
        first = await rheo.fetch("s", "g")
        assert _seqs(first) == [1, 2]
        # Removes the leased delivery of a; that of b stays leased.
        await rheo.trim("s", up_to={0: 1}, force=True)
        assert _seqs(await rheo.fetch("s", "g")) == [3]
        assert await _unsettled(backends, backend, "a") == [(3, False)]
        assert await _unsettled(backends, backend, "b") == [(2, False), (4, True)]


async def test_a_redriven_dead_letter_holds_back_the_later_events_of_its_key(
    backends: Backends,
) -> None:
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g", ordering="key")
        await rheo.append("s", [NewEvent("t", key="a", partition=0) for _ in range(2)])
        [first] = await rheo.fetch("s", "g")
        await rheo.reject(first, "bad")  # releases a: 2 is ready
        await rheo.redrive("s", "g")  # 1 is unsettled again, before 2
        [again] = await rheo.fetch("s", "g")
        assert (again.sequence, again.attempt) == (1, 1)
        assert await rheo.fetch("s", "g") == [], "2 waits for the redriven 1"
        await rheo.ack(again)
        assert _seqs(await rheo.fetch("s", "g")) == [2]


# Races between backend objects and processes -------------------------------------------


async def test_racing_backends_lease_one_delivery_per_key_at_a_time(backends: Backends) -> None:
    objects = [backends.make() for _ in range(3)] + [backends.motor()]
    rheos = [Rheo(b) for b in objects]
    for r in rheos:
        await r.open()
    try:
        await rheos[0].create_stream("s", partitions=3)
        await rheos[0].create_group("s", "g", ordering="key")
        rng = random.Random(3)
        await rheos[0].append("s", [NewEvent("t", {"i": i}, key=f"k{rng.randrange(12)}")
                                    for i in range(240)])
        handled: dict[tuple[str, int], list[int]] = defaultdict(list)
        for _ in range(200):
            batches = await asyncio.gather(*(
                r.fetch("s", "g", consumer_id=f"c{i}", limit=rng.randrange(1, 9))
                for i, r in enumerate(rheos)))
            leases = [x for batch in batches for x in batch]
            slots = [(x.event.key, x.partition) for x in leases]
            assert len(slots) == len(set(slots)), "two deliveries of a key leased at once"
            for x in leases:
                assert x.event.key is not None
                handled[(x.event.key, x.partition)].append(x.sequence)
            await asyncio.gather(*(rheos[rng.randrange(4)].ack(x) for x in leases))
            if not leases and await rheos[1].frontier("s", "g") == await rheos[1].high_water(
                    "s"):
                break
        assert sum(map(len, handled.values())) == 240
        for slot, sequences in handled.items():
            assert sequences == sorted(sequences), f"{slot} out of order: {sequences}"
    finally:
        for r in rheos:
            await r.close()
