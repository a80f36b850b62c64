"""Key ordering across OS processes (tests/runtime/_ordering_worker.py is the worker).

Four processes run a ``Group`` with ``ordering="key"`` (sixteen handlers each)
over 20,000 events of 200 keys in a stream of four partitions; handlers sleep a
random short while and retry about one handling in eight after a short delay.
Every handling is recorded with its wall-clock start and end (one host: the
processes' ``time.time_ns()`` compare). Per key, ordered by start, the handlings
never overlap and their sequences never go down, so the handling order is the
key's append order with redeliveries as repeats of one position; every event is
acked exactly once in the end, nothing is dead-lettered, and the frontier is the
high water.

The ``url`` fixture names the backends it runs on; a backend declaring
``key_ordering`` joins by adding its name to ``BACKENDS`` and a branch to
``url`` (the server backends' URL fixtures are in tests/conftest.py).

On MongoDB the suite runs against an emulator (.ci/mongo-emulator.sh), a Python
server far slower than MongoDB: by default the run there is :data:`MONGO_EVENTS`
events over the same 200 keys, with settings that fetch less often
(:data:`MONGO_SETTINGS`); ``RHEO_MONGO_ORDERING_FULL=1`` runs the full 20,000
(several minutes on the emulator).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rheo_flow import NewEvent, Query, Rheo
from rheo_flow.backends import MongoBackend, RedisBackend

WORKER = Path(__file__).with_name("_ordering_worker.py")
EVENTS = 20_000
KEYS = 200
PARTITIONS = 4
WORKERS = 4
BATCH = 1_000
DEADLINE_S = 120.0
"""How long the workers have to catch up (a full MongoDB run gets :data:`MONGO_DEADLINE_S`)."""

BACKENDS = ["sqlite", "postgres", "redis", "redis-cluster", "mongo"]
"""Backends the test runs on: those declaring ``key_ordering`` (give ``url`` a branch)."""

MONGO_FULL = os.environ.get("RHEO_MONGO_ORDERING_FULL", "") not in ("", "0")
"""``RHEO_MONGO_ORDERING_FULL=1``: the full run on MongoDB too (minutes on the emulator)."""
MONGO_EVENTS = EVENTS if MONGO_FULL else 500
"""Events of the MongoDB run (187 of the 200 keys occur in the first 500)."""
MONGO_DEADLINE_S = 1_800.0 if MONGO_FULL else 300.0
"""The emulator is slow, and slower still on a busy machine."""
MONGO_SETTINGS = ["--max-demand=16", "--fetch-size=16", "--poll-ms=100", "--check-s=1"]
"""Worker settings on MongoDB: no more leases held than handled, fewer fetches and reads."""


@pytest.fixture(params=BACKENDS)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh store of the backend named by the parameter (a server's is removed after)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ordering.db'}?busy_timeout_ms=60000"
    elif request.param == "postgres":
        yield str(request.getfixturevalue("postgres_schema_url"))
    elif request.param in ("redis", "redis-cluster"):
        server = str(request.getfixturevalue(
            "redis_url" if request.param == "redis" else "redis_cluster_url"))
        prefix = f"rheo-test-ord-{uuid.uuid4().hex[:10]}"
        yield f"{server}{'&' if '?' in server else '?'}prefix={prefix}"
        asyncio.run(_drop(RedisBackend.from_url(server, prefix=prefix)))
    elif request.param == "mongo":
        server = str(request.getfixturevalue("mongo_url"))
        prefix = f"ord{uuid.uuid4().hex[:10]}_"
        yield f"{server.split('?', 1)[0]}?collection_prefix={prefix}"
        asyncio.run(_drop(MongoBackend(server, collection_prefix=prefix)))
    else:
        raise AssertionError(f"no URL for backend {request.param!r}")


async def _drop(backend: RedisBackend | MongoBackend) -> None:
    try:
        await backend.drop_all()
    finally:
        await backend.close()


async def _worker(deadline_s: float, *args: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args, f"--deadline-s={deadline_s}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    _, err = await asyncio.wait_for(proc.communicate(), deadline_s + 120)
    assert proc.returncode == 0, err.decode()


def test_four_processes_keep_each_key_in_order(url: str, tmp_path: Path) -> None:
    mongo = url.startswith("mongodb")
    events = MONGO_EVENTS if mongo else EVENTS
    records = asyncio.run(_run(url, tmp_path, events, *(
        (MONGO_DEADLINE_S, MONGO_SETTINGS) if mongo else (DEADLINE_S, []))))
    _check_order(records, events)


async def _run(url: str, tmp_path: Path, events: int, deadline_s: float,
               settings: list[str]) -> list[list[Any]]:
    rng = random.Random(7)
    async with Rheo(url) as rheo:
        await rheo.create_stream("orders", partitions=PARTITIONS)
        info = await rheo.create_group("orders", "billing", ordering="key")
        assert info.ordering == "key"
        for first in range(0, events, BATCH):
            await rheo.append("orders", [
                NewEvent("order", {"i": i}, id=f"o{i}", key=f"k{rng.randrange(KEYS)}")
                for i in range(first, min(first + BATCH, events))])
        ready = tmp_path / "ready"
        ready.mkdir()
        outs = [tmp_path / f"w{i}.jsonl" for i in range(WORKERS)]
        await asyncio.gather(*(
            _worker(deadline_s, url, "orders", "billing", f"w{i}", str(ready), str(WORKERS),
                    str(out), str(i), *settings)
            for i, out in enumerate(outs)))
        high = await rheo.high_water("orders")
        assert sum(high.values()) == events
        assert await rheo.frontier("orders", "billing") == high
        assert await rheo.dead_letters("orders", "billing") == []
        assert await rheo.fetch("orders", "billing", limit=10) == []
        appended: dict[tuple[str, int], list[int]] = defaultdict(list)
        async for event in rheo.stream_query(Query(stream="orders")):
            assert event.key is not None
            appended[(event.key, event.partition)].append(event.sequence)
    records = [json.loads(line) for out in outs for line in out.read_text().splitlines()]
    assert all(out.read_text() for out in outs), "every process handled events"
    handled = defaultdict(list)
    for key, partition, sequence, *_ in sorted(records, key=lambda r: r[4]):
        handled[(key, partition)].append(sequence)
    for slot, sequences in appended.items():
        positions = [s for i, s in enumerate(handled[slot]) if i == 0 or s != handled[slot][i - 1]]
        assert positions == sequences, f"{slot}: handled in append order, repeats aside"
    return records


def _check_order(records: list[list[Any]], events: int) -> None:
    by_key: dict[tuple[str, int], list[list[Any]]] = defaultdict(list)
    for record in records:
        by_key[(record[0], record[1])].append(record)
    rng = random.Random(7)  # the keys _run appended
    appended = {rng.randrange(KEYS) for _ in range(events)}
    assert len(by_key) == len(appended), "every key was handled (each lives in one partition)"
    for slot, handlings in by_key.items():
        handlings.sort(key=lambda r: r[4])
        for before, after in itertools.pairwise(handlings):
            assert after[2] >= before[2], f"{slot}: sequence {after[2]} after {before[2]}"
            assert after[4] >= before[5], f"{slot}: handlings of {before[2]} and {after[2]} overlap"
    acks = Counter((r[1], r[2]) for r in records if r[6] == "ack")
    assert len(acks) == events, "every event acked"
    assert set(acks.values()) == {1}, "every event acked exactly once"
    attempts: dict[tuple[int, int], list[int]] = defaultdict(list)
    for record in sorted(records, key=lambda r: r[4]):
        attempts[(record[1], record[2])].append(record[3])
    for position, seen in attempts.items():
        assert seen == list(range(1, len(seen) + 1)), f"{position}: attempts {seen}"
    retried = sum(1 for r in records if r[6] == "retry")
    assert retried > events // 20, f"the handlers retried ({retried} retries)"
