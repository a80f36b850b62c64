"""Stream records of the Redis backend: creating, describing, listing and deleting streams."""

from __future__ import annotations

from ..._model._errors import ConflictError, UnknownStream
from ..._model._stream import Retention, StreamInfo
from ._codec import stream_record, stream_retention, text
from ._work import WorkNotes

__all__ = ["StreamOperations"]


class StreamOperations(WorkNotes):
    """The stream operations of the contract."""

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        [record] = await self._eval([("create_stream", [self._keys.streams],
                                      [name, partitions])])
        count, created = stream_record(record)
        if count != partitions:
            raise ConflictError(
                f"stream {name!r} exists with {count} partitions, not {partitions}"
            )
        await self._mark(name, count, created)
        self._partitions[name] = count
        return await self._info(name, count, created, stream_retention(record))

    async def stream_info(self, name: str) -> StreamInfo:
        return await self._info(name, *await self._stream_record_with_retention(name))

    async def set_retention(self, stream: str, retention: Retention | None) -> None:
        age = "" if retention is None or retention.max_age_ms is None else retention.max_age_ms
        events = "" if retention is None or retention.max_events is None else (
            retention.max_events)
        [done] = await self._eval([("set_retention", [self._keys.streams],
                                    [stream, age, events])])
        if not int(done):
            raise UnknownStream(stream)

    async def _info(self, name: str, count: int, created: int,
                    retention: Retention | None) -> StreamInfo:
        pipe = self._client.pipeline(transaction=False)
        for p in range(count):
            pipe.hmget(self._keys.partition(name, p).meta, "hw", "lw")
        rows = await self._io(pipe.execute())
        high = {p: int(hw or 0) for p, (hw, _) in enumerate(rows)}
        low = {p: int(lw or 1) for p, (_, lw) in enumerate(rows)}
        return StreamInfo(name, count, created, high, low, retention)

    async def list_streams(self) -> list[str]:
        names = await self._io(self._client.hkeys(self._keys.streams))
        return sorted(text(n) for n in names)

    async def _blob_keys(self, stream: str, count: int) -> list[str]:
        """The blobs of the stream's large events, and their lists (``append_many.lua``)."""
        pipe = self._client.pipeline(transaction=False)
        for p in range(count):
            pipe.smembers(f"{self._keys.tag(stream, p)}:bs")
        keys: list[str] = []
        for p, tokens in enumerate(await self._io(pipe.execute())):
            tag = self._keys.tag(stream, p)
            keys.append(f"{tag}:bs")
            keys.extend(f"{tag}:b:{text(token)}" for token in tokens)
        return keys

    async def delete_stream(self, stream: str) -> None:
        count, _ = await self._stream_record(stream)
        groups = await self._group_names(stream)
        layout = self._keys
        keys = [layout.groups(stream), layout.ids(stream), layout.pauses(stream),
                layout.signal(stream)]
        if layout.summaries:
            keys.append(layout.digests(stream))
            keys.extend(await self._blob_keys(stream, count))
        if layout.summaries:
            for group in groups:
                keys.extend(layout.summary_keys(stream, group))
        elif self._cluster:
            keys.extend(layout.work_keys(stream))
            for group in groups:
                keys.extend(layout.work_keys(stream, group)[2:])
        for p in range(count):
            keys.extend((*layout.partition(stream, p), layout.times(stream, p)))
            for group in groups:
                keys.extend(layout.group(stream, group, p).own())
        if self._cluster:
            # The keys live in many slots: the record goes first, so no reader
            # sees a stream record whose partitions are gone.
            await self._io(self._client.hdel(layout.streams, stream))
            await self._io(self._client.unlink(*keys))
        else:
            # One MULTI/EXEC: no reader sees a stream record whose partitions are gone.
            pipe = self._client.pipeline(transaction=True)
            pipe.unlink(*keys)
            pipe.hdel(layout.streams, stream)
            await self._io(pipe.execute())
        self._forget(stream, None)
