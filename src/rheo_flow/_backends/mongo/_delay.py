"""Delayed delivery (docs/contract.md, "Delayed delivery"): scheduled events wait for
their time by the backend's clock.

An event appended with ``deliver_at`` stores it as ``da``; the first such append to
a stream marks the stream and every group of it ``sc`` (:func:`mark`), and a group
created later takes the mark from its stream, so a fetch knows from the group
document it reads anyway whether to look for scheduled events: a stream without
them pays no extra round trip.

An unordered group's fetch claims new sequences right after its cursor. When its
window (cursor + 1 up to the high water) holds a scheduled event not due yet,
:func:`split_scheduled` first stores the window (``limit`` events due, past the
scheduled ones) as delivery documents, attempt 0: the scheduled events available
at their time, the others now, exactly like deliveries nacked with a delay; the
cursor moves past them, and the fetch leases the due ones as it leases nacked
ones. The frontier waits behind the available deliveries. A key-ordered group
stores its scheduled events at their time as it scans (``_claim_keyed``), holding
their keys. SQLite's and PostgreSQL's ``split_scheduled`` do the same.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any, Final

from pymongo import ASCENDING, UpdateOne
from pymongo import errors as mongo_errors

from ._documents import Group, delivery_id
from ._errors import DUPLICATE_KEY

__all__ = ["SCHEDULED_READ", "count_scheduled", "mark", "new_delivery", "split_scheduled"]

SCHEDULED_READ: Final = 4096
"""How many scheduled events past its window's need a split reads at most."""

Doc = dict[str, Any]


async def mark(streams: Any, groups: Any, stream: str) -> None:
    """Mark ``stream`` and its groups as holding scheduled events, before the events
    become visible. The stream first: a group created meanwhile either is reached by
    the groups' update or reads the stream's mark after its insert (``_streams``)."""
    await streams.update_one({"_id": stream, "sc": {"$ne": 1}}, {"$set": {"sc": 1}})
    await groups.update_many({"s": stream, "sc": {"$ne": 1}}, {"$set": {"sc": 1}})


def new_delivery(g: Group, p: int, seq: int, ready_at: int, key: str | None = None) -> Doc:
    """An available delivery document, attempt 0, ready at ``ready_at``."""
    doc: Doc = {"_id": delivery_id(g.id, p, seq), "g": g.id, "p": p, "s": seq}
    if key is not None:
        doc["k"] = key
    doc.update({"st": "available", "a": 0, "lid": None, "rc": None, "c": None, "dl": 0,
                "r": ready_at, "sb": None, "rs": "", "rj": 0})
    return doc


async def _not_due(events: Any, stream: str, p: int, cursor: int, high: int, now: int,
                   limit: int) -> list[Doc]:
    """The partition's scheduled events not due at ``now`` in (cursor, high], in order."""
    return list(await events.find(
        {"st": stream, "p": p, "n": {"$gt": cursor, "$lte": high}, "da": {"$gt": now}},
        {"_id": 0, "n": 1, "da": 1},
    ).sort("n", ASCENDING).limit(limit + SCHEDULED_READ).to_list(None))


def _window_end(cursor: int, high: int, at: Mapping[int, int], found: int, limit: int) -> int:
    """The last sequence of the window to split: ``limit`` events due past the scheduled
    ones (``at``), no further than the high water nor past what the read saw."""
    # seq - cursor - n: the events due between the cursor and the n-th scheduled one.
    hi = cursor + limit + sum(1 for n, seq in enumerate(sorted(at), 1)
                              if seq - cursor - n < limit)
    return min(high, hi, max(at) if found == limit + SCHEDULED_READ else high)


async def split_scheduled(events: Any, deliveries: Any, groups: Any, g: Group,
                          waters: dict[int, tuple[int, int]], now: int, limit: int) -> set[int]:
    """In each partition of ``waters`` (visited, with its (high, low) water) whose window
    holds a scheduled event not due at ``now``, store the window as delivery documents
    and raise the cursor past it (fenced by the epoch read); ``g.parts`` and ``waters``
    then end at the window, so the round claims no new sequence past it. The
    partitions split."""
    parts = [p for p, (high, _) in waters.items() if high > g.parts[p]["c"]]
    found = await asyncio.gather(*(
        _not_due(events, g.stream, p, g.parts[p]["c"], waters[p][0], now, limit)
        for p in parts))
    docs: list[Doc] = []
    moves: list[UpdateOne] = []
    split: set[int] = set()
    for p, scheduled in zip(parts, found, strict=True):
        if not scheduled:
            continue
        cursor, (high, low) = g.parts[p]["c"], waters[p]
        at = {d["n"]: d["da"] for d in scheduled}
        hi = _window_end(cursor, high, at, len(scheduled), limit)
        docs.extend(new_delivery(g, p, seq, at.get(seq, now))
                    for seq in range(max(cursor, low - 1) + 1, hi + 1))
        moves.append(UpdateOne({"_id": g.id, f"parts.{p}.e": g.parts[p]["e"]},
                               {"$max": {f"parts.{p}.c": hi}}))
        g.parts[p]["c"] = hi
        waters[p] = (hi, low)
        split.add(p)
    if docs:
        try:
            await deliveries.insert_many(docs, ordered=False)
        except mongo_errors.BulkWriteError as exc:  # claimed or split by another fetch
            if any(e.get("code") != DUPLICATE_KEY for e in exc.details.get("writeErrors", [])):
                raise
    if moves:
        await groups.bulk_write(moves, ordered=False)
    return split


async def count_scheduled(events: Any, stream: str, after: Mapping[int, int],
                          now: int) -> dict[int, int]:
    """Per partition of ``after``, its events past ``after[p]`` scheduled later than ``now``."""
    parts = sorted(after)
    counts = await asyncio.gather(*(
        events.count_documents({"st": stream, "p": p, "n": {"$gt": after[p]},
                                "da": {"$gt": now}})
        for p in parts))
    return dict(zip(parts, counts, strict=True))
