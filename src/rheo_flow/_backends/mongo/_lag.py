"""The lag report of the MongoDB backend: every group of many streams in a few queries.

Whatever the number of streams, groups and partitions: the streams' documents, their
partitions' waters, their groups (frontiers and pauses), the dead letters counted
per group (one aggregation on the index of rejected deliveries), the scheduled events
not due yet past the lowest frontier of each partition (only for streams that ever
held one), and the append time of the first event past each frontier (one lookup by
``_id``; a further one only for an event trimmed or deleted meanwhile).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from pymongo import ASCENDING

from ..._model._lag import GroupLag, LagReport, PartitionLag
from ..._model._stream import paused_state
from ._client import resolve
from ._core import MongoCore
from ._documents import event_id
from ._schema import REJECTED_INDEX

__all__ = ["LagOps"]

_Position = tuple[str, int]
"""(stream, partition)."""


class LagOps(MongoCore):
    """``lag_report``."""

    async def lag_report(self, streams: Sequence[str] | None) -> LagReport:
        """Every group of ``streams`` (``None``: every stream), in a bounded number of
        queries (see the module docstring); a stream deleted meanwhile is left out."""
        await self._ready()
        now = self._clock()
        chosen: dict[str, Any] = {} if streams is None else {"_id": {"$in": list(streams)}}
        docs = await self._streams.find(chosen, {"np": 1, "sc": 1}).to_list(None)
        if not docs:
            return LagReport(now, ())
        names = [d["_id"] for d in docs]
        counts = {d["_id"]: d["np"] for d in docs}
        high: dict[_Position, tuple[int, int]] = {}
        async for doc in self._partitions.find({"st": {"$in": names}},
                                               {"st": 1, "p": 1, "hw": 1, "lw": 1}):
            high[(doc["st"], doc["p"])] = (doc["hw"], doc["lw"])
        groups = [g for g in await self._groups.find(
            {"s": {"$in": names}}, {"s": 1, "n": 1, "pz": 1, "parts.f": 1}).to_list(None)
            if g["s"] in counts]
        if not groups:
            return LagReport(now, ())
        letters, later, oldest = await asyncio.gather(
            self._dead_letter_counts([g["_id"] for g in groups]),
            self._not_due(groups, [d["_id"] for d in docs if d.get("sc")], now),
            self._oldest(groups, counts, high))
        out = []
        for g in sorted(groups, key=lambda g: (g["s"], g["n"])):
            stream = g["s"]
            partitions = []
            for p, part in enumerate(g["parts"][:counts[stream]]):
                water = high.get((stream, p), (0, 1))[0]
                frontier = part["f"]
                partitions.append(PartitionLag(
                    p, water, frontier,
                    sum(1 for seq in later.get((stream, p), ()) if seq > frontier),
                    oldest.get((stream, p, frontier))))
            out.append(GroupLag(stream, g["n"], tuple(partitions), letters.get(g["_id"], 0),
                                *paused_state(g.get("pz", 0), now)))
        return LagReport(now, tuple(out))

    async def _dead_letter_counts(self, group_ids: Sequence[Any]) -> dict[Any, int]:
        """Group id -> how many of its deliveries are rejected."""
        counted = await resolve(self._deliveries.aggregate([
            {"$match": {"g": {"$in": list(group_ids)}, "st": "rejected"}},
            {"$group": {"_id": "$g", "n": {"$sum": 1}}},
        ], hint=REJECTED_INDEX))  # a coroutine in PyMongo, a cursor in Motor
        return {doc["_id"]: doc["n"] async for doc in counted}

    async def _not_due(self, groups: Sequence[Mapping[str, Any]], scheduling: Sequence[str],
                       now: int) -> dict[_Position, list[int]]:
        """(stream, partition) -> the sequences of its events scheduled after ``now``
        past the lowest frontier of the partition's groups (streams that held any)."""
        if not scheduling:
            return {}
        lowest: dict[_Position, int] = {}
        for g in groups:
            if g["s"] in scheduling:
                for p, part in enumerate(g["parts"]):
                    lowest[(g["s"], p)] = min(part["f"], lowest.get((g["s"], p), part["f"]))
        clauses = [{"st": s, "p": p, "n": {"$gt": f}, "da": {"$gt": now}}
                   for (s, p), f in sorted(lowest.items())]
        out: dict[_Position, list[int]] = {}
        async for doc in self._events.find({"$or": clauses}, {"_id": 0, "st": 1, "p": 1,
                                                              "n": 1}):
            out.setdefault((doc["st"], doc["p"]), []).append(doc["n"])
        return out

    async def _oldest(self, groups: Sequence[Mapping[str, Any]], counts: Mapping[str, int],
                      high: Mapping[_Position, tuple[int, int]]) -> dict[tuple[str, int, int],
                                                                        int]:
        """(stream, partition, frontier) -> the append time of the first stored event past
        the frontier, for every frontier behind its high water."""
        wanted: dict[str, tuple[str, int, int]] = {}
        for g in groups:
            stream = g["s"]
            for p, part in enumerate(g["parts"][:counts[stream]]):
                water, low = high.get((stream, p), (0, 1))
                if water > part["f"]:
                    first = max(part["f"] + 1, low)
                    wanted[event_id(stream, p, first)] = (stream, p, part["f"])
        out: dict[tuple[str, int, int], int] = {}
        if not wanted:
            return out
        async for doc in self._events.find({"_id": {"$in": list(wanted)}}, {"at": 1}):
            out[wanted.pop(doc["_id"])] = doc["at"]
        found = await asyncio.gather(*(  # trimmed meanwhile: the next stored one
            self._events.find_one({"st": s, "p": p, "n": {"$gt": f}}, {"at": 1},
                                  sort=[("n", ASCENDING)]) for s, p, f in wanted.values()))
        for position, doc in zip(wanted.values(), found, strict=True):
            if doc is not None:
                out[position] = doc["at"]
        return out
