"""Range leases on the Redis backend: an unordered group's fetch leases its new
deliveries as a range, reads them with ``XRANGE`` beside the script, and keeps them
out of the consumer group's PEL.

The shared semantics are the conformance kit's; these are what it cannot see: a
read that missed the range (another process moved the cursor, a trim removed
entries), a client in either response mode, and the upgrade from the release whose
fetch read with ``XREADGROUP`` inside the script (every first delivery in the PEL):
its leases keep settling, renewing and expiring under this release, and its fetch,
run beside this one's, leases nothing twice. ``fixtures/redis_releases/pel/`` holds
that release's fetch and settle scripts and the helpers they started with.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

import test_redis_backend as shared
from rheo_flow import Lease, NewEvent, Rheo, SettleKind
from rheo_flow._backends.redis._codec import fetch_reply, fetched_leases, range_leases
from rheo_flow.backends import RedisBackend

RELEASE = Path(__file__).parent / "fixtures" / "redis_releases" / "pel"


def _script(*parts: str) -> str:
    """A script of that release: its files run as one, as its ``_scripts.py`` joined them."""
    return "".join((RELEASE / f"{part}.lua").read_text() for part in parts)

backend = shared.backend
rheo = shared.rheo


def _keys(backend: RedisBackend, stream: str, group: str, partition: int = 0) -> list[str]:
    tag = f"{{{backend.prefix}:{stream}:{partition}}}"
    return [f"{tag}:x", f"{tag}:m", *(f"{tag}:g:{group}{s}"
                                      for s in ("", ":d", ":z", ":r", ":b", ":y", ":k", ":n"))]


async def _pending(backend: RedisBackend, stream: str, group: str) -> list[tuple[int, str]]:
    rows = await backend.client.xpending_range(_keys(backend, stream, group)[0], group, "-",
                                               "+", 100)
    return [(int(r["message_id"][:-2]), r["consumer"].decode()) for r in rows]


async def _old_fetch(backend: RedisBackend, stream: str, group: str, consumer: str,
                     limit: int, lease_ms: int = 60_000) -> list[Lease]:
    """A fetch of partition 0 as the earlier release ran it (its script, its reply)."""
    token = f"{os.urandom(8).hex()}.0"
    reply: Any = await backend.client.eval(
        _script("common", "fetch"), 10, *_keys(backend, stream, group),
        group, consumer, limit, lease_ms, f"{token}.", token)
    return fetched_leases(stream, 0, group, consumer, token, fetch_reply(reply), reply[1:])


async def _old_ack(backend: RedisBackend, leases: list[Lease]) -> str:
    """An ack as the earlier release's settle script ran it (its codes)."""
    rows = [(x.sequence, x.receipt, x.lease_id, x.attempt, None) for x in leases]
    reply: Any = await backend.client.eval(
        _script("common", "lookup", "settle"), 10,
        *_keys(backend, leases[0].event.stream, leases[0].group), leases[0].group, "a", "", 0,
        orjson.dumps(rows))
    return str(reply.decode())


@pytest.fixture
async def prepared(rheo: Rheo) -> Rheo:
    """Stream ``s`` (one partition) with events 1..6 and group ``g`` at the start."""
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", {"n": n}, key=f"k{n}") for n in range(1, 7)])
    await rheo.create_group("s", "g", start="earliest")
    return rheo


async def test_leases_of_the_earlier_release_settle_after_the_upgrade(
        prepared: Rheo, backend: RedisBackend) -> None:
    rheo = prepared
    old = await _old_fetch(backend, "s", "g", "before", 4)
    assert [x.sequence for x in old] == [1, 2, 3, 4]
    assert await _pending(backend, "s", "g") == [(n, "before") for n in (1, 2, 3, 4)]
    # Acked in order (the run form), out of order, nacked, renewed: each as before, and
    # each settled one leaves the PEL.
    assert all(r.ok for r in await rheo.ack(old[:2]))
    assert all(r.ok for r in await rheo.ack(old[3:4]))
    assert all(r.ok for r in await rheo.renew(old[2:3]))
    assert await _pending(backend, "s", "g") == [(3, "before")]
    assert all(r.ok for r in await rheo.nack(old[2:3], "later"))
    # The redelivery and the new deliveries come from this release's fetch.
    got = await rheo.fetch("s", "g", consumer_id="after", limit=10)
    assert [(x.sequence, x.attempt) for x in got] == [(3, 2), (5, 1), (6, 1)]
    assert [x.event.data["n"] for x in got] == [3, 5, 6]
    [stale] = await rheo.ack(old[2:3])
    assert stale.kind is SettleKind.STALE_LEASE
    assert await _pending(backend, "s", "g") == [(3, "after")]
    assert all(r.ok for r in await rheo.ack(got))
    assert await _pending(backend, "s", "g") == []
    assert await rheo.frontier("s", "g") == {0: 6}


