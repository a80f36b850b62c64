"""A stateful rule on a second, independent store with the same stream and group names.

The machine opens a second backend from the same harness (the first time the
rule runs) and appends, fetches and settles there too, checked against a model
of its own. Nothing may cross between the two stores: ids appended in the first
are new in the second, sequences start at 1 in each, an append to the second
wakes no waiter of the first, and the first store's model stays exact (the
machine's invariant checks it after every step). Only for a harness that
builds a store apart (:attr:`BackendHarness.apart`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from .._model._event import NewEvent
from .._model._lease import Lease
from .._rheo import Rheo
from ._case import LONG_MS, check, check_equal
from ._model import GroupModel, Op
from ._stateful_base import (
    ERRORS,
    KEYS,
    MAX_ATTEMPTS,
    PARTITIONS,
    MachineBase,
    Store,
    settle_checked,
)

__all__ = ["OtherStoreRules"]

WAIT_S = 0.02
"""How long a waiter of the first store waits while the second store appends."""
SETTLE_S = 0.01
"""How long a waiter is given to start waiting."""


@dataclass(slots=True)
class _Other:
    store: Store
    leases: dict[str, Lease] = field(default_factory=dict)
    appended: int = 0


class OtherStoreRules(MachineBase):
    """Appends, fetches and settles on a second store, which must not touch the first."""

    def __init__(self) -> None:
        super().__init__()
        self.other: _Other | None = None

    @precondition(lambda self: self.harness.apart is not None)
    @rule(keys=st.lists(st.sampled_from([*KEYS, None]), min_size=1, max_size=4),
          op=st.sampled_from(["ack", "nack", "reject"]), error=st.integers(0, 99),
          wait=st.integers(0, 2))
    def other_store(self, keys: list[str | None], op: Op, error: int, wait: int) -> None:
        """With ``wait == 0`` (a third of the steps), check a waiter of the first store."""
        self.run(self._other_store(keys, op, error, wait == 0))

    async def _other_store(self, keys: list[str | None], op: Op, error: int,
                           wait: bool) -> None:
        other = self.other or await self._open_other()
        await self._append_other(other, keys, wait)
        store, model = other.store, other.store.model
        t0 = await store.now()
        leases = await store.rheo.fetch(self.stream, self.group, consumer_id="other",
                                        limit=4, lease_ms=LONG_MS)
        model.check_fetch(leases, limit=4, partitions=None, consumer_id="other",
                          lease_ms=LONG_MS, t0=t0, t1=await store.now())
        other.leases.update((x.lease_id, x) for x in leases)
        current = [other.leases[i] for i in model.current_lease_ids()]
        if current:
            await settle_checked(store, op, current, error=ERRORS[error % len(ERRORS)])
        # Its appends checked its sequences; its dead letters carry its errors and ids.
        model.check_dead_letters(
            await store.rheo.dead_letters(self.stream, self.group, limit=10_000),
            await store.now())
        event(f"other_store: {op}")

    async def _open_other(self) -> _Other:
        """The second store, with the first store's stream and group names."""
        backend, rheo = await self.open_store(apart=True)
        streams = await rheo.streams()
        check(self.stream not in streams,
              "a second store from the harness already holds the first store's stream "
              "(the stores are not independent)")
        await rheo.create_stream(self.stream, partitions=PARTITIONS)
        await rheo.create_group(self.stream, self.group, max_attempts=MAX_ATTEMPTS)
        model = GroupModel(self.stream, self.group, PARTITIONS, MAX_ATTEMPTS,
                           self.harness.clock_margin_ms)
        self.other = _Other(Store(backend, rheo, model, self.harness, self.error_aware))
        return self.other

    async def _append_other(self, other: _Other, keys: list[str | None], wait: bool) -> None:
        """Append events whose ids the first store holds (or held): new in this one.

        With ``wait``, a waiter of the first store's stream (on a backend with push
        wake-ups) must not be woken by it (``wakeup.own_stream``).
        """
        events = []
        ids: list[str] = []
        for key in keys:
            other.appended += 1
            ids.append(f"e{other.appended}")
            events.append(NewEvent("sm.other", {"other": other.appended}, id=ids[-1], key=key,
                                   partition=None if key else other.appended % PARTITIONS))
        async with self._first_store_waiter(wait) as waiter:
            stored = await other.store.rheo.append(self.stream, events)
            if waiter is not None:
                check(not await waiter, "an append to the second store woke a waiter of the "
                      "first store's stream")
        check_equal(len(stored), len(events), "one stored event per appended event")
        for new_id, stored_event in zip(ids, stored, strict=True):
            other.store.model.appended(new_id, stored_event)

    @asynccontextmanager
    async def _first_store_waiter(self, wait: bool) -> AsyncIterator[asyncio.Future[bool] | None]:
        """With ``wait``, on a backend with push wake-ups and a harness with peers, a
        waiter of the first store's stream on a new instance over that store.

        A new instance has no wake-up due yet (the machine's own may have one: an
        append no fetch has seen, a settle that released a key, docs/ordering.md),
        so only an append can end its wait. A peer that is the backend itself (one
        process, one store: memory) wakes on appends only.
        """
        peer = self.harness.peer
        if not (wait and peer is not None and self.backend.capabilities.push_wakeups):
            yield None
            return
        async with AsyncExitStack() as stack:
            other = await stack.enter_async_context(peer(self.backend))
            rheo = self.rheo if other is self.backend else await stack.enter_async_context(
                Rheo(other))
            waiter = asyncio.ensure_future(rheo.wait_for_append(self.stream, WAIT_S))
            try:
                await asyncio.sleep(SETTLE_S)  # let it start waiting
                yield waiter
            finally:
                waiter.cancel()
                await asyncio.gather(waiter, return_exceptions=True)
