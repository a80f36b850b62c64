"""The SQLite backend's range leases (unordered groups): what they store, how an expired
range is leased again or dead-lettered, what trim and replay leave of them, the one
commit of ack_and_fetch, and leases in flight across the upgrade to schema 6."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from _sqlite_ranges import ranges_to_delivery_rows, undo_schema_7, undo_schema_8
from rheo_flow import ManualClock, NewEvent, Rheo, SettleKind
from rheo_flow._backends import sqlite as sqlite_module
from rheo_flow.backends import SQLiteBackend


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database file in the test's directory (created on open)."""
    return tmp_path / "events.db"


@pytest.fixture
async def rheo(db: Path, clock: ManualClock) -> AsyncIterator[Rheo]:
    """An opened instance over an SQLite file driven by ``clock``."""
    async with Rheo(SQLiteBackend(db, clock=clock, synchronous="NORMAL")) as r:
        await r.create_stream("s")
        yield r


def _rows(db: Path, query: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(db)
    try:
        return conn.execute(query).fetchall()
    finally:
        conn.close()


_RANGES = "SELECT first_seq, last_seq, attempt, done, pending FROM ranges ORDER BY first_seq"
_DELIVERIES = "SELECT seq, state, attempt FROM deliveries ORDER BY seq"


async def test_a_fetch_stores_one_range_and_acks_set_its_marks(rheo: Rheo, db: Path) -> None:
    await rheo.append("s", [NewEvent("t", i) for i in range(5)])
    leases = await rheo.fetch("s", "g", limit=4)
    assert len({lease.lease_id[:24] for lease in leases}) == 1  # one token, an offset each
    assert _rows(db, _RANGES) == [(1, 4, 1, "0000", 4)]
    assert _rows(db, _DELIVERIES) == []

    assert all(r.ok for r in await rheo.ack([leases[0], leases[2]]))
    assert _rows(db, _RANGES) == [(1, 4, 1, "1010", 2)]
    assert await rheo.frontier("s", "g") == {0: 1}
    assert all(r.ok for r in await rheo.ack(leases))  # 1 and 3 repeat, 2 and 4 take effect
    assert _rows(db, _RANGES) == [(1, 4, 1, "1111", 0)]  # settled, kept for repeats
    assert await rheo.frontier("s", "g") == {0: 4}
    assert all(r.repeated for r in await rheo.ack(leases))
    assert [r.kind for r in await rheo.nack(leases[:1], "late")] == [SettleKind.STALE_LEASE]
    assert _rows(db, _DELIVERIES) == []


async def test_nacks_rejects_and_partial_renewals_split_events_off(
        rheo: Rheo, db: Path, clock: ManualClock) -> None:
    await rheo.create_group("s", "g", max_attempts=3)
    await rheo.append("s", [NewEvent("t", i) for i in range(4)])
    one, two, three, four = await rheo.fetch("s", "g", limit=4, lease_ms=1_000)
    assert (await rheo.nack(one, "retry", delay_ms=10_000))[0].ok
    assert (await rheo.reject(two, "poison"))[0].ok
    [renewed] = await rheo.renew(three, lease_ms=5_000)
    assert renewed.deadline_ms == clock() + 5_000
    assert _rows(db, _RANGES) == [(1, 4, 1, "1110", 1)]
    assert _rows(db, _DELIVERIES) == [(1, "available", 1), (2, "rejected", 1), (3, "leased", 1)]
    assert (await rheo.nack(one, "retry"))[0].repeated  # the delivery row answers now
    assert (await rheo.ack(three))[0].ok

    clock.advance(1_000)  # four's range expired; three, renewed apart, did not
    [again] = await rheo.fetch("s", "g", limit=4)
    assert (again.sequence, again.attempt) == (4, 2)
    assert (await rheo.ack(four))[0].kind is SettleKind.STALE_LEASE
    assert (await rheo.ack(again))[0].ok
    assert await rheo.frontier("s", "g") == {0: 0}  # one waits for its delay
    clock.advance(9_000)
    [retried] = await rheo.fetch("s", "g")
    assert (retried.sequence, retried.attempt) == (1, 2)
    assert (await rheo.ack(retried))[0].ok
    assert await rheo.frontier("s", "g") == {0: 4}


async def test_an_expired_range_cut_by_the_limit_keeps_its_tail(
        rheo: Rheo, db: Path, clock: ManualClock) -> None:
    await rheo.append("s", [NewEvent("t", i) for i in range(6)])
    first = await rheo.fetch("s", "g", limit=6, lease_ms=1_000)
    assert all(r.ok for r in await rheo.ack([first[0], first[2]]))
    clock.advance(1_000)
    again = await rheo.fetch("s", "g", limit=2, lease_ms=1_000)
    assert [(x.sequence, x.attempt) for x in again] == [(2, 2), (4, 2)]
    # The head 1..4 under a new token and attempt; the tail 5..6 keeps the old lease.
    assert _rows(db, _RANGES) == [(1, 4, 2, "1010", 2), (5, 6, 1, "00", 2)]
    assert _rows(db, _DELIVERIES) == [(1, "acked", 1), (3, "acked", 1)]
    # The acks of the old lease still repeat; its leases re-leased are stale.
    assert all(r.repeated for r in await rheo.ack([first[0], first[2]]))
    assert [r.kind for r in await rheo.ack(first[1:2])] == [SettleKind.STALE_LEASE]
    assert [r.kind for r in await rheo.renew(first[3:4])] == [SettleKind.STALE_LEASE]
    # The tail was not leased again: its old leases settle, until it expires.
    assert (await rheo.ack(first[4]))[0].ok
    clock.advance(1_000)
    rest = await rheo.fetch("s", "g", limit=10)
    assert [(x.sequence, x.attempt) for x in rest] == [(2, 3), (4, 3), (6, 2)]
    assert all(r.ok for r in await rheo.ack(rest))
    assert await rheo.frontier("s", "g") == {0: 6}


async def test_an_expired_range_at_max_attempts_is_dead_lettered(
        rheo: Rheo, db: Path, clock: ManualClock) -> None:
    await rheo.create_group("s", "g", max_attempts=1)
    await rheo.append("s", [NewEvent("t", i) for i in range(3)])
    one, two, _ = await rheo.fetch("s", "g", limit=3, lease_ms=1_000)
    assert (await rheo.ack(two))[0].ok
    clock.advance(1_000)
    assert await rheo.fetch("s", "g") == []
    letters = await rheo.dead_letters("s", "g")
    assert [(d.sequence, d.attempts, d.reason) for d in letters] == [
        (1, 1, "max_attempts"), (3, 1, "max_attempts")]
    assert await rheo.frontier("s", "g") == {0: 3}
    assert [r.kind for r in await rheo.ack([one, two])] == [SettleKind.STALE_LEASE, None]
    assert await rheo.redrive("s", "g") == 2
    assert [x.sequence for x in await rheo.fetch("s", "g")] == [1, 3]


async def test_trim_and_replay_cut_ranges(rheo: Rheo, db: Path) -> None:
    await rheo.append("s", [NewEvent("t", i) for i in range(8)])
    leases = await rheo.fetch("s", "g", limit=8)
    assert all(r.ok for r in await rheo.ack(leases[:2]))
    assert await rheo.trim("s", up_to=3, force=True) == {0: 3}
    assert _rows(db, _RANGES) == [(4, 8, 1, "00000", 5)]
    assert [r.kind for r in await rheo.ack(leases[2:4])] == [SettleKind.STALE_LEASE, None]
    assert await rheo.frontier("s", "g") == {0: 4}
    await rheo.replay("s", "g", from_sequence=7)
    assert _rows(db, _RANGES) == [(4, 6, 1, "100", 2)]
    assert [r.kind for r in await rheo.ack(leases[6:])] == [SettleKind.STALE_LEASE] * 2
    assert all(r.ok for r in await rheo.ack(leases[4:6]))
    assert [(x.sequence, x.attempt) for x in await rheo.fetch("s", "g")] == [(7, 1), (8, 1)]
    await rheo.reset("s", "g", to="earliest")
    assert _rows(db, _RANGES) == []
    assert [x.sequence for x in await rheo.fetch("s", "g")] == [4, 5, 6, 7, 8]


async def test_ack_and_fetch_share_one_commit(db: Path) -> None:
    backend = SQLiteBackend(db, synchronous="NORMAL")
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", i) for i in range(4)])
        first = await rheo.fetch("s", "g", limit=2)
        statements: list[str] = []

        def trace(conn: sqlite3.Connection) -> None:
            conn.set_trace_callback(statements.append)

        await backend._writer.run(False, trace)
        statements.clear()
        results, second = await backend.ack_and_fetch(first, "s", "g", "c", 10, 30_000, None)
        assert all(r.ok for r in results)
        assert [x.sequence for x in second] == [3, 4]  # what the acks freed is not leased again
        assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT")] == [
            "BEGIN IMMEDIATE", "COMMIT"]
        assert await rheo.frontier("s", "g") == {0: 2}


