"""The SQLite backend: URL parsing, semantics (against the in-memory reference),
durability across reopen and across processes, competing processes, and index use."""

from __future__ import annotations

import asyncio
import json
import random
import sqlite3
import sys
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rheo_flow import (
    BackendError,
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    Lease,
    ManualClock,
    NewEvent,
    Query,
    Rheo,
    SettleKind,
    SettleResult,
    UnknownGroup,
    UnknownStream,
)
from rheo_flow._backends import sqlite as sqlite_module
from rheo_flow._backends._urls import backend_from_url
from rheo_flow._backends.sqlite import _sql
from rheo_flow._backends.sqlite._fetch_keyed import BLOCKED_MS
from rheo_flow.backends import MemoryBackend, SQLiteBackend

WORKER = Path(__file__).with_name("_sqlite_worker.py")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A database file in the test's directory (created on open)."""
    return tmp_path / "events.db"


@pytest.fixture
async def rheo(db: Path, clock: ManualClock) -> AsyncIterator[Rheo]:
    """An opened instance over an SQLite file driven by ``clock`` (overrides conftest's)."""
    async with Rheo(SQLiteBackend(db, clock=clock, synchronous="NORMAL")) as r:
        yield r


def _with(obj: Any, **changes: Any) -> Any:
    return replace(obj, **changes)


