"""Consumer groups: the :class:`Consumer` an application writes, and the :class:`Group`
runtime that runs it (a worker pool over the demand-driven :class:`Producer`).

A :class:`Consumer` implements :meth:`Consumer.handle_event` (and optionally
:meth:`Consumer.setup`); :meth:`Consumer.start` builds the :class:`Group` that
fetches, renews and settles for it. A plain async function becomes a consumer
with the :func:`consumer` decorator. The two classes share one module because
each needs the other: ``start`` builds a Group, a Group checks and runs a
Consumer. What a handler returns (the outcomes) is in :mod:`rheo_flow._outcome`.

One :class:`Group` runs one :class:`~rheo_flow.Consumer` for one
(instance, stream, group) in this process. The :class:`~rheo_flow.Producer`
does what pipelines share with it: fetching (at most ``fetch_size`` and never
more than ``max_demand`` inflight), renewal of everything inflight in one call
about every ``lease_ms / 2``, back-off after failed fetches, idle waits on push
wake-ups or ``poll_ms``, and handing unfinished leases back on shutdown. On top:

* the feeder takes leases from the producer in batches, only while fewer than
  ``concurrency`` are waiting for a worker;
* ``concurrency`` workers run the handler on queued leases, straight from one
  shared queue (no task or future per event);
* the acknowledger settles whatever handlers finished since it last woke, one
  backend call per (operation, reason), through the shared decision table.
"""

from __future__ import annotations

import asyncio
import logging
import math
from abc import ABC, abstractmethod
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType, TracebackType
from typing import Any, Literal, Self, TypeAlias

from . import _telemetry
from ._backlog import wait_caught_up
from ._backoff import Backoff
from ._errors import (
    AlreadyStarted,
    InvalidArgument,
    NotStarted,
    RheoError,
    SetupRefused,
    StoreLost,
)
from ._event import Event
from ._failure import bounded, error_text, failure_fields
from ._lease import Lease
from ._options import CONSUMER, GROUP, validate
from ._outcome import _CURRENT_LEASE, Ack, Context, Outcome, Reject, Retry
from ._producer import Producer
from ._retry import RetryPolicy
from ._rheo import Partitions, Rheo
from ._settle_calls import SettleObserver, SettleOp, _outcome, dead_lettered
from ._settle_results import SettleResult, classify
from ._validation import MAX_REASON

__all__ = ["Consumer", "Group", "GroupStats", "consumer"]

log = logging.getLogger("rheo_flow.group")

_REGISTRY: dict[tuple[str, str, str], Group] = {}
"""Running groups of this process, by (instance id, stream, group)."""

_Category = Literal["ack", "retry", "reject", "handler_error", "invalid_outcome", "shutdown"]
_State = Literal["new", "starting", "running", "stopping", "stopped"]


