"""A group's progress: its frontiers, its dead letters, and the moves back (redrive, replay, reset).

Every move back bumps the epoch of the partitions it touches, which fences the
frontier and cursor advances (and the work summary's clears) computed before it;
a replay or reset also notes the partitions it leaves with events past the cursor
in the group's work summary (``_summary``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo import ASCENDING

from ..._model._stream import DeadLetter, StartPosition
from .._shared import start_position
from ._core import MongoCore
from ._delay import count_scheduled
from ._documents import Group
from ._schema import ACTIVE_INDEX, REJECTED_INDEX
from ._summary import initial

__all__ = ["ProgressOps"]


class ProgressOps(MongoCore):
    """``frontier``, ``dead_letters``, ``redrive``, ``replay`` and ``reset``."""

    async def scheduled(self, stream: str, after: Mapping[int, int]) -> dict[int, int]:
        """Counted on the scheduled events' index; a stream that never held one
        (``sc``, see ``_delay``) answers zeros from its document alone."""
        await self._ready()
        if not after:
            return {}
        if not (await self._stream_doc(stream)).get("sc"):
            return dict.fromkeys(after, 0)
        return await count_scheduled(self._events, stream, after, self._clock())

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        await self._ready()
        g = await self._group(stream, group)
        return {p: part["f"] for p, part in g.parts.items()}

    async def frontiers(self, stream: str) -> dict[str, dict[int, int]]:
        await self._ready()
        await self._stream_doc(stream)
        docs = await self._groups.find({"s": stream}, {"n": 1, "parts.f": 1}).sort(
            "n", ASCENDING).to_list(None)
        return {d["n"]: {p: part["f"] for p, part in enumerate(d["parts"])} for d in docs}

    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        await self._ready()
        g = await self._group(stream, group)
        query: dict[str, Any] = {"g": g.id, "st": "rejected"}
        if after is not None:
            query["$or"] = [{"p": {"$gt": after[0]}}, {"p": after[0], "s": {"$gt": after[1]}}]
        docs = await self._deliveries.find(
            query, {"p": 1, "s": 1, "a": 1, "rs": 1, "rj": 1, "le": 1}
        ).hint(REJECTED_INDEX).sort([("p", ASCENDING), ("s", ASCENDING)]).limit(
            limit).to_list(None)
        if not docs:
            return []
        events = await self._load_events(stream, [(d["p"], d["s"]) for d in docs])
        return [
            DeadLetter(stream, group, d["p"], d["s"], events[(d["p"], d["s"])].id, d["a"],
                       d["rs"], d["rj"], d.get("le"))
            for d in docs
            if (d["p"], d["s"]) in events
        ]

    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        await self._ready()
        g = await self._group(stream, group)
        selected = _dead_letters_at(g, positions)
        if selected is None:
            return 0
        query, parts = selected
        result = await self._deliveries.update_many(query, {
            "$set": {"st": "available", "a": 0, "lid": None, "rc": None, "sb": None,
                     "r": self._clock(), "rs": ""},
            "$unset": {"le": ""},
            "$rename": {"sk": "k"},  # unsettled again: its key holds back the later ones
        })
        if not result.modified_count:
            return 0
        await self._reopen_frontiers(g, parts)
        return int(result.modified_count)

    async def _reopen_frontiers(self, g: Group, parts: list[int]) -> None:
        """Redriven deliveries are pending again: no frontier may stay past the lowest
        pending delivery of its partition (found on the index of active deliveries)."""
        lowest = await asyncio.gather(*(
            self._deliveries.find_one({"g": g.id, "p": p, "r": {"$exists": True}}, {"s": 1},
                                      sort=[("s", ASCENDING)], hint=ACTIVE_INDEX)
            for p in parts
        ))
        low = {p: doc["s"] for p, doc in zip(parts, lowest, strict=True) if doc is not None}
        if low:
            await self._groups.update_one({"_id": g.id}, {
                "$min": {f"parts.{p}.f": seq - 1 for p, seq in low.items()},
                "$inc": {f"parts.{p}.e": 1 for p in low},
            })

    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        moving = await self._moving(stream, group, partitions)
        if moving is None:
            return
        g, waters = moving
        # Trimmed events are gone and count as settled: replay starts at the low water.
        starts = {p: max(from_sequence, low) for p, (_, low) in waters.items()}
        await self._move_back(
            g, {"$or": [{"p": p, "s": {"$gte": start}} for p, start in starts.items()]},
            "$min", {p: start - 1 for p, start in starts.items()}, waters,
        )

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        moving = await self._moving(stream, group, partitions)
        if moving is None:
            return
        g, waters = moving
        await self._move_back(
            g, {"p": {"$in": list(waters)}},
            "$set", {p: start_position(to, high, low) for p, (high, low) in waters.items()},
            waters,
        )

    async def _move_back(
        self, g: Group, dropped: dict[str, Any], operator: str, positions: dict[int, int],
        waters: dict[int, tuple[int, int]],
    ) -> None:
        """Drop the deliveries matching ``dropped``, then move cursors and frontiers.

        ``operator`` (``$min`` or ``$set``) applies ``positions`` to both the cursor
        and the frontier of each partition, whose epoch is bumped, and the work summary
        notes the partitions left with events past the position (their high water in
        ``waters``), in the same update. Deleting a delivery fences its lease; it is
        materialised again, attempt 1.
        """
        await self._deliveries.delete_many({"g": g.id, **dropped})
        update: dict[str, Any] = {
            operator: {k: v for p, position in positions.items()
                       for k, v in ((f"parts.{p}.c", position), (f"parts.{p}.f", position))},
            "$inc": {f"parts.{p}.e": 1 for p in positions},
        }
        noted = initial(positions, {p: high for p, (high, _) in waters.items()})
        if noted:
            update["$max"] = {f"w.{p}": high for p, high in noted.items()}
        await self._groups.update_one({"_id": g.id}, update)

    async def _moving(
        self, stream: str, group: str, partitions: Sequence[int]
    ) -> tuple[Group, dict[int, tuple[int, int]]] | None:
        """The group a move back applies to and the (high, low) waters of its partitions.

        ``None`` when no partition is named (the move does nothing).
        """
        await self._ready()
        g = await self._group(stream, group)
        named = list(partitions)
        if not named:
            return None
        return g, await self._waters(stream, named)


def _dead_letters_at(
    g: Group, positions: Sequence[tuple[int, int]] | None
) -> tuple[dict[str, Any], list[int]] | None:
    """The filter of the dead letters at ``positions`` (all when ``None``), and their partitions.

    ``None`` when ``positions`` names none.
    """
    query: dict[str, Any] = {"g": g.id, "st": "rejected"}
    if positions is None:
        return query, list(range(g.count))
    by_part: dict[int, set[int]] = {}
    for p, seq in positions:
        by_part.setdefault(p, set()).add(seq)
    if not by_part:
        return None
    parts = sorted(by_part)
    query["$or"] = [{"p": p, "s": {"$in": sorted(by_part[p])}} for p in parts]
    return query, parts
