"""The DuckDB sink: exactly once into a table (also across a SIGKILL between the sink's
commit and the ack), poison rows dead-lettered, redeliveries skipped, Parquet exports."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from _sink_helpers import backlog, run_pipeline
from rheo_flow import Event, InvalidArgument, Lease, Rheo
from rheo_flow.backends import SQLiteBackend
from rheo_flow.pipeline import Message
from rheo_flow.sinks import Column, DuckDBSink, RowStatus, Span

WaitUntil = Callable[..., Awaitable[None]]
WORKER = Path(__file__).with_name("_sink_worker.py")
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "duckdb_sink.py"


def _require_duckdb() -> Any:
    try:
        import duckdb
    except ImportError:
        message = "duckdb is not installed: pip install 'rheo-flow[duckdb]'"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return duckdb


duckdb = _require_duckdb()

COLUMNS = [
    Column("event_id", "VARCHAR", "event.id"),
    Column("part", "INTEGER", "event.partition"),
    Column("seq", "BIGINT", "event.sequence"),
    Column("customer", "VARCHAR", "data.customer"),
    Column("amount", "BIGINT", "data.amount", check="amount >= 0"),
    Column("data", "JSON", "data"),
]


def leased(ids: list[str], *, part: int = 0) -> list[Message]:
    """Messages for events ``ids`` (sequences 1..n of one partition)."""
    now = int(time.time() * 1000)
    return [Message(Lease(lease_id=f"{seq:032x}", receipt="r", group="g", consumer_id="c",
                          event=Event("orders", part, seq, event_id, "t",
                                      {"amount": seq, "customer": "c"}, None, {}, now),
                          attempt=1, deadline_ms=now + 60_000))
            for seq, event_id in enumerate(ids, start=1)]


# Exactly once --------------------------------------------------------------------------------


async def test_50k_events_land_exactly_once(tmp_path: Path, wait_until: WaitUntil) -> None:
    async with Rheo("memory://") as rheo, DuckDBSink(tmp_path / "wh.duckdb", table="orders",
                                                     columns=COLUMNS) as sink:
        ids = await backlog(rheo, 50_000)
        pipeline = await run_pipeline(rheo, sink, 50_000, wait_until, rows=5_000)
        assert await sink.query("SELECT count(*), count(DISTINCT event_id), sum(amount) "
                                "FROM orders") == [(50_000, 50_000, sum(range(50_000)))]
        stored = {r[0] for r in await sink.query("SELECT event_id FROM orders")}
        assert stored == set(ids)
        assert pipeline.producer.stats().acked == 50_000
        high = await rheo.high_water("orders")
        assert await sink.progress("orders", "warehouse") == [
            Span(p, 1, high[p]) for p in sorted(high)]
        stats = sink.stats()
        assert stats.written == 50_000
        assert stats.invalid == stats.retry == stats.replayed == 0


async def test_poison_rows_are_dead_lettered_and_their_neighbours_written(
        tmp_path: Path, wait_until: WaitUntil) -> None:
    poison = {17: -1, 2_500: "not a number", 2_501: -5, 7_777: 2**70, 9_999: -3}
    async with Rheo("memory://") as rheo, DuckDBSink(tmp_path / "wh.duckdb", table="orders",
                                                     columns=COLUMNS) as sink:
        await backlog(rheo, 10_000, poison=poison)
        await run_pipeline(rheo, sink, 10_000, wait_until, rows=2_000)
        dead = await rheo.dead_letters("orders", "warehouse")
        reasons = {int(d.event_id.removeprefix("order-")): d.reason for d in dead}
        assert sorted(reasons) == sorted(poison)
        assert "CHECK constraint" in reasons[17]
        assert "Conversion" in reasons[2_500]
        assert all(r.startswith("sink_invalid: ") for r in reasons.values())
        rows = await sink.query("SELECT count(*), count(DISTINCT event_id) FROM orders")
        assert rows == [(10_000 - len(poison), 10_000 - len(poison))]
        present = await sink.query(
            "SELECT count(*) FROM orders WHERE event_id IN ('order-16', 'order-18', "
            "'order-2499', 'order-2502', 'order-7776', 'order-7778', 'order-9998')")
        assert present == [(7,)]
        assert await sink.query("SELECT count(*) FROM orders WHERE amount < 0") == [(0,)]


async def test_a_redelivered_batch_is_skipped_not_written_again(tmp_path: Path) -> None:
    async with DuckDBSink(tmp_path / "wh.duckdb", table="orders", columns=COLUMNS) as sink:
        batch = leased([f"e{i}" for i in range(100)])
        assert all(r.ok and not r.replayed for r in await sink.write(batch[:60]))
        results = await sink.write(batch)
        assert [r.replayed for r in results] == [True] * 60 + [False] * 40
        assert all(r.status is RowStatus.WRITTEN for r in results)
        assert await sink.query("SELECT count(*) FROM orders") == [(100,)]
        assert await sink.progress("orders", "g") == [Span(0, 1, 100)]
        assert sink.stats().fallbacks == 0
        # After a reset, a deliberate replay writes again: the key keeps one row each.
        assert await sink.reset_progress("orders", "g") >= 1
        results = await sink.write(batch)
        assert all(r.ok and not r.replayed for r in results)
        assert await sink.query("SELECT count(*) FROM orders") == [(100,)]
        assert sink.stats().fallbacks == 1


async def test_progress_survives_a_restart_and_gaps_stay_open(tmp_path: Path) -> None:
    db = tmp_path / "wh.duckdb"
    batch = leased([f"e{i}" for i in range(10)])
    async with DuckDBSink(db, table="orders", columns=COLUMNS) as sink:
        await sink.write(batch[:3] + batch[5:])  # sequences 4 and 5 held elsewhere
        assert await sink.progress("orders", "g") == [Span(0, 1, 3), Span(0, 6, 10)]
    async with DuckDBSink(db, table="orders", columns=COLUMNS) as sink:
        results = await sink.write(batch)
        assert [r.replayed for r in results] == [True] * 3 + [False] * 2 + [True] * 5
        assert await sink.progress("orders", "g") == [Span(0, 1, 10)]


async def test_the_progress_log_is_compacted(tmp_path: Path) -> None:
    async with DuckDBSink(tmp_path / "wh.duckdb", table="orders", columns=COLUMNS) as sink:
        batch = leased([f"e{i}" for i in range(400)])
        for i in range(0, 400, 2):  # every other sequence first: 200 separate runs
            await sink.write(batch[i:i + 1])
        for i in range(1, 400, 2):
            await sink.write(batch[i:i + 1])
        assert await sink.progress("orders", "g") == [Span(0, 1, 400)]
        stored = await sink.query("SELECT count(*) FROM rheo_sink_progress")
        assert stored[0][0] <= 64 + 4 * 200


async def test_staged_load_and_the_fallback_keep_one_row_per_key(tmp_path: Path) -> None:
    batch = leased([f"e{i}" for i in range(50)])
    async with DuckDBSink(tmp_path / "a.duckdb", table="orders", columns=COLUMNS,
                          load="staged", progress=False) as sink:
        await sink.write(batch[:20])
        assert all(r.ok for r in await sink.write(batch))
        assert await sink.query("SELECT count(*) FROM orders") == [(50,)]
        assert sink.stats().fallbacks == 0
    async with DuckDBSink(tmp_path / "b.duckdb", table="orders", columns=COLUMNS,
                          progress=False) as sink:
        await sink.write(batch[:20])
        assert all(r.ok for r in await sink.write(batch))
        assert await sink.query("SELECT count(*) FROM orders") == [(50,)]
        assert sink.stats().fallbacks == 1


# Parquet -------------------------------------------------------------------------------------


async def test_export_to_parquet_partitioned_by_a_column(tmp_path: Path) -> None:
    out = tmp_path / "export"
    async with DuckDBSink(tmp_path / "wh.duckdb", table="orders", columns=COLUMNS) as sink:
        batch = leased([f"e{i}" for i in range(30)])
        for i, m in enumerate(batch):
            m.put_data({"amount": i, "customer": f"c{i % 3}"})
        await sink.write(batch[:20])
        assert await sink.export_parquet(out, partition_by="customer") == out
        assert sorted(p.name for p in out.iterdir()) == ["customer=c0", "customer=c1",
                                                        "customer=c2"]
        await sink.write(batch)
        await sink.export_parquet(out, partition_by=["customer"])
        count = await sink.query(
            "SELECT customer, count(*) FROM read_parquet(?, hive_partitioning = true) "
            "GROUP BY customer ORDER BY customer", [str(out / "**" / "*.parquet")])
        assert count == [("c0", 10), ("c1", 10), ("c2", 10)]
        await sink.export_parquet(tmp_path / "flat")
        assert [p.name for p in (tmp_path / "flat").iterdir()] == ["data.parquet"]
        leftovers = await asyncio.to_thread(lambda: [p.name for p in tmp_path.iterdir()
                                                     if p.name.startswith(".")])
        assert leftovers == []
        with pytest.raises(InvalidArgument, match="partition_by must name columns"):
            await sink.export_parquet(out, partition_by="nope")
        with pytest.raises(InvalidArgument, match="needs a directory"):
            await sink.export_parquet()


async def test_periodic_export_runs_while_rows_arrive_and_on_close(
        tmp_path: Path, wait_until: WaitUntil) -> None:
    out = tmp_path / "export"
    sink = DuckDBSink(tmp_path / "wh.duckdb", table="orders", columns=COLUMNS,
                      export_dir=out, export_partition_by="part", export_interval=0.05)
    async with sink:
        batch = leased([f"e{i}" for i in range(10)])
        await sink.write(batch[:5])
        await wait_until(lambda: (out / "part=0").is_dir(), message="a periodic export")
        await sink.write(batch[5:])
    assert sink.stats().exports >= 2
    con = duckdb.connect()
    assert con.execute("SELECT count(*) FROM read_parquet(?)",
                       [str(out / "part=0" / "*.parquet")]).fetchone() == (10,)


# Tables and arguments ------------------------------------------------------------------------


async def test_existing_tables_are_checked(tmp_path: Path) -> None:
    db = tmp_path / "wh.duckdb"
    with pytest.raises(InvalidArgument, match="does not exist"):
        await DuckDBSink(db, table="orders", columns=COLUMNS, create=False).open()
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE nokey (event_id VARCHAR, part INTEGER, seq BIGINT, "
                "customer VARCHAR, amount BIGINT, data JSON)")
    con.execute("CREATE TABLE short (event_id VARCHAR PRIMARY KEY)")
    con.close()
    with pytest.raises(InvalidArgument, match="needs a PRIMARY KEY or UNIQUE constraint on "
                                              "event_id"):
        await DuckDBSink(db, table="nokey", columns=COLUMNS).open()
    with pytest.raises(InvalidArgument, match=r"has no column.*part, seq"):
        await DuckDBSink(db, table="short", columns=COLUMNS).open()


async def test_a_host_connection_is_shared_and_left_open(tmp_path: Path) -> None:
    con = duckdb.connect(str(tmp_path / "wh.duckdb"))
    async with DuckDBSink(connection=con, table="sales.orders", columns=COLUMNS) as sink:
        await sink.write(leased(["a", "b"]))
    assert con.execute("SELECT count(*) FROM sales.orders").fetchone() == (2,)
    assert con.execute("SELECT count(*) FROM sales.rheo_sink_progress").fetchone() == (1,)
    con.close()


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"table": "a b"}, "invalid table name"),
    ({"table": "t", "load": "fast"}, 'load must be "auto" or "staged"'),
    ({"table": "t", "export_interval": 5}, "export_interval needs export_dir"),
    ({"table": "t", "export_interval": 0, "export_dir": "x"}, "export_interval must be"),
    ({"table": "t", "export_partition_by": "zzz"}, "partition_by must name columns"),
    ({"table": "t", "key": "nope"}, "key column 'nope'"),
    ({"table": "t", "progress_table": "x;y"}, "invalid progress table name"),
])
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        DuckDBSink(**kwargs)


# A crash between the sink's commit and the ack -----------------------------------------------


async def _worker(*args: str) -> tuple[int, Any]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode is not None
    if proc.returncode == 0:
        return 0, json.loads(out)
    return proc.returncode, err.decode()


async def test_a_sigkill_between_commit_and_ack_neither_loses_nor_duplicates(
        tmp_path: Path) -> None:
    events, target = tmp_path / "events.db", tmp_path / "wh.duckdb"
    async with Rheo(SQLiteBackend(events)) as rheo:
        ids = await backlog(rheo, 50_000)
    args = ["duckdb", "sqlite", "--events", str(events), "--target", str(target)]

    code, err = await _worker(*args, "--kill-after-commits", "4")
    assert code == -signal.SIGKILL, err
    con = duckdb.connect(str(target))
    committed = con.execute("SELECT count(*) FROM orders_sink").fetchone()[0]
    con.close()
    assert 0 < committed < 50_000
    async with Rheo(SQLiteBackend(events)) as rheo:
        acked_before = sum((await rheo.frontier("orders", "warehouse")).values())
    # The last commit was not acked: its rows will be delivered again.
    assert acked_before < committed

    code, stats = await _worker(*args)
    assert code == 0, stats
    assert stats["replayed"] > 0  # the committed, unacked rows came back and were skipped
    assert stats["written"] - stats["replayed"] == 50_000 - committed
    assert stats["fallbacks"] == 0
    assert stats["invalid"] == stats["retry"] == 0
    con = duckdb.connect(str(target))
    assert con.execute("SELECT count(*), count(DISTINCT event_id) FROM orders_sink"
                       ).fetchone() == (50_000, 50_000)
    assert {r[0] for r in con.execute("SELECT event_id FROM orders_sink").fetchall()} == set(ids)
    con.close()
    async with Rheo(SQLiteBackend(events)) as rheo:
        assert await rheo.frontier("orders", "warehouse") == await rheo.high_water("orders")
        assert await rheo.dead_letters("orders", "warehouse") == []


async def test_the_example_moves_events_into_duckdb_and_queries_them(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(EXAMPLE), str(tmp_path),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "customer-0: 3998 orders" in text
    assert "sink: 19997 rows written" in text
    assert all(f"order-{n}: sink_invalid: ConstraintException" in text
               for n in (4242, 9000, 15555))
    assert "parquet: 19997 rows in customer=customer-0" in text
