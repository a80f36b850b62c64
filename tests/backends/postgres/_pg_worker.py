"""A separate OS process consuming a PostgreSQL group, driven by test_postgres_processes.py.

Modes (the result is printed as one JSON document on stdout):

* ``compete URL STREAM GROUP NAME READY_DIR WORKERS`` — wait until ``WORKERS``
  processes are ready, then fetch (batches of 200, a lease that never expires)
  and ack until the group's frontier reaches the high water; report every lease
  and every ack result.
* ``crash URL STREAM GROUP NAME READY_DIR WORKERS LEASE_MS`` — lease one batch
  with a short lease, then mark itself ready (so the others start only after it
  leased) and exit without settling it, as a consumer that dies would.

A lease is reported as ``[partition, sequence, attempt, lease_id, start_ms,
deadline_ms]``, with ``start_ms = deadline_ms - lease_ms`` on the server clock.
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
from rheo_flow import Lease, Rheo

LEASE_MS = 3_600_000
BATCH = 200


def _report(lease: Lease, lease_ms: int) -> list[Any]:
    return [lease.partition, lease.sequence, lease.attempt, lease.lease_id,
            lease.deadline_ms - lease_ms, lease.deadline_ms]


async def _ready(args: argparse.Namespace) -> None:
    await wait_for_workers(args.ready_dir, args.name, args.workers)


async def compete(args: argparse.Namespace) -> dict[str, Any]:
    async with Rheo(args.url) as rheo:
        await _ready(args)
        return await _competing.compete(
            rheo, stream=args.stream, group=args.group, name=args.name, limit=BATCH,
            lease_ms=LEASE_MS, report=lambda lease: _report(lease, LEASE_MS),
            idle=lambda: asyncio.sleep(0.01),
        )


async def crash(args: argparse.Namespace) -> dict[str, Any]:
    async with Rheo(args.url) as rheo:
        # Lease first, then say ready: the competitors start only once this batch is
        # taken, so there is always an abandoned batch to come back.
        leases = await rheo.fetch(args.stream, args.group, consumer_id=args.name,
                                  limit=BATCH, lease_ms=args.lease_ms)
        (Path(args.ready_dir) / args.name).touch()
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
