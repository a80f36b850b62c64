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
import random
import time
import uuid
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from ._event import Event, NewEvent
from ._failure import bounded, error_text
from ._lease import Lease
from ._outcome import ACK, Context, Outcome, Reject, Retry
from ._rheo import Rheo
from ._settle_results import Decision, SettleResult
from ._stream import DeadLetter
from ._urls import redact_url

__all__ = ["DemoConfig", "DemoResult", "run_demo", "run_worker"]

STREAM = "orders"
GROUPS = ("billing", "shipping")
MAX_ATTEMPTS = 3
RETRY_DELAY_MS = 150
IDLE_WAIT_S = 0.05
FAULT_WINDOW = 0.3
"""Faults are placed in the first 30% of the events so their retries overlap other work."""

Handler = Callable[[Event, Context], Awaitable[Outcome]]
"""The handler signature of :class:`~rheo_flow.Consumer` functions."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoConfig:
    """Knobs of one demo run."""

    url: str
    events: int = 5000
    partitions: int = 6
    workers: int = 3
    """Workers per group."""
    rate: float = 300.0
    """Events per second appended after the initial backlog (0: as fast as possible)."""
    backlog: float = 0.3
    """Share of the events appended up front, before the steady flow."""
    burst: float = 0.15
    """Share appended at once two thirds into the steady flow (a flash sale)."""
    batch: int = 20
    lease_ms: int = 1_000
    work_ms: float = 4.0
    """Simulated handler work per relevant event."""
    seed: int = 7
    timeout_s: float = 120.0


@dataclass(frozen=True, slots=True)
class Faults:
    """Which events misbehave, and how."""

    flaky: frozenset[str]
    """Fail once per group with a transient error, then succeed (nack and retry)."""
    poison: str
    """Billing's handler always raises on it: dead-lettered at max_attempts."""
    undeliverable: str
    """Shipping rejects it outright (a dead letter on the first attempt)."""
    stall: str
    """A shipping worker freezes on it for longer than its lease."""


@dataclass(slots=True)
class GroupStats:
    """Live counters of one consumer group."""

    name: str
    workers: int
    handled: int = 0
    """Handler invocations, redeliveries included."""
    acked: int = 0
    retried: int = 0
    dead_letters: list[DeadLetter] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    """Settle results by outcome: ``ok``, ``repeated`` or a settle kind."""
    lag: dict[int, int] = field(default_factory=dict)
    settled_ids: set[str] = field(default_factory=set)
    samples: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=64))

    @property
    def settled(self) -> int:
        """Events of this run acked or dead-lettered."""
        return self.acked + len(self.dead_letters)

    def rate(self, window_s: float = 1.0) -> float:
        """Settled events per second over the last ``window_s``."""
        if len(self.samples) < 2:
            return 0.0
        now, latest = self.samples[-1]
        for t, count in self.samples:
            if now - t <= window_s:
                return (latest - count) / (now - t) if now > t else 0.0
        return 0.0

    def record(self, results: Sequence[SettleResult]) -> None:
        """Count the outcome of one settle call."""
        for result in results:
            if result.ok:
                self.outcomes["repeated" if result.repeated else "ok"] += 1
            else:
                self.outcomes[str(result.kind)] += 1


@dataclass(slots=True)
class DemoState:
    """Everything the live view and the summary show."""

    config: DemoConfig
    run_id: str
    total: int
    faults: Faults
    groups: dict[str, GroupStats]
    appended: int = 0
    produced: bool = False
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None
    high_water: dict[int, int] = field(default_factory=dict)
    description: str = ""

    @property
    def elapsed(self) -> float:
        """Seconds since the start (frozen once finished)."""
        return (self.finished or time.monotonic()) - self.started

    done: bool = False
    """Every event appended and every group caught up."""

    def caught_up(self) -> bool:
        """Whether every group's lag, as last observed, is zero on every partition."""
        return all(sum(g.lag.values()) == 0 and len(g.lag) == self.config.partitions
                   for g in self.groups.values())


@dataclass(frozen=True, slots=True)
class DemoResult:
    """The outcome of a run; ``ok`` when every group settled every event."""

    ok: bool
    events: int
    elapsed_s: float
    missing: dict[str, int]
    """Events of this run a group neither acked nor dead-lettered."""


