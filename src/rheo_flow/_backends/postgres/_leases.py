"""Leases of the PostgreSQL backend: fetch, and the fenced settles and renewals.

Each is ONE round trip to a server-side function (defined in ``functions/``):

* ``fetch`` claims eligible deliveries with ``FOR UPDATE SKIP LOCKED`` (expired
  leases with attempt + 1, or dead-lettered past ``max_attempts``), then
  materialises new deliveries past the group's cursor, in round-robin order
  across partitions and sequence order within each; a key-ordered group's
  fetch leases only the first unsettled delivery of each key (see
  ``functions/fetch_keyed.sql``);
* ``ack`` / ``nack`` / ``reject`` / ``renew`` take the whole batch as arrays (see
  :class:`~._batch.SettleBatch`); a delivery changes only while it is still
  leased under the very lease (and receipt) that settles it, and settles that
  finish deliveries move the stored contiguous frontier forward in the same call.

Lease deadlines come from the database clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._model._errors import UnknownGroup
from ..._model._event import decode_json, make_event_json
from ..._model._lease import Lease, make_lease
from ..._model._settle_results import SettleResult
from ._batch import OP_CODES, Op, SettleBatch
from ._core import PostgresCore, StreamMeta
from ._pool import Fetches

__all__ = ["LeaseOps"]

_NO_RANGES = ("{}",) * 7
"""``ack_ranges_fetch``'s acks when there are none."""


