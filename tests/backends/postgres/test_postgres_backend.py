"""The PostgreSQL backend beyond the conformance kit: URLs and pools, migrations,
injection safety, the frontier under concurrent settles, error classification,
LISTEN/NOTIFY wake-ups, and racing appends. Every test works in its own schema,
dropped afterwards."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from rheo_flow import (
    ACK,
    BackendError,
    BackendUnavailable,
    InvalidArgument,
    Lease,
    NewEvent,
    Query,
    Retention,
    Rheo,
    SettleKind,
    consumer,
)
from rheo_flow._backends import postgres as pg
from rheo_flow._backends._urls import backend_from_url
from rheo_flow._backends.postgres._migrations import (
    BOOTSTRAP,
    MIGRATIONS,
    SCHEMA_VERSION,
    VERSION_TABLE,
)
from rheo_flow._backends.postgres._sql import render
from rheo_flow.backends import PostgresBackend

WaitUntil = Callable[..., Awaitable[None]]
"""The ``wait_until`` fixture of conftest.py."""


def _with_schema(url: str, schema: str, **options: str) -> str:
    query = "&".join(f"{k}={v}" for k, v in {"schema": schema, **options}.items())
    return f"{url}{'&' if '?' in url else '?'}{query}"


# The postgres_* fixtures of tests/conftest.py, under the short names these tests use.


@pytest.fixture
def schema(postgres_schema: str) -> str:
    """A schema name of this test only; dropped (with whatever it holds) afterwards."""
    return postgres_schema


@pytest.fixture
def url(postgres_schema_url: str) -> str:
    """The server URL with this test's schema."""
    return postgres_schema_url


@pytest.fixture
def rheo(postgres_rheo: Rheo) -> Rheo:
    """An opened instance owning its pool, on this test's schema."""
    return postgres_rheo


@pytest.fixture
def admin(postgres_admin: asyncpg.Connection) -> asyncpg.Connection:
    """A plain connection to look at what the backend stored."""
    return postgres_admin


# URLs and construction -------------------------------------------------------


def test_from_url_options() -> None:
    backend = PostgresBackend.from_url(
        "postgresql://u:secret@db.example:5433/app?schema=events&pool_max_size=4"
        "&pool_min_size=0&listen=off&migrate=false&sslmode=disable"
    )
    assert backend.schema == "events"
    assert (backend._pool_max, backend._pool_min) == (4, 0)
    assert (backend._listen, backend._migrate) == (False, False)
    # Options of the backend are taken out; the rest goes to asyncpg.
    assert backend._url == "postgresql://u:secret@db.example:5433/app?sslmode=disable"
    assert PostgresBackend.from_url("postgres://h/db").schema == pg.DEFAULT_SCHEMA
    assert isinstance(backend_from_url("postgresql://h/db"), PostgresBackend)
    caps = PostgresBackend.from_url("postgresql://h/db").capabilities.as_dict()
    for flag in ("durable", "distributed", "push_wakeups", "skip_locked", "server_clock"):
        assert caps[flag], flag
    assert not backend.capabilities.push_wakeups, "listen=off: idle consumers poll"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("postgresql://h/db?schema=a%22b", "invalid PostgreSQL schema name"),
        ("postgresql://h/db?schema=x;DROP%20TABLE%20t", "invalid PostgreSQL schema name"),
        ("postgresql://h/db?schema=" + "s" * 49, "invalid PostgreSQL schema name"),
        ("postgresql://h/db?schema=1abc", "invalid PostgreSQL schema name"),
        ("postgresql://h/db?schema=abc%0A", "invalid PostgreSQL schema name"),
        ("postgresql://h/db?pool_max_size=many", "pool_max_size must be an integer"),
        ("postgresql://h/db?pool_min_size=5&pool_max_size=2", "larger than pool_max_size"),
        ("postgresql://h/db?listen=maybe", "listen must be true or false"),
        ("mysql://h/db", "not a PostgreSQL URL"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        PostgresBackend.from_url(url)


def test_bad_construction() -> None:
    with pytest.raises(InvalidArgument, match="exactly one of pool= or url="):
        PostgresBackend()
    with pytest.raises(InvalidArgument, match="invalid PostgreSQL schema name"):
        PostgresBackend(url="postgresql://h/db", schema='x"; DROP SCHEMA public; --')
    with pytest.raises(InvalidArgument, match="pool_max_size"):
        PostgresBackend(url="postgresql://h/db", pool_max_size=0)


async def test_unreachable_server_is_unavailable_and_hides_the_password() -> None:
    # Port 1 on the loopback: nothing listens there.
    backend = PostgresBackend.from_url("postgresql://user:hunter2@127.0.0.1:1/db")
    with pytest.raises(BackendUnavailable) as caught:
        await backend.open()
    assert "hunter2" not in str(caught.value)
    assert "***" in str(caught.value)
    with pytest.raises(BackendUnavailable) as caught:
        await pg.migrate("postgresql://user:hunter2@127.0.0.1:1/db")
    assert "hunter2" not in str(caught.value)


# Host-owned pools ------------------------------------------------------------


async def test_host_pool_is_used_and_never_closed(postgres_url: str, schema: str,
                                                  wait_until: WaitUntil) -> None:
    pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=3)
    try:
        backend = PostgresBackend(pool=pool, schema=schema)
        async with Rheo(backend) as rheo:
            await rheo.create_stream("s")
            waiter = asyncio.create_task(rheo.wait_for_append("s", 10))
            # The LISTEN connection of a host pool is one held from it.
            await wait_until(lambda: backend._listener.connection is not None)
            await rheo.append("s", NewEvent("t"))
            assert await waiter
            [lease] = await rheo.fetch("s", "g")
            assert (await rheo.ack(lease))[0].ok
        assert not pool._closed
        assert await pool.fetchval("SELECT 1") == 1
        # Every connection came back: the held LISTEN connection too.
        await wait_until(lambda: pool.get_idle_size() == pool.get_size())
    finally:
        await pool.close()


# Migrations ------------------------------------------------------------------


async def test_concurrent_migrations_apply_once(postgres_url: str, schema: str,
                                                admin: asyncpg.Connection) -> None:
    conns = [await asyncpg.connect(postgres_url) for _ in range(4)]
    try:
        versions = await asyncio.gather(*(pg.migrate(c, schema) for c in conns),
                                        pg.migrate(_with_schema(postgres_url, schema)))
    finally:
        for c in conns:
            await c.close()
    assert versions == [SCHEMA_VERSION] * 5
    rows = await admin.fetch(f'SELECT version FROM "{schema}".{VERSION_TABLE}')
    assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
    # Several processes opening at once (each with its own pool) work too.
    backends = [PostgresBackend.from_url(_with_schema(postgres_url, schema)) for _ in range(3)]
    await asyncio.gather(*(b.open() for b in backends))
    for b in backends:
        await b.close()


