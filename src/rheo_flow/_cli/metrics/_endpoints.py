"""``GET /metrics`` (the Prometheus page) and ``GET /metrics/lag`` (one group, as JSON for
KEDA's metrics-api scaler), both from the same cached lag report."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping

import orjson

from ..._model._lag import age_seconds
from ._exporter import CONTENT_TYPE, PrometheusExport
from ._store import StoreGauges

__all__ = ["Response", "Route", "lag_json", "routes"]

Response = tuple[int, str, bytes]
"""Status code, content type and body."""
Route = Callable[[Mapping[str, str]], Awaitable[Response]]
"""An endpoint: the query parameters in, the response out."""

_JSON = "application/json"


def routes(export: PrometheusExport, store: StoreGauges) -> dict[str, Route]:
    """The two endpoints: ``/metrics`` is ``export``'s page (the runtime's instruments, the
    process) followed by ``store``'s gauges; ``/metrics/lag`` is one group of ``store``."""
    async def metrics(query: Mapping[str, str]) -> Response:
        await store.current()
        # Rendering runs on a thread, so the event loop keeps consuming meanwhile.
        page = await asyncio.to_thread(lambda: export.render() + store.text())
        return 200, CONTENT_TYPE, page

    async def lag(query: Mapping[str, str]) -> Response:
        return await lag_json(store, query)

    return {"/metrics": metrics, "/metrics/lag": lag}


async def lag_json(store: StoreGauges, query: Mapping[str, str]) -> Response:
    """``{"stream", "group", "lag", "scheduled", "oldest_unsettled_age_seconds",
    "dead_letters", "paused", "store_up", "read_at_ms"}`` of ``?stream=..&group=..``;
    400 without both, 404 for a group the report does not have, 503 before any read."""
    stream, group = query.get("stream"), query.get("group")
    if not stream or not group:
        return _error(400, "pass both stream= and group=, e.g. /metrics/lag?stream=orders"
                           "&group=billing")
    report = await store.current()
    if report is None:
        return _error(503, f"the store could not be read: {store.error or 'not read yet'}")
    entry = report.group(stream, group)
    if entry is None:
        return _error(404, f"no group {group!r} on stream {stream!r} in the lag report")
    body = {"stream": stream, "group": group, "lag": entry.lag, "scheduled": entry.scheduled,
            "oldest_unsettled_age_seconds":
                age_seconds(entry.oldest_unsettled_ms, report.read_at_ms) or 0.0,
            "dead_letters": entry.dead_letters, "paused": entry.paused,
            "partitions": len(entry.partitions), "store_up": store.up,
            "read_at_ms": report.read_at_ms}
    return 200, _JSON, orjson.dumps(body)


def _error(status: int, message: str) -> Response:
    return status, _JSON, orjson.dumps({"error": message})
