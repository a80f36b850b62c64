"""The consumer-group runtime: consumers, outcomes, setup, lifecycle, draining."""

from __future__ import annotations

import asyncio
import importlib.util
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from rheo_flow import (
    ACK,
    AlreadyStarted,
    Consumer,
    Event,
    Group,
    InvalidArgument,
    Lease,
    ManualClock,
    NewEvent,
    NotStarted,
    Reject,
    Retry,
    RetryPolicy,
    Rheo,
    SettleOutcome,
    SettleResult,
    SetupRefused,
    UnknownStream,
    consumer,
    current_lease,
)
from rheo_flow.backends import MemoryBackend

WaitUntil = Callable[..., Awaitable[None]]
"""The ``wait_until`` fixture of conftest: poll a predicate until true or a deadline."""

HAVE_SQLITE = importlib.util.find_spec("rheo_flow._backends.sqlite") is not None


class RecordingBackend(MemoryBackend):
    """The memory backend, recording every nack's reason and counting calls."""

    def __init__(self, *, clock: ManualClock | None = None) -> None:
        super().__init__(clock=clock)
        self.calls: Counter[str] = Counter()
        self.nacks: list[tuple[str, list[int]]] = []

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        self.calls["fetch"] += 1
        return await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        self.calls["ack"] += 1
        return await super().ack(leases)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        self.calls["nack"] += 1
        self.nacks.append((reason, [lease.sequence for lease in leases]))
        return await super().nack(leases, reason, delay_ms, error)


@pytest.fixture(params=["memory", "sqlite"])
async def any_rheo(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rheo]:
    """An instance over each backend that exists, with the system clock."""
    if request.param == "memory":
        backend: Any = MemoryBackend()
    else:
        if not HAVE_SQLITE:
            pytest.skip("the SQLite backend is not available yet")
        from rheo_flow.backends import SQLiteBackend

        backend = SQLiteBackend(str(tmp_path / "group.db"))
    async with Rheo(backend) as instance:
        yield instance


@pytest.fixture
def recording(clock: ManualClock) -> RecordingBackend:
    """A recording memory backend driven by the manual clock."""
    return RecordingBackend(clock=clock)


@pytest.fixture
async def rec_rheo(recording: RecordingBackend) -> AsyncIterator[Rheo]:
    """An instance over the recording backend, with a one-partition stream ``orders``."""
    async with Rheo(recording) as instance:
        await instance.create_stream("orders")
        yield instance


async def append(rheo: Rheo, count: int, stream: str = "orders") -> None:
    await rheo.append(stream, [NewEvent("order.placed", {"n": i}, key=f"k{i}")
                               for i in range(count)])


# Outcomes and consumers --------------------------------------------------------------


def test_outcomes_validate_their_fields() -> None:
    assert Retry("busy").delay_ms is None  # the group's retry_policy decides
    assert Retry("busy", delay_ms=50) == Retry("busy", 50)
    with pytest.raises(InvalidArgument, match="reason"):
        Retry("")
    with pytest.raises(InvalidArgument, match="delay_ms"):
        Retry("busy", delay_ms=-1)
    with pytest.raises(InvalidArgument, match="reason"):
        Reject(42)  # type: ignore[arg-type]
    with pytest.raises(AttributeError):
        Retry("busy").reason = "other"  # type: ignore[misc]


def test_current_lease_outside_a_handler() -> None:
    with pytest.raises(NotStarted, match="handle_event"):
        current_lease()


async def test_decorated_function_is_a_consumer() -> None:
    @consumer(stream="orders", group="billing", concurrency=2)
    async def handle(event: Event, context: Mapping[str, Any]) -> Retry:
        return Retry("later")

    assert isinstance(handle, Consumer)
    assert handle.options == {"stream": "orders", "group": "billing", "concurrency": 2}
    assert "handle" in repr(handle)