RELEASES = Path(__file__).parent / "fixtures" / "postgres_releases"
"""The server-side functions as earlier releases defined them, per schema version."""
RELEASED_FUNCTIONS = {
    1: ("v1_advance_frontiers", "v1_fetch", "v1_settle", "v1_renew"),
    2: ("v2_fetch", "v2_settle", "v2_renew", "v2_advance_frontiers"),
    3: ("v3_fetch",),
    4: ("v4_settle",),
    5: ("v5_fetch_keyed", "v5_fetch"),
    6: ("v6_fetch_keyed", "v6_fetch", "v6_settle"),
    7: ("v7_advance_frontiers", "v7_fetch_keyed", "v7_fetch", "v7_settle", "v7_renew"),
    8: ("v8_advance_frontiers", "v8_fetch_by_key", "v8_fetch",
        "v8_settle_ranged", "v8_settle", "v8_renew", "v8_ack_fetch"),
    9: ("v9_states", "v9_advance_frontiers", "v9_fetch_keyed", "v9_fetch_by_key", "v9_fetch",
        "v9_settle_ranged", "v9_settle", "v9_renew", "v9_ack_fetch", "v9_ack_ranges"),
    10: ("v10_states", "v10_advance_frontiers", "v10_fetch_work", "v10_fetch_keyed",
         "v10_fetch_by_key", "v10_fetch", "v10_settle_ranged", "v10_settle", "v10_renew",
         "v10_ack_fetch", "v10_ack_ranges"),
}
OLD_VERSIONS = sorted(RELEASED_FUNCTIONS)
"""Every schema version before the current one: a database may be left at any of them."""
CURRENT_FUNCTIONS = {"ack_fetch", "ack_ranges", "ack_ranges_fetch", "advance_frontiers",
                     "append_guarded", "append_one",
                     "claim_cursors", "claim_fresh", "expire_spent", "fetch", "fetch_by_key",
                     "fetch_scan", "fetch_work", "lag_report",
                     "holding_locks",
                     "lease_of", "range_bits", "range_mask", "release_keys", "renew", "settle",
                     "settle_leased", "settle_misses", "settle_ranged", "split_scheduled",
                     # The named codes (functions/states.sql).
                     "delivery_available", "delivery_leased", "delivery_acked",
                     "delivery_rejected", "held", "op_renew", "op_ack", "op_nack", "op_reject",
                     "ordering_none", "ordering_by_key"}
"""The server-side functions the current version installs (functions/)."""


async def _as_released(admin: asyncpg.Connection, schema: str, version: int) -> None:
    """Leave ``schema`` as the release at schema ``version`` (1..10) left it: its tables
    (the migrations up to it) and the functions it defined, version by version."""
    for migration in MIGRATIONS[:version]:
        scripts = [*(BOOTSTRAP.statements if migration.version == 1 else ()),
                   *migration.statements,
                   *((RELEASES / f"{name}.sql").read_text()
                     for name in RELEASED_FUNCTIONS[migration.version])]
        for statement in scripts:
            await admin.execute(render(statement, schema))
        await admin.execute(f'INSERT INTO "{schema}".{VERSION_TABLE} (version, description) '
                            "VALUES ($1, 'old')", migration.version)


@pytest.mark.parametrize("version", OLD_VERSIONS)
async def test_an_older_schema_is_upgraded_in_place(url: str, schema: str, version: int,
                                                   admin: asyncpg.Connection) -> None:
    # A database left at an older version by an earlier release.
    await _as_released(admin, schema, version)
    with pytest.raises(BackendError, match=f"at version {version}"):
        await PostgresBackend.from_url(url + "&migrate=false").open()
    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        rows = await admin.fetch(f'SELECT version FROM "{schema}".{VERSION_TABLE} '
                                 "ORDER BY version")
        assert [r[0] for r in rows] == list(range(1, SCHEMA_VERSION + 1))
        await rheo.create_stream("s", partitions=2)
        await rheo.append("s", [NewEvent("t", {"i": i}) for i in range(6)])
        first = await rheo.fetch("s", "g", limit=3)
        assert all(r.ok for r in await rheo.nack(first, "again"))
        leases = await rheo.fetch("s", "g", limit=10)
        assert sorted(lease.event.data["i"] for lease in leases) == list(range(6))
        assert all(r.ok for r in await rheo.ack(leases))
        assert sum((await rheo.frontier("s", "g")).values()) == 6
        # Version 4: dead letters keep the last error (settle takes it).
        await rheo.append("s", [NewEvent("t", {"i": 6}, key="k")])
        [last] = await rheo.fetch("s", "g", limit=10)
        assert all(r.ok for r in await rheo.reject(last, "bad", error="KeyError: 'sku'"))
        [dead] = await rheo.dead_letters("s", "g")
        assert (dead.reason, dead.last_error) == ("bad", "KeyError: 'sku'")
        # Version 11: streams keep a retention policy.
        assert (await rheo.stream_info("s")).retention is None
        policy = Retention(max_age=timedelta(days=1), max_events=2)
        assert (await rheo.set_retention("s", policy)).retention == policy
        # The lag report function (functions/lag_report.sql) exists and answers, to
        # the backend and to the documented query of an external tool.
        await rheo.append("s", [NewEvent("t", {"i": i}, partition=0) for i in (7, 8)])
        assert await admin.fetchval(
            f"SELECT COALESCE(sum(lag), 0) FROM \"{schema}\".lag_report(ARRAY['s']) "
            "WHERE grp = 'g'") == 2
        [group] = (await rheo.lag_report(["s"])).groups
        assert (group.lag, group.dead_letters) == (2, 1)



_FUNCTION_DEFS = """
SELECT p.proname, pg_get_function_identity_arguments(p.oid),
       replace(replace(pg_get_functiondef(p.oid), $1, 'S'), $2, 'S')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $2 ORDER BY 1, 2
"""


@pytest.mark.parametrize("version", OLD_VERSIONS)
async def test_an_upgraded_schema_has_the_functions_of_a_fresh_one(
        postgres_url: str, url: str, schema: str, version: int,
        admin: asyncpg.Connection) -> None:
    await _as_released(admin, schema, version)
    await PostgresBackend.from_url(url).open()
    fresh = f"rheo_test_{uuid.uuid4().hex[:12]}"
    try:
        backend = PostgresBackend.from_url(_with_schema(postgres_url, fresh))
        await backend.open()
        await backend.close()
        upgraded = await admin.fetch(_FUNCTION_DEFS, f'"{schema}"', schema)
        expected = await admin.fetch(_FUNCTION_DEFS, f'"{fresh}"', fresh)
    finally:
        await admin.execute(f'DROP SCHEMA IF EXISTS "{fresh}" CASCADE')
    assert [tuple(r) for r in upgraded] == [tuple(r) for r in expected]
    assert {r[0] for r in expected} == CURRENT_FUNCTIONS
    assert len(expected) == len(CURRENT_FUNCTIONS), "one definition of each (no overloads)"


def test_every_older_version_has_its_released_functions() -> None:
    # A new schema version adds the functions it leaves behind as fixtures, so the
    # upgrades above start from every version a database may be at.
    assert list(range(1, SCHEMA_VERSION)) == OLD_VERSIONS


