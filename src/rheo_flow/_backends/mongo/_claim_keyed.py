"""Fetching from a key-ordered group: a delivery of key K is leased only once every
earlier delivery of K in its partition is settled (docs/ordering.md; ``_keys``).

A claim round of such a group differs from the unordered one (``_claim``) in two ways:

* the eligible existing deliveries are kept only when no earlier delivery of their
  key is unsettled (:func:`~._keys.blocked_keys`, one probe per key), and
  at most the earliest of each key;
* the sequences past the cursor are read with their keys (each partition reads
  for its share of the batch, the others making up what one lacks; never more
  than needed, plus the blocked ones passed over) and materialised **in
  order**, with one ordered insert per partition: a sequence whose key has an
  unsettled delivery (:func:`~._keys.unsettled_keys`), or one leased earlier in
  the round, is stored blocked, the others are leased. An ordered insert stops at
  the first sequence another claimant stored first, so the deliveries of a
  partition are always created in sequence order, each after every earlier one
  exists: a claimant deciding that a sequence's key is free has seen every
  earlier delivery of that key. The insert claims a sequence exactly once, as in
  the unordered round; the existing deliveries are claimed by the same fenced
  updates.

After the writes a round releases (:func:`~._keys.release`) the keys of what it
stored blocked, dead-lettered or gave up, which is what keeps a blocked delivery
from missing the settle that frees its key. Nothing here reads the settled history.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, Final

from pymongo import ASCENDING, UpdateOne
from pymongo import errors as mongo_errors

from ..._model._lease import Lease
from .._shared import round_robin
from .._transitions import Settled
from ._claim import Doc, FetchOps, Visit, _Claim, _fenced, _leased
from ._delay import new_delivery
from ._documents import Group, delivery_id, settled_update
from ._errors import DUPLICATE_KEY
from ._frontier import advance
from ._keys import BLOCKED_MS, KeyedHead, blocked_keys, release, unsettled_keys

__all__ = ["KeyedFetchOps"]

_SCAN_MAX: Final = 256
"""Most events read per query past the cursor (the reads grow from what the batch needs)."""


@dataclass(slots=True)
class _Part:
    """What a key-ordered claim round found in one partition."""

    p: int
    after: int
    """The group's stored frontier: every delivery up to it is settled."""
    cursor: int
    ready: list[Doc]
    """Eligible existing deliveries, each the earliest unsettled one of its key."""
    doomed: list[tuple[Doc, Settled]]
    """Expired leases at ``max_attempts`` (to dead-letter), earliest of their keys too."""
    scanned: list[tuple[int, str | None]] = field(default_factory=list)
    """The events read past the cursor: (sequence, key), in order."""
    free: list[int] = field(default_factory=list)
    """The sequences of ``scanned`` that may be leased, in order."""
    last: int = 0
    """The last sequence the scan passed (it goes on after it)."""
    high: int = 0
    """The partition's high water: the scan stops there."""
    taken: set[str] = field(default_factory=set)
    """Keys held (unsettled, or leased in this round)."""
    unused: set[str] = field(default_factory=set)
    """Keys found free that no scanned event has taken yet."""
    now: int = 0
    late: dict[int, int] = field(default_factory=dict)
    """The scanned events scheduled later than ``now``: their times, by sequence."""

    def size(self) -> int:
        return len(self.ready) + len(self.free)


@dataclass(slots=True)
class _Round:
    """A round's writes: claims of existing deliveries, then an insert per partition."""

    ops: list[Any] = field(default_factory=list)
    """The existing deliveries' bulk: dead-letterings, then fenced claims."""
    claims: list[_Claim] = field(default_factory=list)
    """The existing deliveries claimed, in ``ops``."""
    inserts: dict[int, list[Doc]] = field(default_factory=dict)
    """Per partition: the new delivery documents, in sequence order."""
    fresh: dict[int, list[_Claim]] = field(default_factory=dict)
    """Per partition: the new deliveries leased (``index`` is their place in the insert)."""
    keys: dict[str, str] = field(default_factory=dict)
    """Lease id: key, for the claims whose event has one."""