@dataclass(slots=True)
class GroupStats:
    """Counters of one :class:`Group` (updated by the runtime; read them freely).

    ``acked``, ``retried``, ``rejected`` and ``nacked`` count settles that took
    effect; failure counters are keyed by the classified
    :class:`~rheo_flow.SettleKind` value (``"stale_lease"``, ...).
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
    """Handlers that returned something other than ACK, Retry or Reject."""
    skipped: int = 0
    """Leases lost (found stale on renew) before their handler started."""
    settle_failures: Counter[str] = field(default_factory=Counter)
    """Settle results that did not take effect, by kind."""
    fetch_failures: Counter[str] = field(default_factory=Counter)
    """Failed fetches, by kind."""
    renew_failures: Counter[str] = field(default_factory=Counter)
    """Renew results that did not take effect, by kind."""


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


class Consumer(ABC):
    """Base class of a consumer group's handler.

    Options are class attributes (defaults), constructor keyword arguments, or
    keyword arguments of :meth:`start`, the later winning. Keys that are not
    options of the runtime are application keys: they reach :meth:`setup`
    untouched, unless they look like a misspelt option (``concurency``), which
    raises :class:`~rheo_flow.InvalidArgument` suggesting the option::

        class RiskConsumer(Consumer):
            stream = "market-events"
            group = "risk"
            concurrency = 8

            async def setup(self, options):
                return {"counter": options["counter"]}

            async def handle_event(self, event, context):
                context["counter"].increment()
                return ACK

        async with RiskConsumer().start(rheo, counter=counter) as group:
            ...

    A consumer holds no per-event state: handlers run concurrently, so shared
    mutable state belongs to objects referenced from the context.
    """

    stream: str | None = None
    """The stream to consume (required)."""
    group: str | None = None
    """The consumer group (required)."""
    max_demand: int = 100
    """Bound on outstanding leases (fetched and not yet settled)."""
    concurrency: int = 1
    """How many handlers run at once."""
    fetch_size: int | None = None
    """Most leases one fetch asks for (``None``: ``max_demand``). Below ``max_demand``
    (half of it, say) the next fetch runs while the last batch is handled and
    settled, which pays off on a backend that serves calls in parallel (PostgreSQL)."""
    lease_ms: int = 30_000
    """Lease duration; inflight leases are renewed about every ``lease_ms / 2``."""
    poll_ms: int = 200
    """Idle poll interval when the backend cannot push wake-ups (and their upper bound)."""
    consumer_id: str | None = None
    """This worker's identity; generated by :meth:`Rheo.new_consumer_id` when ``None``."""
    partitions: Partitions = "all"
    """``"all"`` or a list of partition ids to consume."""
    max_attempts: int | None = None
    """Set the group's ``max_attempts`` when starting (``None`` keeps the backend's)."""
    retry_policy: RetryPolicy | None = None
    """The delay before a failed event is redelivered (handler errors, invalid outcomes,
    :class:`Retry` without ``delay_ms``); ``None``: ``RetryPolicy()``, exponential
    backoff from 1 s to 5 min with full jitter."""

    def __init__(self, **options: Any) -> None:
        CONSUMER.check_keys(options)
        self.options: dict[str, Any] = dict(options)
        """Options given to the constructor (they override the class attributes)."""

    async def setup(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
        """Build the read-only handler context once, when the group starts.

        ``options`` holds every resolved option (``rheo`` included) and every
        application key. Return a mapping; raise :class:`~rheo_flow.SetupRefused`
        to refuse to start. The default returns an empty context.
        """
        return {}

    @abstractmethod
    async def handle_event(self, event: Event, context: Context) -> Outcome:
        """Handle one leased event and return :data:`ACK`, :class:`Retry` or :class:`Reject`.

        Raising, or returning anything else, is a handler failure: the group logs
        and counts it and nacks the lease for redelivery after the ``retry_policy``
        delay, recording ``"Type: message"`` as the delivery's last error. Return
        ``Retry`` or ``Reject`` for expected business failures instead of raising.
        """

    def start(self, rheo: Rheo, **options: Any) -> Group:
        """The :class:`~rheo_flow.Group` running this consumer on ``rheo``.

        Use it as an async context manager (``async with consumer.start(rheo):``)
        or call :meth:`Group.run`. ``options`` override the consumer's own.
        """
        return Group(rheo, self, **options)

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} stream={self._option('stream')!r} "
                f"group={self._option('group')!r}>")

    def _option(self, name: str) -> Any:
        return self.options.get(name, getattr(self, name, None))


Handler: TypeAlias = Callable[[Event, Context], Awaitable[Outcome]]
"""An async function handling one event (see :func:`consumer`)."""
Setup: TypeAlias = Callable[[Mapping[str, Any]], Awaitable[Mapping[str, Any]]]
"""An async function building the handler context (see :func:`consumer`)."""


