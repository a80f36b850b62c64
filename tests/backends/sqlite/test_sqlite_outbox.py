"""The SQLite backend writes in the application's transaction (docs/outbox.md, "SQLite"):
``append`` and ``ack`` with ``connection=`` on the caller's own ``sqlite3`` connection
commit and roll back with it. Real files, no mocks."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rheo_flow import (
    BackendError,
    InvalidArgument,
    ManualClock,
    NewEvent,
    Query,
    Rheo,
    SettleKind,
    UnknownStream,
)
from rheo_flow._backends.sqlite._outbox import in_transaction
from rheo_flow.backends import SQLiteBackend


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "events.db"


@pytest.fixture
async def rheo(db: Path, clock: ManualClock) -> AsyncIterator[Rheo]:
    async with Rheo(SQLiteBackend(db, clock=clock, synchronous="NORMAL",
                                  busy_timeout_ms=2_000)) as r:
        await r.create_stream("orders", partitions=2)
        yield r


@pytest.fixture
def conn(rheo: Rheo, db: Path) -> Iterator[sqlite3.Connection]:
    """The application's connection (explicit transactions), with its own table."""
    c = sqlite3.connect(db, isolation_level=None, timeout=2)
    c.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY)")
    yield c
    c.close()


def _orders(conn: sqlite3.Connection) -> list[str]:
    return [row[0] for row in conn.execute("SELECT id FROM orders ORDER BY id")]


async def _place(rheo: Rheo, conn: sqlite3.Connection, order: str, *ids: str) -> list[str]:
    """BEGIN IMMEDIATE, the order's row and its events; left open. The event ids."""
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES (?)", (order,))
    events = await rheo.append(
        "orders", [NewEvent("placed", {"order": order}, id=i, key=order) for i in ids],
        connection=conn)
    return [e.id for e in events]


async def test_committed_events_are_visible_and_delivered_once_to_each_group(
        rheo: Rheo, conn: sqlite3.Connection) -> None:
    await rheo.create_group("orders", "billing")
    await rheo.create_group("orders", "shipping")
    before = await rheo.append("orders", NewEvent("other", {}, key="o0"))
    assert await _place(rheo, conn, "o1", "e1", "e2") == ["e1", "e2"]
    # Not visible before the commit (reads run beside the held write lock; a fetch
    # is a write and would wait for it: test_awaiting_the_backend_while_holding...).
    page = await rheo.query_page(Query(stream="orders"))
    assert [e.id for e in page.events] == [before[0].id]
    assert sum((await rheo.stream_info("orders")).high_water.values()) == 1
    conn.execute("COMMIT")
    assert _orders(conn) == ["o1"]
    assert sum((await rheo.stream_info("orders")).high_water.values()) == 3
    found = (await rheo.query_page(Query(stream="orders", type="placed"))).events
    assert sorted(e.id for e in found) == ["e1", "e2"]
    for group in ("billing", "shipping"):
        leases = await rheo.fetch("orders", group, limit=10)
        assert sorted(lease.event.id for lease in leases) == sorted(["e1", "e2", before[0].id])
        assert await rheo.fetch("orders", group, limit=10) == []
        assert all(r.ok for r in await rheo.ack(leases))


async def test_a_rollback_leaves_no_trace_and_sequences_stay_gapless(
        rheo: Rheo, conn: sqlite3.Connection) -> None:
    await rheo.create_group("orders", "g")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES ('o1')")
    [rolled] = await rheo.append("orders", NewEvent("placed", {}, id="e1"), partition=1,
                                 connection=conn)
    assert rolled.sequence == 1
    conn.execute("ROLLBACK")
    assert _orders(conn) == []
    assert (await rheo.stream_info("orders")).high_water == {0: 0, 1: 0}
    assert (await rheo.query_page(Query(stream="orders"))).events == []
    assert await rheo.fetch("orders", "g") == []
    # The id is free again and the next append takes the rolled-back sequence.
    [again] = await rheo.append("orders", NewEvent("placed", {"n": 2}, id="e1"), partition=1)
    assert (again.partition, again.sequence, again.data) == (1, 1, {"n": 2})


