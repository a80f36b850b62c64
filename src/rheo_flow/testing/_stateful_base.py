"""The stateful conformance machine's plumbing: its loop, its store, settles and checks.

The rules live in :mod:`._stateful` (appends, fetches, settles, time, replays,
resets, trims), :mod:`._stateful_rules` (redrives, deletions) and
:mod:`._stateful_other` (a second store); they share what this module holds.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Container, Coroutine, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine

from .._backend import Backend
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._settle_results import SettleResult
from .._model._stream import DeadLetter, StartPosition
from .._rheo import Rheo
from ._case import LONG_MS, check, check_equal
from ._harness import BackendHarness
from ._model import GroupModel, Op, outcome_of

__all__ = ["MachineBase", "Store", "settle_checked"]

T = TypeVar("T")

PARTITIONS = 2
MAX_ATTEMPTS = 2
KEYS = ["a", "b", "c", "d", "e"]
CONSUMERS = ["c1", "c2"]
STEP_TIMEOUT_S = 60.0
PARTITION_CHOICES: list[list[int] | None] = [None, [0], [1]]
"""Which partitions a reset or trim acts on (``None``: every partition)."""
PICKS = st.lists(st.integers(0, 99), min_size=1, max_size=4)
"""Which current leases a settle takes (by index, modulo how many there are)."""
STALE_PICKS = st.lists(st.integers(0, 99), max_size=2)
"""Which leases no longer current a settle takes as well (see ``choose``)."""
ERRORS: list[str | None] = ["ValueError: bad input", "TimeoutError: db busy ⏳", "", None, None]
"""The error a nack or reject gives (by index, modulo): two texts (one replaces the
other), the empty text (given, so recorded) and none (the last one is kept)."""
SOON_MS = 30_000
"""Leases ending sooner than this may expire during a step (the kit's short leases);
the others are :data:`LONG_MS` and never do."""
START_CHOICES = st.one_of(st.sampled_from(["earliest", "latest"]), st.integers(0, 8))
"""Where a re-created group starts (``group.start``)."""


@dataclass(frozen=True, slots=True)
class Store:
    """A backend the machine drives, with its model."""

    backend: Backend
    rheo: Rheo
    model: GroupModel
    harness: BackendHarness
    error_aware: bool
    """The backend's nack and reject take ``error`` (else the facade drops it)."""

    async def now(self) -> int:
        return await self.harness.current_time(self.backend)


async def settle_checked(store: Store, op: Op, leases: list[Lease], *, delay_ms: int = 0,
                         lease_ms: int = LONG_MS, error: str | None = None,
                         orphans: Container[str] = ()) -> list[SettleResult]:
    """Settle (or renew) ``leases`` on ``store``, check each result against its model,
    record them. A lease in ``orphans`` (of a deleted stream) must settle nothing."""
    reason = f"{op} by the model"
    rheo = store.rheo
    t0 = await store.now()
    if op == "ack":
        call = rheo.ack(leases)
    elif op == "nack":
        call = rheo.nack(leases, reason, delay_ms=delay_ms, error=error)
    elif op == "reject":
        call = rheo.reject(leases, reason, error=error)
    else:
        call = rheo.renew(leases, lease_ms=lease_ms)
    results = await call
    t1 = await store.now()
    check_equal([r.lease_id for r in results], [x.lease_id for x in leases],
                f"{op}: one result per lease, in order")
    recorded = error if store.error_aware else None
    for lease, result in zip(leases, results, strict=True):
        got = outcome_of(result)
        what = f"{op} of {(lease.partition, lease.sequence)} (attempt {lease.attempt})"
        detail = f" ({result.error.reason})" if result.error is not None else ""
        if lease.lease_id in orphans:
            check(got in ("stale_lease", "invalid"),
                  f"{what} with a lease of the deleted stream: got {got}{detail}")
            continue
        allowed = store.model.expect(lease, op, t1)
        check(got in allowed, f"{what}: expected {sorted(allowed)}, got {got}{detail}")
        store.model.apply(lease, op, result, reason=reason, delay_ms=delay_ms,
                          lease_ms=lease_ms, t0=t0, t1=t1, error=recorded)
    return results


def _opened(part: T | None) -> T:
    """``part`` (the backend, the facade) of an open machine; set together by its open."""
    if part is None:
        raise RuntimeError("the machine is not open")
    return part


class MachineBase(RuleBasedStateMachine):
    """One group of one stream on a fresh backend of :attr:`harness`, and its model."""

    harness: ClassVar[BackendHarness]
    """The harness whose backend the machine checks."""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.stack = AsyncExitStack()
        self.in_step = False
        self.leases: dict[str, Lease] = {}
        self.orphans: set[str] = set()
        """Ids of leases of a deleted stream: they never settle again."""
        self.counter = 0
        self.stream = f"sm-{uuid.uuid4().hex[:12]}"
        self.group = "g"
        self._backend: Backend | None = None
        self._rheo: Rheo | None = None
        self.model = self.new_model()
        self.nack_delays = [0]
        self.schedule_delays: list[int] = []
        """How far ahead ``append_scheduled`` schedules events (none: no such backend)."""
        self.can_trim = False
        self.error_aware = False
        """The backend's nack and reject take ``error`` (else the facade drops it)."""

    def new_model(self) -> GroupModel:
        """The model of a new group on a new stream."""
        return GroupModel(self.stream, self.group, PARTITIONS, MAX_ATTEMPTS,
                          self.harness.clock_margin_ms)

    @property
    def backend(self) -> Backend:
        """The backend of the open machine."""
        return _opened(self._backend)

    @property
    def rheo(self) -> Rheo:
        """The facade over :attr:`backend`."""
        return _opened(self._rheo)

    async def open_store(self, *, apart: bool = False) -> tuple[Backend, Rheo]:
        """A fresh backend from the harness (over a store of its own with ``apart``),
        opened, closed with the machine."""
        factory = self.harness.apart if apart else self.harness.factory
        if factory is None:
            raise ValueError(f"harness {self.harness.name!r} has no store apart")
        backend = await self.stack.enter_async_context(factory())
        rheo = await self.stack.enter_async_context(Rheo(backend))
        return backend, rheo

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        self.in_step = True
        result = self.loop.run_until_complete(asyncio.wait_for(coro, STEP_TIMEOUT_S))
        self.in_step = False
        return result

    async def now(self) -> int:
        return await self.harness.current_time(self.backend)

    async def timed(self, call: Awaitable[T]) -> tuple[T, int, int]:
        t0 = await self.now()
        result = await call
        return result, t0, await self.now()

    async def _advance_past(self, moment: int) -> None:
        wait = moment + self.harness.clock_margin_ms + 1 - await self.now()
        await self.harness.advance_time(self.backend, wait)

    def current(self) -> list[Lease]:
        return [self.leases[i] for i in self.model.current_lease_ids()]

    def choose(self, indexes: Sequence[int], stale_indexes: Sequence[int]) -> list[Lease]:
        """Current leases by ``indexes``, and leases no longer current by ``stale_indexes``.

        An odd stale index picks, when there is one, a lease that settled its delivery
        last (settling it again with the same op is ``repeated``); resets and trims
        leave many other stale leases, which would drown those out.
        """
        current = self.current()
        current_ids = {lease.lease_id for lease in current}
        stale = [lease for lease in self.leases.values() if lease.lease_id not in current_ids]
        last = [lease for lease in stale if self.model.is_newest_lease(lease)]
        chosen: dict[str, Lease] = {}
        for i in indexes:
            if current:
                lease = current[i % len(current)]
                chosen[lease.lease_id] = lease
        for i in stale_indexes:
            pool = last if i % 2 and last else stale
            if pool:
                lease = pool[i // 2 % len(pool)]
                chosen[lease.lease_id] = lease
        return list(chosen.values())

    def append_events(self, specs: list[tuple[str | None, int | None]], duplicate: int,
                      delay_ms: int | None = None) -> None:
        """Append events of ``specs`` (key, partition), and with ``duplicate % 3 == 0``
        one with an id appended before (a retained one returns the stored event, a
        trimmed one is appended anew); with ``delay_ms``, every one scheduled that long
        after now (``delay.not_before``)."""
        deliver_at = None if delay_ms is None else self.run(self.now()) + delay_ms
        events: list[NewEvent] = []
        ids: list[str] = []
        for key, partition in specs:
            self.counter += 1
            if key is None and partition is None:
                partition = self.counter % PARTITIONS  # a keyless event names its partition
            ids.append(f"e{self.counter}")
            events.append(NewEvent("sm.event", {"n": self.counter}, id=ids[-1],
                                   key=key, partition=partition, deliver_at=deliver_at))
        known = self.counter - len(events)
        if known and duplicate % 3 == 0:
            ids.append(f"e{duplicate % known + 1}")
            events.append(NewEvent("sm.again", {"dup": True}, id=ids[-1], key=KEYS[0],
                                   deliver_at=deliver_at))
        stored = self.run(self.rheo.append(self.stream, events))
        check_equal(len(stored), len(events), "one stored event per appended event")
        for new_id, stored_event in zip(ids, stored, strict=True):
            self.model.appended(new_id, stored_event, deliver_at)

    async def _fetch(self, limit: int, partitions: list[int] | None, consumer: str,
                     lease_ms: int) -> list[Lease]:
        call = self.rheo.fetch(self.stream, self.group, consumer_id=consumer, limit=limit,
                               lease_ms=lease_ms,
                               partitions="all" if partitions is None else partitions)
        leases, t0, t1 = await self.timed(call)
        self.model.check_fetch(leases, limit=limit, partitions=partitions,
                               consumer_id=consumer, lease_ms=lease_ms, t0=t0, t1=t1)
        self.leases.update((lease.lease_id, lease) for lease in leases)
        return leases

    async def _create_group(self, start: StartPosition, ordered: bool) -> None:
        """Create the group at ``start``, key-ordered when ``ordered`` and the backend can
        (a new group, or one created again after a deletion: the model starts it fresh)."""
        ordered = ordered and self.backend.capabilities.key_ordering
        ordering: Literal["none", "key"] = "key" if ordered else "none"
        info = await self.rheo.create_group(self.stream, self.group, start=start,
                                            max_attempts=MAX_ATTEMPTS, ordering=ordering)
        check_equal((info.ordering, info.max_attempts), (ordering, MAX_ATTEMPTS),
                    "ordering and max_attempts of the created group")
        self.model.recreated(start, ordered=ordered)

    async def _settle(self, op: Op, leases: list[Lease], *, delay_ms: int = 0,
                      lease_ms: int = LONG_MS, error: str | None = None) -> list[SettleResult]:
        if not leases:
            return []
        return await settle_checked(
            Store(self.backend, self.rheo, self.model, self.harness, self.error_aware),
            op, leases, delay_ms=delay_ms, lease_ms=lease_ms, error=error,
            orphans=self.orphans)

    async def _expire(self, leases: list[Lease]) -> None:
        """Shorten ``leases`` to the minimum, then let them run out."""
        if not leases:
            return
        results = await self._settle("renew", leases, lease_ms=10)
        deadlines = [r.deadline_ms for r in results if r.ok and r.deadline_ms is not None]
        if deadlines:
            await self._advance_past(max(deadlines))

    async def _settle_doomed(self) -> list[DeadLetter]:
        """Make the model know every dead letter of the group, until a lease runs out
        again: let each lease held at the last attempt that may run out soon run out
        (on a real clock, one could run out during the next call), reject those that
        ran out (the backend may have dead-lettered them already: ``ok`` or
        ``stale_lease``, a dead letter either way), then list the dead letters (and
        return them)."""
        soon = self.model.doomed_soon(await self.now() + SOON_MS)
        if soon:
            await self._advance_past(max(soon))
        doomed = self.model.doomed_lease_ids(await self.now())
        await self._settle("reject", [self.leases[i] for i in doomed])
        return await self._check_dead_letters()

    # Checks ------------------------------------------------------------

    async def _check_dead_letters(self) -> list[DeadLetter]:
        dead = await self.rheo.dead_letters(self.stream, self.group, limit=10_000)
        positions = [(d.partition, d.sequence) for d in dead]
        check_equal(len(set(positions)), len(dead), "dead letters are listed once each")
        check_equal(positions, sorted(positions), "dead letters in (partition, sequence) order")
        self.model.check_dead_letters(dead, await self.now())
        return dead

    async def _check_progress(self) -> None:
        info = await self.rheo.stream_info(self.stream)
        check_equal([info.high_water[p] for p in range(PARTITIONS)], self.model.high_water,
                    "high water")
        self.model.check_low_water(dict(info.low_water))
        await self._check_dead_letters()
        frontier = await self.rheo.frontier(self.stream, self.group)
        self.model.check_frontier(frontier, await self.now())
