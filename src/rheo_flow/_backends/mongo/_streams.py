"""Streams and groups: creating, describing and listing them; reading events by query."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from bson import ObjectId
from pymongo import ASCENDING
from pymongo import errors as mongo_errors

from ..._backend import DEFAULT_MAX_ATTEMPTS
from ..._model._errors import ConflictError, UnknownStream
from ..._model._event import Event
from ..._model._query import Query
from ..._model._stream import GroupInfo, Retention, StartPosition, StreamInfo
from ..._model._validation import ordering_mismatch
from .._shared import query_window, start_position
from ._core import MongoCore
from ._documents import Group, event_of, group_info_of, partition_id
from ._summary import built

__all__ = ["StreamOps"]


def _retention(doc: Mapping[str, Any]) -> Retention | None:
    """A stream document's retention policy: its fields ``ra`` (max age, ms) and ``re``
    (max events), absent when unset (a document older than retention has neither)."""
    return Retention.from_ms(doc.get("ra"), doc.get("re"))


class StreamOps(MongoCore):
    """The operations on streams and groups as such, and queries."""

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        await self._ready()
        now = self._clock()
        try:
            await self._streams.insert_one({"_id": name, "np": partitions, "at": now})
        except mongo_errors.DuplicateKeyError:
            existing = await self._stream_doc(name)
            if existing["np"] != partitions:
                raise ConflictError(
                    f"stream {name!r} exists with {existing['np']} partitions, not {partitions}"
                ) from None
            return await self._stream_info(existing)
        # Partition documents are also created on demand (append upserts its counter):
        # a creator that dies here leaves a usable stream.
        with contextlib.suppress(mongo_errors.BulkWriteError):
            await self._partitions.insert_many(
                [{"_id": partition_id(name, p), "st": name, "p": p, "hw": 0, "lw": 1}
                 for p in range(partitions)],
                ordered=False,
            )
        return StreamInfo(name, partitions, now, dict.fromkeys(range(partitions), 0),
                          dict.fromkeys(range(partitions), 1))

    async def _stream_info(self, doc: Mapping[str, Any]) -> StreamInfo:
        waters = await self._waters(doc["_id"], range(doc["np"]))
        return StreamInfo(
            doc["_id"], doc["np"], doc["at"],
            {p: high for p, (high, _) in waters.items()},
            {p: low for p, (_, low) in waters.items()}, _retention(doc),
        )

    async def stream_info(self, name: str) -> StreamInfo:
        await self._ready()
        return await self._stream_info(await self._stream_doc(name))

    async def set_retention(self, stream: str, retention: Retention | None) -> None:
        await self._ready()
        fields = {"ra": None if retention is None else retention.max_age_ms,
                  "re": None if retention is None else retention.max_events}
        change = {"$set": {k: v for k, v in fields.items() if v is not None}} | {
            "$unset": {k: "" for k, v in fields.items() if v is None}}
        found = await self._streams.update_one(
            {"_id": stream}, {op: spec for op, spec in change.items() if spec})
        if not found.matched_count:
            raise UnknownStream(stream)

    async def now_ms(self) -> int:
        return self._clock()

    async def list_streams(self) -> list[str]:
        await self._ready()
        docs = await self._streams.find({}, {"_id": 1}).sort("_id", ASCENDING).to_list(None)
        return [d["_id"] for d in docs]

    async def describe_streams(self) -> list[tuple[StreamInfo, list[GroupInfo]]]:
        """Every stream with its waters and groups in three queries, however many there
        are (streams, their partitions' waters, groups without per-partition entries)."""
        await self._ready()
        streams = await self._streams.find({}).sort("_id", ASCENDING).to_list(None)
        waters: dict[str, dict[int, tuple[int, int]]] = {}
        async for doc in self._partitions.find({}, {"st": 1, "p": 1, "hw": 1, "lw": 1}):
            waters.setdefault(doc["st"], {})[doc["p"]] = (doc["hw"], doc["lw"])
        groups: dict[str, list[GroupInfo]] = {}
        now = self._clock()
        async for d in self._groups.find({}, {"parts": 0, "w": 0}).sort(
                [("s", ASCENDING), ("n", ASCENDING)]):
            groups.setdefault(d["s"], []).append(group_info_of(d, now))
        out = []
        for doc in streams:
            name, count = doc["_id"], doc["np"]
            # A partition without a document is empty (see _waters).
            found = waters.get(name, {})
            marks = {p: found.get(p, (0, 1)) for p in range(count)}
            out.append((StreamInfo(name, count, doc["at"], {p: h for p, (h, _) in marks.items()},
                                   {p: low for p, (_, low) in marks.items()},
                                   _retention(doc)),
                        groups.get(name, [])))
        return out

    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None,
        *, ordering: str = "none",
    ) -> GroupInfo:
        """Create the group at ``start``, or return it (with ``max_attempts`` changed if given).

        ``ordering`` applies at creation (stored as ``o``); ``"key"`` for an existing
        group without it is an InvalidArgument.
        """
        await self._ready()
        s = await self._stream_doc(stream)
        existing = await self._groups.find_one({"s": stream, "n": group})
        if existing is None:
            existing, created = await self._insert_group(s, group, start, max_attempts,
                                                         ordering == "key")
            if created:
                return Group.of(existing).info(self._clock())
        g = Group.of(existing)
        if ordering == "key" and g.ordering != "key":
            raise ordering_mismatch(stream, group, g.ordering, ordering)
        if max_attempts is not None and max_attempts != g.max_attempts:
            await self._groups.update_one({"_id": g.id}, {"$set": {"ma": max_attempts}})
            g.max_attempts = max_attempts
        return g.info(self._clock())

    async def _insert_group(
        self, s: Mapping[str, Any], group: str, start: StartPosition, max_attempts: int | None,
        keyed: bool,
    ) -> tuple[dict[str, Any], bool]:
        """Create the group: its document, and False when another creator made it first.

        Its work summary is completed after the insert, from high waters read then
        (``_summary``): an append whose first note came before the document existed is
        seen there, or its second note finds the document.
        """
        waters = await self._waters(s["_id"], range(s["np"]))
        parts = []
        for p in range(s["np"]):
            position = start_position(start, *waters[p])
            parts.append({"c": position, "f": position, "e": 0})
        doc = {
            "_id": ObjectId(), "s": s["_id"], "n": group,
            "ma": max_attempts or DEFAULT_MAX_ATTEMPTS, "at": self._clock(), "parts": parts,
            "np": s["np"],
        }
        if keyed:
            doc["o"] = "key"  # absent: unordered, as every group written before orderings
        if s.get("sc"):
            doc["sc"] = 1
        try:
            await self._groups.insert_one(doc)
            if not s.get("sc"):  # a first scheduled append meanwhile (``_delay.mark``)
                await self._scheduled_since(s["_id"], doc)
            highs = await self._highs(s["_id"], range(s["np"]))
            await built(self._groups, Group.of(doc), highs)
            return doc, True
        except mongo_errors.DuplicateKeyError:
            existing: dict[str, Any] | None = await self._groups.find_one(
                {"s": s["_id"], "n": group})
            if existing is None:  # pragma: no cover - groups are never deleted
                raise
            return existing, False

    async def _scheduled_since(self, stream: str, doc: dict[str, Any]) -> None:
        """Mark the group ``doc`` just inserted when its stream was marked since it was
        read: the mark's update of the groups may have run before the insert."""
        if (await self._streams.find_one({"_id": stream}, {"sc": 1}) or {}).get("sc"):
            await self._groups.update_one({"_id": doc["_id"]}, {"$set": {"sc": 1}})
            doc["sc"] = 1

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        await self._ready()
        return (await self._group(stream, group)).info(self._clock())

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        await self._ready()
        await self._stream_doc(stream)
        docs = await self._groups.find({"s": stream}, {"parts": 0}).sort(
            "n", ASCENDING).to_list(None)
        now = self._clock()
        return [group_info_of(d, now) for d in docs]

    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        await self._ready()
        s = await self._stream_doc(query.stream)
        parts = range(s["np"]) if query.partitions is None else sorted(query.partitions)
        waters = await self._waters(query.stream, list(parts))
        filters = _filters(query)
        out: list[Event] = []
        for p in parts:
            high, low = waters[p]
            window = query_window(query, p, after, low, high)
            if window is None:
                continue
            lo, hi = window
            docs = await self._events.find(
                {"st": query.stream, "p": p, "n": {"$gte": lo, "$lte": hi}, **filters}
            ).sort("n", ASCENDING).limit(limit - len(out)).to_list(None)
            out.extend(event_of(d) for d in docs)
            if len(out) >= limit:
                break
        return out


def _filters(query: Query) -> dict[str, Any]:
    """The event fields a query filters on besides the position (key, type, time)."""
    filters: dict[str, Any] = {}
    if query.key is not None:
        filters["k"] = query.key
    if query.type is not None:
        filters["t"] = query.type
    if query.since_ms is not None or query.until_ms is not None:
        at: dict[str, int] = {}
        if query.since_ms is not None:
            at["$gte"] = query.since_ms
        if query.until_ms is not None:
            at["$lt"] = query.until_ms
        filters["at"] = at
    return filters
