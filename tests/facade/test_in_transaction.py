"""``connection=`` on ``append`` and ``ack``: only a backend declaring
``capabilities.in_transaction`` writes in the application's transaction; elsewhere the
call is refused before anything is written."""

from __future__ import annotations

import sqlite3

import pytest

from rheo_flow import InvalidArgument, NewEvent, Rheo, Unsupported
from rheo_flow.backends import MemoryBackend


async def test_a_backend_without_the_capability_refuses_a_connection() -> None:
    async with Rheo(MemoryBackend()) as rheo:
        await rheo.create_stream("s")
        conn = sqlite3.connect(":memory:")
        try:
            with pytest.raises(InvalidArgument, match="in_transaction"):
                await rheo.append("s", NewEvent("t", {}), connection=conn)
            assert (await rheo.stream_info("s")).high_water == {0: 0}
            await rheo.append("s", NewEvent("t", {}))
            leases = await rheo.fetch("s", "g")
            with pytest.raises(InvalidArgument, match="in_transaction"):
                await rheo.ack(leases, connection=conn)
            assert all(r.ok and not r.repeated for r in await rheo.ack(leases))
        finally:
            conn.close()


async def test_the_backend_base_class_says_it_does_not_support_it() -> None:
    backend = MemoryBackend()
    with pytest.raises(Unsupported, match="append_in_transaction"):
        await backend.append_in_transaction(object(), "s", [])
    with pytest.raises(Unsupported, match="ack_in_transaction"):
        await backend.ack_in_transaction(object(), [])