# The scenario ----------------------------------------------------------------

_SKUS = [("espresso-beans-1kg", 2490), ("grinder-burr", 8900), ("milk-jug", 1450),
         ("paper-filters", 390), ("kettle-gooseneck", 5990), ("scale-0.1g", 2790),
         ("tamper-58mm", 3200), ("cups-set-4", 2400)]
_METHODS = ["card", "card", "card", "paypal", "sepa"]
_CARRIERS = ["DHL", "UPS", "PostNL", "DPD"]
_COUNTRIES = ["DE", "FR", "NL", "BE", "AT", "ES", "IT", "DK"]


def generate_orders(count: int, seed: int, run_id: str) -> tuple[list[NewEvent], Faults]:
    """``count`` order events, interleaved across customers, and the faults among them."""
    rng = random.Random(seed)
    customers = [f"cust-{i:04d}" for i in range(max(8, count // 9))]
    events: list[NewEvent] = []
    # Orders in flight: id, customer, total, destination, next stage.
    open_orders: list[tuple[str, str, int, str, str]] = []
    number = 0
    while len(events) < count:
        if open_orders and (rng.random() < 0.62 or len(open_orders) > 40):
            order_id, customer, total, country, stage = open_orders.pop(
                rng.randrange(len(open_orders)))
            if stage == "paid":
                events.append(_event(run_id, order_id, customer, "paid", {
                    "order_id": order_id, "amount_cents": total,
                    "method": rng.choice(_METHODS), "ship_to": country}))
                open_orders.append((order_id, customer, total, country, "shipped"))
            else:
                events.append(_event(run_id, order_id, customer, "shipped", {
                    "order_id": order_id, "carrier": rng.choice(_CARRIERS),
                    "tracking": f"{rng.randrange(16**10):010X}"}))
            continue
        number += 1
        order_id = f"ord-{number:06d}"
        customer = rng.choice(customers)
        items = [(sku, rng.randint(1, 3), price)
                 for sku, price in rng.sample(_SKUS, rng.randint(1, 3))]
        total = sum(qty * price for _, qty, price in items)
        events.append(_event(run_id, order_id, customer, "placed", {
            "order_id": order_id, "customer": customer,
            "items": [{"sku": sku, "qty": qty, "unit_cents": price} for sku, qty, price in items],
            "total_cents": total, "currency": "EUR"}))
        open_orders.append((order_id, customer, total, rng.choice(_COUNTRIES), "paid"))

    ids = [e.id or "" for e in events]
    window = range(max(8, int(count * FAULT_WINDOW)))
    placed = [i for i in window if i < count and events[i].type == "order.placed"]
    paid = [i for i in window if i < count and events[i].type == "order.paid"]
    poison_at = placed[len(placed) // 3] if placed else 0
    # A malformed amount that the billing handler's int() cannot parse.
    events[poison_at] = _with(events[poison_at], total_cents="12,50 EUR")
    special = {ids[poison_at]}
    undeliverable_at = paid[len(paid) // 2] if paid else None
    if undeliverable_at is not None:
        events[undeliverable_at] = _with(events[undeliverable_at], ship_to="??")
        special.add(ids[undeliverable_at])
    stall = next((ids[i] for i in paid[len(paid) // 4:] if ids[i] not in special), "")
    special.add(stall)
    candidates = [i for i, e in zip(ids, events, strict=True)
                  if e.type != "order.placed" and i not in special]
    flaky = frozenset(rng.sample(candidates, min(max(2, count // 120), len(candidates))))
    faults = Faults(
        flaky=flaky,
        poison=ids[poison_at],
        undeliverable="" if undeliverable_at is None else ids[undeliverable_at],
        stall=stall,
    )
    return events, faults


def _with(event: NewEvent, **changes: object) -> NewEvent:
    return replace(event, data={**event.data, **changes})


def _event(run_id: str, order_id: str, customer: str, stage: str, data: dict[str, object]
           ) -> NewEvent:
    return NewEvent(type=f"order.{stage}", data=data, id=f"{run_id}-{order_id}-{stage}",
                    key=customer, headers={"source": "rheo-flow-demo"})


class Billing:
    """Invoices placed orders and captures payments; the payment gateway sometimes times out."""

    def __init__(self, faults: Faults, work_s: float) -> None:
        self._faults = faults
        self._work_s = work_s
        self._failed_once: set[str] = set()

    async def __call__(self, event: Event, context: Context) -> Outcome:
        if event.type == "order.placed":
            await asyncio.sleep(self._work_s)
            total = int(event.data["total_cents"])  # the poison event raises here
            return ACK if total > 0 else Reject("order with a non-positive total")
        if event.type == "order.paid":
            await asyncio.sleep(self._work_s)
            if event.id in self._faults.flaky and event.id not in self._failed_once:
                self._failed_once.add(event.id)
                return Retry("payment gateway timed out", delay_ms=RETRY_DELAY_MS)
        return ACK


class Shipping:
    """Books shipments for paid orders and notifies customers of shipped ones."""

    def __init__(self, faults: Faults, work_s: float, stall_s: float) -> None:
        self._faults = faults
        self._work_s = work_s
        self._stall_s = stall_s
        self._seen: set[str] = set()

    async def __call__(self, event: Event, context: Context) -> Outcome:
        if event.type == "order.placed":
            return ACK
        first = event.id not in self._seen
        self._seen.add(event.id)
        await asyncio.sleep(self._work_s)
        if event.id == self._faults.stall and first:
            await asyncio.sleep(self._stall_s)  # a frozen worker: its lease runs out meanwhile
        if event.type == "order.paid" and event.data.get("ship_to") not in _COUNTRIES:
            return Reject(f"no carrier delivers to {event.data.get('ship_to')!r}")
        if event.id in self._faults.flaky and first:
            return Retry("carrier API answered 503", delay_ms=RETRY_DELAY_MS)
        return ACK


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
        await rheo.create_stream(STREAM, partitions=config.partitions)
        for name in GROUPS:
            await rheo.create_group(STREAM, name, max_attempts=MAX_ATTEMPTS)
        caps = rheo.capabilities
        state.description = (
            f"{rheo.backend.name} · {'durable' if caps.durable else 'ephemeral'}"
            f" · {'distributed' if caps.distributed else 'single node'}"
        )
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
        tasks = [*workers, producer]
        try:
            await _watch(rheo, state, tasks, console, live=live, quiet=quiet,
                         progress_every_s=progress_every_s)
        finally:
            stop.set()
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await producer
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


# Presentation ----------------------------------------------------------------

_KIND_STYLE = {"ok": "green", "repeated": "green", "stale_lease": "yellow",
               "receipt_mismatch": "yellow", "backend_unavailable": "red",
               "ambiguous": "red", "failed": "red", "invalid": "red"}


def _header(state: DemoState) -> Panel:
    c = state.config
    text = Text.assemble(
        ("backend   ", "bold"), f"{redact_url(c.url)}  ({state.description})\n",
        ("stream    ", "bold"), f"{STREAM} · {c.partitions} partitions · key = customer id\n",
        ("groups    ", "bold"), f"{', '.join(GROUPS)} · {c.workers} workers each\n",
        ("settings  ", "bold"),
        f"max_attempts={MAX_ATTEMPTS} · lease_ms={c.lease_ms} · batch={c.batch}\n",
        ("faults    ", "bold"),
        f"{len(state.faults.flaky)} transient · 1 poison · 1 undeliverable · 1 stalled worker",
    )
    return Panel(text, title="[bold]rheo-flow demo[/]", title_align="left", border_style="cyan")


def _groups_table(state: DemoState, *, final: bool = False) -> Table:
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("group")
    for column in ("handled", "acked", "retried", "dead letters",
                   "avg events/s" if final else "events/s", "lag"):
        table.add_column(column, justify="right")
    for g in state.groups.values():
        rate = g.settled / state.elapsed if final and state.elapsed > 0 else g.rate()
        lag = sum(g.lag.values())
        table.add_row(g.name, f"{g.handled:,}", f"{g.acked:,}", f"{g.retried:,}",
                      f"{len(g.dead_letters):,}", f"{rate:,.0f}",
                      Text(f"{lag:,}", style="green" if lag == 0 else "yellow"))
    return table


def _lag_table(state: DemoState) -> Table:
    table = Table(title="lag per partition", title_justify="left", box=None, pad_edge=False,
                  header_style="bold", title_style="bold")
    table.add_column("")
    for p in range(state.config.partitions):
        table.add_column(f"p{p}", justify="right")
    table.add_row("high water", *(f"{state.high_water.get(p, 0):,}"
                                  for p in range(state.config.partitions)), style="dim")
    for g in state.groups.values():
        table.add_row(g.name, *(_lag_cell(g.lag.get(p, 0)) for p in range(state.config.partitions)))
    return table


def _lag_cell(lag: int) -> Text:
    style = "green" if lag == 0 else "yellow" if lag < 100 else "red"
    return Text(f"{lag:,}", style=style)


def _outcomes_table(state: DemoState) -> Table:
    kinds = ["ok", *sorted({k for g in state.groups.values() for k in g.outcomes} - {"ok"})]
    table = Table(title="settle outcomes", title_justify="left", box=None, pad_edge=False,
                  header_style="bold", title_style="bold")
    table.add_column("")
    for kind in kinds:
        table.add_column(kind, justify="right", style=_KIND_STYLE.get(kind, ""))
    for g in state.groups.values():
        table.add_row(g.name, *(f"{g.outcomes.get(k, 0):,}" for k in kinds))
    return table


def render_live(state: DemoState) -> RenderableType:
    """The refreshing view: header, append progress, groups, lag and settle outcomes."""
    progress = Table.grid(padding=(0, 1))
    progress.add_row(
        Text("appended", style="bold"),
        ProgressBar(total=state.total, completed=state.appended, width=40),
        f"{state.appended:,}/{state.total:,}",
        Text(f"{state.elapsed:5.1f} s", style="dim"),
    )
    return Group(_header(state), progress, Text(), _groups_table(state), Text(),
                 _lag_table(state), Text(), _outcomes_table(state))


def render_line(state: DemoState) -> str:
    """One plain status line (for logs and non-terminal output)."""
    parts = [f"[{state.elapsed:5.1f}s] appended {state.appended}/{state.total}"]
    for g in state.groups.values():
        parts.append(f"{g.name}: {g.settled} settled, lag {sum(g.lag.values())},"
                     f" {g.rate():.0f}/s")
    return " · ".join(parts)


def render_summary(state: DemoState, missing: dict[str, int]) -> RenderableType:
    """The closing summary: per-group totals, dead letters and the verdict."""
    title = Text.assemble(
        ("Summary  ", "bold"),
        f"{state.total:,} events · {state.config.partitions} partitions · "
        f"{state.elapsed:.1f} s",
    )
    parts: list[RenderableType] = [_header(state), title, Text(), _groups_table(state, final=True),
                                   Text(), _lag_table(state), Text(), _outcomes_table(state)]
    letters = Table(title="dead letters", title_justify="left", box=None, pad_edge=False,
                    header_style="bold", title_style="bold")
    for column in ("group", "partition", "sequence", "event", "attempts", "reason"):
        letters.add_column(column)
    for g in state.groups.values():
        for d in g.dead_letters:
            letters.add_row(g.name, str(d.partition), str(d.sequence),
                            d.event_id.removeprefix(f"{state.run_id}-"), str(d.attempts),
                            d.reason)
    if letters.row_count:
        parts += [Text(), letters]
    parts.append(Text())
    for name, count in missing.items():
        g = state.groups[name]
        if count == 0 and sum(g.lag.values()) == 0:
            parts.append(Text.assemble(
                ("✓ ", "bold green"),
                f"{name}: all {state.total:,} events settled ({g.acked:,} acked,"
                f" {len(g.dead_letters)} dead-lettered), no lag"))
        else:
            parts.append(Text.assemble(
                ("✗ ", "bold red"),
                f"{name}: {count:,} events not settled, lag {sum(g.lag.values()):,}"))
    if not state.done:
        parts.append(Text(f"stopped after the {state.config.timeout_s:.0f} s timeout",
                          style="bold red"))
    return Group(*parts)
