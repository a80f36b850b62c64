"""Settle and renew batches of the PostgreSQL backend, as the server-side functions take them.

A batch is checked here first: leases this backend could not have issued are
answered locally, exact duplicates fold onto their first occurrence, and the
rest travel as five array literals sorted by delivery (so concurrent batches
lock rows in one order). The function's answer (the positions that did not take
effect, with a code each) becomes one :class:`~rheo_flow.SettleResult` per lease.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, Literal

from ..._model._lease import Lease
from ..._model._settle_results import SettleKind, SettleResult, settle_ok
from .._issued import Issued
from ._sql import BIGINT_MAX

__all__ = ["OP_CODES", "Op", "SettleBatch"]

Op = Literal["ack", "nack", "reject"]
OP_CODES: Final[dict[Op, int]] = {"ack": 1, "nack": 2, "reject": 3}
"""The settle function's ``p_op`` for each operation."""
_OP_NAMES: Final[dict[int | None, str]] = {
    1: "ack", 2: "nack", 3: "reject", None: "expiry past max_attempts",
}
_NIL_UUID: Final = "00000000000000000000000000000000"
_LEASE_ID: Final = re.compile(r"[0-9a-f]{32}")
_LEASE_IDS: Final = re.compile(r"(?:[0-9a-f]{32},)+")
"""Lease ids joined and followed by commas: a whole batch checked by one match."""
_MAX_ATTEMPT: Final = 10**9
"""Receipts name attempts of at most 9 digits."""


