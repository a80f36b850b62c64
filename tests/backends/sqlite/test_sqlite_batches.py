"""The SQLite backend's batch paths: one fenced statement per settle batch, whole-batch
appends with the stored-id fallback, exact JSON decoding and per-fetch lease ids."""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
from collections.abc import AsyncIterator, Awaitable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rheo_flow import ManualClock, NewEvent, Query, Rheo, SettleKind, UnknownStream
from rheo_flow._backends import sqlite as sqlite_module
from rheo_flow._backends.sqlite import _sql
from rheo_flow._backends.sqlite._writer import Writer
from rheo_flow.backends import SQLiteBackend


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database file in the test's directory (created on open)."""
    return tmp_path / "events.db"


@pytest.fixture
async def rheo(db: Path, clock: ManualClock) -> AsyncIterator[Rheo]:
    """An opened instance over an SQLite file driven by ``clock``."""
    async with Rheo(SQLiteBackend(db, clock=clock, synchronous="NORMAL")) as r:
        yield r


async def test_append_with_a_stored_id_redoes_the_batch_gapless(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=2)
    first = await rheo.append("s", [NewEvent("t", {"n": i}, id=f"e{i}", partition=i % 2)
                                    for i in range(4)])
    # No id repeats inside the batch, one is stored: the whole-batch insert fails on
    # the unique index and is redone; no sequence is skipped.
    again = await rheo.append("s", [NewEvent("t", "a", id="a", partition=0),
                                    NewEvent("t", {"n": 99}, id="e2", partition=1),
                                    NewEvent("t", "b", id="b", partition=0),
                                    NewEvent("t", "c", id="c", partition=1)])
    assert again[1] == first[2]
    assert [(e.id, e.partition, e.sequence) for e in again] == [
        ("a", 0, 3), ("e2", 0, 2), ("b", 0, 4), ("c", 1, 3)]
    info = await rheo.stream_info("s")
    assert dict(info.high_water) == {0: 4, 1: 3}
    stored = [(e.id, e.partition, e.sequence)
              for e in (await rheo.query_page(Query(stream="s"), limit=100)).events]
    assert stored == [("e0", 0, 1), ("e2", 0, 2), ("a", 0, 3), ("b", 0, 4),
                      ("e1", 1, 1), ("e3", 1, 2), ("c", 1, 3)]


async def test_wide_integers_and_unicode_survive_exactly(rheo: Rheo) -> None:
    data = {"big": 2**70, "neg": -(2**65), "u64": 2**64 - 1, "float": 0.1,
            "digits": "1234567890123456789012", "text": "é ✓"}
    plain = {"n": 1, "x": [1.5, None, True]}
    await rheo.create_stream("s")
    appended = await rheo.append("s", [NewEvent("t", data, headers={"h": "✓"}),
                                       NewEvent("t", plain)])
    assert [e.data for e in appended] == [data, plain]
    leases = await rheo.fetch("s", "g", limit=10)
    assert [lease.event.data for lease in leases] == [data, plain]
    assert leases[0].event.headers == {"h": "✓"}
    assert leases[0].event == appended[0]
    page = await rheo.query_page(Query(stream="s"), limit=10)
    assert [e.data for e in page.events] == [data, plain]
    assert all(type(e.data["big"]) is int for e in (appended[0], leases[0].event))


async def test_lease_ids_are_unique_within_and_across_fetches(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=3)
    await rheo.append("s", [NewEvent("t", i, partition=i % 3) for i in range(60)])
    ids: list[str] = []
    for _ in range(3):
        ids.extend(lease.lease_id for lease in await rheo.fetch("s", "g", limit=20))
    assert len(ids) == len(set(ids)) == 60
    assert all(len(i) == 32 and int(i, 16) >= 0 for i in ids)


async def test_mixed_settle_batch_classifies_each_lease(rheo: Rheo, clock: ManualClock) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", i) for i in range(5)])
    one, two, _three, four, five = await rheo.fetch("s", "g", limit=5, lease_ms=1_000)
    assert all(r.ok for r in await rheo.ack([one]))
    clock.advance(1_000)
    (two_again, three_again) = await rheo.fetch("s", "g", limit=2, lease_ms=60_000)
    assert (two_again.sequence, three_again.sequence) == (2, 3)
    # Four and five expired but nobody leased them again: their leases still settle.
    forged = type(five)(five.lease_id, "0-5-9", five.group, five.consumer_id, five.event,
                        five.attempt, five.deadline_ms)
    results = await rheo.ack([one, two, four, forged, three_again])
    assert [(r.ok, r.kind, r.repeated) for r in results] == [
        (True, None, True),
        (False, SettleKind.STALE_LEASE, False),
        (True, None, False),
        (False, SettleKind.RECEIPT_MISMATCH, False),
        (True, None, False),
    ]
    assert await rheo.frontier("s", "g") == {0: 1}
    assert all(r.ok for r in await rheo.ack([two_again, five]))
    assert await rheo.frontier("s", "g") == {0: 5}


