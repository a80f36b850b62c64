"""What a fetch asks of the server, counted by a PyMongo command listener (issue 36).

No wall-clock measure: the commands one fetch sends, and the documents and bytes the
server returns to them, are the same on any server. A fetch on a stream of 256
partitions sends as many commands as on a stream of one, whether it finds nothing or
fills its batch from one busy partition, and reads as much: the group's work summary
names the partitions with new events, so neither the group's per-partition entries
nor the high waters of the idle partitions are read; and deliveries held by other
consumers' leases or delayed by nacks are not read: the queries for due deliveries
run on the indexes by ready time, bounded by the fetch's ``now``, and return none of
them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import bson
from pymongo import AsyncMongoClient, monitoring

from _mongo_backends import SLOW_SERVER_TIMEOUT_MS, Backends
from rheo_flow import NewEvent, Rheo
from rheo_flow.backends import MongoBackend

HOUR_MS = 3_600_000


@dataclass
class Sent:
    """One command as sent, and how many documents its reply returned."""

    name: str
    collection: Any
    command: dict[str, Any]
    returned: int = 0
    reply_bytes: int = 0
    """The size of the reply, as BSON."""


@dataclass
class Commands(monitoring.CommandListener):
    """Every command the client sends while ``on``, with the documents returned."""

    on: bool = False
    sent: dict[int, Sent] = field(default_factory=dict)

    def started(self, event: monitoring.CommandStartedEvent) -> None:
        if self.on:
            name = event.command_name
            # A getMore names its cursor; the collection is a field of its own.
            target = event.command.get("collection" if name == "getMore" else name)
            self.sent[event.request_id] = Sent(name, target, dict(event.command))

    def succeeded(self, event: monitoring.CommandSucceededEvent) -> None:
        sent = self.sent.get(event.request_id)
        if sent is None:
            return
        sent.reply_bytes = len(bson.encode(event.reply))
        cursor = event.reply.get("cursor")
        if isinstance(cursor, dict):
            sent.returned = len(cursor.get("firstBatch", ()))
        elif isinstance(event.reply.get("value"), dict):  # findAndModify
            sent.returned = 1

    def failed(self, event: monitoring.CommandFailedEvent) -> None:
        pass

    def clear(self) -> list[Sent]:
        out = list(self.sent.values())
        self.sent = {}
        return out


@asynccontextmanager
async def counted(backends: Backends) -> AsyncIterator[tuple[Rheo, Commands]]:
    """A Rheo on the test's prefix whose client reports its commands to a listener."""
    commands = Commands()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(
        backends.url, event_listeners=[commands])
    backend = MongoBackend(client=client, collection_prefix=backends.prefix,
                           clock=backends.clock, timeout_ms=SLOW_SERVER_TIMEOUT_MS)
    try:
        async with Rheo(backend) as rheo:
            yield rheo, commands
    finally:
        await client.close()


async def fetch_counted(rheo: Rheo, commands: Commands, stream: str, limit: int = 100,
                        consumer: str = "fresh") -> tuple[int, list[Sent]]:
    """Fetch (acking what it got, uncounted): how many leases, and the commands sent."""
    commands.clear()
    commands.on = True
    try:
        leases = await rheo.fetch(stream, "g", consumer_id=consumer, limit=limit,
                                  lease_ms=60_000)
    finally:
        commands.on = False
    sent = commands.clear()
    if leases:
        await rheo.ack(leases)
    return len(leases), sent


def shape(sent: list[Sent]) -> list[tuple[str, Any]]:
    return sorted((s.name, s.collection) for s in sent)


async def test_fetch_commands_do_not_grow_with_partitions(backends: Backends) -> None:
    async with counted(backends) as (rheo, commands):
        shapes: dict[int, dict[str, list[tuple[str, Any]]]] = {}
        for count in (1, 256):
            empty, busy = f"empty-{count}", f"busy-{count}"
            for stream in (empty, busy):
                await rheo.create_stream(stream, partitions=count)
                await rheo.create_group(stream, "g")
            await rheo.append(busy, [NewEvent("t", {"n": i}) for i in range(150)], partition=0)
            got, empty_sent = await fetch_counted(rheo, commands, empty)
            assert got == 0
            got, busy_sent = await fetch_counted(rheo, commands, busy)
            assert got == 100
            shapes[count] = {"empty": shape(empty_sent), "busy": shape(busy_sent)}
        # The same commands on 256 partitions as on one, and few of them: an empty fetch
        # reads the group (without its per-partition entries) and the due deliveries;
        # a busy one then reads the busy partition's entry and high water (at once),
        # and sends the claims, the cursor and the read of the events.
        assert shapes[256] == shapes[1]
        assert shapes[256]["empty"] == [("find", f"{backends.prefix}deliveries"),
                                        ("find", f"{backends.prefix}groups")]
        assert len(shapes[256]["busy"]) <= 7, shapes[256]["busy"]


