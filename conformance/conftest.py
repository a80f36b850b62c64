"""Run the conformance kit against every shipped backend and write the matrix.

Select backends with ``RHEO_BACKENDS`` (comma list; default: every shipped
backend whose module exists). Server backends read their URL from
``RHEO_POSTGRES_URL``, ``RHEO_REDIS_URL`` and ``RHEO_MONGO_URL`` (defaults: the
local servers); the ``pgbouncer`` column is the PostgreSQL backend through
PgBouncer in transaction pooling, at ``RHEO_PGBOUNCER_URL`` (default: the
``.ci/pgbouncer.sh`` one, ``?pooler=transaction``), with wake-ups over a
``listen_url`` to the server itself (``RHEO_POSTGRES_URL``) unless the URL names
one. A backend whose server cannot be reached is skipped with a message naming
its variable, and fails the run when ``CI=true``.

With ``RHEO_MATRIX_PATH`` set, a run merges its results into the matrix at
that path (``RHEO_MATRIX_PATH=docs/conformance-matrix.md pytest conformance``
refreshes the published one): only the columns of the backends that ran
change. Without it nothing is written, so running the tests never changes a
tracked file.

Adding a backend: add an entry to :data:`BACKENDS` whose ``build`` returns its
:class:`~rheo_flow.testing.BackendHarness` (the generic
:func:`~rheo_flow.testing.url_harness` suits a backend built from a URL;
a backend with its own harness factory, e.g. one taking an injectable clock or
a dedicated schema, plugs that in instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from rheo_flow import Rheo
from rheo_flow._backends._urls import redact_url
from rheo_flow.testing import (
    AppTransaction,
    BackendHarness,
    TransactionFactory,
    memory_harness,
    sqlite_harness,
    url_harness,
)
from rheo_flow.testing.plugin import MatrixRecorder

ROOT = Path(__file__).resolve().parent.parent
MATRIX_PATH = Path(os.environ["RHEO_MATRIX_PATH"]) if os.environ.get("RHEO_MATRIX_PATH") else None
"""Where the run merges its results (``RHEO_MATRIX_PATH``); None: nowhere."""
PROBE_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class HarnessContext:
    """What a harness factory may use: a per-test directory and the server URL."""

    tmp_path: Path
    url: str


@dataclass(frozen=True, slots=True)
class BackendEntry:
    """How the conformance run builds one shipped backend."""

    module: str
    """The backend's module; the backend counts as shipped when it is importable."""
    build: Callable[[HarnessContext], BackendHarness]
    url_env: str | None = None
    """Environment variable holding the server URL (server backends only)."""
    default_url: str = ""


# The registry: backend name -> how to build its harness. Hook point for new backends.
BACKENDS: dict[str, BackendEntry] = {
    "memory": BackendEntry("rheo_flow._backends.memory", lambda ctx: memory_harness()),
    "sqlite": BackendEntry("rheo_flow._backends.sqlite", lambda ctx: sqlite_harness(ctx.tmp_path)),
    "postgres": BackendEntry(
        "rheo_flow._backends.postgres", lambda ctx: _postgres_harness(ctx.url),
        "RHEO_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test",
    ),
    "pgbouncer": BackendEntry(
        "rheo_flow._backends.postgres", lambda ctx: _pgbouncer_harness(ctx.url),
        "RHEO_PGBOUNCER_URL", "postgresql://postgres@127.0.0.1:6432/test?pooler=transaction",
    ),
    "redis": BackendEntry(
        "rheo_flow._backends.redis", lambda ctx: _redis_harness(ctx.url),
        "RHEO_REDIS_URL", "redis://127.0.0.1:6379/0",
    ),
    # The same RedisBackend on a Redis Cluster (a RedisCluster client, partitions
    # spread over the primaries).
    "redis-cluster": BackendEntry(
        "rheo_flow._backends.redis", lambda ctx: _redis_harness(ctx.url, "redis-cluster"),
        "RHEO_REDIS_CLUSTER_URL", "redis+cluster://127.0.0.1:7000",
    ),
    # The same MongoBackend around the two client types it accepts: PyMongo's
    # AsyncMongoClient (built from the URL) and a host's Motor client.
    "mongo": BackendEntry(
        "rheo_flow._backends.mongo", lambda ctx: _mongo_harness("mongo", ctx.url),
        "RHEO_MONGO_URL", "mongodb://127.0.0.1:37017/rheo_test?serverSelectionTimeoutMS=3000",
    ),
    "mongo-motor": BackendEntry(
        "rheo_flow._backends.mongo", lambda ctx: _mongo_harness("mongo-motor", ctx.url),
        "RHEO_MONGO_URL", "mongodb://127.0.0.1:37017/rheo_test?serverSelectionTimeoutMS=3000",
    ),
}


