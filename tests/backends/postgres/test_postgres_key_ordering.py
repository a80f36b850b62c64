"""Key-ordered groups on the PostgreSQL backend, beyond the conformance kit's
``ordering.*`` cases: the upgrade of a version 4 schema, batches filled past a
blocked key (also past one longer than a fetch's scan budget), trims releasing a
key, events held behind their key until a settle or a dead letter releases it
(stored not held when the key's last delivery is locked), and competing fetches
of several instances never holding two deliveries of one key. Every test works in
its own schema, dropped afterwards (the ``postgres_*`` fixtures of
tests/conftest.py)."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
import pytest

from rheo_flow import InvalidArgument, Lease, NewEvent, Query, Rheo
from rheo_flow._backends.postgres._migrations import (
    BOOTSTRAP,
    MIGRATIONS,
    SCHEMA_VERSION,
    VERSION_TABLE,
)
from rheo_flow._backends.postgres._sql import render
from rheo_flow.backends import PostgresBackend

WaitUntil = Callable[..., Awaitable[None]]
"""The ``wait_until`` fixture's type (tests/conftest.py)."""


def _keys(leases: list[Lease]) -> list[str | None]:
    return [lease.event.key for lease in leases]


# Upgrade ---------------------------------------------------------------------


async def test_a_version_4_schema_upgrades_with_its_groups_unordered(
        postgres_schema_url: str, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    url, schema, admin = postgres_schema_url, postgres_schema, postgres_admin
    # The tables of version 4 (the functions do not matter: the upgrade installs
    # them all), with a group, two events of one key and a lease on the first.
    for migration in MIGRATIONS[:4]:
        for script in (*(BOOTSTRAP.statements if migration.version == 1 else ()),
                       *migration.statements):
            await admin.execute(render(script, schema))
        await admin.execute(f'INSERT INTO "{schema}".{VERSION_TABLE} (version, description) '
                            "VALUES ($1, 'old')", migration.version)
    q = f'"{schema}"'
    stream_id = await admin.fetchval(
        f"INSERT INTO {q}.streams (name, partitions, created_at_ms) VALUES ('s', 1, 0) "
        "RETURNING id")
    await admin.execute(f"INSERT INTO {q}.partitions (stream_id, part, high_water) "
                        "VALUES ($1, 0, 3)", stream_id)
    await admin.execute(
        f"INSERT INTO {q}.events (stream_id, part, seq, appended_at_ms, event_id, type, key, "
        "data) SELECT $1, 0, i, 0, 'e' || i, 't', 'k', json_build_object('i', i) "
        "FROM generate_series(1, 3) i", stream_id)
    gid = await admin.fetchval(
        f"INSERT INTO {q}.groups (stream_id, name, max_attempts, created_at_ms) "
        "VALUES ($1, 'old', 5, 0) RETURNING id", stream_id)
    await admin.execute(f"INSERT INTO {q}.cursors VALUES ($1, 0, 1)", gid)
    await admin.execute(f"INSERT INTO {q}.frontiers VALUES ($1, 0, 0)", gid)
    lease_id = uuid.uuid4()
    await admin.execute(
        f"INSERT INTO {q}.deliveries (group_id, part, seq, state, attempt, lease_id, "
        "consumer_id, deadline_ms) VALUES ($1, 0, 1, 1, 1, $2, 'c', 9000000000000)",
        gid, lease_id)

    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        version = await admin.fetchval(f"SELECT max(version) FROM {q}.{VERSION_TABLE}")
        assert version == SCHEMA_VERSION
        assert (await rheo.group_info("s", "old")).ordering == "none"
        assert [g.ordering for g in await rheo.groups("s")] == ["none"]
        with pytest.raises(InvalidArgument, match="'none'"):
            await rheo.create_group("s", "old", ordering="key")
        # Unordered as before: the later events of the leased key are not held back.
        assert [x.sequence for x in await rheo.fetch("s", "old", limit=10)] == [2, 3]
        assert await admin.fetchval(f"SELECT count(*) FROM {q}.deliveries "
                                    "WHERE key IS NOT NULL") == 0
        # The lease of version 4 settles as before.
        event = (await rheo.query_page(Query(stream="s"), limit=1)).events[0]
        old = Lease(lease_id.hex, "0-1-1", "old", "c", event, 1, 9_000_000_000_000)
        assert all(r.ok for r in await rheo.ack(old))
        # A new group of the stream may be key-ordered.
        assert (await rheo.create_group("s", "keyed", ordering="key")).ordering == "key"
        assert [x.sequence for x in await rheo.fetch("s", "keyed", limit=10)] == [1]


# Blocked keys ----------------------------------------------------------------


async def test_a_blocked_key_among_many_keys_still_fills_the_batch(postgres_rheo: Rheo) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    keys = [f"k{i}" if i % 4 == 3 else "hot" for i in range(800)]  # 600 hot, 200 others
    await rheo.append("s", [NewEvent("t", {"i": i}, key=k, partition=0)
                            for i, k in enumerate(keys)])
    [hot] = await rheo.fetch("s", "g", limit=1)
    assert hot.event.key == "hot"
    assert hot.sequence == 1
    first = await rheo.fetch("s", "g", limit=100)
    assert len(first) == 100
    assert "hot" not in _keys(first)
    assert [x.sequence for x in first] == sorted(x.sequence for x in first)
    second = await rheo.fetch("s", "g", limit=150)
    assert len(second) == 100
    assert "hot" not in _keys(second)
    assert len(set(_keys([*first, *second]))) == 200
    assert await rheo.fetch("s", "g", limit=10) == []
    assert all(r.ok for r in await rheo.ack(hot))
    [nxt] = await rheo.fetch("s", "g", limit=10)
    assert (nxt.event.key, nxt.sequence) == ("hot", 2)


async def test_a_key_longer_than_the_scan_budget_does_not_stall_others(postgres_rheo: Rheo) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    for _ in range(3):  # 6,000 events of one key, then ten of others
        await rheo.append("s", [NewEvent("t", key="hot", partition=0) for _ in range(2_000)])
    await rheo.append("s", [NewEvent("t", key=f"k{i}", partition=0) for i in range(10)])
    [hot] = await rheo.fetch("s", "g", limit=1)
    others: list[Lease] = []
    for _ in range(4):
        others += await rheo.fetch("s", "g", limit=10)
    assert sorted(_keys(others), key=str) == sorted(f"k{i}" for i in range(10))
    assert (await rheo.frontier("s", "g")) == {0: 0}
    assert all(r.ok for r in await rheo.ack([hot, *others]))
    [nxt] = await rheo.fetch("s", "g", limit=10)
    assert (nxt.event.key, nxt.sequence) == ("hot", 2)
    assert (await rheo.frontier("s", "g")) == {0: 1}


async def test_a_trim_releases_the_key_of_a_trimmed_delivery(postgres_rheo: Rheo) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    await rheo.append("s", [NewEvent("t", key="a", partition=0) for _ in range(3)])
    [first] = await rheo.fetch("s", "g", limit=10)
    assert await rheo.fetch("s", "g", limit=10) == []
    await rheo.trim("s", up_to=1, force=True)
    assert [x.sequence for x in await rheo.fetch("s", "g", limit=10)] == [2]
    assert not (await rheo.ack(first))[0].ok


async def test_only_key_ordered_groups_store_keys(postgres_rheo: Rheo, postgres_schema: str,
                                                  postgres_admin: asyncpg.Connection) -> None:
    rheo, schema, admin = postgres_rheo, postgres_schema, postgres_admin
    # A key K is stored as "k" + K, a keyless event as "-" + its sequence (its own
    # key: never blocked); the delivery of a later event of a leased key is stored
    # available, attempt 0. An unordered group stores no delivery rows for its leases.
    await rheo.create_stream("s")
    await rheo.create_group("s", "plain")
    await rheo.create_group("s", "keyed", ordering="key")
    await rheo.append("s", [NewEvent("t", key="a"), NewEvent("t", key="a"), NewEvent("t")])
    assert len(await rheo.fetch("s", "plain", limit=10)) == 3
    assert len(await rheo.fetch("s", "keyed", limit=10)) == 2
    rows = await admin.fetch(
        f'SELECT g.name, d.seq, d.state, d.key FROM "{schema}".deliveries d '
        f'JOIN "{schema}".groups g ON g.id = d.group_id ORDER BY g.name, d.seq')
    assert [tuple(r) for r in rows] == [
        ("keyed", 1, 1, "ka"), ("keyed", 2, 0, "ka"), ("keyed", 3, 1, "-3")]
    # The unordered group's fetch stored one range (schema version 8), no delivery rows.
    ranges = await admin.fetch(
        f'SELECT g.name, r.first_seq, r.last_seq, r.pending FROM "{schema}".ranges r '
        f'JOIN "{schema}".groups g ON g.id = r.group_id')
    assert [tuple(r) for r in ranges] == [("plain", 1, 3, 3)]


# Held deliveries (schema version 7) ------------------------------------------

HELD = 2**63 - 1
"""available_at_ms of a delivery held behind an earlier one of its key."""


async def _held(admin: asyncpg.Connection, schema: str) -> dict[int, bool]:
    """Each available delivery's sequence: whether it is held."""
    rows = await admin.fetch(f'SELECT seq, available_at_ms FROM "{schema}".deliveries '
                             "WHERE state = 0 ORDER BY seq")
    return {r["seq"]: r["available_at_ms"] == HELD for r in rows}


async def test_events_behind_a_leased_key_are_held_until_it_is_settled_for_good(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    rheo, schema, admin = postgres_rheo, postgres_schema, postgres_admin
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    await rheo.append("s", [NewEvent("t", key="a") for _ in range(3)] + [NewEvent("t", key="b")])
    first = await rheo.fetch("s", "g", limit=10)
    assert [(x.event.key, x.sequence) for x in first] == [("a", 1), ("b", 4)]
    assert await _held(admin, schema) == {2: True, 3: True}
    await rheo.ack(first)  # releases a: its next event is due, the one after it held
    assert await _held(admin, schema) == {2: False, 3: True}
    [second] = await rheo.fetch("s", "g", limit=10)
    assert second.sequence == 2
    await rheo.nack(second, "later")  # a nack keeps the key: 3 stays held
    assert await _held(admin, schema) == {2: False, 3: True}
    [again] = await rheo.fetch("s", "g", limit=10)
    assert (again.sequence, again.attempt) == (2, 2)
    await rheo.reject(again, "bad")  # a dead letter releases it
    assert await _held(admin, schema) == {3: False}
    assert [x.sequence for x in await rheo.fetch("s", "g", limit=10)] == [3]


async def test_an_expired_lease_dead_lettered_by_a_fetch_releases_its_key(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection,
        wait_until: WaitUntil) -> None:
    rheo, schema, admin = postgres_rheo, postgres_schema, postgres_admin
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key", max_attempts=1)
    await rheo.append("s", [NewEvent("t", key="a") for _ in range(2)])
    [first] = await rheo.fetch("s", "g", limit=10, lease_ms=10)
    assert await _held(admin, schema) == {2: True}
    leases: list[Lease] = []

    async def fetched() -> bool:  # once the lease ran out, a fetch dead-letters it
        leases.extend(await rheo.fetch("s", "g", limit=10))
        return bool(leases)

    await wait_until(fetched, timeout=10, message="the next event of the key leased")
    assert [x.sequence for x in leases] == [2]
    assert [d.sequence for d in await rheo.dead_letters("s", "g")] == [first.sequence]


async def test_an_event_behind_a_locked_delivery_is_stored_not_held_and_still_waits(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    rheo, schema, admin = postgres_rheo, postgres_schema, postgres_admin
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key")
    await rheo.append("s", [NewEvent("t", key="a")])
    [first] = await rheo.fetch("s", "g", limit=10)
    await rheo.append("s", [NewEvent("t", key="a")])
    # A settle of the key's last delivery under way (its row locked): the fetch
    # cannot lock it, so it cannot be sure that settle will see its new row.
    async with admin.transaction():
        await admin.execute(f'SELECT 1 FROM "{schema}".deliveries WHERE seq = 1 FOR UPDATE')
        assert await rheo.fetch("s", "g", limit=10) == []
    assert await _held(admin, schema) == {2: False}
    assert await rheo.fetch("s", "g", limit=10) == []  # not the head: it waits all the same
    await rheo.ack(first)
    assert [x.sequence for x in await rheo.fetch("s", "g", limit=10)] == [2]


# Competing fetches -----------------------------------------------------------


async def test_competing_instances_never_hold_two_deliveries_of_a_key(
        postgres_schema_url: str) -> None:
    url = postgres_schema_url
    events = 600
    rng = random.Random(3)
    instances = [Rheo(PostgresBackend.from_url(url)) for _ in range(3)]
    for instance in instances:
        await instance.open()
    try:
        first = instances[0]
        await first.create_stream("s", partitions=2)
        await first.create_group("s", "g", ordering="key", max_attempts=100)
        await first.append("s", [NewEvent("t", {"i": i}, key=f"k{rng.randrange(12)}")
                                 for i in range(events)])
        held: dict[tuple[int, str], int] = {}
        last: dict[tuple[int, str], int] = {}
        acked: set[tuple[int, int]] = set()

        async def work(instance: Rheo, seed: int) -> None:
            r = random.Random(seed)
            while len(acked) < events:
                leases = await instance.fetch("s", "g", limit=r.randint(1, 6), lease_ms=30_000)
                for lease in leases:
                    where = (lease.partition, str(lease.event.key))
                    assert where not in held, f"{where} leased twice: {held[where]}, {lease}"
                    assert lease.sequence >= last.get(where, 0), "a key went backwards"
                    held[where] = lease.sequence
                    last[where] = lease.sequence
                await asyncio.sleep(r.random() / 200)
                for lease in leases:
                    del held[(lease.partition, str(lease.event.key))]
                    if r.random() < 0.1:
                        assert all(x.ok for x in await instance.nack(lease, "again"))
                    else:
                        assert all(x.ok for x in await instance.ack(lease))
                        acked.add((lease.partition, lease.sequence))
                if not leases:
                    await asyncio.sleep(0.005)

        async with asyncio.timeout(120):
            await asyncio.gather(*(work(instances[i % 3], i) for i in range(12)))
        assert sum((await first.frontier("s", "g")).values()) == events
        assert await first.dead_letters("s", "g") == []
    finally:
        for instance in instances:
            await instance.close()
