"""Settling and renewing: fenced single-document updates, one ``bulk_write`` per call.

The lease rules (:mod:`rheo_flow._backends._transitions`) decide what each
delivery becomes; here that outcome is written as an update filtered on the
lease id and the ``leased`` state, so a settle that lost a race to another
settle, an expiry or a new lease matches nothing. Every update carries the
call's token (``tk``): after a partial match, reading the documents back tells
exactly which updates were this call's.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pymongo import UpdateOne

from ..._model._lease import Lease
from ..._model._settle_results import SettleKind, SettleResult
from .._shared import fence, missing_delivery
from .._transitions import Op, not_leased, renew_delivery, settle_delivery
from ._core import MongoCore
from ._documents import DELIVERY_FIELDS, Group, delivery_id, settled_update
from ._frontier import advance
from ._keys import KeyedHead, release

__all__ = ["SettleOps"]

Doc = dict[str, Any]
Call = Op | Literal["renew"]


@dataclass(frozen=True, slots=True)
class _Call:
    """One settle or renew call: what it asks for, when, under which token."""

    op: Call
    reason: str
    delay_ms: int
    lease_ms: int
    error: str | None
    now: int
    token: str


@dataclass(frozen=True, slots=True)
class _Write:
    """The update a lease's settle sends, and its result should the update match."""

    index: int
    """The lease's position in the call."""
    doc_id: Any
    group: Group
    update: Doc
    result: SettleResult
    terminal: bool
    """Whether the delivery is settled for good (its frontier may move)."""
    key: str | None = None
    """The delivery's key in a key-ordered group (released when settled for good)."""


class SettleOps(MongoCore):
    """``ack``, ``nack``, ``reject`` and ``renew``."""

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return await self._settle(list(leases), "ack", "", 0)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return await self._settle(list(leases), "nack", reason, delay_ms, error=error)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return await self._settle(list(leases), "reject", reason, 0, error=error)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        return await self._settle(list(leases), "renew", "", 0, lease_ms=lease_ms)

    async def _settle(
        self,
        leases: list[Lease],
        op: Call,
        reason: str,
        delay_ms: int,
        *,
        lease_ms: int = 0,
        error: str | None = None,
    ) -> list[SettleResult]:
        if not leases:
            return []
        await self._ready()
        call = _Call(op, reason, delay_ms, lease_ms, error, self._clock(), uuid.uuid4().hex)
        batch = _Batch(self._groups, self._deliveries, self._highs)
        await batch.load(leases)
        results: list[SettleResult | None] = [None] * len(leases)
        first: dict[tuple[str, str, str, str, int, int], int] = {}
        repeats: list[tuple[int, int]] = []
        writes: list[_Write] = []
        for i, lease in enumerate(leases):
            # The receipt is part of the lease: a forged receipt beside the real one is
            # another lease (receipt_mismatch), not a repeat of it.
            key = (lease.lease_id, lease.receipt, lease.stream, lease.group, lease.partition,
                   lease.sequence)
            if key in first:
                repeats.append((i, first[key]))
                continue
            first[key] = i
            planned = _plan(call, i, lease, batch.find(lease))
            if isinstance(planned, SettleResult):
                results[i] = planned
            else:
                writes.append(planned)
        if writes:
            await self._write(call, leases, writes, batch, results)
        for i, j in repeats:
            results[i] = _repeat(leases[i], results[j], op)
        return [r for r in results if r is not None]

    async def _write(
        self,
        call: _Call,
        leases: list[Lease],
        writes: list[_Write],
        batch: _Batch,
        results: list[SettleResult | None],
    ) -> None:
        """Send the fenced updates, record every lease's result, advance the frontiers."""
        ops = [UpdateOne({"_id": w.doc_id, "lid": leases[w.index].lease_id, "st": "leased"},
                         w.update) for w in writes]
        result = await self._deliveries.bulk_write(ops, ordered=False)
        took: set[Any] = {w.doc_id for w in writes}
        if result.matched_count < len(ops):
            # Some fenced updates missed: another settle or a new lease came first.
            docs = await self._deliveries.find(
                {"_id": {"$in": list(took)}}, DELIVERY_FIELDS | {"tk": 1}
            ).to_list(None)
            by_id = {d["_id"]: d for d in docs}
            took = {doc_id for doc_id, d in by_id.items() if d.get("tk") == call.token}
            for w in writes:
                if w.doc_id not in took:
                    results[w.index] = batch.recheck(leases[w.index], by_id.get(w.doc_id),
                                                     call.op)
        touched: set[tuple[Any, int]] = set()
        released: list[KeyedHead] = []
        for w in writes:
            if w.doc_id in took:
                results[w.index] = w.result
                if w.terminal:
                    p = leases[w.index].partition
                    touched.add((w.group.id, p))
                    if w.key is not None:
                        released.append((w.group.id, p, w.key, w.group.parts[p]["f"]))
        if released:  # the next delivery of each key may be leased now
            await release(self._deliveries, released)
        if touched:
            await advance(self._groups, self._deliveries, touched)