async def test_leases_in_flight_across_the_upgrade_keep_working(
        db: Path, clock: ManualClock) -> None:
    async with Rheo(SQLiteBackend(db, clock=clock)) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", i) for i in range(6)])
        await rheo.create_group("s", "g", max_attempts=5)
        held = await rheo.fetch("s", "g", limit=4, lease_ms=1_000)
        assert (await rheo.ack(held[0]))[0].ok
    conn = sqlite3.connect(db)
    try:  # back to what version 5 left: delivery rows, no ranges
        undo_schema_8(conn)
        undo_schema_7(conn)
        ranges_to_delivery_rows(conn)
        conn.execute("PRAGMA user_version = 5")
        conn.commit()
    finally:
        conn.close()
    async with Rheo(SQLiteBackend(db, clock=clock)) as rheo:
        assert (await rheo.ack(held[0]))[0].repeated
        assert (await rheo.ack(held[1]))[0].ok
        assert (await rheo.nack(held[2], "retry"))[0].ok
        assert await rheo.frontier("s", "g") == {0: 2}
        clock.advance(1_000)  # held[3] expired: leased again beside the new events
        again = await rheo.fetch("s", "g", limit=10)
        assert [(x.sequence, x.attempt) for x in again] == [(3, 2), (4, 2), (5, 1), (6, 1)]
        assert (await rheo.ack(held[3]))[0].kind is SettleKind.STALE_LEASE
        assert all(r.ok for r in await rheo.ack(again))
        assert await rheo.frontier("s", "g") == {0: 6}
    assert _rows(db, "PRAGMA user_version") == [(sqlite_module.SCHEMA_VERSION,)]
    assert sqlite_module.SCHEMA_VERSION >= 7  # ranges since version 6, upgraded through 7 on
    assert [row[:2] for row in _rows(db, _RANGES)] == [(5, 6)]