class FunctionConsumer(Consumer):
    """A :class:`Consumer` around plain async functions (built by :func:`consumer`)."""

    def __init__(self, handler: Handler, setup: Setup | None = None, **options: Any) -> None:
        super().__init__(**options)
        self._handler = handler
        self._setup = setup
        self.name: str = getattr(handler, "__name__", "handler")
        """The decorated function's name."""

    async def setup(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
        """Run the setup function given to :func:`consumer`, if any."""
        if self._setup is None:
            return {}
        return await self._setup(options)

    async def handle_event(self, event: Event, context: Context) -> Outcome:
        """Run the decorated function."""
        return await self._handler(event, context)

    async def __call__(self, event: Event, context: Context) -> Outcome:
        """Call the decorated function directly (handy in unit tests)."""
        return await self._handler(event, context)

    def __repr__(self) -> str:
        return (f"<consumer {self.name} stream={self._option('stream')!r} "
                f"group={self._option('group')!r}>")


def consumer(*, setup: Setup | None = None, **options: Any) -> Callable[[Handler], Consumer]:
    """Turn an async ``handler(event, context) -> Outcome`` function into a :class:`Consumer`.

    ``options`` are the consumer's options and application keys (a key that looks
    like a misspelt option is refused); ``setup`` is an optional async function
    building the context::

        @consumer(stream="orders", group="billing", concurrency=8)
        async def bill(event, context):
            return ACK

        async with bill.start(rheo) as group:
            ...
    """

    CONSUMER.check_keys(options, "@consumer")

    def wrap(handler: Handler) -> Consumer:
        if not callable(handler):
            raise InvalidArgument(f"@consumer decorates an async function, got {handler!r}")
        return FunctionConsumer(handler, setup, **options)

    return wrap


class Group:
    """The runtime of one consumer group in this process.

    Build it with :meth:`Consumer.start` (or ``Group(rheo, consumer, **options)``)
    and use it as an async context manager, or call :meth:`run`::

        async with RiskConsumer().start(rheo, counter=counter) as group:
            ...                        # the group consumes in the background
            await group.drain(timeout=10)

    ``observer`` is called with a :class:`~rheo_flow.SettleOutcome` for every
    settled lease (its result carries the classified kind of a failure);
    ``backoff`` replaces the default fetch-failure schedule. Only one group per
    (Rheo instance, stream, group) may run in a process: starting a second one
    raises :class:`~rheo_flow.AlreadyStarted`.

    Leases arrive in sequence order per partition, but with ``concurrency > 1``
    handlers of one partition overlap; use ``concurrency=1`` (or the pipeline's
    ``partition_by``) when a handler needs strict per-partition order.
    """

    def __init__(
        self,
        rheo: Rheo,
        consumer: Consumer,
        *,
        observer: SettleObserver | None = None,
        backoff: Backoff | None = None,
        **options: Any,
    ) -> None:
        if not isinstance(rheo, Rheo):
            raise InvalidArgument(f"expected a Rheo instance, got {type(rheo).__name__}")
        if not isinstance(consumer, Consumer):
            raise InvalidArgument(f"expected a Consumer, got {type(consumer).__name__}")
        validate("observer", observer)
        validate("backoff", backoff)
        merged = {**consumer.options, **options}
        if "rheo" in merged:
            raise InvalidArgument("pass the Rheo instance to start() or Group(), not as an option")
        CONSUMER.check_keys(consumer.options)
        GROUP.check_keys(options)
        _check_class_options(consumer)
        values = {name: merged.pop(name, getattr(consumer, name, None)) for name in GROUP.names}
        _require(consumer, values, "stream", "group")
        chosen = GROUP.resolve(values)
        self._rheo = rheo
        self._consumer = consumer
        self._stream: str = chosen["stream"]
        self._group: str = chosen["group"]
        self._max_demand: int = chosen["max_demand"]
        self._concurrency: int = chosen["concurrency"]
        fetch_size = chosen["fetch_size"]
        self._fetch_size: int = self._max_demand if fetch_size is None else fetch_size
        self._lease_ms: int = chosen["lease_ms"]
        self._poll_ms: int = chosen["poll_ms"]
        consumer_id = chosen["consumer_id"]
        self._consumer_id: str = (rheo.new_consumer_id() if consumer_id is None
                                  else consumer_id)
        self._partitions: Literal["all"] | list[int] = chosen["partitions"]
        self._max_attempts: int | None = chosen["max_attempts"]
        retry_policy = chosen["retry_policy"]
        self._retry_policy: RetryPolicy = (RetryPolicy() if retry_policy is None
                                           else retry_policy)
        resolved = {
            **merged,
            "stream": self._stream,
            "group": self._group,
            "rheo": rheo,
            "max_demand": self._max_demand,
            "concurrency": self._concurrency,
            "fetch_size": self._fetch_size,
            "lease_ms": self._lease_ms,
            "poll_ms": self._poll_ms,
            "consumer_id": self._consumer_id,
            "partitions": self._partitions,
            "max_attempts": self._max_attempts,
            "retry_policy": self._retry_policy,
        }
        self._options: Mapping[str, Any] = MappingProxyType(resolved)
        self._observer = observer
        self._producer = Producer(
            rheo, self._stream, self._group, max_demand=self._max_demand,
            fetch_size=self._fetch_size, lease_ms=self._lease_ms, poll_ms=self._poll_ms,
            consumer_id=self._consumer_id, partitions=self._partitions,
            max_attempts=self._max_attempts, backoff=backoff,
        )
        self._producer._observer = self._observe  # one call per settle call, not per lease
        shared = self._producer._stats
        self.stats = GroupStats(fetch_failures=shared.fetch_failure_kinds,
                                renew_failures=shared.renew_failures)
        """Counters of this group."""

        self._state: _State = "new"
        self._context: Context = MappingProxyType({})
        self._ready: deque[Lease] = deque()
        """Fetched leases waiting for a worker."""
        self._current: list[Lease | None] = [None] * self._concurrency
        """The lease each worker is handling."""
        self._acks: list[Lease] = []
        self._others: list[_Finished] = []
        self._settling: _Category = "ack"
        """The category the acknowledger is settling (read by the settle observer)."""
        self._work = asyncio.Event()
        self._room = asyncio.Event()
        self._flush = asyncio.Event()
        self._done = asyncio.Event()
        self._closing = False
        self._handing_back = False
        """Set by ``drain(hand_back=True)``: leases no handler started go back."""
        self._feed_task: asyncio.Task[None] | None = None
        self._acker_task: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._stop_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._lag: _telemetry.LagTracker | None = None

    # Introspection -------------------------------------------------------------

    @property
    def stream(self) -> str:
        """The consumed stream."""
        return self._stream

    @property
    def group(self) -> str:
        """The consumer group's name."""
        return self._group

    @property
    def consumer_id(self) -> str:
        """This worker's identity (given or generated)."""
        return self._consumer_id

    @property
    def options(self) -> Mapping[str, Any]:
        """Every resolved option and application key (what :meth:`Consumer.setup` receives)."""
        return self._options

    @property
    def context(self) -> Context:
        """The read-only handler context built by :meth:`Consumer.setup`."""
        return self._context

    @property
    def running(self) -> bool:
        """Whether the group has started and is not stopping."""
        return self._state == "running"

    @property
    def inflight(self) -> int:
        """How many leases are outstanding (fetched and not yet settled)."""
        return len(self._producer.inflight)

    def __repr__(self) -> str:
        return (f"<Group {self._stream}/{self._group} consumer={self._consumer_id} "
                f"{self._state} inflight={len(self._producer.inflight)}>")

    # Lifecycle -----------------------------------------------------------------

    async def start(self) -> Self:
        """Claim the (instance, stream, group) slot, run ``setup`` and start consuming.

        Raises :class:`~rheo_flow.AlreadyStarted` when a group for the same
        identity runs in this process (or this object was started before),
        :class:`~rheo_flow.SetupRefused` when ``setup`` refuses or fails, and
        :class:`~rheo_flow.UnknownStream` / :class:`~rheo_flow.InvalidArgument`
        for a missing stream or a partition it does not have.
        """
        if self._state != "new":
            raise AlreadyStarted(f"{self!r} was already started; build a new Group to run again")
        key = self._key()
        other = _REGISTRY.get(key)
        if other is not None:
            raise AlreadyStarted(
                f"a group for stream {self._stream!r}, group {self._group!r} already runs on "
                f"this Rheo instance ({self._rheo.instance_id}) in this process: {other!r}; "
                "scale with concurrency, or stop it first"
            )
        _REGISTRY[key] = self
        self._state = "starting"
        try:
            with _telemetry.detached():  # the renewer must not inherit the caller's span
                await self._producer.start()
            try:
                self._context = await self._setup()
            except BaseException:
                await self._producer.stop()
                raise
        except BaseException:
            self._state = "stopped"
            self._release_slot()
            self._done.set()
            raise
        with _telemetry.detached():  # the tasks must not inherit the caller's span
            self._feed_task = self._spawn(self._feed(), "fetch")
            self._acker_task = self._spawn(self._acker_loop(), "ack")
            self._workers = [self._spawn(self._worker(i), f"worker-{i}")
                             for i in range(self._concurrency)]
        self._lag = _telemetry.track_lag(self._rheo, self._stream, self._group,
                                         self._partitions)
        self._state = "running"
        log.info("group %s/%s started (consumer %s, max_demand %d, concurrency %d)",
                 self._stream, self._group, self._consumer_id, self._max_demand,
                 self._concurrency)
        return self

    async def run(self) -> None:
        """Start (unless started) and consume until cancelled or stopped.

        Cancelling the task running it stops the group cleanly: handlers are
        cancelled, finished work is settled and no task is left behind. Raises
        :class:`~rheo_flow.RheoError` when an internal task of the group crashed,
        and :class:`~rheo_flow.StoreLost` when the backend lost the stream's data.
        """
        if self._state == "new":
            await self.start()
        try:
            await self._done.wait()
        finally:
            await self.stop()
        self._raise_failure()

    async def run_until_empty(self, timeout: float | None = None) -> bool:
        """Start (unless started), consume until the backlog seen at the start is
        settled, then drain and stop: for batch jobs and scripts.

        It finishes once the group's frontier reaches the high water mark read
        when it was called, on every consumed partition (every event appended
        before then is acked or dead-lettered, by this or any other consumer of
        the group); events appended later are not waited for, and those this
        group already holds are finished or handed back as by
        ``drain(hand_back=True)``. Returns True then, False when ``timeout``
        seconds pass first (the group is stopped as by :meth:`stop`). Raises as
        :meth:`run` when the group crashes.
        """
        if self._state == "new":
            await self.start()
        reached = False
        try:
            async with asyncio.timeout(timeout):
                reached = await wait_caught_up(
                    self._rheo, self._stream, self._group, self._partitions,
                    interval=min(self._poll_ms / 1000, 1.0), stopped=self._done.is_set)
                if reached and self._state == "running":
                    await self.drain(hand_back=True)
        except TimeoutError:
            reached = False
        finally:
            await self.stop()
        self._raise_failure()
        return reached

    def _raise_failure(self) -> None:
        if isinstance(self._failure, StoreLost):
            raise self._failure
        if self._failure is not None:
            raise RheoError(f"group {self._stream}/{self._group} crashed: "
                             f"{type(self._failure).__name__}: {self._failure}"
                             ) from self._failure

    async def drain(self, timeout: float | None = None, *, hand_back: bool = False) -> bool:
        """Stop fetching and wait until every inflight lease has settled.

        Renewal keeps running meanwhile. Returns True once nothing is inflight,
        False when ``timeout`` seconds pass first (the group keeps its leases and
        keeps renewing them; call :meth:`stop` to end it). The group does not
        fetch again after a drain.

        With ``hand_back=True`` only the handlers already running are waited
        for: leases no handler has started (and any a fetch under way still
        returns) are handed back at once, nacked with reason ``"shutdown"`` and
        no delay, so that another consumer takes them without waiting for their
        expiry (what a worker does on SIGTERM).
        """
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float)
            or not math.isfinite(timeout) or timeout < 0
        ):
            raise InvalidArgument(f"timeout must be None or seconds >= 0, got {timeout!r}")
        if self._state != "running":
            raise NotStarted(f"cannot drain {self!r}: it is not running")
        if hand_back:
            self._handing_back = True
            self._producer.halt()
            self._give_back(list(self._ready))
            self._ready.clear()
        # The producer stops fetching (a fetch in progress hands its leases to the
        # workers, or back) and waits until the inflight set is empty, renewing
        # meanwhile.
        return await self._producer.drain(timeout)

    def _give_back(self, leases: list[Lease]) -> None:
        """Queue unstarted leases for the acknowledger to hand back (one nack)."""
        if leases:
            self._others.extend(_Finished(lease, "shutdown", "shutdown") for lease in leases)
            self._flush.set()

    async def stop(self) -> None:
        """Stop now: cancel fetching and running handlers, settle what finished, release.

        Leases whose handler was cancelled or had not started are nacked with
        reason ``"shutdown"`` (one call) so that another consumer gets them without
        waiting for expiry. For a graceful stop call :meth:`drain` first.
        Idempotent; cancelling the caller does not interrupt the shutdown.
        """
        if self._state == "new":
            self._state = "stopped"
            self._done.set()
            return
        if self._state == "stopped" and self._stop_task is None:
            return  # start() failed: nothing runs
        if self._state == "starting":
            raise NotStarted(f"cannot stop {self!r} while it is starting")
        await asyncio.shield(self._begin_stop())

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def _key(self) -> tuple[str, str, str]:
        return (self._rheo.instance_id, self._stream, self._group)

    def _release_slot(self) -> None:
        key = self._key()
        if _REGISTRY.get(key) is self:
            del _REGISTRY[key]

    async def _setup(self) -> Context:
        name = (self._consumer.name if isinstance(self._consumer, FunctionConsumer)
                else type(self._consumer).__name__)
        try:
            context = await self._consumer.setup(self._options)
        except SetupRefused:
            raise
        except Exception as exc:
            raise SetupRefused(f"{name}.setup() failed: {_describe(exc)}") from exc
        if not isinstance(context, Mapping):
            raise SetupRefused(
                f"invalid_context: {name}.setup() must return a mapping, "
                f"got {type(context).__name__}: {_short_repr(context)}"
            )
        return MappingProxyType(dict(context))

    def _spawn(self, coro: Coroutine[Any, Any, None], role: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=f"rheo-group {self._stream}/{self._group} {role}")
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None or self._state in ("stopping", "stopped"):
            return
        log.error("group %s/%s: task %s crashed; stopping the group", self._stream,
                  self._group, task.get_name(), exc_info=exc)
        self._failure = exc
        self._begin_stop()

    def _begin_stop(self) -> asyncio.Task[None]:
        if self._stop_task is None:
            self._state = "stopping"
            self._stop_task = asyncio.ensure_future(self._shutdown())
        return self._stop_task

    async def _shutdown(self) -> None:
        producer = self._producer
        try:
            producer.halt()  # even a fetch that outlives the cancel below returns nothing more
            await _cancel_and_wait([self._feed_task])
            await _cancel_and_wait(self._workers)
            leftovers = [lease for lease in self._current if lease is not None]
            leftovers.extend(self._ready)
            self._ready.clear()
            self._current = [None] * self._concurrency
            self._closing = True
            self._flush.set()
            if self._acker_task is not None:
                await asyncio.wait([self._acker_task])
            if leftovers:
                self._settling = "shutdown"
                await producer.hand_back(leftovers, "shutdown")
        finally:
            await _cancel_and_wait([self._feed_task, self._acker_task, *self._workers])
            await producer.stop()
            if self._lag is not None:
                await self._lag.aclose()
            self._release_slot()
            self._state = "stopped"
            self._done.set()
            log.info("group %s/%s stopped (consumer %s)", self._stream, self._group,
                     self._consumer_id)

    # Feeding -------------------------------------------------------------------

    async def _feed(self) -> None:
        """Take leases from the producer in batches while workers are short of work."""
        producer = self._producer
        ready = self._ready
        room = self._room
        size = self._fetch_size
        while True:
            if len(ready) >= self._concurrency:
                room.clear()
                await room.wait()
                continue
            leases = await producer.demand(size)
            if not leases:
                return  # draining or stopped
            if self._handing_back:
                self._give_back(leases)
                return
            self.stats.fetched += len(leases)
            ready.extend(leases)
            self._work.set()

    # Handling ------------------------------------------------------------------

    async def _worker(self, slot: int) -> None:
        ready = self._ready
        work = self._work
        room = self._room
        flush = self._flush
        current = self._current
        acks = self._acks
        inflight = self._producer.inflight
        producer = self._producer
        handle_event = _handler_of(self._consumer)
        lost_ids = inflight.lost_ids
        concurrency = self._concurrency
        while True:
            if not ready:
                work.clear()
                await work.wait()
                continue
            context = self._context
            traced = _telemetry.tracer() is not None or _telemetry.instruments() is not None
            while ready:
                lease = ready.popleft()
                if len(ready) < concurrency:
                    room.set()
                if lost_ids and producer.lost(lease):
                    producer.skip(lease)
                    self.stats.skipped += 1
                    continue
                current[slot] = lease
                if traced:
                    finished = await self._handle_traced(lease)
                else:
                    token = _CURRENT_LEASE.set(lease)
                    try:
                        outcome = await handle_event(lease.event, context)
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
                current[slot] = None
                if finished is None:
                    acks.append(lease)
                else:
                    self._others.append(finished)
                flush.set()

    async def _handle_traced(self, lease: Lease) -> _Finished | None:
        """One handler call inside its telemetry ``process`` span."""
        with _telemetry.process_event(lease, self._consumer_id) as processing:
            finished = await self._handle(lease)
            if processing is not None:
                if finished is None:
                    processing.outcome("ack")
                else:
                    processing.outcome(finished.category, finished.error)
        return finished

    async def _handle(self, lease: Lease) -> _Finished | None:
        token = _CURRENT_LEASE.set(lease)
        try:
            outcome = await self._consumer.handle_event(lease.event, self._context)
        except asyncio.CancelledError as exc:
            task = asyncio.current_task()
            if task is None or task.cancelling():
                raise
            return self._handler_failed(lease, exc)
        except Exception as exc:
            return self._handler_failed(lease, exc)
        finally:
            _CURRENT_LEASE.reset(token)
        return None if outcome.__class__ is Ack else self._classify(lease, outcome)

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
        self.stats.invalid_outcomes += 1
        text = _short_repr(outcome)
        delay = self._retry_policy.delay_ms(lease.attempt)
        log.error("handler of %s/%s returned an invalid outcome for p%d s%d (attempt %d): %s "
                  "(expected ACK, Retry or Reject); nacking with a delay of %d ms",
                  self._stream, self._group, lease.partition, lease.sequence, lease.attempt,
                  text, delay, extra=failure_fields(lease, self._consumer_id))
        reason = _reason(f"invalid_outcome: {text}")
        return _Finished(lease, "invalid_outcome", reason, delay, last_error=bounded(reason))

    def _handler_failed(self, lease: Lease, exc: BaseException) -> _Finished:
        self.stats.handler_errors += 1
        delay = self._retry_policy.delay_ms(lease.attempt)
        log.error("handler of %s/%s failed on p%d s%d (attempt %d); nacking with a delay "
                  "of %d ms", self._stream, self._group, lease.partition, lease.sequence,
                  lease.attempt, delay, exc_info=exc,
                  extra=failure_fields(lease, self._consumer_id))
        return _Finished(lease, "handler_error", _reason(f"handler_error: {_describe(exc)}"),
                         delay, error=exc, last_error=error_text(exc))

    # Settling ------------------------------------------------------------------

    async def _acker_loop(self) -> None:
        flush = self._flush
        while True:
            if not self._acks and not self._others:
                if self._closing:
                    return
                flush.clear()
                await flush.wait()
                continue
            # Everything that finished since the last wake-up goes out together.
            # Workers append to these very lists: copy and empty them in place.
            acks = self._acks[:]
            self._acks.clear()
            others = self._others[:]
            self._others.clear()
            if acks:
                await self._settle_batch("ack", acks)
            if others:
                calls: dict[tuple[_Category, str, int, str | None], list[Lease]] = {}
                for item in others:
                    calls.setdefault((item.category, item.reason, item.delay_ms,
                                      item.last_error), []).append(item.lease)
                for (category, reason, delay_ms, error), leases in calls.items():
                    await self._settle_batch(category, leases, reason, delay_ms, error)

    async def _settle_batch(self, category: _Category, leases: list[Lease], reason: str = "",
                            delay_ms: int = 0, last_error: str | None = None) -> None:
        producer = self._producer
        self._settling = category
        try:
            if category == "ack":
                await producer.ack(leases)
            elif category == "reject":
                await producer.reject(leases, reason, last_error)
            elif category == "shutdown":
                await producer.hand_back(leases, reason)
            else:
                await producer.nack(leases, reason, delay_ms, last_error)
        except Exception as exc:
            # Not expected (the facade classifies backend errors); never lose the leases.
            error = classify(exc, self._rheo.backend.classify_error)
            self.stats.settle_failures[error.kind.value] += len(leases)
            producer.confirm(leases)
            log.error("settling %d leases of %s/%s failed: %s; leaving them to expire",
                      len(leases), self._stream, self._group, error.reason, exc_info=exc)

    def _observe(self, op: SettleOp, leases: Sequence[Lease],
                 results: Sequence[SettleResult]) -> None:
        """Count one settle call's results (called by the producer's settle) and pass
        them on, one :class:`~rheo_flow.SettleOutcome` per lease, to the observer."""
        stats = self.stats
        failed = [result.error for result in results if result.error is not None]
        for error in failed:
            stats.settle_failures[error.kind.value] += 1
        done = len(results) - len(failed)
        if op == "ack":
            stats.acked += done
        else:
            if op == "reject":
                stats.rejected += done
            elif self._settling == "retry":
                stats.retried += done
            else:
                stats.nacked += done
            stats.dead_lettered += dead_lettered(self._rheo, op, leases, results)
        observer = self._observer
        if observer is not None:
            for lease, result in zip(leases, results, strict=True):
                try:
                    observer(_outcome(op, lease, result))
                except Exception:
                    log.exception("settle observer of %s/%s failed", self._stream,
                                  self._group)


