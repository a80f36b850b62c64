"""The pipeline: a producer feeding processors, batchers and the acknowledger."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Self

from .. import _telemetry
from .._model._errors import AlreadyStarted, InvalidArgument
from .._model._lease import Lease
from .._model._typed import Upcaster, check_models
from .._rheo import DEFAULT_LEASE_MS, Partitions, Rheo
from .._runtime._backlog import run_until_empty
from .._runtime._fetch_pair import Backlog, lead_and_follow
from .._runtime._lifecycle import Lifecycle, Runtime, State
from .._runtime._options import MAX_DEMAND, PIPELINE
from .._runtime._producer import Producer
from .._runtime._retry_policy import RetryPolicy
from .._support._waiting import first_of
from ._acknowledger import ProducerAcknowledger
from ._batcher import Batcher
from ._handler import HandlerLike, callbacks_of
from ._message import OnFailure
from ._processor import Processors
from ._rate_limiter import RateLimit, RateLimiter
from ._stages import Stages
from ._topology import ProducerTopology, Topology, batcher_topology, processor_topology
from ._typed_messages import messages_of

__all__ = ["Pipeline", "PipelineStats"]

log = logging.getLogger("rheo_flow.pipeline")

DEFAULT_BATCH_GUESS = 100
"""Messages assumed per batch when sizing ``max_inflight`` for a :class:`BatchSize` batcher."""


@dataclass(frozen=True, slots=True)
class PipelineStats:
    """A snapshot of a pipeline's counters."""

    inflight: int
    """Leases fetched and not yet settled."""
    max_inflight: int
    in_processors: int
    """Messages queued for or inside processors."""
    in_batchers: int
    """Messages in open batches or in batches being handled."""
    peak_inflight: int
    peak_in_processors: int
    peak_in_batchers: int
    fetched: int
    acked: int
    nacked: int
    rejected: int
    """Rejects that took effect (``on_failure="reject"``)."""
    batches: int
    settle_failures: dict[str, int]
    dead_lettered: int = 0
    """Deliveries the pipeline's settles dead-lettered: its rejects, and its nacks of a
    last attempt (reason ``"max_attempts"``)."""
    invalid_payloads: int = 0
    """Events whose data did not validate against their type's model (rejected at once,
    before the processors)."""


