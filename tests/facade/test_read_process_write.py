"""Read, process, write exactly once: ``Rheo.transaction(conn, leases)`` acks the leases,
the application's rows and the derived events in one commit, or none of them
(docs/outbox.md). Real PostgreSQL and SQLite, no mocks; a Group handler returning
SETTLED and a Pipeline batcher confirming its messages settle nothing twice."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from _outbox_app import App
from rheo_flow import (
    SETTLED,
    BackendError,
    Consumer,
    Event,
    Group,
    InvalidArgument,
    NewEvent,
    Rheo,
    SettleOutcome,
    StaleLease,
    current_lease,
)
from rheo_flow.backends import SQLiteBackend
from rheo_flow.pipeline import Batcher, Message, Pipeline, PipelineHandler, confirm_settled


@pytest.fixture(params=["sqlite", "postgres"])
async def app(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[App]:
    if request.param == "sqlite":
        path = str(tmp_path / "app.db")
        yield App("sqlite", f"sqlite:///{path}", path)
        return
    url: str = request.getfixturevalue("postgres_url")
    schema: str = request.getfixturevalue("postgres_schema")
    yield App("postgres", f"{url}?schema={schema}", url, schema)


@pytest.fixture
async def rheo(app: App) -> AsyncIterator[Rheo]:
    backend: Any = SQLiteBackend(app.target) if app.kind == "sqlite" else app.url
    async with Rheo(backend) as r:
        await r.create_stream("orders", partitions=2)
        await r.create_stream("invoices")
        await app.create_table()
        yield r


@pytest.fixture
async def conn(app: App, rheo: Rheo) -> AsyncIterator[Any]:
    c = await app.connect()
    yield c
    await app.close(c)


async def _orders(rheo: Rheo, count: int) -> None:
    await rheo.append("orders", [NewEvent("order.placed", {"n": i}, id=f"o-{i}", key=f"k{i}")
                                 for i in range(count)])


async def _invoices(rheo: Rheo) -> list[str]:
    return [e.id async for e in rheo.stream_query(_query("invoices"))]


def _query(stream: str) -> Any:
    from rheo_flow import Query
    return Query(stream=stream)


# The helper ---------------------------------------------------------------------------


async def test_acks_rows_and_derived_events_commit_together(
        app: App, rheo: Rheo, conn: Any) -> None:
    await _orders(rheo, 3)
    leases = await rheo.fetch("orders", "billing", limit=3)
    async with rheo.transaction(conn, leases) as tx:
        for lease in leases:
            await app.write(conn, lease.event.id)
            await tx.append("invoices", NewEvent("invoice.due", id=f"inv-{lease.event.id}"))
        assert await _invoices(rheo) == []  # nothing visible before the commit
    assert [r.ok for r in tx.results] == [True] * 3
    assert [e.id for e in tx.events] == ["inv-o-0", "inv-o-1", "inv-o-2"]
    assert await app.effects() == ["o-0", "o-1", "o-2"]
    assert sorted(await _invoices(rheo)) == ["inv-o-0", "inv-o-1", "inv-o-2"]
    assert await rheo.lag("orders", "billing") == {0: 0, 1: 0}


async def test_a_stale_lease_rolls_the_whole_transaction_back(
        app: App, rheo: Rheo, conn: Any) -> None:
    await _orders(rheo, 2)
    leases = await rheo.fetch("orders", "billing", limit=2)
    # The first one goes back and another consumer takes it: ours is stale now.
    await rheo.nack(leases[0], "elsewhere")
    [again] = await rheo.fetch("orders", "billing", consumer_id="other")

    async def step() -> None:
        async with rheo.transaction(conn, leases) as tx:
            for lease in leases:
                await app.write(conn, lease.event.id)
            await tx.append("invoices", NewEvent("invoice.due", id="inv"))

    with pytest.raises(StaleLease, match=r"1 of 2 leases lost .*rolled back") as caught:
        await step()
    assert [lease.lease_id for lease in caught.value.leases] == [leases[0].lease_id]
    assert caught.value.kind == "stale_lease"
    assert [r.ok for r in caught.value.results] == [False, True]
    # Never half: no row, no derived event, and the live lease's ack rolled back too.
    assert await app.effects() == []
    assert await _invoices(rheo) == []
    assert await rheo.frontier("orders", "billing") in ({0: 0, 1: 0}, {})
    assert (await rheo.ack(again))[0].ok  # the new holder settles it
    [live] = await rheo.ack(leases[1])
    assert live.ok
    assert not live.repeated


async def test_an_error_in_the_block_rolls_back(app: App, rheo: Rheo, conn: Any) -> None:
    await _orders(rheo, 1)
    [lease] = await rheo.fetch("orders", "billing")

    async def step() -> None:
        async with rheo.transaction(conn, lease) as tx:
            await app.write(conn, lease.event.id)
            await tx.append("invoices", NewEvent("invoice.due"))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await step()
    assert await app.effects() == []
    assert await _invoices(rheo) == []
    assert (await rheo.ack(lease))[0].repeated is False  # not acked by the rollback


async def test_inside_the_callers_transaction_a_stale_lease_dooms_it(
        app: App, rheo: Rheo, conn: Any) -> None:
    """Joined: the caller commits. Even if it swallowed the StaleLease and committed,
    nothing of the transaction is kept."""
    await _orders(rheo, 1)
    [lease] = await rheo.fetch("orders", "billing")
    await rheo.nack(lease, "elsewhere")
    await app.execute(conn, "BEGIN")
    await app.write(conn, "before")
    with pytest.raises(StaleLease):
        async with rheo.transaction(conn, lease) as tx:
            await tx.append("invoices", NewEvent("invoice.due"))
    await app.execute(conn, "COMMIT") if app.kind == "postgres" else conn.commit()
    assert await app.effects() == []
    assert await _invoices(rheo) == []


async def test_inside_the_callers_transaction_the_caller_commits(
        app: App, rheo: Rheo, conn: Any) -> None:
    await _orders(rheo, 1)
    [lease] = await rheo.fetch("orders", "billing")
    await app.execute(conn, "BEGIN")
    async with rheo.transaction(conn, lease) as tx:
        await app.write(conn, lease.event.id)
        await tx.append("invoices", NewEvent("invoice.due", id="inv"))
    assert await app.effects() == []  # not committed yet: the caller's
    await app.execute(conn, "COMMIT")
    assert await app.effects() == ["o-0"]
    assert await _invoices(rheo) == ["inv"]


async def test_bad_arguments_are_refused(rheo: Rheo, conn: Any) -> None:
    with pytest.raises(InvalidArgument, match="Lease objects"):
        rheo.transaction(conn, ["not a lease"])  # type: ignore[list-item]
    with pytest.raises(InvalidArgument, match="connection"):
        rheo.transaction(None, [])
    tx = rheo.transaction(conn)
    with pytest.raises(InvalidArgument, match="not open"):
        await tx.append("invoices", NewEvent("t"))


async def test_a_backend_without_in_transaction_refuses() -> None:
    async with Rheo("memory://") as rheo:
        with pytest.raises(InvalidArgument, match="in_transaction"):
            rheo.transaction(object(), [])


# The runtimes -------------------------------------------------------------------------


class Billing(Consumer):
    """Writes one effect row and one invoice per order, in one transaction."""

    stream = "orders"
    group = "billing"

    def __init__(self, rheo: Rheo, app: App, steal: bool = False) -> None:
        super().__init__()
        self.rheo, self.app, self.steal = rheo, app, steal

    async def handle_event(self, event: Event, context: Any) -> Any:
        lease = current_lease()
        if self.steal and lease.attempt == 1:
            await self.rheo.nack(lease, "taken elsewhere")  # ours goes stale
        conn = await self.app.connect()
        try:
            async with self.rheo.transaction(conn, lease) as tx:
                await self.app.write(conn, event.id)
                await tx.append("invoices", NewEvent("invoice.due", id=f"inv-{event.id}"))
        finally:
            await self.app.close(conn)
        return SETTLED


async def test_a_group_handler_settling_in_its_transaction_is_not_acked_again(
        app: App, rheo: Rheo) -> None:
    await _orders(rheo, 6)
    outcomes: list[SettleOutcome] = []
    group = Group(rheo, Billing(rheo, app), observer=outcomes.append, concurrency=2)
    assert await group.run_until_empty(timeout=30)
    assert group.stats.acked == 6
    assert outcomes == []  # no settle call of the runtime's: each was acked once
    assert await app.effects() == [f"o-{i}" for i in range(6)]
    assert len(await _invoices(rheo)) == 6


async def test_a_group_handler_losing_its_lease_settles_nothing(app: App, rheo: Rheo) -> None:
    await _orders(rheo, 2)
    outcomes: list[SettleOutcome] = []
    group = Group(rheo, Billing(rheo, app, steal=True), observer=outcomes.append)
    assert await group.run_until_empty(timeout=30)
    # Each event: a first attempt whose transaction found its lease stale (released, no
    # nack of the runtime's), then the redelivery, settled in its transaction.
    assert [o.op for o in outcomes] == []
    assert group.stats.settle_failures["stale_lease"] == 2
    assert group.stats.handler_errors == 0
    assert await app.effects() == ["o-0", "o-1"]
    assert sorted(await _invoices(rheo)) == ["inv-o-0", "inv-o-1"]


class BatchBilling(PipelineHandler):
    """A batcher writing a batch's effects and invoices in one transaction."""

    def __init__(self, rheo: Rheo, app: App) -> None:
        self.rheo, self.app = rheo, app

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: Any,
                           context: Any) -> list[Message]:
        conn = await self.app.connect()
        try:
            async with self.rheo.transaction(conn, [m.lease for m in messages]) as tx:
                for m in messages:
                    await self.app.write(conn, m.lease.event.id)
                await tx.append("invoices", [NewEvent("invoice.due", id=f"inv-{m.lease.event.id}")
                                             for m in messages])
        finally:
            await self.app.close(conn)
        confirm_settled(messages)
        return messages


