"""A synchronous client, for code without an event loop: Django and Flask views,
scripts, worker threads.

``rheo_flow.sync.Rheo`` wraps :class:`rheo_flow.Rheo`: one event loop runs in a
daemon thread of the client's own for the client's lifetime, and each call hands
its coroutine to that loop (``asyncio.run_coroutine_threadsafe``) and waits. No
loop is started per call, and the backend's pool, caches and wake-ups live as
long as the client. Many threads may share one client.

``connection=`` takes the application's synchronous connection inside its
transaction (docs/outbox.md, "Synchronous code"): a ``sqlite3.Connection``, a
psycopg 3 ``Connection``, or a SQLAlchemy ``Session`` or ``Connection`` on
``sqlite://`` or ``postgresql+psycopg://``. The statements on it run in the
calling thread, the one the connection belongs to (sqlite3 refuses any other),
while the loop thread waits for them.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from ._backend import Backend
from ._facade._in_transaction import sync_driver_connection
from ._model._errors import InvalidArgument
from ._model._event import Event, NewEvent
from ._model._lease import Lease
from ._model._settle_results import SettleResult
from ._model._stream import Retention, StreamInfo
from ._rheo import Rheo as AsyncRheo
from ._support._blocking import CallerThread

__all__ = ["Rheo"]

T = TypeVar("T")


class Rheo:
    """A synchronous rheo_flow client over one backend; use it as a context manager,
    or :meth:`open` it and :meth:`close` it.

    ``backend`` and ``max_event_bytes`` are those of :class:`rheo_flow.Rheo`. The
    client runs one event loop in a daemon thread until :meth:`close`; its methods
    block the calling thread until the operation is done. Calling one from a thread
    that runs an event loop raises ``RuntimeError`` (it would block that loop): use
    :class:`rheo_flow.Rheo` there.
    """

    def __init__(self, backend: Backend | str = "memory://", *,
                 max_event_bytes: int | None = None) -> None:
        _refuse_running_loop("Rheo()")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="rheo_flow.sync", daemon=True)
        self._thread.start()
        self._closed = False

        async def build() -> AsyncRheo:
            return AsyncRheo(backend, max_event_bytes=max_event_bytes)

        try:
            self._rheo = self._call("Rheo()", build)
        except BaseException:
            self._stop()
            raise

    @classmethod
    def open(cls, backend: Backend | str = "memory://", *,
             max_event_bytes: int | None = None) -> Self:
        """A client with its backend opened (connections made, schema checked)."""
        client = cls(backend, max_event_bytes=max_event_bytes)
        try:
            client._call("open", client._rheo.open)
        except BaseException:
            client.close()
            raise
        return client

    def __enter__(self) -> Self:
        self._call("with", self._rheo.open)
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Close the backend (what it owns) and stop the loop thread (idempotent)."""
        if self._closed:
            return
        try:
            self._call("close", self._shutdown)
        finally:
            self._closed = True
            self._stop()

    async def _shutdown(self) -> None:
        try:
            await self._rheo.close()
        finally:
            mine = asyncio.current_task()
            left = [task for task in asyncio.all_tasks() if task is not mine]
            for task in left:
                task.cancel()
            await asyncio.gather(*left, return_exceptions=True)
            await self._loop.shutdown_asyncgens()
            await self._loop.shutdown_default_executor()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (the loop thread is then gone)."""
        return self._closed

    @property
    def rheo(self) -> AsyncRheo:
        """The :class:`rheo_flow.Rheo` underneath; its coroutines run only in the client's
        loop (see :meth:`run`)."""
        return self._rheo

    # Operations ----------------------------------------------------------------

    def run(self, operation: Callable[[AsyncRheo], Awaitable[T]]) -> T:
        """Any operation of :class:`rheo_flow.Rheo`, in the client's loop:
        ``client.run(lambda rheo: rheo.fetch("orders", "billing"))``."""
        rheo = self._rheo

        async def call() -> T:
            return await operation(rheo)

        return self._call("run", call)

    def create_stream(self, name: str, *, partitions: int = 1,
                      retention: Retention | None = None) -> StreamInfo:
        """:meth:`rheo_flow.Rheo.create_stream`."""
        return self._call("create_stream", lambda: self._rheo.create_stream(
            name, partitions=partitions, retention=retention))

    def stream_info(self, name: str) -> StreamInfo:
        """:meth:`rheo_flow.Rheo.stream_info`."""
        return self._call("stream_info", lambda: self._rheo.stream_info(name))

    def append(
        self,
        stream: str,
        events: NewEvent | Mapping[str, Any] | Iterable[NewEvent | Mapping[str, Any]],
        *,
        key: str | None = None,
        partition: int | None = None,
        connection: Any = None,
    ) -> list[Event]:
        """:meth:`rheo_flow.Rheo.append`; ``connection``: the application's synchronous
        connection (or SQLAlchemy ``Session``/``Connection``) in its open transaction,
        used in this thread."""
        conn = _sync_connection(connection)
        return self._call("append", lambda: self._rheo.append(
            stream, events, key=key, partition=partition, connection=conn))

    def ack(self, leases: Lease | Iterable[Lease], *, connection: Any = None
            ) -> list[SettleResult]:
        """:meth:`rheo_flow.Rheo.ack`; ``connection`` as for :meth:`append`."""
        conn = _sync_connection(connection)
        return self._call("ack", lambda: self._rheo.ack(leases, connection=conn))

    def _call(self, what: str, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
        """``make()``'s coroutine run in the loop thread; its blocking calls on the
        application's connection come back to this thread while it waits."""
        _refuse_running_loop(what)
        if self._closed:
            raise RuntimeError("this rheo_flow.sync.Rheo is closed")
        caller = CallerThread(self._loop)
        done = asyncio.run_coroutine_threadsafe(caller.run(make()), self._loop)
        return caller.serve(done)


def _refuse_running_loop(what: str) -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        f"rheo_flow.sync.Rheo: {what} called in a thread running an event loop, which it "
        "would block until the operation is done: await rheo_flow.Rheo's operations there, "
        "or call this from another thread (asyncio.to_thread)")


def _sync_connection(connection: Any) -> Any:
    """The driver connection under ``connection`` (unwrapped here, in the thread it
    belongs to); an asyncio connection is refused."""
    if connection is None:
        return None
    conn = sync_driver_connection(connection)
    kind = type(conn)
    asyncio_ext = sys.modules.get("sqlalchemy.ext.asyncio")
    psycopg = sys.modules.get("psycopg")
    if (kind.__module__.partition(".")[0] == "asyncpg"
            or (psycopg is not None and isinstance(conn, psycopg.AsyncConnection))
            or (asyncio_ext is not None and isinstance(
                conn, asyncio_ext.AsyncConnection | asyncio_ext.AsyncSession))):
        raise InvalidArgument(
            "rheo_flow.sync.Rheo takes a synchronous connection (sqlite3, a psycopg "
            "Connection, a SQLAlchemy Session or Connection), got "
            f"{kind.__module__}.{kind.__qualname__}: pass that to rheo_flow.Rheo in async code")
    return conn