async def _worker(*args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


# URLs and construction -------------------------------------------------------


def test_from_url_forms(tmp_path: Path) -> None:
    assert SQLiteBackend.from_url("sqlite:///events.db").path == "events.db"
    assert SQLiteBackend.from_url("sqlite:///data/my%20events.db").path == "data/my events.db"
    assert SQLiteBackend.from_url(f"sqlite:///{tmp_path}/a.db").path == f"{tmp_path}/a.db"
    assert SQLiteBackend.from_url("sqlite:////abs/path.db").path == "/abs/path.db"
    assert SQLiteBackend.from_url("sqlite:///:memory:").path == ":memory:"
    built = backend_from_url("sqlite:///x.db?synchronous=normal&busy_timeout_ms=250")
    assert isinstance(built, SQLiteBackend)
    assert built.path == "x.db"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite://host/x.db", "names a host"),
        ("sqlite:///", "no database path"),
        ("sqlite://", "names a host"),
        ("sqlite:///x.db?journal=wal", "unknown SQLite URL option 'journal'"),
        ("sqlite:///x.db?synchronous=sometimes", "synchronous must be one of"),
        ("sqlite:///x.db?busy_timeout_ms=-1", "busy_timeout_ms"),
        ("postgresql:///x.db", "not an SQLite URL"),
    ],
)
def test_bad_urls(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        SQLiteBackend.from_url(url)


def test_bad_arguments() -> None:
    with pytest.raises(InvalidArgument, match="path"):
        SQLiteBackend("")
    with pytest.raises(InvalidArgument, match="busy_timeout_ms"):
        SQLiteBackend("x.db", busy_timeout_ms=-5)


def test_capabilities() -> None:
    caps = SQLiteBackend(":memory:").capabilities
    assert (caps.durable, caps.distributed) == (True, False)
    assert (caps.push_wakeups, caps.server_clock, caps.fenced_settle) == (True, False, True)


# Basic operations --------------------------------------------------------------


async def test_append_is_idempotent_and_gapless(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=2)
    first = await rheo.append("s", [NewEvent("t", {"n": i}, id=f"e{i}", partition=i % 2)
                                    for i in range(5)])
    assert [(e.partition, e.sequence) for e in first] == [(0, 1), (1, 1), (0, 2), (1, 2), (0, 3)]
    again = await rheo.append("s", [NewEvent("t", {"n": 99}, id="e1"),
                                    NewEvent("u", [1, "x"], id="new", partition=1,
                                             headers={"h": "v"}),
                                    NewEvent("u", None, id="new")])
    assert again[0] == first[1]
    assert (again[1].partition, again[1].sequence, again[1].headers) == (1, 3, {"h": "v"})
    assert again[2] == again[1]
    info = await rheo.stream_info("s")
    assert dict(info.high_water) == {0: 3, 1: 3}
    assert dict(info.low_water) == {0: 1, 1: 1}
    with pytest.raises(ConflictError):
        await rheo.create_stream("s", partitions=3)
    with pytest.raises(UnknownStream):
        await rheo.backend.append("nope", [])
    assert await rheo.streams() == ["s"]


async def test_lease_lifecycle(rheo: Rheo, clock: ManualClock) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", i) for i in range(6)])
    await rheo.create_group("s", "g", max_attempts=2)
    leases = await rheo.fetch("s", "g", consumer_id="c", limit=4, lease_ms=1_000)
    assert [(lease.sequence, lease.attempt) for lease in leases] == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert all(lease.deadline_ms == clock() + 1_000 for lease in leases)
    one, two, three, four = leases

    # A hole: 1 and 3 acked, 2 in flight -> the frontier stays at 1.
    assert all(r.ok and not r.repeated for r in await rheo.ack([one, three]))
    assert await rheo.frontier("s", "g") == {0: 1}
    assert (await rheo.ack(one))[0].repeated
    assert (await rheo.nack(one, "late"))[0].kind is SettleKind.STALE_LEASE

    renewed = await rheo.renew([two], lease_ms=5_000)
    assert (renewed[0].ok, renewed[0].deadline_ms) == (True, clock() + 5_000)

    # Nack makes 4 available again; reject dead-letters nothing else yet.
    assert (await rheo.nack(four, "retry"))[0].ok
    assert (await rheo.nack(four, "retry"))[0].repeated
    again = await rheo.fetch("s", "g", consumer_id="c", limit=1, lease_ms=1_000)
    assert [(lease.sequence, lease.attempt) for lease in again] == [(4, 2)]
    # attempt 2 == max_attempts: a nack dead-letters it.
    assert (await rheo.nack(again, "still failing"))[0].ok
    [dead] = await rheo.dead_letters("s", "g")
    assert (dead.sequence, dead.attempts, dead.reason) == (4, 2, "max_attempts")

    # Lease 2 expires (after its renewal) and is re-leased with attempt 2; the old one is stale.
    clock.advance(5_000)
    re = await rheo.fetch("s", "g", consumer_id="d", limit=1, lease_ms=1_000)
    assert [(lease.sequence, lease.attempt, lease.consumer_id) for lease in re] == [(2, 2, "d")]
    assert (await rheo.ack(two))[0].kind is SettleKind.STALE_LEASE
    assert (await rheo.renew(two))[0].kind is SettleKind.STALE_LEASE
    forged = Lease(re[0].lease_id, "forged", "g", "d", re[0].event, 2, 0)
    assert (await rheo.ack(forged))[0].kind is SettleKind.RECEIPT_MISMATCH
    assert (await rheo.reject(re, "poison"))[0].ok
    assert await rheo.frontier("s", "g") == {0: 4}

    # Expired at max_attempts: dead-lettered instead of re-leased.
    five = await rheo.fetch("s", "g", consumer_id="c", limit=1, lease_ms=1_000)
    assert (await rheo.nack(five, "x"))[0].ok
    five = await rheo.fetch("s", "g", consumer_id="c", limit=1, lease_ms=1_000)
    assert five[0].attempt == 2
    clock.advance(1_000)
    six = await rheo.fetch("s", "g", consumer_id="c", limit=5, lease_ms=1_000)
    assert [lease.sequence for lease in six] == [6]
    letters = await rheo.dead_letters("s", "g")
    assert [(d.sequence, d.reason) for d in letters] == [(2, "poison"), (4, "max_attempts"),
                                                         (5, "max_attempts")]
    assert (await rheo.ack(five))[0].kind is SettleKind.STALE_LEASE
    assert await rheo.frontier("s", "g") == {0: 5}

    # Redrive all: available again with attempt 0, the frontier moves back.
    assert await rheo.redrive("s", "g") == 3
    assert await rheo.frontier("s", "g") == {0: 1}
    redriven = await rheo.fetch("s", "g", consumer_id="c", limit=5, lease_ms=1_000)
    assert [(lease.sequence, lease.attempt) for lease in redriven] == [(2, 1), (4, 1), (5, 1)]
    assert all(r.ok for r in await rheo.ack([*redriven, *six]))
    assert await rheo.frontier("s", "g") == {0: 6}
    assert await rheo.lag("s", "g") == {0: 0}


async def test_invalid_leases(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    [event] = await rheo.append("s", NewEvent("t"))
    [lease] = await rheo.fetch("s", "g", limit=1)
    for stream, group, sequence in (("s", "other", 1), ("gone", "g", 1), ("s", "g", 7)):
        moved = Lease(lease.lease_id, lease.receipt, group, "c",
                      _with(event, stream=stream, sequence=sequence), 1, 0)
        [result] = await rheo.ack(moved)
        assert result.kind is SettleKind.INVALID, (stream, group, sequence)


async def test_round_robin_and_partition_filter(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=3)
    for p in range(3):
        await rheo.append("s", [NewEvent("t", i, partition=p) for i in range(4)])
    got = await rheo.fetch("s", "g", limit=6)
    # Every partition gets its turn before any gets a second one.
    assert sorted(lease.partition for lease in got[:3]) == [0, 1, 2]
    assert sorted(lease.partition for lease in got[3:]) == [0, 1, 2]
    only = await rheo.fetch("s", "g", limit=10, partitions=[2])
    assert [(lease.partition, lease.sequence) for lease in only] == [(2, 3), (2, 4)]


async def test_replay_reset_query_trim(rheo: Rheo, clock: ManualClock) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("a" if i % 2 else "b", i, key="k") for i in range(10)])
    leases = await rheo.fetch("s", "g", limit=10)
    await rheo.ack(leases[:6])
    assert await rheo.frontier("s", "g") == {0: 6}

    await rheo.replay("s", "g", from_sequence=4)
    assert await rheo.frontier("s", "g") == {0: 3}
    assert (await rheo.ack(leases[7]))[0].kind is SettleKind.STALE_LEASE
    assert (await rheo.ack(leases[4]))[0].kind is SettleKind.STALE_LEASE
    again = await rheo.fetch("s", "g", limit=10)
    assert [(lease.sequence, lease.attempt) for lease in again] == [(s, 1) for s in range(4, 11)]

    await rheo.reset("s", "g", to=8)
    assert await rheo.frontier("s", "g") == {0: 8}
    assert (await rheo.ack(again[0]))[0].kind is SettleKind.STALE_LEASE
    assert [lease.sequence for lease in await rheo.fetch("s", "g", limit=10)] == [9, 10]
    await rheo.reset("s", "g", to="latest")
    assert await rheo.fetch("s", "g", limit=10) == []

    page = await rheo.query_page(Query(stream="s", type="a", from_sequence=3), limit=2)
    assert [e.sequence for e in page.events] == [4, 6]
    rest = await rheo.query_page(Query(stream="s", type="a", from_sequence=3), cursor=page.cursor)
    assert [e.sequence for e in rest.events] == [8, 10]
    assert rest.cursor is None
    assert [e.sequence for e in (await rheo.query_page(
        Query(stream="s", key="k", since_ms=clock(), until_ms=clock() + 1, to_sequence=2)
    )).events] == [1, 2]

    assert await rheo.trim("s", up_to=5) == {0: 5}
    info = await rheo.stream_info("s")
    assert (info.low_water[0], info.high_water[0]) == (6, 10)
    assert [e.sequence for e in (await rheo.query_page(Query(stream="s"))).events] == [
        6, 7, 8, 9, 10]
    # Sequences are never reused after a trim.
    [late] = await rheo.append("s", NewEvent("t"))
    assert late.sequence == 11


