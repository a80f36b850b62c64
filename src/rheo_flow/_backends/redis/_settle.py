"""Settling and renewing leases on the Redis backend.

Every settle batch and renew tick is one round trip: one ``settle.lua`` or
``renew.lua`` call per group partition the leases point at, pipelined, each
answering with one code letter per lease.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Any, Final, NamedTuple

import orjson

from ..._model._lease import Lease
from ..._model._settle_results import SettleKind, SettleResult, settle_ok
from ..._model._validation import NAME_PATTERN
from ..._support._collector import collector_paused
from .._issued_runs import Run
from ._codec import text
from ._scripts import ScriptCall
from ._work import WorkNotes

__all__ = ["SettleOperations"]

# Settle codes returned by the scripts (named in lookup.lua): code -> (kind, reason); "o"
# (OK) and "r" (REPEATED) succeed.
_CODES: Final[dict[str, tuple[SettleKind, str]]] = {
    "S": (SettleKind.STALE_LEASE, "the delivery was leased again"),
    "K": (SettleKind.STALE_LEASE, "already settled by ack"),
    "N": (SettleKind.STALE_LEASE, "already settled by nack"),
    "J": (SettleKind.STALE_LEASE, "already settled by reject"),
    "X": (SettleKind.STALE_LEASE, "dead-lettered after max_attempts when its lease expired"),
    "P": (SettleKind.STALE_LEASE, "the delivery was replayed, reset or trimmed"),
    "M": (SettleKind.RECEIPT_MISMATCH, "receipt does not match the lease"),
    "I": (SettleKind.INVALID, "lease names no group of this backend"),
    "Q": (SettleKind.INVALID, "lease names no delivery of this backend"),
}
_OK: Final = SettleResult.success
_NOT_A_LEASE: Final = "lease names no group of this backend"
_MAX_VALID_KEYS: Final = 4096
# What a settle sends per lease (the attempt lets the script recognise a current lease
# by one string compare; the key releases it in a key-ordered group), what a renew
# sends, and where a lease points.
_SETTLE_FIELDS: Final = attrgetter("event.sequence", "receipt", "lease_id", "attempt", "event")
_SETTLE_ROW: Final = attrgetter("event.sequence", "receipt", "lease_id", "attempt", "event.key")
"""A settle row taken in one call, for a batch of one partition (its keys checked there)."""
_RENEW_ROW: Final = attrgetter("event.sequence", "receipt", "lease_id", "consumer_id")
_KEY: Final = attrgetter("event.stream", "group", "event.partition")
_KEY_TYPES: Final = frozenset({str, type(None)})

_Buckets = dict[tuple[str, str, int], list[int]]


class _Plan(NamedTuple):
    """A settle's script calls, and what reading their replies needs."""

    results: list[SettleResult | None]
    """The results known before any call (leases that name no delivery)."""
    buckets: _Buckets
    """The lease indexes of each call, by the partition it is for."""
    calls: list[ScriptCall]
    runs: list[Run] | None = None
    """The runs of blocks this backend leased that the leases are (an ack's), if they are."""

    @property
    def run(self) -> Run | None:
        """The one run the leases are, sent as ``settle.lua``'s run form."""
        return self.runs[0] if self.runs is not None and len(self.runs) == 1 else None


def _settle_row(lease: Lease) -> tuple[Any, ...]:
    """What a settle sends of a lease: (seq, receipt, lease_id, attempt, key or None)."""
    seq, receipt, lease_id, attempt, event = _SETTLE_FIELDS(lease)
    key = getattr(event, "key", None)
    return seq, receipt, lease_id, attempt, key if type(key) is str else None