async def test_dead_letters_of_version_3_carry_over_without_an_error(
        url: str, schema: str, admin: asyncpg.Connection) -> None:
    await _as_released(admin, schema, 3)
    q = f'"{schema}"'
    stream_id = await admin.fetchval(
        f"INSERT INTO {q}.streams (name, partitions, created_at_ms) VALUES ('s', 1, 0) "
        "RETURNING id")
    await admin.execute(f"INSERT INTO {q}.partitions (stream_id, part, high_water) "
                        "VALUES ($1, 0, 2)", stream_id)
    await admin.execute(
        f"INSERT INTO {q}.events (stream_id, part, seq, appended_at_ms, event_id, type, data) "
        "SELECT $1, 0, i, 0, 'e' || i, 't', json_build_object('i', i) "
        "FROM generate_series(1, 2) i", stream_id)
    gid = await admin.fetchval(
        f"INSERT INTO {q}.groups (stream_id, name, max_attempts, created_at_ms) "
        "VALUES ($1, 'g', 2, 0) RETURNING id", stream_id)
    await admin.execute(f"INSERT INTO {q}.cursors VALUES ($1, 0, 0)", gid)
    await admin.execute(f"INSERT INTO {q}.frontiers VALUES ($1, 0, 0)", gid)
    old = await admin.fetch(f"SELECT * FROM {q}.fetch($1, '{{0}}', 2, 60000, 'c')", gid)
    # Version 3's settle (eight arguments): a reject and a nack.
    for op, row in ((3, old[0]), (2, old[1])):
        await admin.fetchrow(f"SELECT * FROM {q}.settle($1::smallint, $2, $3, $4, $5, $6, "
                             "'old', 0)", op, [gid], [0], [row[1]], [row[3]], [row[2]])

    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        [dead] = await rheo.dead_letters("s", "g")
        assert (dead.sequence, dead.reason, dead.last_error) == (1, "old", None)
        [again] = await rheo.fetch("s", "g")
        assert all(r.ok for r in await rheo.nack(again, "boom", error="OSError: disk"))
        assert [(d.sequence, d.reason, d.last_error) for d in await rheo.dead_letters("s", "g")
                ] == [(1, "old", None), (2, "max_attempts", "OSError: disk")]
        # A caller still passing eight arguments (the previous release) settles too.
        await rheo.redrive("s", "g")
        leases = await rheo.fetch("s", "g", limit=2)
        await admin.fetchrow(
            f"SELECT * FROM {q}.settle(1::smallint, $1, $2, $3, $4, $5, '', 0)",
            [gid] * 2, [0, 0], [x.sequence for x in leases],
            [uuid.UUID(x.lease_id) for x in leases], [x.attempt for x in leases])
        assert await rheo.frontier("s", "g") == {0: 2}


async def test_groups_of_version_10_are_not_paused_and_pause_after_the_upgrade(
        url: str, schema: str, admin: asyncpg.Connection) -> None:
    await _as_released(admin, schema, 10)
    q = f'"{schema}"'
    stream_id = await admin.fetchval(
        f"INSERT INTO {q}.streams (name, partitions, created_at_ms) VALUES ('s', 1, 0) "
        "RETURNING id")
    await admin.execute(f"INSERT INTO {q}.partitions (stream_id, part, high_water) "
                        "VALUES ($1, 0, 2)", stream_id)
    await admin.execute(
        f"INSERT INTO {q}.events (stream_id, part, seq, appended_at_ms, event_id, type, data) "
        "SELECT $1, 0, i, 0, 'e' || i, 't', json_build_object('i', i) "
        "FROM generate_series(1, 2) i", stream_id)
    gid = await admin.fetchval(
        f"INSERT INTO {q}.groups (stream_id, name, max_attempts, created_at_ms) "
        "VALUES ($1, 'g', 2, 0) RETURNING id", stream_id)
    await admin.execute(f"INSERT INTO {q}.cursors VALUES ($1, 0, 0)", gid)
    await admin.execute(f"INSERT INTO {q}.frontiers VALUES ($1, 0, 0)", gid)
    [held] = await admin.fetch(f"SELECT * FROM {q}.fetch($1, '{{0}}', 1, 60000, 'c')", gid)

    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        info = await rheo.group_info("s", "g")
        assert (info.paused, info.paused_until_ms) == (False, None)
        await rheo.pause_group("s", "g")
        assert await rheo.fetch("s", "g") == []
        # The lease a fetch of version 10 took still settles while the group is paused.
        await admin.fetchrow(f"SELECT * FROM {q}.settle(1::smallint, $1, $2, $3, $4, $5, "
                             "'', 0)", [gid], [0], [held[1]], [held[3]], [held[2]])
        assert await rheo.frontier("s", "g") == {0: 1}
        await rheo.resume_group("s", "g")
        assert [x.sequence for x in await rheo.fetch("s", "g")] == [2]


async def test_state_written_at_version_2_carries_over_the_upgrade(
        url: str, schema: str, admin: asyncpg.Connection) -> None:
    # Version 2 as an earlier release left it: events appended, a group with
    # leases handed out by version 2's fetch and one of them acked.
    await _as_released(admin, schema, 2)
    q = f'"{schema}"'
    ids = [str(uuid.uuid4()) for _ in range(3)] + ["order-7", "Zürich", "a b"]
    stream_id = await admin.fetchval(
        f"INSERT INTO {q}.streams (name, partitions, created_at_ms) VALUES ('s', 1, 0) "
        "RETURNING id")
    await admin.execute(f"INSERT INTO {q}.partitions (stream_id, part, high_water) "
                        "VALUES ($1, 0, 6)", stream_id)
    await admin.execute(
        f"INSERT INTO {q}.events (stream_id, part, seq, appended_at_ms, event_id, type, data) "
        "SELECT $1, 0, i, 0, ($2::text[])[i], 't', json_build_object('i', i) "
        "FROM generate_series(1, 6) i", stream_id, ids)
    gid = await admin.fetchval(
        f"INSERT INTO {q}.groups (stream_id, name, max_attempts, created_at_ms) "
        "VALUES ($1, 'g', 5, 0) RETURNING id", stream_id)
    await admin.execute(f"INSERT INTO {q}.cursors VALUES ($1, 0, 0)", gid)
    await admin.execute(f"INSERT INTO {q}.frontiers VALUES ($1, 0, 0)", gid)
    old = await admin.fetch(f"SELECT * FROM {q}.fetch($1, '{{0}}', 4, 60000, 'c')", gid)
    assert [r[1] for r in old] == [1, 2, 3, 4]

    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        assert await admin.fetchval(f"SELECT max(version) FROM {q}.{VERSION_TABLE}") == (
            SCHEMA_VERSION)
        # Leases of version 2 settle under the new functions, fenced as before.
        events = (await rheo.query_page(Query(stream="s"), limit=10)).events
        leases = [Lease(r[3].hex, f"0-{r[1]}-{r[2]}", "g", "c", events[r[1] - 1], r[2], r[4])
                  for r in old]
        forged = dataclasses.replace(leases[0], lease_id=uuid.uuid4().hex)
        results = await rheo.ack([forged, *leases[:3]])
        assert results[0].kind is SettleKind.STALE_LEASE
        assert all(r.ok and not r.repeated for r in results[1:])
        assert (await rheo.ack(leases[:1]))[0].repeated
        assert await rheo.frontier("s", "g") == {0: 3}
        # Appends stay idempotent by id across the upgrade.
        again = await rheo.append("s", [NewEvent("t", {"x": 1}, id=i) for i in ids])
        assert [e.sequence for e in again] == [1, 2, 3, 4, 5, 6]
        fresh = await rheo.append("s", [NewEvent("t", {"i": 7}, id="order-8")])
        assert fresh[0].sequence == 7
        rest = await rheo.fetch("s", "g", limit=10)
        assert [lease.event.id for lease in rest] == [*ids[4:], "order-8"]
        assert all(r.ok for r in await rheo.ack([*rest, leases[3]]))
        assert await rheo.frontier("s", "g") == {0: 7}


