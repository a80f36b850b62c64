"""A TCP proxy a test can cut and restore: a server that stops answering, then comes back."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from urllib.parse import urlsplit

__all__ = ["Proxy", "free_port"]


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Proxy:
    """A TCP proxy to a server that the test can cut (every connection dropped, new ones
    refused) and restore on the same port."""

    def __init__(self, target: tuple[str, int]) -> None:
        self._target = target
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @classmethod
    def to(cls, url: str, default_port: int) -> Proxy:
        """A proxy to the server of ``url``."""
        parts = urlsplit(url)
        return cls((parts.hostname or "127.0.0.1", parts.port or default_port))

    def url(self, url: str) -> str:
        """``url`` through the proxy."""
        netloc = urlsplit(url).netloc
        credentials, at, host = netloc.rpartition("@")
        name = host.rsplit(":", 1)[0] if ":" in host else host
        return url.replace(netloc, f"{credentials}{at}{name}:{self.port}", 1)

    async def open(self) -> None:
        """Accept connections (again, after a cut) on the same port."""
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", self.port)

    async def cut(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()
        if server is not None:
            await server.wait_closed()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(ConnectionError, OSError):
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    writer.transport.abort()