class SettleOperations(WorkNotes):
    """``ack``, ``nack``, ``reject`` and ``renew``."""

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return await self._settle_op(leases, "a", "", 0)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return await self._settle_op(leases, "n", _with_error(reason, error), delay_ms)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return await self._settle_op(leases, "r", _with_error(reason, error), 0)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        if not leases:
            return []
        results, replies = await self._settle(
            leases, "renew",
            lambda group, payload: [group, lease_ms, payload],
            _RENEW_ROW,
        )
        renewed: dict[tuple[str, str], tuple[int, set[int]]] = {}
        for indexes, reply in replies:
            deadline_text, codes = reply.split(":", 1)
            deadline = int(deadline_text)
            for index, code in zip(indexes, codes, strict=True):
                lease = leases[index]
                results[index] = (SettleResult.success(lease.lease_id, deadline_ms=deadline)
                                  if code == "o" else _result(lease.lease_id, code))
                if code == "o" and self._cluster:
                    soonest, partitions = renewed.get((lease.stream, lease.group),
                                                      (deadline, set()))
                    partitions.add(lease.partition)
                    renewed[(lease.stream, lease.group)] = (min(soonest, deadline), partitions)
        for (stream, group), (soonest, partitions) in renewed.items():
            await self._note_due(stream, group, partitions, soonest)
        return [r for r in results if r is not None]

    async def _settle_op(
        self, leases: Sequence[Lease], op: str, reason: str, delay_ms: int
    ) -> list[SettleResult]:
        if not leases:
            return []
        plan = self._settle_op_plan(leases, op, reason, delay_ms)
        try:
            replies = await self._eval(plan.calls)
        finally:
            self._settled(leases, plan)
        await self._note_settled(plan, replies, op)
        return self._settle_op_results(leases, plan, replies)

    def _settled(self, leases: Sequence[Lease], plan: _Plan) -> None:
        """Leases settled (or their settle failed: a repeat is answered all the same) leave
        the registry of blocks (.._issued_runs), which keeps only what is still to settle."""
        if plan.runs is not None:
            self._issued.acked(plan.runs)
        elif len(self._issued):
            self._issued.settled(leases, range(len(leases)))

    async def _note_settled(self, plan: _Plan, replies: list[Any], op: str) -> None:
        """On a Cluster, note the partitions where a nack made deliveries due (at once
        or later: the next visit finds when) or a settle released the next delivery of
        a key (see ``_work``)."""
        if not self._cluster:
            return
        due: dict[tuple[str, str], list[int]] = {}
        for (stream, group, p), reply in zip(plan.buckets, replies, strict=True):
            if op == "n" or text(reply).endswith("+"):
                due.setdefault((stream, group), []).append(p)
        for (stream, group), partitions in due.items():
            await self._note_work(stream, [group], partitions, fresh=False)

    def _settle_op_plan(self, leases: Sequence[Lease], op: str, reason: str, delay_ms: int
                        ) -> _Plan:
        """The script calls of a settle, and what reading their replies needs."""
        return self._settle_calls(
            leases, "settle", lambda group, payload: [group, op, reason, delay_ms, payload],
            _settle_row, fast_row=_SETTLE_ROW, run=op == "a")

    def _settle_op_results(self, leases: Sequence[Lease], plan: _Plan, replies: list[Any]
                           ) -> list[SettleResult]:
        """One result per lease from the replies of a settle's calls."""
        results, replies = plan.results, self._settle_replies(plan.buckets, replies)
        if len(replies) == 1 and len(replies[0][0]) == len(leases):
            indexes, codes = replies[0]
            if codes.count("o") == len(codes):
                with collector_paused():
                    return [settle_ok(lease.lease_id) for lease in leases]
        for indexes, codes in replies:
            for index, code in zip(indexes, codes, strict=True):
                results[index] = _result(leases[index].lease_id, code)
        return [r for r in results if r is not None]

    async def _settle(
        self,
        leases: Sequence[Lease],
        script: str,
        args: Callable[[str, bytes], list[Any]],
        row: Callable[[Lease], tuple[Any, ...]],
        fast_row: Callable[[Lease], tuple[Any, ...]] | None = None,
        run: bool = False,
    ) -> tuple[list[SettleResult | None], list[tuple[list[int], str]]]:
        """Run ``script`` for the leases, one call per group partition; the results of
        the leases that name no delivery, and per call the lease indexes and codes."""
        results, buckets, calls, _ = self._settle_calls(leases, script, args, row, fast_row,
                                                        run)
        return results, self._settle_replies(buckets, await self._eval(calls))

    def _settle_calls(
        self,
        leases: Sequence[Lease],
        script: str,
        args: Callable[[str, bytes], list[Any]],
        row: Callable[[Lease], tuple[Any, ...]],
        fast_row: Callable[[Lease], tuple[Any, ...]] | None = None,
        run: bool = False,
    ) -> _Plan:
        """``script``'s calls for the leases, one per group partition; the results of
        the leases that name no delivery and the partitions the calls are for."""
        results: list[SettleResult | None] = [None] * len(leases)
        dumps = orjson.dumps
        runs = self._issued.runs(leases) if run else None
        if runs is not None and len(runs) == 1:
            # One run of a block this backend leased (.._issued_runs): its run form at
            # once, no lease's fields checked first; the rows serve the script's fallback.
            at = runs[0]
            request = args(at.group, dumps(list(map(fast_row or row, leases))))
            request.extend((at.token, at.lo, at.hi))
            return _Plan(results, {(at.stream, at.group, at.part): list(range(len(leases)))},
                         [(script, self._keys.script_keys(at.stream, at.group, at.part),
                           request)], runs)
        one = self._one_bucket(leases, fast_row or row)
        calls: list[ScriptCall]
        if one is not None:
            (stream, group, partition), rows = one
            buckets: _Buckets = {one[0]: list(range(len(leases)))}
            request = args(group, dumps(rows))
            if run:
                request.extend(_run_form(rows))
            calls = [(script, self._keys.script_keys(stream, group, partition), request)]
        else:
            buckets = self._buckets(leases, results)
            calls = [
                (script, self._keys.script_keys(stream, group, partition),
                 args(group, dumps([row(leases[i]) for i in indexes])))
                for (stream, group, partition), indexes in buckets.items()
            ]
        return _Plan(results, buckets, calls, runs)

    def _settle_replies(self, buckets: _Buckets, replies: list[Any]
                        ) -> list[tuple[list[int], str]]:
        """Per call of :meth:`_settle_calls`, the lease indexes and their codes."""
        out: list[tuple[list[int], str]] = []
        for (stream, _, _), indexes, reply in zip(buckets, buckets.values(), replies,
                                                  strict=True):
            codes = text(reply)
            if codes.endswith("+"):
                # A key released its next delivery: an idle fetcher here can take it.
                codes = codes[:-1]
                self._released_for(stream).set()
            out.append((indexes, codes))
        return out

    def _buckets(self, leases: Sequence[Lease], results: list[SettleResult | None]) -> _Buckets:
        """Lease indexes by the partition they point at; ``results`` gets ``invalid``
        for every lease that cannot name a delivery of this backend."""
        buckets: _Buckets = {}
        for index, lease in enumerate(leases):
            key = self._lease_key(lease)
            if key is not None:
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = buckets[key] = []
                bucket.append(index)
            else:
                results[index] = SettleResult.failure(
                    getattr(lease, "lease_id", ""), SettleKind.INVALID, _NOT_A_LEASE)
        return buckets

    def _lease_key(self, lease: Lease) -> tuple[str, str, int] | None:
        """Where a lease points (stream, group, partition); None when it cannot name a
        delivery of this backend."""
        valid = self._valid_keys
        try:
            event = lease.event
            key = (event.stream, lease.group, event.partition)
            ok = valid.get(key)
            if ok is None:
                ok = _lease_key_ok(key)
                if len(valid) >= _MAX_VALID_KEYS:
                    valid.clear()
                valid[key] = ok
            seq = event.sequence
            # True == 1 as a dict key: the cached answer may be for another type.
            ok = (ok and type(key[2]) is int and type(seq) is int and seq >= 0
                  and type(lease.lease_id) is str and type(lease.receipt) is str)
        except (AttributeError, TypeError):
            return None
        return key if ok else None

    def _one_bucket(
        self, leases: Sequence[Lease], row: Callable[[Lease], tuple[Any, ...]]
    ) -> tuple[tuple[str, str, int], list[tuple[Any, ...]]] | None:
        """The common batch: well-formed leases of one group partition, with their rows."""
        try:
            keys = list(map(_KEY, leases))
        except AttributeError:
            return None
        key = keys[0]
        if keys.count(key) != len(keys):
            return None
        try:
            rows = list(map(row, leases))
        except AttributeError:
            return None
        try:
            ok = self._valid_keys.get(key)
        except TypeError:
            return None
        if ok is None:
            return None
        # True == 1: the cached answer may be for another type of partition.
        if not (ok and type(key[2]) is int and _rows_ok(rows)):
            return None
        return key, rows