def _mongo_harness(name: str, url: str) -> BackendHarness:
    """MongoDB on a manual clock (its leases use the client's clock), one prefix per test.

    Every test gets its own collections (dropped afterwards), which keeps them small.
    ``mongo-motor`` passes a Motor client as a host-owned client.
    """
    import dataclasses
    import uuid
    import weakref
    from collections.abc import AsyncIterator

    from rheo_flow import ManualClock
    from rheo_flow.backends import Backend, MongoBackend

    clients: weakref.WeakKeyDictionary[Backend, Any] = weakref.WeakKeyDictionary()

    # The wire emulator CI runs answers one client at a time, slowly when the machine
    # is busy: the cases check what the backend does, not how fast, so a call may take
    # longer than the default 10 s before it is given up on.
    timeout_ms = 60_000

    def build(clock: ManualClock, prefix: str | None = None) -> Backend:
        prefix = prefix or f"c{uuid.uuid4().hex[:10]}_"
        if name != "mongo-motor":
            return MongoBackend.from_url(f"{url}{'&' if '?' in url else '?'}"
                                         f"collection_prefix={prefix}&timeout_ms={timeout_ms}",
                                         clock=clock)
        from motor.motor_asyncio import AsyncIOMotorClient

        client = AsyncIOMotorClient(url)
        backend = MongoBackend(client=client, collection_prefix=prefix, clock=clock,
                               timeout_ms=timeout_ms)
        clients[backend] = client
        return backend

    def peer(backend: Backend, clock: ManualClock) -> Backend:
        assert isinstance(backend, MongoBackend)
        return build(clock, backend.collection_prefix)

    base = BackendHarness.with_manual_clock(name, build, peer=peer)
    assert base.peer is not None
    base_peer = base.peer

    async def release(backend: Backend) -> None:
        await backend.close()
        client = clients.pop(backend, None)
        if client is not None:
            client.close()

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[Backend]:
        async with base.factory() as backend:
            assert isinstance(backend, MongoBackend)
            # Capabilities (push wake-ups) are known from open() on.
            await backend.open()
            try:
                yield backend
            finally:
                with contextlib.suppress(Exception):  # unreachable server: nothing to drop
                    await backend.drop_all()
                await release(backend)

    @contextlib.asynccontextmanager
    async def peer_factory(backend: Backend) -> AsyncIterator[Backend]:
        async with base_peer(backend) as other:
            try:
                yield other
            finally:
                await release(other)

    # Every factory call makes collections of their own: a store apart.
    return dataclasses.replace(base, factory=factory, peer=peer_factory, apart=factory)


_PG_SCHEMA = f"rheo_conformance_{os.getpid()}"
"""The PostgreSQL run's own schema, dropped when the session ends."""


_PGBOUNCER_SCHEMA = f"rheo_conformance_pgbouncer_{os.getpid()}"
"""The PgBouncer run's own schema (apart from the direct run's), dropped when the session ends."""

_APART = "_apart"
"""The suffix of each run's second schema: the store apart of the cases that need one."""


def _postgres_harness(url: str) -> BackendHarness:
    separator = "&" if "?" in url else "?"
    harness = url_harness("postgres", f"{url}{separator}schema={_PG_SCHEMA}",
                          apart_url=f"{url}{separator}schema={_PG_SCHEMA}{_APART}")
    return dataclasses.replace(harness, transaction=_asyncpg_transaction(url))


