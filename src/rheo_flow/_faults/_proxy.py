"""A loopback TCP proxy between clients and a real server, to break the network on purpose.

:class:`FaultProxy` listens on a free loopback port and forwards every connection
to one backend server. While it runs, a test switches what the network does:

* :meth:`FaultProxy.pass_traffic` — forward everything at once (the default);
* :meth:`FaultProxy.drop` — reset (or close) every open connection, as a
  crashed middlebox or a server that went away would; new connections are
  accepted and forwarded as usual;
* :meth:`FaultProxy.blackhole` — accept and hold connections (all of them, or
  a share of those open), forward nothing in either direction for ``seconds``
  (a network partition), then either drop the held connections or let the held
  bytes through (the partition heals);
* :meth:`FaultProxy.lose_replies` — swallow the server's next answer(s) and
  reset the connection: the request took effect, the client never hears of it;
* :meth:`FaultProxy.set_delay` — deliver each chunk ``seconds`` after it was
  read, in order, in both directions (a slow link: latency, not a throughput cap).

:meth:`FaultProxy.url` rewrites a backend URL's host and port to point at the
proxy, so the clients built from it go through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit, urlunsplit

from .._backends._urls import redact_url
from .._model._errors import InvalidArgument

__all__ = ["DEFAULT_PORTS", "FaultProxy", "ProxyStats"]

DEFAULT_PORTS: Final[dict[str, int]] = {
    "postgresql": 5432, "postgres": 5432, "redis": 6379, "rediss": 6379,
    "mongodb": 27017,
}
"""The port a URL of each scheme means when it names none."""

_CHUNK: Final = 65_536
_CONNECT_TIMEOUT_S: Final = 10.0
_LINGER_RESET: Final = struct.pack("ii", 1, 0)
"""SO_LINGER on, 0 s: closing the socket sends a RST instead of a FIN."""

AfterBlackhole = Literal["drop", "resume"]


@dataclass(slots=True)
class ProxyStats:
    """What the proxy did so far (counters only grow)."""

    accepted: int = 0
    """Client connections accepted."""
    dropped: int = 0
    """Connections the proxy reset or closed on purpose."""
    upstream_failures: int = 0
    """Client connections closed because the server could not be reached."""
    replies_lost: int = 0
    """Answers from the server swallowed by :meth:`FaultProxy.lose_replies`."""


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = asyncio.Event()
        self.flowing = asyncio.Event()
        self.flowing.set()

    def abort(self, reset: bool) -> None:
        if self.closed.is_set():
            return
        for writer in (self.client, self.server):
            if writer is None:
                continue
            sock = writer.get_extra_info("socket")
            if reset and sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
            writer.transport.abort()
        for task in self.tasks:
            task.cancel()
        self.closed.set()


class FaultProxy:
    """A TCP proxy on ``127.0.0.1`` to ``target_host:target_port``, controllable at runtime.

    Use it as ``async with FaultProxy.for_url(url) as proxy:`` (or :meth:`start` /
    :meth:`stop`) inside the running event loop; every control method acts at once
    on the connections open now and on those accepted later.
    """

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if not isinstance(target_port, int) or not 0 < target_port < 65536:
            raise InvalidArgument(f"target_port must be a TCP port, got {target_port!r}")
        self.target_host = target_host
        self.target_port = target_port
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._held: set[_Link] = set()
        self._hold_new = False
        self._delay = 0.0
        self._lose_replies = 0
        self._blackhole: asyncio.Task[None] | None = None
        self.stats = ProxyStats()
        self.held = asyncio.Event()
        """Set when a held connection receives bytes (a request waits in the blackhole)."""

    @classmethod
    def for_url(cls, url: str) -> FaultProxy:
        """A proxy to the server a ``postgresql://``, ``redis://`` or ``mongodb://`` URL names."""
        host, port = _address(url)
        return cls(host, port)

    # -- lifecycle -------------------------------------------------------

    async def start(self) -> None:
        """Listen (on a free port unless one was given)."""
        if self._server is not None:
            return
        self._server = await asyncio.start_server(self._accept, self._host, self._port)
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and close every connection."""
        if self._blackhole is not None:
            self._blackhole.cancel()
            self._blackhole = None
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for link in list(self._links):
            link.abort(reset=False)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> FaultProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def port(self) -> int:
        """The port the proxy listens on (known once started)."""
        if self._server is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def connections(self) -> int:
        """How many client connections are open through the proxy now."""
        return len(self._links)

    def url(self, url: str) -> str:
        """``url`` with its host and port replaced by the proxy's (credentials kept)."""
        _address(url)
        parts = urlsplit(url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = f"{userinfo}@" if userinfo else ""
        return urlunsplit(parts._replace(netloc=f"{netloc}{self._host}:{self.port}"))

    # -- faults ----------------------------------------------------------

    def pass_traffic(self) -> None:
        """Forward everything at once: end any blackhole (letting held bytes through) and delay."""
        self._end_blackhole()
        self._delay = 0.0
        self._lose_replies = 0

    def set_delay(self, seconds: float) -> None:
        """Deliver every chunk read from now on ``seconds`` later (0 to stop delaying)."""
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
                0 <= seconds <= 3600):
            raise InvalidArgument(f"delay must be 0 to 3600 seconds, got {seconds!r}")
        self._delay = float(seconds)

    def drop(self, *, reset: bool = True) -> int:
        """Reset (``reset=True``: RST) or close (FIN) every open connection; return how many."""
        links = list(self._links)
        for link in links:
            link.abort(reset)
        self.stats.dropped += len(links)
        return len(links)

    def lose_replies(self, count: int = 1) -> None:
        """Swallow the next ``count`` answers from the server, resetting each one's connection.

        The server did the work (an append stored, a settle committed, leases
        granted) but the client never hears of it: the ambiguous outcome that
        idempotent appends and fenced settles exist for.
        """
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise InvalidArgument(f"count must be an integer >= 0, got {count!r}")
        self._lose_replies = count

    def blackhole(self, seconds: float, *, then: AfterBlackhole = "drop",
                  share: float = 1.0, hold_new: bool | None = None) -> asyncio.Task[None]:
        """Hold connections, forwarding nothing, for ``seconds``; then ``drop`` or ``resume`` them.

        With ``share=1`` every connection is held, those accepted meanwhile too
        (the server is cut off). With a smaller share, that fraction of the open
        connections (at least one, chosen at random) is held and every other
        connection, new ones included, passes: a client's pool is half cut off,
        so its requests on held connections arrive late while others go through.
        ``hold_new`` overrides whether connections accepted meanwhile are held
        (``hold_new=False`` with ``share=1``: every open connection goes silent,
        as after a failover or a lost NAT entry, while reconnecting works).
        ``then="drop"`` resets the held connections when the period ends (as a
        partition that outlived the connections would); ``"resume"`` lets their
        held bytes through (the partition heals). Returns the task that ends the
        period; awaiting it is optional. :meth:`pass_traffic` ends it early,
        letting the bytes through.
        """
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
                0 < seconds <= 3600):
            raise InvalidArgument(f"blackhole must last 0 to 3600 seconds, got {seconds!r}")
        if then not in ("drop", "resume"):
            raise InvalidArgument(f"then must be 'drop' or 'resume', got {then!r}")
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise InvalidArgument(f"share must be in (0, 1], got {share!r}")
        self._end_blackhole()
        self.held.clear()
        links = list(self._links)
        if share < 1:
            links = random.sample(links, min(len(links), max(1, round(share * len(links)))))
        self._hold_new = share >= 1 if hold_new is None else hold_new
        for link in links:
            self._hold_link(link)
        self._blackhole = asyncio.get_running_loop().create_task(
            self._hold(float(seconds), then), name="rheo-faults-blackhole")
        return self._blackhole

    @property
    def blackholed(self) -> bool:
        """Whether the proxy holds traffic now."""
        return self._hold_new or bool(self._held)

    def _hold_link(self, link: _Link) -> None:
        link.flowing.clear()
        self._held.add(link)

    async def _hold(self, seconds: float, then: AfterBlackhole) -> None:
        await asyncio.sleep(seconds)  # the length of the partition is the fault itself
        self._blackhole = None
        if then == "drop":
            held = [link for link in self._held if not link.closed.is_set()]
            for link in held:
                link.abort(reset=True)
            self.stats.dropped += len(held)
        self._release()

    def _end_blackhole(self) -> None:
        if self._blackhole is not None:
            self._blackhole.cancel()
            self._blackhole = None
        self._release()

    def _release(self) -> None:
        self._hold_new = False
        held, self._held = self._held, set()
        for link in held:
            link.flowing.set()

    # -- forwarding ------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.accepted += 1
        link = _Link(writer)
        self._links.add(link)
        if self._hold_new:
            self._hold_link(link)
        try:
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT_S):
                    up_reader, up_writer = await asyncio.open_connection(
                        self.target_host, self.target_port)
            except (OSError, TimeoutError):
                self.stats.upstream_failures += 1
                link.abort(reset=True)
                return
            if link.closed.is_set():  # dropped while connecting
                up_writer.transport.abort()
                return
            link.server = up_writer
            loop = asyncio.get_running_loop()
            link.tasks = [loop.create_task(self._pump(reader, up_writer, link, reply=False)),
                          loop.create_task(self._pump(up_reader, writer, link, reply=True))]
            await link.closed.wait()
        finally:
            self._links.discard(link)
            self._held.discard(link)
            link.abort(reset=False)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    link: _Link, *, reply: bool) -> None:
        """Copy one direction: read chunks at once, deliver each when due and flowing.

        ``reply``: the direction from the server to the client.
        """
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            try:
                while True:
                    due, chunk = await queue.get()
                    await link.flowing.wait()
                    wait = due - loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)  # the injected delay itself
                        await link.flowing.wait()
                    if not chunk:
                        break
                    if reply and self._lose_replies > 0:
                        self._lose_replies -= 1
                        self.stats.replies_lost += 1
                        self.stats.dropped += 1
                        link.abort(reset=True)
                        return
                    writer.write(chunk)
                    await writer.drain()
            except OSError:
                link.abort(reset=True)
                return
            # One side finished: close both (PostgreSQL, Redis and MongoDB clients
            # never half-close a connection and go on reading).
            link.abort(reset=False)

        delivering = loop.create_task(deliver())
        try:
            while True:
                try:
                    chunk = await reader.read(_CHUNK)
                except OSError:
                    link.abort(reset=True)
                    return
                if chunk and not link.flowing.is_set():
                    self.held.set()
                queue.put_nowait((loop.time() + self._delay, chunk))
                if not chunk:
                    await delivering
                    return
        finally:
            delivering.cancel()

    def __repr__(self) -> str:
        listening = f"127.0.0.1:{self._port}" if self._server is not None else "not started"
        return (f"FaultProxy({listening} -> {self.target_host}:{self.target_port}, "
                f"connections={len(self._links)})")


def _address(url: str) -> tuple[str, int]:
    """The host and port a backend URL names (the scheme's default port when none)."""
    if not isinstance(url, str) or "://" not in url:
        raise InvalidArgument(f"not a backend URL: {redact_url(str(url))!r}")
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidArgument(f"cannot proxy {scheme!r} URLs; known: {', '.join(DEFAULT_PORTS)}")
    if "," in parts.netloc:
        raise InvalidArgument(f"cannot proxy a URL naming several hosts: {redact_url(url)!r}")
    try:
        port = parts.port or DEFAULT_PORTS[scheme]
    except ValueError:
        raise InvalidArgument(f"invalid port in {redact_url(url)!r}") from None
    return parts.hostname or "127.0.0.1", port
