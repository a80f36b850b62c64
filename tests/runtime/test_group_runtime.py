"""The consumer-group runtime under time and failure: renewal, stale and failed
settles, fetch back-off, idling and push wake-ups."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

import pytest

from _doubles import FlakyBackend
from rheo_flow import (
    ACK,
    Event,
    Lease,
    ManualClock,
    NewEvent,
    Rheo,
    RheoError,
    consumer,
    current_lease,
)
from rheo_flow._runtime._backoff import Backoff

WaitUntil = Callable[..., Awaitable[None]]
"""The ``wait_until`` fixture of conftest: poll a predicate until true or a deadline."""


class RecordingBackoff(Backoff):
    """A backoff remembering the delays it handed out."""

    def __init__(self, **kwargs: int) -> None:
        super().__init__(**kwargs)
        self.delays: list[float] = []

    def next_delay(self) -> float:
        delay = super().next_delay()
        self.delays.append(delay)
        return delay


@pytest.fixture
def flaky(clock: ManualClock) -> FlakyBackend:
    """A flaky memory backend driven by the manual clock."""
    return FlakyBackend(clock=clock)


@pytest.fixture
async def frheo(flaky: FlakyBackend) -> AsyncIterator[Rheo]:
    """An instance over the flaky backend, with a one-partition stream ``orders``."""
    async with Rheo(flaky) as instance:
        await instance.create_stream("orders")
        yield instance


async def append(rheo: Rheo, count: int) -> None:
    await rheo.append("orders", [NewEvent("order.placed", {"n": i}) for i in range(count)])


# Renewal ------------------------------------------------------------------------------


async def test_slow_handler_keeps_its_lease_through_renewal(wait_until: WaitUntil) -> None:
    # A real short lease on the system clock: only renewal keeps it alive.
    backend = FlakyBackend()
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders")
        await append(rheo, 1)
        started, release = asyncio.Event(), asyncio.Event()
        attempts: list[int] = []

        @consumer(stream="orders", group="billing", lease_ms=400, poll_ms=10)
        async def handle(event: Event, context: Mapping[str, Any]) -> Any:
            attempts.append(current_lease().attempt)
            started.set()
            await release.wait()
            return ACK

        async with handle.start(rheo) as group:
            await asyncio.wait_for(started.wait(), 5)
            stolen: list[Lease] = []

            async def three_lease_periods_without_a_thief() -> bool:
                stolen.extend(await rheo.fetch("orders", "billing", consumer_id="thief",
                                               limit=10, lease_ms=400))
                return backend.calls["renew"] >= 6  # renewed about every 200 ms

            await wait_until(three_lease_periods_without_a_thief, timeout=20)
            assert stolen == []
            release.set()
            await wait_until(lambda: group.stats.acked == 1)
        assert attempts == [1]
        assert not group.stats.renew_failures
        assert not group.stats.settle_failures


async def test_renewal_is_one_call_for_everything_inflight(
    frheo: Rheo, flaky: FlakyBackend, wait_until: WaitUntil,
) -> None:
    await append(frheo, 5)
    release = asyncio.Event()

    @consumer(stream="orders", group="billing", lease_ms=60, max_demand=5, concurrency=5)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        await release.wait()
        return ACK

    async with handle.start(frheo) as group:
        await wait_until(lambda: group.stats.fetched == 5 and len(flaky.renewed) >= 3)
        assert set(flaky.renewed) == {5}
        release.set()
        await wait_until(lambda: group.stats.acked == 5)


async def test_lease_lost_before_handling_is_skipped(
    frheo: Rheo, flaky: FlakyBackend, clock: ManualClock, wait_until: WaitUntil,
) -> None:
    await append(frheo, 2)
    started, release = asyncio.Event(), asyncio.Event()
    handled: list[int] = []

    @consumer(stream="orders", group="billing", lease_ms=60, max_demand=2)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        handled.append(event.sequence)
        started.set()
        await release.wait()
        return ACK

    async with handle.start(frheo) as group:
        await asyncio.wait_for(started.wait(), 5)
        clock.advance(61)
        stolen = await frheo.fetch("orders", "billing", consumer_id="thief", limit=10,
                                   lease_ms=60_000)
        assert [lease.attempt for lease in stolen] == [2, 2]
        await wait_until(lambda: group.stats.renew_failures["stale_lease"] >= 2)
        release.set()
        await wait_until(lambda: group.stats.skipped == 1 and group.inflight == 0)
        assert group.stats.settle_failures == {"stale_lease": 1}
    assert handled == [1]
    assert flaky.nacks == []
    assert all(r.ok for r in await frheo.ack(stolen))


# Settle failures ----------------------------------------------------------------------


async def test_stale_settle_is_dropped(
    frheo: Rheo, flaky: FlakyBackend, clock: ManualClock, wait_until: WaitUntil,
) -> None:
    await append(frheo, 1)
    started, release = asyncio.Event(), asyncio.Event()

    @consumer(stream="orders", group="billing", lease_ms=60_000, max_demand=1)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        started.set()
        await release.wait()
        return ACK

    async with handle.start(frheo) as group:
        await asyncio.wait_for(started.wait(), 5)
        clock.advance(60_001)  # our lease expires and another consumer takes the event
        [stolen] = await frheo.fetch("orders", "billing", consumer_id="thief", lease_ms=60_000)
        assert stolen.attempt == 2
        release.set()
        await wait_until(lambda: group.stats.settle_failures["stale_lease"] == 1)
        await wait_until(lambda: group.inflight == 0)
        assert (group.stats.acked, group.stats.nacked) == (0, 0)
    assert flaky.nacks == []  # no nack: the new lease is not disturbed
    assert (await frheo.ack(stolen))[0].ok


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (ConnectionRefusedError("connection refused"), "backend_unavailable"),
        (TimeoutError("no answer"), "ambiguous"),
    ],
)
async def test_unreachable_or_ambiguous_ack_leaves_the_lease_to_expire(
    frheo: Rheo, flaky: FlakyBackend, clock: ManualClock, wait_until: WaitUntil,
    caplog: pytest.LogCaptureFixture, error: BaseException, kind: str,
) -> None:
    await append(frheo, 1)
    attempts: list[int] = []
    flaky.ack_error = error

    @consumer(stream="orders", group="billing", lease_ms=60_000, poll_ms=10)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        attempts.append(current_lease().attempt)
        return ACK

    async with handle.start(frheo) as group:
        await wait_until(lambda: group.stats.settle_failures[kind] == 1)
        await wait_until(lambda: group.inflight == 0)
        flaky.ack_error = None  # the backend is back
        fetches = flaky.calls["fetch"]
        await wait_until(lambda: flaky.calls["fetch"] >= fetches + 3)
        assert attempts == [1]  # not nacked: nothing comes back before the lease expires
        assert flaky.nacks == []
        clock.advance(60_000)
        await wait_until(lambda: group.stats.acked == 1)
    assert attempts == [1, 2]
    assert await frheo.frontier("orders", "billing") == {0: 1}
    assert kind in caplog.text


async def test_failed_ack_is_nacked_for_immediate_redelivery(
    frheo: Rheo, flaky: FlakyBackend, wait_until: WaitUntil,
) -> None:
    await append(frheo, 1)
    attempts: list[int] = []
    flaky.ack_error = RuntimeError("constraint violated")

    @consumer(stream="orders", group="billing", lease_ms=60_000, poll_ms=10)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        attempts.append(current_lease().attempt)
        if len(attempts) == 2:
            flaky.ack_error = None
        return ACK

    async with handle.start(frheo) as group:
        await wait_until(lambda: group.stats.acked == 1)
    assert attempts == [1, 2]
    assert flaky.nacks == [("settle_failed: failed", [1])]
    assert (group.stats.settle_failures, group.stats.nacked) == ({"failed": 1}, 1)


# Fetching -----------------------------------------------------------------------------


async def test_fetch_failures_back_off_and_recover(
    frheo: Rheo, flaky: FlakyBackend, wait_until: WaitUntil, caplog: pytest.LogCaptureFixture,
) -> None:
    await append(frheo, 1)
    flaky.fetch_failures = 3
    backoff = RecordingBackoff(initial_ms=1, max_ms=50, jitter_ms=0)

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return ACK

    async with handle.start(frheo, backoff=backoff) as group:
        await wait_until(lambda: group.stats.acked == 1)
    assert group.stats.fetch_failures == 3
    assert group.stats.fetch_failures_by_kind == {"backend_unavailable": 3}
    assert backoff.delays == pytest.approx([0.001, 0.002, 0.004])
    assert backoff.failures == 0  # reset by the first successful fetch
    assert "backend_unavailable" in caplog.text


@pytest.mark.parametrize("push", [True, False], ids=["push", "poll"])
async def test_idle_group_does_not_spin(clock: ManualClock, push: bool) -> None:
    backend = FlakyBackend(clock=clock, push=push)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders")

        @consumer(stream="orders", group="billing", poll_ms=50)
        async def handle(event: Event, context: Mapping[str, Any]) -> Any:
            return ACK

        async with handle.start(rheo):
            await asyncio.sleep(0.3)  # the idle period being measured, not a synchronisation
        # About one fetch per poll interval; a spinning loop would make thousands.
        assert 1 <= backend.calls["fetch"] <= 12
        assert (backend.calls["wait"] >= 1) is push


async def test_append_wakes_an_idle_group(frheo: Rheo, flaky: FlakyBackend,
                                          wait_until: WaitUntil) -> None:
    @consumer(stream="orders", group="billing", poll_ms=600_000)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return ACK

    async with handle.start(frheo) as group:
        await wait_until(lambda: flaky.calls["wait"] >= 1)  # parked on the push wake-up
        await append(frheo, 1)
        await wait_until(lambda: group.stats.acked == 1, timeout=5)
    assert flaky.calls["fetch"] <= 3  # woken by the append, not by the 10-minute poll


# Crashes ------------------------------------------------------------------------------


class Fatal(BaseException):
    """Not an Exception: escapes the handler-failure path."""


async def test_crashed_runtime_stops_and_run_raises(frheo: Rheo) -> None:
    await append(frheo, 1)

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        raise Fatal("boom")

    group = handle.start(frheo)
    with pytest.raises(RheoError, match="crashed: Fatal: boom") as info:
        await asyncio.wait_for(group.run(), 5)
    assert isinstance(info.value.__cause__, Fatal)
    assert not group.running