async def test_fetch_reads_do_not_grow_with_partitions(backends: Backends) -> None:
    """What the replies hold, not only how many commands: an empty fetch of 256 partitions
    reads one small group document and no delivery (the bytes of one partition's fetch,
    give or take the names), and a fetch from one busy partition of 256 reads the entry
    and high water of that partition only."""
    async with counted(backends) as (rheo, commands):
        read: dict[int, dict[str, list[Sent]]] = {}
        for count in (1, 256):
            empty, busy = f"empty{count:03d}", f"busy{count:03d}"
            for stream in (empty, busy):
                await rheo.create_stream(stream, partitions=count)
                await rheo.create_group(stream, "g")
            # Work elsewhere in the store changes nothing: another group's, another stream's.
            await rheo.create_group(busy, "other")
            await rheo.append(busy, [NewEvent("t", {"n": i}) for i in range(150)], partition=0)
            for _ in range(2):  # the second empty fetch as the first
                got, empty_sent = await fetch_counted(rheo, commands, empty)
                assert got == 0
            got, busy_sent = await fetch_counted(rheo, commands, busy)
            assert got == 100
            read[count] = {"empty": empty_sent, "busy": busy_sent}
        for kind in ("empty", "busy"):
            docs = {count: sum(s.returned for s in read[count][kind]) for count in read}
            size = {count: sum(s.reply_bytes for s in read[count][kind]) for count in read}
            assert docs[256] == docs[1], (kind, docs)
            # Only the partition count (an int32 either way) and the ids differ.
            assert abs(size[256] - size[1]) <= 16, (kind, size)
        empty_reads = read[256]["empty"]
        assert sum(s.returned for s in empty_reads) == 1  # the group, none of its entries
        assert sum(s.reply_bytes for s in empty_reads) < 1_024, [
            (s.name, s.collection, s.reply_bytes) for s in empty_reads]
        partition_reads = [s for s in read[256]["busy"]
                           if str(s.collection).endswith("partitions")]
        assert [s.returned for s in partition_reads] == [1]  # partition 0's high water


async def test_fetch_reads_no_held_or_delayed_delivery(backends: Backends) -> None:
    async with counted(backends) as (rheo, commands):
        await rheo.create_stream("s", partitions=4)
        await rheo.create_group("s", "g")
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(240)])
        held = await rheo.fetch("s", "g", consumer_id="holder", limit=200, lease_ms=HOUR_MS)
        delayed = held[:100]
        await rheo.nack(delayed, "later", delay_ms=HOUR_MS)
        got, sent = await fetch_counted(rheo, commands, "s", limit=10)
        assert got == 10  # new events past the cursors, none of the 200 in flight
        reads = [s for s in sent if s.name == "find" and str(s.collection).endswith("deliveries")]
        assert reads, shape(sent)
        for read in reads:  # on an index by ready time, bounded by now
            assert read.command.get("hint") in ("due", "group_due"), read.command
            assert "$lte" in read.command["filter"]["r"], read.command
        assert sum(read.returned for read in reads) == 0
        # Once they are due (the leases expired, the delay over), they are read: the
        # group's first 10, and as there may be more, up to 10 per partition with due
        # deliveries (one distinct lists them), so that each gets its turns.
        backends.clock.advance(HOUR_MS + 1)
        got, sent = await fetch_counted(rheo, commands, "s", limit=10, consumer="late")
        assert got == 10
        assert sum(s.returned for s in sent if s.name == "find"
                   and str(s.collection).endswith("deliveries")) == 10 + 4 * 10
        assert [s.name for s in sent].count("distinct") == 1


async def test_describe_streams_sends_the_same_commands_for_one_stream_or_many(
        backends: Backends) -> None:
    """What ``rheo-flow streams`` lists: three queries (streams, waters, groups) whether
    the store holds one stream or twenty, each with its groups."""
    async with counted(backends) as (rheo, commands):
        sent: dict[int, list[tuple[str, Any]]] = {}
        names: list[str] = []
        for count in (1, 20):
            while len(names) < count:
                names.append(f"listed-{len(names):02d}")
                await rheo.create_stream(names[-1], partitions=4)
                await rheo.create_group(names[-1], "g")
            commands.clear()
            commands.on = True
            try:
                described = await rheo.describe_streams()
            finally:
                commands.on = False
            assert [info.name for info, _ in described] == names
            sent[count] = shape(commands.clear())
        assert sent[20] == sent[1]
        assert sent[1] == [("find", f"{backends.prefix}groups"),
                           ("find", f"{backends.prefix}partitions"),
                           ("find", f"{backends.prefix}streams")]
