"""Key-ordered groups on the MongoDB backend, beyond the conformance kit's ``ordering.*``
cases: how the ordering and the blocked deliveries are stored, old group documents,
a blocked key among many, releases by settle, trim and redrive, both client types,
and races between backend objects and OS processes.

Runs against ``RHEO_MONGO_URL`` (default: the emulator ``.ci/mongo-emulator.sh``
starts); every test works in collections of its own prefix, dropped afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from bson import ObjectId

from rheo_flow import InvalidArgument, Lease, ManualClock, NewEvent, Rheo
from rheo_flow._backends.mongo._keys import BLOCKED_MS
from rheo_flow.backends import MongoBackend

ORDERING_WORKER = Path(__file__).with_name("_ordering_worker.py")


class Store:
    """Backends on one fresh collection prefix (as separate processes would), dropped after."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.prefix = f"ko{uuid.uuid4().hex[:10]}_"
        self.clock = ManualClock()
        self.built: list[MongoBackend] = []
        self.clients: list[Any] = []

    def make(self, **options: Any) -> MongoBackend:
        options.setdefault("clock", self.clock)
        backend = MongoBackend(self.url, collection_prefix=self.prefix, **options)
        self.built.append(backend)
        return backend

    def motor(self) -> MongoBackend:
        from motor.motor_asyncio import AsyncIOMotorClient

        client = AsyncIOMotorClient(self.url)
        self.clients.append(client)
        backend = MongoBackend(client=client, collection_prefix=self.prefix, clock=self.clock)
        self.built.append(backend)
        return backend

    def collection(self, backend: MongoBackend, name: str) -> Any:
        """A collection of the store, through ``backend``'s (opened) client."""
        return backend._db[f"{self.prefix}{name}"]

    async def cleanup(self) -> None:
        for backend in self.built:
            await backend.close()
        await self.make().drop_all()
        for client in self.clients:
            client.close()


@pytest.fixture
async def store(mongo_url: str) -> AsyncIterator[Store]:
    made = Store(mongo_url)
    try:
        yield made
    finally:
        await made.cleanup()


async def _group_id(store: Store, backend: MongoBackend, group: str = "g") -> Any:
    doc = await store.collection(backend, "groups").find_one({"n": group}, {"_id": 1})
    return doc["_id"]


async def _unsettled(store: Store, backend: MongoBackend, key: str) -> list[tuple[int, bool]]:
    """(sequence, blocked) of the unsettled deliveries of ``key`` in group g, in order."""
    docs = await store.collection(backend, "deliveries").find(
        {"g": await _group_id(store, backend), "k": key, "r": {"$exists": True}},
        {"s": 1, "r": 1},
    ).sort("s", 1).to_list(None)
    return [(d["s"], d["r"] == BLOCKED_MS) for d in docs]


def _seqs(leases: list[Lease]) -> list[int]:
    return [lease.sequence for lease in leases]


# Capabilities and the group document ---------------------------------------------------


@pytest.mark.parametrize("client", ["pymongo", "motor"])
async def test_key_ordering_is_declared_and_open_makes_its_index(store: Store,
                                                                  client: str) -> None:
    backend = store.make() if client == "pymongo" else store.motor()
    assert backend.capabilities.key_ordering is True  # before open too
    await backend.open()
    assert backend.capabilities.key_ordering is True
    deliveries = await store.collection(backend, "deliveries").index_information()
    assert deliveries["keyed"]["key"] == [("g", 1), ("p", 1), ("k", 1), ("s", 1)]
    assert deliveries["keyed"]["partialFilterExpression"] == {
        "r": {"$exists": True}, "k": {"$exists": True}}


async def test_ordering_is_stored_with_the_group(store: Store) -> None:
    backend = store.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        assert (await rheo.create_group("s", "g", ordering="key")).ordering == "key"
        assert (await rheo.create_group("s", "plain")).ordering == "none"
        groups = store.collection(backend, "groups")
        assert (await groups.find_one({"n": "g"}))["o"] == "key"
        assert "o" not in await groups.find_one({"n": "plain"})
        # Only a key-ordered group's deliveries store their key, and only keyed events.
        await rheo.append("s", [NewEvent("t", key="a"), NewEvent("t")])
        await rheo.fetch("s", "g")
        await rheo.fetch("s", "plain")
        deliveries = store.collection(backend, "deliveries")
        keyed = {d["s"]: d.get("k") for d in await deliveries.find(
            {"g": await _group_id(store, backend)}).to_list(None)}
        assert keyed == {1: "a", 2: None}
        assert await deliveries.count_documents({"k": {"$exists": True}}) == 1