class Pipeline(Runtime):
    """A Broadway-like pipeline over one consumer group, composed in code::

        pipeline = Pipeline(
            rheo, stream="orders", group="billing", handler=Billing(),
            processors=Processors(concurrency=8, partition_by="key"),
            batchers={"default": Batcher(batch_size=100, batch_timeout=1.0),
                      "s3": Batcher(batch_size=BatchSize(1_000_000, size_of=body_len))},
        )
        async with pipeline:
            ...  # runs until the block exits, then drains

    A :class:`~rheo_flow.Producer` fetches leases as the stages free demand
    (``max_inflight`` bounds every message in the pipeline, hence its memory)
    and renews them while they are processed or batched; messages flow through
    ``handler.handle_message`` in the processors, are batched per batcher and
    batch key, go through ``handler.handle_batch`` and are settled in batches:
    successes acked, failures nacked (``on_failure="retry"``, after
    ``retry_delay_ms`` or, without it, the ``retry_policy`` backoff) or rejected,
    per message (:meth:`Message.configure_ack`). Each failure records its last
    error on the delivery (what a stage raised, else the reason). Without
    batchers, processors ack successful messages themselves.

    ``max_inflight`` defaults to room for every processor's demand twice over
    plus ``concurrency + 1`` batches per batcher. ``fetch_size`` caps one fetch
    (default: all the free demand, up to ``max_inflight``), e.g. to claim the
    batches a benchmark compares at a fixed size.
    """

    def __init__(
        self,
        rheo: Rheo,
        *,
        stream: str,
        group: str,
        handler: HandlerLike,
        processors: Processors | None = None,
        batchers: Mapping[str, Batcher] | None = None,
        context: Any = None,
        rate_limit: RateLimit | RateLimiter | None = None,
        max_inflight: int | None = None,
        fetch_size: int | None = None,
        lease_ms: int = DEFAULT_LEASE_MS,
        poll_ms: int = 200,
        consumer_id: str | None = None,
        partitions: Partitions = "all",
        max_attempts: int | None = None,
        ordering: Literal["none", "key"] | None = None,
        on_failure: OnFailure = "retry",
        retry_delay_ms: int | None = None,
        retry_policy: RetryPolicy | None = None,
        shutdown_timeout: float = 30.0,
        models: Mapping[str, type] | None = None,
        upcasters: Mapping[tuple[str, int], Upcaster] | None = None,
    ) -> None:
        self._callbacks = callbacks_of(handler)
        self._models = check_models(models, upcasters)
        self._invalid_payloads = 0
        self._handler = handler
        processors = Processors() if processors is None else processors
        if not isinstance(processors, Processors):
            raise InvalidArgument(f"processors must be a Processors, got "
                                  f"{type(processors).__name__}")
        self._processors = processors
        self._batchers = _check_batchers(batchers)
        PIPELINE.resolve({"max_inflight": max_inflight, "fetch_size": fetch_size,
                          "on_failure": on_failure,
                          "retry_delay_ms": retry_delay_ms, "retry_policy": retry_policy,
                          "shutdown_timeout": shutdown_timeout})
        max_inflight = _inflight_bound(max_inflight, fetch_size, processors, self._batchers)
        self._producer = Producer(
            rheo, stream, group, max_demand=max_inflight, fetch_size=fetch_size,
            lease_ms=lease_ms, poll_ms=poll_ms,
            consumer_id=consumer_id, partitions=partitions, max_attempts=max_attempts,
            ordering=ordering,
        )
        self._acknowledger = ProducerAcknowledger(
            self._producer, on_failure=on_failure, retry_delay_ms=retry_delay_ms,
            retry_policy=retry_policy)
        self._context = context
        self._rate_limiter = _limiter(rate_limit)
        self._shutdown_timeout = float(shutdown_timeout)
        self._stages: Stages | None = None
        self._dispatcher: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._life = Lifecycle(f"pipeline {self._producer.stream}/{self._producer.group}",
                               self._shutdown)
        self._lag: _telemetry.LagTracker | None = None

    # Introspection -------------------------------------------------------------

    @property
    def producer(self) -> Producer:
        """The producer feeding the pipeline."""
        return self._producer

    @property
    def handler(self) -> HandlerLike:
        """The handler object."""
        return self._handler

    @property
    def context(self) -> Any:
        """The context passed to every callback."""
        return self._context

    @property
    def processors(self) -> Processors:
        """The processor settings."""
        return self._processors

    @property
    def batchers(self) -> dict[str, Batcher]:
        """The batcher settings by name."""
        return dict(self._batchers)

    @property
    def on_failure(self) -> OnFailure:
        """What a failed message does unless it says otherwise: ``retry`` or ``reject``."""
        return self._acknowledger.on_failure

    @property
    def retry_delay_ms(self) -> int | None:
        """The fixed delay before a retried message is redelivered, unless it says
        otherwise; ``None``: the :attr:`retry_policy` delay of its attempt."""
        return self._acknowledger.retry_delay_ms

    @property
    def retry_policy(self) -> RetryPolicy:
        """The backoff of retried messages without a fixed delay (default
        ``RetryPolicy()``: 1 s doubling to 5 min, full jitter)."""
        return self._acknowledger.retry_policy

    @property
    def state(self) -> State:
        """``new``, ``running``, ``draining`` or ``stopped``."""
        return self._life.state

    @property
    def rate_limit(self) -> RateLimit | None:
        """The current rate limit (``None``: unlimited)."""
        return None if self._rate_limiter is None else self._rate_limiter.limit

    def update_rate_limit(
        self, allowed_messages: int | None = None, interval_ms: int | None = None
    ) -> RateLimit:
        """Change the rate limit while running (or set one): it applies from the next fetch."""
        if self._rate_limiter is None:
            if allowed_messages is None:
                raise InvalidArgument("allowed_messages is needed to set a first rate limit")
            self._rate_limiter = RateLimiter(RateLimit(allowed_messages, interval_ms or 1000))
            return self._rate_limiter.limit
        return self._rate_limiter.update(allowed_messages, interval_ms)

    def topology(self) -> Topology:
        """The producer, processors and batchers with their settings."""
        producer = self._producer
        partitions = producer.partitions
        return Topology(
            producer=ProducerTopology(
                producer.stream, producer.group, producer.consumer_id, producer.max_demand,
                producer.lease_ms, producer.poll_ms,
                partitions if isinstance(partitions, str) else list(partitions),
                self.rate_limit,
            ),
            processors=[processor_topology(self._processors)],
            batchers=[batcher_topology(name, b) for name, b in self._batchers.items()],
        )

    def stats(self) -> PipelineStats:
        """A snapshot of the counters."""
        counts = self._producer.stats()
        stages = self._stages
        return PipelineStats(
            inflight=len(self._producer.inflight),
            max_inflight=self._producer.max_demand,
            in_processors=0 if stages is None else stages.in_processors,
            in_batchers=0 if stages is None else stages.in_batchers,
            peak_inflight=counts.peak_inflight,
            peak_in_processors=0 if stages is None else stages.processors.peak,
            peak_in_batchers=0 if stages is None else stages.peak_in_batchers,
            fetched=counts.fetched,
            acked=counts.acked,
            nacked=counts.nacked,
            rejected=counts.rejected,
            batches=0 if stages is None else sum(s.emitted for s in stages.batchers.values()),
            settle_failures=counts.settle_failures,
            dead_lettered=counts.dead_lettered,
            invalid_payloads=self._invalid_payloads,
        )

    # Lifecycle -------------------------------------------------------------------

    async def start(self) -> Self:
        """Start the producer, the stages and the fetch loop."""
        life = self._life
        if life.state is not State.NEW:
            raise AlreadyStarted("this pipeline was already started; build a new one")
        life.state = State.STARTING
        with _telemetry.detached():  # the tasks must not inherit the caller's span
            try:
                await self._producer.start()
            except BaseException:
                life.ended()  # the producer ended too: its start failed
                raise
            self._stages = Stages(
                self._processors, self._batchers, self._callbacks, self._context,
                self._acknowledger, inflight=self._producer.inflight,
                lease_ms=self._producer.lease_ms,
            )
            self._stages.start()
            self._acknowledger.start()
            self._dispatcher = life.tasks.spawn(self._dispatch(), "fetch")
        producer = self._producer
        self._lag = _telemetry.track_lag(producer.rheo, producer.stream, producer.group,
                                         producer.partitions, producer.inflight)
        life.state = State.RUNNING
        return self

    async def _dispatch(self) -> None:
        """Fetch and submit until stopped. An error ends it, and stops the pipeline as a
        fatal error (raised by :meth:`drain` and :meth:`run_until_empty`)."""
        if self._rate_limiter is None:
            backlog = Backlog()
            await lead_and_follow(self._fetch_loop(backlog), self._follow(backlog))
        else:
            await self._fetch_loop(None)

    async def _fetch_loop(self, backlog: Backlog | None) -> None:
        """Fetch through ``demand`` (which waits for work) and submit, until stopped."""
        producer = self._producer
        want = producer.max_demand
        while True:
            limiter = self._rate_limiter
            n = want
            if limiter is not None:
                allowed = limiter.remaining() or await self._wait_for_rate(limiter)
                if not allowed:
                    return
                n = min(want, allowed)
            leases = await producer.demand(n)
            if not leases:
                return
            if limiter is not None:
                limiter.consume(len(leases))
            if backlog is not None:
                backlog.saw(len(leases), producer.fetch_size)
            await self._submit(leases)

    async def _follow(self, backlog: Backlog) -> None:
        """A second fetch beside the loop's while fetches come back full (a backlog)."""
        producer = self._producer
        while True:
            await backlog.wait()
            leases = await producer._demand_more(producer.max_demand)
            backlog.saw(len(leases), producer.fetch_size)
            if leases:
                await self._submit(leases)

    async def _submit(self, leases: list[Lease]) -> None:
        """Hand fetched leases to the processors, as messages; reject those whose data does
        not validate against its type's model."""
        messages, invalid = messages_of(leases, self._acknowledger, self._models)
        if invalid:
            self._invalid_payloads += len(invalid)
            # A process step of their own (stage "validation"): its span and duration carry
            # error.type=invalid_payload, the reject settling them is its child.
            with _telemetry.process_messages(invalid, "validation", "models"):
                await self._acknowledger.settle((), invalid)
        if messages:
            self._started_stages().submit(messages)

    def _started_stages(self) -> Stages:
        stages = self._stages
        if stages is None:
            raise RuntimeError("a pipeline has its stages once started")
        return stages

    async def _wait_for_rate(self, limiter: RateLimiter) -> int:
        """The next window's allowance, or 0 when the pipeline stops meanwhile."""
        allowed, _ = await first_of(limiter.available(), self._stopping.wait())
        return 0 if self._stopping.is_set() or allowed.cancelled() else allowed.result()

    async def run_until_empty(self, timeout: float | None = None) -> bool:
        """Start (unless started), run until the backlog seen at the start is settled,
        then drain: for batch jobs and scripts.

        It finishes once the group's frontier reaches the high water mark read
        when it was called, on every consumed partition (every event appended
        before then is acked or dead-lettered, by this or any other consumer of
        the group); events appended later are not waited for, and what the
        pipeline already holds is finished or handed back as by
        ``drain(hand_back=True)``. Returns True then, False when ``timeout``
        seconds pass first (the pipeline is stopped as by :meth:`stop`).
        """
        return await run_until_empty(self, self._life, self._producer, timeout,
                                     stopped=self._fetching_ended)

    def _fetching_ended(self) -> bool:
        return self._life.state is not State.RUNNING or (self._dispatcher is not None
                                                         and self._dispatcher.done())

    async def drain(self, timeout: float | None = None, *, hand_back: bool = False) -> bool:
        """Stop fetching, finish the processors, flush every open batch (trigger
        ``drain``), settle everything and stop renewing, within ``timeout`` seconds
        (default ``shutdown_timeout``).

        With ``hand_back=True`` the messages no processor has started are not
        processed: they are handed back at once (nacked with reason
        ``"shutdown"`` and no delay) so that another consumer takes them without
        waiting for their expiry (what a worker does on SIGTERM); messages
        already in processors or batches are finished and settled.

        Returns True after a clean drain: nothing is left inflight. On timeout the
        stages are cancelled and what they held is handed back as by :meth:`stop`
        (False). Raises :class:`~rheo_flow.StoreLost` when fetching stopped because
        the backend lost the stream's data.
        """
        life = self._life
        if life.state is State.NEW:
            life.ended()
            return True
        if life.state is State.DRAINING:
            return not self._producer.inflight
        if life.stopping:
            await life.stop()
            life.raise_failure()
            return not self._producer.inflight
        life.state = State.DRAINING
        budget = self._shutdown_timeout if timeout is None else timeout
        clean = False
        try:
            async with asyncio.timeout(budget):
                clean = await self._finish(hand_back)
        except TimeoutError:
            log.warning("pipeline drain timed out after %.1fs with %d leases inflight: "
                        "handing them back", budget, len(self._producer.inflight))
        finally:
            await self.stop()  # hands back whatever is left; shielded from our caller
        life.raise_failure()
        return clean

    async def _finish(self, hand_back: bool) -> bool:
        """Stop fetching, finish (or hand back) what the stages hold, flush the batches,
        and wait until nothing is inflight; True then."""
        self._stopping.set()
        self._producer.halt()
        if self._dispatcher is not None:
            await asyncio.wait([self._dispatcher])
        stages = self._started_stages()
        if hand_back:
            await self._acknowledger.hand_back(stages.processors.withdraw())
        await stages.drain()
        return await self._producer.drain()

    async def stop(self) -> None:
        """Stop now: cancel the stages, hand back every lease still inflight (one nack
        with reason ``"shutdown"``, as :meth:`Group.stop <rheo_flow.Group.stop>`
        does) so that another consumer takes them without waiting for their
        expiry, and stop renewing. For a graceful stop call :meth:`drain` first.
        Idempotent; cancelling the caller does not interrupt the shutdown (the
        cancellation is raised to the caller as it goes on)."""
        self._stopping.set()
        await self._life.stop()

    async def _shutdown(self) -> None:
        """Cancel fetching and the stages, send what they acked, hand back the rest; then
        stop the producer and the lag tracking, always."""
        self._stopping.set()
        try:
            await self._life.tasks.cancel([self._dispatcher])
            if self._stages is not None:
                await self._stages.cancel()
            await self._acknowledger.close()  # what the stages acked is acked, not handed back
            if self._producer.inflight:
                try:
                    await self._producer.hand_back_inflight()
                except Exception:
                    log.exception("handing back %d leases failed; leaving them to expire",
                                  len(self._producer.inflight))
        finally:
            try:
                await self._producer.stop()
            finally:
                lag, self._lag = self._lag, None
                if lag is not None:
                    await lag.aclose()



