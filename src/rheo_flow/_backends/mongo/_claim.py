"""Fetching: claiming deliveries with fenced updates and inserts, without locks.

A fetch reads its group without the per-partition entries, with its work summary
(``_summary``: the partitions that may have events past the cursor), and the
group's due deliveries (available, or leased with an expired lease) in one query
on the index by ready time, ``now`` its bound, so neither the settled history nor
the deliveries held or delayed are walked (``_due_first`` says when it reads
partition by partition). The partitions with work are those two name: when there
are none the fetch is over, two commands and two small replies whatever the
partition count. Otherwise it reads the entries (cursor, frontier, epoch) of those
partitions and the high waters of those the summary names, at once, and counts the
sequences past each cursor that have no delivery yet. It then sends one unordered ``bulk_write``:
a conditional update per existing delivery, filtered on exactly the state that
was read, and an insert per new delivery, whose unique ``_id`` lets exactly one
claimant win each sequence. Only the writes that matched are leases; a round
that lost every claim to other consumers is tried again (``_CLAIM_ROUNDS``).
Expired deliveries at ``max_attempts`` met on the way become dead letters in the
same bulk write. The cursors' moves and the summary's clears follow in one ordered
bulk write.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from pymongo import ASCENDING, InsertOne, UpdateOne
from pymongo import errors as mongo_errors

from ..._model._lease import Lease
from ..._support._call_retry import retried
from .._shared import round_robin
from .._transitions import Settled, expire
from ._core import MongoCore
from ._delay import split_scheduled
from ._documents import Group, delivery_id, settled_update
from ._errors import DUPLICATE_KEY
from ._frontier import advance
from ._schema import DUE_INDEX, GROUP_DUE_INDEX
from ._summary import built, clears

__all__ = ["FetchOps", "Visit"]

_CLAIM_ROUNDS: Final = 3
"""Fetch retries (only while it has leased nothing) after losing every claim to others."""

Doc = dict[str, Any]

_DUE_FIELDS: Final = {"_id": 1, "p": 1, "s": 1, "st": 1, "a": 1, "lid": 1, "r": 1, "k": 1}
"""What a fetch reads of a due delivery: enough to claim it with a fenced update."""

Due = dict[int, tuple[list[Doc], list[tuple[Doc, Settled]]]]
"""Per partition with due deliveries: the eligible ones (in sequence order), and the
expired ones at ``max_attempts`` with what they become (dead letters)."""


@dataclass(frozen=True, slots=True)
class _Claim:
    """One delivery a fetch tries to lease, and where its write sits in the bulk."""

    partition: int
    sequence: int
    attempt: int
    lease_id: str
    index: int
    """Position of the claiming write in the bulk write."""
    doc_id: Any
    """The existing delivery's ``_id``; ``None`` for a new delivery (an insert)."""

    @property
    def receipt(self) -> str:
        return f"{self.partition}-{self.sequence}-{self.attempt}"


@dataclass(frozen=True, slots=True)
class _Found:
    """What a claim round found, per partition fetched from (in the order of ``ids``)."""

    ready: list[list[Doc]]
    """The eligible existing deliveries, in sequence order."""
    fresh: list[int]
    """How many sequences past the cursor (no delivery yet) to lease."""
    expired: list[tuple[int, Doc, Settled]]
    """(partition, delivery, what it becomes): expired leases at ``max_attempts``."""


class _AllLost(Exception):
    """A claim round leased nothing: other consumers won every claim."""


@dataclass(frozen=True, slots=True)
class Visit:
    """What a claim round visits: the partitions with work, as the group has them now."""

    g: Group
    """The group, with the entries of (at least) the partitions visited."""
    ids: list[int]
    """The partitions with work, in the fetch's round-robin order."""
    due: Due
    """Their due deliveries."""
    waters: dict[int, tuple[int, int]]
    """Per partition visited, the (high, low) water; a partition the summary does not
    name has no new events: its cursor stands for its high water."""
    now: int


