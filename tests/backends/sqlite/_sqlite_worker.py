"""A separate OS process working on an SQLite file, driven by test_sqlite_backend.py.

Modes (the result is printed as one JSON document on stdout):

* ``compete DB STREAM GROUP NAME READY_DIR WORKERS`` — wait until ``WORKERS``
  processes are ready, then fetch and ack with a lease that never expires until the
  group's frontier reaches the high water; report every lease and ack result.
* ``report DB STREAM GROUP`` — the stream's high water, the group's frontier and
  every stored event id.
* ``append DB STREAM COUNT`` — append ``COUNT`` events with ids ``child-<i>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

# tests/, for the shared loop (_competing.py): run by path, a script has only its own
# folder on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import _competing
from _competing import wait_for_workers
from rheo_flow import NewEvent, Query, Rheo
from rheo_flow.backends import SQLiteBackend

LEASE_MS = 3_600_000


def _backend(db: str) -> SQLiteBackend:
    # A long busy timeout: four processes take turns on one writer lock.
    return SQLiteBackend(db, busy_timeout_ms=60_000)


async def compete(args: argparse.Namespace) -> dict[str, Any]:
    async with Rheo(_backend(args.db)) as rheo:
        await wait_for_workers(args.ready_dir, args.name, args.workers)
        return await _competing.compete(
            rheo, stream=args.stream, group=args.group, name=args.name, limit=10,
            lease_ms=LEASE_MS,
        )


async def report(args: argparse.Namespace) -> dict[str, Any]:
    async with Rheo(_backend(args.db)) as rheo:
        events = [e async for e in rheo.stream_query(Query(stream=args.stream))]
        return {
            "high_water": await rheo.high_water(args.stream),
            "frontier": await rheo.frontier(args.stream, args.group),
            "ids": [e.id for e in events],
            "data": [e.data for e in events],
        }


async def append(args: argparse.Namespace) -> dict[str, Any]:
    async with Rheo(_backend(args.db)) as rheo:
        events = await rheo.append(
            args.stream, [NewEvent("child", {"i": i}, id=f"child-{i}") for i in range(args.count)]
        )
        return {"sequences": [e.sequence for e in events]}


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("compete")
    for name in ("db", "stream", "group", "name", "ready_dir"):
        p.add_argument(name)
    p.add_argument("workers", type=int)
    p = modes.add_parser("report")
    for name in ("db", "stream", "group"):
        p.add_argument(name)
    p = modes.add_parser("append")
    p.add_argument("db")
    p.add_argument("stream")
    p.add_argument("count", type=int)
    args = parser.parse_args()
    run = {"compete": compete, "report": report, "append": append}[args.mode]
    result = asyncio.run(run(args))
    print(json.dumps(result, sort_keys=True, default=lambda o: dict(o)))


if __name__ == "__main__":
    main()