class SettleBatch:
    """A settle or renew batch: invalid leases answered locally, exact duplicates
    folded onto their first occurrence, the rest as arrays sorted by delivery
    (so concurrent batches lock rows in one order).

    ``groups`` maps (stream, group) to (group id, partitions) for every group the
    batch names that exists. ``issued``, given for acks, vouches for the leases this
    backend's fetches built: a batch of those, each once, is forgotten there and skips
    every check (see :mod:`.._issued`).
    """

    def __init__(self, leases: Sequence[Lease],
                 groups: Mapping[tuple[str, str], tuple[int, int]],
                 issued: Issued | None = None) -> None:
        self.leases = leases
        self.results: list[SettleResult | None] = [None] * len(leases)
        self.duplicates: list[tuple[int, int]] = []
        self.order: list[int] = []
        self._args: tuple[str, ...] | None = ()
        self._ranges: tuple[str, ...] = ()
        self._ranges_order: list[int] = []
        self.gid = 0
        self.entries: list[tuple[int, int, int, int]] = []
        """(partition, sequence, attempt, position) of a one-group batch, by delivery;
        empty when the batch needed :meth:`_general`, and until asked for after
        :meth:`_issued`."""
        if not leases:
            return
        if issued is not None and self._issued(leases, groups, issued):
            return
        if not self._common(leases, groups):
            self._general(leases, groups)

    def _issued(self, leases: Sequence[Lease],
                groups: Mapping[tuple[str, str], tuple[int, int]],
                issued: Issued) -> bool:
        """A batch of one group whose every lease ``issued`` vouches for, none twice:
        no field needs a check, and the leases are grouped by range at once
        (:meth:`range_args`), in the order they come. False (nothing recorded) for
        anything else; ``issued`` then forgets the leases only if one came twice."""
        first = leases[0]
        group = first.group
        stream = first.event.stream
        found = groups.get((stream, group))
        if found is None or not issued.vouches_for_all(leases):
            return False
        partitions = found[1]
        # A range's leases share its token (the first 12 bytes of their ids), and with
        # it their partition, attempt and base (sequence - offset). Runs are keyed by
        # token; a lease whose token names a run of another partition, attempt or base
        # (a key-ordered group's leases share one token per fetch) sends the batch to
        # the checked path, which makes it an element of its own.
        runs: dict[str, tuple[tuple[int, str, int, int], list[int], list[int]]] = {}
        for i, lease in enumerate(leases):
            lease_id = lease.lease_id
            event = lease.event
            if lease.group != group or event.stream != stream:
                return False
            token = lease_id[:24]
            seq = event.sequence
            base = seq - int(lease_id[24:], 16)
            run = runs.get(token)
            if run is None:
                if not 0 <= event.partition < partitions:  # the stream was recreated smaller
                    return False
                run = runs[token] = ((event.partition, token, lease.attempt, base), [], [])
            elif (base != run[0][3] or event.partition != run[0][0]
                  or lease.attempt != run[0][2]):
                return False
            run[1].append(seq)
            run[2].append(i)
        if issued.forget(leases) != len(leases):  # a lease twice: settled lease by lease
            return False
        elements: list[tuple[int, int, int, int, tuple[int, str, int, int], list[int],
                             list[int]]] = []
        for key, seqs, positions in runs.values():
            if seqs != sorted(seqs):  # handled out of order: by delivery within the range
                pairs = sorted(zip(seqs, positions, strict=True))
                seqs = [pair[0] for pair in pairs]
                positions = [pair[1] for pair in pairs]
            elements.append((key[0], seqs[0], key[2], positions[0], key, seqs, positions))
        # By delivery (partition, lowest sequence): the lock order; then as range_args
        # orders the same batch checked lease by lease.
        elements.sort()
        self.gid = found[0]
        self._args = None  # built if asked for (see args)
        self.order = self._ranges_order = [i for element in elements for i in element[6]]
        self._ranges = _range_arrays([(element[4], element[5]) for element in elements])
        return True

    def _common(self, leases: Sequence[Lease],
                groups: Mapping[tuple[str, str], tuple[int, int]]) -> bool:
        """The batch as one fetch hands it back (one group, every lease well formed,
        no two alike), checked with no per-lease fallbacks: the lease ids by one
        match over the whole batch. False (nothing recorded) for anything else,
        which :meth:`_general` then answers lease by lease."""
        first = leases[0]
        group = first.group
        stream = first.event.stream
        found = groups.get((stream, group))
        if found is None:
            return False
        gid, partitions = found
        ids = [lease.lease_id for lease in leases]
        if not all(type(lease_id) is str for lease_id in ids):
            return False
        if (_LEASE_IDS.fullmatch(",".join(ids) + ",") is None
                or len(set(ids)) != len(ids)):
            return False
        entries: list[tuple[int, int, int, int]] = []
        append = entries.append
        for i, lease in enumerate(leases):
            event = lease.event
            part, seq, attempt = event.partition, event.sequence, lease.attempt
            if (type(part) is not int or type(seq) is not int or type(attempt) is not int
                    or not 0 <= part < partitions or not 0 < seq <= BIGINT_MAX
                    or not 0 < attempt < _MAX_ATTEMPT
                    or lease.group != group or event.stream != stream
                    or lease.receipt != f"{part}-{seq}-{attempt}"):
                return False
            append((part, seq, attempt, i))
        entries.sort()
        self.gid = gid
        self.entries = entries
        self.order = [e[3] for e in entries]
        self._args = None  # built if asked for: acks travel per range
        return True

    @property
    def args(self) -> tuple[str, ...]:
        """The five array parameters of the settle and renew statements (empty when
        nothing is left to send); the results then follow the leases in that order."""
        if self._args is None:
            leases = self.leases
            if not self.entries:  # a batch of issued leases (_issued), grouped by range
                self.entries = sorted(
                    (lease.event.partition, lease.event.sequence, lease.attempt, i)
                    for i, lease in enumerate(leases))
            entries = self.entries
            self.order = [e[3] for e in entries]
            self._args = (
                _array([str(self.gid)] * len(entries)),
                _array([str(e[0]) for e in entries]),
                _array([str(e[1]) for e in entries]),
                _array([leases[e[3]].lease_id for e in entries]),
                _array([str(e[2]) for e in entries]),
            )
        return self._args

    @property
    def sends(self) -> bool:
        """Whether any lease is left to send to the server."""
        return bool(self.entries) or bool(self._args) or bool(self._ranges)

    def range_args(self) -> tuple[str, ...]:
        """The batch as ``ack_ranges`` takes it (functions/ack_ranges.sql), or ``()`` when
        it is not a one-group batch; the results then follow the elements in that order.

        Each lease id splits into a token (its first 12 bytes) and an offset (the last 4),
        and the leases of one (partition, token, attempt, base = sequence - offset) travel
        as one element: their lowest sequence, a bit per sequence from it, their count.
        """
        if self._ranges:
            self.order = self._ranges_order
            return self._ranges
        if not self.entries:
            return ()
        leases = self.leases
        runs: dict[tuple[int, str, int, int], list[int]] = {}
        run: list[int] = []
        key = (-1, "", -1, -1)
        for part, seq, attempt, i in self.entries:
            lease_id = leases[i].lease_id
            token, base = lease_id[:24], seq - int(lease_id[24:], 16)
            # Leases of one range come one after another (the entries are by delivery).
            if token != key[1] or base != key[3] or attempt != key[2] or part != key[0]:
                key = (part, token, attempt, base)
                run = runs.setdefault(key, [])
            run.append(seq)
            run.append(i)
        self.order = [i for run in runs.values() for i in run[1::2]]
        return _range_arrays([(key, run[0::2]) for key, run in runs.items()])

    def _general(self, leases: Sequence[Lease],
                 groups: Mapping[tuple[str, str], tuple[int, int]]) -> None:
        """Any batch: invalid leases answered here, duplicates folded, the rest sorted."""
        firsts: dict[tuple[str, str, str, str, int, int], int] = {}
        entries: list[tuple[int, int, int, str, int, int]] = []
        lease_pattern = _LEASE_ID.fullmatch
        for i, lease in enumerate(leases):
            event = lease.event
            stream, part, seq = event.stream, event.partition, event.sequence
            found = groups.get((stream, lease.group))
            if found is None or type(part) is not int or not 0 <= part < found[1]:
                self.results[i] = SettleResult.failure(
                    lease.lease_id, SettleKind.INVALID, "lease names no group of this backend")
                continue
            if type(seq) is not int or not 0 < seq <= BIGINT_MAX:
                self.results[i] = SettleResult.failure(
                    lease.lease_id, SettleKind.INVALID, "lease names no delivery of this backend")
                continue
            lease_id, receipt = lease.lease_id, lease.receipt
            key = (lease_id, receipt, stream, lease.group, part, seq)
            if key in firsts:
                self.duplicates.append((i, firsts[key]))
                continue
            firsts[key] = i
            # Our lease ids are 32 lowercase hex digits and receipts
            # "{partition}-{sequence}-{attempt}"; anything else matches nothing.
            if type(lease_id) is not str or lease_pattern(lease_id) is None:
                lease_id = _NIL_UUID
            attempt = lease.attempt
            if (type(attempt) is not int or not 0 < attempt < _MAX_ATTEMPT
                    or receipt != f"{part}-{seq}-{attempt}"):
                # Not the receipt this lease was issued with: the receipt decides.
                attempt = _receipt_attempt(receipt, part, seq)
            entries.append((found[0], part, seq, lease_id, attempt, i))
        entries.sort()
        self.order = [e[5] for e in entries]
        self._args = (
            tuple(_array(map(str, column)) for column in zip(*entries, strict=True))[:5]
            if entries else ()
        )

    def apply(self, bad_idx: list[int] | None, bad_code: list[int] | None,
              bad_by: list[int | None] | None, deadline_ms: int | None) -> None:
        """Record the function's answer: listed positions failed, the rest took effect."""
        leases, results = self.leases, self.results
        if not bad_idx:  # the common case: every lease took effect
            if deadline_ms is None:
                for i in self.order:
                    results[i] = settle_ok(leases[i].lease_id)
            else:
                for i in self.order:
                    results[i] = SettleResult(leases[i].lease_id, None, False, deadline_ms)
            return
        if bad_code is None or bad_by is None:
            raise RuntimeError("a settle reply listed failed leases without their codes")
        bad = {i: (c, b) for i, c, b in zip(bad_idx, bad_code, bad_by, strict=True)}
        for position, i in enumerate(self.order, start=1):
            code, by = bad.get(position, (0, None))
            results[i] = _result(leases[i].lease_id, code, by, deadline_ms)

    def finish(self, *, renew: bool) -> list[SettleResult]:
        """Every lease's result, in the batch's order; duplicates answered as their first."""
        for i, first in self.duplicates:
            prior = self.results[first]
            if prior is None:
                raise RuntimeError(f"lease {self.leases[first].lease_id} got no result")
            lease_id = self.leases[i].lease_id
            if prior.ok:
                self.results[i] = (
                    SettleResult.success(lease_id, deadline_ms=prior.deadline_ms) if renew
                    else SettleResult.success(lease_id, repeated=True)
                )
            else:
                self.results[i] = SettleResult(lease_id, prior.error)
        out = [result for result in self.results if result is not None]
        if len(out) != len(self.results):
            raise RuntimeError("a settle reply left leases of the batch without a result")
        return out