class FetchOps(MongoCore):
    """``fetch``: lease eligible deliveries, round-robin over the partitions with work."""

    async def fetch(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> list[Lease]:
        await self._ready()
        g = await self._summarised(stream, group)
        ids = list(range(g.count)) if partitions is None else list(partitions)
        if not ids or limit <= 0 or g.paused_until > self._clock():
            return []
        ids = self._rotation.order(g.id, ids)

        async def claim(attempt: int) -> list[Lease]:
            nonlocal g
            if attempt > 1:
                g = await self._summarised(stream, group)
            visit = await self._visit(g, ids, self._clock(), limit)
            if visit is None:
                return []
            leases, lost = await self._claim(visit, consumer_id, limit, lease_ms)
            if not leases and lost:
                raise _AllLost
            return leases

        try:
            return await retried(claim, when=lambda e: isinstance(e, _AllLost),
                                 attempts=_CLAIM_ROUNDS)
        except _AllLost:
            return []

    async def _summarised(self, stream: str, group: str) -> Group:
        """The group without its per-partition entries, with its work summary (built here,
        from the group read whole and every high water, when it has none: ``_summary``)."""
        g = await self._group(stream, group, whole=False)
        if g.work is not None:
            return g
        g = await self._group(stream, group)
        return await built(self._groups, g, await self._highs(stream, range(g.count)))

    async def _visit(self, g: Group, ids: list[int], now: int, limit: int) -> Visit | None:
        """The partitions of ``ids`` with work (named by the summary, or holding due
        deliveries), their entries, due deliveries and high waters; ``None`` when none
        has any. Only what the visit needs is read."""
        work = g.work or {}
        first, due_parts = await self._due_first(g, ids, now, limit)
        flagged = [p for p in ids if p in work]
        wanted = set(flagged) | due_parts
        visited = [p for p in ids if p in wanted]
        if not visited:
            return None
        reads: list[Any] = [self._waters(g.stream, flagged)]
        if any(p not in g.parts for p in visited):
            reads.append(self._group_parts(g, visited))
        read = await asyncio.gather(*reads)
        waters: dict[int, tuple[int, int]] = read[0]
        if len(read) > 1:
            g = read[1]
        if not g.scheduled and not g.ordered:
            # Claim no further than the summary's notes: a scheduled append marks the
            # group before its note, so what a note read here covers is never scheduled
            # unless the group read shows the mark (``_delay``).
            for p in flagged:
                waters[p] = (min(waters[p][0], work[p]), waters[p][1])
        elif g.scheduled and not g.ordered and flagged:
            # waters holds the flagged partitions only (yet): the split ends them at
            # their windows, which are deliveries now, due or not: read them.
            split = await split_scheduled(self._events, self._deliveries, self._groups, g,
                                          waters, now, limit)
            if split:
                due_parts |= split
                first = None
        due = await self._due(g, due_parts, now, limit, first)
        for p in visited:
            waters.setdefault(p, (g.parts[p]["c"], 0))
        return Visit(g, visited, due, waters, now)

    async def _claim(
        self, visit: Visit, consumer_id: str, limit: int, lease_ms: int
    ) -> tuple[list[Lease], int]:
        """One claim round: returns the leases won and how many claims were lost."""
        g, ids, now = visit.g, visit.ids, visit.now
        found = _found(g, ids, visit.due, limit,
                       {p: high for p, (high, _) in visit.waters.items()})
        deadline = now + lease_ms
        ops, wanted = _claim_writes(g, ids, found, limit, consumer_id, deadline)
        winners = await self._write_claims(ops, wanted) if ops else []
        await self._pass_cursors(g, wanted, ids)
        if found.expired:
            await advance(self._groups, self._deliveries, {(g.id, p) for p, _, _ in found.expired})
        lost = len(wanted) - len(winners)
        if not winners:
            return [], lost
        return await self._leases(g, winners, consumer_id, deadline), lost

    async def _due_first(
        self, g: Group, ids: list[int], now: int, limit: int
    ) -> tuple[list[Doc] | None, set[int]]:
        """The group's deliveries due at ``now`` in ``ids`` (all of them, or ``None`` when
        there may be more than ``limit``), and the partitions holding them.

        One query reads them, the soonest due first, on the index by ready time (``now``
        its bound): an idle partition costs nothing, and neither does a held or delayed
        delivery. Only when it finds ``limit`` (more may wait in partitions it did not
        reach) does one ``distinct`` list the partitions with due deliveries, each then
        read on its own (:meth:`_candidates`), so that every one gets its turns.
        """
        query = _due_query(g, ids, now)
        docs = await self._deliveries.find(query, _DUE_FIELDS).hint(GROUP_DUE_INDEX).sort(
            "r", ASCENDING).limit(limit).to_list(None)
        if len(docs) < limit:  # every due delivery
            return docs, {d["p"] for d in docs}
        wanted = set(ids)
        return None, {p for p in await self._deliveries.distinct("p", query) if p in wanted}

    async def _due(
        self, g: Group, parts: set[int], now: int, limit: int, first: list[Doc] | None
    ) -> Due:
        """Per partition of ``parts`` (with due deliveries at ``now``): up to ``limit``
        eligible ones (in sequence order) and the expired ones at ``max_attempts`` met;
        from ``first`` when it holds them all (:meth:`_due_first`)."""
        if first is not None:
            due: Due = {}
            for d in first:
                ready, doomed = due.setdefault(d["p"], ([], []))
                _sort_out(g, [d], now, ready, doomed)
            for ready, _ in due.values():
                ready.sort(key=lambda d: d["s"])
            return due
        ordered = sorted(parts)
        found = await asyncio.gather(*(self._candidates(g, p, now, limit) for p in ordered))
        return dict(zip(ordered, found, strict=True))

    async def _candidates(
        self, g: Group, p: int, now: int, limit: int
    ) -> tuple[list[Doc], list[tuple[Doc, Settled]]]:
        """Up to ``limit`` eligible deliveries of a partition, the soonest due first (listed
        in sequence order), and the expired ones met on the way that reached
        ``max_attempts`` (to dead-letter).

        The read is a range of the index by ready time, bounded by ``now``: the deliveries
        held by leases or delayed by nacks are never walked, nor the settled history (a
        settled delivery carries no ready time).
        """
        ready: list[Doc] = []
        doomed: list[tuple[Doc, Settled]] = []
        seen: list[Any] = []
        query: Doc = {"g": g.id, "p": p, "r": {"$exists": True, "$lte": now}}
        while len(ready) < limit:
            want = limit - len(ready)
            if seen:  # read on past those met (the dead letters among them take no place)
                query["_id"] = {"$nin": seen}
            docs = await self._deliveries.find(query, _DUE_FIELDS).hint(DUE_INDEX).sort(
                "r", ASCENDING).limit(want).to_list(None)
            _sort_out(g, docs, now, ready, doomed)
            seen += [d["_id"] for d in docs]
            if len(docs) < want:
                break
        ready.sort(key=lambda d: d["s"])
        return ready, doomed

    async def _write_claims(self, ops: list[Any], wanted: list[_Claim]) -> list[_Claim]:
        """Send the round's writes; the claims won (inserted, or updated under our lease id)."""
        failed: set[int] = set()
        try:
            result = await self._deliveries.bulk_write(ops, ordered=False)
            matched = result.matched_count
        except mongo_errors.BulkWriteError as exc:
            errors = exc.details.get("writeErrors", [])
            if any(e.get("code") != DUPLICATE_KEY for e in errors):
                raise
            failed = {e["index"] for e in errors}
            matched = exc.details.get("nMatched", 0)
        updates = [c for c in wanted if c.doc_id is not None]
        lost: set[int] = set()
        if matched < len(ops) - (len(wanted) - len(updates)):
            lost = await self._taken_by_others(updates)
        return [c for c in wanted if c.index not in failed and c.index not in lost]

    async def _taken_by_others(self, updates: list[_Claim]) -> set[int]:
        """Some fenced updates missed: read back which deliveries hold our lease ids."""
        docs = await self._deliveries.find(
            {"_id": {"$in": [c.doc_id for c in updates]}}, {"_id": 1, "lid": 1}
        ).to_list(None)
        holders = {d["_id"]: d.get("lid") for d in docs}
        return {c.index for c in updates if holders.get(c.doc_id) != c.lease_id}

    async def _pass_cursors(self, g: Group, wanted: list[_Claim], visited: list[int]) -> None:
        """Move the cursors past every sequence inserted here or found taken, and clear
        the summary's entries of ``visited`` that the cursors have passed.

        Unless the group moved meanwhile (its epoch changed): then the move decided
        the cursor.
        """
        tops: dict[int, int] = {}
        for c in wanted:
            if c.doc_id is None:
                tops[c.partition] = max(tops.get(c.partition, 0), c.sequence)
        await self._raise_cursors(g, tops, visited)

    async def _raise_cursors(self, g: Group, tops: dict[int, int], visited: list[int]) -> None:
        """Raise the cursors to ``tops`` (per partition), in partitions the group did not
        move, then clear the entries of ``visited`` passed (``_summary.clears``)."""
        ops = [UpdateOne({"_id": g.id, f"parts.{p}.e": g.parts[p]["e"]},
                         {"$max": {f"parts.{p}.c": top}})
               for p, top in tops.items()]
        ops += clears(g, tops, visited)
        if ops:  # in order: a clear compares the entry with the cursor just raised
            await self._groups.bulk_write(ops, ordered=True)

    async def _leases(
        self, g: Group, winners: list[_Claim], consumer_id: str, deadline: int
    ) -> list[Lease]:
        """The leases of the claims won whose events still exist."""
        events = await self._load_events(g.stream, [(c.partition, c.sequence) for c in winners])
        missing = [c.lease_id for c in winners if (c.partition, c.sequence) not in events]
        if missing:
            # Trimmed while we claimed: the delivery has no event any more; give it up.
            await self._deliveries.delete_many({"g": g.id, "lid": {"$in": missing}})
        return [
            Lease(lease_id=c.lease_id, receipt=c.receipt, group=g.name, consumer_id=consumer_id,
                  event=events[(c.partition, c.sequence)], attempt=c.attempt,
                  deadline_ms=deadline)
            for c in winners
            if (c.partition, c.sequence) in events
        ]


def _due_query(g: Group, ids: list[int], now: int) -> Doc:
    """The group's deliveries due at ``now`` in ``ids`` (on the index by ready time)."""
    query: Doc = {"g": g.id, "r": {"$exists": True, "$lte": now}}
    if len(ids) < g.count:
        query["p"] = ids[0] if len(ids) == 1 else {"$in": sorted(ids)}
    return query


def _found(g: Group, ids: list[int], due: Due, limit: int, highs: dict[int, int]) -> _Found:
    """What a round found in ``ids``: the eligible deliveries, how many new sequences
    past each cursor (up to its high water) to lease, the expired ones to dead-letter."""
    ready: list[list[Doc]] = []
    fresh: list[int] = []
    expired: list[tuple[int, Doc, Settled]] = []
    for p in ids:
        eligible, doomed = due.get(p, ([], []))
        ready.append(eligible)
        expired.extend((p, d, settled) for d, settled in doomed)
        fresh.append(max(0, min(limit - len(eligible), highs[p] - g.parts[p]["c"])))
    return _Found(ready, fresh, expired)


def _claim_writes(
    g: Group, ids: list[int], found: _Found, limit: int, consumer_id: str, deadline: int
) -> tuple[list[Any], list[_Claim]]:
    """The round's bulk write: the expired deliveries' dead-lettering, then the claims.

    Claims are taken round-robin, one partition after the other; in a partition
    the existing deliveries come before the new sequences.
    """
    ops: list[Any] = [UpdateOne(_fenced(d), settled_update(s)) for _, d, s in found.expired]
    wanted: list[_Claim] = []
    sizes = [len(ready) + fresh for ready, fresh in zip(found.ready, found.fresh, strict=True)]
    for i, depth in round_robin(sizes, limit):
        p, ready = ids[i], found.ready[i]
        if depth < len(ready):
            doc = ready[depth]
            claim = _Claim(p, doc["s"], doc["a"] + 1, uuid.uuid4().hex, len(ops), doc["_id"])
            ops.append(UpdateOne(_fenced(doc), {"$set": _leased(claim, consumer_id, deadline)}))
        else:
            seq = g.parts[p]["c"] + depth - len(ready) + 1
            claim = _Claim(p, seq, 1, uuid.uuid4().hex, len(ops), None)
            ops.append(InsertOne({
                "_id": delivery_id(g.id, p, seq), "g": g.id, "p": p, "s": seq,
                **_leased(claim, consumer_id, deadline), "rs": "", "rj": 0,
            }))
        wanted.append(claim)
    return ops, wanted


def _sort_out(
    g: Group, docs: list[Doc], now: int, ready: list[Doc], doomed: list[tuple[Doc, Settled]]
) -> None:
    """Sort due deliveries into the eligible ones and those to dead-letter (expired at
    ``max_attempts``). One at or below the frontier (settled, so it carries no ready
    time: never met) is left out."""
    for d in docs:
        if d["s"] <= g.parts[d["p"]]["f"]:
            continue
        settled = expire(d["a"], g.max_attempts, now)
        if settled is None:
            ready.append(d)
        else:
            doomed.append((d, settled))


def _fenced(d: Doc) -> Doc:
    """A filter on exactly the state that was read: anyone else's change makes it miss."""
    return {"_id": d["_id"], "st": d["st"], "lid": d["lid"], "a": d["a"], "r": d["r"]}


def _leased(claim: _Claim, consumer_id: str, deadline: int) -> Doc:
    """The fields of a delivery leased by ``claim`` until ``deadline``."""
    return {
        "st": "leased", "a": claim.attempt, "lid": claim.lease_id, "rc": claim.receipt,
        "c": consumer_id, "dl": deadline, "r": deadline, "sb": None,
    }
