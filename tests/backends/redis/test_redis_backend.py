"""Redis-specific behaviour of the Redis backend (the shared semantics are in conformance/).

Every test works under its own key prefix and deletes its keys afterwards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rheo_flow import (
    BackendUnavailable,
    InvalidArgument,
    NewEvent,
    Query,
    Rheo,
    SettleKind,
)
from rheo_flow._backends._urls import backend_from_url
from rheo_flow._faults._proxy import FaultProxy
from rheo_flow.backends import RedisBackend

WaitUntil = Callable[..., Awaitable[None]]


def _prefix() -> str:
    return f"rheo-test-{uuid.uuid4().hex[:10]}"


@asynccontextmanager
async def scratch_backend(url: str) -> AsyncIterator[RedisBackend]:
    """A backend on ``url`` (a server or a cluster) under a fresh prefix; its keys are
    deleted when it closes."""
    b = RedisBackend.from_url(url, prefix=_prefix())
    try:
        yield b
    finally:
        await b.drop_all()
        await b.close()


@pytest.fixture
async def backend(redis_url: str) -> AsyncIterator[RedisBackend]:
    """A backend under a fresh prefix; its keys are deleted after the test."""
    async with scratch_backend(redis_url) as b:
        yield b


@pytest.fixture
async def rheo(backend: RedisBackend) -> AsyncIterator[Rheo]:
    """An opened instance over :func:`backend`."""
    async with Rheo(backend) as instance:
        yield instance


# Construction, URLs, secrets -------------------------------------------------


def test_url_scheme_builds_the_backend() -> None:
    for scheme in ("redis", "rediss"):
        built = backend_from_url(f"{scheme}://127.0.0.1:6379/0?prefix=app.v1")
        assert isinstance(built, RedisBackend)
        assert built.prefix == "app.v1"
        assert built.capabilities.distributed
        assert built.capabilities.server_clock
        assert built.capabilities.push_wakeups


def test_bad_construction_is_a_clear_error() -> None:
    with pytest.raises(InvalidArgument, match="prefix"):
        RedisBackend.from_url("redis://127.0.0.1/0", prefix="has space")
    with pytest.raises(InvalidArgument, match="prefix"):
        RedisBackend.from_url("redis://127.0.0.1/0?prefix={tag}")
    with pytest.raises(InvalidArgument, match="exactly one"):
        RedisBackend()
    with pytest.raises(InvalidArgument, match=r"redis\.asyncio\.Redis"):
        RedisBackend(client="not a client")  # type: ignore[arg-type]


async def test_unreachable_server_is_backend_unavailable_without_the_password() -> None:
    url = "redis://user:s3cret-pw@127.0.0.1:1/0"
    backend = RedisBackend.from_url(url)
    assert "s3cret-pw" not in repr(backend)
    with pytest.raises(BackendUnavailable) as caught:
        await Rheo(backend).open()
    assert "s3cret-pw" not in str(caught.value)
    assert "***" in str(caught.value)
    await backend.close()


async def test_settle_against_an_unreachable_server_is_classified(rheo: Rheo) -> None:
    stream = "s"
    await rheo.create_stream(stream)
    await rheo.append(stream, NewEvent("t"))
    [lease] = await rheo.fetch(stream, "g")
    down = RedisBackend.from_url("redis://:s3cret-pw@127.0.0.1:1/0", prefix="x")
    try:
        [result] = await Rheo(down).ack(lease)
        assert result.kind is SettleKind.BACKEND_UNAVAILABLE
        assert result.error is not None
        assert "s3cret-pw" not in result.error.reason
    finally:
        await down.close()
    await rheo.ack(lease)


def test_driver_errors_are_classified() -> None:
    backend = RedisBackend.from_url("redis://127.0.0.1/0")
    classify = backend.classify_error
    refused = RedisConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused.")
    assert classify(refused) is SettleKind.BACKEND_UNAVAILABLE
    assert classify(RedisConnectionError("Connection closed by server.")) is SettleKind.AMBIGUOUS
    assert classify(RedisTimeoutError("Timeout reading from socket")) is SettleKind.AMBIGUOUS
    assert classify(RedisTimeoutError("Timeout connecting to server")) is (
        SettleKind.BACKEND_UNAVAILABLE)
    assert classify(ResponseError("ERR user_script:1: boom")) is SettleKind.FAILED
    assert classify(ValueError("not a driver error")) is None


async def _paused_settle(redis_url: str, backend: RedisBackend, *, kill: bool,
                         wait_until: WaitUntil) -> None:
    """Ack while the server holds writes: the reply never comes (timeout or killed)."""
    client = aioredis.Redis.from_url(
        redis_url, socket_timeout=None if kill else 0.25, single_connection_client=True,
        retry=Retry(NoBackoff(), 0),
    )
    admin = aioredis.Redis.from_url(redis_url)
    fenced = RedisBackend(client=client, prefix=backend.prefix)
    try:
        async with Rheo(backend) as rheo:
            await rheo.create_stream("s")
            await rheo.append("s", NewEvent("t"))
            [lease] = await rheo.fetch("s", "g")
            await client.ping()
            own_id = await client.client_id()
            await admin.client_pause(2_000, all=False)
            try:
                ack = asyncio.ensure_future(Rheo(fenced).ack(lease))
                if kill:
                    async def sent() -> bool:
                        clients = await admin.client_list()
                        return any(int(c["id"]) == own_id and c["cmd"] == "evalsha"
                                   for c in clients)

                    await wait_until(sent, message="the ack reached the server")
                    await admin.client_kill_filter(_id=str(own_id))
                [result] = await ack
            finally:
                await admin.client_unpause()
            assert result.kind is SettleKind.AMBIGUOUS, result
            # Whether or not it committed, the same lease now settles once: ok or repeated.
            [again] = await rheo.ack(lease)
            assert again.ok
            assert await rheo.frontier("s", "g") == {0: 1}
    finally:
        await client.aclose()
        await admin.aclose()


async def test_timeout_mid_script_is_ambiguous(
    redis_url: str, backend: RedisBackend, wait_until: WaitUntil
) -> None:
    await _paused_settle(redis_url, backend, kill=False, wait_until=wait_until)


async def test_connection_lost_mid_script_is_ambiguous(
    redis_url: str, backend: RedisBackend, wait_until: WaitUntil
) -> None:
    await _paused_settle(redis_url, backend, kill=True, wait_until=wait_until)


# Host-owned clients ----------------------------------------------------------


@pytest.mark.parametrize("decode", [False, True], ids=["bytes", "decoded"])
async def test_host_client_is_used_and_never_closed(redis_url: str, decode: bool) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=decode)
    backend = RedisBackend(client=client, prefix=_prefix())
    try:
        async with Rheo(backend) as rheo:
            await rheo.create_stream("s", partitions=2)
            stored = await rheo.append("s", [NewEvent("t", {"i": i}, key=f"k{i}")
                                             for i in range(6)])
            leases = await rheo.fetch("s", "g", limit=10)
            assert sorted(x.event.data["i"] for x in leases) == list(range(6))
            assert all(r.ok for r in await rheo.renew(leases))
            assert all(r.ok for r in await rheo.ack(leases))
            assert await rheo.frontier("s", "g") == await rheo.high_water("s")
            page = await rheo.query_page(Query(stream="s"))
            assert sorted(e.id for e in page.events) == sorted(e.id for e in stored)
            assert await rheo.streams() == ["s"]
            assert [g.group for g in await rheo.groups("s")] == ["g"]
        assert await client.ping()  # the backend did not close the host's client
    finally:
        await backend.drop_all()
        await client.aclose()


# Layout ----------------------------------------------------------------------


async def test_each_partition_lives_in_one_cluster_slot(
    rheo: Rheo, backend: RedisBackend
) -> None:
    await rheo.create_stream("orders", partitions=4)
    await rheo.append("orders", [NewEvent("t", key=f"k{i}") for i in range(40)])
    leases = await rheo.fetch("orders", "billing", limit=40)
    await rheo.ack(leases[:20])
    await rheo.nack(leases[20:25], "later", delay_ms=60_000)
    await rheo.reject(leases[25:30], "bad")
    keys = [k.decode() async for k in backend.client.scan_iter(match=f"{{{backend.prefix}:*")]
    slots: dict[int, set[int]] = {}
    for key in keys:
        partition = int(key.split("}", 1)[0].rsplit(":", 1)[1])
        slots.setdefault(partition, set()).add(key_slot(key.encode()))
    assert sorted(slots) == [0, 1, 2, 3]
    assert all(len(s) == 1 for s in slots.values()), "one hash slot per partition"
    assert len({next(iter(s)) for s in slots.values()}) > 1, "partitions spread over slots"
    for p in range(4):
        tag = f"{{{backend.prefix}:orders:{p}}}"
        for suffix in (":x", ":m", ":g:billing", ":g:billing:d"):
            assert await backend.client.exists(tag + suffix), tag + suffix


async def test_the_pel_holds_redeliveries_not_first_deliveries(
        rheo: Rheo, backend: RedisBackend, wait_until: WaitUntil) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(3)])
    key = f"{{{backend.prefix}:s:0}}:x"
    first = await rheo.fetch("s", "g", consumer_id="alice", limit=3, lease_ms=60_000)
    assert [x.receipt for x in first] == ["1-0", "2-0", "3-0"], "the receipt is the entry id"
    # A range lease: one block record, nothing in the PEL; the consumer group's last id
    # follows the cursor all the same.
    assert await backend.client.xpending_range(key, "g", "-", "+", 10) == []
    blocks = await backend.client.hgetall(f"{{{backend.prefix}:s:0}}:g:g:b")
    assert [v.decode().split("|")[:2] for v in blocks.values()] == [["1", "3"]]
    [info] = await backend.client.xinfo_groups(key)
    assert info["last-delivered-id"] == b"3-0"
    await rheo.ack(first[:1])
    [short] = await rheo.renew(first[1:2], lease_ms=10)
    assert short.deadline_ms is not None
    deadline = short.deadline_ms
    await wait_until(lambda: _expired(backend, deadline), message="expiry")
    [again] = await rheo.fetch("s", "g", consumer_id="bob", limit=3)
    assert (again.sequence, again.attempt) == (2, 2)
    # A redelivery is taken with XCLAIM: the PEL shows who holds it.
    [entry] = await backend.client.xpending_range(key, "g", "-", "+", 10)
    assert (entry["message_id"], entry["consumer"]) == (b"2-0", b"bob")
    # A renew of our own lease claims it again (one more delivery in the PEL's count);
    # a stale lease touches nothing.
    [stale] = await rheo.renew(first[1])
    assert stale.kind is SettleKind.STALE_LEASE
    [kept] = await backend.client.xpending_range(key, "g", "-", "+", 10)
    assert kept["times_delivered"] == entry["times_delivered"]
    [ok] = await rheo.renew(again)
    assert ok.ok
    [renewed] = await backend.client.xpending_range(key, "g", "-", "+", 10)
    assert (renewed["consumer"], renewed["times_delivered"]) == (
        b"bob", entry["times_delivered"] + 1)
    assert all(r.ok for r in await rheo.ack([again, first[2]]))
    assert await backend.client.xpending_range(key, "g", "-", "+", 10) == []
    assert await rheo.frontier("s", "g") == {0: 3}


async def test_close_forgets_idle_redis_consumers(redis_url: str, backend: RedisBackend) -> None:
    user = RedisBackend.from_url(redis_url, prefix=backend.prefix)
    async with Rheo(user) as rheo:
        await rheo.create_stream("s", partitions=2)
        await rheo.append("s", [NewEvent("t", partition=p) for p in (0, 1, 0)])
        # Redeliveries make Redis consumers (first deliveries do not: see above).
        await rheo.nack(await rheo.fetch("s", "g", consumer_id="first", limit=3), "again")
        done = await rheo.fetch("s", "g", consumer_id="done", limit=2, partitions=[0])
        await rheo.ack(done)
        await rheo.fetch("s", "g", consumer_id="holding", limit=1, partitions=[1])
    names = {
        p: {c["name"] for c in await backend.client.xinfo_consumers(
            f"{{{backend.prefix}:s:{p}}}:x", "g")}
        for p in (0, 1)
    }
    assert names == {0: set(), 1: {b"holding"}}, "only a consumer with pending entries stays"


async def _expired(backend: RedisBackend, deadline_ms: int) -> bool:
    return await backend.server_time_ms() > deadline_ms


# Fetching --------------------------------------------------------------------


async def test_fetch_fills_the_limit_from_uneven_partitions(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=8)
    await rheo.append("s", [NewEvent("t") for _ in range(5)], partition=6)
    await rheo.append("s", [NewEvent("t") for _ in range(2)], partition=1)
    one = await rheo.fetch("s", "g", limit=1)
    assert len(one) == 1
    rest = await rheo.fetch("s", "g", limit=6)
    assert len(rest) == 6, "a second round takes from the partitions that have more"
    assert sorted((x.partition, x.sequence) for x in one + rest) == (
        [(1, 1), (1, 2)] + [(6, s) for s in range(1, 6)])


async def test_large_batches_cross_the_script_chunk_size(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    events = [NewEvent("t", {"i": i}, id=f"e{i}") for i in range(10_500)]
    stored = await rheo.append("s", events)
    again = await rheo.append("s", events[:4_500])
    assert again == stored[:4_500], "re-appending a large batch returns the stored events"
    leases = await rheo.fetch("s", "g", limit=10_000, lease_ms=60_000)
    assert [x.sequence for x in leases] == list(range(1, 10_001))
    assert all(r.ok for r in await rheo.renew(leases, lease_ms=60_000))
    results = await rheo.nack(leases[:4_001], "again")
    assert all(r.ok for r in results)
    redelivered = await rheo.fetch("s", "g", limit=4_001, lease_ms=60_000)
    assert [(x.sequence, x.attempt) for x in redelivered] == [(s, 2) for s in range(1, 4_002)]
    assert all(r.ok for r in await rheo.ack(redelivered + leases[4_001:]))
    assert await rheo.frontier("s", "g") == {0: 10_000}
    rest = await rheo.fetch("s", "g", limit=10_000)
    assert [x.sequence for x in rest] == list(range(10_001, 10_501))
    assert all(r.ok for r in await rheo.ack(rest))
    assert await rheo.frontier("s", "g") == {0: 10_500}


async def test_max_attempts_update_reaches_every_partition(rheo: Rheo) -> None:
    await rheo.create_stream("s", partitions=3)
    await rheo.append("s", [NewEvent("t", partition=p) for p in range(3)])
    leases = await rheo.fetch("s", "g", limit=3)
    assert {x.attempt for x in leases} == {1}
    await rheo.create_group("s", "g", max_attempts=1)
    assert all(r.ok for r in await rheo.nack(leases, "boom"))
    dead = await rheo.dead_letters("s", "g")
    assert [(d.partition, d.attempts, d.reason) for d in dead] == [
        (p, 1, "max_attempts") for p in range(3)]


async def test_lease_times_come_from_the_server_clock(rheo: Rheo, backend: RedisBackend) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    before = await backend.server_time_ms()
    [lease] = await rheo.fetch("s", "g", lease_ms=5_000)
    after = await backend.server_time_ms()
    assert before + 5_000 <= lease.deadline_ms <= after + 5_000
    assert before - 5_000 <= lease.event.appended_at_ms <= after


# Scripts ---------------------------------------------------------------------


async def test_scripts_reload_after_a_flush(rheo: Rheo, backend: RedisBackend) -> None:
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", partition=p) for p in (0, 1)])
    await backend.client.script_flush()
    leases = await rheo.fetch("s", "g", limit=2)  # a pipelined call: one script per partition
    assert len(leases) == 2
    await backend.client.script_flush()
    assert all(r.ok for r in await rheo.ack(leases[:1]))  # a single call
    await backend.client.script_flush()
    more = await rheo.append("s", [NewEvent("t", partition=p) for p in (0, 1)])  # MULTI/EXEC
    assert [e.sequence for e in more] == [2, 2]
    await backend.client.script_flush()
    key = f"{backend.prefix}:streams"
    replies = await backend._eval([("create_stream", [key], ["t1", 1]),
                                   ("create_stream", [key], ["t2", 3])], transaction=True)
    assert [r.split(b"|")[0] for r in replies] == [b"1", b"3"]


async def test_every_script_call_survives_a_flush_between_its_parts(
    rheo: Rheo, backend: RedisBackend
) -> None:
    # EVALSHA finds nothing, and another client flushes again before the retry: the
    # retry carries the script's source, so it runs whatever the cache holds.
    await rheo.create_stream("s", partitions=3)
    real = backend.client.evalsha
    flushes = 0

    async def flush_first(*args: object) -> object:
        nonlocal flushes
        flushes += 1
        await backend.client.script_flush()
        return await real(*args)  # type: ignore[arg-type]

    backend.client.evalsha = flush_first  # type: ignore[method-assign]
    try:
        await rheo.append("s", NewEvent("t", partition=1))
        [lease] = await rheo.fetch("s", "g", partitions=[1])
        assert all(r.ok for r in await rheo.ack([lease]))
    finally:
        del backend.client.evalsha
    assert flushes >= 3


async def test_group_consumes_everything_while_scripts_are_flushed(
    rheo: Rheo, backend: RedisBackend, redis_url: str, wait_until: WaitUntil
) -> None:
    from rheo_flow import ACK, Ack, Event, consumer

    total = 3_000
    await rheo.create_stream("s", partitions=3)
    for start in range(0, total, 500):
        await rheo.append("s", [NewEvent("t", {"i": i}, key=f"k{i % 7}")
                                for i in range(start, start + 500)])
    seen: list[int] = []

    @consumer(stream="s", group="g", concurrency=4, lease_ms=60_000)
    async def handle(event: Event, context: object) -> Ack:
        seen.append(event.data["i"])
        return ACK

    flusher = aioredis.Redis.from_url(redis_url)
    flushes = 0
    stop = asyncio.Event()

    async def flush_scripts() -> None:
        nonlocal flushes
        while not stop.is_set():
            await flusher.script_flush()
            flushes += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(flush_scripts())
    try:
        async with handle.start(rheo) as group:
            # Leases are a minute long: one lost to a failed call would hold this past
            # the deadline.
            await wait_until(lambda: group.stats.acked == total, timeout=60.0,
                             message=f"{total} acks")
            stop.set()
            await task
        assert not group.running
    finally:
        stop.set()
        await task
        await flusher.aclose()
    assert flushes > 10
    assert sorted(seen) == list(range(total))
    assert not group.stats.fetch_failures
    assert not group.stats.settle_failures
    info = await rheo.stream_info("s")
    assert await rheo.frontier("s", "g") == info.high_water


# Retention -------------------------------------------------------------------


async def test_trim_in_chunks_and_ids_can_come_back(
    rheo: Rheo, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rheo_flow._backends.redis import _events as module

    monkeypatch.setattr(module, "_TRIM_CHUNK", 3)
    await rheo.create_stream("s", partitions=2)
    await rheo.append("s", [NewEvent("t", id=f"a{i}", partition=0) for i in range(10)])
    await rheo.append("s", [NewEvent("t", id=f"b{i}", partition=1) for i in range(4)])
    held = await rheo.fetch("s", "g", limit=20, partitions=[0])
    assert await rheo.trim("s", up_to={0: 8}, force=True) == {0: 8}
    assert (await rheo.frontier("s", "g"))[0] == 8
    results = await rheo.ack(held)
    assert [r.kind for r in results] == [SettleKind.STALE_LEASE] * 8 + [None] * 2
    assert await rheo.frontier("s", "g") == {0: 10, 1: 0}
    # A trimmed id is forgotten: appending it again stores a new event.
    [back] = await rheo.append("s", NewEvent("t", id="a3", partition=1))
    assert (back.partition, back.sequence) == (1, 5)
    [kept] = await rheo.append("s", NewEvent("t", id="a9", partition=1))
    assert (kept.partition, kept.sequence) == (0, 10), "a retained id keeps its partition"


# Wake-ups --------------------------------------------------------------------


async def test_wait_for_append_wakes_across_instances(redis_url: str, rheo: Rheo,
                                                      backend: RedisBackend) -> None:
    await rheo.create_stream("s", partitions=3)
    assert await rheo.wait_for_append("s", 0.05) is False
    other = RedisBackend.from_url(redis_url, prefix=backend.prefix)
    try:
        async with Rheo(other) as producer:
            waiter = asyncio.ensure_future(rheo.wait_for_append("s", 10))
            while not waiter.done():
                await producer.append("s", NewEvent("t", partition=2))
                await asyncio.wait({waiter}, timeout=0.05)
            assert waiter.result() is True
            # The wake-up read one entry only: the next wait learns the high water
            # first instead of returning at once for events already appended.
            assert await rheo.wait_for_append("s", 0.05) is False
            # An append between a fetch and the next wait is never missed.
            assert await rheo.fetch("s", "g", limit=100)
            await producer.append("s", NewEvent("t", partition=0))
            await rheo.stream_info("s")
            assert await rheo.wait_for_append("s", 5) is True
    finally:
        await other.close()


@pytest.mark.parametrize("socket_timeout", [0.4, 0.1], ids=["blocking", "polling"])
async def test_wait_stays_under_the_client_socket_timeout(
    redis_url: str, socket_timeout: float
) -> None:
    client = aioredis.Redis.from_url(redis_url, socket_timeout=socket_timeout)
    backend = RedisBackend(client=client, prefix=_prefix())
    try:
        async with Rheo(backend) as rheo:
            await rheo.create_stream("s")
            loop = asyncio.get_running_loop()
            started = loop.time()
            assert await rheo.wait_for_append("s", 0.7) is False
            assert loop.time() - started >= 0.7
            waiter = asyncio.ensure_future(rheo.wait_for_append("s", 10))
            while not waiter.done():
                await rheo.append("s", NewEvent("t"))
                await asyncio.wait({waiter}, timeout=0.05)
            assert waiter.result() is True
    finally:
        await backend.drop_all()
        await client.aclose()


async def test_group_consumes_with_push_wakeups(rheo: Rheo, wait_until: WaitUntil) -> None:
    from rheo_flow import ACK, Ack, Event, consumer

    await rheo.create_stream("s", partitions=2)
    seen: list[int] = []

    @consumer(stream="s", group="g", poll_ms=60_000, concurrency=2)
    async def handle(event: Event, context: object) -> Ack:
        seen.append(event.data["i"])
        return ACK

    async with handle.start(rheo) as group:
        # poll_ms is a minute: only a push wake-up can deliver these in time.
        for i in range(5):
            await rheo.append("s", NewEvent("t", {"i": i}, key=f"k{i}"))
        await wait_until(lambda: group.stats.acked == 5, message="5 acks")
    assert sorted(seen) == list(range(5))


async def test_malformed_leases_are_invalid_without_a_round_trip(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", NewEvent("t"))
    [lease] = await rheo.fetch("s", "g")
    forged = [
        dataclasses.replace(lease, event=dataclasses.replace(lease.event, stream="a}b{c")),
        dataclasses.replace(lease, event=dataclasses.replace(lease.event, partition=-1)),
        dataclasses.replace(lease, group="no such group"),
        lease,
    ]
    results = await rheo.ack(forged)
    assert [r.kind for r in results] == [SettleKind.INVALID] * 3 + [None]


# Blocks of new deliveries ----------------------------------------------------


def _group_key(backend: RedisBackend, suffix: str, group: str = "g") -> str:
    return f"{{{backend.prefix}:s:0}}:g:{group}{suffix}"


async def test_new_deliveries_share_one_record_until_settled(
    rheo: Rheo, backend: RedisBackend
) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(5)])
    leases = await rheo.fetch("s", "g", limit=5)
    client = backend.client
    assert await client.hlen(_group_key(backend, ":d")) == 0, "no record per new delivery"
    assert await client.hlen(_group_key(backend, ":b")) == 1
    assert await client.zcard(_group_key(backend, ":z")) == 0
    assert len({lease.lease_id for lease in leases}) == 5
    assert all(r.ok for r in await rheo.ack(leases[1:]))
    assert (await rheo.frontier("s", "g"))[0] == 0
    assert await client.hlen(_group_key(backend, ":b")) == 1, "1 is still leased"
    assert all(r.ok for r in await rheo.ack(leases[:1]))
    assert (await rheo.frontier("s", "g"))[0] == 5
    # In order: the acks that moved the frontier over them wrote no record; the block
    # answers for them and has nothing left to expire.
    assert sorted(await client.hkeys(_group_key(backend, ":d"))) == [b"2", b"3", b"4", b"5"]
    assert await client.hlen(_group_key(backend, ":b")) == 1
    assert await client.zcard(_group_key(backend, ":y")) == 0
    [again] = await rheo.ack(leases[2])
    assert again.ok
    assert again.repeated


async def test_in_order_run_acks_check_the_block_and_every_own_record(
    rheo: Rheo, backend: RedisBackend, wait_until: WaitUntil
) -> None:
    # An ack of a block's consecutive leases at the frontier takes the short path (one
    # range, no record); anything that makes one of them not current must still show.
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(12)])
    client = backend.client
    leases = await rheo.fetch("s", "g", limit=4)
    assert all(r.ok for r in await rheo.renew(leases[2:3], lease_ms=5_000))  # 3: a record
    results = await rheo.ack(leases)
    assert [r.ok for r in results] == [True] * 4
    assert (await rheo.frontier("s", "g"))[0] == 4
    repeated = await rheo.ack(leases)
    assert all(r.ok and r.repeated for r in repeated)
    # A receipt that does not match, a lease id of another block: not current.
    more = await rheo.fetch("s", "g", limit=4)
    other = await rheo.fetch("s", "g", limit=4, lease_ms=300)
    forged = [more[0], dataclasses.replace(more[1], receipt="1-0"), *more[2:]]
    results = await rheo.ack(forged)
    assert [r.kind for r in results] == [None, SettleKind.RECEIPT_MISMATCH, None, None]
    swapped = [dataclasses.replace(lease, lease_id=o.lease_id)
               for lease, o in zip(other, more, strict=True)]
    assert all(r.kind is SettleKind.STALE_LEASE for r in await rheo.ack(swapped))
    assert (await rheo.frontier("s", "g"))[0] == 5
    assert all(r.ok for r in await rheo.ack(more[1:2]))
    assert (await rheo.frontier("s", "g"))[0] == 8
    # Expired and leased again: the old run is fenced, the new leases settle.
    await wait_until(lambda: _expired(backend, other[0].deadline_ms), message="expiry")
    stolen = await rheo.fetch("s", "g", limit=4)
    assert [lease.event.sequence for lease in stolen] == [9, 10, 11, 12]
    assert all(r.kind is SettleKind.STALE_LEASE for r in await rheo.ack(other))
    assert await client.hlen(_group_key(backend, ":d")) > 0
    assert all(r.ok for r in await rheo.ack(stolen))
    assert (await rheo.frontier("s", "g"))[0] == 12


async def test_expired_block_leases_are_fenced_after_a_re_lease(
    rheo: Rheo, backend: RedisBackend, wait_until: WaitUntil
) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(3)])
    first = await rheo.fetch("s", "g", limit=3, lease_ms=50)
    await wait_until(lambda: _expired(backend, first[0].deadline_ms), message="expiry")
    # Expired but not leased again: it may still settle.
    [late] = await rheo.ack(first[0])
    assert late.ok
    assert not late.repeated
    second = await rheo.fetch("s", "g", limit=3, lease_ms=60_000)
    assert [(x.sequence, x.attempt) for x in second] == [(2, 2), (3, 2)]
    stale = await rheo.ack(first[1:])
    assert [r.kind for r in stale] == [SettleKind.STALE_LEASE] * 2
    stale_renew = await rheo.renew(first[1:])
    assert [r.kind for r in stale_renew] == [SettleKind.STALE_LEASE] * 2
    assert all(r.ok for r in await rheo.ack(second))
    assert (await rheo.frontier("s", "g"))[0] == 3
    assert await backend.client.zcard(_group_key(backend, ":y")) == 0


async def test_expired_block_dead_letters_at_max_attempts(
    rheo: Rheo, backend: RedisBackend, wait_until: WaitUntil
) -> None:
    await rheo.create_stream("s")
    await rheo.create_group("s", "g", max_attempts=1)
    await rheo.append("s", [NewEvent("t") for _ in range(2)])
    first = await rheo.fetch("s", "g", limit=2, lease_ms=50)
    await wait_until(lambda: _expired(backend, first[0].deadline_ms), message="expiry")
    assert await rheo.fetch("s", "g", limit=2) == []
    dead = await rheo.dead_letters("s", "g")
    assert [(d.sequence, d.attempts, d.reason) for d in dead] == [
        (1, 1, "max_attempts"), (2, 1, "max_attempts")]
    assert (await rheo.frontier("s", "g"))[0] == 2
    assert [r.kind for r in await rheo.ack(first)] == [SettleKind.STALE_LEASE] * 2


async def test_block_leases_nack_renew_reject_each_on_their_own(
    rheo: Rheo, backend: RedisBackend, wait_until: WaitUntil
) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(4)])
    leases = await rheo.fetch("s", "g", limit=4, lease_ms=300)
    assert (await rheo.nack(leases[0], "again"))[0].ok
    [renewed] = await rheo.renew(leases[1], lease_ms=60_000)
    assert renewed.ok
    assert (await rheo.reject(leases[2], "bad"))[0].ok
    [redelivered] = await rheo.fetch("s", "g", limit=4, lease_ms=60_000)
    assert (redelivered.sequence, redelivered.attempt) == (1, 2)
    await wait_until(lambda: _expired(backend, leases[3].deadline_ms), message="expiry")
    # The block expired: only the delivery that was neither settled nor renewed returns.
    [expired] = await rheo.fetch("s", "g", limit=4, lease_ms=60_000)
    assert (expired.sequence, expired.attempt) == (4, 2)
    assert (await rheo.ack(leases[3]))[0].kind is SettleKind.STALE_LEASE
    results = await rheo.ack([redelivered, leases[1], expired])
    assert all(r.ok for r in results)
    assert (await rheo.frontier("s", "g"))[0] == 4
    assert [d.sequence for d in await rheo.dead_letters("s", "g")] == [3]


async def test_replay_reset_and_trim_cover_block_leases(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(6)])
    leases = await rheo.fetch("s", "g", limit=6, lease_ms=60_000)
    await rheo.ack(leases[:2])
    await rheo.replay("s", "g", from_sequence=4)
    results = await rheo.ack(leases[2:])
    assert [r.ok for r in results] == [True, False, False, False], "3 was not replayed"
    again = await rheo.fetch("s", "g", limit=6, lease_ms=60_000)
    assert [(x.sequence, x.attempt) for x in again] == [(4, 1), (5, 1), (6, 1)]
    removed = await rheo.trim("s", up_to=4, force=True)
    assert removed == {0: 4}
    results = await rheo.ack(again)
    assert [r.kind for r in results] == [SettleKind.STALE_LEASE, None, None]
    assert (await rheo.frontier("s", "g"))[0] == 6
    await rheo.append("s", [NewEvent("t") for _ in range(2)])
    held = await rheo.fetch("s", "g", limit=6, lease_ms=60_000)
    await rheo.reset("s", "g", to=7)
    assert [r.kind for r in await rheo.ack(held)] == [SettleKind.STALE_LEASE] * 2
    [last] = await rheo.fetch("s", "g", limit=6)
    assert last.sequence == 8
    assert (await rheo.ack(last))[0].ok


async def test_replies_are_parsed_by_hiredis(backend: RedisBackend) -> None:
    from redis.utils import HIREDIS_AVAILABLE

    assert HIREDIS_AVAILABLE, "the redis extra installs hiredis"
    await backend.open()
    connection = await backend.client.connection_pool.get_connection()
    try:
        assert type(connection._parser).__name__ == "_AsyncHiredisParser"
    finally:
        await backend.client.connection_pool.release(connection)


async def test_in_order_acks_write_no_record_and_survive_redrive_and_replay(
    rheo: Rheo, backend: RedisBackend
) -> None:
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t") for _ in range(6)])
    leases = await rheo.fetch("s", "g", limit=6, lease_ms=60_000)
    assert (await rheo.reject(leases[0], "bad"))[0].ok
    twice = await rheo.ack([*leases[1:], leases[1], leases[5]])
    assert [(r.ok, r.repeated) for r in twice] == [(True, False)] * 5 + [(True, True)] * 2
    assert (await rheo.frontier("s", "g"))[0] == 6
    assert await backend.client.hkeys(_group_key(backend, ":d")) == [b"1"]
    assert all(r.ok and r.repeated for r in await rheo.ack(leases[1:]))
    stale = await rheo.nack(leases[1:3], "late")
    assert [r.kind for r in stale] == [SettleKind.STALE_LEASE] * 2
    # The frontier moves back to 0: the acks behind it keep answering for themselves.
    assert await rheo.redrive("s", "g") == 1
    assert (await rheo.frontier("s", "g"))[0] == 0
    [again] = await rheo.fetch("s", "g", limit=6)
    assert (again.sequence, again.attempt) == (1, 1)
    assert all(r.ok and r.repeated for r in await rheo.ack(leases[1:]))
    assert (await rheo.ack(again))[0].ok
    assert (await rheo.frontier("s", "g"))[0] == 6
    await rheo.replay("s", "g", from_sequence=5)
    results = await rheo.ack(leases[3:])
    assert [(r.ok, r.kind) for r in results] == [
        (True, None), (False, SettleKind.STALE_LEASE), (False, SettleKind.STALE_LEASE)]
    assert [x.sequence for x in await rheo.fetch("s", "g", limit=6)] == [5, 6]


async def test_event_data_round_trips_exactly(rheo: Rheo) -> None:
    await rheo.create_stream("s")
    data = {"big": 2**70, "neg": -(2**65), "text": 'quote " slash / é \u2028', "f": 0.1,
            "nested": [[], {}, None, True]}
    [stored] = await rheo.append("s", NewEvent("t", data, id="e1"))
    [again] = await rheo.append("s", NewEvent("t", data, id="e1"))
    [lease] = await rheo.fetch("s", "g")
    assert stored.data == data
    assert again.data == data
    assert lease.event.data == data
    assert isinstance(lease.event.data["big"], int)


async def test_a_fetch_resent_after_its_answer_was_lost_strands_nothing(
        redis_url: str, wait_until: Any) -> None:
    """redis-py resends a command whose answer never came; the fetch script then runs
    twice with the same block token. The first run's leases must still expire and come
    back, or the frontier stalls behind them for ever."""
    prefix = _prefix()
    url = f"{redis_url}{'&' if '?' in redis_url else '?'}prefix={prefix}"
    owner = RedisBackend.from_url(redis_url, prefix=prefix)
    try:
        await _resent_fetch(url, Rheo(owner), wait_until)
    finally:
        await owner.drop_all()
        await owner.close()


async def _resent_fetch(url: str, direct: Rheo, wait_until: Any) -> None:
    async with FaultProxy.for_url(url) as proxy, direct:
        await direct.create_stream("s", partitions=1)
        await direct.create_group("s", "g")
        await direct.append("s", [NewEvent("t", {"n": n}) for n in range(10)])
        async with Rheo(proxy.url(url)) as rheo:
            # Scripts loaded and the stream known: the next answer is the fetch's.
            await rheo.ack(await rheo.fetch("s", "g", limit=1, lease_ms=5_000))
            proxy.lose_replies(1)
            await rheo.fetch("s", "g", limit=5, lease_ms=200)
            assert proxy.stats.replies_lost == 1
        acked: set[int] = set()

        async def everything_acked() -> bool:
            leases = await direct.fetch("s", "g", limit=10, lease_ms=5_000)
            await direct.ack(leases)
            acked.update(lease.event.sequence for lease in leases)
            return sum((await direct.lag("s", "g")).values()) == 0

        await wait_until(everything_acked, timeout=10, interval=0.05,
                         message="every event delivered and acked")
        assert acked == set(range(2, 11))
