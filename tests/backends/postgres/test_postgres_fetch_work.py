"""What a PostgreSQL fetch reads (schema version 10): only the partitions with work
(functions/fetch_work.sql), and of the delivery rows only those due (deliveries_due
and deliveries_expiry bound their scans by the time). Each probe fetch runs in a
transaction of its own that is rolled back, and the statistics of that transaction
(``pg_stat_get_xact_*``) count the index scans it made and the entries they returned:
what these tests hold to is how much a fetch reads, which does not depend on the
machine's speed. Every test works in its own schema (the ``postgres_*`` fixtures of
tests/conftest.py)."""

from __future__ import annotations

import asyncpg
import pytest

from rheo_flow import NewEvent, Rheo

HOUR = 3_600_000

_READS = """
SELECT c.relname, pg_stat_get_xact_numscans(c.oid) AS scans,
       pg_stat_get_xact_tuples_returned(c.oid) AS returned
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind = 'i'
"""


async def _probe_fetch(admin: asyncpg.Connection, schema: str, stream: str, group: str,
                       parts: list[int], limit: int = 100
                       ) -> tuple[list[tuple[int, int]], dict[str, tuple[int, int]]]:
    """A fetch through the function, rolled back: its (partition, sequence) pairs and,
    per index of the schema, (scans, entries returned) by the fetch. The session's
    counts not yet reported may include earlier transactions' (they are reported
    at most once a second), but never change within a transaction: the fetch's
    are the difference."""
    q = f'"{schema}"'
    gid = await admin.fetchval(
        f"SELECT g.id FROM {q}.groups g JOIN {q}.streams s ON s.id = g.stream_id "
        "WHERE s.name = $1 AND g.name = $2", stream, group)
    tx = admin.transaction()
    await tx.start()
    try:
        before = {r["relname"]: (r["scans"], r["returned"])
                  for r in await admin.fetch(_READS, schema)}
        rows = await admin.fetch(f"SELECT o_part, o_seq FROM {q}.fetch($1, $2, $3, $4, 'probe')",
                                 gid, parts, limit, HOUR)
        reads = {r["relname"]: (r["scans"] - before[r["relname"]][0],
                                r["returned"] - before[r["relname"]][1])
                 for r in await admin.fetch(_READS, schema)}
    finally:
        await tx.rollback()
    return [(r["o_part"], r["o_seq"]) for r in rows], reads


def _delivery_entries(reads: dict[str, tuple[int, int]]) -> int:
    """The entries the delivery rows' indexes returned (their primary key aside)."""
    return sum(returned for name, (_, returned) in reads.items()
               if name.startswith("deliveries_") and name != "deliveries_pkey")


async def _append(rheo: Rheo, stream: str, part: int, count: int) -> None:
    for start in range(0, count, 1000):
        await rheo.append(stream, [NewEvent("t", {"i": i})
                                   for i in range(start, min(count, start + 1000))],
                          partition=part)


