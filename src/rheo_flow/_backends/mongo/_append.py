"""Appending: per-partition sequences, idempotent on event ids, in one of two ways.

With transactions (replica sets, sharded clusters) sequences are allocated with
``$inc`` on the partitions' counters and the events inserted in one
multi-document transaction: a batch is atomic and sequences stay gapless even
if the process dies halfway. A standalone server has no transactions; there the
events are inserted at the next free sequences directly (the unique index turns
a race into a retry) and the counters follow with ``$max``, which keeps
sequences gapless but makes a batch only as atomic as its retry: an interrupted
append may leave a prefix of its batch stored, and repeating it with the same
event ids completes it.

Either way an append notes the partitions it appended to in the work summary of
every group of the stream twice: before its sequences become visible (before the
commit, or before the counters move) and after (see ``_summary`` for why both).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, TypeVar

from pymongo import DESCENDING, ReturnDocument, UpdateOne
from pymongo import errors as mongo_errors

from ..._backend import AppendRecord
from ..._model._errors import UnknownStream
from ..._model._event import Event
from ..._support._call_retry import retried
from ._client import resolve
from ._core import MongoCore
from ._delay import mark
from ._documents import event_document, event_of, partition_id
from ._errors import is_duplicate, is_transient
from ._summary import note

__all__ = ["AppendOps"]

T = TypeVar("T")

_APPEND_BUDGET_S: Final = 30.0
"""How long an append keeps retrying write conflicts before giving up."""


class AppendOps(MongoCore):
    """``append``, in a transaction when the server has them, else optimistically."""

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        await self._ready()
        records = list(records)
        # One append per stream at a time in this process: concurrent appends would
        # only fight over the same counters (write conflicts or sequence races).
        lock = self._append_locks.setdefault(stream, asyncio.Lock())
        async with lock:
            if any(r.deliver_at_ms is not None for r in records):
                await mark(self._streams, self._groups, stream)
            if self._transactions:
                events = await self._in_transaction(
                    lambda session, again: self._store_in(session, again, stream, records))
            else:
                events = await self._append_optimistic(stream, records)
            # The second note, after the sequences became visible (see _summary).
            await note(self._groups, stream, _tops(events))
        if records:
            self._waiters.wake(stream)
        return events

    async def _known(
        self, stream: str, records: list[AppendRecord], session: Any = None
    ) -> dict[str, Event]:
        """The events already stored under the ids of ``records``."""
        ids = list({r.id for r in records})
        query = {"st": stream, "id": ids[0] if len(ids) == 1 else {"$in": ids}}
        docs = await self._events.find(query, session=session).to_list(None)
        return {d["id"]: event_of(d) for d in docs}

    # With transactions -------------------------------------------------------

    async def _store_in(
        self, session: Any, again: bool, stream: str, records: list[AppendRecord]
    ) -> list[Event]:
        """The transaction's work: ``again`` when an earlier attempt failed."""
        if await self._streams.find_one({"_id": stream}, session=session) is None:
            raise UnknownStream(stream)
        if not records:
            return []
        known = await self._known(stream, records, session)
        fresh, counts = _plan(records, known)
        if not fresh:
            return _in_order(records, known)
        events = await self._insert_in(session, again, stream, fresh, counts)
        # The first note, before the commit makes the sequences visible (see _summary);
        # outside the transaction, which writes no group document.
        await note(self._groups, stream, _tops(events))
        return _in_order(records, known | {e.id: e for e in events})

    async def _insert_in(
        self, session: Any, again: bool, stream: str, fresh: list[AppendRecord],
        counts: Mapping[int, int],
    ) -> list[Event]:
        """Allocate the sequences of ``fresh`` and insert its events, in the transaction."""
        if again:
            # A counter behind the stored events (left by an append without
            # transactions that was interrupted) would collide for ever: catch it up.
            tops = await self._next_free(stream, sorted(counts), True, session)
            await self._raise_counters(stream, tops, session)
        first = await self._allocate(stream, counts, session)
        docs = _documents(stream, fresh, first, self._clock())
        await self._events.insert_many(docs, ordered=True, session=session)
        return [event_of(d) for d in docs]

    async def _allocate(
        self, stream: str, counts: Mapping[int, int], session: Any
    ) -> dict[int, int]:
        """Take ``counts[p]`` sequences of each partition's counter: the first one taken."""
        first: dict[int, int] = {}
        for p, count in sorted(counts.items()):
            doc = await self._partitions.find_one_and_update(
                {"_id": partition_id(stream, p)},
                {"$inc": {"hw": count}, "$setOnInsert": {"st": stream, "p": p, "lw": 1}},
                upsert=True, return_document=ReturnDocument.AFTER, session=session,
            )
            first[p] = doc["hw"] - count + 1
        return first

    async def _in_transaction(self, work: Callable[[Any, bool], Awaitable[T]]) -> T:
        """Run ``work(session, again)`` in a transaction, retrying write conflicts and
        duplicate keys (an id appended concurrently) for up to ``_APPEND_BUDGET_S``."""
        session = await resolve(self._client.start_session())
        try:
            return await retried(lambda attempt: _transact(session, work, attempt > 1),
                                 when=lambda e: is_transient(e) or is_duplicate(e),
                                 within_s=_APPEND_BUDGET_S)
        finally:
            await resolve(session.end_session())

    # Without transactions ----------------------------------------------------

    async def _append_optimistic(self, stream: str, records: list[AppendRecord]) -> list[Event]:
        """Append without transactions: insert at the next free sequences, then raise the counter.

        The unique (stream, partition, sequence) index makes a concurrent appender's
        insert fail instead of sharing a sequence; the loser recomputes the next free
        sequence from the events themselves and retries. Events are inserted in
        order, so the stored sequences of a partition always form a contiguous range.
        """
        await self._stream_doc(stream)
        if not records:
            return []
        events = await retried(
            lambda attempt: self._insert_next(stream, records, exact=attempt > 1),
            when=_lost_race, within_s=_APPEND_BUDGET_S)
        tops = _tops(events)
        # The first note, before the counters make the sequences visible (see _summary).
        await note(self._groups, stream, tops)
        await self._raise_counters(stream, tops)
        return events

    async def _insert_next(
        self, stream: str, records: list[AppendRecord], exact: bool
    ) -> list[Event]:
        """Insert the new records after the highest used sequences (``exact``: from the events)."""
        known = await self._known(stream, records)
        fresh, counts = _plan(records, known)
        if fresh:
            highs = await self._next_free(stream, sorted(counts), exact)
            docs = _documents(stream, fresh, {p: highs[p] + 1 for p in counts}, self._clock())
            await self._events.insert_many(docs, ordered=True)
            known.update((d["id"], event_of(d)) for d in docs)
        return _in_order(records, known)

    # Counters ----------------------------------------------------------------

    async def _raise_counters(
        self, stream: str, tops: Mapping[int, int], session: Any = None
    ) -> None:
        """Raise partition counters (high waters) to at least ``tops``."""
        await self._partitions.bulk_write([
            UpdateOne({"_id": partition_id(stream, p)},
                      {"$max": {"hw": top}, "$setOnInsert": {"st": stream, "p": p, "lw": 1}},
                      upsert=True)
            for p, top in sorted(tops.items())
        ], ordered=False, session=session)

    async def _next_free(
        self, stream: str, partitions: list[int], exact: bool, session: Any = None
    ) -> dict[int, int]:
        """The highest used sequence per partition: the counter, or the events when it lags."""
        highs = await self._highs(stream, partitions, session)
        if exact:
            # The counter lags after a lost race or an interrupted append. (One query at a
            # time: a transaction's session does not run operations concurrently.)
            for p in partitions:
                top = await self._events.find_one({"st": stream, "p": p}, {"n": 1},
                                                   sort=[("n", DESCENDING)], session=session)
                if top is not None:
                    highs[p] = max(highs[p], top["n"])
        return highs