async def test_a_stored_event_id_returns_the_stored_event_and_keeps_the_transaction(
        rheo: Rheo, conn: sqlite3.Connection) -> None:
    [stored] = await rheo.append("orders", NewEvent("placed", {"first": True}, id="e1",
                                                    key="k"))
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES ('o1')")
    events = await rheo.append(
        "orders", [NewEvent("placed", {"first": False}, id="e1", key="k"),
                   NewEvent("placed", {}, id="e2", key="k")], connection=conn)
    assert events[0] == stored
    assert events[1].sequence == stored.sequence + 1
    # Repeated within the transaction too: the uncommitted event is returned.
    assert await rheo.append("orders", NewEvent("placed", {}, id="e2", key="k"),
                             connection=conn) == [events[1]]
    assert conn.in_transaction
    conn.execute("INSERT INTO orders VALUES ('o2')")
    conn.execute("COMMIT")
    assert _orders(conn) == ["o1", "o2"]
    found = (await rheo.query_page(Query(stream="orders"))).events
    assert [(e.id, e.sequence) for e in found] == [("e1", 1), ("e2", 2)]


async def test_the_ack_commits_with_the_callers_writes(
        rheo: Rheo, conn: sqlite3.Connection) -> None:
    await rheo.create_group("orders", "g")
    await rheo.append("orders", [NewEvent("placed", {}, id=f"e{i}", partition=0)
                                 for i in range(3)])
    leases = await rheo.fetch("orders", "g", limit=3)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES ('handled')")
    results = await rheo.ack(leases, connection=conn)
    assert all(r.ok and not r.repeated for r in results)
    assert await rheo.frontier("orders", "g") == {0: 0, 1: 0}  # not committed yet
    conn.execute("COMMIT")
    assert _orders(conn) == ["handled"]
    assert await rheo.frontier("orders", "g") == {0: 3, 1: 0}
    assert all(r.ok and r.repeated for r in await rheo.ack(leases))


async def test_a_rolled_back_ack_leaves_the_leases_unacked(
        rheo: Rheo, conn: sqlite3.Connection, clock: ManualClock) -> None:
    await rheo.create_group("orders", "g")
    await rheo.append("orders", [NewEvent("placed", {}, id=f"e{i}", partition=0)
                                 for i in range(2)])
    leases = await rheo.fetch("orders", "g", limit=2, lease_ms=1_000)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES ('handled')")
    assert all(r.ok for r in await rheo.ack(leases, connection=conn))
    conn.execute("ROLLBACK")
    assert _orders(conn) == []
    assert await rheo.frontier("orders", "g") == {0: 0, 1: 0}
    assert await rheo.fetch("orders", "g") == []  # still leased
    clock.advance(1_001)
    again = await rheo.fetch("orders", "g", limit=2)
    assert [(lease.event.id, lease.attempt) for lease in again] == [("e0", 2), ("e1", 2)]


async def test_a_stale_leases_ack_fails_without_aborting_the_transaction(
        rheo: Rheo, conn: sqlite3.Connection, clock: ManualClock) -> None:
    await rheo.create_group("orders", "g")
    await rheo.append("orders", NewEvent("placed", {}, id="e0", partition=0))
    await rheo.append("orders", NewEvent("placed", {}, id="e1", partition=1))
    stale = await rheo.fetch("orders", "g", partitions=[0], lease_ms=1_000)
    clock.advance(1_001)
    current = await rheo.fetch("orders", "g", limit=2)
    assert sorted(lease.event.id for lease in current) == ["e0", "e1"]
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES ('o1')")
    results = await rheo.ack([*stale, *current], connection=conn)
    assert [r.ok for r in results] == [False, True, True]
    assert results[0].kind is SettleKind.STALE_LEASE
    assert conn.in_transaction
    conn.execute("COMMIT")
    assert _orders(conn) == ["o1"]
    assert await rheo.frontier("orders", "g") == {0: 1, 1: 1}


