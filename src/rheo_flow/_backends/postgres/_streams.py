"""Streams of the PostgreSQL backend: creating and describing them, appending, reading.

An append is one statement (``append`` in ``statements.sql``) that numbers the
events gaplessly under the partition row locks and sends one ``NOTIFY`` for the
whole batch. Event ids are unique per stream: an append that meets ids already
stored returns those events and appends the rest.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import orjson

from ..._backend import AppendRecord
from ..._model._errors import BackendError, ConflictError, InvalidArgument, UnknownStream
from ..._model._event import Event, decode_json, make_event_json
from ..._model._query import Query
from ..._model._stream import Retention, StreamInfo
from ..._support._call_retry import retried
from .._shared import query_window
from ._core import PostgresCore, StreamMeta
from ._listener import scheduled_payload
from ._pool import Fetches, PoolCalls
from ._sql import BIGINT_MAX

if TYPE_CHECKING:
    import asyncpg

__all__ = ["StreamOps", "event_of"]

_APPEND_ATTEMPTS: Final = 5
"""Tries of an append whose ids keep being stored by racing appends meanwhile (the first
included)."""


def event_of(stream: str, row: Any) -> Event:
    """An event from a row of the event columns (``part, seq, event_id, ...``)."""
    part, seq, event_id, type_, key, data, headers, appended_at_ms = row
    return make_event_json(stream, part, seq, event_id, type_, data, key,
                           decode_json(headers) if headers is not None else {}, appended_at_ms)


class _DuplicateId(Exception):
    """The append's answer that some id is stored already (functions/append_guarded.sql
    answers it instead of raising the unique violation): the caller looks the stored ids
    up and appends the others."""


def _duplicate_id(exc: BaseException) -> bool:
    """Whether ``exc`` is an append meeting an event id already stored."""
    return isinstance(exc, _DuplicateId)


def _check_records(stream: str, meta: StreamMeta, records: Sequence[AppendRecord]) -> None:
    for r in records:
        if "\x00" in r.id or "\x00" in r.type or (r.key is not None and "\x00" in r.key):
            raise InvalidArgument(
                "PostgreSQL cannot store NUL characters in event ids, types or keys"
            )
        if not 0 <= r.partition < meta.partitions:
            raise InvalidArgument(
                f"partition {r.partition} is out of range: stream {stream!r} has "
                f"partitions 0..{meta.partitions - 1}"
            )


class StreamOps(PostgresCore):
    """Stream operations: create, describe, list, append, query."""

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        pool = await self._ready()
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(self._sql.insert_stream, name, partitions)
            if row is not None:
                await conn.execute(self._sql.insert_partitions, row[0], partitions)
            else:
                [row] = await conn.fetch(self._sql.stream, name)
                if row[1] != partitions:
                    raise ConflictError(
                        f"stream {name!r} exists with {row[1]} partitions, not {partitions}"
                    )
            meta = StreamMeta(row[0], row[1], row[2])
            info = await self._info(conn, name, meta)
        self._streams[name] = meta
        return info

    async def _info(self, conn: asyncpg.Connection | PoolCalls, name: str,
                    meta: StreamMeta) -> StreamInfo:
        rows = await conn.fetch(self._sql.partitions, meta.id)
        return StreamInfo(
            name=name,
            partitions=meta.partitions,
            created_at_ms=meta.created_at_ms,
            high_water={r[0]: r[1] for r in rows},
            low_water={r[0]: r[2] for r in rows},
            retention=Retention.from_ms(rows[0][3], rows[0][4]) if rows else None,
        )

    async def stream_info(self, name: str) -> StreamInfo:
        meta = await self._stream(name)
        return await self._info(await self._ready(), name, meta)

    async def list_streams(self) -> list[str]:
        pool = await self._ready()
        rows = await pool.fetch(self._sql.list_streams)
        return [r[0] for r in rows]

    # Appending ---------------------------------------------------------------

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        meta = await self._stream(stream)
        if not records:
            return []
        _check_records(stream, meta, records)
        return await self._append_records(await self._ready(), stream, meta, records)

    async def append_in_transaction(self, connection: Any, stream: str,
                                    records: Sequence[AppendRecord]) -> list[Event]:
        """:meth:`append` on the application's asyncpg or psycopg ``connection``, in its open
        transaction: the same statement (its ``NOTIFY`` is delivered at that
        transaction's commit, dropped at its rollback) inside a function whose
        exception block is a subtransaction (functions/append_guarded.sql), so that ids
        already stored leave the transaction usable, in one round trip. The rows of
        the partitions appended to stay locked until the transaction ends."""
        meta = await self._stream(stream)
        caller = await self._check_caller(connection, "append")
        if not records:
            return []
        _check_records(stream, meta, records)
        return await self._append_records(caller, stream, meta, records)

    async def _append_records(self, pool: Fetches, stream: str, meta: StreamMeta,
                              records: Sequence[AppendRecord]) -> list[Event]:
        # Repeated ids within one batch: the first occurrence is appended, the later
        # ones return the same event (as the reference backend does).
        first: dict[str, int] = {}
        for i, r in enumerate(records):
            first.setdefault(r.id, i)
        unique = [records[i] for i in sorted(first.values())]
        stored = await self._append_unique(pool, stream, meta, unique)
        return [stored[r.id] for r in records]

    async def _append_unique(self, pool: Fetches, stream: str, meta: StreamMeta,
                             records: list[AppendRecord]) -> dict[str, Event]:
        """The events of ``records`` (distinct ids) by id, appending those not stored yet."""
        stored: dict[str, Event] = {}

        async def append_fresh(attempt: int) -> None:
            fresh = [r for r in records if r.id not in stored]
            if fresh:
                await self._append_fresh(pool, stream, meta, fresh, stored)

        try:
            await retried(append_fresh, when=_duplicate_id, attempts=_APPEND_ATTEMPTS)
        except Exception as exc:
            if not _duplicate_id(exc):
                raise
            raise BackendError(
                f"append to {stream!r} kept conflicting with concurrent appends of the same ids"
            ) from None
        return stored

    async def _append_fresh(self, pool: Fetches, stream: str, meta: StreamMeta,
                            records: list[AppendRecord], stored: dict[str, Event]) -> None:
        """Append ``records`` into ``stored``; when some ids turn out to be stored already
        (a retried append, or a racing one), look those up and raise for another try."""
        try:
            stored.update(await self._insert_events(pool, stream, meta, records))
        except Exception as exc:
            if _duplicate_id(exc):
                stored.update(await self._stored_events(pool, stream, meta,
                                                        [r.id for r in records]))
            raise

    async def _insert_events(self, pool: Fetches, stream: str, meta: StreamMeta,
                             records: list[AppendRecord]) -> dict[str, Event]:
        if len(records) == 1:
            return await self._insert_one(pool, stream, meta, records[0])
        # Columns that are NULL for every event travel as one NULL (ROWS FROM
        # pads the shorter columns with NULLs).
        heads = ([_headers_text(r.headers) for r in records]
                 if any(r.headers for r in records) else None)
        keys = [r.key for r in records]
        try:
            ids = orjson.dumps([r.id for r in records]).decode()
            types = orjson.dumps([r.type for r in records]).decode()
            key_list = (orjson.dumps(keys).decode() if any(k is not None for k in keys)
                        else None)
        except TypeError:  # orjson refuses text that is not valid Unicode
            raise InvalidArgument(_NOT_UNICODE) from None
        deliver_at = None
        payload = stream
        if any(r.deliver_at_ms is not None for r in records):
            await self._mark_scheduled(meta)
            deliver_at = "{" + ",".join(["NULL" if r.deliver_at_ms is None
                                         else str(r.deliver_at_ms) for r in records]) + "}"
            payload = scheduled_payload(stream, records)
        [row] = await pool.fetch(
            self._sql.append, meta.id,
            "{" + ",".join([str(r.partition) for r in records]) + "}", ids, types, key_list,
            "[" + ",".join([r.data_json for r in records]) + "]", heads, self._channel, payload,
            deliver_at,
        )
        at, seqs, duplicate = row[0], row[1], row[2]
        if duplicate:
            raise _DuplicateId("an event id of the append is stored already")
        # data is decoded from its JSON text on first access: the stored events
        # share nothing with the caller's objects.
        return {
            r.id: make_event_json(stream, r.partition, seq, r.id, r.type, r.data_json, r.key,
                                  dict(r.headers) if r.headers else {}, at)
            for r, seq in zip(records, seqs, strict=True)
        }

    async def _insert_one(self, pool: Fetches, stream: str, meta: StreamMeta,
                          record: AppendRecord) -> dict[str, Event]:
        """:meth:`_insert_events` of one event: ``append_one``, no subtransaction."""
        try:
            orjson.dumps((record.id, record.type, record.key))  # the batch's Unicode check
        except TypeError:
            raise InvalidArgument(_NOT_UNICODE) from None
        payload = stream
        if record.deliver_at_ms is not None:
            await self._mark_scheduled(meta)
            payload = scheduled_payload(stream, [record])
        headers = record.headers
        [row] = await pool.fetch(
            self._sql.append_one, meta.id, record.partition, record.id, record.type, record.key,
            record.data_json, _headers_text(headers),
            self._channel, payload, record.deliver_at_ms,
        )
        at, seq, duplicate = row[0], row[1], row[2]
        if duplicate:
            raise _DuplicateId("the event id of the append is stored already")
        if seq is None:
            raise UnknownStream(stream)
        return {record.id: make_event_json(stream, record.partition, seq, record.id,
                                           record.type, record.data_json, record.key,
                                           dict(headers) if headers else {}, at)}

    async def _mark_scheduled(self, meta: StreamMeta) -> None:
        """Flag the stream as holding scheduled events, committed before they are
        appended (on a connection of the backend's own, even for an append in the
        application's transaction: the flag only makes fetches look for them)."""
        if meta.id not in self._scheduled_streams:
            await (await self._ready()).fetch(self._sql.mark_scheduled, meta.id)
            self._scheduled_streams.add(meta.id)

    async def scheduled(self, stream: str, after: Mapping[int, int]) -> dict[int, int]:
        meta = await self._stream(stream)
        parts = sorted(after)
        rows = await (await self._ready()).fetch(
            self._sql.scheduled_counts, meta.id, parts, [after[p] for p in parts])
        return {row[0]: row[1] for row in rows}

    async def _stored_events(self, pool: Fetches, stream: str, meta: StreamMeta,
                             ids: list[str]) -> dict[str, Event]:
        rows = await pool.fetch(self._sql.stored_events, meta.id, ids)
        return {row[2]: event_of(stream, row) for row in rows}

    # Reading -----------------------------------------------------------------

    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        meta = await self._stream(query.stream)
        pool = await self._ready()
        info = await self._info(pool, query.stream, meta)
        filters = (query.key, query.type, _clamp(query.since_ms), _clamp(query.until_ms))
        parts = range(meta.partitions) if query.partitions is None else sorted(query.partitions)
        out: list[Event] = []
        for part in parts:
            window = query_window(
                query, part, after, info.low_water[part], info.high_water[part])
            if window is None:
                continue
            lo, hi = window
            rows = await pool.fetch(self._sql.query_events, meta.id, part, lo, hi,
                                    limit - len(out), *filters)
            out.extend(event_of(query.stream, row) for row in rows)
            if len(out) >= limit:
                break
        return out


def _clamp(ms: int | None) -> int | None:
    """A time bound of a query as a ``bigint`` parameter."""
    return min(ms, BIGINT_MAX) if isinstance(ms, int) else ms


_NOT_UNICODE: Final = "event ids, types and keys must be valid Unicode text"


def _headers_text(headers: Mapping[str, str] | None) -> str | None:
    """An event's headers as the JSON text the append stores (``None``: none)."""
    return json.dumps(headers, separators=(",", ":"), ensure_ascii=False) if headers else None
