"""Health reporting of a worker: a file touched while ready, and ``/healthz`` / ``/readyz``.

The file suits exec probes and supervisors that look at a path; the endpoint
(a tiny asyncio HTTP server, no dependency) suits Kubernetes HTTP probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from urllib.parse import parse_qsl

from ..._support._waiting import cancel_and_wait

__all__ = ["Health", "Route"]

log = logging.getLogger("rheo_flow.worker")

Route = Callable[[Mapping[str, str]], Awaitable[tuple[int, str, bytes]]]
"""An extra endpoint: the query parameters in; status code, content type and body out."""

_REQUEST_TIMEOUT = 5.0
_TEXT = "text/plain; charset=utf-8"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            500: "Internal Server Error", 503: "Service Unavailable"}
_MAX_HEADER_LINES = 100


class Health:
    """Reports ``ready()`` and ``live()`` through a file and/or an HTTP endpoint.

    The file is touched every ``interval`` seconds while ``ready()`` holds and
    removed as soon as it does not (and on close). ``GET /healthz`` answers 200
    while ``live()`` holds, ``GET /readyz`` 200 while ``ready()`` holds; 503
    otherwise, 404 for any other path. ``notes`` (optional) gives lines the two
    answers add after theirs (which groups are paused, say: ``_paused.py``).
    ``routes`` adds endpoints (``/metrics``): each takes the query parameters and
    answers a status code, a content type and a body.
    """

    def __init__(
        self,
        *,
        ready: Callable[[], bool],
        live: Callable[[], bool],
        file: Path | None = None,
        port: int | None = None,
        host: str = "0.0.0.0",
        interval: float = 5.0,
        notes: Callable[[], Awaitable[list[str]]] | None = None,
        routes: Mapping[str, Route] | None = None,
    ) -> None:
        self._ready = ready
        self._routes = dict(routes or {})
        self._notes = notes
        self._live = live
        self._file = file
        self._port = port
        self._host = host
        self._interval = interval
        self._server: asyncio.Server | None = None
        self._toucher: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()

    @staticmethod
    def fresh(path: Path, interval: float) -> bool:
        """Whether ``path`` exists and was touched within three intervals."""
        try:
            return time.time() - path.stat().st_mtime < 3 * interval
        except OSError:
            return False

    async def start(self) -> None:
        """Start touching the file and serving the endpoint (whichever is configured)."""
        if self._file is not None:
            self._toucher = asyncio.create_task(self._touch_loop(), name="rheo-health-file")
        if self._port is not None:
            self._server = await asyncio.start_server(self._serve, self._host, self._port)
            bound = self._server.sockets[0].getsockname()
            paths = ", ".join(["/healthz", "/readyz", *self._routes])
            log.info("health endpoint on http://%s:%d (%s)", bound[0], bound[1], paths)

    def changed(self) -> None:
        """Re-check readiness now (the file follows at once)."""
        self._changed.set()

    def remove_file(self) -> None:
        """Remove the health file (if any)."""
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.unlink()

    async def close(self) -> None:
        """Stop reporting; the file is removed."""
        await cancel_and_wait([self._toucher])
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self.remove_file()

    async def _touch_loop(self) -> None:
        if self._file is None:  # started only with a file: nothing to touch otherwise
            return
        while True:
            if self._ready():
                try:
                    self._file.touch()
                except OSError as exc:
                    log.warning("cannot touch the health file %s: %s", self._file, exc)
            else:
                self.remove_file()
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self._interval)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT):
                request = await reader.readline()
                for _ in range(_MAX_HEADER_LINES):
                    if (await reader.readline()) in (b"\r\n", b"\n", b""):
                        break
            parts = request.decode("latin-1").split()
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, ctype, body = 405, _TEXT, b"method not allowed\n"
            else:
                path, _, query = parts[1].partition("?")
                status, ctype, body = await self._answer(path, dict(parse_qsl(query)))
            head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                    f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n")
            writer.write(head.encode() + (body if parts[0:1] != ["HEAD"] else b""))
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _answer(self, path: str, query: dict[str, str]) -> tuple[int, str, bytes]:
        route = self._routes.get(path)
        if route is not None:
            try:
                return await route(query)
            except Exception:
                log.exception("GET %s failed", path)
                return 500, _TEXT, b"internal error (see the worker's log)\n"
        if path == "/healthz":
            status, body = (200, "ok\n") if self._live() else (503, "not live\n")
        elif path == "/readyz":
            status, body = (200, "ready\n") if self._ready() else (503, "not ready\n")
        else:
            return 404, _TEXT, b"not found\n"
        if self._notes is not None:
            body += "".join(f"{line}\n" for line in await self._notes())
        return status, _TEXT, body.encode()
