"""A PostgreSQL crash right after a re-lease: the new lease survives, the old one stays fenced.

The test runs its OWN server (``throwaway_postgres``: initdb into a temporary
directory, a free loopback port) because it kills it with SIGKILL; see
:mod:`rheo_flow._faults._servers`. Without the server binaries the test
is skipped, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from rheo_flow import NewEvent, Rheo, SettleKind
from rheo_flow._faults._servers import PostgresServer
from rheo_flow.backends import PostgresBackend

pytestmark = pytest.mark.slow


async def test_a_re_lease_survives_a_crash_and_the_old_lease_stays_fenced(
        throwaway_postgres: PostgresServer) -> None:
    server = throwaway_postgres
    url = f"{server.url}?schema=crash&listen=false"
    rheo = Rheo(PostgresBackend.from_url(url))
    try:
        await rheo.open()
        await rheo.create_stream("s")
        await rheo.create_group("s", "g")
        await rheo.append("s", [NewEvent("t", {"n": 1})])
        [old] = await rheo.fetch("s", "g", limit=1, lease_ms=200, consumer_id="first")
        # Wait (against a deadline) for the lease to expire on the server's clock:
        # the next fetch then leases the delivery again.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:
            again = await rheo.fetch("s", "g", limit=1, lease_ms=60_000, consumer_id="second")
            if again:
                break
            assert loop.time() < deadline, "the lease never expired"
            await asyncio.sleep(0.05)  # the server's clock decides the expiry
        server.kill()
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rheo.close(), 10)
    [new] = again
    assert new.attempt == 2
    assert new.lease_id != old.lease_id

    server.start()
    async with Rheo(PostgresBackend.from_url(url)) as revived:
        [stale] = await revived.ack([old])
        assert not stale.ok
        assert stale.kind is SettleKind.STALE_LEASE
        [taken] = await revived.ack([new])
        assert taken.ok
        assert not taken.repeated
        assert await revived.frontier("s", "g") == {0: 1}