def _inflight_bound(max_inflight: int | None, fetch_size: int | None, processors: Processors,
                    batchers: Mapping[str, Batcher]) -> int:
    """``max_inflight`` as given (warning when a batch cannot fill), else the default
    the stages need; checked against ``fetch_size``."""
    if max_inflight is None:
        max_inflight = default_max_inflight(processors, batchers)
        if max_inflight > MAX_DEMAND:
            raise InvalidArgument(
                f"the default max_inflight ({max_inflight}: room for the processors' "
                f"demand twice over and concurrency + 1 batches per batcher) is above "
                f"{MAX_DEMAND:,}: pass max_inflight")
    else:
        _warn_if_batches_cannot_fill(max_inflight, batchers)
    if fetch_size is not None and fetch_size > max_inflight:
        raise InvalidArgument(f"fetch_size ({fetch_size}) cannot exceed max_inflight "
                              f"({max_inflight}, computed from the stages): never more "
                              "than max_inflight leases are held")
    return max_inflight


def default_max_inflight(processors: Processors, batchers: Mapping[str, Batcher]) -> int:
    """Room for every processor's demand twice over plus ``concurrency + 1`` batches per
    batcher (so batch processors stay busy while the next batch fills)."""
    total = processors.concurrency * processors.max_demand * 2
    for b in batchers.values():
        per_batch = b.max_messages or DEFAULT_BATCH_GUESS
        total += per_batch * (b.concurrency + 1)
    return total


