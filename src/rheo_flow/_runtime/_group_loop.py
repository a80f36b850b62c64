"""The loop of one consumer group: the feeder, the handler workers and the acknowledger.

A :class:`GroupLoop` runs over the group's :class:`~rheo_flow.Producer` (which
fetches, renews and frees demand); the :class:`~rheo_flow.Group` starts its
tasks and stops them:

* the feeder takes leases from the producer in batches, only while fewer than
  ``concurrency`` plus one fetch are waiting for a worker (so the next fetch is
  under way while a batch is handled);
* ``concurrency`` workers run the handler on queued leases, straight from one
  shared queue (no task or future per event), woken one at a time;
* the acknowledger settles whatever handlers finished since it last woke, one
  backend call per (operation, reason), through the shared decision table. On a
  backend whose ``ack_and_fetch`` is one call, acks finished while a fetch is
  under way wait for it: the feeder's next call carries them.

:class:`GroupStats` are the counters the loop keeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, TypeAlias

from .. import _telemetry
from .._model._errors import InvalidPayload, StaleLease
from .._model._event import Event
from .._model._failure import bounded, describe, error_text, failure_fields, truncated
from .._model._lease import Lease
from .._model._outcome import _CURRENT_LEASE, Ack, Context, Reject, Retry, Settled
from .._model._settle_results import SettleResult, classify
from .._model._typed import Models
from .._model._validation import MAX_REASON
from .._telemetry import EventProcessing
from .._telemetry._state import OFF, Off
from ._fetch_pair import Backlog, lead_and_follow
from ._idle_workers import IdleWorkers
from ._producer import Producer
from ._retry_policy import RetryPolicy
from ._settle_calls import SettleObserver, SettleOp, _outcome, by_settle_call, count_settled

__all__ = ["EventHandler", "GroupLoop", "GroupStats", "short_repr"]

log = logging.getLogger("rheo_flow.group")

_Category = Literal["ack", "retry", "reject", "handler_error", "invalid_outcome", "shutdown",
                    "settled", "invalid_payload"]

EventHandler: TypeAlias = Callable[[Event, Context], Awaitable[Any]]
"""What handles one event (a consumer's ``handle_event``, or the function it wraps)."""


@dataclass(slots=True)
class GroupStats:
    """Counters of one :class:`Group` (updated by the runtime; read them freely).

    ``acked``, ``retried``, ``rejected`` and ``nacked`` count settles that took
    effect; failure counters are keyed by the classified
    :class:`~rheo_flow.SettleKind` value (``"stale_lease"``, ...). The counters a
    :class:`~rheo_flow.ProducerStats` has too mean the same there, with the same types.
    """

    fetched: int = 0
    """Leases received from fetch."""
    acked: int = 0
    """Acks that took effect."""
    retried: int = 0
    """Nacks of :class:`~rheo_flow.Retry` outcomes that took effect."""
    rejected: int = 0
    """Rejects of :class:`~rheo_flow.Reject` outcomes that took effect."""
    dead_lettered: int = 0
    """Deliveries this group's settles dead-lettered: its rejects, and its nacks of a
    last attempt (the backend rejects those with reason ``"max_attempts"``). A lease
    that expired at its last attempt is dead-lettered by a later fetch, unseen here."""
    nacked: int = 0
    """Other nacks that took effect: handler failures, shutdown, failed settles."""
    handler_errors: int = 0
    """Handlers that raised."""
    invalid_outcomes: int = 0
    """Handlers that returned something other than ACK, Retry, Reject or SETTLED."""
    invalid_payloads: int = 0
    """Events whose data did not validate against their type's model (rejected at once,
    before the handler)."""
    skipped: int = 0
    """Leases lost (found stale on renew) before their handler started."""
    settle_failures: Counter[str] = field(default_factory=Counter)
    """Settle results that did not take effect, by kind."""
    fetch_failures_by_kind: Counter[str] = field(default_factory=Counter)
    """Failed fetches, by kind (:attr:`fetch_failures` is their total)."""
    renew_failures: Counter[str] = field(default_factory=Counter)
    """Renew results that did not take effect, by kind."""

    @property
    def fetch_failures(self) -> int:
        """Failed fetches (each one retried after a back-off)."""
        return self.fetch_failures_by_kind.total()


@dataclass(slots=True)
class _Finished:
    """A handled lease waiting for the acknowledger (acks travel as bare leases)."""

    lease: Lease
    category: _Category
    reason: str = ""
    delay_ms: int = 0
    error: BaseException | None = None
    """What the handler raised (``handler_error``), for telemetry."""
    last_error: str | None = None
    """The failure recorded on the delivery (the dead letter's ``last_error``)."""

    def settle_call(self) -> tuple[_Category, str, int, str | None]:
        """What the settle call that takes this lease is keyed by (leases with the same
        go out together)."""
        return (self.category, self.reason, self.delay_ms, self.last_error)


class GroupLoop:
    """The feeder, workers and acknowledger of one group over its ``producer``.

    The group runs :meth:`feed`, :meth:`work` (once per worker slot) and
    :meth:`acknowledge` as tasks, and sets :attr:`context` once ``setup`` built it.
    The producer calls :meth:`observe` once per settle call.
    """

    def __init__(
        self,
        producer: Producer,
        handle_event: EventHandler,
        *,
        concurrency: int,
        retry_policy: RetryPolicy,
        stats: GroupStats,
        observer: SettleObserver | None,
        models: Models | None = None,
    ) -> None:
        self._producer = producer
        self._typed = None if models is None else models.typed
        self._handle_event = handle_event
        self._concurrency = concurrency
        self._retry_policy = retry_policy
        self._stats = stats
        self._observer = observer
        self.context: Context = MappingProxyType({})
        """The read-only handler context (set by the group once ``setup`` built it)."""
        self._ready: deque[Lease] = deque()
        """Fetched leases waiting for a worker."""
        self._current: list[Lease | None] = [None] * concurrency
        """The lease each worker is handling."""
        self._acks: list[Lease] = []
        """Leases whose handler acked, waiting for the acknowledger (or the next fetch)."""
        self._nacks_and_rejects: list[_Finished] = []
        """Finished leases that are not bare acks: retries, rejects, failed handlers,
        hand-backs (each with the reason and delay its settle call takes)."""
        self._settling: _Category = "ack"
        """The category the acknowledger is settling (read by :meth:`observe`)."""
        self._idle = IdleWorkers()
        self._ready_bound = concurrency + producer.fetch_size
        """Leases the feeder lets wait for a worker: one fetch of read-ahead beyond
        the workers, so the next call is under way while a batch is handled
        (max_demand still bounds the leases held)."""
        producer._collect_acks(self._take_acks)
        self._room = asyncio.Event()
        self._backlog = Backlog()
        self._flush = asyncio.Event()
        self._closing = False
        self._handing_back = False
        """Set by :meth:`hand_back_unstarted`: leases no handler started go back."""

    # Feeding -------------------------------------------------------------------

    async def feed(self) -> None:
        """Take leases from the producer in batches while workers are short of work (a
        second fetch beside the first while they come back full: :mod:`._fetch_pair`)."""
        await lead_and_follow(self._feed(lead=True), self._feed(lead=False))

    async def _feed(self, *, lead: bool) -> None:
        """The lead fetches through ``demand`` (which waits for work); the other one only
        while the last fetch came back full."""
        producer = self._producer
        ready = self._ready
        room = self._room
        backlog = self._backlog
        size = producer.fetch_size
        full = self._ready_bound
        while True:
            if len(ready) >= full:
                room.clear()
                await room.wait()
                continue
            if lead:
                leases = await producer.demand(size)
                if not leases:
                    return  # draining or stopped
            elif not backlog:
                await backlog.wait()
                continue
            else:
                leases = await producer._demand_more(size)
            backlog.saw(len(leases), size)
            if not leases:
                continue
            if self._handing_back:
                self._give_back(leases)
                return
            self._stats.fetched += len(leases)
            ready.extend(leases)
            self._idle.wake_one()

    def hand_back_unstarted(self) -> None:
        """Stop fetching and hand back every lease no handler started (and those a
        fetch under way still returns), for ``drain(hand_back=True)``."""
        self._handing_back = True
        self._producer.halt()
        self._give_back(list(self._ready))
        self._ready.clear()

    def _give_back(self, leases: list[Lease]) -> None:
        """Queue unstarted leases for the acknowledger to hand back (one nack)."""
        if leases:
            self._nacks_and_rejects.extend(_Finished(lease, "shutdown", "shutdown")
                                           for lease in leases)
            self._flush.set()

    def close(self) -> list[Lease]:
        """Once the feeder and workers are gone: let the acknowledger finish what is
        queued and end, and return the leases that were handling or waiting."""
        leftovers = [lease for lease in self._current if lease is not None]
        leftovers.extend(self._ready)
        self._ready.clear()
        self._current = [None] * self._concurrency
        self._closing = True
        self._flush.set()
        return leftovers

    async def hand_back(self, leases: list[Lease]) -> None:
        """Hand back the leases :meth:`close` returned (one nack, reason ``"shutdown"``)."""
        self._settling = "shutdown"
        await self._producer.hand_back(leases, "shutdown")

    # Handling ------------------------------------------------------------------

    async def work(self, slot: int) -> None:
        """One worker: handle queued leases one at a time, forever, each one inside its
        telemetry ``process`` span (a no-op while telemetry is off)."""
        ready, idle, room, flush = self._ready, self._idle, self._room, self._flush
        current, acks, nacks_and_rejects = self._current, self._acks, self._nacks_and_rejects
        producer = self._producer
        consumer_id = producer.consumer_id
        handle_event, typed = self._handle_event, self._typed
        lost_ids = producer.inflight.lost_ids
        below_full = self._ready_bound - 1
        while True:
            if not ready:
                await idle.wait()
                continue
            context = self.context
            process = _process_span()  # per wake-up, not per event: telemetry may come on
            while ready:
                lease = ready.popleft()
                if ready:  # more waiting: another worker may take it while this one awaits
                    idle.wake_one()
                if len(ready) == below_full:  # only the feeder at the bound waits for room
                    room.set()
                if lost_ids and producer.lost(lease):
                    producer.skip(lease)
                    self._stats.skipped += 1
                    continue
                current[slot] = lease
                # The handler call, here rather than in a method: no coroutine per event.
                finished: _Finished | None
                with process(lease, consumer_id) as processing:
                    token = _CURRENT_LEASE.set(lease)
                    try:
                        outcome = await handle_event(
                            lease.event if typed is None else typed(lease.event), context)
                    except InvalidPayload as exc:
                        finished = self._invalid_payload(lease, exc)
                    except asyncio.CancelledError as exc:
                        task = asyncio.current_task()
                        if task is None or task.cancelling():
                            raise
                        finished = self._handler_failed(lease, exc)
                    except Exception as exc:
                        finished = self._handler_failed(lease, exc)
                    else:
                        finished = None if outcome.__class__ is Ack else self._classify(
                            lease, outcome)
                    finally:
                        _CURRENT_LEASE.reset(token)
                    if processing is not None:
                        _report(processing, finished)
                current[slot] = None
                # The acknowledger waits for a flush only once both lists were empty.
                if finished is None:
                    if not acks:
                        flush.set()
                    acks.append(lease)
                else:
                    if not nacks_and_rejects:
                        flush.set()
                    nacks_and_rejects.append(finished)

    def _classify(self, lease: Lease, outcome: object) -> _Finished | None:
        """What a handler's return value asks for (``None``: ack)."""
        if isinstance(outcome, Ack):
            return None
        if isinstance(outcome, Retry):
            delay = outcome.delay_ms
            if delay is None:
                delay = self._retry_policy.delay_ms(lease.attempt)
            reason = _reason(outcome.reason)
            return _Finished(lease, "retry", reason, delay, last_error=bounded(reason))
        if isinstance(outcome, Reject):
            return _Finished(lease, "reject", _reason(outcome.reason))
        if isinstance(outcome, Settled):
            return _Finished(lease, "settled", "settled")
        self._stats.invalid_outcomes += 1
        text = short_repr(outcome)
        delay = self._retry_policy.delay_ms(lease.attempt)
        producer = self._producer
        log.error("handler of %s/%s returned an invalid outcome for p%d s%d (attempt %d): %s "
                  "(expected ACK, Retry, Reject or SETTLED); nacking with a delay of %d ms",
                  producer.stream, producer.group, lease.partition, lease.sequence,
                  lease.attempt, text, delay, extra=failure_fields(lease, producer.consumer_id))
        reason = _reason(f"invalid_outcome: {text}")
        return _Finished(lease, "invalid_outcome", reason, delay, last_error=bounded(reason))

    def _invalid_payload(self, lease: Lease, exc: InvalidPayload) -> _Finished:
        """An event whose data does not validate: rejected at once (retrying cannot fix it)."""
        self._stats.invalid_payloads += 1
        producer = self._producer
        log.error("event of %s/%s p%d s%d (attempt %d) has invalid data, rejecting it: %s",
                  producer.stream, producer.group, lease.partition, lease.sequence,
                  lease.attempt, truncated(str(exc), 500),
                  extra=failure_fields(lease, producer.consumer_id))
        return _Finished(lease, "invalid_payload", "invalid_payload", error=exc,
                         last_error=error_text(exc))

    def _handler_failed(self, lease: Lease, exc: BaseException) -> _Finished:
        if isinstance(exc, StaleLease) and any(
                lost.lease_id == lease.lease_id for lost in exc.leases):
            return self._lost_in_transaction(lease, exc)
        self._stats.handler_errors += 1
        delay = self._retry_policy.delay_ms(lease.attempt)
        producer = self._producer
        log.error("handler of %s/%s failed on p%d s%d (attempt %d); nacking with a delay "
                  "of %d ms", producer.stream, producer.group, lease.partition, lease.sequence,
                  lease.attempt, delay, exc_info=exc,
                  extra=failure_fields(lease, producer.consumer_id))
        return _Finished(lease, "handler_error", _reason(f"handler_error: {describe(exc)}"),
                         delay, error=exc, last_error=error_text(exc))

    # Settling ------------------------------------------------------------------

    async def acknowledge(self) -> None:
        """The acknowledger: settle what finished, until :meth:`close` and all is settled."""
        flush = self._flush
        producer = self._producer
        while True:
            if not self._acks and not self._nacks_and_rejects:
                if self._closing:
                    return
                flush.clear()
                await flush.wait()
                continue
            if (not self._nacks_and_rejects and not self._closing
                    and producer._acks_wait_for_fetch()):
                # The feeder's next call carries these acks, the moment its fetch returns.
                await producer._fetch_landed()
                continue
            # Everything that finished since the last wake-up goes out together.
            # Workers append to these very lists: copy and empty them in place.
            acks = self._take_acks()
            nacks_and_rejects = self._nacks_and_rejects[:]
            self._nacks_and_rejects.clear()
            if acks:
                await self._settle_batch("ack", acks)
            for (category, reason, delay_ms, error), items in by_settle_call(
                    nacks_and_rejects, _Finished.settle_call).items():
                await self._settle_batch(category, [item.lease for item in items], reason,
                                         delay_ms, error)

    def _take_acks(self) -> list[Lease]:
        """The acks ready now (for the acknowledger, or the producer's next fetch)."""
        acks = self._acks[:]
        self._acks.clear()
        return acks

    async def _settle_batch(self, category: _Category, leases: list[Lease], reason: str = "",
                            delay_ms: int = 0, last_error: str | None = None) -> None:
        producer = self._producer
        self._settling = category
        try:
            if category == "ack":
                await producer.ack(leases)
            elif category == "reject" or category == "invalid_payload":
                await producer.reject(leases, reason, last_error)
            elif category == "shutdown":
                await producer.hand_back(leases, reason)
            elif category == "settled":  # by the handler, in its transaction
                producer.confirm(leases)
                if reason == "settled":
                    self._stats.acked += len(leases)
            else:
                await producer.nack(leases, reason, delay_ms, last_error)
        except Exception as exc:
            # Not expected (the facade classifies backend errors); never lose the leases.
            error = classify(exc, producer.rheo.backend.classify_error)
            self._stats.settle_failures[error.kind.value] += len(leases)
            producer.confirm(leases)
            log.error("settling %d leases of %s/%s failed: %s; leaving them to expire",
                      len(leases), producer.stream, producer.group, error.reason, exc_info=exc)

    def _lost_in_transaction(self, lease: Lease, exc: StaleLease) -> _Finished:
        """The handler's own transaction found its lease stale and rolled back: the event
        is another consumer's now. Release the lease unsettled (a nack would be refused)."""
        self._stats.settle_failures[exc.kind] += 1
        producer = self._producer
        log.warning("handler of %s/%s lost its lease of p%d s%d (attempt %d) in its "
                    "transaction, rolled back: %s", producer.stream, producer.group,
                    lease.partition, lease.sequence, lease.attempt, exc,
                    extra=failure_fields(lease, producer.consumer_id))
        return _Finished(lease, "settled", "lost", error=exc)

    def observe(self, op: SettleOp, leases: Sequence[Lease],
                results: Sequence[SettleResult]) -> None:
        """Count one settle call's results (called by the producer's settle) and pass
        them on, one :class:`~rheo_flow.SettleOutcome` per lease, to the observer."""
        stats = self._stats
        took_effect = count_settled(stats, self._producer.rheo, op, leases, results)
        if op == "nack":
            if self._settling == "retry":
                stats.retried += took_effect
            else:
                stats.nacked += took_effect
        observer = self._observer
        if observer is not None:
            for lease, result in zip(leases, results, strict=True):
                try:
                    observer(_outcome(op, lease, result))
                except Exception:
                    log.exception("settle observer of %s/%s failed", self._producer.stream,
                                  self._producer.group)


def _untraced(lease: Lease, consumer_id: str) -> Off:
    """The ``process`` span of an event while telemetry is off: none."""
    return OFF


def _process_span() -> Callable[[Lease, str], EventProcessing | Off]:
    """What opens an event's ``process`` span: nothing while no tracer and no meter
    provider is configured (one check for a worker's run of events, not one per event)."""
    if _telemetry.tracer() is None and _telemetry.instruments() is None:
        return _untraced
    return _telemetry.process_event


def _report(processing: EventProcessing, finished: _Finished | None) -> None:
    """Tell an event's ``process`` span what became of its handler's result."""
    if finished is None:
        processing.outcome("ack")
    else:
        processing.outcome(finished.category, finished.error)


def short_repr(value: object, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters (for messages about bad values)."""
    return truncated(repr(value), limit)


def _reason(text: str) -> str:
    """A settle reason the facade accepts: bounded length."""
    return truncated(text, MAX_REASON)
