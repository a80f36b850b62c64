"""A separate OS process competing for a MongoDB group, driven by test_mongo_multiprocess.py.

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
import sys
from pathlib import Path
from typing import Any

# tests/, for the shared loop (_competing.py): run by path, a script has only its own
# folder on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import _competing
from _competing import wait_for_workers
from rheo_flow import Rheo
from rheo_flow.backends import MongoBackend

LEASE_MS = 3_600_000


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
            await wait_for_workers(args.ready_dir, args.name, args.workers)
            return await _competing.compete(
                rheo, stream=args.stream, group=args.group, name=args.name, limit=10,
                lease_ms=LEASE_MS,
            )
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
