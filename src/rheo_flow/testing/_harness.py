"""Harnesses: how the conformance kit builds a fresh backend and makes its time pass."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from .._backend import Backend
from .._support._clock import ManualClock, system_clock

__all__ = [
    "AppTransaction",
    "BackendFactory",
    "BackendHarness",
    "TransactionFactory",
    "memory_harness",
    "sqlite_harness",
    "url_harness",
]

BackendFactory = Callable[[], AbstractAsyncContextManager[Backend]]
"""Builds a fresh backend for one test (opened or not: the kit opens and closes it)."""

PeerFactory = Callable[[Backend], AbstractAsyncContextManager[Backend]]
"""Builds a second backend object over the same store as the given one."""

Advance = Callable[[Backend, int], Awaitable[None]]
"""Makes ``ms`` milliseconds of the backend's time pass."""

Now = Callable[[Backend], Awaitable[int]]
"""The backend's current time, epoch milliseconds."""


@dataclass(frozen=True, slots=True)
class AppTransaction:
    """A transaction of the application's own, open on ``connection`` (what a backend
    declaring ``in_transaction`` writes in), and how to end it."""

    connection: object
    commit: Callable[[], Awaitable[None]]
    rollback: Callable[[], Awaitable[None]]


TransactionFactory = Callable[[Backend], AbstractAsyncContextManager[AppTransaction]]
"""Opens a connection of the application's own to the given backend's database and a
transaction on it (the kit ends the transaction; the factory closes the connection)."""


async def _system_now(backend: Backend) -> int:
    return system_clock()


@dataclass(frozen=True, slots=True, kw_only=True)
class BackendHarness:
    """How the kit gets a fresh backend for each test and how it makes time pass.

    ``factory`` is called once per test (and once per stateful example); it
    returns an async context manager yielding a backend over an empty or
    shared store (every test uses unique stream names, so a shared server is
    fine). The kit opens the backend through :class:`~rheo_flow.Rheo` and
    closes it before leaving the context manager.

    ``advance`` makes backend time pass; leave it ``None`` for a backend on a
    real clock (the kit then waits until ``now`` has moved). ``now`` reads the
    backend's clock (default: the system clock; a server-clock backend may
    query its server). ``exact_time`` says that time only moves through
    ``advance`` (a :class:`~rheo_flow.ManualClock`), which lets the kit check
    timing to the millisecond. ``short_ms`` is the lease or delay the kit lets
    expire; ``clock_margin_ms`` the skew tolerated between ``now`` and the clock
    the backend stamps leases with.

    ``peer`` (optional) builds a second backend object over the same store as
    a given one, as another process would; cases about competing instances
    skip visibly without it.

    ``apart`` (optional) builds a backend over a store of its own, apart from
    every store ``factory`` builds: a stream of the same name there is another
    stream. Cases about stores that must share nothing (wake-ups, caches) use
    one beside the case's backend, and skip visibly without it.

    ``transaction`` (optional) opens a transaction of the application's own on
    the backend's database: the cases of ``in_transaction`` (docs/outbox.md) write
    in it, and skip visibly without it.
    """

    name: str
    factory: BackendFactory
    advance: Advance | None = None
    now: Now | None = None
    peer: PeerFactory | None = None
    apart: BackendFactory | None = None
    transaction: TransactionFactory | None = None
    exact_time: bool = False
    short_ms: int = 150
    clock_margin_ms: int = 50

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise ValueError("a harness needs a non-empty name")
        if self.short_ms < 10:
            raise ValueError("short_ms must be at least 10 (the smallest lease)")

    async def current_time(self, backend: Backend) -> int:
        """The backend's time in epoch milliseconds."""
        return await (self.now or _system_now)(backend)

    async def advance_time(self, backend: Backend, ms: int) -> None:
        """Make at least ``ms`` milliseconds of backend time pass."""
        if ms <= 0:
            return
        if self.advance is not None:
            await self.advance(backend, ms)
            return
        now = self.now or _system_now
        target = await now(backend) + ms
        while True:
            current = await now(backend)
            if current >= target:
                return
            # Waiting for a clock to reach a value is the condition itself.
            await asyncio.sleep(min(0.05, (target - current) / 1000))

    @classmethod
    def with_manual_clock(
        cls,
        name: str,
        build: Callable[[ManualClock], Backend],
        *,
        peer: Callable[[Backend, ManualClock], Backend] | None = None,
        short_ms: int = 1_000,
    ) -> BackendHarness:
        """A harness for a backend that takes an injectable clock.

        ``build(clock)`` returns a new backend using ``clock``; ``peer(backend,
        clock)`` (optional) a second backend over the same store. Time then
        only moves when the kit advances the :class:`~rheo_flow.ManualClock`, so
        expiry tests are instant and exact.
        """
        clocks: weakref.WeakKeyDictionary[Backend, ManualClock] = weakref.WeakKeyDictionary()

        def clock_of(backend: Backend) -> ManualClock:
            try:
                return clocks[backend]
            except KeyError:
                raise ValueError(f"backend {backend!r} was not built by harness {name!r}") from None

        @asynccontextmanager
        async def factory() -> AsyncIterator[Backend]:
            clock = ManualClock()
            backend = build(clock)
            clocks[backend] = clock
            yield backend

        async def advance(backend: Backend, ms: int) -> None:
            clock_of(backend).advance(ms)

        async def now(backend: Backend) -> int:
            return clock_of(backend)()

        peer_factory: PeerFactory | None = None
        if peer is not None:
            make_peer = peer

            @asynccontextmanager
            async def peer_factory_impl(backend: Backend) -> AsyncIterator[Backend]:
                clock = clock_of(backend)
                other = make_peer(backend, clock)
                clocks[other] = clock
                yield other

            peer_factory = peer_factory_impl

        return cls(
            name=name,
            factory=factory,
            advance=advance,
            now=now,
            peer=peer_factory,
            exact_time=True,
            short_ms=short_ms,
            clock_margin_ms=0,
        )


