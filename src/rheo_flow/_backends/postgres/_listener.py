"""Wake-ups of idle PostgreSQL consumers through ``LISTEN``/``NOTIFY``.

Every append sends one ``NOTIFY`` on the schema's channel with the stream's name
as payload. A :class:`Listener` holds one dedicated connection that listens on
it while anything waits; when that connection cannot be had, callers poll.

An append of scheduled events (``NewEvent(deliver_at=...)``) adds their times to
the payload (``"stream ms ms ..."``; a name holds no space): the listener wakes
the stream's waiters at once and again at each time, so that an idle consumer
fetches a scheduled event when it becomes due rather than a poll interval later
(a listener of an earlier release sees a name no stream has, and polls).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Final

from ..._model._append_records import AppendRecord
from .._shared import Waiters

if TYPE_CHECKING:
    import asyncpg

__all__ = ["LISTEN_RETRY_S", "Listener", "scheduled_payload"]


def scheduled_payload(stream: str, records: Sequence[AppendRecord]) -> str:
    """The ``NOTIFY`` payload of an append of ``records`` to ``stream``, some scheduled."""
    times = sorted({r.deliver_at_ms for r in records if r.deliver_at_ms is not None})
    return " ".join([stream, *map(str, times[:MAX_NOTIFIED_TIMES])])

log = logging.getLogger("rheo_flow.postgres")

MAX_NOTIFIED_TIMES: Final = 32
"""At most how many distinct scheduled times (the earliest) an append's payload names."""
MAX_TIMERS: Final = 10_000
"""At most how many wake-ups at scheduled times a listener keeps armed."""

LISTEN_RETRY_S: Final = 5.0
"""After a failed LISTEN connection, poll for this long before trying again."""


class Listener:
    """The LISTEN connection of one backend, its waiters and notification counters.

    ``connect`` opens the connection (a dedicated one, or one held from the host's
    pool) and ``release`` gives it back. The counters close the race between a
    fetch and the wait after it: see :meth:`fetching` and :meth:`wait`.
    """

    def __init__(self, channel: str, connect: Callable[[], Awaitable[asyncpg.Connection]],
                 release: Callable[[asyncpg.Connection], Awaitable[None]]) -> None:
        self._channel = channel
        self._connect = connect
        self._release = release
        self.connection: asyncpg.Connection | None = None
        """The listening connection, while there is one."""
        self._task: asyncio.Task[bool] | None = None
        self._failed_at = -LISTEN_RETRY_S
        self.waiters = Waiters()
        """Who waits for an append, by stream."""
        self.notes: dict[str, int] = {}
        """Notifications received, by stream."""
        self._seen: dict[str, int] = {}
        self._timers: dict[tuple[str, int], asyncio.TimerHandle] = {}
        """Wake-ups armed at scheduled times, by (stream, time in ms)."""

    def fetching(self, stream: str) -> None:
        """Record that a fetch of ``stream`` starts: it sees every append notified so far."""
        if self.connection is not None:
            self._seen[stream] = self.notes.get(stream, 0)

    async def wait(self, stream: str, timeout: float) -> bool:
        """Wait for a notification of ``stream``, or ``timeout`` seconds (False).

        A notification that arrived after the latest fetch of the stream started
        (so that fetch may have missed its events) returns at once instead of
        being lost between the fetch and the wait.
        """
        notes = self.notes.get(stream, 0)
        if stream in self._seen and notes > self._seen[stream]:
            self._seen[stream] = notes
            return True
        return await self.waiters.wait(stream, timeout)

    async def ensure(self) -> bool:
        """Whether a LISTEN connection is up, making one unless one failed just now."""
        if self.connection is not None and not self.connection.is_closed():
            return True
        if time.monotonic() - self._failed_at < LISTEN_RETRY_S:
            return False
        task = self._task
        if task is None or task.done():
            task = self._task = asyncio.get_running_loop().create_task(self._start())
        # A waiter cancelled while the connection is being made (a consumer that
        # fetched meanwhile) must not abort it half-way: the next wait uses it.
        return await asyncio.shield(task)

    async def _start(self) -> bool:
        try:
            conn = await self._connect()
        except Exception as exc:
            self._failed(exc)
            return False
        try:
            await conn.add_listener(self._channel, self._on_notify)
        except Exception as exc:
            self._failed(exc)
            await self._drop(conn)
            return False
        conn.add_termination_listener(self._on_lost)
        self.connection = conn
        return True

    def _failed(self, exc: Exception) -> None:
        self._failed_at = time.monotonic()
        log.warning("LISTEN on %s failed (%s: %s); polling for %.0fs",
                    self._channel, type(exc).__name__, exc, LISTEN_RETRY_S)

    def _on_notify(self, conn: object, pid: int, channel: str, payload: object) -> None:
        stream, *times = str(payload).split(" ")
        self._note(stream)
        if times:
            self._arm(stream, times)

    def _note(self, stream: str) -> None:
        self.notes[stream] = self.notes.get(stream, 0) + 1
        self.waiters.wake(stream)

    def _arm(self, stream: str, times: list[str]) -> None:
        """Wake ``stream``'s waiters again at each of ``times`` (ms since the epoch, by
        this host's clock: a skew with the server's makes a fetch early, which finds
        nothing and polls, or late by it)."""
        loop = asyncio.get_running_loop()
        now = time.time() * 1000
        for item in times:
            at = int(item) if item.isdigit() else 0
            if at <= now or (stream, at) in self._timers or len(self._timers) >= MAX_TIMERS:
                continue
            # A millisecond after: a timer may fire a little early, and a fetch before
            # the time finds nothing (the server's clock counts whole milliseconds).
            self._timers[(stream, at)] = loop.call_later(
                (at - now + 1) / 1000, self._fire, stream, at)

    def _fire(self, stream: str, at: int) -> None:
        self._timers.pop((stream, at), None)
        self._note(stream)

    def _on_lost(self, conn: object) -> None:
        if self.connection is conn:
            self.connection = None
        # Wake everyone: they fetch now, and the next wait reconnects (or polls).
        self.waiters.wake_all()

    async def stop(self) -> None:
        """Close the connection (letting one being made finish first) and wake every waiter."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        task, self._task = self._task, None
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await task
        conn, self.connection = self.connection, None
        if conn is not None:
            conn.remove_termination_listener(self._on_lost)
            with contextlib.suppress(Exception):
                await conn.remove_listener(self._channel, self._on_notify)
            await self._drop(conn)
        self._on_lost(None)

    async def _drop(self, conn: asyncpg.Connection) -> None:
        try:
            await self._release(conn)
        except Exception as exc:  # closing must not fail the caller's shutdown
            log.debug("closing the LISTEN connection failed: %s", exc)
            conn.terminate()
