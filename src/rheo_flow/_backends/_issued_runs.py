"""The blocks of new deliveries a backend object leased, and the runs of their leases an
ack names (SQLite's new ranges, Redis's blocks).

The common fetch leases new deliveries as one block per partition (a range on
SQLite, a block on Redis): its leases are built from it in sequence order. The
registry keeps each such block by token with its leases, the very objects handed
out. A batch of acks that names runs of them, each run consecutive leases of one
block in their order (a ``Group`` acks what it fetched, mostly in the order
fetched), is recognised by identity alone, one test a lease in C
(``map(operator.is_, ...)``), and travels as runs: SQLite's backend thread marks
each run with one slice of its range's marks (``sqlite/_ranges.take_runs``), Redis
sends the run form of ``settle.lua`` without checking every lease's fields first.
What a run settles is taken from the registry (the block's token, partition and
the run's sequences), never from the leases' fields, so an ack of a run settles
exactly the events those lease objects were issued for. A lease is immutable:
being that object is being that lease.

Anything else (a lease of another block, out of order, twice, built elsewhere) is
left to the per-lease path, which checks every lease (:meth:`IssuedRuns.vouch`
saves SQLite the checks of the fields for leases of registered blocks). Whether a
run is still in flight is the store's to say: a block leased again since has
another token, an event acked already is marked; either sends the batch the
per-lease way, which answers each lease (``repeated``, ``stale_lease``...).

The registry keeps the blocks of at most :data:`LIMIT` leases (the oldest go
first); a block whose leases were all settled leaves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from operator import is_
from typing import Final

from .._model._lease import Lease

__all__ = ["IssuedRuns", "Run"]

LIMIT: Final = 16_384
"""Leases kept at most, counted over the blocks held (the oldest blocks go first). The
blocks hold the leases themselves, events and data included, so the bound is what a
consumer keeps in flight, not more: the leases of a block dropped still settle, the
per-lease way."""


@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive leases of one registered block, as an ack sends them: the block's
    stream, group, partition and token, and the run's first and last sequence."""

    stream: str
    group: str
    part: int
    token: str
    lo: int
    hi: int


class _Block:
    """A registered block: where it is, its first sequence, its leases in sequence
    order, which of them were settled here (a byte each) and how many were not."""

    __slots__ = ("first", "group", "leases", "left", "part", "settled", "stream", "token")

    def __init__(self, stream: str, group: str, part: int, token: str, first: int,
                 leases: list[Lease]) -> None:
        self.stream = stream
        self.group = group
        self.part = part
        self.token = token
        self.first = first
        self.leases = leases
        self.settled = bytearray(len(leases))
        self.left = len(leases)


class IssuedRuns:
    """The blocks of new deliveries one backend object leased, by token; ``token_of``
    tells a lease id's block token (``None``: not a block lease)."""

    __slots__ = ("_blocks", "_held", "_token_of")

    def __init__(self, token_of: Callable[[str], str | None]) -> None:
        self._blocks: dict[str, _Block] = {}
        self._held = 0  # leases of the blocks held
        self._token_of = token_of

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def leases_held(self) -> int:
        """How many leases the blocks held have (settled ones included)."""
        return self._held

    def register(self, stream: str, group: str, part: int, token: str, first: int,
                 leases: list[Lease]) -> None:
        """Keep a new block: ``leases`` are its leases from sequence ``first`` on, in order.

        The registry keeps a copy of the list: the caller's may change (a lease taken
        out of it would shift every later one onto another sequence)."""
        blocks = self._blocks
        blocks[token] = _Block(stream, group, part, token, first, list(leases))
        self._held += len(leases)
        if self._held > LIMIT:  # leases never settled here: drop the oldest blocks at once
            for key in list(blocks):
                if self._held <= LIMIT * 3 // 4 or key == token:
                    break
                self._drop(key)

    def _drop(self, token: str) -> None:
        self._held -= len(self._blocks.pop(token).leases)

    def _at(self, lease: Lease) -> tuple[_Block, int] | None:
        """The registered block holding ``lease`` (that very object) and its index there."""
        lease_id = lease.lease_id
        if lease_id.__class__ is not str:  # a forged lease may hold anything
            return None
        token = self._token_of(lease_id)
        found = None if token is None else self._blocks.get(token)
        if found is None:
            return None
        index = lease.event.sequence - found.first
        if index.__class__ is not int or not 0 <= index < len(found.leases):
            return None
        return (found, index) if found.leases[index] is lease else None

    def runs(self, leases: Sequence[Lease]) -> list[Run] | None:
        """``leases`` as runs of registered blocks, in their order; ``None`` unless every
        lease is in one (each lease then belongs to exactly one run)."""
        out: list[Run] = []
        i, total = 0, len(leases)
        while i < total:
            at = self._at(leases[i])
            if at is None:
                return None
            found, index = at
            held = found.leases
            n = min(total - i, len(held) - index)
            if not all(map(is_, leases[i:i + n], held[index:index + n])):
                n = 1  # the run ends somewhere inside: find where, a lease at a time
                while i + n < total and index + n < len(held) and leases[i + n] is held[index + n]:
                    n += 1
            lo = found.first + index
            out.append(Run(found.stream, found.group, found.part, found.token, lo, lo + n - 1))
            i += n
        return out

    def acked(self, runs: Sequence[Run]) -> None:
        """``runs`` were acked: a block whose leases all were settled leaves the registry."""
        blocks = self._blocks
        for run in runs:
            found = blocks.get(run.token)
            if found is not None:
                self._mark(found, run.lo - found.first, run.hi - found.first + 1)

    def settled(self, leases: Sequence[Lease], positions: Iterable[int]) -> None:
        """The leases of ``leases`` at ``positions`` (vouched for) were settled (acked,
        nacked or rejected; answered, whatever the answer): a block whose leases all
        were leaves the registry."""
        for i in positions:
            at = self._at(leases[i])
            if at is not None:
                found, index = at
                self._mark(found, index, index + 1)

    def _mark(self, found: _Block, a: int, b: int) -> None:
        """The leases ``a`` to ``b`` (excluded) of ``found`` were settled; the block leaves
        the registry once all of its were."""
        found.left -= b - a - found.settled.count(1, a, b)
        found.settled[a:b] = b"\x01" * (b - a)
        if found.left <= 0:
            self._drop(found.token)

    def vouch(self, leases: Sequence[Lease]) -> set[int]:
        """The positions in ``leases`` of leases of registered blocks (those very objects):
        the per-lease path checks only what the stored block can answer for them."""
        if not self._blocks:
            return set()
        return {i for i, lease in enumerate(leases) if self._at(lease) is not None}
