"""Store-side gauges: the lag report read at scrape time, cached, on a connection of its own.

A scrape asks :meth:`StoreGauges.current`: the report read last is reused while it is
younger than the interval, concurrent scrapes wait for the one read under way (never
two at once), and a failed read keeps the last report while ``rheo_store_up`` says 0.
The reads go through a :class:`~rheo_flow.Rheo` of their own on the same URL (its own
SQLite connection, a PostgreSQL pool of at most two connections without LISTEN, its
own Redis client), so a scrape never waits for, nor holds, what the runtimes use.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlsplit

from ..._backends._urls import scrub_secrets
from ..._model._lag import LagReport
from ..._rheo import Rheo
from ._text import store_text

__all__ = ["READ_TIMEOUT_S", "StoreGauges", "observer_url", "read_failure"]

log = logging.getLogger("rheo_flow.metrics")

READ_TIMEOUT_S = 10.0
"""How long one read of the lag report may take before it counts as failed."""
_OBSERVER_OPTIONS = {"pool_min_size": "0", "pool_max_size": "2", "listen": "false"}


def observer_url(url: str) -> str:
    """``url`` for a second, small instance: on PostgreSQL a pool of at most two
    connections and no LISTEN connection (options the URL sets itself are kept)."""
    if url.split("://", 1)[0].lower() not in ("postgresql", "postgres"):
        return url
    given = {key for key, _ in parse_qsl(urlsplit(url).query, keep_blank_values=True)}
    extra = "&".join(f"{k}={v}" for k, v in _OBSERVER_OPTIONS.items() if k not in given)
    if not extra:
        return url
    return f"{url}{'&' if '?' in url else '?'}{extra}"


def read_failure(exc: BaseException, timeout: float, url: str) -> str:
    """Why a read of the store within ``timeout`` seconds failed, secrets masked."""
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout:g}s"
    return scrub_secrets(f"{type(exc).__name__}: {exc}", url)


class StoreGauges:
    """The cached lag report of ``streams`` (``None``: every stream) and its gauges."""

    def __init__(self, url: str, *, streams: Sequence[str] | None = None,
                 interval: float = 5.0, rheo: Rheo | None = None,
                 timeout: float = READ_TIMEOUT_S) -> None:
        self._url = url
        self.streams = None if streams is None else list(streams)
        """The streams read (``None``: every stream of the store)."""
        self._interval = interval
        self._timeout = timeout
        self._owned = rheo is None
        self._rheo = rheo if rheo is not None else Rheo(observer_url(url))
        self._lock = asyncio.Lock()
        self._fresh_until = float("-inf")
        self.report: LagReport | None = None
        """The last report read (kept through failed reads)."""
        self.up = False
        """Whether the last read succeeded."""
        self.error: str | None = None
        """Why the last read failed (secrets scrubbed); ``None`` after a success."""
        self.read_seconds = 0.0
        """How long the last read took (failed or not)."""
        self.read_at: float | None = None
        """When the last successful read finished (seconds since the epoch)."""
        self._reads = 0
        self._page: tuple[int, bytes] | None = None

    def use(self, rheo: Rheo) -> None:
        """Read through ``rheo`` (not closed by :meth:`aclose`) from now on."""
        if self._owned:
            self._owned = False
        self._rheo = rheo

    async def current(self) -> LagReport | None:
        """The report, read again first when older than the interval (one read at a time:
        a scrape arriving during a read waits for it and uses its result)."""
        if time.monotonic() < self._fresh_until:
            return self.report
        async with self._lock:
            if time.monotonic() >= self._fresh_until:
                await self._read()
        return self.report

    async def _read(self) -> None:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout):
                await self._rheo.open()
                report = await self._rheo.lag_report(self.streams)
        except Exception as exc:
            error = read_failure(exc, self._timeout, self._url)
            if self.up or self.error is None:
                log.warning("metrics: the store could not be read: %s", error)
            self.up, self.error = False, error
        else:
            if not self.up and self.error is not None:
                log.info("metrics: the store is readable again")
            self.report, self.up, self.error = report, True, None
            self.read_at = time.time()
        finally:
            self._reads += 1
            self.read_seconds = time.perf_counter() - started
            self._fresh_until = time.monotonic() + self._interval

    async def aclose(self) -> None:
        """Close the instance of the reads (when this object opened it)."""
        if self._owned:
            await self._rheo.close()

    def text(self) -> bytes:
        """The store gauges in the Prometheus text format (:mod:`._text`), rendered once
        per read and reused by every scrape until the next one."""
        key = self._reads
        if self._page is None or self._page[0] != key:
            self._page = (key, store_text(self.report, up=self.up,
                                          read_seconds=self.read_seconds,
                                          read_at=self.read_at).encode())
        return self._page[1]