async def test_a_pipeline_batcher_settles_its_batch_in_its_transaction(
        app: App, rheo: Rheo) -> None:
    await _orders(rheo, 10)
    pipeline = Pipeline(rheo, stream="orders", group="billing",
                        handler=BatchBilling(rheo, app),
                        batchers={"default": Batcher(batch_size=4, batch_timeout=0.05)})
    assert await pipeline.run_until_empty(timeout=30)
    assert pipeline.producer.stats().confirmed == 10
    assert pipeline.producer.stats().acked == 0  # nothing acked twice
    assert await app.effects() == sorted(f"o-{i}" for i in range(10))
    assert len(await _invoices(rheo)) == 10


class StealingBatchBilling(BatchBilling):
    """The first batch's first lease goes stale before its transaction (another
    consumer takes the event)."""

    stolen: str | None = None

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: Any,
                           context: Any) -> list[Message]:
        if self.stolen is None:
            self.stolen = messages[0].lease.lease_id
            await self.rheo.nack(messages[0].lease, "taken elsewhere")
        return await super().handle_batch(batcher, messages, batch_info, context)


async def test_a_pipeline_batch_losing_a_lease_rolls_back_and_releases_it(
        app: App, rheo: Rheo) -> None:
    await _orders(rheo, 4)
    handler = StealingBatchBilling(rheo, app)
    pipeline = Pipeline(rheo, stream="orders", group="billing", handler=handler,
                        batchers={"default": Batcher(batch_size=4, batch_timeout=0.5)},
                        retry_delay_ms=0)
    assert await pipeline.run_until_empty(timeout=30)
    stats = pipeline.producer.stats()
    # The batch: rolled back; its stale lease released unsettled, the 3 others nacked.
    assert stats.nacked == 3
    assert stats.confirmed == 4 + 1  # the 4 settled in transactions later, the stale one
    assert stats.acked == 0
    assert await app.effects() == [f"o-{i}" for i in range(4)]
    assert len(await _invoices(rheo)) == 4