async def test_nack_batch_dead_letters_the_last_attempt(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", max_attempts=2)
    await rheo.append("s", [NewEvent("t", i) for i in range(3)])
    first = await rheo.fetch("s", "g", limit=3)
    assert all(r.ok for r in await rheo.nack(first, "retry"))
    second = await rheo.fetch("s", "g", limit=3)
    assert [lease.attempt for lease in second] == [2, 2, 2]
    renewed = await rheo.renew(second, lease_ms=5_000)
    assert all(r.ok and r.deadline_ms is not None for r in renewed)
    assert all(r.ok for r in await rheo.nack(second[:2], "again"))
    letters = await rheo.dead_letters("s", "g")
    assert [(d.sequence, d.reason) for d in letters] == [(1, "max_attempts"), (2, "max_attempts")]
    assert await rheo.frontier("s", "g") == {0: 2}
    assert all(r.ok for r in await rheo.reject(second[2:], "poison"))
    assert await rheo.frontier("s", "g") == {0: 3}
    assert await rheo.fetch("s", "g", limit=3) == []


async def test_settle_and_frontier_statements_use_keys_not_history(db: Path) -> None:
    async with Rheo(SQLiteBackend(db, synchronous="NORMAL")) as r:
        await r.create_stream("s")
        await r.append("s", [NewEvent("t", i) for i in range(5_003)])
        await r.ack(await r.fetch("s", "g", limit=5_000))
        # Nacked, the last 3 are delivery rows (not a range): leased again below.
        await r.nack(await r.fetch("s", "g", limit=3), "again")
        pending = await r.fetch("s", "g", limit=3, lease_ms=60_000)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        head = ("why", 0, 0, 5, "max_attempts", 1)
        for sql in [*_sql.SETTLE.values(), _sql.RENEW]:
            error = (None,) if "?11" in sql else ()  # nack and reject record an error
            plan = " ".join(row[3] for row in conn.execute(
                "EXPLAIN QUERY PLAN " + sql, (*head, 0, 1, "x", "y", *error)))
            assert plan == "SEARCH deliveries USING PRIMARY KEY (group_id=? AND part=? AND seq=?)"

        # Work, not time: the ack of 3 leases beside 5,000 acked rows takes few VM steps.
        steps = 0

        def count() -> int:
            nonlocal steps
            steps += 1
            return 0

        plan = [row[3] for row in conn.execute(
            "EXPLAIN QUERY PLAN " + _sql.ADVANCE_FRONTIER, (1, 0))]
        assert "COVERING INDEX deliveries_active" in plan[2], plan
        assert "INDEX ranges_open" in plan[-1], plan
        assert not any("SCAN" in step for step in plan), plan

        conn.execute("BEGIN")
        conn.set_progress_handler(count, 1)
        changed = conn.executemany(_sql.SETTLE["ack"], [
            (*head, 0, lease.sequence, lease.lease_id, lease.receipt) for lease in pending
        ]).rowcount
        conn.execute(_sql.ADVANCE_FRONTIER, (1, 0))
        conn.set_progress_handler(None, 1)
        (frontier,) = conn.execute("SELECT frontier FROM group_partitions").fetchone()
        conn.execute("ROLLBACK")
        assert changed == 3
        assert frontier == 5_003
        assert steps < 1_000, steps
    finally:
        conn.close()


_V1_CHECK = "CHECK (state IN ('available', 'leased', 'acked', 'rejected'))"


async def test_schema_1_file_is_migrated_in_place(db: Path) -> None:
    async with Rheo(SQLiteBackend(db, synchronous="NORMAL")) as r:
        await r.create_stream("s")
        await r.create_group("s", "g", max_attempts=1)
        await r.append("s", [NewEvent("t", i) for i in range(4)])
        first, second, third = await r.fetch("s", "g", limit=3, lease_ms=60_000)
        await r.ack([first])
        await r.nack([second], "boom")  # the last attempt: dead-lettered
    # Turn the file back into schema 1: its deliveries table had an IN-list CHECK.
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        v1 = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'deliveries'").fetchone()[0]
        v1 = v1.split("CHECK", 1)[0] + _V1_CHECK + v1.split("CHECK", 1)[1].split(")", 1)[1]
        conn.execute(v1.replace("deliveries", "old", 1))
        conn.execute("INSERT INTO old SELECT * FROM deliveries")
        conn.execute("DROP TABLE deliveries")
        conn.execute("ALTER TABLE old RENAME TO deliveries")
        for statement in _sql.DELIVERIES_INDEXES:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("COMMIT")
        assert _V1_CHECK in conn.execute(
            "SELECT sql FROM sqlite_schema WHERE name = 'deliveries'").fetchone()[0]
    finally:
        conn.close()

    async with Rheo(SQLiteBackend(db, synchronous="NORMAL")) as r:
        assert await r.frontier("s", "g") == {0: 2}
        assert [d.sequence for d in await r.dead_letters("s", "g")] == [2]
        assert all(res.ok for res in await r.ack([third]))  # leases survive the migration
        (fourth,) = await r.fetch("s", "g", limit=5)
        assert fourth.sequence == 4
        await r.ack([fourth])
        assert await r.frontier("s", "g") == {0: 4}
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (sqlite_module.SCHEMA_VERSION,)
        sql = conn.execute("SELECT sql FROM sqlite_schema WHERE name = 'deliveries'").fetchone()[0]
        assert "state = 'available' OR" in sql
        assert _V1_CHECK not in sql
        names = {row[0] for row in conn.execute(
            "SELECT name FROM sqlite_schema WHERE tbl_name = 'deliveries' AND type = 'index'")}
        assert {"deliveries_active", "deliveries_rejected"} <= names
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute("UPDATE deliveries SET state = 'bogus'")
    finally:
        conn.close()


async def test_batch_with_a_lease_from_elsewhere_is_answered_lease_by_lease(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", i, partition=0) for i in range(3)])
    first, second, third = await rheo.fetch("s", "g", limit=3)
    foreign = replace(third, event=replace(third.event, partition=7))
    wrong_type = replace(second, lease_id=12345)
    results = await rheo.ack([first, foreign, wrong_type])
    assert [(r.ok, r.kind) for r in results] == [
        (True, None), (False, SettleKind.INVALID), (False, SettleKind.STALE_LEASE)]
    renewed = await rheo.renew([second, third, foreign], lease_ms=5_000)
    assert [(r.ok, r.kind) for r in renewed] == [
        (True, None), (True, None), (False, SettleKind.INVALID)]
    assert all(r.ok for r in await rheo.ack([second, third]))
    assert await rheo.frontier("s", "g") == {0: 3, 1: 0}


async def _queued(backend: SQLiteBackend, *calls: Awaitable[Any]) -> list[Any]:
    """Run ``calls`` while the backend thread is held, so that they queue up."""
    gate, holding = threading.Event(), threading.Event()
    executor = backend._writer.executor
    assert executor is not None

    def hold() -> None:
        holding.set()
        gate.wait(10)

    blocker = asyncio.wrap_future(executor.submit(hold))
    # The thread may still be finishing an earlier drain, which would take the new
    # calls one by one as they come: queue them only once the thread is held.
    deadline = asyncio.get_running_loop().time() + 10
    while not holding.is_set():
        assert asyncio.get_running_loop().time() < deadline, "the thread was never held"
        await asyncio.sleep(0.001)
    tasks = [asyncio.ensure_future(call) for call in calls]
    # Release the thread only once every call waits in the writer's queue.
    while len(backend._writer._pending) < len(calls):
        assert asyncio.get_running_loop().time() < deadline, "calls never queued up"
        await asyncio.sleep(0.001)
    gate.set()
    await blocker
    return list(await asyncio.gather(*tasks, return_exceptions=True))


async def test_operations_queued_together_share_one_commit_and_keep_their_errors(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    alone: list[int] = []
    together, single = Writer._run_together, Writer._run_alone

    def record_together(self: Writer, jobs: list[Any]) -> Any:
        batches.append(len(jobs))
        return together(self, jobs)

    def record_alone(self: Writer, job: Any) -> Any:
        alone.append(1)
        return single(self, job)

    monkeypatch.setattr(Writer, "_run_together", record_together)
    monkeypatch.setattr(Writer, "_run_alone", record_alone)
    backend = SQLiteBackend(db, synchronous="FULL")
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", [NewEvent("t", {"n": i}) for i in range(6)])
        first = await rheo.fetch("s", "g", limit=2)
        batches.clear()
        alone.clear()
        acked, second, appended = await _queued(
            backend, rheo.ack(first), rheo.fetch("s", "g", limit=2),
            rheo.append("s", [NewEvent("t", {"n": 6})]))
        assert (batches, alone) == ([3], [])  # one transaction, one commit
        assert all(r.ok for r in acked)
        assert [lease.event.sequence for lease in second] == [3, 4]
        assert [e.sequence for e in appended] == [7]
        # One call fails: the batch is redone one call per transaction, and the
        # error reaches only the caller whose call raised.
        batches.clear()
        acked, failed, third = await _queued(
            backend, rheo.ack(second), rheo.append("missing", [NewEvent("t", 1)]),
            rheo.fetch("s", "g", limit=2))
        assert batches == [3]
        assert len(alone) == 3
        assert isinstance(failed, UnknownStream)
        assert all(r.ok for r in acked)
        assert [lease.event.sequence for lease in third] == [5, 6]
    # Everything that returned is in the file.
    async with Rheo(SQLiteBackend(db)) as again:
        assert await again.frontier("s", "g") == {0: 4}
        assert dict((await again.stream_info("s")).high_water) == {0: 7}


# Schema 4's triggers, as that version created them (the upgrade to 5 drops them).
_V4_TRIGGERS = (
    """CREATE TRIGGER deliveries_key_settled AFTER UPDATE OF state ON deliveries
    WHEN OLD.key IS NOT NULL AND OLD.state IN ('available', 'leased')
         AND NEW.state IN ('acked', 'rejected')
    BEGIN SELECT 1; END""",
    """CREATE TRIGGER deliveries_key_removed AFTER DELETE ON deliveries
    WHEN OLD.key IS NOT NULL AND OLD.state IN ('available', 'leased')
    BEGIN SELECT 1; END""",
)


async def test_schema_4_file_loses_its_triggers_and_keeps_blocked_keys(db: Path) -> None:
    async with Rheo(SQLiteBackend(db, synchronous="NORMAL")) as r:
        await r.create_stream("s")
        await r.create_group("s", "g", ordering="key")
        await r.append("s", [NewEvent("t", i, key="a") for i in range(2)])
        [first] = await r.fetch("s", "g", limit=5)  # the second is stored blocked
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for statement in _V4_TRIGGERS:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 4")
    finally:
        conn.close()
    async with Rheo(SQLiteBackend(db, synchronous="NORMAL")) as r:
        assert await r.fetch("s", "g", limit=5) == []
        assert all(x.ok for x in await r.ack([first]))  # the lease survives the upgrade
        [second] = await r.fetch("s", "g", limit=5)  # released by the ack
        assert second.sequence == 2
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (sqlite_module.SCHEMA_VERSION,)
        assert conn.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'trigger'").fetchall() == []
    finally:
        conn.close()


async def test_key_ordered_statements_never_read_settled_history(db: Path) -> None:
    """The keyed scan, the key probe and the releases run on the partial indexes."""
    async with Rheo(SQLiteBackend(db)) as r:
        await r.create_stream("s")
        await r.create_group("s", "g", ordering="key")
    conn = sqlite3.connect(db)
    try:
        for statement, params in ((_sql.ELIGIBLE_BY_KEY, (1, 0, 0)),
                                  (_sql.EVENT_KEYS_AFTER, (1, 0, 1, 0, 10, 0)),
                                  (_sql.RELEASE_KEY, (1, 0, 1)),
                                  (_sql.RELEASE_HEADS, (1, 0))):
            plan = " ".join(str(row[-1]) for row in conn.execute(
                f"EXPLAIN QUERY PLAN {statement}", params))
            assert "deliveries_keyed" in plan, plan
            assert "SCAN" not in plan.replace("USING INDEX", ""), plan
    finally:
        conn.close()


async def test_key_ordered_settle_cost_does_not_grow_with_acked_history(db: Path) -> None:
    async with Rheo(SQLiteBackend(db, synchronous="NORMAL")) as r:
        await r.create_stream("s", partitions=1)
        await r.create_group("s", "g", ordering="key")
        await r.append("s", [NewEvent("t", i, key=f"k{i % 7}") for i in range(3_000)])
        while leases := await r.fetch("s", "g", limit=100):
            assert all(x.ok for x in await r.ack(leases))
        await r.append("s", [NewEvent("t", i, key="k1") for i in range(2)])
        [last] = await r.fetch("s", "g", limit=5)
    conn = sqlite3.connect(db, isolation_level=None)
    try:  # the ack's own update, then its release: one probe whatever the acked rows
        conn.execute("UPDATE deliveries SET state = 'acked' WHERE seq = ?", (last.sequence,))
        ticks = itertools.count()
        conn.set_progress_handler(lambda: next(ticks) * 0, 1)  # 0: go on
        conn.execute(_sql.RELEASE_KEY, (1, 0, last.sequence))
        conn.set_progress_handler(None, 1)
        assert next(ticks) < 200
        assert conn.execute("SELECT available_at_ms FROM deliveries WHERE seq = ?",
                            (last.sequence + 1,)).fetchone() == (0,)
    finally:
        conn.close()
