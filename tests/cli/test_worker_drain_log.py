"""The drain log of ``rheo-flow worker`` counts what the drain did: leases settled by
the handlers that were running, handed back unstarted, and cut short (then handed
back) when the grace period ran out. Real worker processes on SQLite and PostgreSQL;
the handlers hold their events until the test creates a ``release`` file."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from rheo_flow import NewEvent, Rheo

WaitUntil = Callable[..., Awaitable[None]]

EVENTS = 10
HELD = 2
"""The handlers running (the group's concurrency) when the worker gets SIGTERM."""

APP = '''
import asyncio
import os
import pathlib

from rheo_flow import ACK, consumer

DIR = pathlib.Path(os.environ["WORKER_TEST_DIR"])


@consumer(stream="jobs", group="g", concurrency=2, max_demand=10, lease_ms=60_000,
          poll_ms=50)
async def jobs(event, context):
    (DIR / f"started-{event.sequence}").touch()
    while not (DIR / "release").exists():
        await asyncio.sleep(0.02)  # held until the test says so
    return ACK
'''


@pytest.fixture(params=["sqlite", "postgres"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store with ``EVENTS`` events on stream ``jobs`` (1 partition)."""
    if request.param == "sqlite":
        made = f"sqlite:///{tmp_path / 'events.db'}"
    else:
        made = request.getfixturevalue("postgres_schema_url")
    async with Rheo(made) as rheo:
        await rheo.create_stream("jobs", partitions=1)
        await rheo.append("jobs", [NewEvent("job", {"n": n}) for n in range(EVENTS)])
    return made


async def _worker(tmp_path: Path, url: str, grace: str) -> asyncio.subprocess.Process:
    (tmp_path / "app.py").write_text(APP)
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "WORKER_TEST_DIR": str(tmp_path)}
    with (tmp_path / "worker.log").open("wb") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rheo_flow", "worker", "app:jobs", "-u", url,
            "--grace-seconds", grace, cwd=tmp_path, env=env, stdout=out,
            stderr=asyncio.subprocess.STDOUT)


def _started(tmp_path: Path) -> int:
    return sum(1 for p in tmp_path.iterdir() if p.name.startswith("started-"))


async def _exit(proc: asyncio.subprocess.Process, tmp_path: Path) -> int:
    try:
        return await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError((tmp_path / "worker.log").read_text()) from None


async def test_a_clean_drain_counts_settled_and_handed_back(
        tmp_path: Path, url: str, wait_until: WaitUntil) -> None:
    proc = await _worker(tmp_path, url, "30")
    await wait_until(lambda: _started(tmp_path) == HELD, timeout=20, message="two held")
    proc.send_signal(signal.SIGTERM)
    await wait_until(lambda: "SIGTERM received" in (tmp_path / "worker.log").read_text(),
                     timeout=10, message="the worker is draining")
    (tmp_path / "release").touch()
    assert await _exit(proc, tmp_path) == 0
    log = (tmp_path / "worker.log").read_text()
    assert (f"drained: every lease settled or handed back ({HELD} settled, "
            f"{EVENTS - HELD} handed back unstarted)") in log, log


async def test_a_drain_past_its_grace_period_counts_what_was_cut_short(
        tmp_path: Path, url: str, wait_until: WaitUntil) -> None:
    proc = await _worker(tmp_path, url, "0.5")
    await wait_until(lambda: _started(tmp_path) == HELD, timeout=20, message="two held")
    proc.send_signal(signal.SIGTERM)  # and the handlers are never released
    assert await _exit(proc, tmp_path) == 1
    log = (tmp_path / "worker.log").read_text()
    assert (f"not drained within 0.5s: 0 settled, {EVENTS - HELD} handed back unstarted, "
            f"{HELD} cut short and handed back") in log, log
    async with Rheo(url) as rheo:  # nothing was acked
        lag = await rheo.lag("jobs", "g")
        assert lag == {0: EVENTS}
