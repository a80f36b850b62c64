"""A loopback TCP proxy in front of a real server, told to stall or drop its connections.

Tests of network faults use it instead of mocking a driver: the driver talks
to the real server through it, and the test decides when the network stops
forwarding (a stall: every socket stays open, nothing goes through) or breaks
(every connection is reset mid-call).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from types import TracebackType
from typing import Self


class Proxy:
    """Forwards ``127.0.0.1:port`` to ``host:target_port`` until told otherwise."""

    def __init__(self, host: str, target_port: int) -> None:
        self._target = (host, target_port)
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.connections = 0
        """How many client connections the proxy accepted."""
        self.held = asyncio.Event()
        """Set when bytes arrive while the proxy stalls (a request is held back)."""

    @property
    def port(self) -> int:
        """The proxy's listening port."""
        assert self._server is not None
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        assert self._server is not None
        self._server.close()
        self.drop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    def stall(self) -> None:
        """Stop forwarding in both directions; sockets (and new connections) stay open."""
        self.held.clear()
        self._flowing.clear()

    def resume(self) -> None:
        """Forward again (what was held back is delivered)."""
        self._flowing.set()

    def drop(self) -> None:
        """Reset every open connection, both sides."""
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.add(up_writer)
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.get_running_loop().create_task(self._pump(source, sink))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                chunk = await source.read(65536)
                if chunk and not self._flowing.is_set():
                    self.held.set()
                await self._flowing.wait()
                if not chunk:
                    break
                sink.write(chunk)
                await sink.drain()
        sink.transport.abort()


def refusing_port() -> int:
    """A loopback port nothing listens on (connecting to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port
