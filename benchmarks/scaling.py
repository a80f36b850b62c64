"""Suite ``scaling``: aggregate throughput of 1, 2 and 4 worker processes on one backlog.

Each worker process (``benchmarks/_scaling_worker.py``) runs a consumer group
(``fetch_size`` 100, ``max_demand`` 200, ``concurrency`` 100, no-op handler) on
the same group of one stream with 8 partitions; the parent appends the backlog,
starts the workers, waits until every one has opened its store, releases them
together and stops the clock when the group's lag reaches zero. The figure is
events per second over all workers; the baseline is one worker process on the
same backend in the same run, so the ratio is the speed-up.

Backends: SQLite (a file of its own), PostgreSQL (``RHEO_POSTGRES_URL``), Redis
(``RHEO_REDIS_URL``), MongoDB (``RHEO_MONGO_URL``), and, when their variables
are set, Redis Cluster (``RHEO_REDIS_CLUSTER_URL``) and PostgreSQL through
PgBouncer (``RHEO_PGBOUNCER_URL``); ``RHEO_SCALING_BACKENDS`` (a comma list of
those names) runs only some. A backend whose server cannot be reached is left
out with a note on standard error.

On a machine with two cores, the parent, the workers and the server share them:
beyond two workers the figure is expected to stay flat (docs/scaling.md). So
each one-worker run also measures where the CPU goes: the worker's own CPU
time per event (``time.process_time`` from release to stop) and the rest of
the machine's busy time per event (``/proc/stat``: the server, mostly). From
these the suite models the ceiling on a machine with more cores: with one
worker per core, ``cores / (worker + server CPU per event)`` for a
multi-process server (PostgreSQL, MongoDB), but at most ``primaries / server
CPU per event`` for Redis, whose server runs commands on one thread per
primary; SQLite serializes its writers, so its ceiling is the one-process
rate. A model, not a measurement: it leaves out lock contention and the
network.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rheo_flow import NewEvent, Rheo

from ._common import Result, payload

ROOT = Path(__file__).resolve().parent.parent
PROCESSES = (1, 2, 4)
PARTITIONS = 8
FETCH_SIZE = 100
CHUNK = 2_000
START_TIMEOUT_S = 120.0
DRAIN_TIMEOUT_S = 600.0
MODEL_CORES = (4, 8, 16)
SINGLE_THREADED_SERVERS = {"redis": 1, "redis-cluster": 3}
"""Backends whose server runs commands on one thread per primary: their primaries."""


@dataclass(frozen=True, slots=True)
class Run:
    """One drained backlog: the aggregate rate and where the CPU went, per event."""

    rate: float
    worker_cpu_us: float
    other_cpu_us: float


def _busy_seconds() -> float:
    """CPU seconds the whole machine has been busy (every core, all but idle and iowait)."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _server_urls() -> dict[str, str]:
    urls = {
        "postgres": os.environ.get("RHEO_POSTGRES_URL")
        or "postgresql://postgres@127.0.0.1:5432/test",
        "redis": os.environ.get("RHEO_REDIS_URL") or "redis://127.0.0.1:6379/0",
    }
    for name, variable in (("redis-cluster", "RHEO_REDIS_CLUSTER_URL"),
                           ("pgbouncer", "RHEO_PGBOUNCER_URL")):
        if os.environ.get(variable):
            urls[name] = os.environ[variable]
    # Last: the slowest server here (the MongoDB emulator CI runs).
    urls["mongo"] = os.environ.get("RHEO_MONGO_URL") or "mongodb://127.0.0.1:27017/rheo_bench"
    return urls


async def _reachable(url: str) -> str | None:
    """``None`` when the store opens within a few seconds, else why not."""
    try:
        rheo = await asyncio.wait_for(Rheo(url).open(), 10)
        await rheo.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


async def _backlog(url: str, stream: str, events: int, keys: int | None,
                   ordering: Literal["none", "key"]) -> None:
    rheo = await Rheo(url).open()
    try:
        await rheo.create_stream(stream, partitions=PARTITIONS)
        await rheo.create_group(stream, "g", start="earliest", ordering=ordering)
        for start in range(0, events, CHUNK):
            await rheo.append(stream, [
                NewEvent("bench.event", payload(i), key=str(i if keys is None else i % keys))
                for i in range(start, min(events, start + CHUNK))
            ])
    finally:
        await rheo.close()


async def _wait_for(what: str, check: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"scaling benchmark: {what} within {timeout:.0f}s")
        await asyncio.sleep(0.01)


async def _drained(rheo: Rheo, stream: str) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while sum((await rheo.lag(stream, "g")).values()) > 0:
        if time.monotonic() > deadline:
            raise TimeoutError("scaling benchmark: the backlog was not drained in time")
        await asyncio.sleep(0.02)