async def test_options_resolve_class_constructor_and_start(rheo: Rheo) -> None:
    class Billing(Consumer):
        stream = "orders"
        group = "billing"
        concurrency = 4

        async def handle_event(self, event: Event, context: Mapping[str, Any]) -> Retry:
            return Retry("never called")

    group = Billing(concurrency=3, region="eu").start(rheo, max_demand=10, tenant="acme")
    opts = group.options
    assert (opts["stream"], opts["group"], opts["concurrency"], opts["max_demand"]) == (
        "orders", "billing", 3, 10)
    assert (opts["region"], opts["tenant"], opts["rheo"]) == ("eu", "acme", rheo)
    assert (opts["lease_ms"], opts["poll_ms"], opts["partitions"]) == (30_000, 200, "all")
    assert opts["consumer_id"] == group.consumer_id
    assert rheo.instance_id in group.consumer_id  # generated by rheo.new_consumer_id()
    with pytest.raises(TypeError):
        opts["stream"] = "other"  # type: ignore[index]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"stream": None}, "has no stream"),
        ({"group": "bad name"}, "invalid group name"),
        ({"max_demand": 0}, "max_demand"),
        ({"max_demand": 1_000_001}, "max_demand"),
        ({"concurrency": 0}, "concurrency"),
        ({"concurrency": 11, "max_demand": 10}, "cannot exceed max_demand"),
        ({"lease_ms": 5}, "lease_ms"),
        ({"poll_ms": 0}, "poll_ms"),
        ({"consumer_id": "a b"}, "consumer name"),
        ({"partitions": "some"}, "partitions"),
        ({"partitions": []}, "must not be empty"),
        ({"partitions": [-1]}, "partition ids"),
        ({"max_attempts": 0}, "max_attempts"),
    ],
)
def test_invalid_options_are_refused(rheo: Rheo, options: dict[str, Any], message: str) -> None:
    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Retry:
        return Retry("never called")

    with pytest.raises(InvalidArgument, match=message):
        handle.start(rheo, **options)


def test_group_needs_a_rheo_and_a_consumer(rheo: Rheo) -> None:
    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Retry:
        return Retry("never called")

    with pytest.raises(InvalidArgument, match="Rheo"):
        Group("memory://", handle)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="Consumer"):
        Group(rheo, handle.handle_event)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="not as an option"):
        CountingConsumer(rheo=rheo).start(rheo)


async def test_start_checks_the_stream_and_partitions(rheo: Rheo) -> None:
    @consumer(stream="orders", group="billing", partitions=[5])
    async def handle(event: Event, context: Mapping[str, Any]) -> Retry:
        return Retry("never called")

    with pytest.raises(UnknownStream):
        await handle.start(rheo).start()
    await rheo.create_stream("orders", partitions=2)
    with pytest.raises(InvalidArgument, match="partition 5 is out of range"):
        await handle.start(rheo).start()
    async with handle.start(rheo, partitions=[1]) as group:  # the slot was released
        assert group.running


# Settling outcomes --------------------------------------------------------------------


async def test_ack_path_end_to_end(any_rheo: Rheo, wait_until: WaitUntil) -> None:
    await any_rheo.create_stream("orders", partitions=4)
    await append(any_rheo, 1000)
    seen: Counter[tuple[int, int]] = Counter()
    running = peak = 0

    @consumer(stream="orders", group="billing", concurrency=8, max_demand=100)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        seen[(event.partition, event.sequence)] += 1
        await asyncio.sleep(0)  # let the other handlers interleave
        running -= 1
        return ACK

    async with handle.start(any_rheo) as group:
        await wait_until(lambda: group.stats.acked == 1000, timeout=60, message="1000 acks")
        assert await group.drain(timeout=10)
        assert group.inflight == 0
    assert len(seen) == 1000
    assert set(seen.values()) == {1}
    assert 1 < peak <= 8
    assert await any_rheo.frontier("orders", "billing") == await any_rheo.high_water("orders")
    assert await any_rheo.fetch("orders", "billing", limit=100) == []
    stats = group.stats
    assert (stats.fetched, stats.retried, stats.rejected, stats.nacked) == (1000, 0, 0, 0)
    assert not stats.settle_failures
    assert not stats.fetch_failures
    assert not stats.renew_failures


async def test_acks_are_batched(rec_rheo: Rheo, recording: RecordingBackend,
                                wait_until: WaitUntil) -> None:
    await append(rec_rheo, 200)

    @consumer(stream="orders", group="billing", concurrency=8)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        await asyncio.sleep(0)
        return ACK

    async with handle.start(rec_rheo) as group:
        await wait_until(lambda: group.stats.acked == 200)
    # Everything finished within one acknowledger wake-up goes out in one call.
    assert recording.calls["ack"] <= 200 // 4


