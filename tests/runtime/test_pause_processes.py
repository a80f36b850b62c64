"""``rheo-flow pause`` and ``resume`` with four worker processes consuming one group, on
SQLite, PostgreSQL and Redis.

A producer appends all along. Each handler logs its lease: partition, sequence,
attempt and when the backend leased it (the lease's deadline less the lease time,
on the backend's clock: the same host's). Over several cycles the test pauses the
group with the CLI and checks that no lease was taken after the pause returned
(leases taken before it may still be running and settle), then resumes it and waits
for consumption to go on in the same processes. At the end every event was leased
once, at attempt 1, and acked: nothing lost, nothing settled twice. Every wait is on
a condition with a deadline; the latencies measured are printed (``-s``), not asserted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rheo_flow import NewEvent, Rheo

WORKERS = 4
PARTITIONS = 4
CYCLES = 3
LEASE_MS = 60_000
CLOCK_SLACK_MS = 20
"""Two readings of the host's clock (a backend's, the test's) may differ by rounding."""

APP = '''
import asyncio
import os
import pathlib

from rheo_flow import ACK, consumer, current_lease

LOG = open(pathlib.Path(os.environ["PAUSE_TEST_DIR"]) / f"log-{os.getpid()}", "a",
           buffering=1)


@consumer(stream="work", group="g", concurrency=4, max_demand=8, lease_ms=60_000,
          poll_ms=int(os.environ["PAUSE_TEST_POLL_MS"]))
async def work(event, context):
    lease = current_lease()
    LOG.write(f"{lease.partition} {lease.sequence} {lease.attempt} "
              f"{lease.deadline_ms - 60_000} {os.getpid()}\\n")
    await asyncio.sleep(0.002)  # a handler that takes a little time
    return ACK
'''


@dataclass(frozen=True, slots=True)
class Leased:
    """One handler's lease, as it logged it."""

    partition: int
    sequence: int
    attempt: int
    at_ms: int
    pid: int


@dataclass
class Run:
    """The worker processes over one store, and what their handlers logged."""

    dir: Path
    url: str
    poll_ms: int
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    def leases(self) -> list[Leased]:
        found = []
        for log in self.dir.glob("log-*"):
            for line in log.read_text().splitlines():
                parts = line.split()
                if len(parts) == 5:  # a line being written is left for the next read
                    found.append(Leased(*map(int, parts)))
        return found

    async def start_workers(self) -> None:
        env = {**os.environ, "PAUSE_TEST_DIR": str(self.dir),
               "PAUSE_TEST_POLL_MS": str(self.poll_ms),
               "PYTHONPATH": os.pathsep.join(
                   [str(self.dir), *filter(None, [os.environ.get("PYTHONPATH")])])}
        for index in range(WORKERS):
            with (self.dir / f"out-{index}.txt").open("wb") as out:
                self.procs.append(await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "rheo_flow", "worker", "app:work", "--url", self.url,
                    env=env, cwd=self.dir, stdout=out, stderr=asyncio.subprocess.STDOUT))

    async def cli(self, *args: str) -> tuple[int, int]:
        """Run ``rheo-flow ARGS`` to its end: when it started and ended (ms)."""
        started = _now_ms()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rheo_flow", *args, "-u", self.url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, out.decode()
        return started, _now_ms()

    def outputs(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.dir.glob("out-*.txt")))


def _now_ms() -> int:
    return int(time.time() * 1000)


async def _until(check: Callable[[], bool | Awaitable[bool]], what: str, timeout: float,
                 run: Run) -> None:
    """Wait for ``check()`` (polling it) or fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        done = check()
        if not isinstance(done, bool):
            done = await done
        if done:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{what} not reached within {timeout} s; workers said:\n{run.outputs()}")
        await asyncio.sleep(0.02)  # polling the condition against its deadline


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, int]]:
    """The store's URL and the workers' poll interval: short on SQLite, whose other
    processes learn of a resume by polling; long where wake-ups cross processes."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'pause.db'}", 100
    elif request.param == "postgres":
        yield str(request.getfixturevalue("postgres_schema_url")), 1000
    else:
        redis_url = str(request.getfixturevalue("redis_url"))
        yield f"{redis_url}?prefix=rheo-test-pause-{uuid.uuid4().hex[:10]}", 1000