async def test_retries_and_leases_of_version_9_carry_over_the_upgrade(
        url: str, schema: str, admin: asyncpg.Connection) -> None:
    # Version 9 as released left it: an unordered group's leases (ranges) from its
    # fetch, some of them nacked by its settle into delivery rows (one due at once,
    # three delayed for an hour), and a key-ordered group's leases (delivery rows),
    # one of them expired. Version 10 indexes those rows anew (deliveries_due,
    # deliveries_expiry) in place of the indexes it drops.
    await _as_released(admin, schema, 9)
    q = f'"{schema}"'
    stream_id = await admin.fetchval(
        f"INSERT INTO {q}.streams (name, partitions, created_at_ms) VALUES ('s', 2, 0) "
        "RETURNING id")
    await admin.execute(f"INSERT INTO {q}.partitions (stream_id, part, high_water) "
                        "VALUES ($1, 0, 4), ($1, 1, 4)", stream_id)
    await admin.execute(
        f"INSERT INTO {q}.events (stream_id, part, seq, appended_at_ms, event_id, type, key, "
        "data) SELECT $1, i % 2, i / 2 + 1, 0, 'e' || i, 't', 'k' || i, "
        "json_build_object('i', i) FROM generate_series(0, 7) i", stream_id)
    gids = {}
    for name, ordering in (("g", 0), ("k", 1)):
        gids[name] = await admin.fetchval(
            f"INSERT INTO {q}.groups (stream_id, name, max_attempts, created_at_ms, ordering) "
            "VALUES ($1, $2, 5, 0, $3) RETURNING id", stream_id, name, ordering)
        await admin.execute(f"INSERT INTO {q}.cursors SELECT $1, p, 0 FROM generate_series(0, 1) p",
                            gids[name])
        await admin.execute(f"INSERT INTO {q}.frontiers SELECT $1, p, 0 "
                            "FROM generate_series(0, 1) p", gids[name])
    old = {name: await admin.fetch(f"SELECT * FROM {q}.fetch($1, '{{0,1}}', 8, 3600000, 'c')",
                                   gid) for name, gid in gids.items()}
    assert len(old["g"]) == len(old["k"]) == 8
    nacks = {0: old["g"][:1], 3_600_000: old["g"][1:4]}
    for delay, rows in nacks.items():
        await admin.fetchrow(f"SELECT * FROM {q}.settle(2::smallint, $1, $2, $3, $4, $5, "
                             "'again', $6)", [gids["g"]] * len(rows), [r[0] for r in rows],
                             [r[1] for r in rows], [r[3] for r in rows], [r[2] for r in rows],
                             delay)
    expired = old["k"][0]
    await admin.execute(f"UPDATE {q}.deliveries SET deadline_ms = 0 WHERE group_id = $1 "
                        "AND part = $2 AND seq = $3", gids["k"], expired[0], expired[1])

    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        indexes = {r[0] for r in await admin.fetch(
            "SELECT indexname FROM pg_indexes WHERE schemaname = $1", schema)}
        assert {"deliveries_due", "deliveries_expiry"} <= indexes
        assert not {"deliveries_available", "deliveries_leased", "deliveries_ready"} & indexes
        # The retry due at once comes back; the delayed ones and the leases held do not.
        [again] = await rheo.fetch("s", "g", limit=10)
        assert (again.partition, again.sequence, again.attempt) == (*old["g"][0][:2], 2)
        # The expired lease of the key-ordered group is leased again, alone.
        [relet] = await rheo.fetch("s", "k", limit=10)
        assert (relet.partition, relet.sequence, relet.attempt) == (*expired[:2], 2)
        # The leases of version 9 still held settle as before.
        events = {(e.partition, e.sequence): e
                  for e in (await rheo.query_page(Query(stream="s"), limit=10)).events}
        held = [Lease(r[3].hex, f"{r[0]}-{r[1]}-{r[2]}", group, "c", events[r[0], r[1]], r[2],
                      r[4]) for group, rows in (("g", old["g"][4:]), ("k", old["k"][1:]))
                for r in rows]
        assert all(r.ok and not r.repeated for r in await rheo.ack([again, relet, *held]))
        assert await rheo.frontier("s", "k") == {0: 4, 1: 4}
        # Sequences 1 and 2 of partition 1 and 2 of partition 0 wait for an hour.
        assert await rheo.frontier("s", "g") == {0: 1, 1: 0}


async def test_migrate_false_refuses_a_missing_schema(url: str) -> None:
    backend = PostgresBackend.from_url(url + "&migrate=false")
    with pytest.raises(BackendError, match="rheo-flow migrate"):
        await backend.open()
    await pg.migrate(url)
    await backend.open()
    await backend.close()


async def test_a_newer_schema_is_refused(url: str, schema: str,
                                         admin: asyncpg.Connection) -> None:
    await pg.migrate(url)
    await admin.execute(f'INSERT INTO "{schema}".{VERSION_TABLE} (version, description) '
                        "VALUES ($1, 'from the future')", SCHEMA_VERSION + 1)
    with pytest.raises(BackendError, match="newer than this rheo-flow supports"):
        await PostgresBackend.from_url(url).open()
    with pytest.raises(BackendError, match="newer"):
        await pg.migrate(url)


async def _refused_without(url: str, admin: asyncpg.Connection, drop: str) -> None:
    """Migrate, run ``drop`` (a function of the current version), and check that opening
    without migrate refuses the schema."""
    await pg.migrate(url)
    await admin.execute(drop)
    with pytest.raises(BackendError, match="lacks this rheo-flow's functions"):
        await PostgresBackend.from_url(url + "&migrate=false").open()


async def test_a_current_schema_without_the_named_codes_gets_them(
        url: str, schema: str, admin: asyncpg.Connection) -> None:
    """A schema at the current version made before functions/states.sql (while the
    version was unreleased) is refused without migrate and completed with it."""
    await _refused_without(url, admin, f'DROP FUNCTION "{schema}".held() CASCADE')
    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        await rheo.create_stream("s", partitions=1)
        await rheo.append("s", [NewEvent("t", {})])
        [lease] = await rheo.fetch("s", "g", consumer_id="c", limit=5)
        assert (await rheo.ack([lease]))[0].ok
    assert await admin.fetchval(f"SELECT \"{schema}\".held()") == 2**63 - 1


