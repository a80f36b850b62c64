"""The MongoDB backend beyond the conformance kit: URLs, probing, both client types,
change streams across processes, transactions vs. standalone appends, races between
backend objects (as between processes) and error classification.

Runs against ``RHEO_MONGO_URL`` (default: the emulator ``.ci/mongo-emulator.sh`` starts);
every test works in collections of its own prefix, dropped afterwards (the ``backends``
fixture of tests/backends/mongo/conftest.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from pymongo import AsyncMongoClient
from pymongo import errors as mongo_errors

from _mongo_backends import Backends, fresh_prefix
from rheo_flow import (
    BackendError,
    BackendUnavailable,
    InvalidArgument,
    Lease,
    NewEvent,
    OutcomeUnknown,
    Query,
    Rheo,
)
from rheo_flow._backends._urls import backend_from_url
from rheo_flow._model._settle_results import SettleKind, classify
from rheo_flow.backends import MongoBackend

WaitUntil = Callable[..., Awaitable[None]]


@pytest.fixture(scope="module")
def replica_set(mongo_url: str) -> bool:
    """Whether the test server has transactions and change streams (not a standalone)."""
    from pymongo import MongoClient

    client: MongoClient[dict[str, Any]] = MongoClient(mongo_url)
    try:
        hello = client.admin.command("hello")
    finally:
        client.close()
    return bool(hello.get("setName")) or hello.get("msg") == "isdbgrid"


@pytest.fixture
def needs_replica_set(replica_set: bool) -> None:
    """Skip on a standalone server (no transactions, no change streams)."""
    if not replica_set:
        pytest.skip("the MongoDB test server is a standalone: no transactions or change streams")


# URLs and construction -------------------------------------------------------------


def test_from_url_database_and_prefix() -> None:
    backend = MongoBackend.from_url(
        "mongodb://app:s3cret@db.example:27018/orders?collection_prefix=ev_&retryWrites=true")
    assert (backend.database_name, backend.collection_prefix) == ("orders", "ev_")
    # PyMongo's own options reach it verbatim; ours does not.
    assert backend._url == "mongodb://app:s3cret@db.example:27018/orders?retryWrites=true"
    default = MongoBackend.from_url("mongodb://db.example")
    assert (default.database_name, default.collection_prefix) == ("rheo", "rheo_")
    srv = backend_from_url("mongodb+srv://cluster.example/x")
    assert isinstance(srv, MongoBackend)
    assert srv.database_name == "x"


@pytest.mark.parametrize(("build", "needle"), [
    (lambda: MongoBackend("redis://u:s3cret@h/0"), "not a MongoDB URL"),
    (lambda: MongoBackend("mongodb://u:s3cret@/db"), "names no host"),
    (lambda: MongoBackend(), "exactly one"),
    (lambda: MongoBackend("mongodb://h", client=object()), "exactly one"),
    (lambda: MongoBackend(client=object()), "AsyncMongoClient"),
    (lambda: MongoBackend("mongodb://h", collection_prefix="a$b"), "collection_prefix"),
    (lambda: MongoBackend("mongodb://h/bad.name"), "database name"),
    (lambda: MongoBackend("mongodb://h", transactions="yes"), "transactions"),  # type: ignore[arg-type]
])
def test_bad_construction_is_invalid_argument(build: Callable[[], Any], needle: str) -> None:
    with pytest.raises(InvalidArgument, match=needle) as info:
        build()
    assert "s3cret" not in str(info.value)


async def test_unreachable_server_is_backend_unavailable_without_password() -> None:
    # Port 1 on the loopback: nothing listens, the connection is refused at once.
    backend = MongoBackend(
        "mongodb://app:hunter2@127.0.0.1:1/rheo?serverSelectionTimeoutMS=200")
    with pytest.raises(BackendUnavailable) as info:
        await backend.open()
    assert "hunter2" not in str(info.value)
    assert "127.0.0.1:1" in str(info.value)
    assert classify(info.value, backend.classify_error).kind is SettleKind.BACKEND_UNAVAILABLE


async def test_malformed_url_is_invalid_argument_at_open() -> None:
    with pytest.raises(InvalidArgument, match="invalid MongoDB URL") as info:
        await MongoBackend("mongodb://app:s3cret@127.0.0.1:99999/rheo").open()
    assert "s3cret" not in str(info.value)


async def test_settle_against_unreachable_server_is_classified(backends: Backends) -> None:
    async with Rheo(backends.make()) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", NewEvent("t"))
        [lease] = await rheo.fetch("s", "g")
    # Not opened: the backend opens on first use, and that fails.
    down = Rheo(MongoBackend("mongodb://127.0.0.1:1/rheo?serverSelectionTimeoutMS=200"))
    [result] = await down.ack(lease)
    assert result.kind is SettleKind.BACKEND_UNAVAILABLE


@pytest.mark.parametrize(("exc", "kind"), [
    (mongo_errors.ServerSelectionTimeoutError("no server"), SettleKind.BACKEND_UNAVAILABLE),
    (mongo_errors.ConfigurationError("bad srv"), SettleKind.BACKEND_UNAVAILABLE),
    (mongo_errors.InvalidOperation("Cannot use AsyncMongoClient after close"),
     SettleKind.BACKEND_UNAVAILABLE),
    (mongo_errors.NotPrimaryError("not primary"), SettleKind.BACKEND_UNAVAILABLE),
    (mongo_errors.OperationFailure("not writable primary", 10107),
     SettleKind.BACKEND_UNAVAILABLE),
    (mongo_errors.OperationFailure("auth failed", 18), SettleKind.BACKEND_UNAVAILABLE),
    (mongo_errors.AutoReconnect("connection closed"), SettleKind.AMBIGUOUS),
    (mongo_errors.NetworkTimeout("timed out"), SettleKind.AMBIGUOUS),
    (mongo_errors.ExecutionTimeout("operation exceeded time limit", 50), SettleKind.AMBIGUOUS),
    (mongo_errors.WTimeoutError("waiting for replication timed out", 64),
     SettleKind.AMBIGUOUS),
    (mongo_errors.OperationFailure("interrupted due to repl state change", 11602),
     SettleKind.AMBIGUOUS),
    (mongo_errors.OperationFailure(
        "commit result unknown", 50, {"errorLabels": ["UnknownTransactionCommitResult"]}),
     SettleKind.AMBIGUOUS),
    (mongo_errors.BulkWriteError({"writeErrors": [], "writeConcernErrors": [{"code": 64}]}),
     SettleKind.AMBIGUOUS),
    (mongo_errors.DuplicateKeyError("E11000 duplicate key", 11000), SettleKind.FAILED),
    (mongo_errors.WriteError("document failed validation", 121), SettleKind.FAILED),
    (mongo_errors.BulkWriteError({"writeErrors": [{"index": 0, "code": 11000}]}),
     SettleKind.FAILED),
    (mongo_errors.OperationFailure(
        "write conflict", 112, {"errorLabels": ["TransientTransactionError"]}),
     SettleKind.FAILED),
])
def test_classify_error(exc: BaseException, kind: SettleKind) -> None:
    backend = MongoBackend("mongodb://h")
    assert backend.classify_error(exc) is kind
    assert classify(exc, backend.classify_error).kind is kind


def test_classify_error_leaves_other_errors_to_the_generic_rules() -> None:
    assert MongoBackend("mongodb://h").classify_error(ValueError("x")) is None


# Open: indexes, probes, capabilities ----------------------------------------------------


async def test_open_creates_indexes_and_probes_the_server(
    backends: Backends, replica_set: bool
) -> None:
    backend = backends.make()
    assert backend.capabilities.push_wakeups is False  # conservative until opened
    await backend.open()
    await backend.open()  # idempotent
    caps = backend.capabilities
    assert (caps.durable, caps.distributed, caps.fenced_settle) == (True, True, True)
    # A replica set (the emulator reports itself as one) has both features.
    assert caps.push_wakeups is replica_set
    assert backend.transactions is replica_set
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(backends.url)
    try:
        db = client.get_database(backend.database_name)
        events = await db[f"{backends.prefix}events"].index_information()
        deliveries = await db[f"{backends.prefix}deliveries"].index_information()
        groups = await db[f"{backends.prefix}groups"].index_information()
    finally:
        await client.close()
    assert events["stream_partition_sequence"].get("unique") is True
    assert events["stream_event_id"].get("unique") is True
    assert groups["stream_group"].get("unique") is True
    assert deliveries["group_partition_sequence"].get("unique") is True
    assert {"active", "rejected"} <= set(deliveries)


async def test_features_can_be_turned_off(backends: Backends) -> None:
    backend = backends.make(transactions=False, change_streams=False)
    async with Rheo(backend) as rheo:
        assert backend.transactions is False
        assert rheo.capabilities.push_wakeups is False
        await rheo.create_stream("s")
        assert await rheo.wait_for_append("s", 0.05) is False


async def test_newer_schema_is_refused(backends: Backends) -> None:
    await backends.make().open()
    client: AsyncMongoClient[dict[str, Any]] = AsyncMongoClient(backends.url)
    try:
        db = client.get_database(backends.make().database_name)
        await db[f"{backends.prefix}meta"].update_one({"_id": "schema"}, {"$set": {"v": 99}})
    finally:
        await client.close()
    with pytest.raises(BackendError, match="schema version 99"):
        await backends.make().open()


@pytest.mark.parametrize("kind", ["pymongo", "motor"])
async def test_host_owned_client_is_not_closed(mongo_url: str, kind: str) -> None:
    client: Any
    if kind == "motor":
        from motor.motor_asyncio import AsyncIOMotorClient

        client = AsyncIOMotorClient(mongo_url)
    else:
        client = AsyncMongoClient(mongo_url)
    prefix = fresh_prefix()
    backend = MongoBackend(client=client, collection_prefix=prefix)
    try:
        async with Rheo(backend) as rheo:
            await rheo.create_stream("s", partitions=2)
            [event] = await rheo.append("s", NewEvent("t", {"via": kind}, key="k"))
            [lease] = await rheo.fetch("s", "g")
            assert lease.event == event
            assert (await rheo.ack(lease))[0].ok
        # The backend is closed; the host's client still works.
        assert (await client.admin.command("ping"))["ok"] == 1
    finally:
        await MongoBackend(client=client, collection_prefix=prefix).drop_all()
        if kind == "motor":
            client.close()
        else:
            await client.close()


# Change streams --------------------------------------------------------------------------


async def test_change_stream_wakes_a_waiter_in_another_process(
    backends: Backends, needs_replica_set: None
) -> None:
    waiting, writing = backends.make(), backends.make()
    async with Rheo(waiting) as a, Rheo(writing) as b:
        await a.create_stream("s")
        waiter = asyncio.create_task(a.wait_for_append("s", 10.0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        try:
            # The watcher starts with the first wait: append until it has seen one.
            while not waiter.done():
                assert loop.time() < deadline, "no wake-up through the change stream"
                await b.append("s", NewEvent("t"))
                await asyncio.wait({waiter}, timeout=0.05)
            assert waiter.result() is True
            # An append to another stream does not wake a waiter of "s".
            await a.create_stream("other")
            quiet = asyncio.create_task(a.wait_for_append("s", 0.3))
            await b.append("other", NewEvent("t"))
            assert await quiet is False
        finally:
            waiter.cancel()


async def test_change_stream_with_motor_client(
    backends: Backends, needs_replica_set: None
) -> None:
    waiting, writing = backends.motor(), backends.make()
    async with Rheo(waiting) as a, Rheo(writing) as b:
        assert a.capabilities.push_wakeups is True
        await a.create_stream("s")
        waiter = asyncio.create_task(a.wait_for_append("s", 10.0))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        try:
            while not waiter.done():
                assert loop.time() < deadline, "no wake-up through the Motor change stream"
                await b.append("s", NewEvent("t"))
                await asyncio.wait({waiter}, timeout=0.05)
            assert waiter.result() is True
        finally:
            waiter.cancel()


async def test_close_releases_waiters(
    backends: Backends, wait_until: WaitUntil, needs_replica_set: None
) -> None:
    backend = backends.make()
    rheo = Rheo(backend)
    await rheo.open()
    await rheo.create_stream("s")
    waiter = asyncio.create_task(rheo.wait_for_append("s", 30.0))
    await wait_until(lambda: "s" in backend._waiters, message="waiter registered")
    await rheo.close()
    assert await asyncio.wait_for(waiter, 5.0) is True


# Appends: transactions and the standalone path ------------------------------------------


class _Failing:
    """A collection whose next ``method`` call raises ``exc`` instead of running.

    Stands in for a process dying (or a connection breaking) at that point.
    """

    def __init__(self, inner: Any, method: str, exc: BaseException) -> None:
        self._inner, self._method, self._exc = inner, method, exc
        self.armed = True

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name != self._method or not self.armed:
            return attr

        async def fail(*args: Any, **kwargs: Any) -> Any:
            self.armed = False
            raise self._exc

        return fail


async def test_transactional_append_is_atomic(
    backends: Backends, needs_replica_set: None
) -> None:
    backend = backends.make()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=2)
        await rheo.append("s", NewEvent("t", key="a"))
        # The events insert fails after the counters were incremented in the transaction.
        backend._events = _Failing(backend._events, "insert_many",
                                   mongo_errors.WriteError("boom", 2))
        with pytest.raises(BackendError, match="WriteError: boom") as raised:
            await rheo.append("s", [NewEvent("t", id=f"x{i}", partition=i % 2) for i in range(4)])
        assert raised.value.kind == "failed"
        info = await rheo.stream_info("s")
        assert sum(info.high_water.values()) == 1, "the counter increments were rolled back"
        events = await rheo.append("s", [NewEvent("t", id=f"x{i}", partition=i % 2)
                                         for i in range(4)])
        high = info.high_water
        assert [(e.partition, e.sequence) for e in events] == [
            (0, high[0] + 1), (1, high[1] + 1), (0, high[0] + 2), (1, high[1] + 2)]
        page = await rheo.query_page(Query(stream="s"), limit=10)
        assert len(page.events) == 5


async def test_transactional_appends_from_two_processes_stay_gapless(
    backends: Backends, needs_replica_set: None
) -> None:
    # Separate backend objects share no lock: their transactions conflict and retry.
    one, two = backends.make(), backends.make()
    async with Rheo(one) as a, Rheo(two) as b:
        await a.create_stream("s", partitions=2)

        async def append(rheo: Rheo, n: int) -> None:
            await rheo.append("s", [NewEvent("t", {"n": n}, key=f"k{n}-{i}") for i in range(3)])

        await asyncio.gather(*(append(a if n % 2 else b, n) for n in range(16)))
        info = await a.stream_info("s")
        assert sum(info.high_water.values()) == 48
        for p, high in info.high_water.items():
            page = await a.query_page(Query(stream="s", partitions=[p]), limit=100)
            assert [e.sequence for e in page.events] == list(range(1, high + 1))


async def test_standalone_appends_from_two_processes_stay_gapless(backends: Backends) -> None:
    one = backends.make(transactions=False, change_streams=False)
    two = backends.make(transactions=False, change_streams=False)
    async with Rheo(one) as a, Rheo(two) as b:
        await a.create_stream("s", partitions=2)

        async def append(rheo: Rheo, n: int) -> list[Any]:
            return await rheo.append(
                "s", [NewEvent("t", {"n": n}, id=f"e{n}-{i}", key=f"k{n}-{i}") for i in range(3)])

        batches = await asyncio.gather(*(append(a if n % 2 else b, n) for n in range(16)))
        info = await a.stream_info("s")
        assert sum(info.high_water.values()) == 48
        for p, high in info.high_water.items():
            page = await a.query_page(Query(stream="s", partitions=[p]), limit=100)
            assert [e.sequence for e in page.events] == list(range(1, high + 1))
        for batch in batches:
            for p in (0, 1):
                seqs = [e.sequence for e in batch if e.partition == p]
                assert seqs == sorted(seqs)


async def test_standalone_append_interrupted_before_the_counter(backends: Backends) -> None:
    backend = backends.make(transactions=False, change_streams=False)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", NewEvent("t", id="first"))
        # The events are stored, then the process "dies" before raising the counter.
        backend._partitions = _Failing(backend._partitions, "bulk_write",
                                       mongo_errors.AutoReconnect("connection lost"))
        with pytest.raises(OutcomeUnknown, match="connection lost"):
            await rheo.append("s", [NewEvent("t", id="a"), NewEvent("t", id="b")])
        assert (await rheo.stream_info("s")).high_water == {0: 1}, "the counter lags"
        # Another append finds the lag on its own and continues after the stored events.
        [c] = await rheo.append("s", NewEvent("t", id="c"))
        assert c.sequence == 4
        # Repeating the interrupted append returns the stored events: nothing is lost.
        again = await rheo.append("s", [NewEvent("t", id="a"), NewEvent("t", id="b")])
        assert [e.sequence for e in again] == [2, 3]
        assert (await rheo.stream_info("s")).high_water == {0: 4}
        leases = await rheo.fetch("s", "g", limit=10)
        assert [lease.event.id for lease in leases] == ["first", "a", "b", "c"]


async def test_transactional_append_catches_up_a_lagging_counter(
    backends: Backends, needs_replica_set: None
) -> None:
    # A standalone-mode append died before raising the counter; the deployment then
    # gained transactions. The transactional path must not collide for ever.
    standalone = backends.make(transactions=False, change_streams=False)
    async with Rheo(standalone) as rheo:
        await rheo.create_stream("s")
        standalone._partitions = _Failing(standalone._partitions, "bulk_write",
                                          mongo_errors.AutoReconnect("connection lost"))
        with pytest.raises(OutcomeUnknown, match="connection lost"):
            await rheo.append("s", [NewEvent("t", id="a"), NewEvent("t", id="b")])
    async with Rheo(backends.make()) as rheo:
        assert (await rheo.stream_info("s")).high_water == {0: 0}
        [c] = await rheo.append("s", NewEvent("t", id="c"))
        assert c.sequence == 3
        assert (await rheo.stream_info("s")).high_water == {0: 3}
        assert [lease.event.id for lease in await rheo.fetch("s", "g")] == ["a", "b", "c"]


# Races between backend objects (as between processes) ------------------------------------


async def test_concurrent_claims_from_many_processes_never_double_lease(
    backends: Backends,
) -> None:
    objects = [backends.make() for _ in range(3)] + [backends.motor()]
    rheos = [Rheo(b) for b in objects]
    for r in rheos:
        await r.open()
    try:
        await rheos[0].create_stream("s", partitions=3)
        await rheos[0].append("s", [NewEvent("t", key=f"k{i}") for i in range(120)])
        await rheos[0].create_group("s", "g")

        async def drain(rheo: Rheo, name: str) -> list[Lease]:
            got: list[Lease] = []
            while batch := await rheo.fetch("s", "g", consumer_id=name, limit=7,
                                            lease_ms=60_000):
                got.extend(batch)
            return got

        async def all_of_them(name: str) -> list[Lease]:
            batches = await asyncio.gather(*(drain(r, f"{name}{i}") for i, r in enumerate(rheos)))
            # A fetch that lost every claim returns nothing: pick up what may be left.
            return [x for batch in batches for x in batch] + await drain(rheos[0], name)

        first = await all_of_them("c")
        leased = [(x.partition, x.sequence) for x in first]
        assert len(leased) == len(set(leased)) == 120
        assert {x.attempt for x in first} == {1}
        # Expire everything at once; every delivery is reclaimed exactly once, attempt 2.
        backends.clock.advance(60_001)
        second = await all_of_them("d")
        again = [(x.partition, x.sequence) for x in second]
        assert len(again) == len(set(again)) == 120
        assert set(again) == set(leased)
        assert {x.attempt for x in second} == {2}
        # Old leases are fenced, new ones settle; the frontier reaches the high water.
        stale = await rheos[1].ack(first[:10])
        assert {r.kind for r in stale} == {SettleKind.STALE_LEASE}
        assert all(r.ok and not r.repeated for r in await rheos[2].ack(second))
        assert await rheos[0].frontier("s", "g") == await rheos[0].high_water("s")
    finally:
        for r in rheos:
            await r.close()


async def test_racing_settles_from_two_processes(backends: Backends) -> None:
    one, two = backends.make(), backends.motor()
    async with Rheo(one) as a, Rheo(two) as b:
        await a.create_stream("s")
        await a.append("s", [NewEvent("t") for _ in range(4)])
        leases = await a.fetch("s", "g", limit=4)
        for lease in leases[:2]:
            results = await asyncio.gather(a.ack(lease), b.ack(lease))
            outcomes = [r[0] for r in results]
            assert all(r.ok for r in outcomes)
            assert sorted(r.repeated for r in outcomes) == [False, True]
        acked = {1, 2}
        for lease in leases[2:]:
            results = await asyncio.gather(a.ack(lease), b.nack(lease, "again"))
            ack, nack = (r[0] for r in results)
            assert ack.ok != nack.ok, "exactly one of a racing ack and nack succeeds"
            assert (nack if ack.ok else ack).kind is SettleKind.STALE_LEASE
            if ack.ok:
                acked.add(lease.sequence)
        left = await b.fetch("s", "g", limit=10)
        assert {lease.sequence for lease in left} == {3, 4} - acked
        assert all(lease.attempt == 2 for lease in left)
        frontier = 2 if 3 not in acked else (4 if 4 in acked else 3)
        assert await b.frontier("s", "g") == {0: frontier}


async def test_lease_expiry_on_the_real_clock(backends: Backends, wait_until: WaitUntil) -> None:
    async with Rheo(backends.make(clock=None)) as rheo:
        await rheo.create_stream("s")
        await rheo.append("s", NewEvent("t"))
        [first] = await rheo.fetch("s", "g", lease_ms=50)
        again: list[Lease] = []

        async def redelivered() -> bool:
            again.extend(await rheo.fetch("s", "g", lease_ms=60_000))
            return bool(again)

        await wait_until(redelivered, timeout=10.0, interval=0.02,
                         message="redelivery after the lease expired")
        assert (again[0].sequence, again[0].attempt) == (first.sequence, 2)
        assert (await rheo.ack(first))[0].kind is SettleKind.STALE_LEASE
        assert (await rheo.ack(again))[0].ok
