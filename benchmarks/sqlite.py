"""Suite ``sqlite``: the SQLite backend against plain ``sqlite3`` loops, 1 process, one run.

Both sides use the same durability settings: ``journal_mode=WAL`` and
``synchronous=FULL`` (:class:`~rheo_flow.backends.SQLiteBackend`'s default, passed
to it explicitly here; the journal mode of rheo_flow's file is checked after
each run), a file of their own in a temporary directory, and one dedicated
thread per connection reached in one hop per transaction (as the backend does),
so the event loop stays free in both.

* **append throughput at batch 1000** — ``Rheo.append`` of 1000-event batches
  against one ``executemany`` INSERT of 1000 rows per transaction into a plain
  table (``id INTEGER PRIMARY KEY, type, data``: no event ids, sequences or
  idempotency).
* **consume + ack throughput at batch 100** — a backlog is consumed and
  acknowledged through a :class:`rheo_flow.Group` (``max_demand`` 400,
  ``fetch_size`` 100, ``concurrency`` 100, as the ``postgres`` suite), a
  :class:`~rheo_flow.pipeline.Pipeline` (4 processors, one batcher of 100,
  ``fetch_size`` 100, its default ``max_inflight``: room for its stages, which
  hold a filling batch) and a bare ``fetch``/``ack`` loop (``limit`` 100), against a
  claim + delete loop: one
  ``DELETE FROM q WHERE id IN (SELECT id FROM q ORDER BY id LIMIT 100) RETURNING``
  per batch, one statement and one commit (no leases, fencing or frontier).

Rounds alternate between the contenders, each on a fresh file; medians are
reported.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import orjson

from rheo_flow import ACK, NewEvent, Rheo, consumer
from rheo_flow.backends import SQLiteBackend

from ._common import (
    Result,
    alternating_rounds,
    append_rate,
    backend_loop_rate,
    payload,
    pipeline_rate,
    wait_until,
)

SYNCHRONOUS = "FULL"
BUSY_TIMEOUT_MS = 5_000
APPEND_BATCH = 1_000
CONSUME_BATCH = 100
BACKLOG_CHUNK = 5_000
RAW = "raw-sqlite3"
T = TypeVar("T")


# rheo_flow -------------------------------------------------------------------------


async def _rheo(directory: str) -> tuple[Rheo, Path]:
    path = Path(directory) / "rheo.db"
    backend = SQLiteBackend(path, synchronous=SYNCHRONOUS, busy_timeout_ms=BUSY_TIMEOUT_MS)
    return await Rheo(backend).open(), path


def _check_wal(path: Path) -> None:
    with sqlite3.connect(path) as conn:
        mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
    if mode.lower() != "wal":
        raise RuntimeError(f"rheo_flow's file is in journal mode {mode}, not WAL")


async def _backlog(rheo: Rheo, events: int) -> None:
    await rheo.create_stream("bench")
    for start in range(0, events, BACKLOG_CHUNK):
        await rheo.append("bench", [NewEvent("bench.event", payload(i))
                                    for i in range(start, min(events, start + BACKLOG_CHUNK))])


async def rheo_append(events: int) -> float:
    """Events per second through ``Rheo.append`` of ``APPEND_BATCH``-event batches."""
    with tempfile.TemporaryDirectory(prefix="rheo-bench-") as directory:
        rheo, path = await _rheo(directory)
        try:
            await rheo.create_stream("bench")
            rate = await append_rate(rheo, "bench", events, APPEND_BATCH)
        finally:
            await rheo.close()
        _check_wal(path)
        return rate


@asynccontextmanager
async def _consumed(events: int) -> AsyncIterator[Rheo]:
    """rheo_flow on a fresh file holding a backlog of ``events``; on exit, checks
    that group ``g`` settled all of them and that the file is still in WAL mode."""
    with tempfile.TemporaryDirectory(prefix="rheo-bench-") as directory:
        rheo, path = await _rheo(directory)
        try:
            await _backlog(rheo, events)
            yield rheo
            if sum((await rheo.lag("bench", "g")).values()) != 0:
                raise RuntimeError("rheo_flow left events unsettled")
        finally:
            await rheo.close()
        _check_wal(path)


async def rheo_group(events: int) -> float:
    """Events per second consumed and acked through a ``Group`` (no-op handler)."""
    async with _consumed(events) as rheo:

        # One batch per fetch; up to four held: more room makes it no faster.
        @consumer(stream="bench", group="g", max_demand=4 * CONSUME_BATCH,
                  fetch_size=CONSUME_BATCH, concurrency=CONSUME_BATCH, poll_ms=50)
        async def noop(event: Any, context: Any) -> Any:
            return ACK

        started = time.perf_counter()
        async with noop.start(rheo) as group:
            await wait_until(lambda: group.stats.acked >= events, 300)
            elapsed = time.perf_counter() - started
    return events / elapsed


async def rheo_pipeline(events: int) -> float:
    """Events per second through a ``Pipeline`` (4 processors, one batcher of
    ``CONSUME_BATCH``; each fetch claims at most ``CONSUME_BATCH``, as the ``Group`` does)."""
    async with _consumed(events) as rheo:
        return await pipeline_rate(rheo, "bench", "g", events, demand=CONSUME_BATCH,
                                   batch=CONSUME_BATCH,
                                   fetch_size=CONSUME_BATCH)


async def rheo_backend_loop(events: int) -> float:
    """Events per second of the backend alone: ``ack_and_fetch`` of ``CONSUME_BATCH`` in
    a loop, handler inline (no runtime)."""
    async with _consumed(events) as rheo:
        return await backend_loop_rate(rheo, "bench", "g", events, limit=CONSUME_BATCH)


async def rheo_fetch_ack(events: int) -> float:
    """Events per second of one loop of ``fetch(limit=CONSUME_BATCH)`` + ``ack``."""
    with tempfile.TemporaryDirectory(prefix="rheo-bench-") as directory:
        rheo, path = await _rheo(directory)
        try:
            await _backlog(rheo, events)
            await rheo.create_group("bench", "g")
            started = time.perf_counter()
            done = 0
            while done < events:
                leases = await rheo.fetch("bench", "g", consumer_id="c", limit=CONSUME_BATCH)
                results = await rheo.ack(leases)
                done += sum(r.ok for r in results)
            rate = events / (time.perf_counter() - started)
        finally:
            await rheo.close()
        _check_wal(path)
        return rate


# raw sqlite3 -----------------------------------------------------------------------


class _Raw:
    """A plain queue table on one connection living in one thread, with rheo_flow's
    pragmas; every call is one transaction run start to finish in that thread."""

    def __init__(self, path: Path) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="raw-sqlite")
        self._path = path
        self._conn: sqlite3.Connection | None = None

    @property
    def conn(self) -> sqlite3.Connection:
        assert self._conn is not None
        return self._conn

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _open(self) -> None:
        conn = sqlite3.connect(self._path, isolation_level=None,
                               timeout=BUSY_TIMEOUT_MS / 1000, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS}")
        conn.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, type TEXT NOT NULL, "
                      "data TEXT NOT NULL)")
        self._conn = conn

    async def __aenter__(self) -> _Raw:
        await self.call(self._open)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._conn is not None:
            await self.call(self._conn.close)
        self._executor.shutdown(wait=True)

    def insert(self, rows: list[tuple[str, str]]) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO q (type, data) VALUES (?, ?)", rows)
        conn.execute("COMMIT")

    def take(self, limit: int) -> list[Any]:
        # One statement in autocommit mode: one write transaction, one commit.
        return self.conn.execute(
            "DELETE FROM q WHERE id IN (SELECT id FROM q ORDER BY id LIMIT ?) "
            "RETURNING id, type, data", (limit,)).fetchall()


def _rows(start: int, stop: int) -> list[tuple[str, str]]:
    return [("bench.event", orjson.dumps(payload(i)).decode()) for i in range(start, stop)]


async def raw_append(events: int) -> float:
    """Rows per second of one ``executemany`` INSERT per ``APPEND_BATCH`` rows."""
    with tempfile.TemporaryDirectory(prefix="rheo-bench-") as directory:
        async with _Raw(Path(directory) / "raw.db") as raw:
            started = time.perf_counter()
            for start in range(0, events, APPEND_BATCH):
                await raw.call(raw.insert, _rows(start, min(events, start + APPEND_BATCH)))
            return events / (time.perf_counter() - started)


async def raw_consume(events: int) -> float:
    """Rows per second of one claim + delete statement per ``CONSUME_BATCH`` rows."""
    with tempfile.TemporaryDirectory(prefix="rheo-bench-") as directory:
        async with _Raw(Path(directory) / "raw.db") as raw:
            for start in range(0, events, BACKLOG_CHUNK):
                await raw.call(raw.insert, _rows(start, min(events, start + BACKLOG_CHUNK)))
            started = time.perf_counter()
            done = 0
            while done < events:
                done += len(await raw.call(raw.take, CONSUME_BATCH))
            return events / (time.perf_counter() - started)


# the suite -------------------------------------------------------------------------


async def run(quick: bool) -> list[Result]:
    """Append and consume+ack throughput against plain sqlite3 loops."""
    events = 10_000 if quick else 50_000
    rounds = 1 if quick else 3
    medians = await alternating_rounds(rounds, {
        "raw append": lambda: raw_append(events),
        "append": lambda: rheo_append(events),
        "raw consume": lambda: raw_consume(events),
        "group": lambda: rheo_group(events),
        "pipeline": lambda: rheo_pipeline(events),
        "fetch/ack": lambda: rheo_fetch_ack(events),
        "backend loop": lambda: rheo_backend_loop(events),
    })
    shape = (f"{events} events per contender, median of {rounds} alternating rounds, "
             f"1 process; journal_mode=WAL, synchronous={SYNCHRONOUS} on both sides")
    raw_append_rate, raw_consume_rate = medians["raw append"], medians["raw consume"]
    return [
        Result(f"append batch {APPEND_BATCH}: executemany INSERT", RAW, raw_append_rate,
               "events/s", note=shape),
        Result.compared(f"append batch {APPEND_BATCH} vs raw insert", "sqlite",
                        medians["append"], "events/s", raw_append_rate,
                        note=f"{shape}; target ratio >= 0.3", baseline_name=RAW),
        Result(f"consume+ack batch {CONSUME_BATCH}: DELETE ... LIMIT RETURNING", RAW,
               raw_consume_rate, "events/s", note=shape),
        Result.compared(f"consume+ack batch {CONSUME_BATCH}: Group vs raw claim+delete",
                        "sqlite", medians["group"], "events/s", raw_consume_rate,
                        note=f"{shape}; target ratio >= 0.5", baseline_name=RAW),
        Result.compared(f"consume+ack batch {CONSUME_BATCH}: Pipeline vs raw claim+delete",
                        "sqlite", medians["pipeline"], "events/s", raw_consume_rate,
                        note=shape, baseline_name=RAW),
        Result.compared(f"consume+ack batch {CONSUME_BATCH}: Group vs Pipeline", "sqlite",
                        medians["group"], "events/s", medians["pipeline"], note=shape,
                        baseline_name="pipeline"),
        Result.compared(f"consume+ack batch {CONSUME_BATCH}: fetch/ack vs raw claim+delete",
                        "sqlite", medians["fetch/ack"], "events/s", raw_consume_rate,
                        note=shape, baseline_name=RAW),
        Result.compared(f"consume+ack batch {CONSUME_BATCH}: backend ack_and_fetch loop vs "
                        "raw claim+delete", "sqlite", medians["backend loop"], "events/s",
                        raw_consume_rate, note=shape, baseline_name=RAW),
        Result.compared(f"consume+ack batch {CONSUME_BATCH}: Group vs backend loop", "sqlite",
                        medians["group"], "events/s", medians["backend loop"], note=shape,
                        baseline_name="backend loop"),
    ]
