"""The demand-driven producer: fetches leases on demand, renews them, frees demand on settle.

A :class:`Producer` is the pipeline's source (and can drive any hand-written
consumer): a caller asks for ``n`` leases with :meth:`Producer.demand` and gets
at most ``min(n, max_demand - inflight)`` of them. Every lease stays inflight,
renewed in one backend call about every ``lease_ms / 2``, until it is settled
through :meth:`~Producer.ack`, :meth:`~Producer.nack`, :meth:`~Producer.reject`
or released with :meth:`~Producer.confirm`; that frees demand.

It is the one fetching runtime of rheo_flow: consumer groups and pipelines both
run over it, so fetch sizing, renewal, back-off, idle waits (push wake-ups or
``poll_ms``), skipping leases lost before their handler starts and handing
unstarted leases back on shutdown behave the same in both.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Literal, Self

from .._model._errors import AlreadyStarted, InvalidArgument, NotStarted, StoreLost
from .._model._lease import Lease
from .._model._settle_results import SettleResult, classify
from .._model._validation import check_partition, check_positive_int
from .._rheo import DEFAULT_LEASE_MS, MAX_FETCH, Partitions, Rheo
from .._support._waiting import first_of, wait_event
from ._ack_handover import AckHandover, ack_then_fetch, resolve
from ._backoff import Backoff
from ._inflight import Inflight
from ._lifecycle import Lifecycle, Runtime, State
from ._options import PRODUCER
from ._producer_stats import ProducerStats
from ._renewal import renew_forever
from ._settle_calls import (
    BatchObserver,
    SettleObserver,
    SettleOp,
    count_settled,
    per_outcome,
    settle,
    settled,
)

__all__ = ["Producer", "ProducerStats"]

log = logging.getLogger("rheo_flow.producer")

class Producer(Runtime):
    """Demand-driven source of leases for one (stream, group).

    ``max_demand`` bounds the leases inflight at once: memory stays bounded by it
    whatever the backlog. ``lease_ms`` is each lease's time to live (renewed
    every ``lease_ms / 2`` while inflight); ``poll_ms`` is how long an idle
    producer waits before fetching again when the backend cannot push
    wake-ups (with push wake-ups it is the upper bound of the wait); its own
    nacks, and in a key-ordered group on a distributed store its settles, end
    the wait at once.
    ``fetch_size`` (default ``max_demand``) caps one fetch, so that the next
    fetch can overlap the handling of the last batch.
    ``max_attempts`` (when given) updates the group's setting on start;
    ``ordering`` (when given) is the group's ordering if starting creates it, and
    must be an existing group's (docs/ordering.md).
    ``observer`` is called with every settle outcome (its classified kind
    included), e.g. to feed telemetry.

    Use it as ``async with Producer(...) as producer:`` (start, then drain for
    up to ``shutdown_timeout`` seconds on exit), or call :meth:`start` and
    :meth:`drain` / :meth:`stop` yourself.
    """

    def __init__(
        self,
        rheo: Rheo,
        stream: str,
        group: str,
        *,
        max_demand: int = 100,
        fetch_size: int | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        poll_ms: int = 200,
        consumer_id: str | None = None,
        partitions: Partitions = "all",
        max_attempts: int | None = None,
        ordering: Literal["none", "key"] | None = None,
        backoff: Backoff | None = None,
        observer: SettleObserver | None = None,
        shutdown_timeout: float = 30.0,
    ) -> None:
        if not isinstance(rheo, Rheo):
            raise InvalidArgument(f"rheo must be a Rheo instance, got {type(rheo).__name__}")
        self._rheo = rheo
        chosen = PRODUCER.resolve({
            "stream": stream, "group": group, "max_demand": max_demand,
            "fetch_size": fetch_size, "lease_ms": lease_ms, "poll_ms": poll_ms,
            "consumer_id": consumer_id, "partitions": partitions,
            "max_attempts": max_attempts, "ordering": ordering, "backoff": backoff,
            "observer": observer, "shutdown_timeout": shutdown_timeout,
        })
        self._stream: str = chosen["stream"]
        self._group: str = chosen["group"]
        self._max_demand: int = chosen["max_demand"]
        self._fetch_size: int = self._max_demand if fetch_size is None else fetch_size
        self._lease_ms: int = chosen["lease_ms"]
        self._poll_ms: int = chosen["poll_ms"]
        self._consumer_id: str = consumer_id or rheo.new_consumer_id()
        self._partitions: Partitions = chosen["partitions"]
        self._max_attempts: int | None = max_attempts
        self._ordering: str | None = ordering
        self._refetch_after_settle = False
        """Whether an idle fetch goes again after every settle (known once started): in a
        key-ordered group on a distributed store, a settle may have released a key whose
        next event can be fetched at once."""
        self._backoff = backoff or Backoff()
        self._observer: BatchObserver | None = None if observer is None else per_outcome(observer)
        """Called once per settle call (a runtime over the producer sets its own)."""
        self._shutdown_timeout = float(shutdown_timeout)
        self._inflight = Inflight(self._max_demand)
        self._life = Lifecycle(f"producer {self._stream}/{self._group}", self._shutdown)
        self._fetch_lock = asyncio.Lock()
        self._reserved = 0  # leases the fetches under way may bring: room they hold
        self._room_freed = asyncio.Event()  # on every release, and on a halt: wakes a demand
        self._fetching_halted = asyncio.Event()  # set once fetching must stop (drain or stop)
        self._work_ready = asyncio.Event()
        """Ends an idle wait early: set on a halt and when a settle made work available."""
        self._acks_alone: set[asyncio.Task[Any]] = set()
        """Acks a halted or cancelled demand sends on their own: a stop waits for them."""
        self._stats = ProducerStats()
        self._handover = AckHandover()  # acks riding on a waiting demand's next fetch

    # Properties --------------------------------------------------------------

    @property
    def rheo(self) -> Rheo:
        """The instance this producer fetches from."""
        return self._rheo

    @property
    def stream(self) -> str:
        """The stream consumed."""
        return self._stream

    @property
    def group(self) -> str:
        """The consumer group."""
        return self._group

    @property
    def consumer_id(self) -> str:
        """The consumer id leases are taken under."""
        return self._consumer_id

    @property
    def max_demand(self) -> int:
        """The bound on inflight leases."""
        return self._max_demand

    @property
    def fetch_size(self) -> int:
        """The most leases one fetch asks for."""
        return self._fetch_size

    @property
    def lease_ms(self) -> int:
        """The lease time to live, in milliseconds."""
        return self._lease_ms

    @property
    def poll_ms(self) -> int:
        """The idle poll interval, in milliseconds."""
        return self._poll_ms

    @property
    def partitions(self) -> Partitions:
        """The partitions fetched from (``"all"`` or a list)."""
        return self._partitions

    @property
    def inflight(self) -> Inflight:
        """The inflight set (leases fetched and not yet settled or confirmed)."""
        return self._inflight

    @property
    def state(self) -> State:
        """``new``, ``running``, ``draining``, ``stopping`` or ``stopped``."""
        return self._life.state

    def stats(self) -> ProducerStats:
        """A snapshot of the counters."""
        return self._stats.copy()

    # Lifecycle ---------------------------------------------------------------

    async def start(self) -> Self:
        """Check the stream, create (or update) the group and start renewing.

        Raises :class:`~rheo_flow.AlreadyStarted` when called twice and
        :class:`~rheo_flow.UnknownStream` when the stream does not exist.
        """
        if self._life.state is not State.NEW:
            raise AlreadyStarted(f"producer {self._consumer_id} was already started")
        try:
            info = await self._rheo.stream_info(self._stream)
            if self._partitions != "all":
                self._partitions = sorted({check_partition(p, info.partitions)
                                           for p in self._partitions})
            group = await self._rheo._ensure_group(self._stream, self._group,
                                                   max_attempts=self._max_attempts,
                                                   ordering=self._ordering)
            # Across processes (a distributed store), a released key's next event is
            # fetched again at once; an embedded one keeps to its poll, since fetching
            # after every settle would make the processes sharing a file wait on its lock.
            self._refetch_after_settle = (group.ordering == "key"
                                          and self._rheo.capabilities.distributed)
        except BaseException:
            self._life.ended()  # a failed start leaves nothing running
            raise
        self._life.state = State.RUNNING
        self._life.tasks.spawn(renew_forever(self._rheo, self._inflight, self._lease_ms,
                                             self._stats, self._stream, self._group),
                               f"renewer {self._consumer_id}")
        return self

    async def drain(self, timeout: float | None = None) -> bool:
        """Stop fetching and wait until every inflight lease is settled or released.

        Renewal keeps running while waiting. Returns True when nothing is left
        inflight (renewal then stops and the producer is stopped); False when
        ``timeout`` seconds passed first (it keeps renewing: call :meth:`stop`).
        """
        life = self._life
        if life.state is State.NEW:
            life.ended()
            return True
        if life.stopping:
            await life.stop()
            return not self._inflight
        life.state = State.DRAINING
        self._halt_fetching()
        if not await self._inflight.wait_empty(timeout):
            return False
        await life.stop()
        return True

    async def stop(self) -> None:
        """Stop fetching and renewing now; leases still inflight are left to expire.

        To give unstarted leases back to the group first, pass them to
        :meth:`hand_back`. Idempotent; a cancellation of the caller is raised while
        the stop goes on to its end.
        """
        self._halt_fetching()
        await self._life.stop()

    async def _shutdown(self) -> None:
        """Stop fetching, let acks sent on their own finish; the lifecycle then cancels
        the renewer."""
        self._halt_fetching()
        if self._acks_alone:
            await asyncio.wait(self._acks_alone)
        if self._inflight:
            log.info("producer %s stopped with %d leases inflight: left to expire",
                     self._consumer_id, len(self._inflight))

    def halt(self) -> None:
        """Stop fetching (a :meth:`demand` in progress returns what its fetch claimed,
        the next one returns ``[]``) without waiting for anything; renewal goes on."""
        self._halt_fetching()

    def _halt_fetching(self) -> None:
        self._fetching_halted.set()
        self._room_freed.set()
        self._work_ready.set()


    # Demand ------------------------------------------------------------------

    async def demand(self, n: int) -> list[Lease]:
        """Fetch at most ``min(n, fetch_size, max_demand - inflight)`` leases and track them.

        Waits while nothing can be fetched (no capacity, nothing available, or
        the backend failing, with backoff) and returns at least one lease; an
        empty list means the producer is draining or stopped.
        """
        check_positive_int("n", n)
        if self._life.state is State.NEW:
            raise NotStarted("start the producer before asking it for leases")
        async with self._fetch_lock:
            try:
                while not self._fetching_halted.is_set():
                    leases = await self._fetch_round(n, wait=True)
                    if leases is None:
                        continue
                    if leases:
                        return leases
                    await self._idle()
                return []
            finally:
                handed = self._handover.take()
                if handed is not None:  # halted or cancelled: the acks go out alone
                    self._send_alone(*handed)

    async def batches(self, size: int) -> AsyncIterator[list[Lease]]:
        """Leases in lists of at most ``size``, as demand allows, until drained or stopped."""
        check_positive_int("size", size)
        while True:
            leases = await self.demand(size)
            if not leases:
                return
            yield leases

    async def _demand_more(self, n: int) -> list[Lease]:
        """A fetch beside :meth:`demand`'s (not under its lock), for a runtime that keeps
        two under way while a backlog lasts: one round, never an idle wait; ``[]`` when
        it had no room, failed, fetched nothing, or fetching stopped."""
        if self._fetching_halted.is_set() or self._life.state is not State.RUNNING:
            return []
        return await self._fetch_round(n, wait=False) or []

    async def _fetch_round(self, n: int, *, wait: bool) -> list[Lease] | None:
        """One fetch, with the acks handed over or ready if any; ``None`` when it made
        none (no room: waited for some if ``wait``) or failed."""
        handed = self._handover.take() or self._handover.collect()
        if handed is not None:
            return await self._ack_and_fetch(n, *handed)
        free = self._room()
        if free <= 0:
            if wait:
                await self._wait_for_capacity()
            return None
        self._work_ready.clear()
        return await self._fetch(min(n, free, self._fetch_size, MAX_FETCH))

    def _room(self) -> int:
        """The leases a fetch may ask for: the inflight set's free room, less what the
        fetches under way may bring."""
        return self._inflight.free - self._reserved

    async def _fetch(self, limit: int) -> list[Lease] | None:
        """One fetch; ``None`` after a failure (already waited out its backoff)."""
        self._reserved += limit
        try:
            with self._handover.fetching():
                leases = await self._rheo.fetch(
                    self._stream, self._group, consumer_id=self._consumer_id, limit=limit,
                    lease_ms=self._lease_ms, partitions=self._partitions,
                )
        except (InvalidArgument, StoreLost):
            raise  # retrying cannot help: the runtime stops with it
        except Exception as exc:
            error = classify(exc, self._rheo.backend.classify_error)
            self._stats.fetch_failures_by_kind[error.kind.value] += 1
            delay = self._backoff.next_delay()
            log.warning("fetch from %s/%s failed (%s: %s); retrying in %.2fs (%d in a row)",
                        self._stream, self._group, error.kind.value, error.reason, delay,
                        self._backoff.failures)
            await self._wait_halt(delay)
            return None
        finally:
            self._reserved -= limit
        self._backoff.reset()
        return self._took(leases)

    def _took(self, leases: list[Lease]) -> list[Lease]:
        """Track the leases a fetch returned (none once stopped: they expire)."""
        if self._life.stopping:
            # Stopped while fetching: nobody will settle these; let them expire.
            return []
        if leases:
            self._inflight.add(leases, self._lease_ms)
            stats = self._stats
            stats.fetched += len(leases)
            if len(self._inflight) > stats.peak_inflight:
                stats.peak_inflight = len(self._inflight)
        return leases

    async def _wait_for_capacity(self) -> None:
        self._room_freed.clear()
        if self._room() > 0 or self._fetching_halted.is_set():
            return
        self._handover.waiting = True
        try:
            await wait_event(self._room_freed, self._poll_ms / 1000)
        finally:
            self._handover.waiting = False

    async def _ack_and_fetch(self, n: int, acks: list[Lease],
                             done: asyncio.Future[list[SettleResult]] | None
                             ) -> list[Lease] | None:
        """Acks handed over (by :meth:`ack`, or collected from the runtime) and the fetch
        the room they free allows, in one backend call; ``None`` if it failed (the acks
        then went out alone)."""
        inflight = self._inflight
        room = self._room() + sum(1 for lease in acks if lease.lease_id in inflight)
        limit = min(n, room, self._fetch_size, MAX_FETCH)
        if limit <= 0:  # the room is taken by the other fetch under way
            await self._ack_alone(acks, done)
            return None
        self._work_ready.clear()
        self._reserved += limit
        try:
            with inflight.settling(acks), self._handover.fetching():
                results, leases = await ack_then_fetch(
                    self._rheo, acks, self._stream, self._group, self._consumer_id,
                    limit, self._lease_ms, self._partitions)
        except asyncio.CancelledError:
            # Cancelled with the call under way (a runtime stopping its second fetch):
            # the acks may have landed. Ack them again in a task the stop waits for (an
            # ack repeats as an ack), so they are released and counted, not left
            # inflight to expire; what the call fetched expires.
            self._reserved -= limit
            self._send_alone(acks, done)
            raise
        except Exception:
            # The acks may not have taken effect: ack them alone (an ack repeats as an
            # ack); the fetch is made again on its own, with its own error handling.
            self._reserved -= limit
            await self._ack_alone(acks, done)
            return None
        self._reserved -= limit
        inflight.release(acks)
        took = self._took(leases)  # before any await: the room stays counted
        try:
            results = await settled(self._rheo, "ack", acks, results, observer=self._observer)
        finally:
            self._room_freed.set()
            self._count("ack", acks, results)
            resolve(done, results)
        return took

    def _send_alone(self, acks: list[Lease],
                    done: asyncio.Future[list[SettleResult]] | None) -> None:
        """:meth:`_ack_alone` in a task of the producer's, which a stop waits for."""
        async def send() -> None:
            try:
                await self._ack_alone(acks, done)
            except Exception as exc:  # their waiter, if any, has it; else they expire
                log.warning("acks of %d leases on %s/%s failed: %s", len(acks),
                            self._stream, self._group, exc)

        task = self._life.tasks.spawn(send(), "acks")
        self._acks_alone.add(task)
        task.add_done_callback(self._acks_alone.discard)

    async def _ack_alone(self, acks: list[Lease],
                         done: asyncio.Future[list[SettleResult]] | None) -> None:
        """Ack handed-over acks in a call of their own and give them their results."""
        try:
            results = await self._settle("ack", acks)
        except BaseException as exc:
            if done is not None and not done.done():
                done.set_exception(exc)
            raise
        resolve(done, results)

    def _acks_wait_for_fetch(self) -> bool:
        """Whether a runtime's acks should wait for the fetch under way (the next
        call collects them; see :mod:`._ack_handover`)."""
        return self._handover.defers()

    async def _fetch_landed(self) -> None:
        """Wait until the fetch under way returned."""
        await self._handover.landed()

    def _collect_acks(self, source: Callable[[], list[Lease]]) -> None:
        """Let a runtime's finished acks go with this producer's fetches: before each
        fetch, ``source`` gives the acks ready then (on a backend whose ``ack_and_fetch``
        is one round trip; elsewhere they keep going out on their own)."""
        if self._rheo.backend.one_call_ack_and_fetch:
            self._handover.source = source

    async def _idle(self) -> None:
        """Wait for an append (push wake-ups), a nack that made work available, the poll
        interval, or a halt."""
        timeout = self._poll_ms / 1000
        if not self._rheo.capabilities.push_wakeups:
            await wait_event(self._work_ready, timeout)
            return
        woken, _ = await first_of(self._rheo.wait_for_append(self._stream, timeout),
                                  self._work_ready.wait())
        if not woken.cancelled() and woken.exception() is not None:
            # A wake-up channel that fails at once must not turn idling into spinning.
            log.debug("wait_for_append on %s failed: %s", self._stream, woken.exception())
            await wait_event(self._work_ready, timeout)

    async def _wait_halt(self, timeout: float) -> None:
        await wait_event(self._fetching_halted, timeout)

    # Settling ----------------------------------------------------------------

    async def ack(self, leases: Iterable[Lease]) -> list[SettleResult]:
        """Acknowledge leases in one call, release them and free demand.

        While a :meth:`demand` waits for the room these acks free, they go with its
        next fetch, in one backend call where the backend can (``ack_and_fetch``).
        """
        items = leases if isinstance(leases, list) else list(leases)
        done = self._handover.offer(items)
        if done is None:
            return await self._settle("ack", items)
        self._room_freed.set()
        return await done

    async def nack(
        self, leases: Iterable[Lease], reason: str, delay_ms: int = 0, error: str | None = None
    ) -> list[SettleResult]:
        """Return leases for redelivery after ``delay_ms``, release them, free demand.

        ``error`` is recorded as the deliveries' last error.
        """
        return await self._settle("nack", leases, reason, delay_ms, error)

    async def reject(self, leases: Iterable[Lease], reason: str, error: str | None = None
                     ) -> list[SettleResult]:
        """Dead-letter leases for the group, release them and free demand."""
        return await self._settle("reject", leases, reason, 0, error)

    async def hand_back(self, leases: Iterable[Lease], reason: str = "shutdown"
                        ) -> list[SettleResult]:
        """Give leases whose handling never started or was cut short back to the group.

        One nack for immediate redelivery (delay 0), in (partition, sequence)
        order, so that another consumer gets them without waiting for their
        expiry. Consumer groups and pipelines both use it when they shut down.
        """
        results = await self._settle("nack", sorted(leases, key=_position), reason)
        self._stats.handed_back += sum(result.ok for result in results)
        return results

    async def hand_back_inflight(self, reason: str = "shutdown") -> list[SettleResult]:
        """:meth:`hand_back` every lease still inflight (once nothing will handle them)."""
        return await self.hand_back([entry.lease for entry in self._inflight.entries()],
                                    reason)

    def lost(self, lease: Lease) -> bool:
        """Whether a renew found ``lease`` stale (or it is no longer inflight): settling it
        would be refused, and handling it would duplicate another consumer's work."""
        inflight = self._inflight
        if not inflight.lost_count:
            return lease.lease_id not in inflight
        return lease.lease_id not in inflight or inflight.is_lost(lease.lease_id)

    def skip(self, lease: Lease) -> None:
        """Release a lease found :meth:`lost` before its handler started, unsettled
        (the backend redelivers it to whoever holds it now)."""
        self._inflight.release([lease])
        self._stats.skipped += 1
        self._room_freed.set()
        log.info("skipping %s/%s p%d s%d: its lease was lost before handling",
                 self._stream, self._group, lease.partition, lease.sequence)

    def confirm(self, leases: Iterable[Lease]) -> int:
        """Release leases without settling them (they were settled elsewhere).

        For example when a sink committed the ack in its own transaction.
        Returns how many were inflight.
        """
        released = self._inflight.release(leases)
        self._stats.confirmed += released
        self._room_freed.set()
        return released

    async def _settle(
        self, op: SettleOp, leases: Iterable[Lease], reason: str = "", delay_ms: int = 0,
        last_error: str | None = None,
    ) -> list[SettleResult]:
        items = leases if isinstance(leases, list) else list(leases)
        if not items:
            return []
        try:
            results = await settle(self._rheo, op, items, reason=reason, delay_ms=delay_ms,
                                   error=last_error, inflight=self._inflight,
                                   observer=self._observer)
        finally:
            self._room_freed.set()
        self._count(op, items, results)
        return results

    def _count(self, op: SettleOp, items: list[Lease], results: list[SettleResult]) -> None:
        """Record a settle call's results in the stats; poke an idle fetch if it made
        work available."""
        took_effect = count_settled(self._stats, self._rheo, op, items, results)
        if op == "nack":
            self._stats.nacked += took_effect
        if op == "nack" or took_effect < len(results) or self._refetch_after_settle:
            # Redelivered work (a nack, or the decision table's nack after a failed
            # settle), or in a key-ordered group the next event of a key this settle
            # released (see _refetch_after_settle), is available at once: an idle
            # fetch need not wait for poll_ms.
            self._work_ready.set()


def _position(lease: Lease) -> tuple[int, int]:
    return (lease.event.partition, lease.event.sequence)
