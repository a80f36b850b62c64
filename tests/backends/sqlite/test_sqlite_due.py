"""The SQLite backend's fetch reads only its work (schema 7): delayed and held
deliveries are never walked, idle partitions are never visited, and a file of any
older schema is upgraded with its leases in flight kept.

Work is counted in SQLite VM instructions (a progress handler called on each), which
are exact and do not depend on the machine's speed."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from _sqlite_ranges import (
    SCHEMA_7_INDEXES,
    ranges_to_delivery_rows,
    undo_schema_7,
    undo_schema_8,
)
from rheo_flow import Lease, ManualClock, NewEvent, Retention, Rheo, SettleKind
from rheo_flow._backends import sqlite as sqlite_module
from rheo_flow._backends.sqlite import _sql
from rheo_flow.backends import SQLiteBackend

HOUR = 3_600_000
DELAY = 30 * 60_000


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database file in the test's directory (created on open)."""
    return tmp_path / "events.db"


class Steps:
    """Counts the VM instructions the backend's connection runs while switched on."""

    def __init__(self, backend: SQLiteBackend) -> None:
        self._backend = backend
        self.count = 0

    def _tick(self) -> int:
        self.count += 1
        return 0

    async def measure(self, call: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
        """The instructions ``call`` costs, and what it returned."""
        def on(conn: sqlite3.Connection) -> None:
            conn.set_progress_handler(self._tick, 1)

        def off(conn: sqlite3.Connection) -> None:
            conn.set_progress_handler(None, 1)

        await self._backend._writer.run(False, on)
        self.count = 0
        try:
            result = await call()
        finally:
            await self._backend._writer.run(False, off)
        return self.count, result


@pytest.fixture
async def opened(db: Path, clock: ManualClock) -> AsyncIterator[tuple[Rheo, Steps]]:
    """An instance over an SQLite file driven by ``clock``, and its step counter."""
    backend = SQLiteBackend(db, clock=clock, synchronous="NORMAL")
    async with Rheo(backend) as rheo:
        yield rheo, Steps(backend)


async def _fill(rheo: Rheo, stream: str, partitions: int, count: int) -> None:
    for part in range(partitions):
        events = [NewEvent("t", i) for i in range(count // partitions)]
        if events:
            await rheo.append(stream, events, partition=part)


async def _fetch_cost(rheo: Rheo, steps: Steps, stream: str) -> list[int]:
    """The steps of three fetch(limit=10) by a fresh consumer, each acked (not counted)."""
    costs = []
    for _ in range(3):
        cost, leases = await steps.measure(
            lambda: rheo.fetch(stream, "g", consumer_id="B", limit=10, lease_ms=60_000))
        assert len(leases) == 10
        assert all(lease.attempt == 1 for lease in leases)
        assert all(r.ok for r in await rheo.ack(leases))
        costs.append(cost)
    return costs


@pytest.mark.parametrize("delayed", [False, True], ids=["held", "delayed"])
async def test_held_and_delayed_work_is_never_walked(
        opened: tuple[Rheo, Steps], delayed: bool) -> None:
    rheo, steps = opened
    costs = {}
    for held in (8, 4_000):
        stream = f"s{held}"
        await rheo.create_stream(stream, partitions=4)
        await _fill(rheo, stream, 4, held)
        taken: list[Lease] = []
        while len(taken) < held:  # A holds them, in fetches of 500
            taken += await rheo.fetch(stream, "g", consumer_id="A", limit=500, lease_ms=HOUR)
        if delayed:
            assert all(r.ok for r in await rheo.nack(taken, "later", delay_ms=DELAY))
        await _fill(rheo, stream, 4, 120)
        costs[held] = await _fetch_cost(rheo, steps, stream)
    # The same statements on the same indexes: at most a few b-tree levels more.
    assert max(costs[4_000]) <= 1.2 * min(costs[8]), costs


async def test_idle_partitions_are_never_visited(opened: tuple[Rheo, Steps]) -> None:
    rheo, steps = opened
    empty, busy = {}, {}
    for count in (1, 128):
        await rheo.create_stream(f"e{count}", partitions=count)
        await rheo.create_group(f"e{count}", "g")  # not in what the fetches cost
        empty[count] = [(await steps.measure(
            lambda c=count: rheo.fetch(f"e{c}", "g", consumer_id="B", limit=10)))[0]
            for _ in range(3)]
        await rheo.create_stream(f"s{count}", partitions=count)
        await rheo.create_group(f"s{count}", "g")
        await rheo.append(f"s{count}", [NewEvent("t", i) for i in range(30)], partition=0)
        busy[count] = await _fetch_cost(rheo, steps, f"s{count}")
    assert max(empty[128]) <= 1.2 * min(empty[1]), empty
    assert max(busy[128]) <= 1.2 * min(busy[1]), busy


async def test_a_fetch_takes_the_soonest_due_and_leases_them_in_order(
        opened: tuple[Rheo, Steps], clock: ManualClock) -> None:
    rheo, _ = opened
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", i) for i in range(6)], partition=0)
    await rheo.append("s", [NewEvent("t", i) for i in range(2)], partition=1)
    one = await rheo.fetch("s", "g", limit=8, lease_ms=HOUR)
    first = {(x.partition, x.sequence): x for x in one}
    # Partition 0: 5 and 6 due first, then 1 and 2; 3 not before an hour; 4 stays held.
    await rheo.nack([first[(0, 5)], first[(0, 6)]], "retry", delay_ms=1_000)
    await rheo.nack([first[(0, 1)], first[(0, 2)]], "retry", delay_ms=2_000)
    await rheo.nack([first[(0, 3)]], "retry", delay_ms=HOUR)
    await rheo.nack([first[(1, 1)]], "retry", delay_ms=2_000)
    clock.advance(1_000)
    assert [(x.partition, x.sequence) for x in await rheo.fetch("s", "g", limit=1)] == [(0, 5)]
    clock.advance(1_000)
    two = await rheo.fetch("s", "g", limit=3)
    # Partition 0's share of two: 6 (due first), then 1 (due with 2, a lower sequence).
    assert sorted((x.partition, x.sequence, x.attempt) for x in two) == [
        (0, 1, 2), (0, 6, 2), (1, 1, 2)]
    assert [x.sequence for x in two if x.partition == 0] == [1, 6]  # leased in order
    assert [x.sequence for x in await rheo.fetch("s", "g", limit=5)] == [2]
    assert await rheo.fetch("s", "g", limit=5) == []  # 3 waits an hour, 4 is held
    clock.advance(HOUR)
    assert sorted((x.partition, x.sequence) for x in await rheo.fetch("s", "g", limit=9)) == [
        (0, 1), (0, 2), (0, 3), (0, 4), (0, 5), (0, 6), (1, 1), (1, 2)]


async def test_appends_keep_every_groups_high_water_mirrored(
        opened: tuple[Rheo, Steps], db: Path) -> None:
    rheo, _ = opened
    await rheo.create_stream("s", partitions=3)
    await rheo.append("s", [NewEvent("t", i) for i in range(4)], partition=1)
    await rheo.create_group("s", "late", start="latest")
    await rheo.fetch("s", "g", limit=2)
    await rheo.append("s", [NewEvent("t", i, partition=i % 3) for i in range(5)])
    conn = sqlite3.connect(db)
    try:
        rows = conn.execute(
            "SELECT g.name, gp.part, gp.cursor, gp.high_water, p.high_water"
            " FROM group_partitions AS gp JOIN groups AS g ON g.id = gp.group_id"
            " JOIN partitions AS p ON p.stream_id = g.stream_id AND p.part = gp.part"
            " ORDER BY g.name, gp.part").fetchall()
        behind = conn.execute(
            "SELECT g.name, gp.part FROM group_partitions AS gp INDEXED BY"
            " group_partitions_behind JOIN groups AS g ON g.id = gp.group_id"
            " WHERE gp.cursor < gp.high_water ORDER BY g.name, gp.part").fetchall()
    finally:
        conn.close()
    assert all(mirrored == high for *_, mirrored, high in rows), rows
    assert [row[:3] for row in rows] == [("g", 0, 0), ("g", 1, 2), ("g", 2, 0),
                                         ("late", 0, 0), ("late", 1, 4), ("late", 2, 0)]
    assert behind == [("g", 0), ("g", 1), ("g", 2), ("late", 0), ("late", 1), ("late", 2)]


def _as_version(conn: sqlite3.Connection, version: int) -> None:
    """Turn a file the current schema wrote into the layout of ``version``."""
    undo_schema_8(conn)
    if version == 7:
        conn.execute(f"PRAGMA user_version = {version}")
        return
    undo_schema_7(conn)
    if version <= 5:
        ranges_to_delivery_rows(conn)
    if version <= 3:
        conn.execute("DROP INDEX deliveries_keyed")
        conn.execute("ALTER TABLE deliveries DROP COLUMN key")
        conn.execute("ALTER TABLE groups DROP COLUMN ordering")
    if version <= 2:
        conn.execute("ALTER TABLE deliveries DROP COLUMN last_error")
    if version == 1:  # schema 1's CHECK was an IN list
        table = conn.execute(
            "SELECT sql FROM sqlite_schema WHERE name = 'deliveries'").fetchone()[0]
        head, rest = table.split("CHECK", 1)
        check = "CHECK (state IN ('available', 'leased', 'acked', 'rejected'))"
        conn.execute((head + check + rest.split(")", 1)[1]).replace("deliveries", "old", 1))
        conn.execute("INSERT INTO old SELECT * FROM deliveries")
        conn.execute("DROP TABLE deliveries")
        conn.execute("ALTER TABLE old RENAME TO deliveries")
        for index in _sql.DELIVERIES_INDEXES[:2]:  # schema 1 had no keyed index
            conn.execute(index)
    conn.execute(f"PRAGMA user_version = {version}")


@pytest.mark.parametrize("version", range(1, sqlite_module.SCHEMA_VERSION))
async def test_every_older_file_upgrades_with_its_leases_in_flight(
        db: Path, clock: ManualClock, version: int) -> None:
    async with Rheo(SQLiteBackend(db, clock=clock, synchronous="NORMAL")) as rheo:
        await rheo.create_stream("s", partitions=2)
        await rheo.create_group("s", "g", max_attempts=5)
        for part in (0, 1):
            await rheo.append("s", [NewEvent("t", i) for i in range(4)], partition=part)
        held = await rheo.fetch("s", "g", limit=2, lease_ms=HOUR)  # (0, 1), (1, 1)
        short = await rheo.fetch("s", "g", limit=2, lease_ms=1_000)  # (0, 2), (1, 2)
        later = await rheo.fetch("s", "g", limit=2, lease_ms=HOUR)  # (0, 3), (1, 3)
        assert all(r.ok for r in await rheo.nack(later, "retry", delay_ms=DELAY))
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        _as_version(conn, version)
        conn.execute("COMMIT")
    finally:
        conn.close()

    async with Rheo(SQLiteBackend(db, clock=clock, synchronous="NORMAL")) as rheo:
        await rheo.append("s", [NewEvent("t", "new")], partition=1)  # (1, 5)
        clock.advance(1_000)  # the short leases expired; the others still wait
        got = await rheo.fetch("s", "g", limit=10)
        assert sorted((x.partition, x.sequence, x.attempt) for x in got) == [
            (0, 2, 2), (0, 4, 1), (1, 2, 2), (1, 4, 1), (1, 5, 1)]
        assert all(r.ok for r in await rheo.ack([*held, *got]))
        assert [r.kind for r in await rheo.ack(short)] == [SettleKind.STALE_LEASE] * 2
        clock.advance(DELAY)
        again = await rheo.fetch("s", "g", limit=10)
        assert sorted((x.partition, x.sequence, x.attempt) for x in again) == [
            (0, 3, 2), (1, 3, 2)]
        assert all(r.ok for r in await rheo.ack(again))
        assert await rheo.frontier("s", "g") == {0: 4, 1: 5}
        assert not (await rheo.group_info("s", "g")).paused  # schema 8: none is paused
        await rheo.pause_group("s", "g")
        await rheo.append("s", [NewEvent("t", "paused")], partition=0)
        assert await rheo.fetch("s", "g") == []
        # Schema 8: the stream had no policy; it takes one now.
        assert (await rheo.stream_info("s")).retention is None
        policy = Retention(max_events=1)
        assert (await rheo.set_retention("s", policy)).retention == policy
        assert await rheo.apply_retention("s") == {0: 4, 1: 4}  # (0, 5) came while paused
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (sqlite_module.SCHEMA_VERSION,)
        names = {row[0] for row in conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'index'")}
        assert set(SCHEMA_7_INDEXES) <= names
        (active,) = conn.execute(
            "SELECT sql FROM sqlite_schema WHERE name = 'deliveries_active'").fetchone()
        assert "(group_id, part, seq, state)" in active  # schema 7's, by sequence only
        assert conn.execute(
            "SELECT part, cursor, high_water FROM group_partitions ORDER BY part").fetchall() == [
            (0, 4, 5), (1, 5, 5)]  # partition 0's last event, appended while paused
    finally:
        conn.close()