def _rows_ok(rows: Sequence[tuple[Any, ...]]) -> bool:
    """Whether rows ``(seq, receipt, lease_id, ...)`` can name deliveries (sequences
    non-negative ints, receipts and lease ids strings) and, in settle rows, every key
    is a string or None. Checked a column at a time (each check one C loop)."""
    columns = list(zip(*rows, strict=True))
    seqs, receipts, lids = columns[:3]
    return (set(map(type, seqs)) == {int} and min(seqs) >= 0
            and set(map(type, receipts)) == {str} and set(map(type, lids)) == {str}
            and (len(columns) < 5 or set(map(type, columns[4])) <= _KEY_TYPES))


def _run_form(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The run form of settle rows ``(seq, receipt, lease_id, attempt)`` (see
    ``settle.lua``): ``[token, first, last]`` when the leases are the block leases
    ``<token>:<seq>`` of consecutive sequences with receipts ``<seq>-0``, else empty."""
    first = rows[0][0]
    last = rows[-1][0]
    if last - first + 1 != len(rows):
        return []
    token, colon, tail = rows[0][2].rpartition(":")
    if not colon or tail != str(first):
        return []
    seqs = range(first, last + 1)
    if ([r[1] for r in rows] != [f"{n}-0" for n in seqs]
            or [r[2] for r in rows] != [f"{token}:{n}" for n in seqs]):
        return []
    return [token, first, last]


def _lease_key_ok(key: tuple[Any, Any, Any]) -> bool:
    """Whether (stream, group, partition) can name a delivery of this backend."""
    stream, group, partition = key
    return (type(stream) is str and NAME_PATTERN.match(stream) is not None
            and type(group) is str and NAME_PATTERN.match(group) is not None
            and type(partition) is int and partition >= 0)


def _result(lease_id: str, code: str) -> SettleResult:
    if code == "o":
        return settle_ok(lease_id)
    if code == "r":
        return _OK(lease_id, repeated=True)
    kind, reason = _CODES.get(code, (SettleKind.FAILED, f"unexpected reply {code!r}"))
    return SettleResult.failure(lease_id, kind, reason)


def _with_error(reason: str, error: str | None) -> str:
    """The settle script's reason argument: the reason, then NUL and the error to record."""
    return reason if error is None else f"{reason}\0{error}"