async def test_groups_and_errors(rheo: Rheo, clock: ManualClock) -> None:
    with pytest.raises(UnknownStream):
        await rheo.create_group("s", "g")
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", partition=0), NewEvent("t", partition=0)])
    created = await rheo.create_group("s", "late", start="latest")
    assert created.max_attempts == 5
    assert await rheo.frontier("s", "late") == {0: 2, 1: 0}
    clock.advance(10)
    updated = await rheo.create_group("s", "late", max_attempts=9, start="earliest")
    assert (updated.max_attempts, updated.created_at_ms) == (9, created.created_at_ms)
    assert await rheo.frontier("s", "late") == {0: 2, 1: 0}
    await rheo.create_group("s", "early")
    assert [g.group for g in await rheo.groups("s")] == ["early", "late"]
    assert (await rheo.group_info("s", "late")).max_attempts == 9
    with pytest.raises(UnknownGroup):
        await rheo.frontier("s", "missing")
    with pytest.raises(UnknownGroup):
        await rheo.backend.fetch("s", "missing", "c", 1, 1000, None)


# Semantics match the in-memory reference ----------------------------------------


def _lease_view(lease: Lease) -> tuple[Any, ...]:
    return (lease.event, lease.receipt, lease.group, lease.consumer_id, lease.attempt,
            lease.deadline_ms)