class LeaseOps(PostgresCore):
    """Lease operations: fetch, ack, nack, reject, renew, and acks in a caller's transaction."""

    one_call_ack_and_fetch = True

    async def fetch(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> list[Lease]:
        gid, ids = await self._fetch_args(stream, group, partitions)
        if not ids:
            return []
        pool = await self._ready()
        try:
            rows = await pool.fetch(self._sql.fetch, gid, ids, limit, lease_ms, consumer_id)
        except Exception as exc:
            self._check_group(exc, stream, group)
            raise
        return self._issue(rows, stream, group, consumer_id)

    async def ack_and_fetch(
        self,
        acks: Sequence[Lease],
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> tuple[list[SettleResult], list[Lease]]:
        """The acks and the fetch in one call and one durable commit: ``ack_ranges_fetch``
        (acks per range) for a batch of this group, else ``ack_fetch`` (lease by lease)."""
        gid, ids = await self._fetch_args(stream, group, partitions)
        if not ids:
            return await self.ack(acks) if acks else [], []
        batch = await self._batch(acks, acking=True)
        pool = await self._ready()
        ranges = batch.range_args() if batch.gid == gid else ()
        try:
            if ranges or not batch.sends:
                # The acks' answer, then the leases (functions/ack_ranges.sql).
                head, *rows = await pool.fetch(self._sql.ack_ranges_fetch,
                                               *(ranges or _NO_RANGES), gid, ids, limit,
                                               lease_ms, consumer_id)
            else:
                rows = await pool.fetch(self._sql.ack_fetch, *batch.args, gid, ids, limit,
                                        lease_ms, consumer_id)
                head = rows[0]
                if head["o_seq"] is None:  # no lease: the row carries the acks' answer only
                    rows = []
        except Exception as exc:
            self._check_group(exc, stream, group)
            raise
        if batch.sends:
            batch.apply(head["bad_idx"], head["bad_code"], head["bad_by"], None)
        return batch.finish(renew=False), self._issue(rows, stream, group, consumer_id)

    def _issue(self, rows: Sequence[Sequence[Any]], stream: str, group: str,
               consumer_id: str) -> list[Lease]:
        """The leases of a fetch's rows, vouched for from now on (see :mod:`.._issued`)."""
        leases = _leases(rows, stream, group, consumer_id)
        self._issued.register(leases)
        return leases

    async def _fetch_args(self, stream: str, group: str, partitions: Sequence[int] | None
                          ) -> tuple[int, list[int]]:
        """The group's id and the partitions to fetch from, in this fetch's rotation."""
        meta = await self._stream(stream)
        gid = await self._group_id(stream, group)
        ids = list(range(meta.partitions)) if partitions is None else list(partitions)
        if ids:
            ids = self._rotation.order(gid, ids)
            self._listener.fetching(stream)
        return gid, ids

    def _check_group(self, exc: Exception, stream: str, group: str) -> None:
        """Raise :class:`~rheo_flow.UnknownGroup` when a fetch found its group deleted."""
        if getattr(exc, "sqlstate", None) == "RF001":
            self._forget()
            raise UnknownGroup(stream, group) from None

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return await self._settle(leases, "ack", "", 0)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return await self._settle(leases, "nack", reason, delay_ms, error)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return await self._settle(leases, "reject", reason, 0, error)

    async def _settle(self, leases: Sequence[Lease], op: Op, reason: str, delay_ms: int,
                      error: str | None = None, conn: Fetches | None = None
                      ) -> list[SettleResult]:
        """Settle on ``conn`` (the caller's transaction), else on a pooled connection."""
        batch = await self._batch(leases, acking=op == "ack")
        if batch.sends:
            on: Fetches = conn if conn is not None else await self._ready()
            ranges = batch.range_args() if op == "ack" else ()
            # One row: a function's OUT parameters (functions/settle.sql).
            if ranges:
                [row] = await on.fetch(self._sql.ack_ranges, batch.gid, *ranges)
            else:
                [row] = await on.fetch(
                    self._sql.settle, OP_CODES[op], *batch.args, reason, delay_ms, error
                )
            batch.apply(row["bad_idx"], row["bad_code"], row["bad_by"], None)
        return batch.finish(renew=False)

    async def ack_in_transaction(self, conn: Any, leases: Sequence[Lease]
                                 ) -> list[SettleResult]:
        """Ack ``leases`` on the caller's connection, inside its open transaction.

        The acks (and the frontier moves they cause) commit or roll back together
        with whatever else the caller wrote in that transaction: a sink writing
        rows and acking their leases at once has an exactly-once effect. ``conn``
        must be an asyncpg connection (or pool proxy) or a psycopg 3 connection
        reaching this backend's database (:mod:`._outbox`). Row locks on the settled deliveries
        and their frontiers are held until the caller's transaction ends, so keep
        it short after this call. Results are as for :meth:`ack`.
        """
        caller = await self._check_caller(conn, "ack")
        return await self._settle(leases, "ack", "", 0, None, caller)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        batch = await self._batch(leases)
        if batch.sends:
            pool = await self._ready()
            [row] = await pool.fetch(self._sql.renew, *batch.args, lease_ms)
            batch.apply(row["bad_idx"], row["bad_code"], row["bad_by"], row["deadline_ms"])
        return batch.finish(renew=True)

    async def _batch(self, leases: Sequence[Lease], *, acking: bool = False) -> SettleBatch:
        """Resolve the groups a batch names (one query for those not cached yet); a batch
        of acks may be of leases this backend issued (see :mod:`.._issued`)."""
        groups: dict[tuple[str, str], tuple[int, int]] = {}
        missing: set[tuple[str, str]] = set()
        for lease in leases:
            key = (lease.stream, lease.group)
            if key in groups or key in missing:
                continue
            gid = self._groups.get(key)
            meta = self._streams.get(lease.stream)
            if gid is not None and meta is not None:
                groups[key] = (gid, meta.partitions)
            else:
                missing.add(key)
        if missing:
            pool = await self._ready()
            names = sorted(missing)
            for row in await pool.fetch(
                self._sql.groups_by_name, [s for s, _ in names], [g for _, g in names]
            ):
                key = (row["stream"], row["group_name"])
                groups[key] = (row["group_id"], row["partitions"])
                self._groups[key] = row["group_id"]
                self._streams.setdefault(row["stream"], StreamMeta(
                    row["stream_id"], row["partitions"], row["created_at_ms"]))
        return SettleBatch(leases, groups, self._issued if acking else None)


def _leases(rows: Sequence[Sequence[Any]], stream: str, group: str, consumer_id: str
            ) -> list[Lease]:
    """The leases of a fetch's rows: its reply columns o_part .. o_appended in their order
    (functions/fetch.sql), and ack_fetch's bad_* after them."""
    leases: list[Lease] = []
    append = leases.append
    # This loop runs once per leased event: data stays JSON text until read, and the
    # columns are unpacked in their order (one step) rather than looked up by name; a
    # slice of the record costs half of a starred unpacking of it.
    for row in rows:
        part, seq, attempt, lease_uuid, deadline, event_id, type_, key, data, heads, at = row[:11]
        event = make_event_json(stream, part, seq, event_id, type_, data, key,
                                decode_json(heads) if heads is not None else {}, at)
        append(make_lease(lease_uuid.bytes.hex(), f"{part}-{seq}-{attempt}", group, consumer_id,
                          event, attempt, deadline))
    return leases
