"""What a worker reports about its store: ``/metrics`` and ``/metrics/lag`` on the health
port, and a readiness probe that reads the store every few seconds.

Both go through one :class:`~rheo_flow.Rheo` of their own on the worker's URL (a
small PostgreSQL pool, its own SQLite connection or Redis client: see
:func:`..metrics._store.observer_url`), never through the runtimes' instance, so a
scrape or a probe neither waits for the runtimes' connections nor holds them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from ..._rheo import Rheo
from ..._support._waiting import cancel_and_wait
from ..metrics._endpoints import Route, routes
from ..metrics._exporter import PrometheusExport
from ..metrics._store import StoreGauges, observer_url, read_failure

__all__ = ["Observation", "StoreProbe"]

log = logging.getLogger("rheo_flow.worker")


class StoreProbe:
    """Reads the store every ``interval`` seconds (``check``, bounded by ``timeout``);
    :attr:`problem` says why the last read failed, ``None`` while it answers."""

    def __init__(self, check: Callable[[], Awaitable[object]], url: str, *,
                 interval: float, timeout: float, changed: Callable[[], None]) -> None:
        self._check = check
        self._url = url
        self._interval = interval
        self._timeout = timeout
        self._changed = changed
        self._task: asyncio.Task[None] | None = None
        self.problem: str | None = None
        """``store unreachable: ...`` (no secrets) while the last probe failed."""

    def start(self) -> None:
        """Start probing (the first probe runs at once)."""
        self._task = asyncio.create_task(self._run(), name="rheo-worker-store-probe")

    async def aclose(self) -> None:
        """Stop probing."""
        await cancel_and_wait([self._task])

    async def probe_once(self) -> None:
        """One probe: updates :attr:`problem` (and tells ``changed`` when it flips)."""
        try:
            async with asyncio.timeout(self._timeout):
                await self._check()
        except Exception as exc:
            problem = f"store unreachable: {read_failure(exc, self._timeout, self._url)}"
            if self.problem is None:
                log.warning("readiness: %s", problem)
                self.problem = problem
                self._changed()
            self.problem = problem
            return
        if self.problem is not None:
            log.info("readiness: the store answers again")
            self.problem = None
            self._changed()

    async def _run(self) -> None:
        while True:
            await self.probe_once()
            await asyncio.sleep(self._interval)  # a periodic probe: time is the trigger


class Observation:
    """The metrics endpoints and the store probe of one worker (or supervisor) process.

    ``metrics`` turns the endpoints on (``runtime``: rheo_flow's own instruments of
    this process are on the page too); ``probe_interval`` 0 turns the probe off.
    Call :meth:`start` with the streams to watch once they are known.
    """

    def __init__(self, url: str, *, metrics: bool, runtime: bool, interval: float,
                 streams: Sequence[str] | None, probe_interval: float, probe_timeout: float,
                 changed: Callable[[], None]) -> None:
        self._url = url
        self._streams = None if streams is None else list(streams)
        self._rheo = Rheo(observer_url(url))
        self._export = PrometheusExport(runtime=runtime) if metrics else None
        self._store: StoreGauges | None = None
        if self._export is not None:
            self._store = StoreGauges(url, streams=self._streams, interval=interval,
                                      rheo=self._rheo)
        self._probe = None if probe_interval <= 0 else StoreProbe(
            self._check, url, interval=probe_interval, timeout=probe_timeout, changed=changed)
        self._watched: list[str] = []

    @property
    def problem(self) -> str | None:
        """Why the store is not ready (``None``: it answers, or nobody probes it)."""
        return None if self._probe is None else self._probe.problem

    def routes(self) -> dict[str, Route]:
        """``/metrics`` and ``/metrics/lag`` (none when metrics are off)."""
        if self._export is None or self._store is None:
            return {}
        return routes(self._export, self._store)

    def start(self, consumed: Sequence[str] | None, rheo: Rheo | None = None) -> None:
        """Watch ``consumed`` (the store gauges' default streams, the probe's first one);
        ``rheo`` replaces the instance of its own on ``memory://`` (another instance
        would be another store)."""
        self._watched = list(consumed or [])
        if rheo is not None and self._url.split("://", 1)[0].lower() == "memory":
            self._rheo = rheo
            if self._store is not None:
                self._store.use(rheo)
        if self._store is not None and self._streams is None:
            self._store.streams = None if consumed is None else list(consumed)
        if self._probe is not None:
            self._probe.start()

    async def lines(self) -> list[str]:
        """The probe's problem as a line of ``/readyz`` and ``/healthz`` (if any)."""
        problem = self.problem
        return [] if problem is None else [problem]

    async def _check(self) -> None:
        await self._rheo.open()
        if self._watched:
            await self._rheo.stream_info(self._watched[0])
        else:
            await self._rheo.streams()

    async def aclose(self) -> None:
        """Stop probing, stop recording, close the instance of its own."""
        if self._probe is not None:
            await self._probe.aclose()
        if self._export is not None:
            self._export.close()
        if self._url.split("://", 1)[0].lower() != "memory":
            await self._rheo.close()
