"""A separate OS process consuming scheduled events of a group, driven by
_delayed.py (the PostgreSQL and Redis tests of delayed delivery on the real clock).

``URL STREAM GROUP NAME READY_DIR WORKERS TOTAL POLL_S``: listen for wake-ups, mark
itself ready, wait for the others, then fetch and ack until the group's frontier
reaches ``TOTAL`` events, waiting for wake-ups (or ``POLL_S`` seconds) whenever a
fetch comes back empty. Prints one JSON document: every lease as ``[partition,
sequence, attempt, leased_at_ms]`` (the server's clock: deadline - lease_ms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/, for _competing

from _competing import wait_for_workers
from rheo_flow import Rheo

LEASE_MS = 3_600_000


async def consume(args: argparse.Namespace) -> dict[str, Any]:
    leased: list[list[int]] = []
    async with Rheo(args.url) as rheo:
        await rheo.wait_for_append(args.stream, 0.01)  # the LISTEN connection is up
        await wait_for_workers(args.ready_dir, args.name, args.workers)
        while True:
            leases = await rheo.fetch(args.stream, args.group, consumer_id=args.name,
                                      limit=50, lease_ms=LEASE_MS)
            if leases:
                leased.extend([lease.partition, lease.sequence, lease.attempt,
                               lease.deadline_ms - LEASE_MS] for lease in leases)
                assert all(r.ok for r in await rheo.ack(leases))
                continue
            if sum((await rheo.frontier(args.stream, args.group)).values()) >= args.total:
                break
            await rheo.wait_for_append(args.stream, args.poll_s)
    return {"name": args.name, "leased": leased}


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "stream", "group", "name", "ready_dir"):
        parser.add_argument(name)
    parser.add_argument("workers", type=int)
    parser.add_argument("total", type=int)
    parser.add_argument("poll_s", type=float)
    print(json.dumps(asyncio.run(consume(parser.parse_args())), sort_keys=True))


if __name__ == "__main__":
    main()
