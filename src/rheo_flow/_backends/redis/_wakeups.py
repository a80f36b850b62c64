"""Push wake-ups of the Redis backend: a blocking ``XREAD`` past the high water the
last fetch saw, over every partition of a stream at once on one server (or a primary
with replicas); on a Redis Cluster one blocking ``XREAD`` per partition (each in its
own slot), run concurrently on connections of their own, the first to return ending
the others."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Coroutine
from typing import Any, Final

from ._codec import text
from ._core import RedisCore
from ._driver import Client, RedisCluster

__all__ = ["WakeupOperations", "block_cap_ms"]

_BLOCK_SLACK_MS: Final = 150
_POLL_S: Final = 0.05


def block_cap_ms(client: Client) -> int | None:
    """The longest blocking read the client's socket timeout allows (None: no limit)."""
    kwargs = (client.connection_kwargs if isinstance(client, RedisCluster)
              else client.connection_pool.connection_kwargs)
    timeout = kwargs.get("socket_timeout")
    if isinstance(timeout, int | float) and timeout > 0:
        # Blocking reads must return before the client's socket timeout fires, and
        # Redis ends a block up to 1/hz late (100 ms by default).
        return int(timeout * 1000) - _BLOCK_SLACK_MS
    return None


class WakeupOperations(RedisCore):
    """``wait_for_append``."""

    _block_cap_ms: int | None

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Block on ``XREAD`` over every partition of the stream, past the high water
        the last fetch saw, and over its signal stream; True as soon as something was
        appended after it, a group of the stream was resumed, or a settle of this
        backend made due a delivery that was waiting for its key."""
        released = self._released_for(stream)
        if released.is_set():
            released.clear()
            return True
        count = await self._partition_count(stream)
        seen = self._seen_for(stream)
        stale = self._stale.setdefault(stream, set())
        unknown = sorted({p for p in range(count) if seen[p] < 0} | stale)
        if unknown:
            # No fetch covered these partitions since the last wake-up: wait past now.
            await self._catch_up(stream, unknown, seen)
            stale.difference_update(unknown)
        keys = {self._keys.partition(stream, p).stream: p for p in range(count)}
        signal = self._keys.signal(stream)
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, timeout)
        # A scheduled event due before the timeout ends the wait at its time (woken).
        due_in = await self._next_scheduled_in(stream, count)
        at_scheduled = due_in is not None and due_in < timeout
        if due_in is not None and at_scheduled:
            end = loop.time() + due_in
        while True:
            remaining = end - loop.time()
            if remaining <= 0:
                return at_scheduled
            streams: dict[Any, Any] = {key: f"{seen[p]}-0" for key, p in keys.items()}
            # A resume of a group of the stream adds to its signal stream (_pauses.py):
            # only what is added while waiting wakes.
            streams[signal] = "$"
            read = _unless(released, self._read_each(streams, remaining)
                           if self._cluster else self._read_one(streams, remaining))
            if not at_scheduled:
                woken = await read
            else:
                # Redis ends a block up to 1/hz late (100 ms by default): the scheduled
                # time ends the wait by this process's timer instead.
                try:
                    woken = await asyncio.wait_for(read, remaining)
                except TimeoutError:
                    return True
            if woken is None:
                released.clear()
                return True
            if woken:
                # Only the first new entry was read: unless a fetch covers these
                # partitions first, the next wait starts past their high water.
                for key in woken:
                    if text(key) in keys:
                        stale.add(keys[text(key)])
                return True

    async def _next_scheduled_in(self, stream: str, count: int) -> float | None:
        """Seconds until the stream's next scheduled event is due (a millisecond after:
        a fetch then finds it due by the server's clock), or None when none is ahead."""
        pipe = self._client.pipeline(transaction=False)
        # Past this host's clock (the appends drop the past entries only now and then).
        after = f"({int(time.time() * 1000)}"
        for p in range(count):
            pipe.zrangebyscore(self._keys.times(stream, p), after, "+inf", start=0, num=1,
                               withscores=True)
        firsts = await self._io(pipe.execute())
        if not any(firsts):
            return None
        # The server's clock (a Cluster pipelines no TIME).
        seconds, micros = await self._io(self._client.time())
        now = int(seconds) * 1000 + int(micros) / 1000
        ahead = [at for first in firsts for _, at in first if at > now]
        return (min(ahead) + 1 - now) / 1000 if ahead else None

    async def _catch_up(self, stream: str, partitions: list[int], seen: list[int]) -> None:
        """Move ``seen`` of the partitions to their current high water."""
        pipe = self._client.pipeline(transaction=False)
        for p in partitions:
            pipe.hget(self._keys.partition(stream, p).meta, "hw")
        for p, value in zip(partitions, await self._io(pipe.execute()), strict=True):
            seen[p] = max(seen[p], int(value or 0))

    async def _read_each(self, streams: dict[Any, Any], remaining: float) -> list[Any]:
        """A cluster's wake-up: one blocking read per partition, concurrently; the keys
        of the reads that found an entry once the first one returned."""
        reads = [asyncio.ensure_future(self._read({key: after}, remaining))
                 for key, after in streams.items()]
        try:
            done, _ = await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for read in reads:
                read.cancel()
            await asyncio.gather(*reads, return_exceptions=True)
        woken: list[Any] = []
        for read in reads:
            if read in done or not (read.cancelled() or read.exception()):
                woken.extend(_woken_keys(read.result()))
        return woken

    async def _read_one(self, streams: dict[Any, Any], remaining: float) -> list[Any]:
        """One blocking read over every partition: the keys it found an entry for."""
        return _woken_keys(await self._read(streams, remaining))

    async def _read(self, streams: dict[Any, Any], remaining: float) -> Any:
        """One ``XREAD`` of the first new entry, blocking up to ``remaining`` seconds
        (rounded up: a wait never ends before its timeout) or the client's cap."""
        remaining_ms = math.ceil(remaining * 1000)
        cap = self._block_cap_ms
        if cap is not None and cap < 10:
            # The client's socket timeout leaves no room for a blocking read: poll.
            reply = await self._io(self._client.xread(streams, count=1))
            if not reply:
                await asyncio.sleep(min(_POLL_S, remaining))
            return reply
        block = remaining_ms if cap is None else min(remaining_ms, cap)
        return await self._io(self._client.xread(streams, count=1, block=block))


async def _unless(event: asyncio.Event, read: Coroutine[Any, Any, list[Any]]
                  ) -> list[Any] | None:
    """What ``read`` returns, or None as soon as ``event`` is set (``read`` is then
    cancelled)."""
    reading = asyncio.ensure_future(read)
    waiting = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait((reading, waiting), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (reading, waiting):
            task.cancel()
        await asyncio.gather(reading, waiting, return_exceptions=True)
    if not reading.cancelled():
        return reading.result()
    return None


def _woken_keys(reply: Any) -> list[Any]:
    """The stream keys an ``XREAD`` reply has entries for (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return list(reply)
    return [item[0] for item in reply]