def _asyncpg_transaction(url: str, **options: Any) -> TransactionFactory:
    """The application's own asyncpg connection to ``url`` (the server's URL, without
    rheo_flow's options; ``options`` go to ``asyncpg.connect``), in a transaction the
    case ends."""
    from collections.abc import AsyncIterator

    import asyncpg

    @contextlib.asynccontextmanager
    async def transaction(backend: object) -> AsyncIterator[AppTransaction]:
        conn = await asyncpg.connect(url, **options)
        try:
            tx = conn.transaction()
            await tx.start()
            yield AppTransaction(conn, tx.commit, tx.rollback)
        finally:
            await conn.close()

    return transaction


def _direct_postgres_url() -> str:
    """The PostgreSQL server itself (``RHEO_POSTGRES_URL``), behind the PgBouncer column."""
    return os.environ.get("RHEO_POSTGRES_URL") or BACKENDS["postgres"].default_url


def _pgbouncer_harness(url: str) -> BackendHarness:
    """PostgreSQL through PgBouncer; LISTEN over a direct ``listen_url`` unless one is named."""
    from urllib.parse import quote

    base = url
    url = f"{base}{'&' if '?' in base else '?'}schema={_PGBOUNCER_SCHEMA}"
    apart = f"{url}{_APART}"
    if "listen_url=" not in url:
        listen = f"&listen_url={quote(_direct_postgres_url(), safe='')}"
        url, apart = url + listen, apart + listen
    harness = url_harness("pgbouncer", url, apart_url=apart)
    # The application's transaction through the same PgBouncer, as an application in
    # transaction pooling opens it: asyncpg's statement cache off (its prepared
    # statements would outlive the server connection the pooler lends).
    return dataclasses.replace(harness, transaction=_asyncpg_transaction(
        _without_rheo_options(base), statement_cache_size=0))


def _without_rheo_options(url: str) -> str:
    """``url`` without the query options rheo_flow reads (``pooler=``, ``schema=``, ...),
    which asyncpg would refuse."""
    from rheo_flow._backends.postgres._config import split_url

    return split_url(url)[0]


def _redis_harness(url: str, name: str = "redis") -> BackendHarness:
    """Redis on its server clock, each test under a fresh key prefix deleted afterwards."""
    import uuid
    from collections.abc import AsyncIterator

    from rheo_flow.backends import RedisBackend

    @contextlib.asynccontextmanager
    async def factory() -> AsyncIterator[RedisBackend]:
        prefix = f"rheo-conformance-{uuid.uuid4().hex[:12]}"
        try:
            yield RedisBackend.from_url(url, prefix=prefix)
        finally:
            cleaner = RedisBackend.from_url(url, prefix=prefix)
            with contextlib.suppress(Exception):  # unreachable server: nothing was written
                await cleaner.drop_all()
            await cleaner.close()

    @contextlib.asynccontextmanager
    async def peer(backend: object) -> AsyncIterator[RedisBackend]:
        assert isinstance(backend, RedisBackend)
        yield RedisBackend.from_url(url, prefix=backend.prefix)

    async def now(backend: object) -> int:
        assert isinstance(backend, RedisBackend)
        return await backend.server_time_ms()

    # Every factory call makes a key prefix of its own: a store apart.
    return BackendHarness(name=name, factory=factory, peer=peer, apart=factory, now=now)


@pytest.fixture(scope="session", autouse=True)
def _drop_postgres_schema() -> Iterator[None]:
    """Remove the PostgreSQL runs' schemas (if the run made them) after the session.

    Over a direct connection (``RHEO_POSTGRES_URL``): the PgBouncer column's schema
    lives on the server behind it.
    """
    yield
    schemas = [schema + suffix for name, schema in (("postgres", _PG_SCHEMA),
                                                    ("pgbouncer", _PGBOUNCER_SCHEMA))
               if name in SELECTED for suffix in ("", _APART)]
    if not schemas or not _shipped("postgres"):
        return

    async def drop() -> None:
        import asyncpg

        conn = await asyncpg.connect(_direct_postgres_url())
        try:
            for schema in schemas:
                await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()

    with contextlib.suppress(Exception):  # unreachable server: nothing was created
        asyncio.run(asyncio.wait_for(drop(), PROBE_TIMEOUT_S))