def memory_harness() -> BackendHarness:
    """The in-memory backend on a :class:`~rheo_flow.ManualClock`.

    Its peer is the same backend object: one process, one store.
    """
    from .._backends.memory import MemoryBackend

    harness = BackendHarness.with_manual_clock(
        "memory",
        lambda clock: MemoryBackend(clock=clock),
        peer=lambda backend, clock: backend,
    )
    return _stores_apart(harness)


def _stores_apart(harness: BackendHarness) -> BackendHarness:
    """``harness`` whose every factory call makes a store of its own, as its ``apart``."""
    return dataclasses.replace(harness, apart=harness.factory)


def sqlite_harness(directory: str | Path) -> BackendHarness:
    """The SQLite backend on a :class:`~rheo_flow.ManualClock`, one new file per test.

    ``directory`` holds the database files (pytest's ``tmp_path`` is ideal);
    a peer opens a second backend on the same file.
    """
    from .._backends.sqlite import SQLiteBackend

    base = Path(directory)
    paths: weakref.WeakKeyDictionary[Backend, str] = weakref.WeakKeyDictionary()

    def build(clock: ManualClock) -> Backend:
        path = str(base / f"rheo-{uuid.uuid4().hex[:12]}.db")
        backend = SQLiteBackend(path, clock=clock)
        paths[backend] = path
        return backend

    def peer(backend: Backend, clock: ManualClock) -> Backend:
        other = SQLiteBackend(paths[backend], clock=clock)
        paths[other] = paths[backend]
        return other

    @asynccontextmanager
    async def transaction(backend: Backend) -> AsyncIterator[AppTransaction]:
        import sqlite3

        conn = sqlite3.connect(paths[backend], isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")

            async def commit() -> None:
                conn.execute("COMMIT")

            async def rollback() -> None:
                conn.execute("ROLLBACK")

            yield AppTransaction(conn, commit, rollback)
        finally:
            conn.close()

    # Every backend it builds has a file of its own: a store apart.
    harness = BackendHarness.with_manual_clock("sqlite", build, peer=peer)
    return dataclasses.replace(_stores_apart(harness), transaction=transaction)


def url_harness(name: str, url: str, *, short_ms: int = 150, apart_url: str | None = None
                ) -> BackendHarness:
    """A backend built from a URL (``postgresql://``, ``redis://``, ...) on its real clock.

    Every test builds a new backend object on the same server; the kit's unique
    stream names keep tests apart. A peer is another backend from the same URL;
    ``apart_url`` (optional) names a store apart from ``url``'s (another
    database, schema or key prefix) for the cases about stores sharing nothing.
    """
    from .._backends._urls import backend_from_url

    @asynccontextmanager
    async def factory() -> AsyncIterator[Backend]:
        yield backend_from_url(url)

    @asynccontextmanager
    async def peer(backend: Backend) -> AsyncIterator[Backend]:
        yield backend_from_url(url)

    apart: BackendFactory | None = None
    if apart_url is not None:
        other_url = apart_url

        @asynccontextmanager
        async def apart_factory() -> AsyncIterator[Backend]:
            yield backend_from_url(other_url)

        apart = apart_factory

    return BackendHarness(name=name, factory=factory, peer=peer, apart=apart, short_ms=short_ms)