def _handler_of(consumer: Consumer) -> Callable[[Event, Context], Awaitable[Any]]:
    """What handles one event: a decorated function is called directly (one coroutine
    per event instead of two) unless a subclass overrides ``handle_event``."""
    if (isinstance(consumer, FunctionConsumer)
            and type(consumer).handle_event is FunctionConsumer.handle_event
            and "handle_event" not in getattr(consumer, "__dict__", {})):
        return consumer._handler
    return consumer.handle_event


def _require(consumer: Consumer, values: Mapping[str, Any], *kinds: str) -> None:
    for kind in kinds:
        if values[kind] is None:
            raise InvalidArgument(
                f"{type(consumer).__name__} has no {kind}: set the {kind!r} class attribute "
                f"or pass {kind}=..."
            )


def _check_class_options(consumer: Consumer) -> None:
    """Refuse class attributes of a Consumer subclass that look like misspelt options
    (``concurency = 8``): plain values, not methods or descriptors."""
    for cls in type(consumer).__mro__:
        if cls is Consumer or cls is FunctionConsumer or not issubclass(cls, Consumer):
            continue
        keys = [name for name, value in vars(cls).items()
                if not name.startswith("_") and not callable(value)
                and not hasattr(value, "__get__")]
        CONSUMER.check_keys(keys, f"class attribute of {cls.__name__}")


async def _cancel_and_wait(tasks: Iterable[asyncio.Task[None] | None]) -> None:
    live = [t for t in tasks if t is not None]
    for task in live:
        task.cancel()
    if live:
        await asyncio.wait(live)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _short_repr(value: object, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _reason(text: str) -> str:
    """A settle reason the facade accepts: bounded length."""
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."
