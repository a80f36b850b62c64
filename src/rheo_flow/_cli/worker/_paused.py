"""Which of a worker's groups are paused, for its health output (``/healthz``, ``/readyz``).

A paused group's runtime idles (its fetches return nothing) and stays ready: the
health endpoint keeps answering 200 and adds a line per paused group. The groups
are read at most once per interval, when a probe asks; a failed read keeps the
last answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from ..._rheo import Rheo

__all__ = ["PausedGroups"]

_READ_TIMEOUT_S = 1.0


class PausedGroups:
    """The paused groups among ``groups()`` (``(stream, group)`` pairs), as health lines."""

    def __init__(self, rheo: Callable[[], Rheo | None],
                 groups: Callable[[], Sequence[tuple[str, str]]],
                 interval: Callable[[], float]) -> None:
        self._rheo = rheo
        self._groups = groups
        self._interval = interval
        self._read_at = -float("inf")
        self._lines: list[str] = []
        self._lock = asyncio.Lock()

    async def lines(self) -> list[str]:
        """``paused: STREAM/GROUP`` (then `` until TIME``) per paused group."""
        async with self._lock:
            if time.monotonic() - self._read_at >= self._interval():
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(_READ_TIMEOUT_S):
                        self._lines = await self._read()
                self._read_at = time.monotonic()
            return self._lines

    async def _read(self) -> list[str]:
        rheo = self._rheo()
        if rheo is None or not rheo.capabilities.pause:
            return []
        lines = []
        for stream, group in sorted(set(self._groups())):
            info = await rheo.group_info(stream, group)
            if info.paused:
                until = ("" if info.paused_until_ms is None else " until " + datetime.fromtimestamp(
                    info.paused_until_ms / 1000, UTC).isoformat(timespec="seconds"))
                lines.append(f"paused: {stream}/{group}{until}")
        return lines
