"""A reference model of one consumer group, for the stateful conformance test.

The model follows the contract, not an implementation. Where the contract
leaves a backend free (whether an expired lease past ``max_attempts`` has
already been dead-lettered, whether a delivery whose delay ends during a call
was eligible), the model accepts either outcome and learns from what the
backend answered. Times are backend epoch milliseconds; a call is bracketed by
the times read just before and just after it.

``reset`` and ``trim`` settle deliveries without a lease: a reset counts the
events up to its position as settled (state ``skipped``: no dead letter, never
delivered until a replay) and forgets every delivery of the partition; a trim
removes events, so the model drops their deliveries and moves the partition's
low water past them. Either way the old leases become stale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .._backend import MAX_ATTEMPTS_REASON
from .._model._event import Event
from .._model._lease import Lease
from .._model._settle_results import SettleResult
from .._model._stream import DeadLetter, StartPosition
from ._case import ConformanceFailure, check, check_equal

__all__ = ["GroupModel", "Outcome", "outcome_of"]

Position = tuple[int, int]
State = Literal["available", "leased", "acked", "rejected", "skipped"]
"""``skipped``: settled by a reset (counted as settled, no dead letter, no lease)."""
Op = Literal["ack", "nack", "reject", "renew"]
Outcome = Literal["ok", "repeated", "stale_lease", "receipt_mismatch", "invalid", "other"]

_IMMEDIATE = -(2**62)
"""``ready`` time of a delivery that is eligible at once."""

_SETTLED: frozenset[State] = frozenset({"acked", "rejected", "skipped"})
"""States that count as settled for the frontier."""


def outcome_of(result: SettleResult) -> Outcome:
    """The model's name for a settle result."""
    if result.ok:
        return "repeated" if result.repeated else "ok"
    kind = result.kind.value if result.kind is not None else "other"
    if kind in ("stale_lease", "receipt_mismatch", "invalid"):
        return kind  # type: ignore[return-value]
    return "other"


@dataclass(slots=True)
class _Delivery:
    event: Event
    state: State = "available"
    attempt: int = 0
    lease_id: str | None = None
    """The newest lease of this delivery (current while leased)."""
    deadline_ms: int = 0
    ready_lo: int = _IMMEDIATE
    ready_hi: int = _IMMEDIATE
    """A nacked delivery may be eligible from ``ready_lo`` and surely is after ``ready_hi``."""
    settled_by: Op | None = None
    reason: str = ""
    last_error: str | None = None
    """The error of the last nack or reject that gave one (``settle.last_error``)."""
    not_before: int = _IMMEDIATE
    """A scheduled event's ``deliver_at`` (``delay.not_before``): never leased before it,
    a replay or reset included (``delay.replay``)."""
    rejected_lo: int = 0
    rejected_hi: int = 0
    """A dead letter's ``rejected_at_ms`` lies in ``rejected_lo..rejected_hi`` (one value
    once a listing reported it: it never changes after that)."""


