"""One lifecycle for every runtime: its states, the tasks it owns, and its stop.

Every runtime (:class:`~rheo_flow.Producer`, :class:`~rheo_flow.Group`,
:class:`~rheo_flow.Pipeline`, and the worker through them) is built from these:

* :class:`State` — one enum of the states a runtime goes through, in order:
  ``new`` → ``starting`` → ``running`` → ``draining`` → ``stopping`` → ``stopped``
  (a runtime skips the states it has no use for, never goes back);
* :class:`TaskSet` — the tasks a runtime owns. Each is created through it, a
  crash of one is reported to its owner (which stops), and the owner's stop
  cancels and awaits every one: no task outlives the runtime that made it;
* :class:`Lifecycle` — the state, the recorded fatal error and the stop. The
  stop runs the runtime's shutdown once, in a task of its own that the caller's
  cancellation does not interrupt: every ``stop()`` call waits for that same
  shutdown, and a cancelled caller still sees its ``CancelledError`` (the
  shutdown goes on to its end). A fatal error recorded by :meth:`Lifecycle.fail`
  begins the same stop and is raised to whoever waits for the runtime.

``__aexit__`` means the same everywhere: leaving the block without an exception
drains (for up to ``shutdown_timeout`` seconds) and stops; leaving it with one
(a cancellation included) stops at once, handing unfinished leases back.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from types import TracebackType
from typing import Any, Self

from .._model._errors import RheoError, StoreLost
from .._support._waiting import cancel_and_wait

__all__ = ["Lifecycle", "Runtime", "State", "TaskSet"]

log = logging.getLogger("rheo_flow.runtime")


class State(enum.StrEnum):
    """Where a runtime is in its life; a ``str``, so ``state == "running"`` holds."""

    NEW = "new"
    """Built, not started."""
    STARTING = "starting"
    """``start()`` is under way (a group's ``setup``)."""
    RUNNING = "running"
    """Fetching and handling."""
    DRAINING = "draining"
    """No longer fetching; finishing what it holds."""
    STOPPING = "stopping"
    """Its shutdown is under way."""
    STOPPED = "stopped"
    """Ended: no task of its own runs and no lease is renewed."""


class TaskSet:
    """The tasks one runtime owns; ``on_crash`` hears of any that ends with an error."""

    __slots__ = ("_name", "_on_crash", "_tasks")

    def __init__(self, name: str, on_crash: Callable[[asyncio.Task[Any], BaseException], None]
                 ) -> None:
        self._name = name
        self._on_crash = on_crash
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], role: str) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of the owner, named after it and ``role``."""
        task = asyncio.create_task(coro, name=f"{self._name} {role}")
        self._tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            self._on_crash(task, exc)

    def __len__(self) -> int:
        return len(self._tasks)

    async def cancel(self, tasks: Iterable[asyncio.Task[Any] | None] | None = None) -> None:
        """Cancel ``tasks`` (every task still running when ``None``) and wait until they
        ended. A cancellation of the caller is raised, once they were all cancelled."""
        await cancel_and_wait(list(self._tasks) if tasks is None else tasks)


class Lifecycle:
    """A runtime's state, its fatal error and its one shielded shutdown."""

    __slots__ = ("_failure", "_name", "_shutdown", "_stop_task", "done", "state", "tasks")

    def __init__(self, name: str, shutdown: Callable[[], Awaitable[None]]) -> None:
        self._name = name
        self._shutdown = shutdown
        self._stop_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self.state = State.NEW
        self.done = asyncio.Event()
        """Set once the runtime is stopped."""
        self.tasks = TaskSet(name, self._crashed)

    @property
    def failure(self) -> BaseException | None:
        """The fatal error that stopped the runtime, if one did."""
        return self._failure

    @property
    def stopping(self) -> bool:
        """Whether its shutdown began (or ended)."""
        return self._stop_task is not None or self.state in (State.STOPPING, State.STOPPED)

    def _crashed(self, task: asyncio.Task[Any], exc: BaseException) -> None:
        if self.stopping:
            return
        log.error("%s: task %s crashed; stopping", self._name, task.get_name(), exc_info=exc)
        self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """Record a fatal error and begin the stop (it is raised by :meth:`raise_failure`)."""
        if self._failure is None:
            self._failure = exc
        self.begin_stop()

    def begin_stop(self) -> asyncio.Task[None]:
        """Begin the shutdown, once; the task that runs it."""
        if self._stop_task is None:
            self.state = State.STOPPING
            self._stop_task = asyncio.ensure_future(self._run_shutdown())
        return self._stop_task

    async def stop(self) -> None:
        """Run the shutdown (or join the one under way) to its end.

        A cancellation of the caller is raised at once, while the shutdown goes on.
        """
        if self.state is State.NEW:
            self.state = State.STOPPED
            self.done.set()
            return
        if self.state is State.STOPPED and self._stop_task is None:
            return
        await asyncio.shield(self.begin_stop())

    def ended(self) -> None:
        """Mark a runtime that never ran (its start failed) as stopped."""
        self.state = State.STOPPED
        self.done.set()

    async def _run_shutdown(self) -> None:
        try:
            await self._shutdown()
        finally:
            try:
                await self.tasks.cancel()
            finally:
                self.state = State.STOPPED
                self.done.set()

    def raise_failure(self) -> None:
        """Raise the fatal error that stopped the runtime, if one did:
        :class:`~rheo_flow.StoreLost` as it is, anything else as a
        :class:`~rheo_flow.RheoError` caused by it."""
        failure = self._failure
        if failure is None:
            return
        if isinstance(failure, StoreLost):
            raise failure
        raise RheoError(f"{self._name} crashed: {type(failure).__name__}: {failure}"
                        ) from failure


class Runtime:
    """What every runtime shares: ``async with`` and what leaving it means.

    Entering starts the runtime. Leaving without an exception drains it (for up to
    its ``shutdown_timeout`` seconds) and stops it; leaving with one (a
    cancellation included) stops it at once. A subclass keeps its
    :class:`Lifecycle` in ``_life`` and its drain budget in ``_shutdown_timeout``.
    """

    _life: Lifecycle
    _shutdown_timeout: float

    async def start(self) -> Self:
        """Start the runtime."""
        raise NotImplementedError

    async def drain(self, timeout: float | None = None) -> bool:
        """Stop fetching and finish what the runtime holds; True when nothing is left."""
        raise NotImplementedError

    async def stop(self) -> None:
        """Stop now."""
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if exc is None and self._life.state is State.RUNNING:
                await self.drain(self._shutdown_timeout)
        finally:
            await self.stop()
