"""Fetching leases from the Redis backend, and the Redis consumers fetches create.

A fetch is one round trip: one ``fetch.lua`` call per partition, pipelined, each
followed by an ``XRANGE`` of the entries past where the last fetch left the group's
cursor. The script leases an unordered group's new deliveries as a range without reading
them; the ``XRANGE`` reads them, its reply parsed as the server sent it (no dict per
entry). When it missed them (the first fetch of a partition, or another consumer moved
the cursor) one more round trip reads them. A fetch whose partitions turn out uneven may
take another round to fill its limit.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from typing import Any, Final, TypeAlias

import orjson

from ..._model._errors import BackendError, UnknownGroup
from ..._model._lease import Lease
from .._shared import round_robin
from ._codec import fetched_leases, range_leases
from ._core import RedisCore
from ._scripts import LOST, Read, ScriptCall, is_reply

__all__ = ["FetchOperations"]

_MAX_TRACKED_CONSUMERS: Final = 10_000
_FORGET_CHUNK: Final = 500
"""How many consumer names one ``forget_consumers`` call takes."""
_FILL_ROUNDS: Final = 8
"""How many more round trips a fetch makes to top up a batch the first round left short."""
_Missed: TypeAlias = tuple[int, str, int, int, int]
"""A range of new deliveries a fetch round's reads did not hold: partition, block token,
deadline, first and last sequence."""
_MAX_CURSORS: Final = 4096
"""How many (stream, group, partition) cursors a backend remembers (see ``_cursor_at``)."""
_SCAN_ROUNDS: Final = 8
"""How many more round trips a fetch makes for key-ordered partitions whose scan stopped
at its budget (``fetch.lua`` reads at most the quota plus 1,000 events per call)."""


class FetchOperations(RedisCore):
    """``fetch``, and forgetting the Redis consumers it created."""

    async def fetch(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> list[Lease]:
        leases, _ = await self._fetch_with(stream, group, consumer_id, limit, lease_ms,
                                           partitions, [])
        return leases

    async def _fetch_with(
        self, stream: str, group: str, consumer_id: str, limit: int, lease_ms: int,
        partitions: Sequence[int] | None, first: list[ScriptCall],
    ) -> tuple[list[Lease], list[Any]]:
        """A fetch whose first round trip also runs the calls ``first`` (before its
        own); their replies. They run even when there is no partition to fetch from."""
        count = await self._partition_count(stream)
        ids = list(range(count)) if partitions is None else list(partitions)
        if not ids:
            return [], await self._eval(first)
        self._track_consumer(stream, group, consumer_id)
        ids = self._rotation.order((stream, group), ids)
        per: dict[int, list[Lease]] = {}
        left: dict[int, int] = {}
        scan: set[int] = set()
        replies = await self._fetch_round(
            stream, group, consumer_id, lease_ms,
            list(zip(ids, _shares(limit, len(ids)), strict=True)), per, left, scan, first)
        # A round can come back short where a key-ordered partition's unread events
        # were blocked: top up from the partitions that still report work, until the
        # batch is full or none does (each round leases or reads past blocked events).
        for _ in range(_FILL_ROUNDS):
            got = sum(len(v) for v in per.values())
            if got >= limit or len(ids) <= 1 or not await self._fill_up(
                    stream, group, consumer_id, lease_ms, limit - got, ids, per, left, scan):
                break
        if scan:
            await self._scan_on(stream, group, consumer_id, lease_ms, limit, per, left, scan)
        lists = [per[p] for p in ids if per.get(p)]
        if len(lists) <= 1:
            return (lists[0] if lists else []), replies
        # Round-robin across partitions, each in sequence order.
        sizes = [len(x) for x in lists]
        return [lists[i][depth] for i, depth in round_robin(sizes, sum(sizes))], replies

    async def _fill_up(
        self, stream: str, group: str, consumer_id: str, lease_ms: int, wanted: int,
        ids: Sequence[int], per: dict[int, list[Lease]], left: dict[int, int],
        scan: set[int],
    ) -> bool:
        """Another round of an uneven fetch: ``wanted`` more leases, from the
        partitions the last round says still have some; False when none has."""
        more = [p for p in ids if left.get(p, 0) > 0]
        if not more:
            return False
        shares = _fill(wanted, [left[p] for p in more], [len(per.get(p, ())) for p in more])
        second = [(p, q) for p, q in zip(more, shares, strict=True) if q > 0]
        await self._fetch_round(stream, group, consumer_id, lease_ms, second, per, left, scan)
        # A partition's second round may hold redeliveries below its first
        # round's (each round takes the earliest due): keep sequence order.
        for p, _ in second:
            per.get(p, []).sort(key=_sequence_of)
        return True

    async def _scan_on(
        self, stream: str, group: str, consumer_id: str, lease_ms: int, limit: int,
        per: dict[int, list[Lease]], left: dict[int, int], scan: set[int],
    ) -> None:
        """Key-ordered partitions in ``scan`` stopped reading at their budget, passing
        over events of blocked keys: read on, a few more round trips at most, so a
        long run of one blocked key does not make a fetch come back short."""
        for _ in range(_SCAN_ROUNDS):
            wanted = limit - sum(len(v) for v in per.values())
            parts = sorted(scan)
            scan.clear()
            if wanted <= 0 or not parts:
                return
            quotas = [(p, q) for p, q in zip(parts, _shares(wanted, len(parts)), strict=True)
                      if q > 0]
            await self._fetch_round(stream, group, consumer_id, lease_ms, quotas, per, left,
                                    scan)
            for p, _ in quotas:
                per.get(p, []).sort(key=_sequence_of)

    async def _fetch_round(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        lease_ms: int,
        quotas: Sequence[tuple[int, int]],
        per: dict[int, list[Lease]],
        left: dict[int, int],
        scan: set[int],
        first: Sequence[ScriptCall] = (),
    ) -> list[Any]:
        """One round trip: up to ``quota`` leases from each partition into ``per``;
        ``left`` gets how many more each partition has due, ``scan`` the key-ordered
        partitions whose scan stopped at its budget. The calls ``first`` run before
        the fetch's own in the same round trip: their replies."""
        token = os.urandom(8).hex()
        cursors = self._cursors
        calls: list[ScriptCall] = []
        reads: list[Read] = []
        read_for: dict[int, int] = {}
        for p, quota in quotas:
            keys = self._keys.group(stream, group, p)
            calls.append(("fetch", keys, [group, consumer_id, quota, lease_ms, f"{token}.{p}.",
                                          f"{token}.{p}"]))
            # The new deliveries start past the group's cursor: read from where the last
            # fetch left it, in the same round trip (right unless another one moved it).
            at = cursors.get((stream, group, p))
            if at is not None:
                read_for[p] = len(reads)
                reads.append(("XRANGE", keys[0], f"{at + 1}-0", "+", "COUNT", quota))
        replies, entries = await self._scripts.run_and_read([*first, *calls], reads)
        before = replies[:len(first)]
        del replies[:len(first)]
        missed: list[_Missed] = []
        for (p, _), reply in zip(quotas, replies, strict=True):
            index = read_for.get(p)
            self._take(stream, group, consumer_id, p, f"{token}.{p}", reply,
                       None if index is None else entries[index], per, left, scan, missed)
        if missed:
            await self._read_missed(stream, group, consumer_id, missed, per)
        return before

    def _take(
        self, stream: str, group: str, consumer_id: str, p: int, block: str, reply: Any,
        entries: Any, per: dict[int, list[Lease]], left: dict[int, int], scan: set[int],
        missed: list[_Missed],
    ) -> None:
        """One partition's fetch reply (and the entries read past the cursor, if any):
        its leases into ``per``; ``missed`` gets its range of new deliveries when
        ``entries`` do not hold it."""
        if is_reply(reply, "NOGROUP"):
            raise UnknownGroup(stream, group)
        if is_reply(reply, LOST):
            raise self._lost(stream)
        if is_reply(reply, "AGAIN"):
            # A resent call that had already run: its leases went unanswered and
            # expire; fetch again for this partition.
            left[p] = 1
            return
        head = orjson.loads(reply[0])
        high = head[0]
        left[p] = head[1]
        seen = self._seen_for(stream)
        if high > seen[p]:
            seen[p] = high
        stale = self._stale.get(stream)
        if stale:
            stale.discard(p)
        more, first, last, cursor = head[5:9]
        if more:
            scan.add(p)
        self._cursor_at(stream, group, p, cursor)
        got = per.setdefault(p, [])
        if head[4]:
            got.extend(fetched_leases(stream, p, group, consumer_id, block, head, reply[1:]))
        if first:
            leases = None if entries is None else range_leases(
                stream, p, group, consumer_id, block, head[2], entries, first, last)
            if leases is None:
                missed.append((p, block, head[2], first, last))
            else:
                got.extend(leases)

    async def _read_missed(
        self, stream: str, group: str, consumer_id: str,
        missed: Sequence[_Missed], per: dict[int, list[Lease]],
    ) -> None:
        """Read the new deliveries the round's reads did not hold (no cursor known yet,
        or another fetch had moved it) in one more round trip. An entry trimmed since
        its fetch is gone: its lease is not returned (trim settled it)."""
        reads: list[Read] = [
            ("XRANGE", self._keys.partition(stream, p)[0], f"{first}-0", f"{last}-0")
            for p, _, _, first, last in missed]
        for (p, block, deadline, first, last), entries in zip(
                missed, await self._scripts.read(reads), strict=True):
            per[p].extend(range_leases(stream, p, group, consumer_id, block, deadline, entries,
                                       first, last, whole=False) or ())

    def _cursor_at(self, stream: str, group: str, partition: int, cursor: int) -> None:
        """Remember where a fetch left the group's cursor (-1: a key-ordered group, whose
        new deliveries come in the fetch's reply)."""
        cursors = self._cursors
        key = (stream, group, partition)
        if cursor < 0:
            cursors.pop(key, None)
            return
        if key not in cursors and len(cursors) >= _MAX_CURSORS:
            cursors.clear()
        cursors[key] = cursor

    def _track_consumer(self, stream: str, group: str, consumer_id: str) -> None:
        names = self._consumers.setdefault((stream, group), set())
        if consumer_id not in names and self._tracked < _MAX_TRACKED_CONSUMERS:
            names.add(consumer_id)
            self._tracked += 1

    async def _forget_consumers(self) -> None:
        """Delete the Redis consumers fetches created that hold nothing (best effort)."""
        used, self._consumers, self._tracked = self._consumers, {}, 0
        calls: list[ScriptCall] = []
        for (stream, group), names in used.items():
            count = self._partitions.get(stream, 0)
            ordered = sorted(names)
            for start in range(0, len(ordered), _FORGET_CHUNK):
                chunk = ordered[start:start + _FORGET_CHUNK]
                calls.extend(("forget_consumers", [self._keys.partition(stream, p)[0]],
                              [group, *chunk]) for p in range(count))
        with contextlib.suppress(BackendError):
            await self._eval(calls)


def _shares(total: int, parts: int) -> list[int]:
    """``total`` split as evenly as possible over ``parts`` (the first ones get more)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def _fill(total: int, capacity: Sequence[int], have: Sequence[int]) -> list[int]:
    """Share ``total`` over slots of the given capacities that already hold ``have``:
    one at a time to the lowest slots first (in order on a tie), as the turns of one
    fetch would have taken them."""
    shares = [0] * len(capacity)
    while total > 0:
        open_ = [i for i, c in enumerate(capacity) if shares[i] < c]
        if not open_:
            break
        level = min(have[i] + shares[i] for i in open_)
        for i in open_:
            if total == 0:
                break
            if have[i] + shares[i] == level:
                shares[i] += 1
                total -= 1
    return shares


def _sequence_of(lease: Lease) -> int:
    return lease.event.sequence