class GroupModel:
    """What one group of one stream must look like after each operation."""

    def __init__(self, stream: str, group: str, partitions: int, max_attempts: int,
                 margin_ms: int, *, ordered: bool = False) -> None:
        self.stream = stream
        self.group = group
        self.partitions = partitions
        self.max_attempts = max_attempts
        self.margin = margin_ms
        self.ordered = ordered
        """The group is key-ordered: a delivery waits for every earlier one of its key."""
        self.deliveries: dict[Position, _Delivery] = {}
        self.events_by_id: dict[str, Event] = {}
        """Retained events by id (an id whose event was trimmed may be appended anew)."""
        self.high_water = [0] * partitions
        self.low_water = [1] * partitions
        """Lowest retained sequence per partition; deliveries below it were trimmed."""
        self.paused = False
        """The group is paused (``pause.fetch``): its fetches return nothing."""

    # Appends ---------------------------------------------------------------

    def appended(self, new_id: str, event: Event, deliver_at_ms: int | None = None) -> None:
        """Record what an append returned for an event with id ``new_id`` (scheduled for
        ``deliver_at_ms``: ``delay.sequence``, a retry keeps the stored time)."""
        known = self.events_by_id.get(new_id)
        if known is not None:
            check_equal(event, known, f"re-appending id {new_id!r} returns the stored event")
            return
        check_equal(event.id, new_id, "stored event id")
        expected = self.high_water[event.partition] + 1
        check_equal(event.sequence, expected, f"next sequence of partition {event.partition}")
        self.high_water[event.partition] = expected
        self.events_by_id[new_id] = event
        d = self.deliveries[(event.partition, event.sequence)] = _Delivery(event)
        if deliver_at_ms is not None:
            d.not_before = d.ready_lo = d.ready_hi = deliver_at_ms

    # Eligibility -----------------------------------------------------------

    def _may_be_expired(self, d: _Delivery, t1: int) -> bool:
        return d.state == "leased" and d.deadline_ms <= t1 + self.margin

    def doomed(self, d: _Delivery, t1: int) -> bool:
        """Expired (maybe) at the last attempt: the backend may have dead-lettered it."""
        return self._may_be_expired(d, t1) and d.attempt >= self.max_attempts

    def may_be_eligible(self, d: _Delivery, t1: int) -> bool:
        """Could a fetch ending at ``t1`` lease it?"""
        if d.state == "available":
            return d.ready_lo <= t1 + self.margin
        return self._may_be_expired(d, t1) and d.attempt < self.max_attempts

    def surely_eligible(self, d: _Delivery, t0: int) -> bool:
        """Must a fetch starting at ``t0`` consider it?"""
        if d.state == "available":
            return d.ready_hi == _IMMEDIATE or d.ready_hi < t0 - self.margin
        return (d.state == "leased" and d.deadline_ms < t0 - self.margin
                and d.attempt < self.max_attempts)

    def heads(self, t1: int, *, maybe: bool) -> dict[tuple[int, str], int]:
        """Per (partition, key) of a key-ordered group, the earliest delivery that is not
        settled: only it may be leased. ``maybe``: one that may have been dead-lettered
        by now (:meth:`doomed`) counts as settled (the fetch may release its key)."""
        heads: dict[tuple[int, str], int] = {}
        for (p, s), d in sorted(self.deliveries.items()):
            key = d.event.key
            if key is None or (p, key) in heads or d.state in _SETTLED:
                continue
            if maybe and self.doomed(d, t1):
                continue
            heads[(p, key)] = s
        return heads

    @staticmethod
    def _heads_it(heads: dict[tuple[int, str], int] | None, d: _Delivery) -> bool:
        """Whether ``d`` is not held back by an earlier delivery of its key."""
        key = d.event.key
        return heads is None or key is None or heads.get(
            (d.event.partition, key), d.event.sequence) == d.event.sequence

    def trimmed(self, position: Position) -> bool:
        """Was the event at ``position`` appended and then trimmed?"""
        p, s = position
        return 0 <= p < self.partitions and 0 < s < self.low_water[p]

    def delivery(self, position: Position, context: str = "") -> _Delivery:
        """The model of one delivery; ``context`` prefixes the failure when there is none."""
        try:
            return self.deliveries[position]
        except KeyError:
            what = "was trimmed" if self.trimmed(position) else "was never appended"
            prefix = f"{context} " if context else ""
            raise ConformanceFailure(f"{prefix}{position}, which {what}") from None

    # Fetch -----------------------------------------------------------------

    def check_fetch(
        self, leases: list[Lease], *, limit: int, partitions: list[int] | None,
        consumer_id: str, lease_ms: int, t0: int, t1: int,
    ) -> None:
        """Check one fetch's leases against the model, then record them."""
        if self.paused:
            check_equal(len(leases), 0, "leases fetched from a paused group")
            return
        selected = set(range(self.partitions) if partitions is None else partitions)
        maybe = self.heads(t1, maybe=True) if self.ordered else None
        surely_heads = self.heads(t0, maybe=False) if self.ordered else None
        check(len(leases) <= limit, f"fetch(limit={limit}) returned {len(leases)} leases")
        seen: set[Position] = set()
        last: dict[int, int] = {}
        for lease in leases:
            pos = (lease.partition, lease.sequence)
            check(pos not in seen, f"fetch returned {pos} twice")
            seen.add(pos)
            check(lease.partition in selected, f"fetch returned {pos} outside {sorted(selected)}")
            check(last.get(lease.partition, 0) < lease.sequence,
                  f"fetch returned partition {lease.partition} out of sequence order")
            last[lease.partition] = lease.sequence
            d = self.delivery(pos, "fetch leased")
            check(self.may_be_eligible(d, t1),
                  f"fetch leased {pos} which is {d.state} (attempt {d.attempt}, "
                  f"deadline {d.deadline_ms}, ready {d.ready_lo}, now {t0}..{t1})")
            check(self._heads_it(maybe, d),
                  f"fetch leased {pos} of key {d.event.key!r} although an earlier delivery "
                  f"of the key is unsettled (ordering='key')")
            check_equal(lease.attempt, d.attempt + 1, f"attempt of {pos}")
            check_equal(lease.event.id, d.event.id, f"event id of {pos}")
            check_equal(lease.event, d.event, f"event of {pos}")
            check_equal((lease.group, lease.consumer_id), (self.group, consumer_id),
                        "lease group and consumer")
            check(t0 + lease_ms - self.margin <= lease.deadline_ms <= t1 + lease_ms + self.margin,
                  f"deadline of {pos} is not now + lease_ms")
        surely = [p for p, d in self.deliveries.items()
                  if p[0] in selected and self.surely_eligible(d, t0)
                  and self._heads_it(surely_heads, d)]
        check(leases or not surely, f"fetch returned nothing although {surely[:5]} are eligible")
        for lease in leases:
            d = self.deliveries[(lease.partition, lease.sequence)]
            d.state = "leased"
            d.attempt = lease.attempt
            d.lease_id = lease.lease_id
            d.deadline_ms = lease.deadline_ms
            d.settled_by = None
            d.ready_lo = d.ready_hi = _IMMEDIATE

    # Settle ----------------------------------------------------------------

    def expect(self, lease: Lease, op: Op, t1: int) -> set[Outcome]:
        """The outcomes the contract allows for ``op`` with ``lease`` now."""
        position = (lease.partition, lease.sequence)
        if self.trimmed(position):
            return {"stale_lease"}
        d = self.delivery(position)
        if d.lease_id != lease.lease_id:
            return {"stale_lease"}
        if d.state == "leased":
            return {"ok", "stale_lease"} if self.doomed(d, t1) else {"ok"}
        if op != "renew" and d.settled_by == op:
            return {"repeated"}
        return {"stale_lease"}

    def apply(self, lease: Lease, op: Op, result: SettleResult, *, reason: str, delay_ms: int,
              lease_ms: int, t0: int, t1: int, error: str | None = None) -> None:
        """Record a settle or renew result (already checked against :meth:`expect`).

        ``error`` is the error the backend was given with a nack or reject: one that
        takes effect records it as the last error, replacing an earlier one; ``None``
        keeps the earlier one (``settle.last_error``).
        """
        d = self.deliveries.get((lease.partition, lease.sequence))
        if d is None:  # trimmed: the lease was stale
            return
        outcome = outcome_of(result)
        if outcome == "stale_lease" and d.state == "leased" and d.lease_id == lease.lease_id:
            # A doomed delivery: the backend dead-lettered it when its lease expired.
            self._reject(d, MAX_ATTEMPTS_REASON, None, d.deadline_ms, t1)
            return
        if outcome != "ok":
            return
        if op in ("nack", "reject") and error is not None:
            d.last_error = error
        if op == "ack":
            d.state, d.settled_by = "acked", "ack"
        elif op == "reject":
            self._reject(d, reason, "reject", t0, t1)
        elif op == "nack":
            if d.attempt >= self.max_attempts:
                self._reject(d, MAX_ATTEMPTS_REASON, "nack", t0, t1)
            else:
                d.state, d.settled_by, d.reason = "available", "nack", reason
                d.ready_lo = _IMMEDIATE if delay_ms == 0 else t0 + delay_ms
                d.ready_hi = _IMMEDIATE if delay_ms == 0 else t1 + delay_ms
        else:
            deadline = result.deadline_ms
            if deadline is None:
                raise ConformanceFailure("a successful renew reports the new deadline")
            check(t0 + lease_ms - self.margin <= deadline <= t1 + lease_ms + self.margin,
                  f"renewed deadline {deadline} is not now + {lease_ms}")
            d.deadline_ms = deadline

    def _reject(self, d: _Delivery, reason: str, by: Op | None, lo: int, hi: int) -> None:
        """Dead-letter ``d``, at a time between ``lo`` and ``hi`` (``dead_letters.rejected_at``):
        the call's own time for a reject or a nack, from the lease's deadline to the
        call that reported it for an expiry at max attempts."""
        d.state, d.reason, d.settled_by = "rejected", reason, by
        d.rejected_lo, d.rejected_hi = lo - self.margin, hi + self.margin

    # Re-drives -------------------------------------------------------------

    def _restart(self, d: _Delivery) -> None:
        d.state, d.attempt, d.lease_id, d.settled_by, d.reason = "available", 0, None, None, ""
        d.ready_lo = d.ready_hi = d.not_before
        d.last_error = None

    def replayed(self, partition: int, from_sequence: int) -> None:
        """Every delivery of ``partition`` from ``from_sequence`` on starts over."""
        for (p, s), d in self.deliveries.items():
            if p == partition and s >= from_sequence:
                self._restart(d)

    def redriven(self, positions: list[Position]) -> None:
        """Re-driven dead letters start over."""
        for pos in positions:
            d = self.delivery(pos)
            check_equal(d.state, "rejected", f"state of redriven {pos}")
            self._restart(d)

    def position_at(self, partition: int, at_ms: int) -> int:
        """The first retained sequence of ``partition`` appended at or after ``at_ms``, or
        the next to come (rule ``position.time``)."""
        for s in range(self.low_water[partition], self.high_water[partition] + 1):
            if self.deliveries[(partition, s)].event.appended_at_ms >= at_ms:
                return s
        return self.high_water[partition] + 1

    def reset_position(self, partition: int, to: StartPosition) -> int:
        """Where ``reset(to=...)`` moves ``partition``: the last sequence counted as settled.

        ``"earliest"`` is 0, ``"latest"`` the high water; the position is capped at
        the high water and is at least the low water - 1 (trimmed events stay settled).
        """
        high = self.high_water[partition]
        position = 0 if to == "earliest" else high if to == "latest" else int(to)
        return max(self.low_water[partition] - 1, min(position, high))

    def reset(self, partition: int, to: StartPosition) -> None:
        """``reset`` forgets every delivery of ``partition`` (dead letters included).

        Events up to the position count as settled; later ones are to deliver again
        with attempt 1; every lease on the partition becomes stale.
        """
        position = self.reset_position(partition, to)
        for s in range(self.low_water[partition], self.high_water[partition] + 1):
            d = self.deliveries[(partition, s)]
            self._restart(d)
            if s <= position:
                d.state = "skipped"

    def recreated(self, start: StartPosition, *, ordered: bool) -> None:
        """The group was deleted and created again at ``start``: it starts fresh
        (``delete.group``, ``group.start``): no delivery, lease or dead letter of the
        old group is left, what lies after ``start`` is delivered with attempt 1, and
        it is not paused."""
        self.ordered = ordered
        self.paused = False
        for p in range(self.partitions):
            self.reset(p, start)

    # Trims -----------------------------------------------------------------

    def check_trim(self, requested: dict[int, int], removed: dict[int, int], *, force: bool,
                   t1: int) -> None:
        """Check what ``trim`` removed per partition, then drop the removed events.

        ``requested`` is the bound the call asked for per partition. A forced trim
        removes every retained event up to it (capped at the high water). Without
        ``force`` the facade caps the bound at the group's frontier, which the model
        knows within :meth:`frontier_bounds`. Retained events are contiguous, so the
        count removed tells where the trim stopped.
        """
        check(set(requested) <= set(removed) <= set(range(self.partitions)),
              f"trim of partitions {sorted(requested)} reported {sorted(removed)}")
        frontier = self.frontier_bounds(t1)
        for p in range(self.partitions):
            if p not in requested:
                check_equal(removed.get(p, 0), 0, f"trim removed from partition {p}, not asked")
                continue
            floor = self.low_water[p] - 1
            want = min(requested[p], self.high_water[p])
            if force:
                low = high = max(floor, want)
            else:
                low = max(floor, min(want, frontier[p][0]))
                high = max(floor, min(want, frontier[p][1]))
            got = removed[p]
            check(low - floor <= got <= high - floor,
                  f"trim of partition {p} up to {requested[p]} (force={force}) removed {got}, "
                  f"expected {low - floor if low == high else f'{low - floor}..{high - floor}'}")
            self._remove(p, floor + got)

    def bound_below_settled(self, partition: int) -> int | None:
        """A trim bound that leaves the frontier to walk on: just below the first settled
        delivery past an unsettled one (``None``: there is no such delivery)."""
        hole = False
        for s in range(self.low_water[partition], self.high_water[partition] + 1):
            settled = self.deliveries[(partition, s)].state in _SETTLED
            if hole and settled:
                return s - 1
            hole = hole or not settled
        return None

    def _remove(self, partition: int, bound: int) -> None:
        """Events of ``partition`` up to ``bound`` are gone: deliveries, leases, ids."""
        for s in range(self.low_water[partition], bound + 1):
            d = self.deliveries.pop((partition, s))
            if self.events_by_id.get(d.event.id) == d.event:
                del self.events_by_id[d.event.id]
        self.low_water[partition] = max(self.low_water[partition], bound + 1)

    # Observations ----------------------------------------------------------

    def check_dead_letters(self, dead: list[DeadLetter], t1: int) -> None:
        """Compare a full dead-letter listing ending at ``t1`` with the model.

        Each dead letter names its stream, group and event id, and carries the
        model's attempts, reason and last error, and a ``rejected_at_ms`` within the
        model's bounds (then pinned: a later listing must report the same time).
        """
        listed = {(d.partition, d.sequence): d for d in dead}
        for pos, d in self.deliveries.items():
            if d.state == "rejected":
                check(pos in listed, f"rejected {pos} is missing from dead_letters")
        for pos, letter in listed.items():
            d = self.delivery(pos, "dead_letters lists")
            if d.state != "rejected":
                check(self.doomed(d, t1), f"dead_letters lists {pos} which is {d.state}")
                self._reject(d, MAX_ATTEMPTS_REASON, None, d.deadline_ms, t1)
            self._check_letter(pos, d, letter)

    def _check_letter(self, pos: Position, d: _Delivery, letter: DeadLetter) -> None:
        check_equal((letter.stream, letter.group), (self.stream, self.group),
                    f"stream and group of dead letter {pos}")
        check_equal(letter.event_id, d.event.id, f"event id of dead letter {pos}")
        check_equal((letter.attempts, letter.reason), (d.attempt, d.reason), f"dead letter {pos}")
        check_equal(letter.last_error, d.last_error, f"last_error of dead letter {pos}")
        at, lo, hi = letter.rejected_at_ms, d.rejected_lo, d.rejected_hi
        check(lo <= at <= hi, f"rejected_at_ms of dead letter {pos} is {at}, expected "
              f"{lo if lo == hi else f'{lo}..{hi}'}")
        d.rejected_lo = d.rejected_hi = at

    def frontier_bounds(self, t1: int) -> list[tuple[int, int]]:
        """Per partition, the lowest and highest frontier the contract allows now.

        Trimmed events count as settled: the frontier is at least the low water - 1.
        """
        bounds = []
        for p in range(self.partitions):
            low = high = self.low_water[p] - 1
            low_open = True
            for s in range(self.low_water[p], self.high_water[p] + 1):
                d = self.deliveries[(p, s)]
                terminal = d.state in _SETTLED
                if low_open and terminal:
                    low = s
                else:
                    low_open = False
                if terminal or self.doomed(d, t1):
                    high = s
                else:
                    break
            bounds.append((low, high))
        return bounds

    def check_frontier(self, frontier: dict[int, int], t1: int) -> None:
        """The backend's frontier lies within the allowed bounds."""
        check_equal(sorted(frontier), list(range(self.partitions)), "frontier partitions")
        for p, (low, high) in enumerate(self.frontier_bounds(t1)):
            check(low <= frontier[p] <= high,
                  f"frontier of partition {p} is {frontier[p]}, expected "
                  f"{low if low == high else f'{low}..{high}'}")

    def current_lease_ids(self) -> list[str]:
        """Ids of the leases that are still current (their delivery is leased under them)."""
        return [d.lease_id for d in self.deliveries.values()
                if d.state == "leased" and d.lease_id is not None]

    def is_newest_lease(self, lease: Lease) -> bool:
        """Is ``lease`` the newest lease of its (retained) delivery?"""
        d = self.deliveries.get((lease.partition, lease.sequence))
        return d is not None and d.lease_id == lease.lease_id

    def check_low_water(self, low_water: dict[int, int]) -> None:
        """The backend's low water per partition is the model's."""
        check_equal([low_water.get(p) for p in range(self.partitions)], self.low_water,
                    "low water")

    def unsettled(self) -> list[Position]:
        """Retained deliveries that are not settled (acked, rejected or skipped by a reset)."""
        return [p for p, d in self.deliveries.items() if d.state not in _SETTLED]

    def latest_ready(self) -> int:
        """When every nack delay has surely passed."""
        return max((d.ready_hi for d in self.deliveries.values() if d.state == "available"),
                   default=_IMMEDIATE)

    def rejected(self) -> dict[Position, tuple[str, int, str, str | None]]:
        """Dead letters the model knows of: (event id, attempts, reason, last error)."""
        return {p: (d.event.id, d.attempt, d.reason, d.last_error)
                for p, d in self.deliveries.items() if d.state == "rejected"}

    def doomed_lease_ids(self, t1: int) -> list[str]:
        """Ids of the current leases whose delivery may have been dead-lettered by ``t1``."""
        return [d.lease_id for d in self.deliveries.values()
                if d.lease_id is not None and self.doomed(d, t1)]

    def doomed_soon(self, before: int) -> list[int]:
        """Deadlines before ``before`` of the leases held at the last attempt: they may be
        dead-lettered by then (a call that must know every dead letter waits them out)."""
        return [d.deadline_ms for d in self.deliveries.values()
                if d.state == "leased" and d.attempt >= self.max_attempts
                and d.deadline_ms < before]
