"""The backend thread: the one connection, the queue of operations, their transactions.

Every operation is ONE hop to the backend thread running a whole transaction.
aiosqlite instead hops to its thread and back for every execute and every
fetch: a fetch of ten statements would cost ten queue round trips and
event-loop wake-ups, and the write lock would stay held across event-loop
turns while unrelated coroutines run, stretching the time other processes
wait on it. Here the transaction runs start to finish in the thread at C
speed, the lock is held only for the work itself, and the event loop sees a
single future per operation.

Operations that queue up while the thread is busy (a Group's next fetch
arriving while the last batch's ack commits) run together in ONE transaction
and one commit (group commit): with synchronous=FULL each commit is a sync of
the log, the dominant cost of a small write. Every caller still resumes only
after the commit holding its work, so a lease change is durable when the call
returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from ..._model._errors import BackendUnavailable
from . import _sql as sql

__all__ = ["Writer"]

T = TypeVar("T")

Outcome = tuple[bool, Any]
"""``(True, value)`` or ``(False, exception)``: how a job ended."""


class _Job(Generic[T]):
    """One operation queued for the backend thread, and the future of its caller."""

    __slots__ = ("call", "future", "loop", "write")

    def __init__(
        self,
        write: bool,
        call: Callable[[sqlite3.Connection], T],
        future: asyncio.Future[T],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.write = write
        self.call = call
        self.future = future
        self.loop = loop

    @property
    def begin(self) -> str:
        """The statement that opens the job's transaction."""
        return sql.BEGIN_WRITE if self.write else sql.BEGIN_READ

    def settle(self, outcome: Outcome) -> None:
        """Runs in the caller's loop: hand the result or the error over, unless the
        caller stopped waiting."""
        if not self.future.done():
            ok, value = outcome
            if ok:
                self.future.set_result(value)
            else:
                self.future.set_exception(value)


def _hand_over(done: list[tuple[_Job[Any], Outcome]]) -> None:
    """Resolve finished jobs: one wake-up of each caller loop for the whole batch
    (each ``call_soon_threadsafe`` writes to the loop's self-pipe)."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job[Any], Outcome]]] = {}
    for item in done:
        by_loop.setdefault(item[0].loop, []).append(item)
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed
            loop.call_soon_threadsafe(_settle_all, items)


def _settle_all(items: list[tuple[_Job[Any], Outcome]]) -> None:
    for job, outcome in items:
        job.settle(outcome)


class Writer:
    """The thread that owns the connection and runs every operation's transaction.

    ``connect`` opens the connection in the thread; ``path`` names the database in
    errors. The thread starts on :meth:`open` or on the first :meth:`run`.
    """

    def __init__(self, connect: Callable[[], sqlite3.Connection], path: str) -> None:
        self._connect = connect
        self._path = path
        self.executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._open_lock = asyncio.Lock()
        # Operations waiting for the thread, and whether a drain of them is queued
        # there; both guarded by ``_pending_lock`` (the loop and the thread touch them).
        self._pending: deque[_Job[Any]] = deque()
        self._draining = False
        self._pending_lock = threading.Lock()

    async def open(self) -> ThreadPoolExecutor:
        """Start the thread and connect in it (once)."""
        async with self._open_lock:
            if self.executor is not None:
                return self.executor
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rheo-sqlite")
            try:
                conn = await asyncio.get_running_loop().run_in_executor(executor, self._connect)
            except BaseException:
                executor.shutdown(wait=False)
                raise
            # Set before any operation is queued: the executor's queue orders the two.
            self._conn = conn
            self.executor = executor
            return executor

    async def close(self) -> None:
        """Close the connection in the thread, then stop the thread."""
        async with self._open_lock:
            executor, self.executor = self.executor, None
            if executor is None:
                return
            try:
                await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
            finally:
                executor.shutdown(wait=True)

    def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    async def run(self, write: bool, call: Callable[[sqlite3.Connection], T]) -> T:
        """Queue ``call`` for the thread; its result once the commit holding it is done.

        ``write`` opens the transaction with ``BEGIN IMMEDIATE`` (the write lock first).
        """
        executor = self.executor
        if executor is None:
            executor = await self.open()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        job = _Job(write, call, future, loop)
        with self._pending_lock:
            self._pending.append(job)
            submit = not self._draining
            self._draining = True
        if submit:
            try:
                executor.submit(self._drain)
            except BaseException as exc:  # the backend was closed meanwhile
                # No drain will come for what queued behind this job: fail it all.
                with self._pending_lock:
                    stranded = [j for j in self._pending if j is not job]
                    self._pending.clear()
                    self._draining = False
                _hand_over([(j, (False, exc)) for j in stranded])
                raise
        return await future

    def _drain(self) -> None:
        """Runs in the thread: every queued operation, in queue order, each batch of
        them in one transaction."""
        while True:
            with self._pending_lock:
                if not self._pending:
                    self._draining = False
                    return
                jobs = list(self._pending)
                self._pending.clear()
            if len(jobs) == 1:
                _hand_over([(jobs[0], self._run_alone(jobs[0]))])
            else:
                _hand_over(self._run_together(jobs))

    def _run_alone(self, job: _Job[Any]) -> Outcome:
        try:
            return True, self._transaction(job.begin, job.call)
        except BaseException as exc:  # handed to the caller
            return False, exc

    def _run_together(self, jobs: list[_Job[Any]]) -> list[tuple[_Job[Any], Outcome]]:
        begin = sql.BEGIN_WRITE if any(j.write for j in jobs) else sql.BEGIN_READ
        try:
            results = self._transaction(begin, lambda conn: [job.call(conn) for job in jobs])
        except BaseException:
            # Nothing of the batch stayed: run each operation in a transaction of
            # its own, so an error reaches only the caller whose operation raised.
            return [(job, self._run_alone(job)) for job in jobs]
        return [(job, (True, result)) for job, result in zip(jobs, results, strict=True)]

    def _transaction(self, begin: str, call: Callable[[sqlite3.Connection], T]) -> T:
        conn = self._conn
        if conn is None:
            raise BackendUnavailable(f"SQLite database {self._path!r} is closed")
        conn.execute(begin)
        try:
            result = call(conn)
            conn.execute(sql.COMMIT)
        except BaseException:
            if conn.in_transaction:
                # The original error says more; SQLite rolls back on its own anyway.
                with contextlib.suppress(sqlite3.Error):
                    conn.execute(sql.ROLLBACK)
            raise
        return result
