"""The PostgreSQL lag report: the server function ``lag_report`` (functions/lag_report.sql),
an interface for tools outside rheo-flow (a KEDA postgresql scaler, docs/backends.md,
"Lag from SQL (PostgreSQL)"), and the backend's one-statement ``lag_report``."""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

from rheo_flow import NewEvent, Rheo
from rheo_flow._facade._lag import composed_lag_report

DOCS = Path(__file__).resolve().parents[3] / "docs" / "backends.md"

KEDA_QUERY = ("SELECT COALESCE(sum(lag), 0) FROM rheo_flow.lag_report(ARRAY['orders']) "
              "WHERE grp = 'billing'")
"""The query docs/backends.md gives a KEDA postgresql scaler (schema rheo_flow)."""

SIGNATURE = ("TABLE(stream text, grp text, partition integer, high_water bigint, "
             "frontier bigint, lag bigint, scheduled bigint, oldest_unsettled_ms bigint, "
             "dead_letters bigint, paused boolean, paused_until_ms bigint, read_at_ms bigint)")
"""The columns, which stay as they are across schema versions."""


async def _orders(rheo: Rheo) -> None:
    """Stream orders (4 partitions): billing acked 3 and rejected 1 of 12, shipping none;
    a scheduled event in partition 0; shipping paused."""
    await rheo.create_stream("orders", partitions=4)
    await rheo.create_group("orders", "billing")
    await rheo.create_group("orders", "shipping")
    await rheo.append("orders", [NewEvent("t", {"i": i}, partition=i % 4) for i in range(12)])
    now = await rheo.backend.now_ms()
    await rheo.append("orders", [NewEvent("t", {}, partition=0, deliver_at=now + 3_600_000)])
    leases = await rheo.fetch("orders", "billing", limit=4, partitions=[1])
    assert all(r.ok for r in await rheo.ack(leases[:2]))
    assert all(r.ok for r in await rheo.reject(leases[2:3], "bad"))
    await rheo.pause_group("orders", "shipping")


async def test_the_documented_keda_query_returns_the_groups_lag(
        postgres_rheo: Rheo, postgres_admin: asyncpg.Connection, postgres_schema: str) -> None:
    assert KEDA_QUERY in DOCS.read_text(encoding="utf-8")
    await _orders(postgres_rheo)
    query = KEDA_QUERY.replace("rheo_flow.", f'"{postgres_schema}".')
    billing = (await postgres_rheo.lag_report(["orders"])).group("orders", "billing")
    assert billing is not None
    assert await postgres_admin.fetchval(query) == billing.lag == 13 - 3
    assert await postgres_admin.fetchval(query.replace("'billing'", "'none'")) == 0


async def test_the_function_answers_what_the_backend_reports(
        postgres_rheo: Rheo, postgres_admin: asyncpg.Connection, postgres_schema: str) -> None:
    await _orders(postgres_rheo)
    await postgres_rheo.create_stream("other", partitions=1)
    rows = await postgres_admin.fetch(f'SELECT * FROM "{postgres_schema}".lag_report()')
    report = await postgres_rheo.lag_report()
    assert report.groups == (await composed_lag_report(postgres_rheo.backend, None)).groups
    assert [(r["stream"], r["grp"], r["partition"], r["high_water"], r["frontier"], r["lag"],
             r["scheduled"], r["oldest_unsettled_ms"], r["dead_letters"], r["paused"],
             r["paused_until_ms"]) for r in rows] == [
        (g.stream, g.group, p.partition, p.high_water, p.frontier, p.lag, p.scheduled,
         p.oldest_unsettled_ms, g.dead_letters, g.paused, g.paused_until_ms)
        for g in report.groups for p in g.partitions]
    assert [(g.group, g.dead_letters, g.scheduled, g.paused) for g in report.groups] == [
        ("billing", 1, 1, False), ("shipping", 0, 1, True)]
    assert len({r["read_at_ms"] for r in rows}) == 1
    assert await postgres_admin.fetch(
        f"SELECT * FROM \"{postgres_schema}\".lag_report(ARRAY['missing'])") == []


async def test_the_function_keeps_its_interface(
        postgres_rheo: Rheo, postgres_admin: asyncpg.Connection, postgres_schema: str) -> None:
    await postgres_rheo.lag_report()  # opened: the schema is made
    row = await postgres_admin.fetchrow(
        "SELECT pg_get_function_arguments(p.oid) AS args, pg_get_function_result(p.oid) AS res,"
        " p.provolatile FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = $1 AND p.proname = 'lag_report'", postgres_schema)
    assert row["args"] == "p_streams text[] DEFAULT NULL::text[]"
    assert re.sub(r"\s+", " ", row["res"]) == SIGNATURE
    assert row["provolatile"] == b"s"  # STABLE