async def test_a_group_document_without_ordering_reads_as_unordered(store: Store) -> None:
    backend = store.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        # As written by a rheo-flow without key ordering: no "o" field.
        await store.collection(backend, "groups").insert_one({
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


async def test_a_blocked_key_among_many_still_fills_the_batch(store: Store) -> None:
    backend = store.make()
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
        assert await _unsettled(store, backend, "hot") == [(1, False)] + [
            (s, True) for s in range(2, 41)]
        group = await store.collection(backend, "groups").find_one({"n": "g"})
        assert group["parts"][0]["c"] == 100
        await rheo.ack([*batch, *rest])
        again = await rheo.fetch("s", "g", limit=100)
        assert _seqs(again) == list(range(71, 101)), "each other key's second event"


async def test_blocked_state_is_removed_when_the_key_is_released(store: Store) -> None:
    backend = store.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g", ordering="key", max_attempts=2)
        await rheo.append("s", [NewEvent("t", key="a", partition=0) for _ in range(4)])
        [first] = await rheo.fetch("s", "g")
        assert await _unsettled(store, backend, "a") == [(1, False), (2, True), (3, True),
                                                         (4, True)]
        await rheo.ack(first)  # settled for good: the next is ready, no longer blocked
        assert await _unsettled(store, backend, "a") == [(2, False), (3, True), (4, True)]
        [second] = await rheo.fetch("s", "g")
        await rheo.nack(second, "again")  # not settled: the key stays held
        assert await _unsettled(store, backend, "a") == [(2, False), (3, True), (4, True)]
        [again] = await rheo.fetch("s", "g")
        assert (again.sequence, again.attempt) == (2, 2)
        await rheo.nack(again, "no")  # at max attempts: a dead letter, which releases it
        assert [d.sequence for d in await rheo.dead_letters("s", "g")] == [2]
        assert await _unsettled(store, backend, "a") == [(3, False), (4, True)]
        [third] = await rheo.fetch("s", "g", lease_ms=100)
        store.clock.advance(101)
        [third] = await rheo.fetch("s", "g")  # an expired lease re-leases the same one
        assert (third.sequence, third.attempt) == (3, 2)
        store.clock.advance(60_001)  # expired at max attempts: this fetch dead-letters it
        assert await rheo.fetch("s", "g") == []
        assert await _unsettled(store, backend, "a") == [(4, False)]
        [fourth] = await rheo.fetch("s", "g")
        await rheo.ack(fourth)
        assert await _unsettled(store, backend, "a") == []
        assert await rheo.frontier("s", "g") == {0: 4}


async def test_trim_releases_the_keys_of_the_deliveries_it_removes(store: Store) -> None:
    backend = store.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.create_group("s", "g", ordering="key")
        await rheo.append("s", [NewEvent("t", key=k, partition=0) for k in "abab"])
        first = await rheo.fetch("s", "g")
        assert _seqs(first) == [1, 2]
        # Removes the leased delivery of a; that of b stays leased.
        await rheo.trim("s", up_to={0: 1}, force=True)
        assert _seqs(await rheo.fetch("s", "g")) == [3]
        assert await _unsettled(store, backend, "a") == [(3, False)]
        assert await _unsettled(store, backend, "b") == [(2, False), (4, True)]


async def test_a_redriven_dead_letter_holds_back_the_later_events_of_its_key(
    store: Store,
) -> None:
    backend = store.make()
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


async def test_racing_backends_lease_one_delivery_per_key_at_a_time(store: Store) -> None:
    objects = [store.make() for _ in range(3)] + [store.motor()]
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


async def _ordering_worker(*args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(ORDERING_WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()


async def test_three_processes_keep_each_key_in_order(store: Store, tmp_path: Path) -> None:
    """tests/_ordering_worker.py in three processes (a Group with sixteen handlers each,
    retrying about one handling in eight): per key, handlings never overlap and follow
    the append order; every event is acked exactly once."""
    events, keys = 300, 30
    url = f"{store.url.split('?', 1)[0]}?collection_prefix={store.prefix}"
    rng = random.Random(11)
    async with Rheo(store.make(clock=None)) as rheo:
        await rheo.create_stream("orders", partitions=3)
        await rheo.create_group("orders", "billing", ordering="key")
        await rheo.append("orders", [NewEvent("order", {"i": i}, key=f"k{rng.randrange(keys)}")
                                     for i in range(events)])
        ready = tmp_path / "ready"
        ready.mkdir()
        outs = [tmp_path / f"w{i}.jsonl" for i in range(3)]
        await asyncio.gather(*(
            _ordering_worker(url, "orders", "billing", f"w{i}", str(ready), "3", str(out), str(i))
            for i, out in enumerate(outs)))
        assert await rheo.frontier("orders", "billing") == await rheo.high_water("orders")
        assert await rheo.dead_letters("orders", "billing") == []
    records = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    by_key: dict[tuple[str, int], list[list[Any]]] = defaultdict(list)
    for record in records:
        by_key[(record[0], record[1])].append(record)
    for slot, handlings in by_key.items():
        handlings.sort(key=lambda r: r[4])
        for before, after in itertools.pairwise(handlings):
            assert after[2] >= before[2], f"{slot}: sequence {after[2]} after {before[2]}"
            assert after[4] >= before[5], f"{slot}: handlings of {before[2]} and {after[2]} overlap"
    acks = [(r[1], r[2]) for r in records if r[6] == "ack"]
    assert len(acks) == len(set(acks)) == events