def _plan(
    call: _Call, index: int, lease: Lease, hit: tuple[Group, Doc] | SettleResult
) -> _Write | SettleResult:
    """What settling ``lease`` writes, or its result when it writes nothing."""
    if isinstance(hit, SettleResult):
        return hit
    g, d = hit
    if call.op == "renew":
        renewed = renew_delivery(lease, d["st"], d.get("sb"), call.now, call.lease_ms)
        if not renewed.ok:
            return renewed
        deadline = call.now + call.lease_ms
        update: Doc = {"$set": {"dl": deadline, "r": deadline, "tk": call.token}}
        return _Write(index, d["_id"], g, update, renewed, terminal=False)
    settled = settle_delivery(lease, d["st"], d.get("sb"), d["a"], g.max_attempts, call.op,
                              call.reason, call.delay_ms, call.now)
    if isinstance(settled, SettleResult):
        return settled
    update = settled_update(settled, tk=call.token)
    if call.error is not None:
        update["$set"]["le"] = call.error  # the last error ("le"), kept until a redrive
    return _Write(index, d["_id"], g, update, SettleResult.success(lease.lease_id),
                  settled.terminal, d.get("k"))


def _repeat(lease: Lease, earlier: SettleResult | None, op: Call) -> SettleResult:
    """The result of a lease named again in the same call: a repeat of the first's settle."""
    if earlier is None:
        raise RuntimeError(f"lease {lease.lease_id} repeats one that got no result")
    if earlier.ok and op != "renew":
        return SettleResult.success(lease.lease_id, repeated=True)
    return earlier


class _Batch:
    """The groups and delivery documents a batch of leases names, loaded in a few queries."""

    def __init__(
        self,
        groups: Any,
        deliveries: Any,
        highs: Callable[[str, Sequence[int]], Awaitable[dict[int, int]]],
    ) -> None:
        self._groups_collection = groups
        self._deliveries = deliveries
        self._read_highs = highs
        self._groups: dict[tuple[str, str], Group] = {}
        self._docs: dict[tuple[Any, int, int], Doc] = {}
        self._highs: dict[tuple[str, int], int] = {}

    async def load(self, leases: list[Lease]) -> None:
        """Read the groups, the deliveries and (for leases without one) the high waters."""
        await self._load_groups(leases)
        wanted: dict[tuple[Any, int], set[int]] = {}
        for lease in leases:
            g = self._groups.get((lease.stream, lease.group))
            if g is not None and 0 <= lease.partition < g.count:
                wanted.setdefault((g.id, lease.partition), set()).add(lease.sequence)
        if not wanted:
            return
        ids = [delivery_id(gid, p, seq) for (gid, p), seqs in wanted.items() for seq in seqs]
        docs = await self._deliveries.find(
            {"_id": {"$in": ids}}, DELIVERY_FIELDS | {"g": 1}
        ).to_list(None)
        for d in docs:
            self._docs[(d["g"], d["p"], d["s"])] = d
        await self._load_highs(leases)

    async def _load_groups(self, leases: list[Lease]) -> None:
        pairs = sorted({(lease.stream, lease.group) for lease in leases})
        named: list[Doc] = [{"s": s, "n": n} for s, n in pairs]
        for doc in await self._groups_collection.find(_any_of(named)).to_list(None):
            group = Group.of(doc)
            self._groups[(group.stream, group.name)] = group

    async def _load_highs(self, leases: list[Lease]) -> None:
        """The high waters of the partitions where a lease names no delivery."""
        missing: set[tuple[str, int]] = set()
        for lease in leases:
            g = self._groups.get((lease.stream, lease.group))
            if g is not None and (g.id, lease.partition, lease.sequence) not in self._docs:
                missing.add((lease.stream, lease.partition))
        for stream in {s for s, _ in missing}:
            parts = sorted(p for s, p in missing if s == stream)
            for p, high in (await self._read_highs(stream, parts)).items():
                self._highs[(stream, p)] = high

    def find(self, lease: Lease) -> tuple[Group, Doc] | SettleResult:
        """The group and delivery ``lease`` still holds, or why it holds none."""
        g = self._groups.get((lease.stream, lease.group))
        if g is None or not 0 <= lease.partition < g.count:
            return SettleResult.failure(
                lease.lease_id, SettleKind.INVALID, "lease names no group of this backend"
            )
        d = self._docs.get((g.id, lease.partition, lease.sequence))
        if d is None:
            return missing_delivery(lease, self._highs.get((lease.stream, lease.partition), 0))
        return fence(lease, d.get("lid"), d.get("rc")) or (g, d)

    def recheck(self, lease: Lease, d: Doc | None, op: Call) -> SettleResult:
        """Classify a lease whose fenced update missed, from the document as it is now."""
        if d is None:
            return SettleResult.failure(
                lease.lease_id, SettleKind.STALE_LEASE,
                "the delivery was replayed, reset or trimmed",
            )
        fenced = fence(lease, d.get("lid"), d.get("rc"))
        if fenced is not None:
            return fenced
        if d["st"] != "leased":
            return not_leased(lease, d.get("sb"), op)
        # Leased again under the same lease id cannot happen (ids are unique): the
        # document changed between our update and this read, so it was not ours.
        return SettleResult.failure(
            lease.lease_id, SettleKind.STALE_LEASE, "the delivery changed concurrently"
        )


def _any_of(clauses: list[Doc]) -> Doc:
    """A filter matching any of ``clauses`` (the clause itself when there is one)."""
    return clauses[0] if len(clauses) == 1 else {"$or": clauses}
