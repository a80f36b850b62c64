"""Key-ordered groups: which keys are held, and releasing a key when its head settles.

In a group created with ``ordering="key"`` (docs/ordering.md) a delivery of key K
is leased only when no earlier delivery of K in its partition is unsettled. Such a
group's delivery documents carry their event's key ``k`` (when it has one) while
they are unsettled (settled for good, it is kept as ``sk``), and the partial index
:data:`~._schema.KEYED_INDEX` holds those carrying ``k`` by (group, partition,
key, sequence), so every question below is a bounded scan of that index (an
equality on group, partition and key, a range of sequences), never a read of the
settled history:

* a fetch materialises the sequences past the cursor in order (see
  ``_claim_keyed``); a delivery whose key has an unsettled delivery is stored
  *blocked*: available, attempt 0, ready at :data:`BLOCKED_MS`, so the walk of
  eligible deliveries (``r <= now``) passes over it;
* :func:`release` makes the earliest unsettled delivery of a key ready (``r``
  0) when it is a blocked one. It follows every write that settles a keyed
  delivery for good or removes one (settle, dead-lettering at an expiry, trim),
  and every fetch that stored blocked deliveries releases their keys after the
  insert: whichever of the two reads second sees the other's write, so no
  blocked delivery is left behind by a race (no lost wake-up), and a release is
  idempotent;
* an existing eligible delivery is leased only if :func:`blocked_keys` finds no
  earlier unsettled delivery of its key (a redriven dead letter holds back the
  later deliveries of its key that are not leased).

The probes name no index: an equality on group, partition and key with a range of
sequences is what a planner serves from ``keyed`` (the emulator CI runs plans only
that shape, and walks the whole index when given a hint).

Every probe only counts deliveries after the group's stored frontier (``after``):
everything up to it is settled, so a document a racing fetch left below it (a
trim or a reset that came in between) never holds a key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from typing import Any, Final

from pymongo import ASCENDING, UpdateOne

__all__ = ["BLOCKED_MS", "KeyedHead", "blocked_keys", "held_keys", "release", "unsettled_keys"]

BLOCKED_MS: Final = 2**62
"""``r`` (ready at) of a delivery stored behind an earlier unsettled one of its key."""

KeyedHead = tuple[Any, int, str, int]
"""(group id, partition, key, frontier): a key to release, counting deliveries after it."""


def _unsettled(group_id: Any, partition: int, key: str, after: int,
               before: int | None = None) -> dict[str, Any]:
    """The unsettled deliveries of ``key`` after ``after`` (and before ``before``)."""
    sequences = {"$gt": after} if before is None else {"$gt": after, "$lt": before}
    return {"g": group_id, "p": partition, "k": key, "s": sequences}


async def unsettled_keys(
    deliveries: Any, group_id: Any, partition: int, keys: Iterable[str], after: int
) -> set[str]:
    """Those of ``keys`` with an unsettled delivery in the partition (one probe each)."""
    wanted = sorted(set(keys))
    found = await asyncio.gather(*(
        deliveries.find_one(_unsettled(group_id, partition, key, after), {"_id": 1})
        for key in wanted
    ))
    return {key for key, doc in zip(wanted, found, strict=True) if doc is not None}


async def blocked_keys(
    deliveries: Any, group_id: Any, partition: int, firsts: Mapping[str, int], after: int
) -> set[str]:
    """The keys of ``firsts`` (key: sequence of its earliest candidate) with an unsettled
    delivery before that sequence: their candidates must wait. One probe per key; it
    finds nothing unless a redrive reopened an earlier delivery of a key."""
    wanted = sorted(firsts.items())
    found = await asyncio.gather(*(
        deliveries.find_one(_unsettled(group_id, partition, key, after, seq), {"_id": 1})
        for key, seq in wanted
    ))
    return {key for (key, _), doc in zip(wanted, found, strict=True) if doc is not None}


async def held_keys(
    deliveries: Any, group_id: Any, bounds: Mapping[int, int]
) -> set[tuple[int, str]]:
    """(partition, key) of the unsettled keyed deliveries at or below ``bounds[partition]``
    (those a trim removes: their keys are released afterwards)."""
    clauses = [{"p": p, "s": {"$lte": bound}} for p, bound in sorted(bounds.items())]
    docs = await deliveries.find(
        {"g": group_id, "k": {"$gte": ""},
         **(clauses[0] if len(clauses) == 1 else {"$or": clauses})},
        {"_id": 0, "p": 1, "k": 1},
    ).to_list(None)
    return {(d["p"], d["k"]) for d in docs}


async def release(deliveries: Any, heads: Iterable[KeyedHead]) -> None:
    """Make the earliest unsettled delivery of each key ready if it is a blocked one.

    A key named twice is released once, counting from the lower frontier. The heads
    are read concurrently and the blocked ones made ready in one bulk write.
    """
    lowest: dict[tuple[Any, int, str], int] = {}
    for group_id, partition, key, after in heads:
        at = (group_id, partition, key)
        lowest[at] = min(after, lowest.get(at, after))
    found = await asyncio.gather(*(
        deliveries.find_one(_unsettled(*at, after), {"r": 1}, sort=[("s", ASCENDING)])
        for at, after in lowest.items()))
    # Conditional: a concurrent release may have done it (and the delivery moved on).
    ready = [UpdateOne({"_id": head["_id"], "st": "available", "r": BLOCKED_MS},
                       {"$set": {"r": 0}})
             for head in found if head is not None and head["r"] == BLOCKED_MS]
    if ready:
        await deliveries.bulk_write(ready, ordered=False)
