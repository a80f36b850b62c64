"""A separate OS process competing for a Redis group, driven by test_redis_multiprocess.py.

``compete URL PREFIX STREAM GROUP NAME READY_DIR WORKERS`` waits until
``WORKERS`` processes are ready, then fetches and acks (with a lease that never
expires during the test) until the group's frontier reaches the high water. It
prints one JSON document: every leased ``[partition, sequence, attempt]``, how
many acks took effect, how many were repeats or failures, and the frontier.
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
from rheo_flow.backends import RedisBackend

LEASE_MS = 3_600_000


async def compete(args: argparse.Namespace) -> dict[str, Any]:
    backend = RedisBackend.from_url(args.url, prefix=args.prefix)
    async with Rheo(backend) as rheo:
        await wait_for_workers(args.ready_dir, args.name, args.workers)
        outcome = await _competing.compete(
            rheo, stream=args.stream, group=args.group, name=args.name, limit=100,
            lease_ms=LEASE_MS, report=lambda x: [x.partition, x.sequence, x.attempt],
            idle=lambda: rheo.wait_for_append(args.stream, 0.01),
        )
    results = [(ok, repeated) for _, _, ok, repeated in outcome.pop("acked")]
    outcome["acked"] = sum(1 for ok, repeated in results if ok and not repeated)
    outcome["repeated"] = sum(1 for ok, repeated in results if ok and repeated)
    outcome["failed"] = sum(1 for ok, _ in results if not ok)
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser()
    modes = parser.add_subparsers(dest="mode", required=True)
    p = modes.add_parser("compete")
    for name in ("url", "prefix", "stream", "group", "name", "ready_dir"):
        p.add_argument(name)
    p.add_argument("workers", type=int)
    args = parser.parse_args()
    result = asyncio.run(compete(args))
    print(json.dumps(result, sort_keys=True))


if __name__ == "__main__":
    main()
