"""Moving a group's stored frontiers over the deliveries settled right after them.

A settle, an expiry or a trim that settles a delivery calls :func:`advance`.
Each walk reads the deliveries after the frontier in growing chunks and moves
over them by :func:`~rheo_flow._backends._transitions.advance_frontier`; the
write is a ``$max`` conditioned on the partition's epoch, so an advance
computed before a replay, reset, redrive or trim never lands after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Set
from typing import Any, Final

from ..._support._call_retry import retried
from .._transitions import TERMINAL, advance_frontier
from ._documents import delivery_id

__all__ = ["advance"]

log = logging.getLogger("rheo_flow.mongo")

_WALK_FIRST: Final = 16
_WALK_BATCH: Final = 512
"""Deliveries read per step while advancing a frontier (growing from ``_WALK_FIRST``)."""
_ADVANCE_TRIES: Final = 8
"""Walks of a frontier whose group keeps moving under it before giving up (it is only late)."""

GroupPartition = tuple[Any, int]
"""(group id, partition)."""


class _GroupsMoved(Exception):
    """Some frontiers could not be written: their groups moved since they were read."""

    def __init__(self, pending: set[GroupPartition]) -> None:
        super().__init__(pending)
        self.pending = pending


async def advance(groups: Any, deliveries: Any, touched: Set[GroupPartition]) -> None:
    """Move the stored frontiers of ``touched`` (group id, partition) over settled deliveries.

    Each walk starts from the frontier read after the caller's writes and stops at
    the first gap or pending delivery, so a settled delivery is passed over once.
    A partition whose group moved meanwhile is walked again from where it is now.
    """
    pending = set(touched)
    if not pending:
        return

    async def advance_pending(attempt: int) -> None:
        nonlocal pending
        pending = await _advance_once(groups, deliveries, pending)
        if pending:
            raise _GroupsMoved(pending)

    try:
        await retried(advance_pending, when=lambda e: isinstance(e, _GroupsMoved),
                      attempts=_ADVANCE_TRIES)
    except _GroupsMoved as exc:  # pragma: no cover - needs eight group moves racing one settle
        log.warning("frontier of %s left behind by concurrent group moves", exc.pending)


async def _advance_once(
    groups: Any, deliveries: Any, pending: set[GroupPartition]
) -> set[GroupPartition]:
    """One walk of every pending frontier; returns those whose group moved meanwhile."""
    group_ids = list({gid for gid, _ in pending})
    docs = await groups.find({"_id": {"$in": group_ids}}, {"parts": 1}).to_list(None)
    parts = {d["_id"]: d["parts"] for d in docs}
    work = sorted((k for k in pending if k[0] in parts), key=lambda k: (str(k[0]), k[1]))
    moved = await asyncio.gather(*(
        _walk(deliveries, gid, p, parts[gid][p]["f"]) for gid, p in work
    ))
    moving: set[GroupPartition] = set()
    for (gid, p), target in zip(work, moved, strict=True):
        if target <= parts[gid][p]["f"]:
            continue
        result = await groups.update_one(
            {"_id": gid, f"parts.{p}.e": parts[gid][p]["e"]},
            {"$max": {f"parts.{p}.f": target}},
        )
        if not result.matched_count:
            moving.add((gid, p))
    return moving


async def _walk(deliveries: Any, gid: Any, p: int, frontier: int) -> int:
    """The frontier after moving from ``frontier`` over the settled deliveries next to it.

    Reads the deliveries right after the frontier by ``_id``, in growing chunks:
    a settle usually moves the frontier by a few sequences, a closed hole by many.
    """
    size = _WALK_FIRST
    while True:
        ids = [delivery_id(gid, p, s) for s in range(frontier + 1, frontier + size + 1)]
        docs = await deliveries.find(
            {"_id": {"$in": ids}}, {"_id": 0, "s": 1, "st": 1}
        ).to_list(None)
        moved = advance_frontier(frontier, {d["s"] for d in docs if d["st"] in TERMINAL})
        if moved < frontier + size:
            return moved
        frontier, size = moved, min(size * 4, _WALK_BATCH)
