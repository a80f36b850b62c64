"""Retry backoff and last errors: the policy's schedule, redeliveries that follow it
under a manual clock (no sleeps, no wall-clock assertions), dead letters that say what
the handler raised on every backend, failure logs and the dead-letter counters."""

from __future__ import annotations

import logging
import random
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
    Retry,
    RetryPolicy,
    Rheo,
    SettleResult,
    consumer,
    current_lease,
)
from rheo_flow.backends import MemoryBackend
from rheo_flow.pipeline import Message, Pipeline, PipelineHandler, Processors

WaitUntil = Callable[..., Awaitable[None]]


class DelayRecorder(MemoryBackend):
    """The memory backend recording the delay and error of every nack, and counting fetches."""

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.nacks: list[tuple[int, int, str | None]] = []
        """(attempt, delay_ms, error) of each nacked lease."""
        self.fetches = 0

    async def fetch(self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    partitions: Sequence[int] | None) -> list[Lease]:
        self.fetches += 1
        return await super().fetch(stream, group, consumer_id, limit, lease_ms, partitions)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        self.nacks.extend((lease.attempt, delay_ms, error) for lease in leases)
        return await super().nack(leases, reason, delay_ms, error)


@pytest.fixture
def recorder(clock: ManualClock) -> DelayRecorder:
    return DelayRecorder(clock=clock)


@pytest.fixture
async def db(recorder: DelayRecorder) -> AsyncIterator[Rheo]:
    async with Rheo(recorder) as rheo:
        await rheo.create_stream("orders")
        yield rheo


def expected_delays(seed: int, attempts: int, **policy: Any) -> list[int]:
    replay = RetryPolicy(rng=random.Random(seed), **policy)
    return [replay.delay_ms(attempt) for attempt in range(1, attempts + 1)]


# The policy ------------------------------------------------------------------------


def test_the_default_policy_doubles_from_one_second_up_to_five_minutes() -> None:
    policy = RetryPolicy()
    assert (policy.base_ms, policy.cap_ms, policy.jitter) == (1_000, 300_000, True)
    assert [policy.ceiling_ms(a) for a in range(1, 12)] == [
        1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 64_000, 128_000, 256_000, 300_000,
        300_000]
    assert policy.ceiling_ms(10_000) == 300_000  # no overflow far out


def test_full_jitter_draws_uniformly_below_the_ceiling_from_the_given_source() -> None:
    policy = RetryPolicy(base_ms=200, cap_ms=10_000, rng=random.Random(3))
    draws = random.Random(3)
    for attempt in range(1, 30):
        ceiling = min(10_000, 200 * 2 ** (attempt - 1))
        expected = round(draws.uniform(0, ceiling))
        assert policy.delay_ms(attempt) == expected
        assert 0 <= expected <= ceiling
    fixed = RetryPolicy(base_ms=200, cap_ms=10_000, jitter=False)
    assert [fixed.delay_ms(a) for a in (1, 2, 3, 7)] == [200, 400, 800, 10_000]
    assert [RetryPolicy.immediate().delay_ms(a) for a in (1, 5, 50)] == [0, 0, 0]