async def test_the_connection_is_checked(rheo: Rheo, conn: sqlite3.Connection,
                                         tmp_path: Path) -> None:
    event = NewEvent("placed", {})
    with pytest.raises(InvalidArgument, match=r"sqlite3\.Connection.*got builtins\.object"):
        await rheo.append("orders", event, connection=object())
    with pytest.raises(InvalidArgument, match=r"not inside a transaction.*BEGIN"):
        await rheo.append("orders", event, connection=conn)
    other = sqlite3.connect(tmp_path / "other.db", isolation_level=None)
    memory = sqlite3.connect(":memory:", isolation_level=None)
    try:
        for wrong, says in ((other, "other.db"), (memory, "private in-memory")):
            wrong.execute("BEGIN")
            with pytest.raises(InvalidArgument, match=rf"{says}.*not the backend's database"):
                await rheo.append("orders", event, connection=wrong)
            wrong.execute("ROLLBACK")
    finally:
        other.close()
        memory.close()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES ('o1')")
    with pytest.raises(UnknownStream):
        await rheo.backend.append_in_transaction(conn, "nope", [])
    conn.execute("COMMIT")  # the caller's write survives the failed call
    assert _orders(conn) == ["o1"]
    assert (await rheo.stream_info("orders")).high_water == {0: 0, 1: 0}
    conn.close()
    with pytest.raises(InvalidArgument, match="closed"):
        await rheo.append("orders", event, connection=conn)


async def test_an_ack_on_a_wrong_connection_is_refused(
        rheo: Rheo, conn: sqlite3.Connection) -> None:
    await rheo.create_group("orders", "g")
    await rheo.append("orders", NewEvent("placed", {}))
    leases = await rheo.fetch("orders", "g")
    with pytest.raises(InvalidArgument, match="not inside a transaction"):
        await rheo.ack(leases, connection=conn)  # no transaction open
    with pytest.raises(InvalidArgument, match="not inside a transaction"):
        await rheo.backend.ack_in_transaction(conn, leases)
    assert all(r.ok and not r.repeated for r in await rheo.ack(leases))


async def test_a_memory_backend_refuses_any_connection(tmp_path: Path) -> None:
    async with Rheo(SQLiteBackend(":memory:")) as rheo:
        await rheo.create_stream("s")
        conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
        try:
            conn.execute("BEGIN")
            with pytest.raises(InvalidArgument, match=r"\(:memory:\).*database file"):
                await rheo.append("s", NewEvent("t", {}), connection=conn)
        finally:
            conn.close()


