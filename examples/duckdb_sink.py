"""Move events from a stream into DuckDB with a pipeline, then query the warehouse.

Run it with ``python examples/duckdb_sink.py [DIRECTORY]`` (it needs the
``duckdb`` extra; no server). In DIRECTORY (default: a temporary one) it
keeps the stream in an SQLite file and the warehouse in a DuckDB file, and:

1. appends 20,000 ``order.placed`` events, three of them with a negative
   amount, which the table's ``CHECK`` refuses;
2. runs a pipeline whose batches a ``DuckDBSink`` writes (2,000 rows per
   transaction, idempotently on the event id), until the group has settled
   everything;
3. prints revenue per customer from the table, the dead-lettered events (the
   three poison orders, while the rest of their batches was written) and the
   sink's counters;
4. exports the table to Parquet, partitioned by customer, and reads it back.

Run it twice on the same DIRECTORY: the second run appends nothing new (the
events have fixed ids) and the group has nothing left to deliver.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from rheo_flow import NewEvent, Rheo
from rheo_flow.pipeline import Pipeline, Processors
from rheo_flow.sinks import Column, DuckDBSink, SinkHandler, sink_batcher

ORDERS = 20_000
POISON = {4_242: -10, 9_000: -1, 15_555: -7}

COLUMNS = [
    Column("event_id", "VARCHAR", "event.id"),
    Column("placed_at", "TIMESTAMPTZ", "event.appended_at"),
    Column("customer", "VARCHAR", "data.customer", nullable=False),
    Column("amount", "DECIMAL(12, 2)", "data.amount", check="amount >= 0"),
    Column("items", "INTEGER", "data.items"),
    Column("data", "JSON", "data"),
]


def orders() -> list[NewEvent]:
    """The orders to append; fixed ids make appending them again a no-op."""
    return [
        NewEvent("order.placed",
                 {"customer": f"customer-{i % 5}", "amount": POISON.get(i, 10 + i % 90),
                  "items": 1 + i % 4},
                 id=f"order-{i}", key=f"customer-{i % 5}")
        for i in range(ORDERS)
    ]


async def settled(rheo: Rheo, stream: str, group: str) -> None:
    """Wait until the group has settled every event of the stream."""
    while sum((await rheo.lag(stream, group)).values()):  # noqa: ASYNC110 - polls the lag
        await asyncio.sleep(0.1)


async def main(directory: Path) -> None:
    async with Rheo(f"sqlite:///{directory / 'events.db'}") as rheo, DuckDBSink(
            directory / "warehouse.duckdb", table="orders", columns=COLUMNS) as sink:
        await rheo.create_stream("orders", partitions=4)
        await rheo.append("orders", orders())

        pipeline = Pipeline(
            rheo, stream="orders", group="warehouse", handler=SinkHandler(sink),
            processors=Processors(concurrency=2),
            batchers={"default": sink_batcher(max_rows=2_000, max_age=0.5)},
        )
        async with pipeline:
            await settled(rheo, "orders", "warehouse")

        print("revenue per customer:")
        for customer, count, revenue in await sink.query(
                "SELECT customer, count(*), sum(amount) FROM orders "
                "GROUP BY customer ORDER BY customer"):
            print(f"  {customer}: {count} orders, {revenue}")
        print("dead letters:")
        for dead in await rheo.dead_letters("orders", "warehouse"):
            print(f"  {dead.event_id}: {dead.reason[:90]}")
        stats = sink.stats()
        print(f"sink: {stats.written} rows written in {stats.transactions} transactions, "
              f"{stats.invalid} invalid")

        export = await sink.export_parquet(directory / "orders-parquet",
                                           partition_by="customer")
        rows = await sink.query("SELECT count(*) FROM read_parquet(?, hive_partitioning = true)",
                                [str(export / "*" / "*.parquet")])
        partitions = sorted(p.name for p in export.iterdir())
        print(f"parquet: {rows[0][0]} rows in {', '.join(partitions)}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        target = Path(sys.argv[1])
        target.mkdir(parents=True, exist_ok=True)
        asyncio.run(main(target))
    else:
        with tempfile.TemporaryDirectory(prefix="rheo-duckdb-sink-") as tmp:
            asyncio.run(main(Path(tmp)))
