"""A translated backend error keeps the driver's exception as its cause, masked where it
may hold a secret (rheo_flow._backends._guard).

SQLite's errors (a local file) and encoding errors are kept as they are; any other
driver exception may quote the server's URL with its password, so the cause is a
:class:`MaskedDriverError` copy of its chain with the backend's secrets masked.
"""

from __future__ import annotations

import asyncio
import sqlite3
import traceback
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from rheo_flow import BackendError, BackendUnavailable, NewEvent, OutcomeUnknown, Rheo
from rheo_flow._backends._guard import MaskedDriverError, guard_operations, masked_cause
from rheo_flow._backends._urls import backend_from_url, scrub_secrets
from rheo_flow._model._settle_results import SettleKind
from rheo_flow.backends import SQLiteBackend

SECRET = "s3cret-pw"
URL = f"postgresql://app:{SECRET}@db.example:5432/app"


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception a traceback of it shows."""
    out: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in out:
        out.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__)
    return out


def _shown(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


@guard_operations(tracks_sending=False)
class _Driven:
    """A guarded backend whose operations raise what a test gives them."""

    _timeout_ms = 50
    _deadline_grace_ms = 0

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        return SettleKind.BACKEND_UNAVAILABLE if isinstance(exc, ConnectionError) else None

    def _error_prefix(self) -> str:
        return "Driven at db.example"

    def _scrub(self, text: str) -> str:
        return scrub_secrets(text, URL)

    async def stream_info(self, stream: str) -> Any:
        if self.error is None:
            await asyncio.Event().wait()  # never answers: the deadline ends it
        raise self.error

    async def append(self, stream: str, records: Any) -> Any:
        return await self.stream_info(stream)


def _driver_error() -> ConnectionError:
    """A driver error quoting the URL, raised while handling one that quotes the password."""
    try:
        try:
            raise OSError(f"auth failed: password={SECRET}")
        except OSError as inner:
            raise ConnectionError(f"cannot reach {URL}") from inner
    except ConnectionError as exc:
        return exc


async def test_a_driver_error_that_may_hold_a_secret_becomes_a_masked_cause() -> None:
    with pytest.raises(BackendUnavailable) as raised:
        await _Driven(_driver_error()).stream_info("s")
    error = raised.value
    cause = error.__cause__
    assert isinstance(cause, MaskedDriverError)
    assert cause.driver_type == "builtins.ConnectionError"
    assert str(cause) == "builtins.ConnectionError: cannot reach postgresql://app:***@db.example:5432/app"
    inner = cause.__cause__
    assert isinstance(inner, MaskedDriverError)
    assert str(inner) == "builtins.OSError: auth failed: password=***"
    assert inner.__traceback__ is None  # the original frames may hold the password
    assert SECRET not in _shown(error)
    assert "cannot reach postgresql://app:***@db.example" in _shown(error)


async def test_an_encoding_error_is_kept_as_it_is_even_inside_a_masked_chain() -> None:
    unicode = UnicodeEncodeError("utf-8", "\ud800", 0, 1, "surrogates not allowed")
    with pytest.raises(BackendError) as raised:
        await _Driven(unicode).append("s", [])
    assert raised.value.__cause__ is unicode
    wrapped = ValueError(f"encoding for {URL}")
    wrapped.__cause__ = unicode
    masked = masked_cause(wrapped, lambda text: scrub_secrets(text, URL))
    assert isinstance(masked, MaskedDriverError)
    assert masked.__cause__ is unicode
    assert SECRET not in str(masked)


def test_a_chain_that_loops_is_copied_a_bounded_number_of_links() -> None:
    first, second = RuntimeError(URL), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    links = _chain(masked_cause(first, lambda text: text.replace(SECRET, "***")))
    assert 2 <= len(links) <= 16
    assert all(SECRET not in str(link) for link in links)


async def test_the_deadline_keeps_its_timeout_as_the_cause() -> None:
    with pytest.raises(OutcomeUnknown) as raised:
        await _Driven().append("s", [])
    assert isinstance(raised.value.__cause__, TimeoutError)
    with pytest.raises(BackendUnavailable) as unavailable:
        await _Driven().stream_info("s")
    assert isinstance(unavailable.value.__cause__, TimeoutError)


@pytest.fixture
async def locked(tmp_path: Path) -> AsyncIterator[tuple[Rheo, sqlite3.Connection]]:
    """An SQLite store that fails at once when locked, and a connection holding its lock."""
    path = tmp_path / "locked.db"
    async with Rheo(SQLiteBackend(path, busy_timeout_ms=0)) as rheo:
        await rheo.create_stream("s")
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        try:
            yield rheo, other
        finally:
            other.execute("ROLLBACK")
            other.close()


async def test_an_sqlite_failure_has_the_drivers_error_as_its_cause(
        locked: tuple[Rheo, sqlite3.Connection]) -> None:
    rheo, _ = locked
    with pytest.raises(BackendError) as raised:
        await rheo.append("s", [NewEvent("t")])
    cause = raised.value.__cause__
    assert type(cause) is sqlite3.OperationalError
    assert str(cause) == "database is locked"
    assert "database is locked" in str(raised.value)


def _refusing_url(url: str) -> str:
    """``url`` with user ``app``, the password ``SECRET`` and a port where nothing listens."""
    scheme, rest = url.split("://", 1)
    path = rest.split("/", 1)[1] if "/" in rest else ""
    return f"{scheme}://app:{SECRET}@127.0.0.1:1/{path}"


@pytest.mark.parametrize("kind", ["postgres", "redis", "mongo"])
async def test_a_connection_failure_never_shows_the_password_in_its_chain(
        kind: str, request: pytest.FixtureRequest) -> None:
    base: str = request.getfixturevalue(f"{kind}_url")
    url = _refusing_url(base)
    url += ("&" if "?" in url else "?") + "timeout_ms=1000"
    backend = backend_from_url(url)
    try:
        with pytest.raises(BackendUnavailable) as raised:
            async with Rheo(backend) as rheo:
                await rheo.append("s", [NewEvent("t")])
    finally:
        await backend.close()
    shown = _shown(raised.value)
    assert SECRET not in shown
    assert all(SECRET not in repr(link) for link in _chain(raised.value))
    assert isinstance(raised.value.__cause__, MaskedDriverError)
    assert "Connect call failed" in shown


async def test_the_postgres_sinks_connection_failure_keeps_a_masked_cause(
        postgres_url: str) -> None:
    from rheo_flow.sinks import PostgresSink

    sink = PostgresSink(url=_refusing_url(postgres_url), table="never_made")
    with pytest.raises(BackendUnavailable) as raised:
        await sink.open()
    cause = raised.value.__cause__
    assert isinstance(cause, MaskedDriverError)
    assert SECRET not in _shown(raised.value)
    assert all(SECRET not in repr(link) for link in _chain(raised.value))
