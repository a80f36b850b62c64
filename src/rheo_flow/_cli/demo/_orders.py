"""The demo's scenario: the orders it appends, the events that misbehave, and the handlers.

Orders are placed, paid and shipped, keyed by customer (one customer's events
stay in order in one partition). Among the first events a few are flaky (they
fail once per group), one is poison (billing always raises on it), one is
undeliverable (shipping rejects it) and one stalls a shipping worker past its lease.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, replace

from ..._model._event import Event, NewEvent
from ..._model._outcome import ACK, Context, Outcome, Reject, Retry

__all__ = ["COUNTRIES", "RETRY_DELAY_MS", "Billing", "Faults", "Shipping", "generate_orders"]

RETRY_DELAY_MS = 150
FAULT_WINDOW = 0.3
"""Faults are placed in the first 30% of the events so their retries overlap other work."""


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



_SKUS = [("espresso-beans-1kg", 2490), ("grinder-burr", 8900), ("milk-jug", 1450),
         ("paper-filters", 390), ("kettle-gooseneck", 5990), ("scale-0.1g", 2790),
         ("tamper-58mm", 3200), ("cups-set-4", 2400)]
_METHODS = ["card", "card", "card", "paypal", "sepa"]
_CARRIERS = ["DHL", "UPS", "PostNL", "DPD"]
COUNTRIES = ["DE", "FR", "NL", "BE", "AT", "ES", "IT", "DK"]


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
        open_orders.append((order_id, customer, total, rng.choice(COUNTRIES), "paid"))

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
        if event.type == "order.paid" and event.data.get("ship_to") not in COUNTRIES:
            return Reject(f"no carrier delivers to {event.data.get('ship_to')!r}")
        if event.id in self._faults.flaky and first:
            return Retry("carrier API answered 503", delay_ms=RETRY_DELAY_MS)
        return ACK
