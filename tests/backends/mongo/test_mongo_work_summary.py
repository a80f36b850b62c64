"""The MongoDB backend's work summary (``_summary``): races that must lose nothing.

A fetch reads the group's summary (which partitions may have events past the
cursor), visits those partitions, and clears the entries whose events it has
materialised. Each test below puts a write of another backend (a process of its
own, as far as the server can tell: its own client) exactly between the fetch's
reads and its clear, by wrapping the fetching backend's write of cursors and
clears; no sleep stands in for the interleaving. Both ways of appending are
covered: in transactions and, as on a standalone server, without.

Runs against ``RHEO_MONGO_URL`` (default: the emulator ``.ci/mongo-emulator.sh``
starts); every test works in collections of its own prefix, dropped afterwards.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from bson import ObjectId

from _mongo_backends import Backends
from rheo_flow import Lease, NewEvent, Rheo
from rheo_flow._backends.mongo import _append
from rheo_flow._backends.mongo._documents import Group
from rheo_flow.backends import MongoBackend

TRANSACTIONS = pytest.mark.parametrize("transactions", [True, False],
                                       ids=["transactions", "standalone"])


def _groups(backends: Backends, backend: MongoBackend) -> Any:
    return backend._db[f"{backends.prefix}groups"]


async def _summary(backends: Backends, backend: MongoBackend, group: str = "g") -> Any:
    doc = await _groups(backends, backend).find_one({"n": group}, {"w": 1, "ws": 1})
    return doc.get("ws"), doc.get("w")


def _seqs(leases: list[Lease]) -> list[tuple[int, int]]:
    return sorted((lease.event.partition, lease.event.sequence) for lease in leases)


def _before_clearing(backend: MongoBackend, act: Callable[[], Awaitable[None]]) -> list[int]:
    """Run ``act`` once, when ``backend``'s next fetch has read the summary, the entries
    and the high waters and is about to raise its cursors and clear entries; returns a
    list that holds one item once it ran."""
    ran: list[int] = []
    original = backend._raise_cursors

    async def racing(g: Group, tops: dict[int, int], visited: list[int]) -> None:
        if not ran:
            ran.append(1)
            await act()
        await original(g, tops, visited)

    backend._raise_cursors = racing  # type: ignore[method-assign]
    return ran


@TRANSACTIONS
async def test_an_append_between_the_summary_read_and_the_clear_is_not_lost(
    backends: Backends, transactions: bool
) -> None:
    fetcher = backends.make(transactions=transactions)
    async with Rheo(fetcher) as rheo, Rheo(backends.make(transactions=transactions)) as other:
        await rheo.create_stream("s", partitions=4)
        await rheo.create_group("s", "g")
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(3)], partition=2)
        assert await _summary(backends, fetcher) == (1, {"2": 3})

        async def append() -> None:
            await other.append("s", [NewEvent("t", {"n": 3})], partition=2)

        ran = _before_clearing(fetcher, append)
        first = await rheo.fetch("s", "g", consumer_id="c", limit=10)
        assert ran
        assert _seqs(first) == [(2, 1), (2, 2), (2, 3)]
        # The clear (entry at most the cursor, 3) found the append's note (4): it stayed.
        assert await _summary(backends, fetcher) == (1, {"2": 4})
        await rheo.ack(first)
        second = await rheo.fetch("s", "g", consumer_id="c", limit=10)
        assert _seqs(second) == [(2, 4)]
        await rheo.ack(second)
        # Without a race the clear goes through, and the next fetch finds nothing.
        assert await _summary(backends, fetcher) == (1, {})
        assert await rheo.fetch("s", "g", consumer_id="c", limit=10) == []


async def test_a_replay_between_the_summary_read_and_the_clear_is_not_lost(
    backends: Backends,
) -> None:
    fetcher = backends.make()
    async with Rheo(fetcher) as rheo, Rheo(backends.make()) as other:
        await rheo.create_stream("s", partitions=2)
        await rheo.create_group("s", "g")
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(3)], partition=1)

        async def replay() -> None:
            await other.replay("s", "g", from_sequence=1, partitions=[1])

        ran = _before_clearing(fetcher, replay)
        first = await rheo.fetch("s", "g", consumer_id="c", limit=10)
        assert ran
        assert _seqs(first) == [(1, 1), (1, 2), (1, 3)]
        # The replay moved the cursor back (and bumped the epoch) after the fetch read
        # it: the entry, at most the cursor the fetch raised, is kept all the same.
        assert await _summary(backends, fetcher) == (1, {"1": 3})
        again = await rheo.fetch("s", "g", consumer_id="c", limit=10)
        assert _seqs(again) == [(1, 1), (1, 2), (1, 3)]
        assert [lease.attempt for lease in again] == [1, 1, 1]
        assert not any(r.ok for r in await rheo.ack(first))  # fenced by the replay
        assert all(r.ok for r in await rheo.ack(again))


@TRANSACTIONS
async def test_a_group_created_during_an_append_sees_its_events(
    backends: Backends, transactions: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group appears between the append's first note (which cannot reach it) and
    the moment its events become visible (which its creation cannot see): the second
    note reaches it."""
    appender = backends.make(transactions=transactions)
    async with Rheo(appender) as rheo, Rheo(backends.make()) as other:
        await rheo.create_stream("s", partitions=2)
        notes: list[dict[int, int]] = []
        note = _append.note

        async def noting(groups: Any, stream: str, tops: Any) -> None:
            notes.append(dict(tops))
            if len(notes) == 1:
                await other.create_group("s", "late", start="latest")
            await note(groups, stream, tops)

        monkeypatch.setattr(_append, "note", noting)
        await rheo.append("s", [NewEvent("t", {"n": 1})], partition=0)
        assert notes == [{0: 1}, {0: 1}]
        leases = await other.fetch("s", "late", consumer_id="c", limit=10)
        assert _seqs(leases) == [(0, 1)]


