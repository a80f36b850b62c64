"""``connection=`` on ``append`` and ``ack``: only a backend declaring
``capabilities.in_transaction`` writes in the application's transaction; elsewhere the
call is refused before anything is written."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from rheo_flow import InvalidArgument, NewEvent, Rheo, Unsupported
from rheo_flow.backends import MemoryBackend

SRC = Path(__file__).resolve().parents[2] / "src"


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


def test_a_driver_connection_does_not_import_sqlalchemy(tmp_path: Path) -> None:
    # SQLAlchemy's types are recognised only once the application imported it.
    code = f"""
import asyncio, sqlite3, sys
from rheo_flow import NewEvent, Rheo
from rheo_flow.backends import SQLiteBackend

async def main():
    async with Rheo(SQLiteBackend({str(tmp_path / "e.db")!r})) as rheo:
        await rheo.create_stream("s")
        conn = sqlite3.connect({str(tmp_path / "e.db")!r}, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        await rheo.append("s", NewEvent("t", {{}}), connection=conn)
        conn.execute("COMMIT")
        conn.close()
        print(await rheo.high_water("s"), "sqlalchemy" in sys.modules)

asyncio.run(main())
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["{0:", "1}", "False"]