async def test_an_expired_block_of_the_earlier_release_is_redelivered(
        prepared: Rheo, backend: RedisBackend, wait_until: shared.WaitUntil) -> None:
    rheo = prepared
    old = await _old_fetch(backend, "s", "g", "before", 3, lease_ms=10)
    deadline = old[0].deadline_ms
    assert deadline is not None
    await wait_until(lambda: shared._expired(backend, deadline), message="expiry")
    got = await rheo.fetch("s", "g", consumer_id="after", limit=10)
    assert [(x.sequence, x.attempt) for x in got] == [
        (1, 2), (2, 2), (3, 2), (4, 1), (5, 1), (6, 1)]
    assert len({x.lease_id for x in old + got}) == 9, "a lease id per event and attempt"
    assert {r.kind for r in await rheo.ack(old)} == {SettleKind.STALE_LEASE}
    assert all(r.ok for r in await rheo.ack(got))
    assert await _pending(backend, "s", "g") == []
    assert sum((await rheo.lag("s", "g")).values()) == 0


async def test_the_earlier_release_beside_this_one_leases_nothing_twice(
        prepared: Rheo, backend: RedisBackend) -> None:
    rheo = prepared
    new = await rheo.fetch("s", "g", consumer_id="after", limit=2)
    old = await _old_fetch(backend, "s", "g", "before", 2)
    newer = await rheo.fetch("s", "g", consumer_id="after", limit=10)
    assert [x.sequence for x in new] == [1, 2]
    assert [x.sequence for x in old] == [3, 4]
    assert [x.sequence for x in newer] == [5, 6]
    # The earlier release's settle takes this one's range leases, and the reverse.
    assert await _old_ack(backend, new) == "oo"
    assert all(r.ok for r in await rheo.ack(old + newer))
    assert await _pending(backend, "s", "g") == []
    assert await rheo.frontier("s", "g") == {0: 6}


async def test_a_fetch_reads_the_range_another_process_moved_the_cursor_past(
        prepared: Rheo, backend: RedisBackend, redis_url: str) -> None:
    rheo = prepared
    other = RedisBackend.from_url(redis_url, prefix=backend.prefix)
    async with Rheo(other) as elsewhere:
        taken: list[Lease] = []
        for _ in range(3):  # each one's read starts where its own last fetch left off
            for instance in (rheo, elsewhere):
                taken.extend(await instance.fetch("s", "g", limit=1))
    assert [(x.sequence, x.event.data["n"], x.event.key) for x in taken] == [
        (n, n, f"k{n}") for n in range(1, 7)]
    assert all(r.ok for r in await rheo.ack(taken))


async def test_a_trimmed_entry_of_a_leased_range_is_left_out(
        prepared: Rheo, backend: RedisBackend) -> None:
    key = _keys(backend, "s", "g")[0]
    await backend.client.xtrim(key, minid="3-0", approximate=False)
    entries = await backend.client.execute_command(b"XRANGE", key, "1-0", "4-0")
    assert range_leases("s", 0, "g", "c", "t.0", 9, entries, 1, 4) is None
    leases = range_leases("s", 0, "g", "c", "t.0", 9, entries, 1, 4, whole=False)
    assert leases is not None
    assert [(x.sequence, x.lease_id, x.receipt, x.attempt, x.deadline_ms, x.event.data)
            for x in leases] == [(3, "t.0:3", "3-0", 1, 9, {"n": 3}),
                                 (4, "t.0:4", "4-0", 1, 9, {"n": 4})]


@pytest.mark.parametrize("decode", [False, True])
async def test_range_leases_in_either_response_mode(redis_url: str, decode: bool) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=decode)
    try:
        async with shared.scratch_backend(redis_url) as owned:
            host = RedisBackend(client=client, prefix=owned.prefix)
            async with Rheo(host) as rheo:
                await rheo.create_stream("s")
                await rheo.append("s", [NewEvent("t", {"n": n}, headers={"h": str(n)})
                                        for n in range(4)])
                got = [*await rheo.fetch("s", "g", limit=2), *await rheo.fetch("s", "g")]
                assert [(x.sequence, x.event.data, dict(x.event.headers)) for x in got] == [
                    (n + 1, {"n": n}, {"h": str(n)}) for n in range(4)]
                assert all(type(x.event.id) is str for x in got)
                assert all(r.ok for r in await rheo.ack(got))
    finally:
        await client.aclose()