async def test_concurrent_handlers_on_sqlite_do_not_deadlock(app: App, rheo: Rheo) -> None:
    """Several handlers' transactions at once: each takes the write lock in turn."""
    await _orders(rheo, 8)
    group = Group(rheo, Billing(rheo, app), concurrency=4)
    assert await asyncio.wait_for(group.run_until_empty(timeout=30), 60)
    assert len(await app.effects()) == 8


# SQLAlchemy -----------------------------------------------------------------------------


async def test_an_async_session_commits_the_acks_with_its_writes(
        postgres_url: str, postgres_schema: str) -> None:
    from sqlalchemy import text
    from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine

    app = App("postgres", f"{postgres_url}?schema={postgres_schema}", postgres_url,
              postgres_schema)
    engine = create_async_engine(postgres_url.replace("postgresql://", "postgresql+asyncpg://"))
    try:
        async with Rheo(app.url) as rheo:
            await rheo.create_stream("orders")
            await rheo.create_stream("invoices")
            await app.create_table()
            await _orders(rheo, 2)
            first, second = await rheo.fetch("orders", "billing", limit=2)
            async with async_sessionmaker(engine)() as session:
                with pytest.raises(InvalidArgument, match=r"session\.begin\(\)"):
                    async with rheo.transaction(session, first):
                        pass
                async with session.begin(), rheo.transaction(session, first) as tx:
                    await session.execute(text(f"INSERT INTO {app.table} VALUES ('o-0')"))
                    await tx.append("invoices", NewEvent("invoice.due", id="inv-o-0"))
                await rheo.nack(second, "elsewhere")

                async def stale() -> None:
                    async with session.begin(), rheo.transaction(session, second) as tx:
                        await session.execute(text(f"INSERT INTO {app.table} VALUES ('o-1')"))
                        await tx.append("invoices", NewEvent("invoice.due", id="inv-o-1"))

                with pytest.raises(StaleLease):
                    await stale()
            assert await app.effects() == ["o-0"]
            assert await _invoices(rheo) == ["inv-o-0"]
    finally:
        await engine.dispose()


