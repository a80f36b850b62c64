"""The events of a Redis stream: appending them, reading them back, trimming them."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from hashlib import sha1
from typing import Any, Final

import orjson

from ..._backend import AppendRecord
from ..._model._event import Event
from ..._model._query import Query
from .._shared import query_matches, query_window
from ._codec import appended_across, appended_events, encode_metas, entry_event, text
from ._scripts import LOST, Read, ScriptCall, is_reply
from ._work import WorkNotes

__all__ = ["EventOperations"]

_TRIM_CHUNK: Final = 5_000
"""The most events one trim script removes (a long trim takes several calls)."""
_QUERY_CHUNK: Final = 500
_BLOB_CHARS: Final = 512 * 1024
"""Data from this many characters of JSON on is stored apart from its entry (standalone
Redis; see ``append_many.lua``): a SET takes it without a copy, where a script would copy
it twice and block the server for several times a raw XADD of it."""


class EventOperations(WorkNotes):
    """Append, query and trim."""

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        count = await self._partition_count(stream)
        if not records:
            return []
        metas = encode_metas(records)
        if self._keys.summaries:
            return await self._append_many(stream, count, records, metas)
        targets = [r.partition for r in records]
        if count > 1:
            targets = await self._owners(stream, records)
        by_partition: dict[int, list[int]] = {}
        for index, partition in enumerate(targets):
            by_partition.setdefault(partition, []).append(index)
        dumps = orjson.dumps
        calls: list[ScriptCall] = []
        for partition, indexes in by_partition.items():
            # The data texts go as arguments of their own, not inside the JSON of the
            # heads: nothing escapes them here or decodes them in the server.
            heads = dumps([(records[i].id, metas[i]) if records[i].deliver_at_ms is None
                           else (records[i].id, metas[i], str(records[i].deliver_at_ms))
                           for i in indexes])
            calls.append(("append", self._keys.append_keys(stream, partition),
                          [heads, *[records[i].data_json for i in indexes]]))
        replies = await self._eval(calls, transaction=len(calls) > 1)
        if any(is_reply(reply, LOST) for reply in replies):
            raise self._lost(stream)
        await self._note_appended(stream, by_partition)
        loads = orjson.loads
        if len(calls) == 1 and len(by_partition[targets[0]]) == len(records):
            [reply] = replies
            [(partition, _)] = by_partition.items()
            return appended_events(stream, partition, records, loads(reply))
        events: list[Event | None] = [None] * len(records)
        for (partition, indexes), reply in zip(by_partition.items(), replies, strict=True):
            built = appended_events(stream, partition, [records[i] for i in indexes],
                                    loads(reply))
            for index, event in zip(indexes, built, strict=True):
                events[index] = event
        return [e for e in events if e is not None]

    async def _append_many(self, stream: str, count: int, records: Sequence[AppendRecord],
                           metas: list[str]) -> list[Event]:
        """Standalone Redis: the whole batch in one ``append_many.lua`` call, each id
        looked up in the stream's digest index (8 bytes of its SHA-1) instead of a hash
        field per id in each partition and in the stream."""
        layout = self._keys
        # Large data goes by a SET of its own in the same MULTI, never through Lua.
        tokens = [os.urandom(8).hex() if len(r.data_json) >= _BLOB_CHARS else None
                  for r in records]
        rows = orjson.dumps([(r.id, meta, r.partition, token) if r.deliver_at_ms is None
                             else (r.id, meta, r.partition, token, str(r.deliver_at_ms))
                             for r, meta, token in zip(records, metas, tokens, strict=True)])
        digests = b"".join([sha1(r.id.encode()).digest()[:8] for r in records])
        sets: list[Read] = [
            ("SET", f"{layout.tag(stream, r.partition)}:b:{token}", r.data_json)
            for r, token in zip(records, tokens, strict=True) if token is not None]
        [reply] = await self._scripts.run_after(sets, [(
            "append_many", (layout.digests(stream), layout.ids(stream), layout.groups(stream)),
            [layout.tag_head(stream), f"{layout.prefix}:new:{stream}:", count, rows, digests,
             *["" if token else r.data_json for r, token in zip(records, tokens, strict=True)]],
        )])
        if is_reply(reply, LOST):
            raise self._lost(stream)
        events = appended_across(stream, records, orjson.loads(reply))
        await self._fill_blobs(stream, events)
        return events

    async def scheduled(self, stream: str, after: Mapping[int, int]) -> dict[int, int]:
        await self._partition_count(stream)
        parts = sorted(after)
        pipe = self._client.pipeline(transaction=False)
        for p in parts:
            pipe.zrange(self._keys.times(stream, p), 0, -1, withscores=True)
        times = await self._io(pipe.execute())
        seconds, micros = await self._io(self._client.time())  # a Cluster pipelines no TIME
        now = int(seconds) * 1000 + int(micros) // 1000
        return {p: sum(1 for seq, at in found if at > now and int(seq) > after[p])
                for p, found in zip(parts, times, strict=True)}

    async def _owners(self, stream: str, records: Sequence[AppendRecord]) -> list[int]:
        """The partition each record goes to in a multi-partition stream.

        An id is owned by the partition it was first appended to, even when a
        retry routes it elsewhere (no key, another key, another partition).
        """
        payload = orjson.dumps([[r.id, r.partition] for r in records])
        [owners] = await self._eval([("claim_ids", [self._keys.ids(stream)], [payload])])
        return [int(p) for p in text(owners).split(",")]

    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        stream = query.stream
        count = await self._partition_count(stream)
        pids = range(count) if query.partitions is None else sorted(query.partitions)
        out: list[Event] = []
        for pid in pids:
            window = query_window(query, pid, after, 1, None)
            if window is not None and await self._query_partition(query, pid, window, limit,
                                                                  out):
                break
        await self._fill_blobs(stream, out)
        return out

    async def _query_partition(
        self, query: Query, pid: int, window: tuple[int, int | None], limit: int,
        out: list[Event],
    ) -> bool:
        """Add the partition's matching events in ``window`` to ``out``; True once it
        holds ``limit``."""
        stream = query.stream
        lo, hi = window
        key = self._keys.partition(stream, pid).stream
        low = f"{lo}-0"
        high = "+" if hi is None else f"{hi}-0"
        while True:
            size = min(_QUERY_CHUNK, max(limit - len(out), 50))
            entries: Any = await self._io(self._client.xrange(key, low, high, count=size))
            for entry_id, fields in entries:
                event = entry_event(stream, pid, entry_id, fields)
                if query.until_ms is not None and event.appended_at_ms >= query.until_ms:
                    # Append times never decrease within a partition.
                    return False
                if query_matches(query, event):
                    out.append(event)
                    if len(out) >= limit:
                        return True
            if len(entries) < size:
                return False
            low = f"({text(entries[-1][0])}"

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        count = await self._partition_count(stream)
        groups = await self._group_names(stream)
        removed: dict[int, int] = {}
        for partition, bound in up_to.items():
            keys = list(self._keys.partition(stream, partition))
            digests = ""
            if self._keys.summaries:
                keys.append(self._keys.digests(stream))
                digests = str(partition)
            for group in groups:
                keys.extend(self._keys.group(stream, group, partition).own())
            total = 0
            more = True
            while more:
                [reply] = await self._eval([(
                    "trim", keys,
                    [bound, _TRIM_CHUNK, "1" if count > 1 else "0", digests, *groups],
                )])
                done, more, ids = json.loads(reply)
                total += done
                if ids:
                    await self._io(self._client.hdel(self._keys.ids(stream), *ids))
            removed[partition] = total
        if self._keys.summaries and groups:
            # A trim may release a key-ordered group's next deliveries: each group's next
            # fetch visits the partitions trimmed (the trim script takes no summary).
            pipe = self._client.pipeline(transaction=False)
            for group in groups:
                pipe.zadd(self._keys.summary_keys(stream, group)[0],
                          {str(partition): 0 for partition in up_to})
            await self._io(pipe.execute())
        # A trim may release a key-ordered group's next deliveries (see above).
        await self._note_work(stream, groups, up_to, fresh=False)
        return removed