async def test_max_demand_bounds_outstanding_leases(rec_rheo: Rheo,
                                                    wait_until: WaitUntil) -> None:
    await append(rec_rheo, 50)
    release = asyncio.Event()
    started = 0

    @consumer(stream="orders", group="billing", concurrency=2, max_demand=5, poll_ms=10)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        nonlocal started
        started += 1
        await release.wait()
        return ACK

    async with handle.start(rec_rheo) as group:
        await wait_until(lambda: started == 2 and group.stats.fetched == 5)
        for _ in range(20):  # the fetch loop stays parked while nothing settles
            await asyncio.sleep(0)
        assert (group.stats.fetched, group.inflight, started) == (5, 5, 2)
        release.set()
        await wait_until(lambda: group.stats.acked == 50)
    assert group.stats.fetched == 50


async def test_fetch_size_lets_the_next_fetch_overlap_the_last_batch(
        rec_rheo: Rheo, recording: RecordingBackend, wait_until: WaitUntil) -> None:
    await append(rec_rheo, 40)
    sizes: list[int] = []
    fetch = recording.fetch

    async def sized_fetch(*args: Any) -> list[Lease]:
        leases = await fetch(*args)
        sizes.append(len(leases))
        return leases

    recording.fetch = sized_fetch  # type: ignore[method-assign]
    release = asyncio.Event()

    @consumer(stream="orders", group="billing", concurrency=5, max_demand=10, fetch_size=5,
              poll_ms=10)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        await release.wait()
        return ACK

    async with handle.start(rec_rheo) as group:
        # The first batch is being handled and nothing has settled, yet the second
        # is already fetched: max_demand is reached in two calls of fetch_size.
        await wait_until(lambda: group.stats.fetched == 10)
        assert (sizes, group.stats.acked) == ([5, 5], 0)
        assert group.options["fetch_size"] == 5
        release.set()
        await wait_until(lambda: group.stats.acked == 40)
    assert max(sizes) == 5


async def test_fetch_size_defaults_to_max_demand_and_cannot_exceed_it(rec_rheo: Rheo) -> None:
    @consumer(stream="orders", group="billing", max_demand=7)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return ACK

    assert Group(rec_rheo, handle).options["fetch_size"] == 7
    with pytest.raises(InvalidArgument, match=r"fetch_size \(8\) cannot exceed max_demand \(7\)"):
        Group(rec_rheo, handle, fetch_size=8)
    with pytest.raises(InvalidArgument, match=r"fetch_size must be an integer \(1 to 1,000,000\)"):
        Group(rec_rheo, handle, fetch_size=0)


async def test_retry_redelivers_with_the_next_attempt(any_rheo: Rheo,
                                                      wait_until: WaitUntil) -> None:
    await any_rheo.create_stream("orders")
    await append(any_rheo, 1)
    attempts: list[int] = []

    @consumer(stream="orders", group="billing", poll_ms=20)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        attempts.append(current_lease().attempt)
        return Retry("busy") if len(attempts) == 1 else ACK

    async with handle.start(any_rheo) as group:
        await wait_until(lambda: group.stats.acked == 1)
    assert attempts == [1, 2]
    assert group.stats.retried == 1
    assert await any_rheo.frontier("orders", "billing") == {0: 1}


async def test_retry_delay_postpones_redelivery(rec_rheo: Rheo, recording: RecordingBackend,
                                                clock: ManualClock,
                                                wait_until: WaitUntil) -> None:
    await append(rec_rheo, 1)
    attempts: list[int] = []

    @consumer(stream="orders", group="billing", poll_ms=10)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        attempts.append(current_lease().attempt)
        return Retry("later", delay_ms=60_000) if len(attempts) == 1 else ACK

    async with handle.start(rec_rheo) as group:
        await wait_until(lambda: group.stats.retried == 1)
        fetches = recording.calls["fetch"]
        await wait_until(lambda: recording.calls["fetch"] >= fetches + 3)
        assert attempts == [1]
        clock.advance(60_000)
        await wait_until(lambda: group.stats.acked == 1)
    assert attempts == [1, 2]


async def test_reject_dead_letters(any_rheo: Rheo, wait_until: WaitUntil) -> None:
    await any_rheo.create_stream("orders")
    await append(any_rheo, 2)

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return Reject("malformed order") if event.sequence == 1 else ACK

    async with handle.start(any_rheo) as group:
        await wait_until(lambda: group.stats.rejected == 1 and group.stats.acked == 1)
    [dead] = await any_rheo.dead_letters("orders", "billing")
    assert (dead.sequence, dead.reason, dead.attempts) == (1, "malformed order", 1)
    assert await any_rheo.frontier("orders", "billing") == {0: 2}