def _shipped(name: str) -> bool:
    try:
        return importlib.util.find_spec(BACKENDS[name].module) is not None
    except ImportError:
        return False


def selected_backends() -> list[str]:
    """Backends named by ``RHEO_BACKENDS``, or every shipped one."""
    raw = os.environ.get("RHEO_BACKENDS", "").strip()
    if not raw:
        return [name for name in BACKENDS if _shipped(name)]
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise pytest.UsageError(
            f"RHEO_BACKENDS names unknown backends {unknown}; known: {', '.join(BACKENDS)}"
        )
    return list(dict.fromkeys(names))


SELECTED = selected_backends()
_probes: dict[str, str | None] = {}


def _unavailable(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message} (CI=true: an unavailable backend fails the run)")
    pytest.skip(message)


async def _probe(harness: BackendHarness) -> None:
    async with harness.factory() as backend, Rheo(backend) as rheo:
        await asyncio.wait_for(rheo.streams(), PROBE_TIMEOUT_S)


def _redact(text: str, url: str) -> str:
    """``text`` without the URL's password (drivers may echo the DSN in errors)."""
    password = urlsplit(url).password
    text = text.replace(url, redact_url(url))
    return text.replace(password, "***") if password else text


def _reachable(name: str, harness: BackendHarness, entry: BackendEntry, url: str) -> str | None:
    """None when the server answers, else why not (cached per backend for the session)."""
    if name not in _probes:
        try:
            asyncio.run(asyncio.wait_for(_probe(harness), PROBE_TIMEOUT_S))
            _probes[name] = None
        except Exception as exc:
            error = _redact(f"{type(exc).__name__}: {exc}", url)
            _probes[name] = (
                f"{name} server at {redact_url(url)} is unreachable ({error}); "
                f"set {entry.url_env} to a reachable server"
            )
    return _probes[name]


@pytest.fixture(params=SELECTED, ids=SELECTED)
def rheo_harness(request: pytest.FixtureRequest, tmp_path: Path) -> BackendHarness:
    """The harness of the backend this test runs against."""
    name: str = request.param
    entry = BACKENDS[name]
    if not _shipped(name):
        _unavailable(f"backend {name!r} is not in this version ({entry.module} is missing)")
    url = (os.environ.get(entry.url_env) or entry.default_url) if entry.url_env else ""
    harness = entry.build(HarnessContext(tmp_path=tmp_path, url=url))
    if entry.url_env is not None:
        problem = _reachable(name, harness, entry, url)
        if problem is not None:
            _unavailable(problem)
    return harness


COLUMNS_BY_FILE: dict[str, frozenset[str]] = {
    "test_conformance_mongo.py": frozenset({"mongo"}),
    "test_conformance_motor.py": frozenset({"mongo-motor"}),
    "test_conformance_postgres.py": frozenset({"postgres", "pgbouncer"}),
}
"""The columns a test file runs; ``test_conformance.py`` runs every other one. Four
files let ``--dist loadfile`` spread the columns over the workers (the MongoDB
ones, against the CI's emulator, are the slowest: each has a file of its own)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    claimed = frozenset().union(*COLUMNS_BY_FILE.values())
    keep, drop = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        column = callspec.params.get("rheo_harness") if callspec is not None else None
        mine = COLUMNS_BY_FILE.get(item.path.name)
        if column is None or (column in mine if mine is not None else column not in claimed):
            keep.append(item)
        else:
            drop.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_configure(config: pytest.Config) -> None:
    """Record every conformance result into the matrix, when a path is given."""
    if MATRIX_PATH is not None and not config.pluginmanager.has_plugin("rheo-matrix-recorder"):
        config.pluginmanager.register(MatrixRecorder(MATRIX_PATH), "rheo-matrix-recorder")
