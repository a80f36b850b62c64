"""A separate OS process consuming a PostgreSQL group, driven by tests/test_postgres_processes.py.

Modes (the result is printed as one JSON document on stdout):

* ``compete URL STREAM GROUP NAME READY_DIR WORKERS`` — wait until ``WORKERS``
  processes are ready, then fetch (batches of 200, a lease that never expires)
  and ack until the group's frontier reaches the high water; report every lease
  and every ack result.
* ``crash URL STREAM GROUP NAME READY_DIR WORKERS LEASE_MS`` — wait for the
  others like ``compete``, lease one batch with a short lease and exit without
  settling it, as a consumer that dies would.

A lease is reported as ``[partition, sequence, attempt, lease_id, start_ms,
deadline_ms]``, with ``start_ms = deadline_ms - lease_ms`` on the server clock.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rheo_flow import Lease, Rheo

LEASE_MS = 3_600_000
BATCH = 200
DEADLINE_S = 120.0


async def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def _report(lease: Lease, lease_ms: int) -> list[Any]:
    return [lease.partition, lease.sequence, lease.attempt, lease.lease_id,
            lease.deadline_ms - lease_ms, lease.deadline_ms]


async def _ready(args: argparse.Namespace) -> None:
    ready = Path(args.ready_dir)
    (ready / args.name).touch()
    await _until(lambda: len(list(ready.iterdir())) >= args.workers, "the other workers")


async def compete(args: argparse.Namespace) -> dict[str, Any]:
    async with Rheo(args.url) as rheo:
        await _ready(args)
        leased: list[list[Any]] = []
        acked: list[list[Any]] = []
        deadline = time.monotonic() + DEADLINE_S
        while True:
            leases = await rheo.fetch(args.stream, args.group, consumer_id=args.name,
                                      limit=BATCH, lease_ms=LEASE_MS)
            if leases:
                leased.extend(_report(lease, LEASE_MS) for lease in leases)
                results = await rheo.ack(leases)
                acked.extend(
                    [lease.partition, lease.sequence, r.ok, r.repeated]
                    for lease, r in zip(leases, results, strict=True)
                )
                continue
            # Nothing to claim: the rest is leased elsewhere; done once all is settled.
            frontier = await rheo.frontier(args.stream, args.group)
            if frontier == await rheo.high_water(args.stream):
                return {"name": args.name, "leased": leased, "acked": acked,
                        "frontier": frontier}
            if time.monotonic() > deadline:
                raise SystemExit("timed out before the frontier reached the high water")
            await asyncio.sleep(0.01)


async def crash(args: argparse.Namespace) -> dict[str, Any]:
    async with Rheo(args.url) as rheo:
        await _ready(args)
        leases = await rheo.fetch(args.stream, args.group, consumer_id=args.name,
                                  limit=BATCH, lease_ms=args.lease_ms)
        return {"name": args.name, "leased": [_report(lease, args.lease_ms)
                                              for lease in leases]}


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    for mode in ("compete", "crash"):
        p = modes.add_parser(mode)
        for name in ("url", "stream", "group", "name", "ready_dir"):
            p.add_argument(name)
        p.add_argument("workers", type=int)
        if mode == "crash":
            p.add_argument("lease_ms", type=int)
    args = parser.parse_args()
    run = {"compete": compete, "crash": crash}[args.mode]
    result = asyncio.run(run(args))
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
