"""Push wake-ups: a change stream on the events collection wakes the consumers of each stream.

Change streams need a replica set or a sharded cluster; :func:`probe_change_streams`
finds out at open. Without them consumers poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, Final

from pymongo import errors as mongo_errors

from .._shared import Waiters
from ._client import resolve
from ._errors import CHANGE_STREAMS_UNSUPPORTED

__all__ = ["Watcher", "probe_change_streams"]

log = logging.getLogger("rheo_flow.mongo")

_WATCH_AWAIT_MS: Final = 500
_WATCH_RETRY_S: Final = 1.0
_CLOSE_S: Final = 2.0
"""How long stopping waits for the change stream to close: a server that holds its
``getMore`` past ``maxAwaitTimeMS`` must not make closing the backend hang."""
_PIPELINE: Final = [
    {"$match": {"operationType": "insert"}},
    {"$project": {"fullDocument.st": 1}},
]


async def probe_change_streams(events: Any, where: str) -> bool:
    """Whether a change stream can be opened on ``events`` (logged when it fails oddly)."""
    try:
        stream = await resolve(events.watch(
            [{"$match": {"operationType": "insert"}}], max_await_time_ms=1
        ))
        try:
            await stream.try_next()
        finally:
            await stream.close()
    except mongo_errors.OperationFailure as exc:
        if exc.code not in CHANGE_STREAMS_UNSUPPORTED:
            log.warning("change streams unusable on %s, polling instead: %s", where, exc)
        return False
    except mongo_errors.PyMongoError as exc:
        log.warning("change streams unusable on %s, polling instead: %s", where, exc)
        return False
    return True


class Watcher:
    """One change stream per backend on the events collection, dispatching by stream.

    Started by the first wait; a broken change stream is opened again after a
    pause (waiters still return at their timeout: it only costs latency).
    """

    def __init__(self, waiters: Waiters, where: Callable[[], str]) -> None:
        self._waiters = waiters
        self._where = where
        self._task: asyncio.Task[None] | None = None

    def ensure(self, events: Any, name: str) -> None:
        """Start watching ``events`` unless a watch is running (``name`` names the task)."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch(events), name=name)

    async def stop(self) -> None:
        """Stop watching (a no-op when not started)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=_CLOSE_S)
            if not done:
                log.warning("the change stream on %s did not close within %.0f s; "
                            "left behind", self._where(), _CLOSE_S)
                return
            if not task.cancelled():
                task.exception()  # retrieved: asyncio would log it as never retrieved

    async def _watch(self, events: Any) -> None:
        while True:
            try:
                await self._follow(events)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("change stream on %s failed, retrying in %.0f s: %s",
                            self._where(), _WATCH_RETRY_S, exc)
            else:
                log.info("change stream on %s was closed by the server, reopening in %.0f s",
                         self._where(), _WATCH_RETRY_S)
            await asyncio.sleep(_WATCH_RETRY_S)

    async def _follow(self, events: Any) -> None:
        """Wake the waiters of every stream appended to, until the change stream fails
        or is closed (a closed one answers ``try_next`` at once, without awaiting
        anything: looping on it would starve the event loop)."""
        changes = await resolve(events.watch(_PIPELINE, max_await_time_ms=_WATCH_AWAIT_MS))
        try:
            while changes.alive:
                change = await changes.try_next()
                if change is not None:
                    self._waiters.wake(change.get("fullDocument", {}).get("st", ""))
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(changes.close(), _CLOSE_S)