async def run_workers(url: str, processes: int, events: int, *, keys: int | None = None,
                      ordering: Literal["none", "key"] = "none") -> Run:
    """``processes`` worker processes draining ``events``: the rate and the CPU split.

    The events' keys cycle through ``keys`` distinct values (None: every event its own);
    the group is created with ``ordering``.
    """
    stream = f"scale-{uuid.uuid4().hex[:8]}"
    await _backlog(url, stream, events, keys, ordering)
    with tempfile.TemporaryDirectory(prefix="rheo-scaling-") as directory:
        folder = Path(directory)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)}
        workers = [
            await asyncio.create_subprocess_exec(
                # As a module from the root: run as a script, its folder would come
                # first on sys.path and benchmarks/redis.py would shadow redis-py.
                sys.executable, "-m", "benchmarks._scaling_worker", url, stream, directory,
                f"w{i}", str(FETCH_SIZE), env=env, cwd=ROOT)
            for i in range(processes)
        ]
        rheo = await Rheo(url).open()
        try:
            await _wait_for("workers ready",
                            lambda: len(list(folder.glob("*.ready"))) == processes
                            or any(w.returncode is not None for w in workers), START_TIMEOUT_S)
            if any(w.returncode is not None for w in workers):
                raise RuntimeError("a scaling worker exited before it was ready")
            started, busy, own = time.perf_counter(), _busy_seconds(), time.process_time()
            (folder / "go").touch()
            await _drained(rheo, stream)
            elapsed = time.perf_counter() - started
            busy, own = _busy_seconds() - busy, time.process_time() - own
            (folder / "stop").touch()
            for w in workers:
                await asyncio.wait_for(w.wait(), 60)
            reports = [json.loads((folder / f"w{i}.json").read_text())
                       for i in range(processes)]
            acked = sum(r["acked"] for r in reports)
            worker_cpu = sum(r["cpu_s"] for r in reports)
            if acked < events:
                # The group's lag reached zero, so every event is settled: the acks the
                # workers did not count ended ambiguous (no answer in time) but committed.
                print(f"scaling: {events - acked} of {events} acks ended ambiguous and "
                      "committed (an overloaded server)", file=sys.stderr)
            await rheo.delete_stream(stream)
        finally:
            for w in workers:
                if w.returncode is None:
                    w.kill()
                    await w.wait()
            await rheo.close()
    return Run(events / elapsed, worker_cpu / events * 1e6,
               max(0.0, busy - worker_cpu - own) / events * 1e6)


def _modeled(name: str, one: Run, cores: int) -> float:
    """The modeled rate with ``cores`` cores and one worker per core (see the docstring)."""
    if name == "sqlite":
        return one.rate
    ceiling = cores / ((one.worker_cpu_us + one.other_cpu_us) / 1e6)
    primaries = SINGLE_THREADED_SERVERS.get(name)
    if primaries is not None and one.other_cpu_us > 0:
        ceiling = min(ceiling, primaries / (one.other_cpu_us / 1e6))
    return ceiling


async def _backend_results(name: str, url: str, events: int, rounds: int) -> list[Result]:
    runs: dict[int, list[Run]] = {n: [] for n in PROCESSES}
    for _ in range(rounds):
        for n in PROCESSES:
            runs[n].append(await run_workers(url, n, events))
    best = {n: sorted(values, key=lambda r: r.rate)[len(values) // 2]
            for n, values in runs.items()}
    one = best[1]
    note = f"{events} events, {PARTITIONS} partitions"
    results = [
        Result.compared(f"consume+ack, {n} worker processes", name, best[n].rate, "events/s",
                        one.rate, note, baseline_name="1-process")
        for n in PROCESSES
    ]
    results += [
        Result("CPU per event, 1 worker: the worker", name, one.worker_cpu_us, "µs"),
        Result("CPU per event, 1 worker: server and the rest", name, one.other_cpu_us, "µs"),
    ]
    results += [
        Result.compared(f"modeled: {cores} cores, {cores} workers", name,
                        _modeled(name, one, cores), "events/s", one.rate,
                        "a model from the CPU split, not a measurement",
                        baseline_name="1-process")
        for cores in MODEL_CORES
    ]
    return results


async def run(quick: bool) -> list[Result]:
    """The suite: every reachable backend, 1, 2 and 4 worker processes."""
    events = 4_000 if quick else 20_000
    rounds = 1 if quick else 3
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="rheo-scaling-sqlite-") as directory:
        urls = {"sqlite": f"sqlite:///{directory}/scaling.db", **_server_urls()}
        wanted = [n for n in os.environ.get("RHEO_SCALING_BACKENDS", "").split(",") if n]
        for name, url in urls.items():
            if wanted and name not in wanted:
                continue
            problem = await _reachable(url)
            if problem is not None:
                print(f"scaling: {name} left out ({problem})", file=sys.stderr)
                continue
            try:
                results += await _backend_results(name, url, events, rounds)
            except Exception as exc:  # one backend's failure must not lose the others'
                print(f"scaling: {name} failed ({type(exc).__name__}: {exc})", file=sys.stderr)
    return results