async def test_legacy_transactions_row_factories_and_relative_paths(
        rheo: Rheo, db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(db.parent)
    legacy = sqlite3.connect(db.name)  # isolation_level "": an INSERT opens a transaction
    legacy.row_factory = sqlite3.Row
    try:
        legacy.execute("CREATE TABLE orders (id TEXT)")
        legacy.commit()
        legacy.execute("INSERT INTO orders VALUES ('o1')")
        assert legacy.in_transaction
        [event] = await rheo.append("orders", NewEvent("placed", {"n": 1}, id="e1"),
                                    connection=legacy)
        assert event.data == {"n": 1}
        assert legacy.row_factory is sqlite3.Row
        legacy.commit()
        assert [e.id for e in (await rheo.query_page(Query(stream="orders"))).events] == ["e1"]
    finally:
        legacy.close()


async def test_a_transaction_that_read_before_another_commit_is_told_to_begin_immediate(
        rheo: Rheo, conn: sqlite3.Connection) -> None:
    conn.execute("BEGIN")  # deferred
    assert _orders(conn) == []  # a read: the transaction's snapshot is taken
    await rheo.append("orders", NewEvent("placed", {}))  # another connection commits
    with pytest.raises(BackendError, match="BEGIN IMMEDIATE") as raised:
        await rheo.append("orders", NewEvent("placed", {}), connection=conn)
    assert raised.value.kind == "failed"
    conn.execute("ROLLBACK")
    # A deferred BEGIN that has not read yet takes the lock on the append.
    conn.execute("BEGIN")
    await rheo.append("orders", NewEvent("placed", {}, id="e2"), connection=conn)
    conn.execute("COMMIT")
    assert sum((await rheo.stream_info("orders")).high_water.values()) == 2


async def test_a_backend_fetch_waits_for_a_callers_commit_in_another_thread(
        rheo: Rheo, db: Path) -> None:
    """SQLite has one writer: the backend's fetch waits (up to busy_timeout_ms) while
    an application's transaction holds the lock, and goes on once it commits."""
    await rheo.create_group("orders", "g")
    holding, release = threading.Event(), threading.Event()
    hold_s = 0.3

    def application() -> None:
        c = sqlite3.connect(db, isolation_level=None)
        try:
            c.execute("BEGIN IMMEDIATE")
            c.execute("CREATE TABLE orders (id TEXT)")
            holding.set()
            release.wait(10)
            c.execute("COMMIT")
        finally:
            c.close()

    thread = threading.Thread(target=application)
    thread.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        threading.Timer(hold_s, release.set).start()  # the transaction's length
        assert await rheo.fetch("orders", "g") == []
        waited = time.monotonic() - started
    finally:
        release.set()
        thread.join()
    assert hold_s <= waited < 2.0  # waited for the commit, well within busy_timeout_ms


async def test_awaiting_the_backend_while_holding_the_lock_fails_after_busy_timeout(
        db: Path) -> None:
    """The self-deadlock docs/outbox.md warns of ends at busy_timeout_ms, and says so."""
    async with Rheo(SQLiteBackend(db, busy_timeout_ms=200)) as rheo:
        await rheo.create_stream("orders")
        await rheo.create_group("orders", "g")
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            await rheo.append("orders", NewEvent("placed", {}), connection=conn)
            started = time.monotonic()
            with pytest.raises(BackendError, match=r"waits for itself.*docs/outbox\.md"):
                await rheo.fetch("orders", "g")
            assert 0.2 <= time.monotonic() - started < 5
            conn.execute("COMMIT")
        finally:
            conn.close()
        [lease] = await rheo.fetch("orders", "g")
        assert all(r.ok for r in await rheo.ack([lease]))


async def test_an_error_undoes_the_calls_writes_only(
        rheo: Rheo, conn: sqlite3.Connection, db: Path) -> None:
    """The call's statements run in a savepoint of the application's transaction."""

    def fails_after_writing(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO orders VALUES ('the call''s')")
        raise ValueError("midway")

    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO orders VALUES ('mine')")
    with pytest.raises(ValueError, match="midway"):
        in_transaction(conn, str(db), fails_after_writing)
    assert conn.in_transaction
    conn.execute("COMMIT")
    assert _orders(conn) == ["mine"]


async def test_consumers_are_woken_by_notify_appended_not_by_the_append(
        rheo: Rheo, conn: sqlite3.Connection) -> None:
    backend = rheo.backend
    assert isinstance(backend, SQLiteBackend)
    other = SQLiteBackend(backend.path)  # another backend object on the file
    try:
        waiter = asyncio.create_task(other.wait_for_append("orders", 10))
        await _place(rheo, conn, "o1", "e1")
        conn.execute("COMMIT")
        # The commit alone wakes nobody (the backend cannot see it) ...
        assert not await backend.wait_for_append("orders", 0.05)
        assert not waiter.done()
        backend.notify_appended("orders")
        assert await asyncio.wait_for(waiter, 5)
    finally:
        await other.close()
