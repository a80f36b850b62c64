"""Acks sent per range (functions/ack_ranges.sql): the one-statement common case, and the
batches it hands to the lease-by-lease settle, with every lease's result in its place."""

from __future__ import annotations

import asyncio

import asyncpg

from rheo_flow import Lease, NewEvent, Rheo, SettleKind
from rheo_flow._backends.postgres._batch import SettleBatch


async def _ranges(admin: asyncpg.Connection, schema: str) -> list[tuple[int, int, str, int]]:
    rows = await admin.fetch(f'SELECT first_seq, last_seq, done::text, pending '
                             f'FROM "{schema}".ranges ORDER BY first_seq')
    return [tuple(r) for r in rows]


async def test_acks_with_gaps_set_the_bits_of_their_range(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", {"i": i}) for i in range(8)])
    leases = await rheo.fetch("s", "g", limit=8)
    # Sequences 1, 3, 4 and 8: one element of the range, its bits 10110001.
    batch = SettleBatch([leases[7], leases[0], leases[3], leases[2]], {("s", "g"): (1, 1)})
    [part, _, _, _, lo, bits, count] = batch.range_args()
    assert (part, lo, bits, count) == ("{0}", "{1}", "{10110001}", "{4}")
    assert all(r.ok and not r.repeated
               for r in await rheo.ack([leases[7], leases[0], leases[3], leases[2]]))
    assert await _ranges(postgres_admin, postgres_schema) == [(1, 8, "10110001", 4)]
    assert await rheo.frontier("s", "g") == {0: 1}
    results = await rheo.ack(leases)
    assert [r.repeated for r in results] == [True, False, True, True, False, False, False, True]
    assert all(r.ok for r in results)
    assert await _ranges(postgres_admin, postgres_schema) == [(1, 8, "11111111", 0)]
    assert await rheo.frontier("s", "g") == {0: 8}


async def test_a_batch_mixing_ranges_rows_and_stale_leases_answers_each_lease(
        postgres_rheo: Rheo) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", {"i": i}) for i in range(8)])
    first = await rheo.fetch("s", "g", limit=2, lease_ms=10)  # sequences 1 and 2
    # Those two expire and are leased again under a new token (the first leases are
    # stale); 3..8 come as a new range.
    leases: list[Lease] = []
    while len(leases) < 8:
        leases += await rheo.fetch("s", "g", limit=8)
    assert sorted((lease.sequence, lease.attempt) for lease in leases)[:3] == [
        (1, 2), (2, 2), (3, 1)]
    [third] = [lease for lease in leases if lease.sequence == 3]
    assert all(r.ok for r in await rheo.nack([third], "again"))  # split off into a row
    [again] = await rheo.fetch("s", "g", limit=8)
    assert (again.sequence, again.attempt) == (3, 2)
    rest = [lease for lease in leases if lease.sequence != 3]
    results = await rheo.ack([first[0], again, *rest, first[1]])
    kinds = [r.error.kind if r.error else None for r in results]
    assert kinds == [SettleKind.STALE_LEASE, *[None] * 8, SettleKind.STALE_LEASE]
    assert await rheo.frontier("s", "g") == {0: 8}


async def test_a_fetch_after_acks_waits_for_a_busy_cursor_only_briefly(
        postgres_rheo: Rheo, postgres_schema: str, postgres_url: str,
        postgres_admin: asyncpg.Connection) -> None:
    # A fetch that holds nothing else waits for the cursor another fetch holds; one
    # that follows acks in the same call (holding their locks) gives up soon instead,
    # since the other fetch may be waiting for one of those locks.
    rheo, q = postgres_rheo, f'"{postgres_schema}"'
    await rheo.create_stream("s")
    await rheo.append("s", [NewEvent("t", {"i": i}) for i in range(3)])
    await rheo.create_group("s", "g")
    gid = await postgres_admin.fetchval(f"SELECT id FROM {q}.groups")
    fetch = f"SELECT count(*) FROM {q}.fetch($1, '{{0}}', 10, 60000, 'c')"
    other = await asyncpg.connect(postgres_url)
    try:
        holder = postgres_admin.transaction()
        await holder.start()
        await postgres_admin.execute(f"SELECT 1 FROM {q}.cursors FOR UPDATE")
        async with other.transaction():
            await other.execute("SELECT set_config('rheo_flow.holding_locks', 'on', true)")
            assert await other.fetchval(fetch, gid) == 0  # while the cursor is still held
            assert await other.fetchval("SHOW lock_timeout") == "0"
        waiting = asyncio.ensure_future(other.fetchval(fetch, gid))
        assert await postgres_admin.fetchval("SELECT 1") == 1
        assert not waiting.done()
        await holder.rollback()
        assert await waiting == 3  # it waited for the cursor, then leased all three
    finally:
        await other.close()