@pytest.mark.parametrize(
    ("settings", "match"),
    [({"base_ms": -1}, "base_ms"), ({"cap_ms": 1.5}, "cap_ms"),
     ({"base_ms": 2_000, "cap_ms": 1_000}, "below base_ms"), ({"rng": 7}, "random.Random")],
)
def test_a_bad_policy_is_refused(settings: dict[str, Any], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        RetryPolicy(**settings)


def test_attempts_start_at_one() -> None:
    with pytest.raises(InvalidArgument, match="attempt"):
        RetryPolicy().delay_ms(0)


def test_runtimes_refuse_something_else_as_a_policy(rheo: Rheo) -> None:
    @consumer(stream="orders", group="billing", retry_policy=1_000)
    async def handle(event: Event, context: Any) -> Any:
        return ACK

    with pytest.raises(InvalidArgument, match="retry_policy must be a RetryPolicy"):
        handle.start(rheo)
    with pytest.raises(InvalidArgument, match="retry_policy must be a RetryPolicy"):
        Pipeline(rheo, stream="orders", group="g", handler=Steps({}),
                 retry_policy=1_000)  # type: ignore[arg-type]


# Consumer groups -------------------------------------------------------------------


async def step_through(db: Rheo, recorder: DelayRecorder, clock: ManualClock,
                       attempts: list[int], delays: list[int], wait_until: WaitUntil) -> None:
    """For each delay: the redelivery does not come a millisecond early, and comes on time."""
    for done, delay in enumerate(delays, start=1):
        await wait_until(lambda done=done: len(recorder.nacks) == done)
        assert attempts == list(range(1, done + 1))
        if done == len(delays):
            return
        clock.advance(delay - 1)
        polled = recorder.fetches
        await wait_until(lambda polled=polled: recorder.fetches >= polled + 3)
        assert attempts == list(range(1, done + 1)), "redelivered before its delay"
        clock.advance(1)
        await wait_until(lambda done=done: len(attempts) == done + 1)


async def test_a_failing_event_is_redelivered_on_the_policy_schedule(
    db: Rheo, recorder: DelayRecorder, clock: ManualClock, wait_until: WaitUntil,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await db.append("orders", NewEvent("order.placed", {"n": 1}, id="o-1"))
    delays = expected_delays(42, 4)
    assert all(d > 1 for d in delays), delays  # each step below is meaningful
    attempts: list[int] = []

    @consumer(stream="orders", group="billing", poll_ms=5, max_attempts=4,
              retry_policy=RetryPolicy(rng=random.Random(42)))
    async def handle(event: Event, context: Any) -> Any:
        attempts.append(current_lease().attempt)
        raise RuntimeError(f"boom on attempt {current_lease().attempt}")

    with caplog.at_level(logging.ERROR, logger="rheo_flow.group"):
        async with handle.start(db) as group:
            await step_through(db, recorder, clock, attempts, delays, wait_until)

            async def dead() -> bool:
                return bool(await db.dead_letters("orders", "billing"))

            await wait_until(dead)
    assert [(a, d) for a, d, _ in recorder.nacks] == list(enumerate(delays, start=1))
    assert [e for _, _, e in recorder.nacks] == [
        f"RuntimeError: boom on attempt {a}" for a in range(1, 5)]
    [letter] = await db.dead_letters("orders", "billing")
    assert (letter.event_id, letter.attempts, letter.reason, letter.last_error) == (
        "o-1", 4, "max_attempts", "RuntimeError: boom on attempt 4")
    stats = group.stats
    assert (stats.handler_errors, stats.nacked, stats.rejected, stats.dead_lettered) == (
        4, 4, 0, 1)
    records = [r for r in caplog.records if r.name == "rheo_flow.group"]
    assert len(records) == 4  # once per failure
    assert [(r.stream, r.group, r.partition, r.sequence, r.attempt, r.event_id)  # type: ignore[attr-defined]
            for r in records] == [("orders", "billing", 0, 1, a, "o-1") for a in range(1, 5)]
    assert all(r.exc_info is not None for r in records)


async def test_retry_without_a_delay_takes_the_policy_and_a_delay_overrides_it(
    db: Rheo, recorder: DelayRecorder, clock: ManualClock, wait_until: WaitUntil,
) -> None:
    await db.append("orders", NewEvent("order.placed", {"n": 1}))
    [first] = expected_delays(9, 1)

    @consumer(stream="orders", group="billing", poll_ms=5,
              retry_policy=RetryPolicy(rng=random.Random(9)))
    async def handle(event: Event, context: Any) -> Any:
        attempt = current_lease().attempt
        if attempt == 1:
            return Retry("busy")
        if attempt == 2:
            return Retry("busy again", delay_ms=0)
        return ACK

    async with handle.start(db) as group:
        await wait_until(lambda: len(recorder.nacks) == 1)
        clock.advance(first)
        await wait_until(lambda: group.stats.acked == 1)
    assert recorder.nacks == [(1, first, "busy"), (2, 0, "busy again")]
    assert (group.stats.retried, group.stats.dead_lettered) == (2, 0)


async def test_rejects_and_exhausted_attempts_both_count_as_dead_lettered(
    db: Rheo, wait_until: WaitUntil,
) -> None:
    await db.append("orders", [NewEvent("order.placed", {"n": n}) for n in range(3)])

    @consumer(stream="orders", group="billing", poll_ms=5, max_attempts=2,
              retry_policy=RetryPolicy.immediate())
    async def handle(event: Event, context: Any) -> Any:
        if event.data["n"] == 0:
            raise KeyError("sku")
        if event.data["n"] == 1:
            from rheo_flow import Reject

            return Reject("unknown customer")
        return ACK

    async with handle.start(db) as group:
        await wait_until(lambda: group.stats.dead_lettered == 2)
    assert (group.stats.acked, group.stats.rejected, group.stats.dead_lettered) == (1, 1, 2)
    letters = await db.dead_letters("orders", "billing")
    assert [(d.reason, d.last_error) for d in letters] == [
        ("max_attempts", "KeyError: 'sku'"), ("unknown customer", None)]


# Pipelines -------------------------------------------------------------------------


class Steps(PipelineHandler):
    """Fails the events named in ``failing`` (event number -> exception)."""

    def __init__(self, failing: dict[int, BaseException]) -> None:
        self.failing = failing
        self.attempts: list[int] = []

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        error = self.failing.get(message.data["n"])
        if error is not None:
            self.attempts.append(message.attempt)
            raise error
        return message


async def test_pipeline_redeliveries_follow_the_policy_and_count_dead_letters(
    db: Rheo, recorder: DelayRecorder, clock: ManualClock, wait_until: WaitUntil,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await db.append("orders", [NewEvent("order.placed", {"n": n}, id=f"o-{n}")
                               for n in range(4)])
    delays = expected_delays(5, 3, base_ms=500, cap_ms=1_500)
    assert all(d > 1 for d in delays), delays
    handler = Steps({2: ValueError("cannot parse '12,50 EUR'")})
    pipeline = Pipeline(db, stream="orders", group="billing", handler=handler, poll_ms=5,
                        max_attempts=3, processors=Processors(concurrency=1, max_demand=4),
                        retry_policy=RetryPolicy(base_ms=500, cap_ms=1_500,
                                                 rng=random.Random(5)))
    with caplog.at_level(logging.ERROR, logger="rheo_flow.pipeline"):
        async with pipeline:
            await step_through(db, recorder, clock, handler.attempts, delays, wait_until)
            await wait_until(lambda: pipeline.stats().dead_lettered == 1)
    assert [(a, d) for a, d, _ in recorder.nacks] == list(enumerate(delays, start=1))
    stats = pipeline.stats()
    assert (stats.acked, stats.nacked, stats.rejected, stats.dead_lettered) == (3, 3, 0, 1)
    [letter] = await db.dead_letters("orders", "billing")
    assert (letter.event_id, letter.reason, letter.last_error) == (
        "o-2", "max_attempts", "ValueError: cannot parse '12,50 EUR'")
    records = [r for r in caplog.records if r.name == "rheo_flow.pipeline"]
    assert [(r.stream, r.partition, r.sequence, r.attempt, r.event_id)  # type: ignore[attr-defined]
            for r in records] == [("orders", 0, 3, a, "o-2") for a in (1, 2, 3)]


async def test_a_fixed_pipeline_delay_overrides_the_policy(
    db: Rheo, recorder: DelayRecorder, clock: ManualClock, wait_until: WaitUntil,
) -> None:
    await db.append("orders", [NewEvent("order.placed", {"n": n}) for n in range(2)])

    class Configured(Steps):
        async def handle_message(self, processor: str, message: Message,
                                 context: Any) -> Message:
            if message.data["n"] == 0 and message.attempt == 1:
                return message.failed("not yet").configure_ack(retry_delay_ms=250)
            return message

    pipeline = Pipeline(db, stream="orders", group="billing", handler=Configured({}),
                        poll_ms=5, retry_delay_ms=0)
    async with pipeline:
        await wait_until(lambda: len(recorder.nacks) == 1)
        clock.advance(250)
        await wait_until(lambda: pipeline.stats().acked == 2)
    assert recorder.nacks == [(1, 250, "not yet")]


# Every backend ---------------------------------------------------------------------


async def test_a_raising_handler_leaves_its_error_on_the_dead_letter(
    any_backend: Rheo, wait_until: WaitUntil,
) -> None:
    rheo = any_backend
    await rheo.create_stream("orders")
    await rheo.append("orders", NewEvent("order.placed", {"total": "12,50 EUR"}, id="poison"))

    @consumer(stream="orders", group="billing", poll_ms=10, max_attempts=2,
              retry_policy=RetryPolicy.immediate())
    async def handle(event: Event, context: Any) -> Any:
        # A driver message with a password in it: the dead letter must not keep it.
        raise ConnectionError("cannot reach postgresql://app:hunter2@db/orders")

    async with handle.start(rheo) as group:
        async def dead() -> bool:
            return bool(await rheo.dead_letters("orders", "billing"))

        await wait_until(dead, timeout=15)
    [letter] = await rheo.dead_letters("orders", "billing")
    assert (letter.event_id, letter.attempts, letter.reason) == ("poison", 2, "max_attempts")
    assert letter.last_error == "ConnectionError: cannot reach postgresql://app:***@db/orders"
    assert (group.stats.rejected, group.stats.dead_lettered) == (0, 1)


# The facade ------------------------------------------------------------------------


async def test_settle_errors_are_validated(rheo: Rheo) -> None:
    await rheo.create_stream("orders")
    await rheo.append("orders", NewEvent("t"))
    [lease] = await rheo.fetch("orders", "g")
    for bad, match in (("x" * 1_001, "longer than 1000"), ("a\x00b", "NUL"),
                       (ValueError("x"), "string or None")):
        with pytest.raises(InvalidArgument, match=match):
            await rheo.nack(lease, "r", error=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match=match):
            await rheo.reject(lease, "r", error=bad)  # type: ignore[arg-type]
    assert all(r.ok for r in await rheo.reject(lease, "r", error="x" * 1_000))