@pytest.fixture
async def run(store: tuple[str, int], tmp_path: Path) -> AsyncIterator[Run]:
    url, poll_ms = store
    (tmp_path / "app.py").write_text(APP)
    async with Rheo(url) as rheo:
        await rheo.create_stream("work", partitions=PARTITIONS)
        await rheo.create_group("work", "g")
    made = Run(tmp_path, url, poll_ms)
    try:
        yield made
    finally:
        for proc in made.procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        async with Rheo(url) as rheo:
            await rheo.delete_stream("work")


async def _produce(rheo: Rheo, appended: list[int], stop: asyncio.Event) -> None:
    """Append 10 events every 10 ms until ``stop``; ``appended[0]`` counts them."""
    while not stop.is_set():
        first = appended[0]
        await rheo.append("work", [NewEvent("job", {"n": n}, id=f"job-{n}")
                                   for n in range(first, first + 10)])
        appended[0] += 10
        await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=0.01)


async def test_pause_stops_new_leases_and_resume_restarts_the_same_workers(run: Run) -> None:
    await run.start_workers()
    stop = asyncio.Event()
    appended = [0]
    pause_ms: list[tuple[int, int]] = []
    resume_ms: list[tuple[int, int]] = []
    async with Rheo(run.url) as rheo:
        producer = asyncio.create_task(_produce(rheo, appended, stop))
        try:
            for cycle in range(CYCLES):
                before = len(run.leases())
                await _until(lambda b=before: len(run.leases()) >= b + 50,  # type: ignore[misc]
                             f"cycle {cycle}: consumption", 60, run)
                pausing, paused = await run.cli("pause", "work", "g")
                assert (await rheo.group_info("work", "g")).paused
                window_end = paused + 3 * run.poll_ms
                await _until(lambda end=window_end: _now_ms() > end,  # type: ignore[misc]
                             f"cycle {cycle}: three poll intervals after the pause", 30, run)
                late = [x for x in run.leases() if x.at_ms > paused + CLOCK_SLACK_MS]
                assert late == [], f"cycle {cycle}: leased after the pause returned: {late[:5]}"
                last = max(x.at_ms for x in run.leases())
                pause_ms.append((last - pausing, last - paused))
                resuming, resumed = await run.cli("resume", "work", "g")
                await _until(lambda p=paused: any(x.at_ms > p for x in run.leases()),
                             f"cycle {cycle}: consumption after the resume", 30, run)
                first = min(x.at_ms for x in run.leases() if x.at_ms > paused)
                resume_ms.append((first - resuming, first - resumed))
        finally:
            stop.set()
            await producer
        total = appended[0]
        await _until(lambda: len({(x.partition, x.sequence) for x in run.leases()}) >= total,
                     "every event handled", 120, run)
        async def settled() -> bool:
            high, frontier = await _progress(rheo)
            return sum(high.values()) == total == sum(frontier.values())

        await _until(settled, "every event acked", 60, run)
        high, frontier = await _progress(rheo)
        assert frontier == high
        assert sum(high.values()) == total
    leases = run.leases()
    times = Counter((x.partition, x.sequence) for x in leases)
    assert [k for k, n in times.items() if n != 1] == [], "events leased more than once"
    assert {x.attempt for x in leases} == {1}
    assert len({x.pid for x in leases}) >= 2, "the processes competed for the group"
    for proc in run.procs:
        proc.send_signal(signal.SIGTERM)
    for proc in run.procs:
        assert await asyncio.wait_for(proc.wait(), 60) == 0, run.outputs()
    print(f"\n{run.url.split(':')[0]}: {total} events, {WORKERS} workers, poll "
          f"{run.poll_ms} ms; last lease after the pause command's start and end (ms): "
          f"{pause_ms}; first lease after the resume command's start and end (ms): "
          f"{resume_ms}")


async def _progress(rheo: Rheo) -> tuple[dict[int, int], dict[int, int]]:
    return (dict((await rheo.stream_info("work")).high_water),
            await rheo.frontier("work", "g"))
