"""A worker whose PostgreSQL connections go silent must carry on over new connections.

When every open connection stops answering while new ones work (a failover
behind a virtual IP, a lost NAT or conntrack entry, a half-open TCP connection),
a call sent on a silent connection never returns: asyncpg has no command
timeout unless given one, and no TCP keepalive. The proxy reproduces it by
holding every open connection (forwarding nothing, closing nothing) while
letting new connections through.

Every backend call has a deadline (the backend's ``timeout_ms``): a call sent
on a silent connection ends as ``ambiguous`` (a settle) or a typed error (a
fetch) within it, the connection is closed, and the next call takes a new one.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rheo_flow import ACK, Group, NewEvent, Rheo, consumer
from rheo_flow._faults._proxy import FaultProxy

pytestmark = pytest.mark.slow

EVENTS = 200
TIMEOUT_MS = 2_000
"""The proxied backend's call deadline."""
RECOVERY_S = 15.0
"""A generous bound: several call deadlines and leases."""


async def test_group_carries_on_when_every_open_connection_goes_silent(
        postgres_schema_url: str, wait_until: Any) -> None:
    url = postgres_schema_url
    handled = 0
    async with FaultProxy.for_url(url) as proxy, Rheo(url) as direct:
        await direct.create_stream("s", partitions=2)
        await direct.append("s", [NewEvent("t", {"n": n}) for n in range(EVENTS)])
        async with Rheo(f"{proxy.url(url)}&timeout_ms={TIMEOUT_MS}") as rheo:

            @consumer(stream="s", group="g", concurrency=4, lease_ms=1_000, poll_ms=50)
            async def handle(event: Any, context: Any) -> Any:
                nonlocal handled
                await asyncio.sleep(0.005)  # a handler doing some work
                handled += 1
                return ACK

            async with Group(rheo, handle):
                await wait_until(lambda: handled >= EVENTS // 4, timeout=30,
                                 message="a quarter of the events handled")
                proxy.blackhole(3600, then="resume", hold_new=False)
                try:
                    await wait_until(lambda: _settled(direct), timeout=RECOVERY_S,
                                     interval=0.1, message="every event settled")
                finally:
                    proxy.pass_traffic()  # let the held calls finish, so the Group stops


async def _settled(rheo: Rheo) -> bool:
    return sum((await rheo.lag("s", "g")).values()) == 0
