"""Cancellation of every runtime at the await points that matter.

For each runtime (Producer, Group, Pipeline) and each of ``start``, ``drain``,
``stop`` and ``__aexit__``: the caller is cancelled while the call waits on the
backend (or on handlers); the caller sees its ``CancelledError``, and once the
runtime is stopped no task of its own is left running (so no lease is renewed)
and its producer is stopped too.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

import pytest

from rheo_flow import ACK, Event, ManualClock, NewEvent, Producer, Rheo, consumer
from rheo_flow.backends import MemoryBackend
from rheo_flow.pipeline import Message, Pipeline, Processors

WaitUntil = Callable[..., Awaitable[None]]


class GatedBackend(MemoryBackend):
    """The memory backend whose operations named in :attr:`gates` wait for their gate.

    :attr:`entered` is set for an operation as a call of it starts waiting. A gated
    call that is cancelled still waits for its gate before it ends, as a driver
    finishing its round trip does: the cancellation of whoever awaits it is then
    pending across that wait.
    """

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.gates: dict[str, asyncio.Event] = {}
        self.entered: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.calls: Counter[str] = Counter()

    def gate(self, op: str) -> asyncio.Event:
        """Close the gate of ``op``: its calls wait until the event is set."""
        self.gates[op] = asyncio.Event()
        return self.gates[op]

    async def _pass(self, op: str) -> None:
        self.calls[op] += 1
        gate = self.gates.get(op)
        if gate is None or gate.is_set():
            return
        self.entered[op].set()
        try:
            await gate.wait()
        except asyncio.CancelledError:
            await gate.wait()
            raise

    async def stream_info(self, *args: Any, **kwargs: Any) -> Any:
        await self._pass("stream_info")
        return await super().stream_info(*args, **kwargs)

    async def ack(self, *args: Any, **kwargs: Any) -> Any:
        await self._pass("ack")
        return await super().ack(*args, **kwargs)

    async def nack(self, *args: Any, **kwargs: Any) -> Any:
        await self._pass("nack")
        return await super().nack(*args, **kwargs)

    async def renew(self, *args: Any, **kwargs: Any) -> Any:
        await self._pass("renew")
        return await super().renew(*args, **kwargs)


@pytest.fixture
def backend(clock: ManualClock) -> GatedBackend:
    return GatedBackend(clock=clock)


@pytest.fixture
async def db(backend: GatedBackend) -> AsyncIterator[Rheo]:
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders", partitions=2)
        await rheo.append("orders", [NewEvent("order", {"n": i}) for i in range(20)])
        yield rheo


class Held:
    """Handlers that wait until released (``started`` counts those that began)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def __call__(self, *_: Any) -> None:
        self.started += 1
        await self.release.wait()


async def _entered(event: asyncio.Event) -> None:
    async with asyncio.timeout(5):
        await event.wait()


async def _cancelled_while(call: Coroutine[Any, Any, Any], reached: Callable[[], Awaitable[None]],
                           *gates: asyncio.Event) -> None:
    """Run ``call``, cancel it once ``reached`` returns, then open ``gates``: the caller
    must see its cancellation."""
    task = asyncio.ensure_future(call)
    await reached()
    assert not task.done(), "the call ended before it could be cancelled"
    task.cancel()
    for gate in gates:
        gate.set()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()


async def _assert_ended(runtime: Producer | Any, producer: Producer, wait_until: WaitUntil,
                        *, stop: bool) -> None:
    """Stopped (by one more ``stop()`` if ``stop``; else on its own, by the cancelled
    call), its producer stopped, no task but the test's own left running; and a
    further ``stop()`` changes nothing."""
    if stop:
        await asyncio.wait_for(runtime.stop(), 5)
    else:
        await wait_until(lambda: runtime.state == "stopped")
    assert producer.state == "stopped"
    mine = asyncio.current_task()
    await wait_until(lambda: not [t for t in asyncio.all_tasks() if t is not mine])
    await asyncio.wait_for(runtime.stop(), 5)
    assert runtime.state == "stopped"


# Producer ------------------------------------------------------------------------------


async def test_producer_start_cancelled(db: Rheo, backend: GatedBackend,
                                        wait_until: WaitUntil) -> None:
    producer = Producer(db, "orders", "billing")
    gate = backend.gate("stream_info")
    await _cancelled_while(producer.start(), lambda: _entered(backend.entered["stream_info"]),
                           gate)
    await _assert_ended(producer, producer, wait_until, stop=True)


async def test_producer_drain_cancelled(db: Rheo, wait_until: WaitUntil) -> None:
    producer = await Producer(db, "orders", "billing", max_demand=5).start()
    assert await producer.demand(5)

    async def draining() -> None:
        await wait_until(lambda: producer.state == "draining")

    await _cancelled_while(producer.drain(), draining)
    assert producer.state == "draining"  # its leases are still held and renewed
    await _assert_ended(producer, producer, wait_until, stop=True)


async def test_producer_stop_cancelled_raises_to_its_caller(
        db: Rheo, backend: GatedBackend, wait_until: WaitUntil) -> None:
    """A stop cancelled while the renewer ends: the caller sees the cancellation, and
    the producer still ends stopped, renewing nothing."""
    producer = await Producer(db, "orders", "billing", max_demand=5, lease_ms=10).start()
    assert await producer.demand(5)
    gate = backend.gate("renew")
    await _entered(backend.entered["renew"])

    async def stopping() -> None:
        await wait_until(lambda: producer.state == "stopping")

    await _cancelled_while(producer.stop(), stopping, gate)
    await _assert_ended(producer, producer, wait_until, stop=False)


