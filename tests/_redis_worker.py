"""A separate OS process competing for a Redis group, driven by tests/test_redis_multiprocess.py.

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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rheo_flow import Rheo
from rheo_flow.backends import RedisBackend

LEASE_MS = 3_600_000
DEADLINE_S = 120.0


async def _until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def compete(args: argparse.Namespace) -> dict[str, Any]:
    backend = RedisBackend.from_url(args.url, prefix=args.prefix)
    async with Rheo(backend) as rheo:
        ready = Path(args.ready_dir)
        (ready / args.name).touch()
        await _until(lambda: len(list(ready.iterdir())) >= args.workers, "the other workers")
        leased: list[list[int]] = []
        acked = repeated = failed = 0
        deadline = time.monotonic() + DEADLINE_S
        while True:
            leases = await rheo.fetch(args.stream, args.group, consumer_id=args.name, limit=100,
                                      lease_ms=LEASE_MS)
            if leases:
                leased.extend([x.partition, x.sequence, x.attempt] for x in leases)
                for result in await rheo.ack(leases):
                    if not result.ok:
                        failed += 1
                    elif result.repeated:
                        repeated += 1
                    else:
                        acked += 1
                continue
            # Nothing to claim: the rest is held by other workers; done once all is settled.
            frontier = await rheo.frontier(args.stream, args.group)
            if frontier == await rheo.high_water(args.stream):
                return {"name": args.name, "leased": leased, "acked": acked,
                        "repeated": repeated, "failed": failed, "frontier": frontier}
            if time.monotonic() > deadline:
                raise SystemExit("timed out before the frontier reached the high water")
            await rheo.wait_for_append(args.stream, 0.01)


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