def _warn_if_batches_cannot_fill(max_inflight: object, batchers: Mapping[str, Batcher]) -> None:
    for name, b in batchers.items():
        size = b.max_messages
        if isinstance(max_inflight, int) and size is not None and size > max_inflight:
            log.warning("batcher %s: batch_size %d exceeds max_inflight %d, so its batches "
                        "are only emitted by batch_timeout", name, size, max_inflight)


def _check_batchers(batchers: Mapping[str, Batcher] | None) -> dict[str, Batcher]:
    if batchers is None:
        return {}
    if not isinstance(batchers, Mapping):
        raise InvalidArgument(f"batchers must be a mapping of name to Batcher, got "
                              f"{type(batchers).__name__}")
    out: dict[str, Batcher] = {}
    for name, config in batchers.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgument(f"batcher names must be non-empty strings, got {name!r}")
        if not isinstance(config, Batcher):
            raise InvalidArgument(f"batcher {name!r} must be a Batcher, got "
                                  f"{type(config).__name__}")
        out[name] = config
    return out


def _limiter(rate_limit: RateLimit | RateLimiter | None) -> RateLimiter | None:
    if rate_limit is None or isinstance(rate_limit, RateLimiter):
        return rate_limit
    if isinstance(rate_limit, RateLimit):
        return RateLimiter(rate_limit)
    raise InvalidArgument(f"rate_limit must be a RateLimit, got {type(rate_limit).__name__}")
