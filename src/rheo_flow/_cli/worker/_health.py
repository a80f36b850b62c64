"""Health reporting of a worker: a file touched while ready, and ``/healthz`` / ``/readyz``.

The file suits exec probes and supervisors that look at a path; the endpoint
(a tiny asyncio HTTP server, no dependency) suits Kubernetes HTTP probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ..._support._waiting import cancel_and_wait

__all__ = ["Health"]

log = logging.getLogger("rheo_flow.worker")

_REQUEST_TIMEOUT = 5.0
_MAX_HEADER_LINES = 100


class Health:
    """Reports ``ready()`` and ``live()`` through a file and/or an HTTP endpoint.

    The file is touched every ``interval`` seconds while ``ready()`` holds and
    removed as soon as it does not (and on close). ``GET /healthz`` answers 200
    while ``live()`` holds, ``GET /readyz`` 200 while ``ready()`` holds; 503
    otherwise, 404 for any other path. ``notes`` (optional) gives lines the two
    answers add after theirs (which groups are paused, say: ``_paused.py``).
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
    ) -> None:
        self._ready = ready
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
            log.info("health endpoint on http://%s:%d (/healthz, /readyz)", bound[0], bound[1])

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
            path = parts[1].split("?", 1)[0] if len(parts) >= 2 else ""
            if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                status, body = "405 Method Not Allowed", "method not allowed\n"
            elif path == "/healthz":
                status, body = ("200 OK", "ok\n") if self._live() else (
                    "503 Service Unavailable", "not live\n")
            elif path == "/readyz":
                status, body = ("200 OK", "ready\n") if self._ready() else (
                    "503 Service Unavailable", "not ready\n")
            else:
                status, body = "404 Not Found", "not found\n"
            if self._notes is not None and path in ("/healthz", "/readyz"):
                body += "".join(f"{line}\n" for line in await self._notes())
            head = (f"HTTP/1.1 {status}\r\nContent-Type: text/plain\r\n"
                    f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")
            writer.write((head + (body if parts and parts[0] != "HEAD" else "")).encode())
            await writer.drain()
        except (TimeoutError, ConnectionError, UnicodeDecodeError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()