async def _transact(
    session: Any, work: Callable[[Any, bool], Awaitable[T]], again: bool
) -> T:
    """One attempt: ``work`` in a transaction, committed, or aborted when it fails."""
    await resolve(session.start_transaction())
    try:
        result = await work(session, again)
        await session.commit_transaction()
        return result
    except BaseException:
        if session.in_transaction:
            with contextlib.suppress(mongo_errors.PyMongoError):
                await session.abort_transaction()
        raise


def _tops(events: Sequence[Event]) -> dict[int, int]:
    """The last sequence of each partition among ``events``."""
    tops: dict[int, int] = {}
    for event in events:
        tops[event.partition] = max(tops.get(event.partition, 0), event.sequence)
    return tops


def _lost_race(exc: BaseException) -> bool:
    """An insert that lost sequences to a concurrent appender (a duplicate ``_id``)."""
    return isinstance(exc, mongo_errors.BulkWriteError) and is_duplicate(exc)


def _plan(
    records: list[AppendRecord], known: Mapping[str, Event]
) -> tuple[list[AppendRecord], dict[int, int]]:
    """The records still to store (first occurrence of each new id) and counts per partition."""
    fresh: list[AppendRecord] = []
    counts: dict[int, int] = {}
    seen: set[str] = set()
    for r in records:
        if r.id in known or r.id in seen:
            continue
        seen.add(r.id)
        fresh.append(r)
        counts[r.partition] = counts.get(r.partition, 0) + 1
    return fresh, counts


def _documents(
    stream: str, fresh: list[AppendRecord], first: Mapping[int, int], now: int
) -> list[dict[str, Any]]:
    """Event documents for ``fresh``, numbered from ``first[partition]`` on."""
    nxt = dict(first)
    docs: list[dict[str, Any]] = []
    for r in fresh:
        docs.append(event_document(stream, r, nxt[r.partition], now))
        nxt[r.partition] += 1
    return docs


def _in_order(records: list[AppendRecord], stored: Mapping[str, Event]) -> list[Event]:
    """The stored event of each record, in the order of the records."""
    return [stored[r.id] for r in records]
