"""The ``rheo-flow demo``: an order pipeline on one backend, watched live.

A producer appends orders (placed, paid, shipped; keyed by customer, so one
customer's events stay ordered in one partition) while two consumer groups,
``billing`` and ``shipping``, each run several workers over the public
fetch / ack / nack / reject API. Faults are injected on purpose: a few
transient failures are retried, one poison event is dead-lettered at
``max_attempts``, one event is rejected outright, and one worker stalls past
its lease so that fencing turns its late acks into ``stale_lease``.

The worker loop is the small function :func:`run_worker`; everything else is
the scenario (orders, handlers, faults) and its presentation.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable

from rich.console import Console
from rich.live import Live

from ..._model._event import Event, NewEvent
from ..._model._failure import bounded, error_text
from ..._model._lease import Lease
from ..._model._outcome import Context, Outcome, Reject, Retry
from ..._model._settle_results import Decision
from ..._model._stream import DeadLetter
from ..._rheo import Rheo
from ..._support._waiting import cancel_and_wait
from ._orders import RETRY_DELAY_MS, Billing, Shipping, generate_orders
from ._state import GROUPS, MAX_ATTEMPTS, STREAM, DemoConfig, DemoResult, DemoState, GroupStats
from ._view import render_line, render_live, render_summary

__all__ = ["DemoConfig", "DemoResult", "run_demo", "run_worker"]

IDLE_WAIT_S = 0.05

Handler = Callable[[Event, Context], Awaitable[Outcome]]
"""The handler signature of :class:`~rheo_flow.Consumer` functions."""


# The worker loop ---------------------------------------------------------------


async def run_worker(
    rheo: Rheo,
    group: str,
    handler: Handler,
    stats: GroupStats,
    stop: asyncio.Event,
    *,
    batch: int,
    lease_ms: int,
) -> None:
    """One worker of ``group``: fetch a batch, run the handler on each event, settle.

    Acks, retries (nack) and rejects are each settled in one batched call. A
    settle that fails with the ``nack`` decision is nacked; ``drop`` and
    ``expire`` are left to the backend, which redelivers (docs/concepts.md).
    """
    consumer_id = rheo.new_consumer_id()
    while not stop.is_set():
        leases = await rheo.fetch(STREAM, group, consumer_id=consumer_id, limit=batch,
                                  lease_ms=lease_ms)
        if not leases:
            await rheo.wait_for_append(STREAM, IDLE_WAIT_S)
            continue
        acks: list[Lease] = []
        retries: dict[tuple[str, int, str | None], list[Lease]] = {}
        rejects: dict[str, list[Lease]] = {}
        for lease in leases:
            error: str | None = None
            try:
                outcome = await handler(lease.event, {})
            except Exception as exc:  # a handler bug: retry, as the runtime does
                error = error_text(exc)  # what the dead letter will show
                outcome = Retry(f"handler_error: {error}", RETRY_DELAY_MS)
            stats.handled += 1
            if isinstance(outcome, Retry):
                delay = RETRY_DELAY_MS if outcome.delay_ms is None else outcome.delay_ms
                retries.setdefault((outcome.reason, delay, error or bounded(outcome.reason)),
                                   []).append(lease)
            elif isinstance(outcome, Reject):
                rejects.setdefault(outcome.reason, []).append(lease)
            else:
                acks.append(lease)
        results = await rheo.ack(acks)
        stats.record(results)
        stats.acked += sum(1 for r in results if r.ok and not r.repeated)
        stats.settled_ids.update(lease.event.id for lease, r in zip(acks, results, strict=True)
                                 if r.ok)
        renack = [lease for lease, r in zip(acks, results, strict=True)
                  if r.decision is Decision.NACK]
        if renack:
            retries.setdefault(("settle_failed", 0, None), []).extend(renack)
        for (reason, delay_ms, last_error), items in retries.items():
            results = await rheo.nack(items, reason, delay_ms=delay_ms, error=last_error)
            stats.record(results)
            stats.retried += sum(1 for lease, r in zip(items, results, strict=True)
                                 if r.ok and lease.attempt < MAX_ATTEMPTS)
        for reason, items in rejects.items():
            stats.record(await rheo.reject(items, reason))


# Running it ------------------------------------------------------------------


async def _produce(rheo: Rheo, events: list[NewEvent], state: DemoState) -> None:
    config = state.config
    loop = asyncio.get_running_loop()
    backlog = int(len(events) * config.backlog)
    position = 0
    while position < backlog:
        chunk = events[position:min(backlog, position + 500)]
        await rheo.append(STREAM, chunk)
        position += len(chunk)
        state.appended = position
    burst_at = backlog + int((len(events) - backlog) * 2 / 3)
    burst = int(len(events) * config.burst)
    started = loop.time()
    while position < len(events):
        if config.rate <= 0:
            due = position + 500
        else:
            due = backlog + int((loop.time() - started) * config.rate)
            if due >= burst_at:
                due += burst
        chunk = events[position:min(len(events), due)]
        if chunk:
            await rheo.append(STREAM, chunk)
            position += len(chunk)
            state.appended = position
        if config.rate > 0:
            await asyncio.sleep(0.05)  # pacing the arrival of orders, not synchronisation
    state.produced = True


async def _observe(rheo: Rheo, state: DemoState) -> None:
    high = await rheo.high_water(STREAM)
    state.high_water = high
    now = time.monotonic()
    for stats in state.groups.values():
        frontier = await rheo.frontier(STREAM, stats.name)
        stats.lag = {p: max(0, high[p] - frontier.get(p, 0)) for p in high}
        letters: list[DeadLetter] = []
        after: DeadLetter | None = None
        while True:
            page = await rheo.dead_letters(STREAM, stats.name, limit=500, after=after)
            letters.extend(d for d in page if d.event_id.startswith(state.run_id))
            if len(page) < 500:
                break
            after = page[-1]
        stats.dead_letters = letters
        stats.samples.append((now, stats.settled))


async def run_demo(
    config: DemoConfig,
    console: Console,
    *,
    live: bool = True,
    progress_every_s: float = 2.0,
    quiet: bool = False,
) -> DemoResult:
    """Run the demo against ``config.url`` and print its summary on ``console``.

    ``live`` renders a refreshing view (for a terminal); otherwise a status line
    is printed every ``progress_every_s`` seconds unless ``quiet``.
    """
    run_id = uuid.uuid4().hex[:6]
    events, faults = generate_orders(config.events, config.seed, run_id)
    state = DemoState(
        config=config, run_id=run_id, total=len(events), faults=faults,
        groups={name: GroupStats(name, config.workers) for name in GROUPS},
    )
    async with Rheo(config.url) as rheo:
        await _prepare(rheo, state)
        work_s = config.work_ms / 1000
        handlers: dict[str, Handler] = {
            "billing": Billing(faults, work_s),
            "shipping": Shipping(faults, work_s, stall_s=config.lease_ms * 1.5 / 1000),
        }
        stop = asyncio.Event()
        state.started = time.monotonic()
        workers = [
            asyncio.create_task(run_worker(rheo, name, handlers[name], state.groups[name], stop,
                                           batch=config.batch, lease_ms=config.lease_ms))
            for name in GROUPS for _ in range(config.workers)
        ]
        producer = asyncio.create_task(_produce(rheo, events, state))
        try:
            await _watch(rheo, state, [*workers, producer], console, live=live, quiet=quiet,
                         progress_every_s=progress_every_s)
        finally:
            stop.set()
            await cancel_and_wait([producer])
            for outcome in await asyncio.gather(*workers, return_exceptions=True):
                if isinstance(outcome, Exception):
                    raise outcome
        await _observe(rheo, state)
    state.finished = state.finished or time.monotonic()
    all_ids = {e.id for e in events}
    missing = {
        name: len(all_ids - g.settled_ids - {d.event_id for d in g.dead_letters})
        for name, g in state.groups.items()
    }
    console.print(render_summary(state, missing))
    ok = state.done and not any(missing.values())
    return DemoResult(ok=ok, events=len(events), elapsed_s=state.elapsed, missing=missing)


async def _prepare(rheo: Rheo, state: DemoState) -> None:
    """Create the stream and the groups; describe the backend for the header."""
    await rheo.create_stream(STREAM, partitions=state.config.partitions)
    for name in GROUPS:
        await rheo.create_group(STREAM, name, max_attempts=MAX_ATTEMPTS)
    caps = rheo.capabilities
    state.description = (
        f"{rheo.backend.name} · {'durable' if caps.durable else 'ephemeral'}"
        f" · {'distributed' if caps.distributed else 'single node'}"
    )


async def _watch(
    rheo: Rheo,
    state: DemoState,
    tasks: list[asyncio.Task[None]],
    console: Console,
    *,
    live: bool,
    quiet: bool,
    progress_every_s: float,
) -> None:
    deadline = time.monotonic() + state.config.timeout_s
    last_line = time.monotonic()
    # Transient: the summary that follows shows the final state in full.
    view = Live(render_live(state), console=console, refresh_per_second=8,
                transient=True) if live else None
    with view if view is not None else contextlib.nullcontext():
        while True:
            for task in tasks:
                if task.done() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]
            # Read before observing: lag seen as zero counts only if everything was appended.
            produced = state.produced
            await _observe(rheo, state)
            state.done = produced and state.caught_up()
            if state.done or time.monotonic() > deadline:
                state.finished = time.monotonic()
                if view is not None:
                    view.update(render_live(state), refresh=True)
                return
            if view is not None:
                view.update(render_live(state))
            elif not quiet and time.monotonic() - last_line >= progress_every_s:
                last_line = time.monotonic()
                console.print(render_line(state), highlight=False, soft_wrap=True)
            await asyncio.sleep(0.2)  # the refresh cadence of the view
