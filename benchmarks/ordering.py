"""Suite ``ordering``: key-ordered against unordered consumption, 4 worker processes.

The workers of the ``scaling`` suite (``benchmarks/_scaling_worker.py``: a consumer
group with ``fetch_size`` 100, ``max_demand`` 200, ``concurrency`` 100 and a no-op
handler) drain one backlog of a stream with 8 partitions whose events' keys cycle
through 10, 1,000 or 100,000 distinct values. The figure is events per second over
all workers with the group created ``ordering="key"``; the baseline is the same
run with ``ordering="none"`` on the same backend in the same process run. With 10
keys at most 10 deliveries can be leased at a time, so that ratio shows what the
guarantee costs when few keys carry the load; with 100,000 keys nothing should be
held back, and the ratio is the cost of the bookkeeping alone.

Backends: SQLite, PostgreSQL (``RHEO_POSTGRES_URL``), Redis (``RHEO_REDIS_URL``) and
MongoDB (``RHEO_MONGO_URL``, last: in CI the emulator .ci/mongo-emulator.sh starts, a
Python server whose speed says nothing about MongoDB's; its figures say so), those
that declare ``key_ordering``; ``RHEO_SCALING_BACKENDS`` selects some, and
``RHEO_ORDERING_KEYS`` (say ``100000``) some of the key counts.
"""

from __future__ import annotations

import os
import sys
import tempfile

from rheo_flow import Rheo

from ._common import Result
from .scaling import _reachable, _server_urls, run_workers

WORKERS = 4
KEYS = (10, 1_000, 100_000)


def _key_counts() -> tuple[int, ...]:
    wanted = [int(n) for n in os.environ.get("RHEO_ORDERING_KEYS", "").split(",") if n]
    unknown = [n for n in wanted if n not in KEYS]
    if unknown:
        raise SystemExit(f"RHEO_ORDERING_KEYS: {unknown} not among {list(KEYS)}")
    return tuple(wanted) or KEYS


async def _orders_keys(url: str) -> bool:
    async with Rheo(url) as rheo:
        return bool(rheo.backend.capabilities.key_ordering)


async def _backend_results(name: str, url: str, events: int, rounds: int) -> list[Result]:
    results: list[Result] = []
    note = f"{events} events, 8 partitions"
    if name == "mongo":
        note += ", on the MongoDB emulator in CI (not MongoDB's speed)"
    for keys in _key_counts():
        rates: dict[str, list[float]] = {"none": [], "key": []}
        for _ in range(rounds):
            for ordering in ("none", "key"):
                run = await run_workers(url, WORKERS, events, keys=keys, ordering=ordering)
                rates[ordering].append(run.rate)
        median = {o: sorted(v)[len(v) // 2] for o, v in rates.items()}
        results.append(Result.compared(
            f"consume+ack, {WORKERS} workers, {keys} keys, ordering=key", name,
            median["key"], "events/s", median["none"], note,
            baseline_name="ordering=none"))
    return results


async def run(quick: bool) -> list[Result]:
    """The suite: every reachable backend that orders keys, at 10, 1,000 and 100,000 keys."""
    events = 4_000 if quick else 20_000
    rounds = 1 if quick else 3
    wanted = [n for n in os.environ.get("RHEO_SCALING_BACKENDS", "").split(",") if n]
    results: list[Result] = []
    with tempfile.TemporaryDirectory(prefix="rheo-ordering-sqlite-") as directory:
        servers = _server_urls()
        urls = {"sqlite": f"sqlite:///{directory}/ordering.db",
                "postgres": servers["postgres"], "redis": servers["redis"],
                "mongo": servers["mongo"]}
        for name, url in urls.items():
            if wanted and name not in wanted:
                continue
            problem = await _reachable(url)
            if problem is None and not await _orders_keys(url):
                problem = "it does not declare key_ordering"
            if problem is not None:
                print(f"ordering: {name} left out ({problem})", file=sys.stderr)
                continue
            try:
                results += await _backend_results(name, url, events, rounds)
            except Exception as exc:  # one backend's failure must not lose the others'
                print(f"ordering: {name} failed ({type(exc).__name__}: {exc})", file=sys.stderr)
    return results
