"""Run the conformance kit against every shipped backend and write the matrix.

Select backends with ``RHEO_BACKENDS`` (comma list; default: every shipped
backend whose module exists). Server backends read their URL from
``RHEO_POSTGRES_URL``, ``RHEO_REDIS_URL`` and ``RHEO_MONGO_URL`` (defaults: the
local servers). A backend whose server cannot be reached is skipped with a
message naming its variable, and fails the run when ``CI=true``.

Each run merges its results into ``docs/conformance-matrix.md`` (override the
path with ``RHEO_MATRIX_PATH``): only the columns of the backends that ran
change.

Adding a backend: add an entry to :data:`BACKENDS` whose ``build`` returns its
:class:`~rheo_flow.testing.BackendHarness` (the generic
:func:`~rheo_flow.testing.url_harness` suits a backend built from a URL;
a backend with its own harness factory, e.g. one taking an injectable clock or
a dedicated schema, plugs that in instead).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from rheo_flow import Rheo
from rheo_flow._urls import redact_url
from rheo_flow.testing import BackendHarness, memory_harness, sqlite_harness, url_harness
from rheo_flow.testing.plugin import MatrixRecorder

ROOT = Path(__file__).resolve().parent.parent
MATRIX_PATH = Path(os.environ.get("RHEO_MATRIX_PATH") or ROOT / "docs" / "conformance-matrix.md")
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
        "rheo_flow._backends.postgres", lambda ctx: url_harness("postgres", ctx.url),
        "RHEO_POSTGRES_URL", "postgresql://127.0.0.1:5432/test",
    ),
    "redis": BackendEntry(
        "rheo_flow._backends.redis", lambda ctx: url_harness("redis", ctx.url),
        "RHEO_REDIS_URL", "redis://127.0.0.1:6379/0",
    ),
    "mongo": BackendEntry(
        "rheo_flow._backends.mongo", lambda ctx: url_harness("mongo", ctx.url),
        "RHEO_MONGO_URL", "mongodb://127.0.0.1:27017/rheo_test?serverSelectionTimeoutMS=3000",
    ),
}


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


def pytest_configure(config: pytest.Config) -> None:
    """Record every conformance result into the matrix."""
    if not config.pluginmanager.has_plugin("rheo-matrix-recorder"):
        config.pluginmanager.register(MatrixRecorder(MATRIX_PATH), "rheo-matrix-recorder")
