"""Scenarios that crash the backend server: ``kill -9`` and restart (PostgreSQL, Redis).

A run of these scenarios never touches the server its URL names: its endpoints
start a throwaway server of the same kind (:mod:`._servers`: PostgreSQL with
``fsync`` on, Redis with the append-only file and ``appendfsync always``) and
point the workload and the checker at it. The exception is a URL naming a
throwaway server this process started itself (a test's): the run uses, and
kills, that one.

* ``server-kill`` — SIGKILL the server once per 5,000 events of the run (at
  least once: at 50% settled; more kills spread evenly over 25%-75%), leave it
  down for half a second (clients meet refused connections), start it again (crash
  recovery runs) and let the workload carry on.
* ``crash-after-re-lease`` — SIGSTOP a worker while it holds leases (on
  PostgreSQL, where they can be read, at a moment it does) until they expire,
  wait for another worker to lease one of them again, SIGKILL the server at that
  moment, restart it and SIGCONT the stalled worker: the re-lease must have survived the
  crash, so every settle of the stalled worker's old leases stays fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from typing import Any, Final
from urllib.parse import parse_qsl, urlsplit

from .._backends.postgres import DEFAULT_SCHEMA
from ._run_objects import NETWORKED, RunObjects, throwaway_endpoints_of
from ._scenario import (
    Endpoints,
    RunControl,
    Scenario,
    WorkerProcess,
    backend_family,
    register,
)
from ._servers import PostgresServer, RedisServer, ThrowawayServer, running_servers

__all__ = ["CRASH_AFTER_RE_LEASE", "SERVER_KILL", "kill_points", "server_of", "throwaway_endpoints"]

EVENTS_PER_KILL: Final = 5_000
"""``server-kill`` kills the server once per this many events of a run (at least once)."""
DOWN_S: Final = 0.5
"""How long a killed server stays down before it is started again."""
_RECONNECT_S: Final = 30.0
_STALL_TRIES_S: Final = 5.0
"""How long ``crash-after-re-lease`` keeps trying to stop a worker while it holds leases."""

_servers: RunObjects[ThrowawayServer] = RunObjects("throwaway server", "throwaway_endpoints")


def server_of(run: RunControl) -> ThrowawayServer:
    """The throwaway server behind ``run`` (the scenario's endpoints registered it)."""
    return _servers.of(run)


def throwaway_endpoints(url: str) -> contextlib.AbstractAsyncContextManager[Endpoints]:
    """Endpoints on a throwaway server of ``url``'s kind (the URL's query string is kept).

    Reuses the throwaway server ``url`` names when this process started it.
    """
    kind = PostgresServer if backend_family(url) == "postgres" else RedisServer
    return throwaway_endpoints_of(_servers, url, _own_server(url), lambda: kind().start(),
                                  ThrowawayServer.start)


def _own_server(url: str) -> ThrowawayServer | None:
    parts = urlsplit(url)
    for server in running_servers():
        if parts.port == server.port and parts.hostname in ("127.0.0.1", "localhost"):
            return server
    return None


async def _restart(run: RunControl, server: ThrowawayServer) -> None:
    """Start the killed server again, then wait until the checker's client reaches it."""
    await asyncio.to_thread(server.start)
    run.note(f"{server.name} restarted")
    deadline = time.monotonic() + _RECONNECT_S
    while time.monotonic() < deadline:
        # The first calls after a restart may fail on connections the crash broke.
        with contextlib.suppress(Exception):
            await run.progress()
            return
        await asyncio.sleep(0.05)  # polling the restarted server against a deadline


def kill_points(events: int) -> list[float]:
    """The settled fractions to kill at: one kill per EVENTS_PER_KILL events (at least one),
    spread evenly over 25%-75% (a lone kill at 50%)."""
    kills = max(1, events // EVENTS_PER_KILL)
    if kills == 1:
        return [0.5]
    return [0.25 + 0.5 * i / (kills - 1) for i in range(kills)]


async def _kill_server(run: RunControl) -> None:
    """kill -9 the server at each kill point; each time, down for DOWN_S, then restart."""
    server = server_of(run)
    for fraction in kill_points(run.settings.events):
        if not await run.wait_progress(fraction):
            return
        await asyncio.to_thread(server.kill)
        run.note(f"kill -9 {server.name}")
        await asyncio.sleep(DOWN_S)  # the outage itself
        await _restart(run, server)


async def _crash_after_re_lease(run: RunControl) -> None:
    """Stall a worker past its leases, kill -9 the server right after one is re-leased."""
    server = server_of(run)
    if not await run.wait_progress(0.25):
        return
    stalled = run.workers[0]
    async with _lease_probe(run, stalled) as probe:
        held = await _stall_holding_leases(run, stalled, probe)
        try:
            if held is None:
                run.note(f"{stalled.name} held no lease whenever it was stopped")
            elif await _wait_re_lease(run, probe, held):
                await asyncio.to_thread(server.kill)
                run.note(f"kill -9 {server.name} right after a re-lease")
                await asyncio.sleep(DOWN_S)  # the outage itself
                await _restart(run, server)
            else:
                run.note("no re-lease seen")
        finally:
            if stalled.stopped:
                stalled.cont()
                run.note(f"SIGCONT {stalled.name}")


_Held = list[tuple[int, int, int]]
"""Deliveries (partition, sequence, attempt) a stalled worker held when it was stopped."""


class _PostgresLeases:
    """Reads, in PostgreSQL's deliveries and ranges tables, what one worker of the run's
    group holds."""

    def __init__(self, conn: Any, schema: str, group_id: int, worker: str) -> None:
        self._conn, self._schema, self._group_id, self._worker = conn, schema, group_id, worker

    async def held(self) -> _Held:
        """The deliveries the worker holds leased now."""
        rows = await self._conn.fetch(
            f'SELECT part, seq, attempt FROM "{self._schema}".deliveries '
            "WHERE group_id = $1 AND state = 1 AND consumer_id = $2 "
            f'UNION ALL SELECT r.part, s.seq, r.attempt FROM "{self._schema}".ranges r '
            "CROSS JOIN LATERAL generate_series(r.first_seq, r.last_seq) AS s(seq) "
            "WHERE r.group_id = $1 AND r.pending > 0 AND r.consumer_id = $2 "
            "AND get_bit(r.done, (s.seq - r.first_seq)::integer) = 0",
            self._group_id, self._worker)
        return [(r["part"], r["seq"], r["attempt"]) for r in rows]

    async def re_leased(self, held: _Held) -> bool:
        """Whether another worker leased one of ``held`` again (it may be settled since)."""
        parts, seqs, attempts = (list(column) for column in zip(*held, strict=True))
        return bool(await self._conn.fetchval(
            f'SELECT EXISTS (SELECT 1 FROM "{self._schema}".deliveries d '
            "JOIN unnest($2::int[], $3::bigint[], $4::int[]) AS h(part, seq, attempt) "
            "ON d.part = h.part AND d.seq = h.seq "
            "WHERE d.group_id = $1 AND d.attempt > h.attempt) OR EXISTS (SELECT 1 "
            f'FROM "{self._schema}".ranges r '
            "JOIN unnest($2::int[], $3::bigint[], $4::int[]) AS h(part, seq, attempt) "
            "ON r.part = h.part AND h.seq BETWEEN r.first_seq AND r.last_seq "
            "WHERE r.group_id = $1 AND r.attempt > h.attempt)",
            self._group_id, parts, seqs, attempts))


@contextlib.asynccontextmanager
async def _lease_probe(run: RunControl, worker: WorkerProcess
                       ) -> AsyncIterator[_PostgresLeases | None]:
    """What ``worker`` holds, read in PostgreSQL's tables; None on other backends."""
    if backend_family(run.url) != "postgres":
        yield None
        return
    import asyncpg  # the postgres extra: only runs against PostgreSQL import it

    params = dict(parse_qsl(urlsplit(run.check_url).query))
    schema = params.get("schema", DEFAULT_SCHEMA)
    config = worker.config
    conn = await asyncpg.connect(run.check_url.split("?", 1)[0])
    try:
        group_id = await conn.fetchval(
            f'SELECT g.id FROM "{schema}".groups g JOIN "{schema}".streams s '
            "ON s.id = g.stream_id WHERE s.name = $1 AND g.name = $2",
            config.stream, config.group)
        yield _PostgresLeases(conn, schema, group_id, worker.name)
    finally:
        await conn.close()


async def _stall_holding_leases(run: RunControl, worker: WorkerProcess,
                                probe: _PostgresLeases | None) -> _Held | None:
    """SIGSTOP ``worker`` at a moment it holds leases; what it holds, or None if it never did.

    A worker between fetches holds nothing, and stalling it then would leave nothing
    to re-lease: where the leases can be read (PostgreSQL), it is let go and stopped
    again a moment later until it holds some. Elsewhere it is stopped once.
    """
    deadline = time.monotonic() + min(_STALL_TRIES_S, max(0.0, run.remaining()))
    while True:
        worker.stop()
        run.note(f"SIGSTOP {worker.name}")
        if probe is None:
            return []
        await asyncio.sleep(0.05)  # settles it sent before the signal reach the server
        held = await probe.held()
        if held:
            run.note(f"{worker.name} stopped holding {len(held)} leases")
            return held
        worker.cont()
        if time.monotonic() >= deadline or run.finished.is_set():
            return None
        await asyncio.sleep(random.uniform(0.02, 0.1))  # another moment of its work


async def _wait_re_lease(run: RunControl, probe: _PostgresLeases | None, held: _Held) -> bool:
    """Wait until another worker has leased again one of the deliveries in ``held``.

    PostgreSQL shows it in the deliveries and ranges tables; elsewhere the wait is the lease
    plus a few polls of the live workers.
    """
    lease_s = run.settings.lease_ms / 1000
    if probe is None:
        await run.sleep(lease_s + 0.3)
        return True
    deadline = time.monotonic() + min(max(5 * lease_s, 5.0), run.remaining())
    while time.monotonic() < deadline:
        if await probe.re_leased(held):
            return True
        await asyncio.sleep(0.01)  # polling for the re-lease against a deadline
    return False


SERVER_KILL = register(Scenario(
    "server-kill",
    "kill -9 the server (a throwaway PostgreSQL, or Redis with appendfsync always) once "
    "per 5,000 events (at 50% settled, or spread over 25%-75%); restart it after 0.5 s",
    _kill_server, backends=NETWORKED, endpoints=throwaway_endpoints))
CRASH_AFTER_RE_LEASE = register(Scenario(
    "crash-after-re-lease",
    "SIGSTOP a worker past its lease, kill -9 the server right after another worker "
    "re-leases its work, restart, SIGCONT: the old leases stay fenced",
    _crash_after_re_lease, backends=NETWORKED, endpoints=throwaway_endpoints))