# What an open transaction holds (PostgreSQL) -------------------------------------------


async def test_an_open_read_process_write_transaction_holds_only_its_partition(
        postgres_url: str, postgres_schema: str, postgres_admin: Any) -> None:
    """Inside the caller's transaction, once the helper appended to partition 0 and acked
    a lease of partition 0: appends and acks elsewhere, fetches and reads complete; an
    append to that partition and an ack of the same group's partition wait for the
    commit (docs/outbox.md, "Cost and contention")."""
    app = App("postgres", f"{postgres_url}?schema={postgres_schema}", postgres_url,
              postgres_schema)
    async with Rheo(app.url) as rheo:
        await rheo.create_stream("orders", partitions=2)
        await rheo.create_stream("invoices", partitions=2)
        await rheo.create_stream("other")
        await app.create_table()
        await rheo.append("orders", [NewEvent("t", partition=p) for p in (0, 0, 1)])
        held, waiting = await rheo.fetch("orders", "billing", limit=2, partitions=[0])
        [elsewhere] = await rheo.fetch("orders", "billing", partitions=[1])
        conn = await app.connect()
        try:
            async with conn.transaction():
                async with rheo.transaction(conn, held) as tx:
                    await app.write(conn, held.event.id)
                    await tx.append("invoices", NewEvent("invoice.due"), partition=0)
                assert tx.results[0].ok  # acked, not committed yet
                done = await asyncio.wait_for(asyncio.gather(
                    rheo.append("invoices", NewEvent("t"), partition=1),
                    rheo.append("other", NewEvent("t")),
                    rheo.ack(elsewhere),
                    rheo.fetch("orders", "other-group", limit=10),
                    rheo.fetch("orders", "billing", limit=10),
                    rheo.stream_info("invoices")), 30)
                assert done[2][0].ok
                same = [asyncio.create_task(rheo.append("invoices", NewEvent("t"),
                                                        partition=0)),
                        asyncio.create_task(rheo.ack(waiting))]
                await _blocked_by(postgres_admin, conn.get_server_pid(), 2)
                assert not any(task.done() for task in same)
            appended, [acked] = await asyncio.wait_for(asyncio.gather(*same), 30)
            assert appended[0].sequence == 2
            assert acked.ok
        finally:
            await app.close(conn)