async def test_a_backlog_delayed_into_the_future_is_not_read(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s", partitions=4)
    for part in range(4):
        await _append(rheo, "s", part, 600)
    held = []
    while len(held) < 2000:
        held += await rheo.fetch("s", "g", consumer_id="a", limit=1000, lease_ms=HOUR)
    # 2,000 retries waiting for half an hour (delivery rows), 10 due at once.
    assert all(r.ok for r in await rheo.nack(held[10:], "later", delay_ms=HOUR // 2))
    assert all(r.ok for r in await rheo.nack(held[:10], "now"))
    leases, reads = await _probe_fetch(postgres_admin, postgres_schema, "s", "g",
                                       [0, 1, 2, 3])
    due = {(lease.partition, lease.sequence) for lease in held[:10]}
    assert due <= set(leases), "the retries due come back"
    assert not {(lease.partition, lease.sequence) for lease in held[10:]} & set(leases)
    # The delivery rows' indexes give back the 10 due rows, and one entry per
    # partition to the search for partitions with work; none of the 1,990 waiting.
    assert _delivery_entries(reads) <= 10 + 4 + 4, reads
    # The fetch itself (not rolled back) agrees.
    fetched = await rheo.fetch("s", "g", consumer_id="b", limit=100, lease_ms=HOUR)
    assert due <= {(lease.partition, lease.sequence) for lease in fetched}
    assert {lease.attempt for lease in fetched if (lease.partition, lease.sequence) in due} == {2}


async def test_leases_held_for_an_hour_are_not_read(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s", partitions=4)
    await rheo.create_group("s", "k", ordering="key")
    await rheo.append("s", [NewEvent("t", {"i": i}, key=f"k{i}") for i in range(2400)])
    for group in ("g", "k"):  # ranges, and a key-ordered group's delivery rows
        held = []
        while len(held) < 2000:
            held += await rheo.fetch("s", group, consumer_id="a", limit=1000, lease_ms=HOUR)
        leases, reads = await _probe_fetch(postgres_admin, postgres_schema, "s", group,
                                           [0, 1, 2, 3])
        assert len(leases) == 100
        assert not {(x.partition, x.sequence) for x in held} & set(leases)
        # One entry per partition, to the search for partitions with work.
        assert _delivery_entries(reads) <= 4, (group, reads)
        assert reads["ranges_expiry"][1] <= 4, (group, reads)


async def test_idle_partitions_are_not_visited(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    rheo = postgres_rheo
    parts = list(range(256))
    await rheo.create_stream("s", partitions=256)
    await rheo.create_stream("empty", partitions=256)
    await _append(rheo, "s", 0, 300)
    for stream in ("s", "empty"):
        await rheo.create_group(stream, "g")
        leases, reads = await _probe_fetch(postgres_admin, postgres_schema, stream, "g", parts)
        assert leases == ([(0, seq) for seq in range(1, 101)] if stream == "s" else [])
        # The search for partitions with work reads the cursors and high waters once
        # each; then only partition 0 is claimed (a cursor, its high water, the move).
        assert reads["cursors_pkey"][0] <= 3, reads["cursors_pkey"]
        assert reads["partitions_pkey"][0] <= 2, reads["partitions_pkey"]
        # No partition has delivery rows or ranges due: one descent of each index
        # finds that, and no frontier is read.
        for index in ("deliveries_due", "deliveries_expiry", "ranges_expiry"):
            assert reads[index][0] <= 1, (index, reads[index])
        assert reads["frontiers_pkey"][0] == 0


async def test_the_limit_goes_to_the_partitions_with_work(postgres_rheo: Rheo) -> None:
    rheo = postgres_rheo
    await rheo.create_stream("s", partitions=256)
    for part in (3, 100, 200):
        await _append(rheo, "s", part, 10)
    first = await rheo.fetch("s", "g", consumer_id="a", limit=6, lease_ms=HOUR)
    assert sorted(lease.partition for lease in first) == [3, 3, 100, 100, 200, 200]
    # Partition 100 gets a retry due at once: it comes first there, the turns stay even.
    retry = next(lease for lease in first if lease.partition == 100)
    assert (await rheo.nack([retry], "again"))[0].ok
    second = await rheo.fetch("s", "g", consumer_id="a", limit=9, lease_ms=HOUR)
    assert sorted(lease.partition for lease in second) == [3] * 3 + [100] * 3 + [200] * 3
    from_100 = [lease for lease in second if lease.partition == 100]
    assert (from_100[0].sequence, from_100[0].attempt) == (retry.sequence, 2)
    assert [lease.sequence for lease in from_100[1:]] == [3, 4]


async def test_a_fetch_is_not_compiled_by_jit(
        postgres_rheo: Rheo, postgres_schema: str, postgres_admin: asyncpg.Connection) -> None:
    # A session with JIT on, as through PgBouncer (the backend's own pool turns it
    # off): the plans of fetch's statements stay below jit_above_cost.
    rheo, admin = postgres_rheo, postgres_admin
    await rheo.create_stream("s", partitions=4)
    await _append(rheo, "s", 0, 10)
    await rheo.create_group("s", "g")
    try:
        await admin.execute("LOAD 'auto_explain'")
    except asyncpg.PostgresError as exc:
        pytest.skip(f"auto_explain cannot be loaded here: {exc}")
    for setting in ("jit = on", "jit_above_cost = 100000", "auto_explain.log_min_duration = 0",
                    "auto_explain.log_nested_statements = on", "auto_explain.log_analyze = on",
                    "auto_explain.log_level = notice"):
        await admin.execute(f"SET {setting}")
    plans: list[str] = []
    admin.add_log_listener(lambda _conn, message: plans.append(message.message))
    leases, _ = await _probe_fetch(admin, postgres_schema, "s", "g", [0, 1, 2, 3])
    assert len(leases) == 10
    # The common case (claim_fresh), then with a retry due the steps (fetch_work).
    assert any("claim_fresh" in plan for plan in plans)
    retry = await rheo.fetch("s", "g", consumer_id="a", limit=1, lease_ms=HOUR)
    assert (await rheo.nack(retry, "again"))[0].ok
    leases, _ = await _probe_fetch(admin, postgres_schema, "s", "g", [0, 1, 2, 3])
    assert len(leases) == 10
    assert any("fetch_work" in plan for plan in plans)
    assert not [plan for plan in plans if "JIT:" in plan]
