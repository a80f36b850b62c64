"""Key order inside one process: a ``Group`` running many handlers at once and a
``Pipeline`` with parallel processors and batchers never hand a key's next event
to a second task while the first is unsettled, with random delays and failures.

Across processes the same is shown by tests/runtime/test_key_ordering_processes.py; here
the runtimes' own concurrency is the competition, on memory and SQLite.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from rheo_flow import ACK, Event, NewEvent, Outcome, Retry, Rheo, consumer, current_lease
from rheo_flow.pipeline import Batcher, Message, Pipeline, Processors

EVENTS = 1_500
KEYS = 40
DEADLINE_S = 60.0

WaitUntil = Callable[..., Awaitable[None]]
"""The ``wait_until`` fixture of tests/conftest.py."""
Handling = tuple[int, int, int, int, str]
"""(sequence, attempt, start_ns, end_ns, outcome) of one handling."""


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Rheo]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/o.db"
    async with Rheo(url) as store:
        await store.create_stream("s", partitions=4)
        await store.append("s", [NewEvent("t", {"n": n}, key=f"k{n % KEYS}")
                                 for n in range(EVENTS)])
        yield store


async def _until_caught_up(rheo: Rheo, group: str, wait_until: WaitUntil) -> None:
    high = await rheo.high_water("s")

    async def caught_up() -> bool:
        return await rheo.frontier("s", group) == high

    await wait_until(caught_up, timeout=DEADLINE_S, message=f"group {group} caught up")


def _check_order(handlings: dict[tuple[int, str], list[Handling]]) -> None:
    """Per key: handlings never overlap, sequences never go back, a retried position
    is handled again before the next, and every position ends in an ack once."""
    assert sum(1 for hs in handlings.values() for h in hs if h[4] == "ack") == EVENTS
    for (part, key), hs in handlings.items():
        hs.sort(key=lambda h: h[2])
        for before, after in itertools.pairwise(hs):
            assert after[2] >= before[3], f"{key} in {part}: overlapping handlings"
            if before[4] == "ack":
                assert after[0] > before[0], f"{key} in {part}: {after[0]} after {before[0]}"
            else:
                assert (after[0], after[1]) == (before[0], before[1] + 1), (
                    f"{key} in {part}: retried {before[0]} but then handled {after[0]}")
        assert hs[-1][4] == "ack"


async def test_a_group_with_many_handlers_keeps_each_key_in_order(
        store: Rheo, wait_until: WaitUntil) -> None:
    chance = random.Random(7)
    handlings: dict[tuple[int, str], list[Handling]] = {}

    @consumer(stream="s", group="g", concurrency=32, max_demand=64, fetch_size=32,
              poll_ms=10, ordering="key", max_attempts=100)
    async def handle(event: Event, context: Any) -> Outcome:
        start = time.monotonic_ns()
        await asyncio.sleep(chance.random() / 500)
        outcome: Outcome = Retry("again", delay_ms=2) if chance.randrange(6) == 0 else ACK
        assert event.key is not None
        handlings.setdefault((event.partition, event.key), []).append(
            (event.sequence, current_lease().attempt, start, time.monotonic_ns(),
             "ack" if outcome is ACK else "retry"))
        return outcome

    async with handle.start(store):
        await _until_caught_up(store, "g", wait_until)
    _check_order(handlings)


class _Recording:
    """Processors sleep and sometimes fail; batches are written after a sleep too,
    so a key's event sits in a batch (unsettled) while other tasks run."""

    def __init__(self) -> None:
        self.chance = random.Random(11)
        self.started: dict[tuple[int, int, int], int] = {}
        self.handlings: dict[tuple[int, str], list[Handling]] = {}

    def _record(self, message: Message, outcome: str) -> None:
        assert message.key is not None
        start = self.started.pop((message.partition, message.sequence, message.attempt))
        self.handlings.setdefault((message.partition, message.key), []).append(
            (message.sequence, message.attempt, start, time.monotonic_ns(), outcome))

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        self.started[(message.partition, message.sequence, message.attempt)] = (
            time.monotonic_ns())
        await asyncio.sleep(self.chance.random() / 500)
        if self.chance.randrange(6) == 0:
            self._record(message, "retry")
            return message.failed("again")
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], info: Any,
                           context: Any) -> list[Message]:
        await asyncio.sleep(self.chance.random() / 200)
        for message in messages:
            self._record(message, "ack")
        return messages


async def test_a_pipeline_with_parallel_processors_keeps_each_key_in_order(
        store: Rheo, wait_until: WaitUntil) -> None:
    handler = _Recording()
    async with Pipeline(store, stream="s", group="p", handler=handler, ordering="key",
                        processors=Processors(concurrency=16),
                        batchers={"default": Batcher(batch_size=20, batch_timeout=0.005,
                                                     concurrency=4)},
                        max_inflight=128, poll_ms=10, max_attempts=100, retry_delay_ms=2):
        await _until_caught_up(store, "p", wait_until)
    _check_order(handler.handlings)