class KeyedFetchOps(FetchOps):
    """``fetch`` for every group: key-ordered ones here, the others as in :class:`FetchOps`."""

    async def _claim(
        self, visit: Visit, consumer_id: str, limit: int, lease_ms: int
    ) -> tuple[list[Lease], int]:
        g = visit.g
        if not g.ordered:
            return await super()._claim(visit, consumer_id, limit, lease_ms)
        now, due, waters = visit.now, visit.due, visit.waters
        # Only the partitions with work: due deliveries, or events past the cursor.
        ids = [p for p in visit.ids if p in due or waters[p][0] > g.parts[p]["c"]]
        if not ids:
            await self._raise_cursors(g, {}, visit.ids)
            return [], 0
        # Each partition scans for its share of the batch (the first ones in fetch order
        # one more), so a small fetch reads past the cursor of only a few.
        shares = [limit // len(ids) + (i < limit % len(ids)) for i in range(len(ids))]
        parts = await asyncio.gather(*(
            self._keyed_part(g, p, due.get(p, ([], [])), share, *waters[p], now)
            for p, share in zip(ids, shares, strict=True)))
        short = limit - sum(part.size() for part in parts)
        if short > 0:  # some partitions have less than their share: the others make it up
            await asyncio.gather(*(self._scan_new(g, part, len(part.free) + short)
                                   for part in parts if part.last < part.high))
        deadline = now + lease_ms
        plan = _plan(g, parts, limit, consumer_id, deadline)
        won, tops, stored = await self._write_round(plan)
        await self._raise_cursors(g, tops, visit.ids)
        expired = {(g.id, part.p) for part in parts if part.doomed}
        if expired:
            await advance(self._groups, self._deliveries, expired)
        heads = [(g.id, part.p, d["k"], part.after)
                 for part in parts for d, _ in part.doomed if "k" in d]
        heads += await self._drop_trimmed(g, stored)
        heads += [(g.id, p, d["k"], g.parts[p]["f"])
                  for p, docs in stored.items() for d in docs
                  if "k" in d and d["r"] == BLOCKED_MS]
        await release(self._deliveries, heads)
        lost = len(plan.claims) + sum(map(len, plan.fresh.values())) - len(won)
        if not won:
            return [], lost
        leases = await self._leases(g, won, consumer_id, deadline)
        kept = {lease.lease_id for lease in leases}
        gone = [(g.id, c.partition, plan.keys[c.lease_id], g.parts[c.partition]["f"])
                for c in won if c.lease_id not in kept and c.lease_id in plan.keys]
        await release(self._deliveries, gone)  # trimmed while we claimed
        return leases, lost

    async def _keyed_part(
        self, g: Group, p: int, due: tuple[list[Doc], list[tuple[Doc, Settled]]], share: int,
        high: int, low: int, now: int
    ) -> _Part:
        """The partition's eligible deliveries (``due``: those the fetch read, kept when
        heads of their keys), then the new sequences that may be leased, up to ``share``
        in all."""
        ready, doomed = due
        after = g.parts[p]["f"]
        firsts: dict[str, int] = {}
        for d in sorted([*ready, *(d for d, _ in doomed)], key=lambda d: d["s"]):
            if "k" in d:
                firsts.setdefault(d["k"], d["s"])
        held = await blocked_keys(self._deliveries, g.id, p, firsts, after)

        def head(d: Doc) -> bool:
            return "k" not in d or (d["k"] not in held and firsts[d["k"]] == d["s"])

        part = _Part(p, after, g.parts[p]["c"], [d for d in ready if head(d)],
                     [(d, s) for d, s in doomed if head(d)],
                     # trimmed sequences have nothing to deliver
                     last=max(g.parts[p]["c"], low - 1), high=high, taken=set(firsts),
                     now=now)
        if share > len(part.ready):
            await self._scan_new(g, part, share - len(part.ready))
        return part

    async def _scan_new(self, g: Group, part: _Part, want: int) -> None:
        """Read on past the events scanned until ``want`` may be leased (or none is left).

        Each read asks for a range of sequences no wider than it needs, and only the
        keys that may still fill the batch are probed (twice as many as it lacks, in
        order); the next read starts at the first event of a key not probed yet.
        """
        size = max(want - len(part.free), 1)
        while len(part.free) < want and part.last < part.high:
            top = min(part.high, part.last + size)
            docs = await self._events.find(
                {"st": g.stream, "p": part.p, "n": {"$gt": part.last, "$lte": top}},
                {"_id": 0, "n": 1, "k": 1, "da": 1},
            ).sort("n", ASCENDING).to_list(None)
            unknown = list(dict.fromkeys(
                k for d in docs
                if (k := d.get("k")) is not None and k not in part.taken
                and k not in part.unused))
            probed = unknown[:2 * (want - len(part.free))]
            if probed:
                held = await unsettled_keys(self._deliveries, g.id, part.p, probed, part.after)
                part.taken |= held
                part.unused |= set(probed) - held
            part.last = _take(part, docs, want, top)
            size = min(size * 4, _SCAN_MAX)

    async def _write_round(
        self, plan: _Round
    ) -> tuple[list[_Claim], dict[int, int], dict[int, list[Doc]]]:
        """Send the round's writes: the claims won, the cursor per partition, the
        documents stored per partition."""
        parts = sorted(plan.inserts)
        existing, inserted = await asyncio.gather(
            self._write_claims(plan.ops, plan.claims) if plan.ops else _none(),
            asyncio.gather(*(_insert_in_order(self._deliveries, plan.inserts[p])
                             for p in parts)))
        won = list(existing)
        tops: dict[int, int] = {}
        stored: dict[int, list[Doc]] = {}
        for p, (count, top) in zip(parts, inserted, strict=True):
            stored[p] = plan.inserts[p][:count]
            if top is not None:
                tops[p] = top
            won.extend(c for c in plan.fresh.get(p, []) if c.index < count)
        return won, tops, stored

    async def _drop_trimmed(self, g: Group, stored: dict[int, list[Doc]]) -> list[KeyedHead]:
        """Remove the blocked documents stored below a low water a trim raised meanwhile
        (their events are gone); the keys to release. The leased ones go with their
        leases (``_leases``)."""
        blocked = {p: [d for d in docs if d["r"] == BLOCKED_MS] for p, docs in stored.items()}
        parts = [p for p, docs in blocked.items() if docs]
        if not parts:
            return []
        waters = await self._waters(g.stream, parts)
        stale = [d for p in parts for d in blocked[p] if d["s"] < waters[p][1]]
        if not stale:
            return []
        await self._deliveries.delete_many(
            {"_id": {"$in": [d["_id"] for d in stale]}, "r": BLOCKED_MS})
        return [(g.id, d["p"], d["k"], g.parts[d["p"]]["f"]) for d in stale if "k" in d]


def _take(part: _Part, docs: list[Doc], want: int, top: int) -> int:
    """Pass over ``docs`` (the events after ``part.last``, in order) until ``want`` are
    free or a key is neither known free nor taken; the last sequence passed (``top``
    when every one was: the range up to it is read)."""
    last = part.last
    for d in docs:
        seq, key = d["n"], d.get("k")
        late = d.get("da", 0) > part.now
        if len(part.free) >= want or (not late and key is not None and key not in part.taken
                                      and key not in part.unused):
            return last
        last = seq
        part.scanned.append((seq, key))
        if late:  # stored at its time, holding its key (docs/contract.md)
            part.late[seq] = d["da"]
            if key is not None:
                part.unused.discard(key)
                part.taken.add(key)
            continue
        if key is None or key in part.unused:
            part.free.append(seq)
        if key in part.unused:
            part.unused.discard(key)
            part.taken.add(key)
    return top


async def _none() -> list[_Claim]:
    return []


async def _insert_in_order(deliveries: Any, docs: list[Doc]) -> tuple[int, int | None]:
    """Insert ``docs`` in order until one exists already: how many were stored, and the
    cursor after them (the last stored, or the one found taken: it exists too)."""
    if not docs:
        return 0, None
    try:
        await deliveries.insert_many(docs, ordered=True)
        return len(docs), docs[-1]["s"]
    except mongo_errors.BulkWriteError as exc:
        errors = exc.details.get("writeErrors", [])
        if not errors or any(e.get("code") != DUPLICATE_KEY for e in errors):
            raise
        count = int(errors[0]["index"])
        return count, docs[count]["s"]


def _plan(g: Group, parts: list[_Part], limit: int, consumer_id: str, deadline: int) -> _Round:
    """The round's writes, claims taken round-robin over the partitions (in a partition
    the existing deliveries first, then the new sequences in order)."""
    plan = _Round()
    plan.ops = [UpdateOne(_fenced(d), settled_update(s)) for part in parts for d, s in part.doomed]
    picks = [0] * len(parts)
    for i, _ in round_robin([part.size() for part in parts], limit):
        picks[i] += 1
    for part, picked in zip(parts, picks, strict=True):
        for doc in part.ready[:picked]:
            claim = _Claim(part.p, doc["s"], doc["a"] + 1, uuid.uuid4().hex, len(plan.ops),
                           doc["_id"])
            plan.ops.append(UpdateOne(_fenced(doc),
                                      {"$set": _leased(claim, consumer_id, deadline)}))
            plan.claims.append(claim)
            if "k" in doc:
                plan.keys[claim.lease_id] = doc["k"]
        _plan_new(g, part, max(0, picked - len(part.ready)), plan, consumer_id, deadline)
    return plan


def _plan_new(g: Group, part: _Part, taking: int, plan: _Round, consumer_id: str,
              deadline: int) -> None:
    """The partition's new documents: every scanned sequence up to the first free one not
    taken (all when every free one is), leased when taken, blocked otherwise."""
    taken = set(part.free[:taking])
    end = part.free[taking] - 1 if taking < len(part.free) else (
        part.scanned[-1][0] if part.scanned else part.cursor)
    docs: list[Doc] = []
    fresh: list[_Claim] = []
    for seq, key in part.scanned:
        if seq > end:
            break
        if seq in part.late:
            docs.append(new_delivery(g, part.p, seq, part.late[seq], key))
            continue
        doc: Doc = {"_id": delivery_id(g.id, part.p, seq), "g": g.id, "p": part.p, "s": seq}
        if key is not None:
            doc["k"] = key
        if seq in taken:
            claim = _Claim(part.p, seq, 1, uuid.uuid4().hex, len(docs), None)
            doc.update(_leased(claim, consumer_id, deadline))
            fresh.append(claim)
            if key is not None:
                plan.keys[claim.lease_id] = key
        else:
            doc.update({"st": "available", "a": 0, "lid": None, "rc": None, "c": None,
                        "dl": 0, "r": BLOCKED_MS, "sb": None})
        doc.update({"rs": "", "rj": 0})
        docs.append(doc)
    if docs:
        plan.inserts[part.p] = docs
        plan.fresh[part.p] = fresh