def _range_arrays(runs: Sequence[tuple[tuple[int, str, int, int], list[int]]]
                  ) -> tuple[str, ...]:
    """``ack_ranges``'s seven array parameters (functions/ack_ranges.sql) for runs of
    leases, each its (partition, token, attempt, base) and its sequences, ascending
    and distinct: their lowest sequence, a bit per sequence from it, their count."""
    bits: list[str] = []
    for _, seqs in runs:
        lo, width = seqs[0], seqs[-1] - seqs[0] + 1
        if width == len(seqs):
            bits.append("1" * width)
        else:
            mask = bytearray(b"0" * width)
            for seq in seqs:
                mask[seq - lo] = 49  # "1"
            bits.append(mask.decode())
    return (
        _array([str(key[0]) for key, _ in runs]),
        _array([key[1] for key, _ in runs]),
        _array([str(key[2]) for key, _ in runs]),
        _array([str(key[3]) for key, _ in runs]),
        _array([str(seqs[0]) for _, seqs in runs]),
        _array(bits),
        _array([str(len(seqs)) for _, seqs in runs]),
    )


def _array(items: Iterable[str]) -> str:
    """The text of a PostgreSQL array of ``items`` (which need no quoting)."""
    return "{" + ",".join(items) + "}"


def _receipt_attempt(receipt: object, part: int, seq: int) -> int:
    """The attempt a receipt names for (part, seq), or -1 (matches no delivery)."""
    if type(receipt) is str:
        head, _, tail = receipt.rpartition("-")
        if (tail.isascii() and tail.isdigit() and len(tail) < 10
                and head == f"{part}-{seq}"):
            return int(tail)
    return -1


_FAILURES: Final[dict[int, tuple[SettleKind, str]]] = {
    2: (SettleKind.STALE_LEASE, "the delivery was leased again"),
    3: (SettleKind.RECEIPT_MISMATCH, "receipt does not match the lease"),
    5: (SettleKind.STALE_LEASE, "the delivery was replayed, reset or trimmed"),
    6: (SettleKind.INVALID, "lease names no delivery of this backend"),
}
"""The settle function's failure codes (see functions/settle.sql) but 4 (settled by
another operation, named in the message) and 7 (changed concurrently: the default)."""


def _result(lease_id: str, code: int, by: int | None, deadline_ms: int | None) -> SettleResult:
    if code == 0:
        return SettleResult(lease_id, None, False, deadline_ms)
    if code == 1:
        return SettleResult.success(lease_id, repeated=True)
    if code == 4:
        return SettleResult.failure(lease_id, SettleKind.STALE_LEASE,
                                    f"already settled by {_OP_NAMES.get(by, by)}")
    kind, message = _FAILURES.get(
        code, (SettleKind.FAILED, "the delivery changed concurrently; retry"))
    return SettleResult.failure(lease_id, kind, message)