async def test_a_current_schema_without_the_lag_report_function_gets_it(
        url: str, schema: str, admin: asyncpg.Connection) -> None:
    """A schema at the current version made before functions/lag_report.sql (while the
    version was unreleased) is refused without migrate and completed with it."""
    await _refused_without(url, admin, f'DROP FUNCTION "{schema}".lag_report(text[])')
    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        await rheo.create_stream("s", partitions=1)
        await rheo.create_group("s", "g")
        await rheo.append("s", [NewEvent("t", {})])
        assert [g.lag for g in (await rheo.lag_report()).groups] == [1]
    assert await admin.fetchval(f'SELECT sum(lag) FROM "{schema}".lag_report()') == 1


async def test_a_current_schema_without_claim_fresh_gets_it(
        url: str, schema: str, admin: asyncpg.Connection) -> None:
    """A schema at the current version made before fetch's common case
    (functions/fetch_work.sql, claim_fresh) was added while the version was unreleased
    is refused without migrate, and completed with it: its fetch, which calls
    claim_fresh, works again."""
    await _refused_without(
        url, admin, f'DROP FUNCTION "{schema}".claim_fresh(integer, integer, integer[], bigint)')
    async with Rheo(PostgresBackend.from_url(url)) as rheo:
        await rheo.create_stream("s", partitions=2)
        await rheo.append("s", [NewEvent("t", {"i": i}, partition=i % 2) for i in range(4)])
        leases = await rheo.fetch("s", "g", consumer_id="c", limit=10)
        assert sorted((x.partition, x.sequence) for x in leases) == [
            (p, q) for p in (0, 1) for q in (1, 2)]
        assert all(r.ok for r in await rheo.ack(leases))
    assert await admin.fetchval(
        "SELECT to_regprocedure($1) IS NOT NULL",
        f'"{schema}".claim_fresh(integer, integer, integer[], bigint)')


async def test_migrate_rejects_bad_targets() -> None:
    with pytest.raises(InvalidArgument, match="needs a postgresql:// URL"):
        await pg.migrate(42)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="invalid PostgreSQL schema name"):
        await pg.migrate("postgresql://h/db?schema=bad-name")


# Names never reach SQL text ----------------------------------------------------


async def test_names_are_bound_parameters(rheo: Rheo, schema: str,
                                          admin: asyncpg.Connection) -> None:
    backend = rheo.backend
    # The facade refuses such names; the backend itself binds whatever it gets.
    hostile = "x'); DROP TABLE deliveries; --"
    await backend.create_stream(hostile, 1)
    assert hostile in await backend.list_streams()
    await backend.create_group(hostile, hostile, "earliest", None)
    assert [g.group for g in await backend.list_groups(hostile)] == [hostile]
    tables = {r[0] for r in await admin.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = $1", schema)}
    assert {"deliveries", "events", "streams", "groups"} <= tables
    with pytest.raises(InvalidArgument):
        await rheo.create_stream("bad'name")


async def test_nul_in_keys_is_a_clear_error(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    with pytest.raises(InvalidArgument, match="NUL"):
        await rheo.append("s", NewEvent("t", key="a\x00b"))
    assert (await rheo.stream_info("s")).high_water == {0: 0}


async def test_awkward_text_round_trips_exactly(rheo: Rheo) -> None:
    # Ids, types and keys travel to the server as JSON arrays and data as one
    # JSON array of the events' texts: every character must come back as sent.
    await rheo.create_stream("s", partitions=3)
    odd = ['q"uote', "back\\slash", "tab\tnew\nline", "\x01\x1f", "Zürich ✓ 😀", "[1]", "{}",
           "null", "'", "\u2028"]
    events = [NewEvent(f"type {o}", {"v": o, "n": [1.5, None, True], o: {"x": o}}, id=f"id {o}",
                       key=o, headers={"h": o} if i % 2 else {})
              for i, o in enumerate(odd)]
    stored = await rheo.append("s", events)
    leases = await rheo.fetch("s", "g", limit=len(odd))
    for got in ([lease.event for lease in leases], stored):
        by_id = {e.id: e for e in got}
        for i, o in enumerate(odd):
            e = by_id[f"id {o}"]
            assert (e.type, e.key, e.data) == (f"type {o}", o,
                                               {"v": o, "n": [1.5, None, True], o: {"x": o}})
            assert e.headers == ({"h": o} if i % 2 else {})
    again = await rheo.append("s", events)
    assert [e.sequence for e in again] == [e.sequence for e in stored]
    await rheo.create_stream("one")
    with pytest.raises(InvalidArgument, match="valid Unicode"):
        await rheo.append("one", NewEvent("t", id="lone \ud800 surrogate"))


# Settles: batches, duplicates, the frontier ------------------------------------


async def test_duplicate_lease_in_one_batch(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(2)])
    first, second = await rheo.fetch("s", "g")
    results = await rheo.ack([first, second, first])
    assert [(r.ok, r.repeated) for r in results] == [(True, False), (True, False),
                                                     (True, True)]
    forged = dataclasses.replace(second, receipt="nonsense")
    results = await rheo.nack([forged, forged], "r")
    assert [r.kind for r in results] == [SettleKind.RECEIPT_MISMATCH] * 2
    renewed = await rheo.renew([first, first])
    assert [r.kind for r in renewed] == [SettleKind.STALE_LEASE] * 2


@pytest.mark.parametrize("odd", ["receipt", "lease_id", "attempt", "group", "partition"])
async def test_one_odd_lease_spoils_nothing_else_in_its_batch(rheo: Rheo, odd: str) -> None:
    # A batch as fetch returned it is checked in one pass; one lease that does
    # not fit (bad receipt or id, another group, a partition the stream lacks)
    # gets its own answer and the rest still take effect.
    await rheo.create_stream("s", partitions=2)
    await rheo.create_group("s", "other")
    await rheo.append("s", [NewEvent("t", key=str(i)) for i in range(6)])
    leases = await rheo.fetch("s", "g", limit=6)
    victim = leases[3]
    changed: Any
    if odd == "partition":
        event = dataclasses.replace(victim.event, partition=7)
        changed = dataclasses.replace(victim, event=event)
    else:
        value: Any = {"receipt": "0-1-1x", "lease_id": "G" * 32, "attempt": 2,
                      "group": "other"}[odd]
        changed = dataclasses.replace(victim, **{odd: value})
    batch = [*leases[:3], changed, *leases[4:]]
    results = await rheo.ack(batch)
    if odd == "attempt":  # the receipt decides, and it names the lease's attempt
        assert [(r.ok, r.repeated) for r in results] == [(True, False)] * 6
    else:
        assert [r.ok for r in results] == [True, True, True, False, True, True]
        assert (await rheo.ack([victim]))[0].ok
    assert all(r.repeated for r in await rheo.ack(leases))


async def test_ack_in_transaction_commits_with_the_callers_writes(
        rheo: Rheo, postgres_url: str, schema: str, admin: asyncpg.Connection) -> None:
    backend = rheo.backend
    assert isinstance(backend, PostgresBackend)
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(3)])
    leases = await rheo.fetch("s", "g", limit=3)
    await admin.execute(f'CREATE TABLE "{schema}".sink (n int)')
    conn = await asyncpg.connect(postgres_url)
    try:
        with pytest.raises(InvalidArgument, match="inside a transaction"):
            await backend.ack_in_transaction(conn, leases)
        tx = conn.transaction()
        await tx.start()
        await conn.execute(f'INSERT INTO "{schema}".sink VALUES (0)')
        results = await backend.ack_in_transaction(conn, leases[:1])
        assert results[0].ok
        await tx.rollback()
        assert await rheo.frontier("s", "g") == {0: 0}, "the ack rolled back with the insert"
        async with conn.transaction():
            await conn.execute(f'INSERT INTO "{schema}".sink VALUES (1), (2)')
            results = await backend.ack_in_transaction(conn, leases)
        assert [r.ok for r in results] == [True] * 3
    finally:
        await conn.close()
    assert await rheo.frontier("s", "g") == {0: 3}
    assert await admin.fetchval(f'SELECT count(*) FROM "{schema}".sink') == 2
    assert [r.repeated for r in await rheo.ack(leases)] == [True] * 3


