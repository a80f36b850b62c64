"""Blocking calls on an application's synchronous connection (a ``sqlite3.Connection``,
a sync psycopg ``Connection``), made by a backend's coroutine, and the thread that
runs them.

Under the async API the coroutine runs in the application's event loop:
:func:`call_blocking` runs the call right there (SQLite: the connection belongs to
that thread, and the call awaits nothing while it holds the write lock) or in a
worker thread (``in_thread``: a network round trip must not stall the loop;
psycopg's connections serialise their calls with a lock of their own).

Under the synchronous client (:mod:`rheo_flow.sync`) the coroutine runs in the
client's loop thread while the application's thread waits for its result: that
waiting thread runs the blocking calls (:class:`CallerThread`), so a connection
is only ever used in the thread that made it (sqlite3 refuses any other) and
the loop thread never blocks on one application's transaction.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import queue
from collections.abc import Awaitable, Callable, Coroutine
from contextvars import ContextVar
from typing import Any, TypeVar

__all__ = ["CallerThread", "call_blocking"]

T = TypeVar("T")

_Runner = Callable[[Callable[[], Any]], Awaitable[Any]]
_CALLER: ContextVar[_Runner | None] = ContextVar("rheo_flow_caller_thread", default=None)


async def call_blocking(fn: Callable[[], T], *, in_thread: bool) -> T:
    """``fn()`` (blocking calls on the application's connection), in the thread that
    waits for this coroutine when there is one (:class:`CallerThread`), else in a
    worker thread (``in_thread``) or right here."""
    runner = _CALLER.get()
    if runner is not None:
        result: T = await runner(fn)
        return result
    if in_thread:
        return await asyncio.to_thread(fn)
    return fn()


_DONE = None


class CallerThread:
    """One call of the synchronous client: its coroutine runs in the client's loop,
    and its blocking calls (:func:`call_blocking`) come back to the calling thread,
    which :meth:`serve` keeps busy with them until the coroutine is done."""

    __slots__ = ("_loop", "_serving", "_work")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._work: queue.SimpleQueue[tuple[Callable[[], Any], asyncio.Future[Any]] | None] = (
            queue.SimpleQueue())
        self._serving = True

    async def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """``coro``, its blocking calls sent to the calling thread (run it in the loop)."""
        _CALLER.set(self._call)
        return await coro

    async def _call(self, fn: Callable[[], Any]) -> Any:
        if not self._serving:  # a task the call left behind: the caller has gone
            return await asyncio.to_thread(fn)
        future = self._loop.create_future()
        self._work.put((fn, future))
        return await future

    def serve(self, done: concurrent.futures.Future[T]) -> T:
        """Run the blocking calls sent here until ``done`` (the call's future) is done;
        its result. Interrupted (``KeyboardInterrupt``), the call is cancelled."""
        done.add_done_callback(lambda _: self._work.put(_DONE))
        try:
            while (item := self._work.get()) is not _DONE:
                fn, future = item
                if future.done():  # cancelled while queued
                    continue
                try:
                    result = fn()
                except Exception as exc:
                    self._loop.call_soon_threadsafe(_settle, future, None, exc)
                else:
                    self._loop.call_soon_threadsafe(_settle, future, result, None)
        except BaseException:
            done.cancel()
            raise
        finally:
            self._serving = False
        return done.result()


def _settle(future: asyncio.Future[Any], result: Any, exc: Exception | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
