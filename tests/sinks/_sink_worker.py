"""A separate OS process running a pipeline into a sink, driven by tests/sinks/test_sinks_*.py.

``python tests/sinks/_sink_worker.py SINK BACKEND ...`` runs a pipeline from a durable
backend into a sink until the group's frontier reaches the stream's high water,
then prints the sink's counters as one JSON document on stdout.

* SINK ``duckdb``: ``--target`` is the DuckDB file; BACKEND ``sqlite``: ``--events``
  is the SQLite file.
* SINK ``postgres``: ``--target`` is the server URL and ``--schema`` the schema of
  both the sink's table and the backend (BACKEND ``postgres``, acked in the sink's
  transaction), or BACKEND ``sqlite`` (the sink keeps its own frontier).

``--kill-after-commits N`` makes the process SIGKILL itself right after the
sink's N-th committed transaction, before the pipeline acks anything of that
batch: the crash the sink's exactly-once design is for.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from typing import Any

from rheo_flow import Rheo
from rheo_flow.pipeline import Pipeline, Processors
from rheo_flow.sinks import (
    Column,
    CommitInfo,
    DuckDBSink,
    PostgresSink,
    Sink,
    SinkHandler,
    sink_batcher,
)

LEASE_MS = 2_000
"""Short leases: what the killed process held is redelivered soon after it died."""
DEADLINE_S = 120.0
BATCH_ROWS = 2_000


def columns(json_type: str) -> list[Column]:
    """The test table: event fields, a checked amount and the data as JSON."""
    return [
        Column("event_id", "VARCHAR", "event.id"),
        Column("part", "INTEGER", "event.partition"),
        Column("seq", "BIGINT", "event.sequence"),
        Column("amount", "BIGINT", "data.amount", check="amount >= 0"),
        Column("data", json_type, "data"),
    ]


def killer(after: int | None) -> Any:
    """An ``on_commit`` hook that SIGKILLs this process after ``after`` commits."""
    commits = 0

    def on_commit(info: CommitInfo) -> None:
        nonlocal commits
        commits += 1
        if after is not None and commits >= after:
            os.kill(os.getpid(), signal.SIGKILL)

    return on_commit


async def finished(rheo: Rheo, stream: str, group: str) -> None:
    """Wait until every delivery of the group is settled (frontier = high water)."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        if await rheo.frontier(stream, group) == await rheo.high_water(stream):
            return
        if time.monotonic() > deadline:
            raise SystemExit("timed out before the frontier reached the high water")
        await asyncio.sleep(0.05)  # polling the backend against a deadline


async def run(args: argparse.Namespace) -> dict[str, Any]:
    on_commit = killer(args.kill_after_commits)
    pool = None
    if args.backend == "sqlite":
        from rheo_flow.backends import SQLiteBackend

        rheo = Rheo(SQLiteBackend(args.events))
    else:
        import asyncpg

        from rheo_flow.backends import PostgresBackend

        pool = await asyncpg.create_pool(args.target, min_size=1, max_size=6)
        rheo = Rheo(PostgresBackend(pool=pool, schema=args.schema))
    sink: Sink
    if args.sink == "duckdb":
        sink = DuckDBSink(args.target, table=args.table, columns=columns("JSON"),
                          on_commit=on_commit)
    else:
        if pool is None:
            import asyncpg

            pool = await asyncpg.create_pool(args.target, min_size=1, max_size=6)
        backend = rheo.backend if args.backend == "postgres" else None
        sink = PostgresSink(pool=pool, table=f"{args.schema}.{args.table}",
                            columns=columns("JSONB"), settle_with=backend,  # type: ignore[arg-type]
                            on_commit=on_commit)
    try:
        async with rheo, sink:
            pipeline = Pipeline(
                rheo, stream=args.stream, group=args.group, handler=SinkHandler(sink),
                processors=Processors(concurrency=2),
                batchers={"default": sink_batcher(max_rows=BATCH_ROWS, max_age=0.2,
                                                  concurrency=2)},
                lease_ms=LEASE_MS,
            )
            async with pipeline:
                await finished(rheo, args.stream, args.group)
            stats = sink.stats()
            return {"written": stats.written, "replayed": stats.replayed,
                    "settled": stats.settled, "invalid": stats.invalid, "retry": stats.retry,
                    "fallbacks": stats.fallbacks, "transactions": stats.transactions,
                    "confirmed": pipeline.producer.stats().confirmed,
                    "acked": pipeline.producer.stats().acked}
    finally:
        if pool is not None:
            await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sink", choices=("duckdb", "postgres"))
    parser.add_argument("backend", choices=("sqlite", "postgres"))
    parser.add_argument("--target", required=True)
    parser.add_argument("--events", help="the SQLite file of the stream")
    parser.add_argument("--schema", default="public")
    parser.add_argument("--table", default="orders_sink")
    parser.add_argument("--stream", default="orders")
    parser.add_argument("--group", default="warehouse")
    parser.add_argument("--kill-after-commits", type=int, default=None)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(run(args)), sort_keys=True))


if __name__ == "__main__":
    main()