async def test_a_group_written_before_summaries_is_built_by_a_fetch(backends: Backends) -> None:
    """Upgrading: a group document as an earlier rheo-flow wrote it (no ``np``, ``w`` or
    ``ws``) reads as having no summary; the next fetch reads it whole with every high
    water, as fetches did, and completes the summary."""
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=3)
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(4)], partition=1)
        await _groups(backends, backend).insert_one({
            "_id": ObjectId(), "s": "s", "n": "old", "ma": 5, "at": 1,
            "parts": [{"c": 0, "f": 0, "e": 0} for _ in range(3)]})
        assert await _summary(backends, backend, "old") == (None, None)
        first = await rheo.fetch("s", "old", consumer_id="c", limit=3)
        assert _seqs(first) == [(1, 1), (1, 2), (1, 3)]
        doc = await _groups(backends, backend).find_one({"n": "old"})
        assert (doc["ws"], doc["np"], doc["w"]) == (1, 3, {"1": 4})
        await rheo.ack(first)
        rest = await rheo.fetch("s", "old", consumer_id="c", limit=10)
        assert _seqs(rest) == [(1, 4)]
        await rheo.ack(rest)
        assert await _summary(backends, backend, "old") == (1, {})


async def test_replay_and_reset_note_the_partitions_they_move_back(backends: Backends) -> None:
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=3)
        await rheo.create_group("s", "g")
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(2)], partition=0)
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(2)], partition=2)
        await rheo.ack(await rheo.fetch("s", "g", consumer_id="c", limit=10))
        assert await _summary(backends, backend) == (1, {})
        await rheo.replay("s", "g", from_sequence=2, partitions=[0])
        assert await _summary(backends, backend) == (1, {"0": 2})
        await rheo.reset("s", "g", to="earliest", partitions=[2])
        assert await _summary(backends, backend) == (1, {"0": 2, "2": 2})
        leases = await rheo.fetch("s", "g", consumer_id="c", limit=10)
        assert _seqs(leases) == [(0, 2), (2, 1), (2, 2)]
        await rheo.ack(leases)
        await rheo.reset("s", "g", to="latest")  # nothing left past the cursors: no entry
        assert await _summary(backends, backend) == (1, {})


@TRANSACTIONS
async def test_an_append_dying_after_its_events_became_visible_left_them_noted(
    backends: Backends, transactions: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stops between making the events visible (the commit, or the counters)
    and its second note: the first note already names the partition."""
    appender = backends.make(transactions=transactions)
    async with Rheo(appender) as rheo, Rheo(backends.make()) as other:
        await rheo.create_stream("s", partitions=2)
        await rheo.create_group("s", "g")
        note = _append.note
        calls: list[int] = []

        async def dying(groups: Any, stream: str, tops: Any) -> None:
            calls.append(1)
            if len(calls) == 2:
                raise ConnectionError("the appending process stopped here")
            await note(groups, stream, tops)

        monkeypatch.setattr(_append, "note", dying)
        with pytest.raises(Exception, match="stopped here"):
            await rheo.append("s", [NewEvent("t", {"n": 1}), NewEvent("t", {"n": 2})],
                              partition=1)
        assert (await other.stream_info("s")).high_water[1] == 2  # visible
        assert _seqs(await other.fetch("s", "g", consumer_id="c", limit=10)) == [(1, 1), (1, 2)]


async def test_opening_a_version_1_store_records_version_2(backends: Backends) -> None:
    """An older rheo-flow's appends would not note the summaries: once a process of this
    version opened the store, older ones refuse it."""
    first = backends.make()
    await first.open()
    meta = first._db[f"{backends.prefix}meta"]
    await meta.update_one({"_id": "schema"}, {"$set": {"v": 1}})
    await backends.make().open()
    assert (await meta.find_one({"_id": "schema"}))["v"] == 2