async def test_frontier_with_holes(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(5)])
    leases = await rheo.fetch("s", "g", limit=5)
    await rheo.ack([leases[0], leases[2], leases[3]])
    assert await rheo.frontier("s", "g") == {0: 1}
    await rheo.reject([leases[1]], "bad")
    assert await rheo.frontier("s", "g") == {0: 4}
    await rheo.redrive("s", "g")
    assert await rheo.frontier("s", "g") == {0: 1}
    [again] = await rheo.fetch("s", "g")
    assert (again.sequence, again.attempt) == (2, 1)
    await rheo.ack([again, leases[4]])
    assert await rheo.frontier("s", "g") == {0: 5}


async def test_frontier_after_batches_with_runs_gaps_and_nacks(rheo: Rheo) -> None:
    # One settle batch moves each partition's frontier over its own run and
    # over sequences settled earlier past a gap; nacks leave it where it is.
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", key=str(i)) for i in range(40)])
    leases = await rheo.fetch("s", "g", limit=40)
    by = {p: sorted((lease for lease in leases if lease.partition == p),
                    key=lambda lease: lease.sequence) for p in (0, 1)}
    assert all(len(ls) >= 6 for ls in by.values())
    batch = [lease for ls in by.values() for lease in (ls[0], ls[1], ls[3], ls[5])]
    random.Random(7).shuffle(batch)
    assert all(r.ok for r in await rheo.ack(batch))
    assert await rheo.frontier("s", "g") == {0: 2, 1: 2}
    assert all(r.ok for r in await rheo.nack([by[0][2], by[1][2]], "again"))
    assert await rheo.frontier("s", "g") == {0: 2, 1: 2}
    again = await rheo.fetch("s", "g", limit=10)
    assert sorted((lease.sequence, lease.attempt) for lease in again) == [(3, 2), (3, 2)]
    assert all(r.ok for r in await rheo.ack([*again, by[0][4], by[1][4], by[1][6]]))
    assert await rheo.frontier("s", "g") == {0: 6, 1: 7}
    assert all(r.repeated for r in await rheo.ack(batch))


async def test_lease_ids_are_unique_and_leases_come_round_robin(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=3)
    await rheo.append("s", [NewEvent("t", partition=i % 3) for i in range(600)])
    first = await rheo.fetch("s", "g", limit=250)  # new deliveries only
    assert all(r.ok for r in await rheo.nack(first[:40], "again"))
    mixed = await rheo.fetch("s", "g", limit=250)  # re-leases and new deliveries
    ids = [lease.lease_id for lease in first + mixed]
    assert len(set(ids)) == len(ids) == 500
    assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in ids)
    for batch in (first, mixed):
        # In sequence order within each partition, the partitions taking turns.
        for part in range(3):
            seqs = [lease.sequence for lease in batch if lease.partition == part]
            assert seqs == sorted(seqs)
        depths = [sum(1 for x in batch[:i] if x.partition == lease.partition)
                  for i, lease in enumerate(batch)]
        assert depths == sorted(depths)
    assert sum(lease.attempt == 2 for lease in mixed) == 40


async def test_lease_changes_commit_synchronously(rheo: Rheo, schema: str,
                                                  admin: asyncpg.Connection) -> None:
    # A lease change must be on disk when the call returns (a crash must not undo
    # a re-lease and let the superseded holder's ack through): no function may
    # switch its transaction to asynchronous commit. Each runs here inside an
    # open transaction, where such a switch would still show.
    await rheo.create_stream("s")
    await rheo.create_group("s", "g")
    await rheo.append("s", [NewEvent("t") for _ in range(4)])
    backend = rheo.backend
    assert isinstance(backend, PostgresBackend)
    gid = await admin.fetchval(f'SELECT id FROM "{schema}".groups')
    sql = backend._sql
    for fresh in (True, False):  # new deliveries, then expired ones leased again
        async with admin.transaction():
            rows = await admin.fetch(sql.fetch, gid, [0], 4, 60_000, "c")
            assert [r[2] for r in rows] == [1 if fresh else 2] * 4
            assert await admin.fetchval("SHOW synchronous_commit") == "on"
        for table in ("deliveries", "ranges"):
            await admin.execute(f'UPDATE "{schema}".{table} SET deadline_ms = 0')
    leases = await rheo.fetch("s", "g", limit=4)
    assert [lease.attempt for lease in leases] == [3, 3, 3, 3]
    batch = await backend._batch(leases)
    async with admin.transaction():
        await admin.fetchrow(sql.renew, *batch.args, 60_000)
        assert await admin.fetchval("SHOW synchronous_commit") == "on"
        await admin.fetchrow(sql.settle, 2, *batch.args, "again", 0, None)
        assert await admin.fetchval("SHOW synchronous_commit") == "on"
    # Nor is it set for a function as a whole.
    configs = await admin.fetch(
        "SELECT p.proname, p.proconfig, p.prosrc FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = $1", schema)
    assert {r[0] for r in configs} >= {"fetch", "settle", "renew", "advance_frontiers"}
    for name, config, source in configs:
        assert not any("synchronous_commit" in c for c in config or ()), name
        assert "synchronous_commit" not in source, name


