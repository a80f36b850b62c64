"""A separate OS process competing for a MongoDB group, driven by tests/test_mongo_multiprocess.py.

``compete URL PREFIX STREAM GROUP NAME READY_DIR WORKERS CLIENT`` waits until
``WORKERS`` processes are ready, then fetches and acks with a lease that never
expires until the group's frontier reaches the high water, and prints every
lease and ack result as one JSON document on stdout. ``CLIENT`` is ``pymongo``
(the backend builds its ``AsyncMongoClient`` from the URL) or ``motor`` (a
host-owned ``AsyncIOMotorClient``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rheo_flow import Rheo
from rheo_flow.backends import MongoBackend

LEASE_MS = 3_600_000
DEADLINE_S = 120.0


async def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def compete(args: argparse.Namespace) -> dict[str, Any]:
    client: Any = None
    if args.client == "motor":
        from motor.motor_asyncio import AsyncIOMotorClient

        client = AsyncIOMotorClient(args.url)
        backend = MongoBackend(client=client, collection_prefix=args.prefix)
    else:
        backend = MongoBackend.from_url(f"{args.url}?collection_prefix={args.prefix}")
    try:
        async with Rheo(backend) as rheo:
            ready = Path(args.ready_dir)
            (ready / args.name).touch()
            await _until(lambda: len(list(ready.iterdir())) >= args.workers, "the other workers")
            leased: list[list[Any]] = []
            acked: list[list[Any]] = []
            deadline = time.monotonic() + DEADLINE_S
            while True:
                leases = await rheo.fetch(
                    args.stream, args.group, consumer_id=args.name, limit=10, lease_ms=LEASE_MS
                )
                if leases:
                    leased.extend([lease.partition, lease.sequence, lease.lease_id, lease.attempt]
                                  for lease in leases)
                    results = await rheo.ack(leases)
                    acked.extend(
                        [lease.partition, lease.sequence, r.ok, r.repeated]
                        for lease, r in zip(leases, results, strict=True)
                    )
                    continue
                # Nothing to claim: the rest is leased by the other worker; done once all
                # is settled.
                frontier = await rheo.frontier(args.stream, args.group)
                if frontier == await rheo.high_water(args.stream):
                    return {"name": args.name, "leased": leased, "acked": acked,
                            "frontier": frontier}
                if time.monotonic() > deadline:
                    raise SystemExit("timed out before the frontier reached the high water")
                await asyncio.sleep(0.005)
    finally:
        if client is not None:
            client.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("compete")
    for name in ("url", "prefix", "stream", "group", "name", "ready_dir"):
        p.add_argument(name)
    p.add_argument("workers", type=int)
    p.add_argument("client", choices=["pymongo", "motor"])
    args = parser.parse_args()
    result = asyncio.run(compete(args))
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