async def test_producer_aexit_cancelled_while_draining(db: Rheo, wait_until: WaitUntil
                                                       ) -> None:
    producer = Producer(db, "orders", "billing", max_demand=5)

    async def use() -> None:
        async with producer:
            assert await producer.demand(5)  # never settled: the exit's drain waits

    async def draining() -> None:
        await wait_until(lambda: producer.state == "draining")

    await _cancelled_while(use(), draining)
    await _assert_ended(producer, producer, wait_until, stop=False)


# Group ---------------------------------------------------------------------------------


def _group(db: Rheo, held: Held) -> Any:
    @consumer(stream="orders", group="billing", concurrency=2, max_demand=4)
    async def handle(event: Event, context: Any) -> Any:
        await held(event)
        return ACK

    return handle.start(db)


async def test_group_start_cancelled(db: Rheo, backend: GatedBackend,
                                     wait_until: WaitUntil) -> None:
    group = _group(db, Held())
    gate = backend.gate("stream_info")
    await _cancelled_while(group.start(), lambda: _entered(backend.entered["stream_info"]),
                           gate)
    await _assert_ended(group, group._producer, wait_until, stop=True)


async def test_group_drain_cancelled(db: Rheo, wait_until: WaitUntil) -> None:
    held = Held()
    group = await _group(db, held).start()
    await wait_until(lambda: held.started == 2)

    async def draining() -> None:
        await wait_until(lambda: group.state == "draining")

    await _cancelled_while(group.drain(), draining)
    assert group.running  # a cancelled drain leaves the group holding its leases
    await _assert_ended(group, group._producer, wait_until, stop=True)


async def test_group_stop_cancelled_while_handing_back(
        db: Rheo, backend: GatedBackend, wait_until: WaitUntil) -> None:
    held = Held()
    group = await _group(db, held).start()
    await wait_until(lambda: held.started == 2)
    gate = backend.gate("nack")
    await _cancelled_while(group.stop(), lambda: _entered(backend.entered["nack"]), gate)
    await _assert_ended(group, group._producer, wait_until, stop=False)
    assert backend.calls["nack"] == 1  # the hand-back went out once, to its end


async def test_group_aexit_cancelled_while_draining(db: Rheo, wait_until: WaitUntil
                                                    ) -> None:
    held = Held()
    group = _group(db, held)

    async def use() -> None:
        async with group:
            await wait_until(lambda: held.started == 2)

    async def draining() -> None:
        await wait_until(lambda: group.state == "draining")

    await _cancelled_while(use(), draining)
    await _assert_ended(group, group._producer, wait_until, stop=False)


# Pipeline ------------------------------------------------------------------------------


class _HeldHandler:
    def __init__(self, held: Held) -> None:
        self.held = held

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        await self.held(message)
        return message


def _pipeline(db: Rheo, held: Held) -> Pipeline:
    return Pipeline(db, stream="orders", group="billing", handler=_HeldHandler(held),
                    processors=Processors(concurrency=2, max_demand=2), max_inflight=8)


async def test_pipeline_start_cancelled(db: Rheo, backend: GatedBackend,
                                        wait_until: WaitUntil) -> None:
    pipeline = _pipeline(db, Held())
    gate = backend.gate("stream_info")
    await _cancelled_while(pipeline.start(), lambda: _entered(backend.entered["stream_info"]),
                           gate)
    await _assert_ended(pipeline, pipeline.producer, wait_until, stop=True)


async def test_pipeline_drain_cancelled_stops_it(db: Rheo, wait_until: WaitUntil) -> None:
    held = Held()
    pipeline = await _pipeline(db, held).start()
    await wait_until(lambda: held.started == 2)

    async def draining() -> None:
        await wait_until(lambda: pipeline.state == "draining")

    await _cancelled_while(pipeline.drain(), draining)
    await _assert_ended(pipeline, pipeline.producer, wait_until, stop=True)


async def test_pipeline_stop_cancelled_while_handing_back(
        db: Rheo, backend: GatedBackend, wait_until: WaitUntil) -> None:
    """A stop cancelled while it hands leases back still stops the producer: nothing
    keeps renewing the leases."""
    held = Held()
    pipeline = await _pipeline(db, held).start()
    await wait_until(lambda: held.started == 2)
    gate = backend.gate("nack")
    await _cancelled_while(pipeline.stop(), lambda: _entered(backend.entered["nack"]), gate)
    await _assert_ended(pipeline, pipeline.producer, wait_until, stop=False)
    assert backend.calls["nack"] == 1


async def test_pipeline_aexit_cancelled_while_draining(db: Rheo, wait_until: WaitUntil
                                                       ) -> None:
    held = Held()
    pipeline = _pipeline(db, held)

    async def use() -> None:
        async with pipeline:
            await wait_until(lambda: held.started == 2)

    async def draining() -> None:
        await wait_until(lambda: pipeline.state == "draining")

    await _cancelled_while(use(), draining)
    await _assert_ended(pipeline, pipeline.producer, wait_until, stop=False)