async def test_poison_event_is_dead_lettered_at_max_attempts(any_rheo: Rheo,
                                                             wait_until: WaitUntil) -> None:
    await any_rheo.create_stream("orders")
    await append(any_rheo, 3)
    calls: Counter[int] = Counter()

    @consumer(stream="orders", group="billing", max_attempts=3, poll_ms=20)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        calls[event.sequence] += 1
        if event.sequence == 2:
            raise ValueError("cannot parse")
        return ACK

    async with handle.start(any_rheo) as group:
        # The third failure's nack is sent after the handler returns: wait for it too.
        await wait_until(lambda: group.stats.acked == 2 and group.stats.handler_errors == 3
                         and group.stats.dead_lettered == 1)
        dead = await any_rheo.dead_letters("orders", "billing")
        await wait_until(lambda: group.inflight == 0)
    assert [(d.sequence, d.reason, d.attempts) for d in dead] == [(2, "max_attempts", 3)]
    assert calls == {1: 1, 2: 3, 3: 1}
    assert await any_rheo.frontier("orders", "billing") == {0: 3}
    assert (await any_rheo.group_info("orders", "billing")).max_attempts == 3


async def test_handler_raise_is_nacked_with_handler_error(
    rec_rheo: Rheo, recording: RecordingBackend, wait_until: WaitUntil,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await append(rec_rheo, 1)
    attempts: list[int] = []

    @consumer(stream="orders", group="billing", poll_ms=10,
              retry_policy=RetryPolicy.immediate())
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        attempts.append(current_lease().attempt)
        if len(attempts) == 1:
            raise KeyError("customer")
        return ACK

    async with handle.start(rec_rheo) as group:
        await wait_until(lambda: group.stats.acked == 1)
    assert recording.nacks == [("handler_error: KeyError: 'customer'", [1])]
    assert attempts == [1, 2]
    assert (group.stats.handler_errors, group.stats.nacked) == (1, 1)
    assert "KeyError" in caplog.text


async def test_handler_cancelling_itself_is_a_handler_error(
    rec_rheo: Rheo, recording: RecordingBackend, wait_until: WaitUntil,
) -> None:
    await append(rec_rheo, 1)

    @consumer(stream="orders", group="billing", poll_ms=10,
              retry_policy=RetryPolicy.immediate())
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        if current_lease().attempt == 1:
            raise asyncio.CancelledError  # e.g. an inner task it awaited was cancelled
        return ACK

    async with handle.start(rec_rheo) as group:
        await wait_until(lambda: group.stats.acked == 1)
    assert recording.nacks == [("handler_error: CancelledError", [1])]


@pytest.mark.parametrize(
    ("returned", "reason"),
    [
        ("ok", "invalid_outcome: 'ok'"),
        (None, "invalid_outcome: None"),
        (("retry", "x"), "invalid_outcome: ('retry', 'x')"),
    ],
)
async def test_invalid_outcome_is_nacked(
    rec_rheo: Rheo, recording: RecordingBackend, wait_until: WaitUntil,
    returned: object, reason: str,
) -> None:
    await append(rec_rheo, 1)

    @consumer(stream="orders", group="billing", poll_ms=10,
              retry_policy=RetryPolicy.immediate())
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return returned if current_lease().attempt == 1 else ACK

    async with handle.start(rec_rheo) as group:
        await wait_until(lambda: group.stats.acked == 1)
    assert recording.nacks == [(reason, [1])]
    assert (group.stats.invalid_outcomes, group.stats.handler_errors) == (1, 0)


async def test_observer_sees_every_settle(rec_rheo: Rheo, wait_until: WaitUntil) -> None:
    await append(rec_rheo, 3)
    seen: list[tuple[str, int, bool]] = []

    def observer(outcome: SettleOutcome) -> None:
        seen.append((outcome.op, outcome.lease.sequence, outcome.result.ok))
        raise RuntimeError("a broken observer does not break the group")

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return Reject("no") if event.sequence == 2 else ACK

    async with handle.start(rec_rheo, observer=observer) as group:
        await wait_until(lambda: len(seen) == 3)
        assert group.stats.acked == 2
    assert sorted(seen) == [("ack", 1, True), ("ack", 3, True), ("reject", 2, True)]


async def test_partitions_restrict_what_is_consumed(rheo: Rheo,
                                                    wait_until: WaitUntil) -> None:
    await rheo.create_stream("orders", partitions=3)
    await rheo.append("orders", [NewEvent("t", i, partition=i % 3) for i in range(9)])
    seen: list[int] = []

    @consumer(stream="orders", group="billing", partitions=[1])
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        seen.append(event.partition)
        return ACK

    async with handle.start(rheo) as group:
        await wait_until(lambda: group.stats.acked == 3)
    assert seen == [1, 1, 1]
    assert await rheo.frontier("orders", "billing") == {0: 0, 1: 3, 2: 0}


# Setup ----------------------------------------------------------------------------------


class CountingConsumer(Consumer):
    stream = "orders"
    group = "billing"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.setup_options: Mapping[str, Any] = {}
        self.contexts: list[Mapping[str, Any]] = []

    async def setup(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
        self.setup_options = options
        return {"counter": options["counter"], "label": "billing"}

    async def handle_event(self, event: Event, context: Mapping[str, Any]) -> Any:
        self.contexts.append(context)
        context["counter"][event.sequence] += 1
        with pytest.raises(TypeError):
            context["label"] = "changed"  # type: ignore[index]
        return ACK


async def test_setup_builds_a_read_only_context(rec_rheo: Rheo, wait_until: WaitUntil) -> None:
    await append(rec_rheo, 2)
    counter: Counter[int] = Counter()
    billing = CountingConsumer()

    async with billing.start(rec_rheo, counter=counter, concurrency=2) as group:
        await wait_until(lambda: group.stats.acked == 2)
    assert counter == {1: 1, 2: 1}
    options = billing.setup_options
    assert options["rheo"] is rec_rheo
    assert (options["stream"], options["group"], options["concurrency"]) == (
        "orders", "billing", 2)
    assert options["consumer_id"] == group.consumer_id
    assert billing.contexts[0] is billing.contexts[1] is group.context
    assert dict(group.context) == {"counter": counter, "label": "billing"}


async def test_default_setup_gives_an_empty_context(rec_rheo: Rheo,
                                                    wait_until: WaitUntil) -> None:
    await append(rec_rheo, 1)
    contexts: list[Mapping[str, Any]] = []

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        contexts.append(context)
        return ACK

    async with handle.start(rec_rheo) as group:
        await wait_until(lambda: group.stats.acked == 1)
    assert contexts == [{}]


async def test_setup_function_of_a_decorated_consumer(rec_rheo: Rheo,
                                                      wait_until: WaitUntil) -> None:
    await append(rec_rheo, 1)
    seen: list[str] = []

    async def setup(options: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"tenant": options["tenant"]}

    @consumer(stream="orders", group="billing", setup=setup, tenant="acme")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        seen.append(context["tenant"])
        return ACK

    async with handle.start(rec_rheo) as group:
        await wait_until(lambda: group.stats.acked == 1)
    assert seen == ["acme"]


@pytest.mark.parametrize("context", [None, ["a", "b"], "text", 42])
async def test_non_mapping_context_refuses_to_start(rheo: Rheo, context: object) -> None:
    await rheo.create_stream("orders")

    async def setup(options: Mapping[str, Any]) -> Any:
        return context

    @consumer(stream="orders", group="billing", setup=setup)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return ACK

    refused = r"invalid_context: handle.setup\(\) must return a mapping"
    with pytest.raises(SetupRefused, match=refused):
        async with handle.start(rheo):
            pytest.fail("the group must not start")

    @consumer(stream="orders", group="billing")
    async def plain(event: Event, context: Mapping[str, Any]) -> Any:
        return ACK

    async with plain.start(rheo) as group:  # the slot was released
        assert group.running


async def test_setup_refusal(rheo: Rheo) -> None:
    await rheo.create_stream("orders")

    class Refusing(Consumer):
        stream = "orders"
        group = "billing"

        async def setup(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
            if "database" not in options:
                raise SetupRefused("no database configured")
            return {}

        async def handle_event(self, event: Event, context: Mapping[str, Any]) -> Any:
            return ACK

    with pytest.raises(SetupRefused, match="no database configured"):
        await Refusing().start(rheo).start()

    class Broken(Refusing):
        async def setup(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
            return {"db": options["database"]}

    with pytest.raises(SetupRefused, match=r"Broken.setup\(\) failed: KeyError") as info:
        await Broken().start(rheo).start()
    assert isinstance(info.value.__cause__, KeyError)
    async with Refusing().start(rheo, database="db") as group:
        assert group.running


# Lifecycle ------------------------------------------------------------------------------


async def test_one_group_per_instance_stream_and_group(rheo: Rheo, clock: ManualClock) -> None:
    await rheo.create_stream("orders")

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return ACK

    async with handle.start(rheo) as first:
        with pytest.raises(AlreadyStarted, match="'billing' already runs"):
            await handle.start(rheo).start()
        with pytest.raises(AlreadyStarted, match="already started"):
            await first.start()
        async with handle.start(rheo, group="audit") as other:
            assert other.running
        async with Rheo(rheo.backend) as second, handle.start(second) as elsewhere:
            assert elsewhere.running
    assert not first.running
    async with handle.start(rheo) as again:
        assert again.running


async def test_drain_with_timeout(rec_rheo: Rheo, recording: RecordingBackend,
                                  wait_until: WaitUntil) -> None:
    await append(rec_rheo, 1)
    release = asyncio.Event()
    started = asyncio.Event()

    @consumer(stream="orders", group="billing", poll_ms=10)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        started.set()
        await release.wait()
        return ACK

    async with handle.start(rec_rheo) as group:
        await asyncio.wait_for(started.wait(), 5)
        assert await group.drain(timeout=0.05) is False
        assert group.inflight == 1
        release.set()
        assert await group.drain(timeout=5) is True
        assert (group.inflight, group.stats.acked) == (1 - 1, 1)
        # A drained group fetches no more.
        fetches = recording.calls["fetch"]
        await append(rec_rheo, 1)
        for _ in range(20):
            await asyncio.sleep(0)
        assert recording.calls["fetch"] == fetches
    with pytest.raises(NotStarted):
        await group.drain(timeout=1)


async def test_stop_nacks_unfinished_work(rec_rheo: Rheo, recording: RecordingBackend,
                                          wait_until: WaitUntil) -> None:
    await append(rec_rheo, 4)
    started: list[int] = []

    @consumer(stream="orders", group="billing", max_demand=4, concurrency=2)
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        started.append(event.sequence)
        await asyncio.Event().wait()  # never finishes
        return ACK

    async with handle.start(rec_rheo) as group:
        # Two handlers running, two leases fetched behind them and never started.
        await wait_until(lambda: len(started) == 2 and group.stats.fetched == 4)
        await group.stop()
    assert recording.nacks == [("shutdown", [1, 2, 3, 4])]
    assert not group.running
    leases = await rec_rheo.fetch("orders", "billing", limit=10)
    assert [lease.attempt for lease in leases] == [2, 2, 2, 2]


def _group_tasks() -> set[asyncio.Task[Any]]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_run_is_cancellation_safe(rec_rheo: Rheo, recording: RecordingBackend,
                                        wait_until: WaitUntil) -> None:
    await append(rec_rheo, 2)
    before = _group_tasks()
    started = asyncio.Event()
    finished: list[int] = []

    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        if event.sequence == 2:
            started.set()
            await asyncio.Event().wait()
        finished.append(event.sequence)
        return ACK

    group = handle.start(rec_rheo)
    runner = asyncio.create_task(group.run())
    await asyncio.wait_for(started.wait(), 5)
    await wait_until(lambda: group.stats.acked == 1)
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner
    assert not group.running
    assert _group_tasks() == before
    assert finished == [1]
    assert recording.nacks == [("shutdown", [2])]
    async with handle.start(rec_rheo) as again:  # the slot was released
        assert again.running


async def test_run_returns_when_stopped(rec_rheo: Rheo, wait_until: WaitUntil) -> None:
    @consumer(stream="orders", group="billing")
    async def handle(event: Event, context: Mapping[str, Any]) -> Any:
        return ACK

    group = handle.start(rec_rheo)
    runner = asyncio.create_task(group.run())
    await wait_until(lambda: group.running)
    await group.stop()
    await asyncio.wait_for(runner, 5)
    await group.stop()  # idempotent
    assert not group.running


async def test_a_subclass_of_a_decorated_consumer_keeps_its_handle_event(
        rec_rheo: Rheo, wait_until: WaitUntil) -> None:
    from rheo_flow._runtime._group import FunctionConsumer

    await append(rec_rheo, 3)
    seen: list[str] = []

    class Wrapped(FunctionConsumer):
        async def handle_event(self, event: Event, context: Mapping[str, Any]) -> Any:
            seen.append("wrapped")
            return await super().handle_event(event, context)

    async def plain(event: Event, context: Mapping[str, Any]) -> Any:
        seen.append("plain")
        return ACK

    async with Wrapped(plain, stream="orders", group="billing").start(rec_rheo) as group:
        await wait_until(lambda: group.stats.acked == 3)
    assert seen == ["wrapped", "plain"] * 3
