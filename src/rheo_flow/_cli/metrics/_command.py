"""``rheo-flow metrics``: the store gauges on a port of their own, without a worker.

It serves ``/metrics`` (the store gauges of :mod:`._store` and the process metrics),
``/metrics/lag`` (one group as JSON, for KEDA), ``/healthz`` and ``/readyz`` (200 while
the store answers), until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Mapping
from typing import Annotated

import typer

from .._common import UrlOption, console, existing, run

__all__ = ["metrics"]

log = logging.getLogger("rheo_flow.metrics")


def metrics(
    url: UrlOption,
    port: Annotated[int, typer.Option(
        min=0, max=65535, help="Port to serve /metrics, /metrics/lag, /healthz, /readyz on.")],
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
    interval: Annotated[str, typer.Option(
        help="How long one read of the store's lag report serves scrapes (a duration).",
    )] = "5s",
    streams: Annotated[str | None, typer.Option(
        show_default=False, help="Streams to report, comma-separated (default: every one).",
    )] = None,
    log_level: Annotated[str, typer.Option(help="DEBUG, INFO, WARNING or ERROR.")] = "INFO",
) -> None:
    """Export the store's lag, scheduled events, oldest unsettled age, dead letters and
    pauses as Prometheus metrics (and as JSON for KEDA), read at scrape time.

    Every group of the streams is reported; one read of the store serves the scrapes
    of --interval. Needs the prometheus extra (pip install 'rheo-flow[prometheus]').
    Runs until SIGTERM or SIGINT.
    """
    from ..worker._command import LogFormat, _configure_logging, _fail, _positive, _streams
    from ._exporter import MISSING_EXTRA, available

    level = log_level.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise _fail(f"unknown --log-level {log_level!r}", 2)
    _configure_logging(level, LogFormat.text)
    if not available():
        raise _fail(MISSING_EXTRA, 2)
    seconds = _positive(interval, "--interval")
    names = _streams(streams, "--streams")
    run(console(), lambda: _serve(url, host, port, seconds, names), url)


async def _serve(url: str, host: str, port: int, interval: float,
                 streams: tuple[str, ...] | None) -> None:
    from ..._backends._urls import redact_url
    from ..._rheo import Rheo
    from ..worker._health import Health
    from ._endpoints import Response, routes
    from ._exporter import PrometheusExport
    from ._store import StoreGauges

    async with Rheo(existing(url)):
        pass  # a missing store (or one never migrated) is an error, not a 503 forever
    export = PrometheusExport(runtime=False)
    store = StoreGauges(existing(url), streams=streams, interval=interval)

    async def ready(query: Mapping[str, str]) -> Response:
        await store.current()
        if store.up:
            return 200, "text/plain; charset=utf-8", b"ready\n"
        return 503, "text/plain; charset=utf-8", f"not ready\n{store.error}\n".encode()

    health = Health(ready=lambda: store.up, live=lambda: True, port=port, host=host,
                    routes={**routes(export, store), "/readyz": ready})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await health.start()
    log.info("exporting the lag of %s (%s)", redact_url(url),
             "every stream" if streams is None else ", ".join(streams))
    try:
        await store.current()  # the first read at once: an unreachable store shows in the log
        await stop.wait()
    finally:
        await health.close()
        await store.aclose()
        export.close()