async def test_acks_and_the_next_fetch_share_one_pipeline(
        prepared: Rheo, backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    rheo = prepared
    first = await rheo.fetch("s", "g", consumer_id="c", limit=3)
    await rheo.fetch("s", "g", consumer_id="c", limit=1)  # 4: the cursor is known now
    runner = type(backend._scripts)
    round_trips: list[int] = []
    pipeline = runner._pipeline

    async def counted(self: Any, calls: Any, *args: Any, **kwargs: Any) -> Any:
        round_trips.append(len(calls))
        return await pipeline(self, calls, *args, **kwargs)

    monkeypatch.setattr(runner, "_pipeline", counted)
    results, leases = await backend.ack_and_fetch(first, "s", "g", "c", 2, 60_000, None)
    assert [r.ok and not r.repeated for r in results] == [True] * 3
    assert [lease.sequence for lease in leases] == [5, 6]
    assert round_trips == [2]  # the settle script and the fetch script, one pipeline
    assert await rheo.frontier("s", "g") == {0: 3}


def test_a_fetch_returns_each_partition_in_sequence_order() -> None:
    # One script call may hand back a partition's redeliveries before events a replay or
    # reset made fetchable again below them (found by the stateful kit on Redis): the
    # fetch's result sorts each partition, and keeps the round-robin across partitions.
    from types import SimpleNamespace

    from rheo_flow._backends.redis._fetch import _Harvest

    def lease(partition: int, sequence: int) -> Any:
        return SimpleNamespace(partition=partition,
                               event=SimpleNamespace(partition=partition, sequence=sequence))

    harvest = _Harvest("s", "g", "c", 10, 1_000, [1, 0])
    harvest.of(1).extend([lease(1, 5), lease(1, 1), lease(1, 2)])
    harvest.of(0).extend([lease(0, 3), lease(0, 4)])
    assert [(x.partition, x.event.sequence) for x in harvest.batch()] == [
        (1, 1), (0, 3), (1, 2), (0, 4), (1, 5)]


async def test_a_range_s_leases_and_its_ack_results_are_built_with_the_collector_paused(
        prepared: Rheo, backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # A fetch's leases and an ack's results come in bursts of hundreds of objects, none
    # in a cycle: the cyclic collector waits for the burst (docs/benchmarks.md), and is
    # on again after it; a collector the application switched off stays off.
    rheo = prepared
    from rheo_flow._backends.redis import _codec, _settle

    seen: list[bool] = []
    build, ok = _codec._block_leases, _settle.settle_ok

    def spy_build(*args: Any) -> list[Lease]:
        seen.append(gc.isenabled())
        return build(*args)

    def spy_ok(lease_id: str) -> Any:
        seen.append(gc.isenabled())
        return ok(lease_id)

    monkeypatch.setattr(_codec, "_block_leases", spy_build)
    monkeypatch.setattr(_settle, "settle_ok", spy_ok)
    first = await rheo.fetch("s", "g", consumer_id="c", limit=3)
    assert [lease.sequence for lease in first] == [1, 2, 3]
    assert all(r.ok for r in await rheo.ack(first))
    assert seen == [False] * 4  # one build, three results
    assert gc.isenabled()
    seen.clear()
    gc.disable()
    try:
        rest = await rheo.fetch("s", "g", consumer_id="c", limit=3)
        assert all(r.ok for r in await rheo.ack(rest))
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert [lease.sequence for lease in rest] == [4, 5, 6]
    assert seen == [False] * 4


async def test_an_ack_of_a_run_of_a_block_goes_as_its_run_form_unchecked(
        prepared: Rheo, backend: RedisBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    # The leases of a block this backend leased, acked as a run of them in order (those
    # very objects: .._issued_runs), are sent as the run form at once, no lease's fields
    # checked; copies go the checked way. Settled leases leave the registry.
    rheo = prepared
    runner = type(backend)
    as_run: list[bool] = []
    plan_of = runner._settle_op_plan

    def spy(self: Any, *args: Any) -> Any:
        plan = plan_of(self, *args)
        as_run.append(plan.run is not None)
        return plan

    monkeypatch.setattr(runner, "_settle_op_plan", spy)
    issued = backend._issued
    leases = await rheo.fetch("s", "g", consumer_id="c", limit=4)
    assert len(issued) == 1
    assert all(r.ok and not r.repeated for r in await rheo.ack(leases[:2]))
    assert as_run == [True]
    copies = [dataclasses.replace(lease) for lease in leases[2:]]
    assert all(r.ok and not r.repeated for r in await rheo.ack(copies))
    assert as_run == [True, False]
    assert len(issued) == 1  # two of its leases are still to settle (as far as it knows)
    # The originals repeat: their run is not the frontier's next one, the script answers
    # each lease from the rows.
    assert all(r.ok and r.repeated for r in await rheo.ack(leases[2:]))
    assert as_run == [True, False, True]
    assert len(issued) == 0
    assert await rheo.frontier("s", "g") == {0: 4}
    # A forged lease of a registered block is not that block's lease: checked, refused.
    more = await rheo.fetch("s", "g", consumer_id="c", limit=2)
    forged = dataclasses.replace(more[0], receipt="5-1")
    assert [r.kind for r in await rheo.ack([forged])] == [SettleKind.RECEIPT_MISMATCH]
    assert as_run == [True, False, True, False]
    assert all(r.ok and not r.repeated for r in await rheo.ack(more))
