"""Fetching leases from the Redis backend, and the Redis consumers fetches create.

A fetch is one round trip. On standalone Redis, a fetch of a stream of several partitions
is one ``fetch_many.lua`` call: it finds the partitions with work in the group's
summaries (stream-level keys every script keeps exact) and puts the limit where the work
is, so its cost follows the partitions with work, not the partition count (every few
seconds one call rewrites the summaries from every partition first, see ``_SWEEP_S``).
On a Cluster, whose partitions live in many slots, a fetch of several partitions first
reads the group's summary in its own slot (``_work``: one ``work.lua`` call), then
visits only the partitions it names, and writes back what it found when that differs;
every ``_SWEEP_S`` seconds it visits every partition instead. A visit (and a fetch of
one partition) is one ``fetch.lua`` call per partition, pipelined (one round trip per
primary), each followed by an ``XRANGE`` of the entries past where the last fetch left
the group's cursor. The script leases an
unordered group's new deliveries as a range without reading them; the ``XRANGE`` reads
them, its reply parsed as the server sent it (no dict per entry). When it missed them
(the first fetch of a partition, or another consumer moved the cursor) one more round
trip reads them. ``fetch_many`` does the same for the partitions that had new
deliveries in this backend's last fetch, and reads the others' itself. A fetch whose
partitions turn out uneven may take another round to fill its limit.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from ..._model._errors import BackendError, UnknownGroup
from ..._model._lease import Lease
from ..._support._collector import collector_paused
from .._shared import round_robin
from ._codec import FetchReply, fetch_reply, fetched_leases, range_leases, text
from ._scripts import LOST, Read, ScriptCall, is_reply
from ._work import Planned, WorkNotes, plan_of

__all__ = ["FetchOperations"]

_MAX_TRACKED_CONSUMERS: Final = 10_000
_FORGET_CHUNK: Final = 500
"""How many consumer names one ``forget_consumers`` call takes."""
_FILL_ROUNDS: Final = 8
"""How many more round trips a fetch makes to top up a batch the first round left short."""
_MAX_CURSORS: Final = 4096
"""How many (stream, group, partition) cursors a backend remembers (see ``_cursor_at``)."""
_SWEEP_S: Final = 5.0
"""How long a backend trusts the summaries after its last fetch that rewrote them from
every partition of the group (its first fetch of the group does). Every script of this
release keeps them exact; the rewrite is the net for writes of a release that did not
(a rolling upgrade) and for a trim's follow-up that failed: their work is found within
this time."""
_clock = time.monotonic
"""The clock of ``_SWEEP_S`` (tests replace it)."""
_BUSY_READS: Final = 8
"""At most how many partitions' new deliveries a summary fetch reads itself (as many as
it took from each last time, and at least an even share of the limit)."""
_SCAN_ROUNDS: Final = 8
"""How many more round trips a fetch makes for key-ordered partitions whose scan stopped
at its budget (``fetch.lua`` reads at most the quota plus 1,000 events per call)."""


class _Missed(NamedTuple):
    """A range of new deliveries a fetch round's reads did not hold."""

    partition: int
    block: str
    """The block token of the fetch that leased them."""
    deadline: int
    first: int
    last: int


@dataclass(slots=True)
class _Harvest:
    """One fetch: what it asks for, and what its round trips gathered so far.

    ``leases`` holds each partition's leases in sequence order; ``due`` how many more
    each partition reported due in its last round; ``unscanned`` the key-ordered
    partitions whose scan stopped at its budget (they have more to read); ``missed``
    the ranges of new deliveries the current round's reads did not hold.
    """

    stream: str
    group: str
    consumer_id: str
    limit: int
    lease_ms: int
    order: list[int]
    """The partitions, in the order this fetch serves them."""
    leases: dict[int, list[Lease]] = field(default_factory=dict)
    due: dict[int, int] = field(default_factory=dict)
    unscanned: set[int] = field(default_factory=set)
    missed: list[_Missed] = field(default_factory=list)
    report: bool = False
    """Whether the partition calls report their exact summary (a planned fetch)."""
    found: dict[int, tuple[int, bool]] = field(default_factory=dict)
    """Per partition visited, the exact summary its last call reported (earliest due
    delivery, 0: none; whether events are past the cursor)."""

    def wanted(self) -> int:
        """How many more leases the fetch may take."""
        return self.limit - sum(map(len, self.leases.values()))

    def of(self, partition: int) -> list[Lease]:
        """The leases gathered from ``partition`` (the list to add to)."""
        got = self.leases.get(partition)
        if got is None:
            got = self.leases[partition] = []
        return got

    def batch(self) -> list[Lease]:
        """The fetch's result: round-robin across partitions, each in sequence order."""
        lists = [self.leases[p] for p in self.order if self.leases.get(p)]
        for got in lists:
            # One call may return a partition's redeliveries before events replayed
            # below them (a replay or reset moved its cursor back): sorted here, once.
            # Already in order, the sort is one pass.
            got.sort(key=_sequence_of)
        if len(lists) <= 1:
            return lists[0] if lists else []
        sizes = [len(x) for x in lists]
        return [lists[i][depth] for i, depth in round_robin(sizes, sum(sizes))]


