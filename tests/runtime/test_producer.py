"""The demand-driven Producer: demand bound, renewal, settling, drain, wake-ups, back-off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

from _doubles import FlakyBackend
from rheo_flow import (
    AlreadyStarted,
    InvalidArgument,
    ManualClock,
    NewEvent,
    NotStarted,
    Producer,
    Rheo,
    UnknownStream,
)
from rheo_flow._runtime._backoff import Backoff

WaitUntil = Callable[..., Awaitable[None]]


@pytest.fixture
def backend(clock: ManualClock) -> FlakyBackend:
    return FlakyBackend(clock=clock)


@pytest.fixture
async def db(backend: FlakyBackend) -> AsyncIterator[Rheo]:
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders", partitions=4)
        yield rheo


async def append(rheo: Rheo, count: int, start: int = 0) -> None:
    await rheo.append("orders", [NewEvent("order", {"n": i}, key=f"k{i % 7}")
                                 for i in range(start, start + count)])


async def test_demand_is_bounded_by_max_demand_and_freed_by_settles(db: Rheo) -> None:
    await append(db, 50)
    async with Producer(db, "orders", "billing", max_demand=10) as producer:
        first = await producer.demand(100)
        assert len(first) == 10
        assert len(producer.inflight) == 10
        waiting = asyncio.create_task(producer.demand(5))
        for _ in range(20):  # give the task every chance to (wrongly) fetch
            await asyncio.sleep(0)
        assert not waiting.done()
        await producer.ack(first[:3])
        freed = await asyncio.wait_for(waiting, 5)
        assert len(freed) == 3  # min(n=5, max_demand - inflight = 3)
        await producer.ack(first[3:] + freed)
        assert not producer.inflight
    stats = producer.stats()
    assert (stats.fetched, stats.acked, stats.peak_inflight) == (13, 13, 10)


async def test_nack_reject_and_confirm_release_demand(db: Rheo, clock: ManualClock) -> None:
    await append(db, 4)
    async with Producer(db, "orders", "billing", max_demand=4, lease_ms=1_000) as producer:
        leases = sorted(await producer.demand(4), key=lambda lease: lease.event.data["n"])
        assert [r.ok for r in await producer.nack(leases[:1], "later", delay_ms=5_000)] == [True]
        assert [r.ok for r in await producer.reject(leases[1:2], "poison")] == [True]
        assert producer.confirm(leases[2:3]) == 1
        await producer.ack(leases[3:])
        assert not producer.inflight

        # The confirmed lease was not settled: it is still leased until it expires.
        other = await db.fetch("orders", "billing", consumer_id="other", limit=10)
        assert other == []
        clock.advance(5_000)
        redelivered = await db.fetch("orders", "billing", consumer_id="other", limit=10)
        assert sorted(lease.event.data["n"] for lease in redelivered) == [0, 2]
        assert {lease.attempt for lease in redelivered} == {2}
        await db.ack(redelivered)
    dead = await db.dead_letters("orders", "billing")
    assert [(d.reason, d.event_id) for d in dead] == [("poison", leases[1].event.id)]
    stats = producer.stats()
    assert (stats.acked, stats.nacked, stats.rejected, stats.confirmed) == (1, 1, 1, 1)


async def test_renews_every_inflight_lease_in_one_call(
    db: Rheo, backend: FlakyBackend, clock: ManualClock, wait_until: WaitUntil
) -> None:
    await append(db, 6)
    async with Producer(db, "orders", "billing", max_demand=10, lease_ms=100) as producer:
        leases = await producer.demand(10)
        assert len(leases) == 6
        clock.advance(80)
        renewals = producer.stats().renewals
        await wait_until(lambda: producer.stats().renewals > renewals)
        # Renewed at t+80 to t+180: at t+160 nothing is eligible for another consumer,
        # although the original lease (t+100) has run out.
        clock.advance(80)
        assert await db.fetch("orders", "billing", consumer_id="thief", limit=10) == []
        calls_per_tick = backend.calls["renew"] / producer.stats().renewals
        assert calls_per_tick == 1
        results = await producer.ack(leases)
        assert all(r.ok for r in results)


async def test_drain_stops_fetching_keeps_renewing_and_waits_for_settles(db: Rheo) -> None:
    await append(db, 8)
    producer = await Producer(db, "orders", "billing", max_demand=4, lease_ms=100).start()
    leases = await producer.demand(4)
    assert not await producer.drain(timeout=0.15)  # leases still inflight
    assert producer.state == "draining"
    assert await producer.demand(4) == []  # no more fetching once draining
    renewals = producer.stats().renewals
    assert renewals >= 1  # kept renewing while draining
    finishing = asyncio.create_task(producer.drain(timeout=5))
    await producer.ack(leases)
    assert await finishing
    assert producer.state == "stopped"
    assert (await db.lag("orders", "billing")) != {0: 0, 1: 0, 2: 0, 3: 0}  # 4 left


async def test_drain_wakes_a_demand_waiting_for_events(db: Rheo) -> None:
    producer = await Producer(db, "orders", "billing", poll_ms=60_000).start()
    waiting = asyncio.create_task(producer.demand(5))
    await asyncio.sleep(0)
    assert await producer.drain(timeout=1)
    assert await asyncio.wait_for(waiting, 1) == []


async def test_push_wakeup_ends_an_idle_wait(db: Rheo) -> None:
    async with Producer(db, "orders", "billing", poll_ms=60_000) as producer:
        waiting = asyncio.create_task(producer.demand(5))
        for _ in range(10):
            await asyncio.sleep(0)
        assert not waiting.done()
        await append(db, 2)
        leases = await asyncio.wait_for(waiting, 5)
        assert len(leases) in (1, 2)  # a wake-up may race the second append row
        await producer.ack(leases)
        rest = await producer.demand(5) if len(leases) == 1 else []
        await producer.ack(rest)


async def test_polls_when_the_backend_cannot_push(clock: ManualClock) -> None:
    backend = FlakyBackend(clock=clock, push=False)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders")
        async with Producer(rheo, "orders", "g", poll_ms=10) as producer:
            waiting = asyncio.create_task(producer.demand(5))
            await rheo.append("orders", NewEvent("x"))
            leases = await asyncio.wait_for(waiting, 5)
            assert len(leases) == 1
            await producer.ack(leases)


async def test_fetch_failures_back_off_then_recover(db: Rheo, backend: FlakyBackend) -> None:
    await append(db, 3)
    backend.fetch_failures = 2
    backoff = Backoff(initial_ms=1, max_ms=2, jitter_ms=0)
    async with Producer(db, "orders", "billing", backoff=backoff) as producer:
        leases = await asyncio.wait_for(producer.demand(10), 5)
        assert len(leases) == 3
        stats = producer.stats()
        assert (stats.fetch_failures, stats.fetch_failures_by_kind) == (
            2, {"backend_unavailable": 2})
        assert backoff.failures == 0  # reset after the successful fetch
        await producer.ack(leases)


async def test_unavailable_backend_on_ack_leaves_leases_to_expire(
    db: Rheo, backend: FlakyBackend, clock: ManualClock
) -> None:
    await append(db, 2)
    async with Producer(db, "orders", "billing", lease_ms=1_000) as producer:
        leases = await producer.demand(10)
        backend.ack_error = ConnectionRefusedError("down")
        results = await producer.ack(leases)
        assert {r.kind for r in results} == {"backend_unavailable"}
        assert not producer.inflight  # released: no longer renewed
        assert producer.stats().settle_failures == {"backend_unavailable": 2}
        assert backend.calls["nack"] == 0
        backend.ack_error = None
        assert await db.fetch("orders", "billing", consumer_id="x", limit=10) == []
        clock.advance(1_000)
        again = await db.fetch("orders", "billing", consumer_id="x", limit=10)
        assert sorted(lease.attempt for lease in again) == [2, 2]
        await db.ack(again)


async def test_batches_iterate_until_drained(db: Rheo) -> None:
    await append(db, 7)
    producer = await Producer(db, "orders", "billing", max_demand=3).start()
    seen = []
    async for leases in producer.batches(2):
        assert len(leases) <= 2
        seen.extend(leases)
        await producer.ack(leases)
        if len(seen) == 7:
            drained = asyncio.create_task(producer.drain(1))
    assert await drained
    assert len({lease.event.id for lease in seen}) == 7


async def test_partitions_restrict_fetching(db: Rheo) -> None:
    await append(db, 40)
    async with Producer(db, "orders", "billing", partitions=[1, 3], max_demand=100) as p:
        leases = await p.demand(100)
        assert leases
        assert {lease.partition for lease in leases} <= {1, 3}
        await p.ack(leases)


async def test_max_attempts_updates_the_group(db: Rheo) -> None:
    async with Producer(db, "orders", "billing", max_attempts=2):
        assert (await db.group_info("orders", "billing")).max_attempts == 2


async def test_bad_input_and_lifecycle_errors(db: Rheo) -> None:
    with pytest.raises(InvalidArgument, match="max_demand"):
        Producer(db, "orders", "g", max_demand=0)
    with pytest.raises(InvalidArgument, match="lease_ms"):
        Producer(db, "orders", "g", lease_ms=1)
    with pytest.raises(InvalidArgument, match="stream"):
        Producer(db, "bad name!", "g")
    with pytest.raises(InvalidArgument, match="partitions"):
        Producer(db, "orders", "g", partitions="some")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="rheo"):
        Producer("memory://", "orders", "g")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="partition 9"):
        await Producer(db, "orders", "g", partitions=[9]).start()
    with pytest.raises(UnknownStream):
        await Producer(db, "missing", "g").start()
    producer = Producer(db, "orders", "g")
    with pytest.raises(NotStarted):
        await producer.demand(1)
    await producer.start()
    with pytest.raises(AlreadyStarted):
        await producer.start()
    with pytest.raises(InvalidArgument, match="n must be"):
        await producer.demand(0)
    await producer.stop()
    assert await producer.demand(1) == []


async def test_observer_sees_every_settle_with_its_kind(db: Rheo, backend: FlakyBackend
                                                        ) -> None:
    from rheo_flow import SettleOutcome

    await append(db, 3)
    seen: list[SettleOutcome] = []
    async with Producer(db, "orders", "billing", observer=seen.append) as producer:
        leases = await producer.demand(3)
        await producer.ack(leases[:2])
        backend.ack_error = ConnectionRefusedError("down")
        await producer.ack(leases[2:])
    assert [(o.op, o.result.kind) for o in seen] == [
        ("ack", None), ("ack", None), ("ack", "backend_unavailable")]


async def test_fetch_size_caps_each_fetch(db: Rheo) -> None:
    await append(db, 10)
    async with Producer(db, "orders", "billing", max_demand=8, fetch_size=3) as producer:
        assert producer.fetch_size == 3
        first = await producer.demand(8)
        second = await producer.demand(8)
        assert (len(first), len(second)) == (3, 3)  # the second overlaps the first
        await producer.ack(first + second)
        rest = await producer.demand(8)
        assert len(rest) == 3
        await producer.ack(rest)
    with pytest.raises(InvalidArgument, match=r"fetch_size \(9\) cannot exceed max_demand"):
        Producer(db, "orders", "g", max_demand=8, fetch_size=9)
    with pytest.raises(InvalidArgument, match=r"fetch_size must be an integer \(1 to 1,000,000\)"):
        Producer(db, "orders", "g", fetch_size=0)


async def test_hand_back_makes_unstarted_leases_available_at_once(
    db: Rheo, backend: FlakyBackend
) -> None:
    await append(db, 3)
    producer = await Producer(db, "orders", "billing", lease_ms=60_000).start()
    leases = await producer.demand(10)
    results = await producer.hand_back(leases)
    assert all(r.ok for r in results)
    assert not producer.inflight
    assert backend.nacks == [("shutdown", sorted(lease.sequence for lease in leases))]
    await producer.stop()
    again = await db.fetch("orders", "billing", consumer_id="other", limit=10)
    assert sorted(lease.attempt for lease in again) == [2, 2, 2]
    await db.ack(again)


async def test_a_nack_ends_an_idle_wait(clock: ManualClock) -> None:
    backend = FlakyBackend(clock=clock, push=False)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders")
        await rheo.append("orders", NewEvent("x"))
        async with Producer(rheo, "orders", "g", poll_ms=600_000) as producer:
            [lease] = await producer.demand(5)
            waiting = asyncio.create_task(producer.demand(5))
            for _ in range(20):  # parked in its idle wait: nothing else is available
                await asyncio.sleep(0)
            assert not waiting.done()
            fetches = backend.calls["fetch"]
            await producer.nack([lease], "again")
            [redelivered] = await asyncio.wait_for(waiting, 5)  # not after 10 minutes
            assert redelivered.attempt == 2
            assert backend.calls["fetch"] == fetches + 1
            await producer.ack([redelivered])


async def test_lost_leases_are_skipped_and_renew_failures_counted(
    db: Rheo, clock: ManualClock, wait_until: WaitUntil
) -> None:
    await append(db, 2)
    async with Producer(db, "orders", "billing", lease_ms=60) as producer:
        leases = await producer.demand(10)
        assert not any(producer.lost(lease) for lease in leases)
        clock.advance(61)
        stolen = await db.fetch("orders", "billing", consumer_id="thief", limit=10,
                                lease_ms=60_000)
        await wait_until(lambda: producer.stats().renew_failures["stale_lease"] == 2)
        assert all(producer.lost(lease) for lease in leases)
        for lease in leases:
            producer.skip(lease)
        assert not producer.inflight
        assert producer.stats().skipped == 2
    assert all(r.ok for r in await db.ack(stolen))


async def test_stop_is_not_lost_when_capacity_frees_at_the_same_time(db: Rheo) -> None:
    # A demand waiting for capacity is cancelled just as a settle frees it: the
    # cancellation must still end the demand.
    await append(db, 30)
    async with Producer(db, "orders", "billing", max_demand=2) as producer:
        leases = await producer.demand(2)
        for _ in range(20):
            waiting = asyncio.create_task(producer.demand(2))
            for _ in range(5):
                await asyncio.sleep(0)
            producer.confirm(leases[:1])  # sets the wake-up ...
            waiting.cancel()               # ... in the same iteration as the cancel
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(waiting, 5)
            leases = leases[1:] + await producer.demand(1)
        await producer.ack(leases)


async def test_inflight_tracks_a_fetch_under_one_expiry_and_renews_lease_by_lease(
        db: Rheo) -> None:
    from rheo_flow import Lease
    from rheo_flow._model._settle_results import SettleError, SettleKind, SettleResult
    from rheo_flow._runtime._inflight import Inflight

    await append(db, 4)
    await db.create_group("orders", "billing")
    leases = await db.fetch("orders", "billing", consumer_id="c", limit=4)
    assert len(leases) == 4
    inflight = Inflight(10)
    inflight.add(iter(leases), lease_ms=10_000)  # any iterable
    assert len(inflight) == 4
    assert inflight.free == 6
    fetched_at = {inflight.expires_at(lease.lease_id) for lease in leases}
    assert len(fetched_at) == 1
    assert None not in fetched_at

    class Renewer:
        async def renew(self, batch: list[Lease], *, lease_ms: int) -> list[SettleResult]:
            await asyncio.sleep(0.01)  # the loop clock moves on before the results
            kinds = [None, SettleKind.STALE_LEASE, SettleKind.BACKEND_UNAVAILABLE, None]
            return [SettleResult(lease.lease_id, None if kind is None else SettleError(kind))
                    for lease, kind in zip(batch, kinds, strict=True)]

    first, stale, unavailable, last = leases
    await inflight.renew_all(Renewer(), lease_ms=10_000)
    (old,) = fetched_at
    assert old is not None
    assert inflight.expires_at(first.lease_id) == inflight.expires_at(last.lease_id)
    assert (inflight.expires_at(first.lease_id) or 0) > old  # renewed
    assert inflight.expires_at(unavailable.lease_id) == old  # left as it was
    assert inflight.lost_count == 1
    assert inflight.is_lost(stale.lease_id)
    entry = inflight.get(stale.lease_id)
    assert entry is not None
    assert entry.lost
    assert entry.lease is stale
    assert [e.lease for e in inflight.entries()] == leases
    assert inflight.oldest_expiry(lease.lease_id for lease in leases) == old
    assert inflight.release([stale, unavailable.lease_id, stale]) == 2
    assert inflight.lost_count == 0
    assert not inflight.is_lost(stale.lease_id)
    assert inflight.get(stale.lease_id) is None
    assert inflight.expires_at("nope") is None
    assert len(inflight) == 2


async def test_settle_calls_a_batch_observer_once_per_backend_call(db: Rheo) -> None:
    from typing import cast

    from rheo_flow import Lease
    from rheo_flow._model._settle_results import SettleError, SettleKind, SettleResult
    from rheo_flow._runtime._settle_calls import settle

    await append(db, 3)
    await db.create_group("orders", "billing")
    leases = await db.fetch("orders", "billing", consumer_id="c", limit=3)

    class Stub:
        async def ack(self, batch: list[Lease]) -> list[SettleResult]:
            return [SettleResult(lease.lease_id, SettleError(SettleKind.FAILED, "boom")
                                 if lease is batch[1] else None) for lease in batch]

        async def nack(self, batch: list[Lease], reason: str, *, delay_ms: int = 0
                       ) -> list[SettleResult]:
            assert reason == "settle_failed: failed"
            return [SettleResult(lease.lease_id) for lease in batch]

    calls: list[tuple[str, list[str], list[str | None]]] = []

    def observe(op: str, batch: Sequence[Lease], results: Sequence[SettleResult]) -> None:
        calls.append((op, [lease.lease_id for lease in batch],
                      [None if r.kind is None else r.kind.value for r in results]))

    results = await settle(cast(Rheo, Stub()), "ack", leases, observer=observe)
    assert [r.ok for r in results] == [True, False, True]
    ids = [lease.lease_id for lease in leases]
    assert calls == [("ack", ids, [None, "failed", None]),  # one call for the batch
                     ("nack", [ids[1]], [None])]  # one for the decision table's follow-up


async def test_a_renew_during_a_settle_call_leaves_the_settling_leases_alone(db: Rheo) -> None:
    # The settle may commit on the server before its call returns: a renew in that
    # window would find those leases settled and report them lost.
    from typing import cast

    from rheo_flow import Lease
    from rheo_flow._model._settle_results import SettleResult
    from rheo_flow._runtime._inflight import Inflight
    from rheo_flow._runtime._settle_calls import settle

    await append(db, 4)
    await db.create_group("orders", "billing")
    leases = await db.fetch("orders", "billing", consumer_id="c", limit=4)
    inflight = Inflight(10)
    inflight.add(leases, lease_ms=10_000)
    acking, kept = leases[:3], leases[3:]
    ack_started, finish_ack = asyncio.Event(), asyncio.Event()

    class SlowAck:
        async def ack(self, batch: list[Lease]) -> list[SettleResult]:
            results = await db.ack(batch)  # committed ...
            ack_started.set()
            await finish_ack.wait()        # ... but the call has not returned yet
            return results

    renewed: list[list[str]] = []

    class Renewer:
        async def renew(self, batch: list[Lease], *, lease_ms: int) -> list[SettleResult]:
            renewed.append([lease.lease_id for lease in batch])
            return await db.renew(batch, lease_ms=lease_ms)

    settling = asyncio.create_task(settle(cast(Rheo, SlowAck()), "ack", acking,
                                          inflight=inflight))
    await asyncio.wait_for(ack_started.wait(), 5)
    await inflight.renew_all(Renewer(), lease_ms=10_000)
    assert renewed == [[lease.lease_id for lease in kept]]
    assert inflight.lost_count == 0
    finish_ack.set()
    assert all(result.ok for result in await asyncio.wait_for(settling, 5))
    assert len(inflight) == 1
    await inflight.renew_all(Renewer(), lease_ms=10_000)  # the batch is no longer skipped
    assert renewed[-1] == [kept[0].lease_id]