@pytest.mark.parametrize("op", ["ack", "renew"])
@pytest.mark.parametrize("table", ["ranges", "deliveries"])
async def test_a_settle_waiting_on_a_concurrent_update_applies_to_the_new_row_version(
        rheo: Rheo, schema: str, postgres_url: str, admin: asyncpg.Connection,
        wait_until: WaitUntil, op: str, table: str) -> None:
    # Settles lock their rows first and then update them: the row version they
    # update must be the one they waited for, not a stale one. An unordered group
    # holds its leases in a range row, a key-ordered one in a delivery row each.
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", ordering="key" if table == "deliveries" else "none")
    await rheo.append("s", [NewEvent("t") for _ in range(3)])
    leases = await rheo.fetch("s", "g", limit=3)
    other = await asyncpg.connect(postgres_url)
    try:
        tx = other.transaction()
        await tx.start()
        # Another transaction moves the rows to new versions and holds them.
        await other.execute(f'UPDATE "{schema}".{table} SET deadline_ms = deadline_ms + 1')
        settling = asyncio.create_task(
            rheo.ack(leases) if op == "ack" else rheo.renew(leases, lease_ms=60_000))
        await wait_until(lambda: admin.fetchval(
            "SELECT count(*) > 0 FROM pg_locks WHERE NOT granted"))
        await tx.commit()
        results = await asyncio.wait_for(settling, 10)
    finally:
        await other.close()
    assert all(r.ok and not r.repeated for r in results)
    if table == "deliveries":
        rows = await admin.fetch(
            f'SELECT state, deadline_ms FROM "{schema}".deliveries ORDER BY seq')
        states, deadlines = [r[0] for r in rows], [r[1] for r in rows]
        acked = states == [2, 2, 2]
    else:
        [row] = await admin.fetch(f'SELECT pending, deadline_ms FROM "{schema}".ranges')
        deadlines = [row[1]] * 3
        acked = row[0] == 0
    if op == "ack":
        assert acked
        assert await rheo.frontier("s", "g") == {0: 3}
    else:
        assert deadlines == [r.deadline_ms for r in results]


async def test_frontier_under_concurrent_settles(rheo: Rheo) -> None:
    """Racing ack batches (on several pool connections) never strand the frontier."""
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(2_000)])
    leases = await rheo.fetch("s", "g", limit=2_000)
    assert len(leases) == 2_000
    random.Random(7).shuffle(leases)
    batches = [leases[i:i + 37] for i in range(0, len(leases), 37)]
    results = await asyncio.gather(*(rheo.ack(b) for b in batches))
    assert all(r.ok and not r.repeated for batch in results for r in batch)
    assert await rheo.frontier("s", "g") == await rheo.high_water("s")


async def test_concurrent_fetches_claim_disjoint_sets(url: str) -> None:
    async with Rheo(url) as a, Rheo(url) as b:
        await a.create_stream("s", partitions=3)
        await a.append("s", [NewEvent("t", {"n": i}) for i in range(900)])
        await a.create_group("s", "g")
        batches = await asyncio.gather(*(
            (a if i % 2 else b).fetch("s", "g", limit=100, consumer_id=f"c{i}")
            for i in range(12)))
        claimed = [(x.partition, x.sequence) for batch in batches for x in batch]
        assert len(claimed) == len(set(claimed)), "no delivery leased twice"
        # A fetch that found every cursor busy waits for one of them only, so the
        # racing calls need not have claimed everything: the rest is still there.
        while rest := await a.fetch("s", "g", limit=100):
            batches.append(rest)
            claimed += [(x.partition, x.sequence) for x in rest]
        assert len(claimed) == len(set(claimed)) == 900
        for batch in batches:
            by_partition: dict[int, list[int]] = {}
            for lease in batch:
                by_partition.setdefault(lease.partition, []).append(lease.sequence)
            assert all(seqs == sorted(seqs) for seqs in by_partition.values())


async def test_deadlines_use_the_server_clock(rheo: Rheo, admin: asyncpg.Connection) -> None:
    now = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    await rheo.create_stream("s")
    before = await admin.fetchval(now)
    await rheo.append("s", NewEvent("t"))
    [lease] = await rheo.fetch("s", "g", lease_ms=60_000)
    after = await admin.fetchval(now)
    assert before + 60_000 <= lease.deadline_ms <= after + 60_000
    assert before <= lease.event.appended_at_ms <= after


# Appends -----------------------------------------------------------------------


async def test_racing_appends_of_the_same_ids(url: str) -> None:
    async with Rheo(url) as a, Rheo(url) as b:
        await a.create_stream("s", partitions=2)
        batches = [[NewEvent("t", {"n": i}, id=f"id-{i}") for i in range(j, j + 60)]
                   for j in range(0, 300, 30)]
        outs = await asyncio.gather(*((a if i % 2 else b).append("s", batch)
                                      for i, batch in enumerate(batches)))
        stored: dict[str, tuple[int, int]] = {}
        for events in outs:
            for event in events:
                position = (event.partition, event.sequence)
                assert stored.setdefault(event.id, position) == position
        assert len(stored) == 330
        high = await a.high_water("s")
        assert sum(high.values()) == 330
        for part, top in high.items():
            seqs = sorted(s for p, s in stored.values() if p == part)
            assert seqs == list(range(1, top + 1)), "gapless sequences"


async def test_one_notification_per_append(rheo: Rheo, postgres_url: str, schema: str,
                                           wait_until: WaitUntil) -> None:
    await rheo.create_stream("s")
    listener = await asyncpg.connect(postgres_url)
    got: list[str] = []
    try:
        await listener.add_listener(f"rheo_flow.{schema}", lambda *a: got.append(a[3]))
        await rheo.append("s", [NewEvent("t") for _ in range(100)])
        await rheo.append("s", [NewEvent("t") for _ in range(3)])
        await wait_until(lambda: len(got) >= 2)
        await listener.execute("SELECT 1")  # anything else in flight arrives before this
    finally:
        await listener.close()
    assert got == ["s", "s"]


# Wake-ups ----------------------------------------------------------------------


async def test_wait_for_append_is_woken_by_another_process_append(url: str,
                                                                  wait_until: WaitUntil
                                                                  ) -> None:
    async with Rheo(url) as waiter_side, Rheo(url) as appender:
        await appender.create_stream("s")
        await appender.create_stream("other")
        assert not await waiter_side.wait_for_append("s", 0.05)
        backend = waiter_side.backend
        assert isinstance(backend, PostgresBackend)
        waiter = asyncio.create_task(waiter_side.wait_for_append("s", 30))
        await wait_until(lambda: "s" in backend._listener.waiters)
        await appender.append("other", NewEvent("t"))  # another stream does not wake it
        await appender.append("s", NewEvent("t"))
        assert await waiter, "woken by the append (not timed out)"


async def test_an_append_between_fetch_and_wait_is_not_lost(url: str,
                                                            wait_until: WaitUntil) -> None:
    async with Rheo(url) as consumer_side, Rheo(url) as appender:
        await appender.create_stream("s")
        backend = consumer_side.backend
        assert isinstance(backend, PostgresBackend)
        assert not await consumer_side.wait_for_append("s", 0.01)  # starts LISTEN
        assert await consumer_side.fetch("s", "g") == []
        # The append lands after that fetch looked, before anyone waits.
        await appender.append("s", NewEvent("t"))
        await wait_until(lambda: backend._listener.notes.get("s", 0) >= 1)
        # Nothing else will be appended: only the missed notification can end this wait.
        assert await consumer_side.wait_for_append("s", 30)
        assert len(await consumer_side.fetch("s", "g")) == 1
        # Seen once: the next wait waits again.
        assert not await consumer_side.wait_for_append("s", 0.05)