class FetchOperations(WorkNotes):
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
        harvest = _Harvest(stream, group, consumer_id, limit, lease_ms,
                           self._rotation.order((stream, group), ids),
                           report=self._cluster and count > 1)
        planned: Planned | None = None
        if count > 1 and (self._keys.summaries or self._cluster):
            started = _clock()
            resync = started - self._swept.get((stream, group), -_SWEEP_S) >= _SWEEP_S
            if self._cluster:
                replies, planned = await self._fetch_planned(harvest, count, first, resync)
                resync = planned.full
            else:
                replies = await self._fetch_summarized(harvest, count, first, resync)
            if resync:
                self._swept[(stream, group)] = started
        else:
            replies = await self._fetch_round(
                harvest, list(zip(harvest.order, _shares(limit, len(ids)), strict=True)), first)
        # A round can come back short where a key-ordered partition's unread events
        # were blocked: top up from the partitions that still report work, until the
        # batch is full or none does (each round leases or reads past blocked events).
        for _ in range(_FILL_ROUNDS):
            if harvest.wanted() <= 0 or len(ids) <= 1 or not await self._fill_up(harvest):
                break
        if harvest.unscanned:
            await self._scan_on(harvest)
        if planned is not None:
            call = self._found_call(stream, group, planned, harvest.found, count)
            if call is not None:
                await self._write_work(stream, call)
        leases = harvest.batch()
        await self._fill_blobs(stream, [lease.event for lease in leases])
        return leases, replies

    async def _fetch_summarized(self, harvest: _Harvest, count: int,
                                first: Sequence[ScriptCall], resync: bool) -> list[Any]:
        """One round trip of ``fetch_many.lua`` (see the module docstring), with the calls
        ``first`` before it and the reads of the partitions that had new deliveries last
        time; the replies of ``first``. With ``resync`` the script first rewrites the
        summaries from every partition."""
        stream, group, order = harvest.stream, harvest.group, harvest.order
        whole = len(order) == count
        at = self._cursors
        asked = set(order)
        busy = [(p, took) for p, took in self._busy.get((stream, group), ())
                if p in asked and (stream, group, p) in at]
        # The partitions a wake-up knows no high water of: this fetch tells it theirs.
        seen, stale = self._seen_for(stream), self._stale.get(stream, ())
        unseen = [p for p in order if seen[p] < 0 or p in stale]
        reads: list[Read] = [
            ("XRANGE", self._keys.partition(stream, p).stream, f"{at[stream, group, p] + 1}-0",
             "+", "COUNT", min(max(took, -(-harvest.limit // len(busy))), harvest.limit))
            for p, took in busy]
        call: ScriptCall = ("fetch_many", self._keys.summary_keys(stream, group), [
            self._keys.tag_head(stream), group, harvest.consumer_id, harvest.limit,
            harvest.lease_ms, os.urandom(8).hex(), count,
            "" if whole else ",".join(map(str, order)), order[0] if whole else 0,
            ",".join(str(p) for p, _ in busy), "1" if resync else "0",
            ",".join(map(str, unseen))])
        replies, entries = await self._scripts.run_and_read([*first, call], reads)
        raw = replies.pop()
        if is_reply(raw, "NOGROUP"):
            raise UnknownGroup(stream, group)
        if is_reply(raw, LOST):
            raise self._lost(stream)
        self._seen_many(stream, text(raw[0]))
        took = self._take_many(harvest, raw[1:],
                               {p: got for (p, _), got in zip(busy, entries, strict=True)})
        if harvest.missed:
            await self._read_missed(harvest)
        self._busy[(stream, group)] = sorted(took.items(), key=lambda pair: -pair[1])[:_BUSY_READS]
        return replies

    async def _fetch_planned(self, harvest: _Harvest, count: int,
                             first: Sequence[ScriptCall], resync: bool
                             ) -> tuple[list[Any], Planned]:
        """A Cluster's fetch (see ``_work``): the plan, with the calls ``first`` and the
        high waters the wake-ups lack in the same round trip, then one round trip to
        the partitions with work. A resync (or a summary never written in full) visits
        every partition instead, those not asked for with a quota of 0. The replies of
        ``first``, and the plan."""
        stream, group, order = harvest.stream, harvest.group, harvest.order
        seen, stale = self._seen_for(stream), self._stale.get(stream, ())
        unseen = [p for p in order if seen[p] < 0 or p in stale]
        # Read before any lease: an append after it must still wake the client's wait.
        reads: list[Read] = [("HGET", self._keys.partition(stream, p).meta, "hw")
                             for p in unseen]
        replies, waters = await self._scripts.run_and_read(
            [*first, self._plan_call(stream, group)], reads)
        plan = plan_of(replies.pop())
        for p, high_water in zip(unseen, waters, strict=True):
            self._saw(stream, p, int(high_water or 0))
        full = resync or not plan.written
        if full:
            asked = set(order)
            quotas = [*zip(order, _shares(harvest.limit, len(order)), strict=True),
                      *((p, 0) for p in range(count) if p not in asked)]
        else:
            work = plan.with_work()
            busy = [p for p in order if p in work]
            quotas = list(zip(busy, _shares(harvest.limit, len(busy)), strict=True))
        if quotas:
            await self._fetch_round(harvest, quotas)
        return replies, Planned(plan, full)

    def _seen_many(self, stream: str, high_waters: str) -> None:
        """The high waters a ``fetch_many`` call read (``p=hw,...``), for the wake-ups."""
        if not high_waters:
            return
        for pair in high_waters.split(","):
            p, high_water = map(int, pair.split("="))
            self._saw(stream, p, high_water)

    def _saw(self, stream: str, p: int, high_water: int) -> None:
        """A fetch read partition ``p``'s high water: the wake-ups know it now."""
        seen = self._seen_for(stream)
        if high_water > seen[p]:
            seen[p] = high_water
        stale = self._stale.get(stream)
        if stale:
            stale.discard(p)

    def _take_many(self, harvest: _Harvest, raw: Sequence[Any], entries_of: dict[int, Any]
                   ) -> dict[int, int]:
        """The (partition, block token, reply) triples of a ``fetch_many`` reply into
        ``harvest``; how many new deliveries it took from each partition that had some."""
        took: dict[int, int] = {}
        visited: set[int] = set()
        again: set[int] = set()
        for i in range(0, len(raw), 3):
            p = int(raw[i])
            (again if p in visited else visited).add(p)
            reply = self._take(harvest, p, text(raw[i + 1]), raw[i + 2], entries_of.get(p))
            if reply is not None:
                new = len(reply.items) - reply.redelivered
                if reply.first:
                    new += reply.last - reply.first + 1
                if new:
                    took[p] = took.get(p, 0) + new
        for p in again:
            # A later call on the partition may lease redeliveries below an earlier one's.
            harvest.leases[p].sort(key=_sequence_of)
        return took

    async def _fill_up(self, harvest: _Harvest) -> bool:
        """Another round of an uneven fetch: the leases it still wants, from the
        partitions the last round says still have some; False when none has."""
        due = harvest.due
        more = [p for p in harvest.order if due.get(p, 0) > 0]
        if not more:
            return False
        shares = _fill(harvest.wanted(), [due[p] for p in more],
                       [len(harvest.leases.get(p, ())) for p in more])
        second = [(p, q) for p, q in zip(more, shares, strict=True) if q > 0]
        await self._fetch_round(harvest, second)
        return True

    async def _scan_on(self, harvest: _Harvest) -> None:
        """Key-ordered partitions whose scan stopped at its budget passed over events of
        blocked keys: read on, a few more round trips at most, so a long run of one
        blocked key does not make a fetch come back short."""
        for _ in range(_SCAN_ROUNDS):
            wanted = harvest.wanted()
            parts = sorted(harvest.unscanned)
            harvest.unscanned.clear()
            if wanted <= 0 or not parts:
                return
            quotas = [(p, q) for p, q in zip(parts, _shares(wanted, len(parts)), strict=True)
                      if q > 0]
            await self._fetch_round(harvest, quotas)

    async def _fetch_round(
        self, harvest: _Harvest, quotas: Sequence[tuple[int, int]],
        first: Sequence[ScriptCall] = (),
    ) -> list[Any]:
        """One round trip: up to ``quota`` leases from each partition into ``harvest``.
        The calls ``first`` run before the fetch's own in the same round trip: their
        replies."""
        stream, group = harvest.stream, harvest.group
        token = os.urandom(8).hex()
        cursors = self._cursors
        calls: list[ScriptCall] = []
        reads: list[Read] = []
        read_for: dict[int, int] = {}
        report = ("1",) if harvest.report else ()
        for p, quota in quotas:
            keys = self._keys.group(stream, group, p)
            calls.append(("fetch", self._keys.script_keys(stream, group, p),
                          [group, harvest.consumer_id, quota, harvest.lease_ms,
                           f"{token}.{p}.", f"{token}.{p}", *report]))
            # The new deliveries start past the group's cursor: read from where the last
            # fetch left it, in the same round trip (right unless another one moved it).
            at = cursors.get((stream, group, p))
            if at is not None and quota > 0:
                read_for[p] = len(reads)
                reads.append(("XRANGE", keys.stream, f"{at + 1}-0", "+", "COUNT", quota))
        replies, entries = await self._scripts.run_and_read([*first, *calls], reads)
        before = replies[:len(first)]
        del replies[:len(first)]
        for (p, _), reply in zip(quotas, replies, strict=True):
            index = read_for.get(p)
            self._take(harvest, p, f"{token}.{p}", reply,
                       None if index is None else entries[index])
        if harvest.missed:
            await self._read_missed(harvest)
        return before

    def _take(self, harvest: _Harvest, p: int, block: str, raw: Any, entries: Any
              ) -> FetchReply | None:
        """One partition's fetch reply (and the entries read past the cursor, if any):
        its leases into ``harvest``, or its range of new deliveries into
        ``harvest.missed`` when ``entries`` do not hold it. Its reply (None: ``AGAIN``)."""
        stream = harvest.stream
        if is_reply(raw, "NOGROUP"):
            raise UnknownGroup(stream, harvest.group)
        if is_reply(raw, LOST):
            raise self._lost(stream)
        if is_reply(raw, "AGAIN"):
            # A resent call that had already run: its leases went unanswered and
            # expire; fetch again for this partition.
            harvest.due[p] = 1
            return None
        reply = fetch_reply(raw)
        harvest.due[p] = reply.still_due
        if reply.fresh >= 0:
            harvest.found[p] = (reply.earliest, reply.fresh == 1)
        self._saw(stream, p, reply.high_water)
        if reply.more:
            harvest.unscanned.add(p)
        self._cursor_at(stream, harvest.group, p, reply.cursor)
        got = harvest.of(p)
        with collector_paused():
            if reply.items:
                got.extend(fetched_leases(stream, p, harvest.group, harvest.consumer_id,
                                          block, reply, raw[1:]))
            first, last = reply.first, reply.last
            leases = None if entries is None or not first else range_leases(
                stream, p, harvest.group, harvest.consumer_id, block, reply.deadline,
                entries, first, last)
        if first:
            if leases is None:
                harvest.missed.append(_Missed(p, block, reply.deadline, first, last))
            else:
                self._issued.register(stream, harvest.group, p, block, first, leases)
                got.extend(leases)
        return reply

    async def _read_missed(self, harvest: _Harvest) -> None:
        """Read the new deliveries the round's reads did not hold (no cursor known yet,
        or another fetch had moved it) in one more round trip. An entry trimmed since
        its fetch is gone: its lease is not returned (trim settled it)."""
        missed, harvest.missed = harvest.missed, []
        stream = harvest.stream
        reads: list[Read] = [
            ("XRANGE", self._keys.partition(stream, m.partition).stream, f"{m.first}-0",
             f"{m.last}-0") for m in missed]
        read = await self._scripts.read(reads)
        with collector_paused():
            for m, entries in zip(missed, read, strict=True):
                leases = range_leases(stream, m.partition, harvest.group, harvest.consumer_id,
                                      m.block, m.deadline, entries, m.first, m.last,
                                      whole=False) or []
                if len(leases) == m.last - m.first + 1:  # the whole block (none trimmed)
                    self._issued.register(stream, harvest.group, m.partition, m.block, m.first,
                                          leases)
                harvest.of(m.partition).extend(leases)

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
                calls.extend(("forget_consumers", [self._keys.partition(stream, p).stream],
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
