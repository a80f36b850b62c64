"""The in-memory backend's fetch visits only the partitions that may have work.

Each group keeps which partitions have new events past its cursor and when each
partition's active deliveries next become due (``Work``); a fetch visits those
partitions only, so an idle partition costs nothing and held or delayed
deliveries are not rescanned before they are due. Visits are counted with a
backend whose per-partition eligibility is instrumented, and the bookkeeping is
checked against the state it summarises after every operation of random runs.
No timing is measured: the clock is a ManualClock.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from rheo_flow import Lease, ManualClock, NewEvent, Rheo
from rheo_flow._backends.memory import MemoryBackend
from rheo_flow._backends.memory._state import NEVER, Delivery, Group, Stream

HOUR = 3_600_000
DELAY = 30 * 60_000


@dataclass(frozen=True)
class Visit:
    """One partition a fetch looked at, and whether it scanned its active deliveries."""

    partition: int
    scanned: bool


class Counting(MemoryBackend):
    """The memory backend, recording each partition a fetch visits."""

    def __init__(self, *, clock: ManualClock) -> None:
        super().__init__(clock=clock)
        self.visits: list[Visit] = []

    def _eligible(self, g: Group, pid: int, s: Stream, now: int, limit: int
                  ) -> tuple[list[Delivery], int]:
        self.visits.append(Visit(pid, g.partitions[pid].due <= now))
        return super()._eligible(g, pid, s, now, limit)

    def _eligible_by_key(self, g: Group, pid: int, s: Stream, now: int, limit: int
                         ) -> tuple[list[Delivery], int]:
        self.visits.append(Visit(pid, g.partitions[pid].due <= now))
        return super()._eligible_by_key(g, pid, s, now, limit)

    def take_visits(self) -> list[Visit]:
        """The visits since the last call."""
        visits, self.visits = self.visits, []
        return visits


@pytest.fixture
async def counted(clock: ManualClock) -> AsyncIterator[tuple[Rheo, Counting]]:
    """An instance over a counting memory backend driven by ``clock``."""
    backend = Counting(clock=clock)
    async with Rheo(backend) as rheo:
        yield rheo, backend


async def _fetch(rheo: Rheo, backend: Counting, stream: str, *, group: str = "g",
                 limit: int = 10, lease_ms: int = HOUR, partitions: Any = "all"
                 ) -> tuple[list[Lease], list[Visit]]:
    backend.take_visits()
    leases = await rheo.fetch(stream, group, consumer_id="c", limit=limit, lease_ms=lease_ms,
                              partitions=partitions)
    return leases, backend.take_visits()


async def test_a_fetch_of_256_partitions_visits_only_the_one_with_events(
    counted: tuple[Rheo, Counting],
) -> None:
    rheo, backend = counted
    await rheo.create_stream("s", partitions=256)
    await rheo.create_group("s", "g")
    assert (await _fetch(rheo, backend, "s"))[1] == []  # nothing anywhere: no visit
    await rheo.append("s", [NewEvent("t", i) for i in range(25)], partition=200)
    for expected in (10, 10, 5):
        leases, visits = await _fetch(rheo, backend, "s")
        assert [(lease.partition, len(leases)) for lease in leases[:1]] == [(200, expected)]
        assert visits == [Visit(200, False)]  # held leases, an hour away: not scanned
        await rheo.ack(leases)
    assert (await _fetch(rheo, backend, "s"))[1] == []  # caught up: no visit


async def test_the_limit_goes_round_robin_over_the_partitions_with_work(
    counted: tuple[Rheo, Counting],
) -> None:
    rheo, backend = counted
    await rheo.create_stream("s", partitions=256)
    for part in (0, 1, 200):
        await rheo.append("s", [NewEvent("t", i) for i in range(4)], partition=part)
    starts = []
    for _ in range(4):
        leases, visits = await _fetch(rheo, backend, "s", limit=6)
        assert sorted(v.partition for v in visits) == [0, 1, 200]
        assert sorted(lease.partition for lease in leases) == [0, 0, 1, 1, 200, 200]
        starts.append(leases[0].partition)
        # One candidate per partition per round, from where this fetch's turn starts.
        assert [lease.partition for lease in leases[:3]] == [v.partition for v in visits]
        await rheo.nack(leases, "again", delay_ms=0)
    # The turn moves one partition of 256 a fetch (1, 2, 3, 4): the round starts at the
    # first partition with work from there, wrapping round.
    assert starts == [1, 200, 200, 200]


async def test_held_and_delayed_deliveries_are_not_rescanned_until_due(
    counted: tuple[Rheo, Counting], clock: ManualClock,
) -> None:
    rheo, backend = counted
    await rheo.create_stream("s", partitions=64)
    await rheo.append("s", [NewEvent("t", i) for i in range(200)], partition=5)
    await rheo.append("s", [NewEvent("t", i) for i in range(100)], partition=9)
    held, _ = await _fetch(rheo, backend, "s", limit=200, partitions=[5])
    delayed, _ = await _fetch(rheo, backend, "s", limit=100, partitions=[9])
    assert (len(held), len(delayed)) == (200, 100)
    await rheo.nack(delayed, "later", delay_ms=DELAY)
    for _ in range(3):  # every due time is ahead: nothing to visit, however often asked
        assert await _fetch(rheo, backend, "s") == ([], [])
        clock.advance(DELAY // 4)
    assert await _fetch(rheo, backend, "s", partitions=[5, 9, 10]) == ([], [])
    clock.advance(DELAY // 4)  # the nack delay is over: partition 9 only
    leases, visits = await _fetch(rheo, backend, "s", limit=100)
    assert visits == [Visit(9, True)]
    assert {(lease.partition, lease.attempt) for lease in leases} == {(9, 2)}
    await rheo.ack(leases)
    clock.advance(HOUR)  # the held leases expire: partition 5 is due
    leases, visits = await _fetch(rheo, backend, "s", limit=300)
    # An ack leaves the due time where it was (a lower bound): partition 9, whose
    # redeliveries were leased for an hour too, is looked at once more, and found empty.
    assert set(visits) == {Visit(5, True), Visit(9, True)}
    assert sorted(lease.sequence for lease in leases) == list(range(1, 201))


async def test_new_events_beside_held_ones_are_taken_without_a_rescan(
    counted: tuple[Rheo, Counting],
) -> None:
    rheo, backend = counted
    await rheo.create_stream("s", partitions=4)
    await rheo.append("s", [NewEvent("t", i) for i in range(50)], partition=1)
    await _fetch(rheo, backend, "s", limit=50, group="g")
    await rheo.append("s", [NewEvent("t", i) for i in range(3)], partition=1)
    leases, visits = await _fetch(rheo, backend, "s", limit=10, group="g")
    assert [lease.sequence for lease in leases] == [51, 52, 53]
    assert visits == [Visit(1, False)]


async def test_a_key_ordered_group_visits_a_blocked_partition_again_when_its_key_frees(
    counted: tuple[Rheo, Counting],
) -> None:
    rheo, backend = counted
    await rheo.create_stream("s", partitions=64)
    await rheo.create_group("s", "k", ordering="key")
    await rheo.append("s", [NewEvent("t", i, key="a") for i in range(2)], partition=7)
    first, visits = await _fetch(rheo, backend, "s", group="k")
    assert [(lease.partition, lease.sequence) for lease in first] == [(7, 1)]
    assert visits == [Visit(7, False)]
    assert (await _fetch(rheo, backend, "s", group="k"))[0] == []  # one rescan: a is held
    assert await _fetch(rheo, backend, "s", group="k") == ([], [])  # then no visit
    await rheo.ack(first)
    second, visits = await _fetch(rheo, backend, "s", group="k")
    assert [(lease.partition, lease.sequence) for lease in second] == [(7, 2)]
    assert visits == [Visit(7, True)]


async def test_the_due_heap_stays_bounded(counted: tuple[Rheo, Counting],
                                          clock: ManualClock) -> None:
    rheo, backend = counted
    await rheo.create_stream("s", partitions=4)
    await rheo.append("s", [NewEvent("t", i) for i in range(4)], partition=2)
    leases, _ = await _fetch(rheo, backend, "s", limit=4)
    for ms in range(HOUR, HOUR - 2_000, -1):  # every renew files an earlier due time
        await rheo.renew(leases, lease_ms=ms)
    for _ in range(500):  # fetches naming partitions leave their old entries behind
        await rheo.nack(await rheo.fetch("s", "g", limit=4, partitions=[2]), "again")
        clock.advance(1)
    assert len(backend._groups[("s", "g")].work.due) <= 2 * 4 + 64


def check_work(backend: MemoryBackend) -> None:
    """Each group's bookkeeping agrees with the state it summarises: ``new`` is exactly
    the partitions with events past the cursor, every partition with a due time has an
    entry of it on the heap, and (unordered groups) none of its active deliveries becomes
    ready before it unless it is at most now (a fetch then visits it)."""
    now = backend._clock()
    for (stream, _), g in backend._groups.items():
        parts = backend._streams[stream].partitions
        assert g.work.new == {pid for pid, gp in enumerate(g.partitions)
                              if gp.cursor < parts[pid].high_water}
        heap = set(g.work.due)
        for pid, gp in enumerate(g.partitions):
            assert gp.due == NEVER or (gp.due, pid) in heap
            if not g.ordered:
                ready = [d.available_at_ms if d.state == "available" else d.deadline_ms
                         for d in gp.active.values()]
                assert gp.due <= max(now, min(ready, default=NEVER))


@pytest.mark.parametrize("seed", range(12))
async def test_the_bookkeeping_follows_every_operation(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    backend = MemoryBackend(clock=clock)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=6)
        await rheo.create_group("s", "g")
        await rheo.create_group("s", "k", ordering="key")
        held: list[Lease] = []
        for _ in range(250):
            group = rng.choice(["g", "k"])
            await _random_step(rng, rheo, clock, group, held)
            check_work(backend)


async def _random_step(rng: random.Random, rheo: Rheo, clock: ManualClock, group: str,
                       held: list[Lease]) -> None:
    choice = rng.random()
    if choice < 0.2:
        await rheo.append("s", [NewEvent("t", i, key=rng.choice(["a", "b", None]))
                                for i in range(rng.randint(1, 5))],
                          partition=rng.randrange(6))
    elif choice < 0.45:
        partitions: Sequence[int] | str = "all" if rng.random() < 0.6 else rng.sample(
            range(6), rng.randint(1, 3))
        held += await rheo.fetch("s", group, limit=rng.randint(1, 8),
                                 lease_ms=rng.choice([100, 1_000]), partitions=partitions)
    elif choice < 0.65 and held:
        chosen = [held.pop(rng.randrange(len(held))) for _ in range(min(3, len(held)))]
        op = rng.choice(["ack", "nack", "reject", "renew"])
        if op == "nack":
            await rheo.nack(chosen, "r", delay_ms=rng.choice([0, 500]))
        elif op == "reject":
            await rheo.reject(chosen, "p")
        elif op == "renew":
            await rheo.renew(chosen, lease_ms=rng.choice([50, 2_000]))
        else:
            await rheo.ack(chosen)
    elif choice < 0.8:
        clock.advance(rng.choice([10, 300, 1_500]))
    elif choice < 0.85:
        await rheo.replay("s", group, from_sequence=rng.randint(1, 5))
    elif choice < 0.9:
        await rheo.reset("s", group, to=rng.choice(["earliest", "latest", rng.randint(0, 6)]))
    elif choice < 0.95:
        await rheo.redrive("s", group)
    else:
        await rheo.trim("s", up_to=rng.randint(0, 6), force=True)
