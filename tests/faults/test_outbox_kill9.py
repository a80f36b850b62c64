"""Read, process, write exactly once under SIGKILL (docs/outbox.md): a child process runs
the loop of tests/_outbox_app.py (ack, the application's row and a derived event in one
transaction) and is killed at a named step of one event: after its write and append
(before the ack and the commit), after the ack (before the commit), and after the commit
(before the handler returns to the runtime). A consumer started afterwards finishes the
work; the store then holds exactly one row and one derived event per source event, the
group settled everything, and the dead child's lease settles nothing any more.

The kill is deterministic: the child blocks at the step and says so on stdout; the
parent kills it once it read that line. Real PostgreSQL and SQLite files."""

from __future__ import annotations

import asyncio
import os
import pickle
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from _outbox_app import App, Billing
from rheo_flow import Lease, NewEvent, Query, Rheo, StaleLease
from rheo_flow.backends import SQLiteBackend

CHILD = Path(__file__).with_name("_outbox_child.py")
ROOT = Path(__file__).resolve().parents[2]
ORDERS = ["o-0", "o-1", "o-2"]
KILLED_ON = "o-1"


@pytest.fixture(params=["sqlite", "postgres"])
async def app(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[App]:
    if request.param == "sqlite":
        path = str(tmp_path / "app.db")
        yield App("sqlite", f"sqlite:///{path}", path)
        return
    url: str = request.getfixturevalue("postgres_url")
    schema: str = request.getfixturevalue("postgres_schema")
    yield App("postgres", f"{url}?schema={schema}", url, schema)


def _backend(app: App) -> Any:
    return SQLiteBackend(app.target) if app.kind == "sqlite" else app.url


async def _kill_at(app: App, step: str, lease_file: Path) -> Lease:
    """Run the child until the handler of KILLED_ON reaches ``step``, SIGKILL it there;
    the lease it held."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(CHILD), app.kind, app.url, app.target, app.schema or "-", step,
        KILLED_ON, str(lease_file), stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, env=env)
    assert child.stdout is not None
    try:
        line = await asyncio.wait_for(child.stdout.readline(), 60)
        assert line.decode().strip() == f"reached {step}", (
            line, (await child.stderr.read()).decode() if child.stderr else "")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.returncode is None:
            child.kill()
        await child.wait()
    # Killed by our SIGKILL; asyncio reports 255 instead when another waiter in the test
    # process reaped the child first ("Unknown child process pid").
    assert child.returncode in (-signal.SIGKILL, 255)
    with open(lease_file, "rb") as file:  # noqa: ASYNC230 - a small local file, once
        lease: Lease = pickle.load(file)
    return lease


async def _invoices(rheo: Rheo) -> Counter[str]:
    return Counter([e.data["order"] async for e in rheo.stream_query(Query(stream="invoices"))])


@pytest.mark.parametrize("step", ["written", "acked", "committed"])
async def test_a_consumer_killed_at_each_step_loses_and_duplicates_nothing(
        app: App, step: str, tmp_path: Path) -> None:
    async with Rheo(_backend(app)) as rheo:
        await rheo.create_stream("orders")
        await rheo.create_stream("invoices")
        await rheo.create_group("orders", "billing")
        await app.create_table()
        await rheo.append("orders", [NewEvent("order.placed", id=i) for i in ORDERS])

        dead = await _kill_at(app, step, tmp_path / "lease.pickle")
        assert dead.event.id == KILLED_ON
        committed = ["o-0", "o-1"] if step == "committed" else ["o-0"]
        assert await app.effects() == committed  # the kill rolled back what was open
        assert await _invoices(rheo) == Counter(committed)

        # A consumer started afterwards finishes the work (the dead lease expires).
        group = Billing(rheo, app, lease_ms=1_000).start(rheo)
        assert await group.run_until_empty(timeout=60)
        assert group.stats.handler_errors == 0
        assert await app.effects() == ORDERS  # one row per source event
        assert await _invoices(rheo) == Counter(ORDERS)  # one derived event each
        assert await rheo.lag("orders", "billing") == {0: 0}

        # The dead child's lease settles nothing: its transaction rolls back whole.
        with pytest.raises(StaleLease):
            await _settle_with(rheo, app, dead)
        assert await app.effects() == ORDERS
        assert await _invoices(rheo) == Counter(ORDERS)


async def _settle_with(rheo: Rheo, app: App, lease: Lease) -> None:
    """The loop's transaction with ``lease``: a row, a derived event, the ack."""
    conn = await app.connect()
    try:
        async with rheo.transaction(conn, lease) as tx:
            await app.write(conn, "stale-write")
            await tx.append("invoices", NewEvent("invoice.due", {"order": "stale"}))
    finally:
        await app.close(conn)
