"""The common case of a PostgreSQL fetch (functions/fetch_work.sql, ``claim_fresh``):
with only new events to lease and a cursor free, the fetch claims the cursors at
once instead of finding its work step by step (``fetch_work``, then the rows due,
the expired ranges and ``claim_cursors``). In each state below, one probe fetch as
it runs and one with ``claim_fresh`` replaced by a function that finds nothing
(so the steps run), each in a transaction of its own that is rolled back, must
lease the same events in the same order with the same attempts; the
transaction's function statistics (``pg_stat_get_xact_function_calls``) say
which way the fetch went. Every test works in its own schema (the ``postgres_*``
fixtures of tests/conftest.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from rheo_flow import NewEvent, Rheo

HOUR = 3_600_000

Leased = list[tuple[int, int, int]]

_CALLS = """
SELECT p.proname, pg_stat_get_xact_function_calls(p.oid) AS calls
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = $1 AND p.proname IN ('claim_fresh', 'fetch_work')
"""


async def _gid(admin: asyncpg.Connection, schema: str, stream: str, group: str) -> int:
    gid: int = await admin.fetchval(
        f'SELECT g.id FROM "{schema}".groups g JOIN "{schema}".streams s '
        "ON s.id = g.stream_id WHERE s.name = $1 AND g.name = $2", stream, group)
    return gid


async def _probe(admin: asyncpg.Connection, schema: str, gid: int, parts: list[int],
                 limit: int, *, stepwise: bool = False, acking: bool = False
                 ) -> tuple[Leased, dict[str, int]]:
    """A fetch's leases (partition, sequence, attempt) in its order, and the calls of
    claim_fresh and fetch_work it made; rolled back. ``stepwise``: with
    claim_fresh finding nothing; ``acking``: through ack_ranges_fetch (no acks) rather
    than fetch. A cursor another transaction holds is waited for 200 ms at most."""
    q = f'"{schema}"'
    tx = admin.transaction()
    await tx.start()
    try:
        if stepwise:
            await admin.execute(
                f"CREATE OR REPLACE FUNCTION {q}.claim_fresh(p_group integer, "
                "p_stream integer, p_parts integer[], p_now bigint, OUT k_part integer[], "
                "OUT k_cur bigint[], OUT k_top bigint[], OUT o_idle boolean) LANGUAGE plpgsql "
                "AS $$ BEGIN RETURN; END $$")
        await admin.execute("SET LOCAL track_functions = 'all'")
        await admin.execute("SET LOCAL lock_timeout = '200ms'")
        # The session's counts not yet reported may hold earlier transactions'
        # calls; they do not change within this one: the fetch's are the difference.
        before = {r["proname"]: r["calls"] or 0 for r in await admin.fetch(_CALLS, schema)}
        call = (f"{q}.ack_ranges_fetch('{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', '{{}}', "
                "$1, $2, $3, $4, 'p')" if acking else f"{q}.fetch($1, $2, $3, $4, 'p')")
        rows = await admin.fetch(f"SELECT o_part, o_seq, o_attempt FROM {call}",
                                 gid, parts, limit, HOUR)
        calls = {r["proname"]: (r["calls"] or 0) - before.get(r["proname"], 0)
                 for r in await admin.fetch(_CALLS, schema)}
    finally:
        await tx.rollback()
    # ack_ranges_fetch's first row is the acks' answer.
    return [(r["o_part"], r["o_seq"], r["o_attempt"]) for r in rows
            if r["o_part"] is not None], calls


async def _both(admin: asyncpg.Connection, schema: str, stream: str, group: str,
                parts: list[int], limit: int = 100) -> tuple[Leased, Leased, dict[str, int]]:
    """The leases of the fetch found step by step, those of the fetch as it runs, and
    the calls the latter made; ``ack_ranges_fetch`` (a consumer's call) must lease what
    the steps lease too."""
    gid = await _gid(admin, schema, stream, group)
    stepwise, _ = await _probe(admin, schema, gid, parts, limit, stepwise=True)
    common, calls = await _probe(admin, schema, gid, parts, limit)
    acking, _ = await _probe(admin, schema, gid, parts, limit, acking=True)
    assert acking == stepwise, (parts, limit)
    return stepwise, common, calls


def _took_the_common_case(calls: dict[str, int]) -> bool:
    """Whether the fetch leased what claim_fresh claimed (fetch_work not run)."""
    assert calls.get("claim_fresh", 0) <= 1, calls
    return calls.get("claim_fresh") == 1 and calls.get("fetch_work", 0) == 0


async def _append(rheo: Rheo, stream: str, sizes: dict[int, int]) -> None:
    for part, count in sizes.items():
        await rheo.append(stream, [NewEvent("t", {"i": i}) for i in range(count)],
                          partition=part)


async def test_uneven_backlogs_are_shared_as_the_steps_share_them(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    await postgres_rheo.create_stream("s", partitions=4)
    await postgres_rheo.create_group("s", "g")
    await _append(postgres_rheo, "s", {0: 3, 1: 50, 3: 200})
    for parts, limit in (([0, 1, 2, 3], 100), ([3, 1, 0, 2], 100), ([1, 3], 7), ([2], 10),
                         ([0, 1, 2, 3], 1000)):
        stepwise, common, calls = await _both(postgres_admin, postgres_schema, "s", "g", parts,
                                           limit)
        assert common == stepwise, (parts, limit)
        if common:
            assert _took_the_common_case(calls), (parts, calls)


async def test_ranges_others_hold_keep_the_common_case(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s", partitions=4)
    await _append(rheo, "s", dict.fromkeys(range(4), 60))
    held = await rheo.fetch("s", "g", consumer_id="a", limit=100, lease_ms=HOUR)
    assert len(held) == 100
    stepwise, common, calls = await _both(postgres_admin, postgres_schema, "s", "g", [0, 1, 2, 3])
    assert common == stepwise
    assert len(common) == 100
    assert {a for _, _, a in common} == {1}
    assert _took_the_common_case(calls)


@pytest.mark.parametrize("state", ["expired range", "retries due", "key-ordered",
                                   "scheduled event", "paused"])
async def test_other_work_takes_the_steps(
        state: str, postgres_rheo: Rheo, postgres_schema: str,
        postgres_admin: asyncpg.Connection) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s", partitions=4)
    await rheo.create_group("s", "g", ordering="key" if state == "key-ordered" else "none")
    await rheo.append("s", [NewEvent("t", {"i": i}, key=f"k{i % 7}") for i in range(120)])
    if state == "scheduled event":
        later = datetime.now(UTC) + timedelta(hours=1)
        await rheo.append("s", [NewEvent("t", {}, partition=0, deliver_at=later)])
    leased = await rheo.fetch("s", "g", consumer_id="a", limit=40, lease_ms=HOUR)
    if state == "expired range":
        await postgres_admin.execute(f'UPDATE "{postgres_schema}".ranges SET deadline_ms = 0')
    elif state == "retries due":
        assert all(r.ok for r in await rheo.nack(leased[:5], "again"))
    elif state == "paused":
        await rheo.pause_group("s", "g")
    stepwise, common, calls = await _both(postgres_admin, postgres_schema, "s", "g", [0, 1, 2, 3])
    assert common == stepwise
    assert not _took_the_common_case(calls), calls
    if state == "paused":
        assert common == []
    elif state in ("expired range", "retries due"):
        assert 2 in {a for _, _, a in common}, "the work due is leased again"


async def test_retries_not_due_yet_take_the_steps_and_stay_waiting(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s", partitions=2)
    await _append(rheo, "s", {0: 50, 1: 50})
    leased = await rheo.fetch("s", "g", consumer_id="a", limit=20, lease_ms=HOUR)
    assert all(r.ok for r in await rheo.nack(leased, "later", delay_ms=HOUR))
    stepwise, common, calls = await _both(postgres_admin, postgres_schema, "s", "g", [0, 1])
    assert common == stepwise
    assert len(common) == 80
    assert {a for _, _, a in common} == {1}
    assert not _took_the_common_case(calls)


async def test_a_cursor_another_fetch_holds_is_skipped_and_none_free_is_waited_for(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection,
        postgres_url: str) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s", partitions=3)
    await rheo.create_group("s", "g")
    await _append(rheo, "s", dict.fromkeys(range(3), 10))
    gid = await _gid(postgres_admin, postgres_schema, "s", "g")
    other = await asyncpg.connect(postgres_url)
    try:
        async with other.transaction():
            await other.execute(f'SELECT 1 FROM "{postgres_schema}".cursors '
                                "WHERE group_id = $1 AND part = 1 FOR UPDATE", gid)
            stepwise, common, calls = await _both(postgres_admin, postgres_schema, "s", "g",
                                               [0, 1, 2])
            assert common == stepwise
            assert {p for p, _, _ in common} == {0, 2}
            assert _took_the_common_case(calls)
            await other.execute(f'SELECT 1 FROM "{postgres_schema}".cursors '
                                "WHERE group_id = $1 FOR UPDATE", gid)
            # No cursor free: the whole fetch waits for one (here until the probe's
            # lock timeout) rather than returning at once.
            stepwise, common, calls = await _both(postgres_admin, postgres_schema, "s", "g",
                                               [0, 1, 2])
            assert common == stepwise == []
            assert not _took_the_common_case(calls)
            assert calls["fetch_work"] == 1
    finally:
        await other.close()


async def test_idle_partitions_cost_the_common_case_no_probe(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    await postgres_rheo.create_stream("s", partitions=256)
    await postgres_rheo.create_group("s", "g")
    await _append(postgres_rheo, "s", {0: 300})
    q = f'"{postgres_schema}"'
    gid = await _gid(postgres_admin, postgres_schema, "s", "g")
    reads_sql = """
        SELECT c.relname, pg_stat_get_xact_numscans(c.oid) AS scans
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = $1 AND c.relkind = 'i'"""
    tx = postgres_admin.transaction()
    await tx.start()
    try:
        before = {r["relname"]: r["scans"] for r in await postgres_admin.fetch(reads_sql,
                                                                              postgres_schema)}
        rows = await postgres_admin.fetch(
            f"SELECT o_part, o_seq FROM {q}.ack_ranges_fetch('{{}}', '{{}}', '{{}}', '{{}}', "
            "'{}', '{}', '{}', $1, $2, 100, $3, 'p') WHERE o_part IS NOT NULL",
            gid, list(range(256)), HOUR)
        scans = {r["relname"]: r["scans"] - before[r["relname"]]
                 for r in await postgres_admin.fetch(reads_sql, postgres_schema)}
    finally:
        await tx.rollback()
    assert [(r["o_part"], r["o_seq"]) for r in rows] == [(0, s) for s in range(1, 101)]
    # The cursors and high waters read once each (and the one cursor moved), one
    # descent of each index of work due, no frontier.
    assert scans["cursors_pkey"] <= 3, scans
    assert scans["partitions_pkey"] <= 2, scans
    for index in ("deliveries_due", "deliveries_expiry", "ranges_expiry"):
        assert scans[index] <= 1, (index, scans)
    assert scans["frontiers_pkey"] == 0, scans


async def test_random_backlogs_limits_and_rotations_lease_as_the_steps(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    # 25 drawn cases (seeded), each on a stream of its own: backlogs, cursors already
    # moved, partitions asked for and limits.
    import random
    rnd = random.Random(29)
    for case in range(25):
        partitions = rnd.randint(1, 6)
        stream = f"s{case}"
        await postgres_rheo.create_stream(stream, partitions=partitions)
        await postgres_rheo.create_group(stream, "g")
        await _append(postgres_rheo, stream, {p: rnd.choice([0, 1, 2, 5, 17, 40, 120])
                                              for p in range(partitions)})
        if rnd.random() < 0.5:  # some of it leased already: cursors moved, ranges held
            await postgres_rheo.fetch(stream, "g", consumer_id="a", limit=rnd.randint(1, 30),
                                      lease_ms=HOUR)
        parts = rnd.sample(range(partitions), rnd.randint(1, partitions))
        limit = rnd.choice([1, 3, 10, 64, 100, 1000])
        stepwise, common, _ = await _both(postgres_admin, postgres_schema, stream, "g", parts,
                                          limit)
        assert common == stepwise, (case, parts, limit)
        assert len(common) <= limit
