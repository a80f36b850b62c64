"""Acks handed over to the next fetch: one backend call acks a batch and fetches the next.

A consumer's acknowledger and its feeder often need the backend at the same moment:
the acks of a finished batch free the room the feeder is waiting for. While (and only
while) the feeder waits for room, :class:`AckHandover` lets those acks ride on the
fetch they make possible, through ``Backend.ack_and_fetch`` (one call and one
commit on PostgreSQL and SQLite, one pipeline on Redis; two calls on MongoDB and in
memory). Acks offered at any other time
(the feeder fetching, idle, drained or stopped) go out at once, as before.

On a backend whose ``ack_and_fetch`` is one round trip, a runtime also lets the
feeder collect the acks it has ready before each fetch (:meth:`AckHandover.collect`),
and holds its acks while a fetch is under way (:meth:`AckHandover.defers`): the
feeder makes its next call as soon as that fetch returns, with the acks of the
batch handled meanwhile, and the batch that fetch brought is handled while the
call is under way. Acks the feeder does not collect then go out on their own.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence

from .. import _telemetry
from .._model._lease import Lease
from .._model._settle_results import SettleResult
from .._rheo import Partitions, Rheo

__all__ = ["AckHandover", "ack_then_fetch"]

Handed = tuple[list[Lease], "asyncio.Future[list[SettleResult]] | None"]
"""Acks handed over, and the future their results go to (None: collected from the
runtime, whose observer sees the results)."""


class AckHandover:
    """The acks handed to a feeder waiting for room (one batch or several)."""

    __slots__ = ("_handed", "_in_flight", "_landed", "source", "waiting")

    def __init__(self) -> None:
        self.waiting = False
        """Set by the feeder while it waits for room: acks are taken then."""
        self.source: Callable[[], list[Lease]] | None = None
        """Where a runtime's finished acks wait (see :meth:`collect`)."""
        self._handed: list[Handed] = []
        self._in_flight = 0
        self._landed = asyncio.Event()
        """Set (and replaced) as each fetch call returns."""

    @contextlib.contextmanager
    def fetching(self) -> Iterator[None]:
        """Mark a fetch call under way (see :meth:`defers`); two may overlap."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            landed, self._landed = self._landed, asyncio.Event()
            landed.set()

    def defers(self) -> bool:
        """Whether a runtime's acks should wait for the fetch under way: the feeder
        collects them for the call it makes as soon as that fetch returns."""
        return self._in_flight > 0 and self.source is not None

    async def landed(self) -> None:
        """Wait until a fetch under way returned."""
        if self._in_flight:
            await self._landed.wait()

    def offer(self, acks: list[Lease]) -> asyncio.Future[list[SettleResult]] | None:
        """Hand ``acks`` to the feeder's next call: the future of their results, or None
        when no feeder waits for room (ack them now)."""
        if not acks or not self.waiting:
            return None
        done: asyncio.Future[list[SettleResult]] = asyncio.get_running_loop().create_future()
        self._handed.append((acks, done))
        return done

    @property
    def handed(self) -> bool:
        """Whether acks wait for the feeder."""
        return bool(self._handed)

    def take(self) -> Handed | None:
        """The acks handed over (and the future of their results), once; None when there
        are none. Several batches are taken as one, their results split back."""
        handed, self._handed = self._handed, []
        if len(handed) <= 1:
            return handed[0] if handed else None
        merged: asyncio.Future[list[SettleResult]] = asyncio.get_running_loop().create_future()
        merged.add_done_callback(lambda done: _split(done, handed))
        return [lease for acks, _ in handed for lease in acks], merged

    def collect(self) -> Handed | None:
        """The acks a runtime has ready (see :attr:`source`), taken from it; None when
        there are none."""
        acks = self.source() if self.source is not None else None
        return (acks, None) if acks else None


def _split(done: asyncio.Future[list[SettleResult]], handed: list[Handed]) -> None:
    """Give each batch taken together its own results (or the error of the call)."""
    error = None if done.cancelled() else done.exception()
    end = 0
    for acks, future in handed:
        start, end = end, end + len(acks)
        if future is None or future.done():
            continue
        if done.cancelled():
            future.cancel()
        elif error is not None:
            future.set_exception(error)
        else:
            future.set_result(done.result()[start:end])


def resolve(done: asyncio.Future[list[SettleResult]] | None,
            results: list[SettleResult]) -> None:
    """Give handed-over acks their results (unless the acknowledger gave up waiting)."""
    if done is not None and not done.done():
        done.set_result(results)


async def ack_then_fetch(
    rheo: Rheo, acks: Sequence[Lease], stream: str, group: str, consumer_id: str, limit: int,
    lease_ms: int, partitions: Partitions,
) -> tuple[list[SettleResult], list[Lease]]:
    """Ack ``acks`` and fetch up to ``limit`` leases in one backend call, reported as the
    acks' settle span and the fetch's poll span. Raises if the call failed (the acks
    may or may not have taken effect)."""
    backend = rheo.backend
    count = await rheo._partition_count(stream)
    selected = rheo._partitions(partitions, count)
    results: list[SettleResult] = []

    async def fetch(stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
                    parts: Sequence[int] | None) -> list[Lease]:
        nonlocal results
        results, leases = await backend.ack_and_fetch(acks, stream, group, consumer_id, limit,
                                                      lease_ms, parts)
        return leases

    with _telemetry.settling("ack", acks, backend, rheo._max_attempts) as telemetry:
        leases = await _telemetry.receive(backend, stream, group, consumer_id, limit, lease_ms,
                                          selected, count, fetch=fetch)
        if telemetry is not None:
            telemetry.done(results)
    return results, leases
