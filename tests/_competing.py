"""The loop every multi-process worker script runs (tests/**/_*_worker.py).

A worker waits until all its siblings are ready, then fetches and acks until the
group's frontier reaches the high water, and reports every lease and every ack
result so the test can check that no event was leased twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from rheo_flow import Lease, Rheo

DEADLINE_S = 120.0


async def until(predicate: Callable[[], bool], what: str) -> None:
    """Poll ``predicate`` until true; exit the worker when it never becomes true."""
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def wait_for_workers(ready_dir: str, name: str, workers: int) -> None:
    """Mark this worker ready and wait until ``workers`` workers are."""
    ready = Path(ready_dir)
    (ready / name).touch()
    await until(lambda: len(list(ready.iterdir())) >= workers, "the other workers")


def lease_row(lease: Lease) -> list[Any]:
    """The default report of a lease: ``[partition, sequence, lease_id, attempt]``."""
    return [lease.partition, lease.sequence, lease.lease_id, lease.attempt]


async def compete(
    rheo: Rheo,
    *,
    stream: str,
    group: str,
    name: str,
    limit: int,
    lease_ms: int,
    report: Callable[[Lease], list[Any]] = lease_row,
    idle: Callable[[], Awaitable[Any]] = lambda: asyncio.sleep(0.005),
) -> dict[str, Any]:
    """Fetch and ack until every event of the group is settled; report what happened.

    ``acked`` holds ``[partition, sequence, ok, repeated]`` per ack result.
    """
    leased: list[list[Any]] = []
    acked: list[list[Any]] = []
    deadline = time.monotonic() + DEADLINE_S
    while True:
        leases = await rheo.fetch(stream, group, consumer_id=name, limit=limit, lease_ms=lease_ms)
        if leases:
            leased.extend(report(lease) for lease in leases)
            results = await rheo.ack(leases)
            acked.extend(
                [lease.partition, lease.sequence, r.ok, r.repeated]
                for lease, r in zip(leases, results, strict=True)
            )
            continue
        # Nothing to claim: the rest is leased elsewhere; done once all is settled.
        frontier = await rheo.frontier(stream, group)
        if frontier == await rheo.high_water(stream):
            return {"name": name, "leased": leased, "acked": acked, "frontier": frontier}
        if time.monotonic() > deadline:
            raise SystemExit("timed out before the frontier reached the high water")
        await idle()
