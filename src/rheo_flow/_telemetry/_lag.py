"""The consumer lag gauge: cached per (stream, group, partition), refreshed in the background.

The gauge's callback runs on the metric reader's thread and never calls the
backend: it reports the values cached by a :class:`LagTracker` and, when they
are older than the refresh interval, asks the tracker's event loop to refresh
them (two backend calls: the frontier and the high water). So a process that
nobody collects metrics from makes no lag queries at all, and the values a
collection reports are at most one refresh interval (plus one collection) old.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence, Sized
from typing import Literal, Protocol

from .._support._waiting import cancel_and_wait
from . import _names as n
from ._metrics import instruments
from ._state import STATE

__all__ = ["LagSource", "LagTracker", "track_lag"]

log = logging.getLogger("rheo_flow.telemetry")


class LagSource(Protocol):
    """Where a :class:`LagTracker` reads the lag: a :class:`~rheo_flow.Rheo` (the runtimes
    that track lag are above this package, so it names what it calls, not the class)."""

    async def lag(self, stream: str, group: str) -> dict[int, int]:
        """``high_water - frontier`` per partition."""
        ...


def track_lag(rheo: LagSource, stream: str, group: str,
              partitions: Literal["all"] | Sequence[int] = "all",
              inflight: Sized | None = None) -> LagTracker | None:
    """Report the lag of ``group`` on ``stream`` (the given partitions) until closed, and
    how many leases the runtime holds (``len(inflight)``, read at collection time).

    Returns ``None`` when telemetry is disabled. Call from the event loop the
    runtime runs on.
    """
    if not STATE.enabled:
        return None
    return LagTracker(rheo, stream, group, partitions, inflight)


class LagTracker:
    """The cached lag of one runtime's (stream, group, partitions), and its held leases."""

    def __init__(self, rheo: LagSource, stream: str, group: str,
                 partitions: Literal["all"] | Sequence[int],
                 inflight: Sized | None = None) -> None:
        self._rheo = rheo
        self._inflight = inflight
        self._stream = stream
        self._group = group
        self._partitions = None if partitions == "all" else frozenset(partitions)
        self._attributes = {n.MESSAGING_SYSTEM: n.SYSTEM, n.DESTINATION: stream,
                            n.CONSUMER_GROUP: group}
        self._values: dict[int, int] = {}
        self._refreshed_at = float("-inf")
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        STATE.lag_sources.add(self)
        if instruments() is not None:
            self._kick()

    @property
    def values(self) -> dict[int, int]:
        """The cached lag per partition (empty before the first refresh)."""
        return dict(self._values)

    def observations(self) -> Iterable[tuple[int, dict[str, str]]]:
        """The cached values as gauge points; schedules a refresh when they are stale."""
        if self._closed:
            return []
        if time.monotonic() - self._refreshed_at >= STATE.lag_refresh:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nothing to refresh
                self._loop.call_soon_threadsafe(self._kick)
        base = self._attributes
        return [(lag, {**base, n.PARTITION: str(p)}) for p, lag in self._values.items()]

    def inflight_observations(self) -> Iterable[tuple[int, dict[str, str]]]:
        """The leases the runtime holds now, as one gauge point (none without a set)."""
        if self._closed or self._inflight is None:
            return []
        return [(len(self._inflight), self._attributes)]

    def _kick(self) -> None:
        if self._closed or (self._task is not None and not self._task.done()):
            return
        self._task = self._loop.create_task(
            self._refresh(), name=f"rheo-lag {self._stream}/{self._group}")

    async def _refresh(self) -> None:
        try:
            lag = await self._rheo.lag(self._stream, self._group)
        except Exception as exc:  # keep the last values; the next collection retries
            log.debug("lag of %s/%s not refreshed: %s", self._stream, self._group, exc)
            return
        finally:
            self._refreshed_at = time.monotonic()
        if self._partitions is not None:
            lag = {p: v for p, v in lag.items() if p in self._partitions}
        self._values = lag

    async def aclose(self) -> None:
        """Stop reporting (and refreshing)."""
        self._closed = True
        STATE.lag_sources.discard(self)
        task, self._task = self._task, None
        await cancel_and_wait([task])
