"""Retention and deletion: trimming a stream's oldest events, deleting streams and groups."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pymongo import UpdateOne

from ._core import MongoCore
from ._documents import ordering_of, partition_id
from ._frontier import advance
from ._keys import held_keys, release

__all__ = ["RetentionOps"]


class RetentionOps(MongoCore):
    """``trim``, ``delete_stream`` and ``delete_group``."""

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        await self._ready()
        await self._stream_doc(stream)
        partitions = list(up_to)
        highs = await self._highs(stream, partitions)
        bounds = {p: min(up_to[p], highs[p]) for p in partitions}
        if not bounds:
            return {}
        await self._partitions.bulk_write([
            UpdateOne({"_id": partition_id(stream, p)},
                      {"$max": {"lw": bound + 1}, "$setOnInsert": {"st": stream, "p": p, "hw": 0}},
                      upsert=True)
            for p, bound in bounds.items()
        ], ordered=False)
        removed: dict[int, int] = {}
        for p, bound in bounds.items():
            result = await self._events.delete_many({"st": stream, "p": p, "n": {"$lte": bound}})
            removed[p] = int(result.deleted_count)
        groups = await self._groups.find({"s": stream}, {"_id": 1, "o": 1}).to_list(None)
        live = {p: bound for p, bound in bounds.items() if bound > 0}
        for doc in groups if live else []:
            await self._settle_trimmed(doc["_id"], live, ordering_of(doc) == "key")
        return removed

    async def _settle_trimmed(self, group_id: Any, bounds: Mapping[int, int], keyed: bool) -> None:
        """Deliveries of removed events are dropped (fencing their leases) and count as settled.

        In a key-ordered group the keys of the unsettled ones dropped are released
        afterwards (the events are gone already, so a fetch stores no new one below).
        """
        held = await held_keys(self._deliveries, group_id, bounds) if keyed else set()
        await self._deliveries.delete_many({"g": group_id, "$or": [
            {"p": p, "s": {"$lte": bound}} for p, bound in bounds.items()
        ]})
        await self._groups.update_one({"_id": group_id}, {
            "$max": {k: v for p, bound in bounds.items()
                     for k, v in ((f"parts.{p}.c", bound), (f"parts.{p}.f", bound))},
        })
        await advance(self._groups, self._deliveries, {(group_id, p) for p in bounds})
        await release(self._deliveries, [(group_id, p, key, bounds[p]) for p, key in held])

    async def delete_stream(self, stream: str) -> None:
        await self._ready()
        await self._stream_doc(stream)
        groups = await self._groups.find({"s": stream}, {"_id": 1}).to_list(None)
        for doc in groups:
            await self._delete_group(doc["_id"])
        await self._events.delete_many({"st": stream})
        await self._partitions.delete_many({"st": stream})
        # The stream document goes last: an interrupted deletion leaves a stream
        # that is still listed, and deleting it again finishes the job.
        await self._streams.delete_one({"_id": stream})
        self._append_locks.pop(stream, None)

    async def delete_group(self, stream: str, group: str) -> None:
        await self._ready()
        await self._delete_group((await self._group(stream, group)).id)

    async def _delete_group(self, group_id: Any) -> None:
        await self._deliveries.delete_many({"g": group_id})
        await self._groups.delete_one({"_id": group_id})
        self._rotation.forget(group_id)
