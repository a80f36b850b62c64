"""The one lifecycle of the runtimes: the same states, the same fatal-error stop and the
same ``async with`` meaning for a Group and a Pipeline."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest

from rheo_flow import (
    ACK,
    Event,
    InvalidArgument,
    Lease,
    ManualClock,
    NewEvent,
    Producer,
    Rheo,
    RheoError,
    StoreLost,
    consumer,
)
from rheo_flow._runtime._lifecycle import State
from rheo_flow.backends import MemoryBackend
from rheo_flow.pipeline import Message, Pipeline

WaitUntil = Callable[..., Awaitable[None]]


class BreakingBackend(MemoryBackend):
    """The memory backend whose fetches raise :attr:`fetch_error` once it is set."""

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.fetch_error: BaseException | None = None
        self.calls: Counter[str] = Counter()
        self.nack_reasons: list[str] = []

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int,
                    lease_ms: int, partitions: Sequence[int] | None) -> list[Lease]:
        if self.fetch_error is not None:
            raise self.fetch_error
        return await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)

    async def nack(self, leases: Sequence[Lease], *args: Any, **kwargs: Any) -> Any:
        self.nack_reasons.append(args[0] if args else kwargs["reason"])
        return await super().nack(leases, *args, **kwargs)


@pytest.fixture
def backend(clock: ManualClock) -> BreakingBackend:
    return BreakingBackend(clock=clock)


@pytest.fixture
async def db(backend: BreakingBackend) -> AsyncIterator[Rheo]:
    async with Rheo(backend) as rheo:
        await rheo.create_stream("orders", partitions=2)
        await rheo.append("orders", [NewEvent("order", {"n": i}) for i in range(10)])
        yield rheo


class _Passing:
    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        return message


def _runtime(kind: str, db: Rheo) -> Any:
    if kind == "pipeline":
        return Pipeline(db, stream="orders", group="billing", handler=_Passing())

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Any) -> Any:
        return ACK

    return handle.start(db)


def _producer(runtime: Any) -> Producer:
    return runtime.producer if isinstance(runtime, Pipeline) else runtime._producer


def test_the_states_are_one_enum_comparable_as_text() -> None:
    assert [state.value for state in State] == [
        "new", "starting", "running", "draining", "stopping", "stopped"]
    assert State.RUNNING == "running"


@pytest.mark.parametrize("kind", ["group", "pipeline"])
@pytest.mark.parametrize(("error", "raised"), [
    (StoreLost("the store lost its data", "orders"), StoreLost),
    (InvalidArgument("a bad fetch"), RheoError),
])
async def test_a_fatal_fetch_error_stops_the_runtime_and_is_raised(
        kind: str, error: BaseException, raised: type[BaseException], db: Rheo,
        backend: BreakingBackend, wait_until: WaitUntil) -> None:
    runtime = await _runtime(kind, db).start()
    backend.fetch_error = error
    await db.append("orders", [NewEvent("order", {"n": 99})])  # wakes an idle fetch
    await wait_until(lambda: runtime.state == "stopped")
    assert _producer(runtime).state == "stopped"
    with pytest.raises(raised) as info:
        await runtime.run_until_empty(5)
    assert info.value is error or info.value.__cause__ is error


@pytest.mark.parametrize("kind", ["group", "pipeline"])
async def test_leaving_async_with_cleanly_drains(kind: str, db: Rheo, backend: BreakingBackend,
                                                 wait_until: WaitUntil) -> None:
    runtime = _runtime(kind, db)
    async with runtime:
        await wait_until(lambda: _producer(runtime).stats().fetched >= 1)
    assert runtime.state == "stopped"
    assert not _producer(runtime).inflight
    assert "shutdown" not in backend.nack_reasons  # nothing handed back: all finished


@pytest.mark.parametrize("kind", ["group", "pipeline"])
async def test_leaving_async_with_on_an_error_stops_at_once(
        kind: str, db: Rheo, backend: BreakingBackend, wait_until: WaitUntil) -> None:
    runtime = _runtime(kind, db)

    async def use() -> None:
        async with runtime:
            await wait_until(lambda: _producer(runtime).stats().fetched >= 1)
            raise LookupError("the application failed")

    with pytest.raises(LookupError):
        await use()
    assert runtime.state == "stopped"
    assert _producer(runtime).state == "stopped"