async def test_consumer_is_woken_by_notify_not_by_polling(rheo: Rheo,
                                                          wait_until: WaitUntil) -> None:
    await rheo.create_stream("s")
    seen: list[int] = []

    @consumer(stream="s", group="g", poll_ms=3_600_000)
    async def record(event: Any, context: Any) -> Any:
        seen.append(event.data["n"])
        return ACK

    async with record.start(rheo) as group:
        backend = rheo.backend
        assert isinstance(backend, PostgresBackend)
        await wait_until(lambda: "s" in backend._listener.waiters)  # idle, waiting an hour
        await rheo.append("s", NewEvent("t", {"n": 1}))
        await wait_until(lambda: seen == [1], timeout=10)
        await wait_until(lambda: group.stats.acked == 1)


async def test_without_listen_it_polls(url: str) -> None:
    async with Rheo(url + "&listen=false") as rheo:
        await rheo.create_stream("s")
        started = time.monotonic()
        assert await rheo.wait_for_append("s", 0.05) is False
        assert time.monotonic() - started >= 0.04, "it slept for the timeout"
        backend = rheo.backend
        assert isinstance(backend, PostgresBackend)
        assert backend._listener.connection is None


async def test_a_lost_listen_connection_wakes_waiters_and_reconnects(
        rheo: Rheo, admin: asyncpg.Connection, wait_until: WaitUntil) -> None:
    await rheo.create_stream("s")
    backend = rheo.backend
    assert isinstance(backend, PostgresBackend)
    listener = backend._listener

    def listening() -> bool:
        return listener.connection is not None and "s" in listener.waiters

    waiter = asyncio.create_task(rheo.wait_for_append("s", 30))
    await wait_until(listening)
    pid = listener.connection.get_server_pid()  # type: ignore[union-attr]
    await admin.execute("SELECT pg_terminate_backend($1)", pid)
    assert await asyncio.wait_for(waiter, 10), "waiters wake up to fetch at once"
    # The next wait reconnects and is woken by appends again.
    again = asyncio.create_task(rheo.wait_for_append("s", 30))
    await wait_until(listening)
    await rheo.append("s", NewEvent("t"))
    assert await asyncio.wait_for(again, 10)


# Error classification -----------------------------------------------------------


def _pg_error(cls: type[Exception]) -> Exception:
    return cls("simulated")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_pg_error(asyncpg.exceptions.SerializationError), SettleKind.FAILED),
        (_pg_error(asyncpg.exceptions.DeadlockDetectedError), SettleKind.FAILED),
        (_pg_error(asyncpg.exceptions.UniqueViolationError), SettleKind.FAILED),
        (_pg_error(asyncpg.exceptions.CheckViolationError), SettleKind.FAILED),
        (_pg_error(asyncpg.exceptions.QueryCanceledError), SettleKind.FAILED),
        (_pg_error(asyncpg.exceptions.ConnectionDoesNotExistError), SettleKind.AMBIGUOUS),
        (_pg_error(asyncpg.exceptions.ConnectionFailureError), SettleKind.AMBIGUOUS),
        (_pg_error(asyncpg.exceptions.AdminShutdownError), SettleKind.AMBIGUOUS),
        (_pg_error(asyncpg.exceptions.CannotConnectNowError), SettleKind.BACKEND_UNAVAILABLE),
        (_pg_error(asyncpg.exceptions.TooManyConnectionsError),
         SettleKind.BACKEND_UNAVAILABLE),
        (_pg_error(asyncpg.exceptions.InvalidPasswordError), SettleKind.BACKEND_UNAVAILABLE),
        (asyncpg.exceptions.InterfaceError("pool is closed"), SettleKind.BACKEND_UNAVAILABLE),
        (asyncpg.exceptions.InterfaceError("cannot call Connection.fetch(): connection is "
                                           "closed"), SettleKind.BACKEND_UNAVAILABLE),
        (ConnectionRefusedError(111, "refused"), SettleKind.BACKEND_UNAVAILABLE),
        (ConnectionResetError(104, "reset"), SettleKind.AMBIGUOUS),
        (TimeoutError(), SettleKind.AMBIGUOUS),
        (OSError(113, "no route"), SettleKind.BACKEND_UNAVAILABLE),
    ],
)
def test_classify_error(exc: BaseException, kind: SettleKind) -> None:
    backend = PostgresBackend.from_url("postgresql://h/db")
    assert backend.classify_error(exc) == kind
    assert backend.classify_error(ValueError("not a driver error")) is None


async def test_settles_on_a_closed_pool_are_backend_unavailable(url: str) -> None:
    rheo = await Rheo(url).open()
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    [lease] = await rheo.fetch("s", "g")
    backend = rheo.backend
    assert isinstance(backend, PostgresBackend)
    assert backend._pool is not None
    await backend._pool.close()  # the pool goes away under the backend
    [result] = await rheo.ack(lease)
    assert result.kind == SettleKind.BACKEND_UNAVAILABLE
    await rheo.close()


async def test_a_connection_lost_mid_call_is_ambiguous(rheo: Rheo, admin: asyncpg.Connection,
                                                       wait_until: WaitUntil) -> None:
    backend = rheo.backend
    assert isinstance(backend, PostgresBackend)
    pool = backend._pool
    assert pool is not None
    async with pool.acquire() as conn:
        pid = conn.get_server_pid()
        call = asyncio.create_task(conn.execute("SELECT pg_sleep(30)"))

        async def running() -> bool:
            query = await admin.fetchval(
                "SELECT query FROM pg_stat_activity WHERE pid = $1 AND state = 'active'", pid)
            return query is not None and "pg_sleep" in query

        await wait_until(running)
        await admin.execute("SELECT pg_terminate_backend($1)", pid)
        with pytest.raises((asyncpg.PostgresError, asyncpg.InterfaceError, OSError)) as caught:
            await call
    assert backend.classify_error(caught.value) == SettleKind.AMBIGUOUS, repr(caught.value)


# Reads and retention on a server ------------------------------------------------


async def test_trim_fences_leases_and_moves_every_group(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", {"n": i}, partition=i % 2) for i in range(20)])
    slow = await rheo.fetch("s", "slow", limit=20)
    fast = await rheo.fetch("s", "fast", limit=20)
    await rheo.ack(fast)
    removed = await rheo.trim("s", up_to=4, force=True)
    assert removed == {0: 4, 1: 4}
    assert await rheo.frontier("s", "slow") == {0: 4, 1: 4}
    results = await rheo.ack(slow)
    kinds = {(x.partition, x.sequence): r.kind for x, r in zip(slow, results, strict=True)}
    assert all(kinds[(p, s)] == SettleKind.STALE_LEASE for p in (0, 1) for s in range(1, 5))
    assert all(kinds[(p, s)] is None for p in (0, 1) for s in range(5, 11))
    assert await rheo.frontier("s", "slow") == {0: 10, 1: 10}
    info = await rheo.stream_info("s")
    assert info.low_water == {0: 5, 1: 5}