async def _blocked_by(admin: Any, pid: int, count: int) -> None:
    """Wait until ``count`` sessions wait for a lock the session ``pid`` holds."""
    deadline = asyncio.get_running_loop().time() + 5
    while await admin.fetchval("SELECT count(*) FROM pg_stat_activity "
                               "WHERE $1 = ANY(pg_blocking_pids(pid))", pid) != count:
        assert asyncio.get_running_loop().time() < deadline, f"not {count} blocked"
        await asyncio.sleep(0.01)


async def test_a_sqlite_session_acks_its_lease_with_its_writes(tmp_path: Path) -> None:
    from sqlalchemy import create_engine, text
    from sqlalchemy.orm import Session

    path = str(tmp_path / "app.db")
    app = App("sqlite", f"sqlite:///{path}", path)
    async with Rheo(SQLiteBackend(path)) as rheo:
        await rheo.create_stream("orders")
        await rheo.create_stream("invoices")
        await app.create_table()
        await _orders(rheo, 1)
        [lease] = await rheo.fetch("orders", "billing")
        engine = create_engine(f"sqlite:///{path}")
        try:
            with Session(engine) as session, session.begin():
                # pysqlite begins at the first write: write first (docs/outbox.md).
                session.execute(text("INSERT INTO effects VALUES ('o-0')"))
                async with rheo.transaction(session, lease) as tx:
                    await tx.append("invoices", NewEvent("invoice.due", id="inv-o-0"))
            assert tx.results[0].ok
        finally:
            engine.dispose()
        assert await app.effects() == ["o-0"]
        assert await _invoices(rheo) == ["inv-o-0"]
        assert await rheo.lag("orders", "billing") == {0: 0}


async def test_an_ack_failing_otherwise_raises_its_backend_error(
        postgres_url: str, postgres_schema: str, postgres_admin: Any) -> None:
    """The application's connection dies inside the block: the ack fails (not stale),
    nothing is committed, and the error is a BackendError of the ack's kind."""
    app = App("postgres", f"{postgres_url}?schema={postgres_schema}", postgres_url,
              postgres_schema)
    async with Rheo(app.url) as rheo:
        await rheo.create_stream("orders")
        await rheo.create_stream("invoices")
        await app.create_table()
        await _orders(rheo, 1)
        [lease] = await rheo.fetch("orders", "billing")
        conn = await app.connect()

        async def step() -> None:
            async with rheo.transaction(conn, lease) as tx:
                await app.write(conn, lease.event.id)
                await tx.append("invoices", NewEvent("invoice.due"))
                await postgres_admin.execute("SELECT pg_terminate_backend($1)",
                                             conn.get_server_pid())

        try:
            with pytest.raises(BackendError) as caught:
                await step()
        finally:
            await app.close(conn)
        assert not isinstance(caught.value, StaleLease)
        assert caught.value.kind in ("backend_unavailable", "ambiguous", "failed")
        assert await app.effects() == []
        assert await _invoices(rheo) == []
        [acked] = await rheo.ack(lease)  # the lease is still ours: nothing was acked
        assert acked.ok
        assert not acked.repeated