def _result_view(result: SettleResult) -> tuple[Any, ...]:
    return (result.ok, result.kind, result.repeated, result.deadline_ms)


@pytest.mark.parametrize("seed", range(8))
async def test_random_operations_match_memory(tmp_path: Path, seed: int) -> None:
    """Random sequences of every operation give identical observable results."""
    rng = random.Random(seed)
    clock = ManualClock()
    mem = Rheo(MemoryBackend(clock=clock))
    sql = Rheo(SQLiteBackend(tmp_path / "diff.db", clock=clock, synchronous="NORMAL"))
    async with mem, sql:
        pairs: list[tuple[Lease, Lease]] = []

        async def both(op: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            outcomes = []
            for r in (mem, sql):
                try:
                    outcomes.append(("ok", await getattr(r, op)(*args, **kwargs)))
                except Exception as exc:  # the same error type on both sides
                    outcomes.append(("error", type(exc)))
            return outcomes[0], outcomes[1]

        async def same(op: str, *args: Any, **kwargs: Any) -> Any:
            a, b = await both(op, *args, **kwargs)
            assert a == b, (op, args, kwargs)
            return a[1]

        for stream, parts in (("s", 3), ("t", 1)):
            await same("create_stream", stream, partitions=parts)
        for step in range(120):
            stream = rng.choice(["s", "s", "t"])
            group = rng.choice(["g1", "g2"])
            choice = rng.random()
            where = (stream, group, step)
            if choice < 0.18:
                events = [NewEvent("t" if rng.random() < 0.5 else "u", {"step": step},
                                   id=f"id{rng.randrange(60)}" if rng.random() < 0.3 else None,
                                   key=rng.choice(["a", "b", "c", "d", None]))
                          for _ in range(rng.randint(1, 6))]
                # Generated ids and key-less routing are random: fix them for both sides.
                count = 3 if stream == "s" else 1
                events = [_with(e, id=e.id or f"{step}-{i}",
                                partition=None if e.key else rng.randrange(count))
                          for i, e in enumerate(events)]
                await same("append", stream, events)
            elif choice < 0.40:
                partitions: Any = "all" if stream == "t" or rng.random() < 0.6 else sorted(
                    rng.sample(range(3), rng.randint(1, 2)))
                kwargs = {"consumer_id": f"c{rng.randrange(2)}", "limit": rng.randint(1, 7),
                          "lease_ms": rng.choice([100, 1_000, 3_000]), "partitions": partitions}
                a, b = await mem.fetch(stream, group, **kwargs), await sql.fetch(
                    stream, group, **kwargs)
                assert [_lease_view(x) for x in a] == [_lease_view(x) for x in b], where
                pairs.extend(zip(a, b, strict=True))
            elif choice < 0.62 and pairs:
                chosen = rng.sample(pairs, min(len(pairs), rng.randint(1, 5)))
                chosen += rng.sample(chosen, 1) if rng.random() < 0.2 else []
                op = rng.choice(["ack", "ack", "nack", "reject", "renew"])
                extra: dict[str, Any] = {}
                args: tuple[Any, ...] = ()
                if op == "nack":
                    args = ("retry",)
                    extra = {"delay_ms": rng.choice([0, 0, 500])}
                elif op == "reject":
                    args = ("poison",)
                elif op == "renew":
                    extra = {"lease_ms": rng.choice([100, 2_000])}
                ra = await getattr(mem, op)([p[0] for p in chosen], *args, **extra)
                rb = await getattr(sql, op)([p[1] for p in chosen], *args, **extra)
                assert [_result_view(x) for x in ra] == [_result_view(x) for x in rb], (op, where)
            elif choice < 0.74:
                clock.advance(rng.choice([0, 50, 400, 1_000, 2_500]))
            elif choice < 0.78:
                await same("create_group", stream, group, max_attempts=rng.randint(1, 4))
            elif choice < 0.82:
                await same("replay", stream, group, from_sequence=rng.randint(1, 6))
            elif choice < 0.86:
                await same("reset", stream, group,
                           to=rng.choice(["earliest", "latest", rng.randint(0, 8)]))
            elif choice < 0.91:
                letters = await same("dead_letters", stream, group, limit=50)
                if isinstance(letters, list) and letters and rng.random() < 0.5:
                    await same("redrive", stream, group, rng.sample(letters, 1))
                else:
                    await same("redrive", stream, group)
            elif choice < 0.95:
                await same("trim", stream, up_to=rng.randint(0, 6), force=rng.random() < 0.5)
            else:
                await same("query_page", Query(stream=stream, key=rng.choice([None, "a"]),
                                               from_sequence=rng.choice([None, 2])), limit=4)
            for s in ("s", "t"):
                await same("stream_info", s)
                await same("groups", s)
                for g in ("g1", "g2"):
                    await same("frontier", s, g)
                    await same("dead_letters", s, g, limit=100)
            await same("query_page", Query(stream=stream), limit=1_000)


# Durability -------------------------------------------------------------------------


async def test_data_survives_reopen(db: Path, clock: ManualClock) -> None:
    async with Rheo(SQLiteBackend(db, clock=clock)) as r:
        await r.create_stream("s", partitions=2)
        written = await r.append("s", [NewEvent("t", {"n": i}, key=str(i)) for i in range(20)])
        leases = await r.fetch("s", "g", limit=8, lease_ms=60_000)
        await r.ack(leases[:5])
        await r.reject(leases[5:6], "bad")
    async with Rheo(SQLiteBackend(db, clock=clock)) as r:
        read = [e async for e in r.stream_query(Query(stream="s"))]
        assert sorted(read, key=lambda e: (e.partition, e.sequence)) == sorted(
            written, key=lambda e: (e.partition, e.sequence))
        # The leases taken before the restart still fence: 6..8 are inflight.
        assert (await r.ack(leases[6]))[0].ok
        assert (await r.ack(leases[0]))[0].repeated
        assert len(await r.dead_letters("s", "g")) == 1
        rest = await r.fetch("s", "g", limit=100)
        assert len(rest) == 20 - 8


async def test_data_survives_in_another_process(db: Path) -> None:
    async with Rheo(f"sqlite:///{db}") as r:
        await r.create_stream("s", partitions=2)
        await r.append("s", [NewEvent("t", {"n": i}, id=f"p-{i}") for i in range(10)])
        await r.ack(await r.fetch("s", "g", limit=4, lease_ms=60_000))
        frontier = await r.frontier("s", "g")
    seen = await _worker("report", str(db), "s", "g")
    assert sorted(seen["ids"]) == sorted(f"p-{i}" for i in range(10))
    assert {int(p): f for p, f in seen["frontier"].items()} == frontier

    appended = await _worker("append", str(db), "s", "5")
    assert len(appended["sequences"]) == 5
    async with Rheo(f"sqlite:///{db}") as r:
        ids = [e.id async for e in r.stream_query(Query(stream="s"))]
        assert sorted(ids) == sorted([f"p-{i}" for i in range(10)] + [f"child-{i}" for i in
                                                                     range(5)])


async def test_competing_processes_never_double_lease(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    total, workers = 3_000, 4
    async with Rheo(SQLiteBackend(db)) as r:
        await r.create_stream("jobs", partitions=4)
        await r.append("jobs", [NewEvent("job", {"n": i}, key=f"k{i}") for i in range(total)])
        await r.create_group("jobs", "workers")
        high = await r.high_water("jobs")
    assert sum(high.values()) == total
    ready = tmp_path / "ready"
    ready.mkdir()
    reports = await asyncio.gather(*(
        _worker("compete", str(db), "jobs", "workers", f"w{i}", str(ready), str(workers))
        for i in range(workers)
    ))

    leased = [(p, s) for rep in reports for p, s, _, _ in rep["leased"]]
    # Leases never expire, so every event is leased exactly once across all processes.
    assert len(leased) == total
    assert set(leased) == {(p, s) for p, n in high.items() for s in range(1, n + 1)}
    assert all(attempt == 1 for rep in reports for *_, attempt in rep["leased"])
    lease_ids = [lid for rep in reports for _, _, lid, _ in rep["leased"]]
    assert len(set(lease_ids)) == total
    acks = [(p, s) for rep in reports for p, s, ok, repeated in rep["acked"] if ok and not repeated]
    assert sorted(acks) == sorted(leased)
    assert sum(1 for rep in reports if rep["leased"]) >= 2  # they really competed
    async with Rheo(SQLiteBackend(db)) as r:
        assert await r.frontier("jobs", "workers") == high
        assert await r.fetch("jobs", "workers", limit=10) == []


# Schema, indexes and errors ------------------------------------------------------------


async def test_fetch_uses_partial_index_whatever_the_acked_count(db: Path) -> None:
    async with Rheo(SQLiteBackend(db, synchronous="NORMAL")) as r:
        await r.create_stream("s")
        await r.append("s", [NewEvent("t", i) for i in range(10_003)])
        await r.ack(await r.fetch("s", "g", limit=10_000))
        assert await r.frontier("s", "g") == {0: 10_000}
        # Nacked, the last 3 become delivery rows, eligible again at once.
        await r.nack(await r.fetch("s", "g", limit=10), "again")
        pending = await r.fetch("s", "g", limit=10, lease_ms=60_000)
        assert [lease.sequence for lease in pending] == [10_001, 10_002, 10_003]

    conn = sqlite3.connect(db)
    try:
        params = (1, 0, 2**62)
        plan = " ".join(row[3] for row in conn.execute(
            "EXPLAIN QUERY PLAN " + _sql.ELIGIBLE, params))
        assert "INDEX deliveries_due (group_id=? AND part=? AND <expr><?)" in plan
        assert "SCAN" not in plan
        (indexed,) = conn.execute(
            "SELECT count(*) FROM deliveries INDEXED BY deliveries_active "
            "WHERE state IN ('available', 'leased')").fetchone()
        assert indexed == 3

        # Work, not time: count SQLite VM instructions of the fetch scan. Walking the
        # 10,000 acked rows would take tens of thousands; the partial index takes few.
        steps = 0

        def count() -> int:
            nonlocal steps
            steps += 1
            return 0

        conn.set_progress_handler(count, 1)
        rows = conn.execute(_sql.ELIGIBLE, params).fetchall()
        conn.set_progress_handler(None, 1)
        assert [seq for _, seq, _ in rows] == [10_001, 10_002, 10_003]
        assert steps < 500, steps
    finally:
        conn.close()


async def test_schema_is_versioned_and_created_once(db: Path) -> None:
    first, second = SQLiteBackend(db), SQLiteBackend(db)
    await asyncio.gather(first.open(), second.open())
    await first.create_stream("s", 1)
    assert (await second.stream_info("s")).partitions == 1
    await asyncio.gather(first.close(), second.close())
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (
            sqlite_module.SCHEMA_VERSION,)
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        conn.execute("PRAGMA user_version = 99")
        conn.commit()
    finally:
        conn.close()
    with pytest.raises(BackendError, match="schema version 99"):
        await SQLiteBackend(db).open()


async def test_a_version_2_file_gains_last_error_in_place(db: Path) -> None:
    # A file as version 2 left it: a dead letter and a delivery waiting for redelivery.
    async with Rheo(SQLiteBackend(db)) as r:
        await r.create_stream("s")
        await r.append("s", [NewEvent("t", i) for i in range(2)])
        first, second = await r.fetch("s", "g", limit=2)
        await r.reject(first, "bad")
        await r.nack(second, "later")
    conn = sqlite3.connect(db)
    try:
        conn.execute("ALTER TABLE deliveries DROP COLUMN last_error")
        conn.execute("PRAGMA user_version = 2")
        conn.commit()
    finally:
        conn.close()
    async with Rheo(SQLiteBackend(db)) as r:
        [dead] = await r.dead_letters("s", "g")
        assert (dead.sequence, dead.reason, dead.last_error) == (1, "bad", None)
        [again] = await r.fetch("s", "g")
        assert all(x.ok for x in await r.reject(again, "worse", error="ValueError: v3"))
        assert [(d.sequence, d.last_error) for d in await r.dead_letters("s", "g")] == [
            (1, None), (2, "ValueError: v3")]
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (
            sqlite_module.SCHEMA_VERSION,)
    finally:
        conn.close()


async def test_backends_opening_a_new_file_at_once_all_open(tmp_path: Path) -> None:
    # Switching a new file to WAL does not wait on SQLite's busy handler: before the
    # retry, two backends opening one new file at once failed about half the time.
    for i in range(20):
        backends = [SQLiteBackend(tmp_path / f"new-{i}.db") for _ in range(4)]
        try:
            await asyncio.gather(*(b.open() for b in backends))
            await backends[0].create_stream("s", 1)
            assert await backends[3].list_streams() == ["s"]
        finally:
            await asyncio.gather(*(b.close() for b in backends))


async def test_unopenable_path_is_backend_unavailable(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="cannot open SQLite database"):
        await SQLiteBackend(tmp_path / "missing-dir" / "x.db").open()


async def test_close_and_reopen_on_use(db: Path) -> None:
    backend = SQLiteBackend(db)
    await backend.create_stream("s", 1)  # opens on first use
    await backend.close()
    await backend.close()
    assert await backend.list_streams() == ["s"]
    await backend.close()


async def test_memory_database() -> None:
    backend = SQLiteBackend.from_url("sqlite:///:memory:")
    async with Rheo(backend) as r:
        await r.create_stream("s")
        await r.append("s", NewEvent("t", 1))
        assert len(await r.fetch("s", "g")) == 1
    # A private database per connection: reopened, it is empty.
    assert await backend.list_streams() == []
    await backend.close()


async def test_locked_database_classifies_as_failed(db: Path) -> None:
    async with Rheo(SQLiteBackend(db, busy_timeout_ms=0)) as r:
        await r.create_stream("s")
        await r.append("s", NewEvent("t"))
        leases = await r.fetch("s", "g")
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        try:
            [result] = await r.ack(leases)
            assert result.kind is SettleKind.FAILED
            assert "locked" in result.error.reason  # type: ignore[union-attr]
        finally:
            other.execute("ROLLBACK")
            other.close()
        # Nothing was committed: the lease still settles.
        assert (await r.ack(leases))[0].ok


def test_classify_error() -> None:
    backend = SQLiteBackend(":memory:")
    assert backend.classify_error(sqlite3.OperationalError("database is locked")) is (
        SettleKind.FAILED)
    assert backend.classify_error(sqlite3.OperationalError("disk I/O error")) is (
        SettleKind.AMBIGUOUS)
    assert backend.classify_error(sqlite3.OperationalError("unable to open database file")) is (
        SettleKind.BACKEND_UNAVAILABLE)
    assert backend.classify_error(
        sqlite3.ProgrammingError("Cannot operate on a closed database.")
    ) is SettleKind.BACKEND_UNAVAILABLE
    assert backend.classify_error(ValueError("x")) is None


async def test_migrate_false_opens_existing_databases_only(tmp_path: Path) -> None:
    missing = tmp_path / "typo.db"
    with pytest.raises(BackendError, match="does not exist"):
        await SQLiteBackend.from_url(f"sqlite:///{missing}?migrate=false").open()
    assert not missing.exists()

    foreign = tmp_path / "foreign.db"
    conn = sqlite3.connect(foreign)
    conn.execute("CREATE TABLE mine (x)")
    conn.close()
    with pytest.raises(BackendError, match=r"no rheo_flow schema.*rheo-flow migrate"):
        await SQLiteBackend(foreign, migrate=False).open()
    conn = sqlite3.connect(foreign)
    try:  # untouched: no rheo_flow table, not switched to WAL
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert tables == {"mine"}
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    finally:
        conn.close()

    ours = tmp_path / "ours.db"
    async with Rheo(SQLiteBackend(ours)) as rheo:
        await rheo.create_stream("s")
    async with Rheo(f"sqlite:///{ours}?migrate=false") as rheo:
        assert await rheo.streams() == ["s"]
    with pytest.raises(InvalidArgument, match="true or false"):
        SQLiteBackend.from_url(f"sqlite:///{ours}?migrate=maybe")


async def test_migrate_false_takes_no_write_lock_and_refuses_a_newer_schema(
        tmp_path: Path) -> None:
    ours = tmp_path / "ours.db"
    async with Rheo(SQLiteBackend(ours)) as rheo:
        await rheo.create_stream("s")
    writer = sqlite3.connect(ours, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # a writer mid-transaction
        async with Rheo(SQLiteBackend(ours, migrate=False, busy_timeout_ms=100)) as rheo:
            assert await rheo.streams() == ["s"]
        writer.execute("PRAGMA user_version = 99")
        writer.execute("COMMIT")
    finally:
        writer.close()
    with pytest.raises(BackendError, match="schema version 99, newer"):
        await SQLiteBackend(ours, migrate=False).open()


def test_the_statements_name_the_blocked_marker_of_the_code() -> None:
    # statements.sql names the marker once (its piece "blocked") and splices it in as
    # the literal, so every statement that stores or finds blocked deliveries uses
    # BLOCKED_MS, the value the code documents.
    for statement in (_sql.STORE_BLOCKED, _sql.RELEASE_KEY, _sql.HAS_BLOCKED,
                      _sql.RELEASE_HEADS):
        assert "{blocked}" not in statement
        assert str(BLOCKED_MS) in statement
