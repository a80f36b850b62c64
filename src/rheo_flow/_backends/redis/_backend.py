"""The :class:`RedisBackend` class: construction, lifecycle and the operation mixins."""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from ..._backend import Backend
from ..._model._capabilities import Capabilities
from ..._model._errors import BackendError, InvalidArgument
from .._guard import DEFAULT_TIMEOUT_MS, check_timeout_ms, guard_operations, masked_cause
from .._urls import redact_url, url_secrets
from ._ack_fetch import AckFetchOperations
from ._cluster import cluster_client, is_cluster_url
from ._dead_letters import DeadLetterOperations
from ._driver import Client, ExponentialWithJitterBackoff, RedisCluster, aioredis, rex
from ._errors import DRIVER_ERRORS, SentAwareRetry
from ._events import EventOperations
from ._keys import DEFAULT_PREFIX, KeyLayout, check_prefix
from ._lag import LagOperations
from ._pauses import PauseOperations
from ._scripts import ScriptRunner
from ._streams import StreamOperations
from ._wakeups import WakeupOperations, block_cap_ms

__all__ = ["TLS_CONNECT_TIMEOUT_MS", "RedisBackend", "connect_timeout_ms"]

_MIN_VERSION: Final = (6, 2)
_DEADLINE_GRACE_MS: Final = 500
"""The socket timeouts of an owned client fire first; the operation deadline backs them up."""
TLS_CONNECT_TIMEOUT_MS: Final = 3_000
"""The longest connect (TLS handshake included) over ``rediss://``, unless the URL sets
``socket_connect_timeout``: a server without TLS never answers a handshake."""


def connect_timeout_ms(url: str, timeout_ms: int) -> int:
    """The connect timeout of a client built from ``url``: ``timeout_ms``, capped at
    :data:`TLS_CONNECT_TIMEOUT_MS` over TLS."""
    if url.lower().startswith("rediss:"):
        return min(timeout_ms, TLS_CONNECT_TIMEOUT_MS)
    return timeout_ms


@guard_operations(tracks_sending=False)
class RedisBackend(
    StreamOperations, EventOperations, PauseOperations, AckFetchOperations,
    DeadLetterOperations, WakeupOperations, LagOperations, Backend,
):
    """Durable, distributed backend on Redis Streams (Redis 6.2 or later).

    Build it from a URL (``redis://[:password@]host:port/db?prefix=myapp``,
    ``rediss://`` for TLS; ``redis+cluster://host:port[,host:port]/`` for a Redis
    Cluster) or around a host-owned ``redis.asyncio.Redis`` or
    ``redis.asyncio.RedisCluster`` client::

        backend = RedisBackend(client=my_client, prefix="orders")

    A host-owned client is never closed by the backend. ``prefix`` namespaces
    every key (letters, digits and ``_ . -``; no ``:``, so that no prefix is the
    start of another's keys). A client built from a URL is
    owned and closed by :meth:`close`. Both response modes of redis-py
    (``decode_responses`` true or false) work.

    Durability is the server's: run Redis with AOF persistence
    (``appendonly yes``) for acknowledged writes to survive a server restart.
    Every partition carries a marker written when its stream is created, checked
    inside the append and fetch scripts: after the server lost its data (a
    restart without persistence, ``FLUSHDB``) they raise
    :class:`~rheo_flow.StoreLost` instead of numbering events from 1 again.

    ``timeout_ms`` (default 10,000; URL option ``timeout_ms``) is the socket
    and connect timeout of a client built from a URL (unless the URL sets
    ``socket_timeout`` / ``socket_connect_timeout``) and bounds every operation.
    Over TLS (``rediss://``) the connect timeout, TLS handshake included, is at most
    :data:`TLS_CONNECT_TIMEOUT_MS`: a server that does not serve TLS never answers the
    handshake, and a connect that timed out is not tried again.
    """

    name = "redis"
    _CAPABILITIES = Capabilities(
        durable=True, distributed=True, push_wakeups=True, server_clock=True,
        key_ordering=True, last_error=True, pause=True, delayed_delivery=True, retention=True,
    )

    def __init__(
        self,
        client: Client | None = None,
        *,
        url: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        if (client is None) == (url is None):
            raise InvalidArgument("RedisBackend needs exactly one of client= or url=")
        self._timeout_ms = check_timeout_ms(timeout_ms)
        self._deadline_grace_ms = _DEADLINE_GRACE_MS
        self._keys = KeyLayout(check_prefix(prefix))
        self._url = None if url is None else redact_url(url)
        self._secrets = []
        if client is not None:
            self._client = _host_client(client)
            self._owned = False
        elif url is not None:
            self._client = self._owned_client(url)
            self._owned = True
        self._cluster = isinstance(self._client, RedisCluster)
        self._keys.summaries = not self._cluster
        self._scripts = ScriptRunner(self._client, self._translate, self._scrub,
                                     cluster=self._cluster)
        self._block_cap_ms = block_cap_ms(self._client)
        self._init_caches()

    def _owned_client(self, url: str) -> Client:
        """A client built from the URL, its options checked now."""
        try:
            self._secrets = url_secrets(url)
            if is_cluster_url(url):
                return cluster_client(url, self._timeout_ms)
            client = aioredis.Redis.from_url(
                url, socket_timeout=self._timeout_ms / 1000,
                socket_connect_timeout=connect_timeout_ms(url, self._timeout_ms) / 1000,
                # Reconnecting may not outlast the operation timeout.
                retry=SentAwareRetry(ExponentialWithJitterBackoff(
                    base=0.01, cap=min(1.0, self._timeout_ms / 20_000)), 10))
            pool = client.connection_pool
            # An option redis-py does not know fails here, not at the first command.
            pool.connection_class(**pool.connection_kwargs)
        except (ValueError, TypeError, rex.RedisClusterException) as exc:
            raise InvalidArgument(
                f"invalid Redis URL {redact_url(url)!r}: {self._scrub(str(exc))}"
            ) from None
        return client

    @classmethod
    def from_url(cls, url: str, *, prefix: str | None = None) -> RedisBackend:
        """A backend owning a client built from a ``redis://`` or ``rediss://`` URL, or
        a Redis Cluster client from ``redis+cluster://host:port[,host:port...]/``
        (``rediss+cluster://`` for TLS).

        The key prefix is ``prefix``, else the URL's ``prefix`` query parameter,
        else ``"rheo"``; ``timeout_ms`` sets the operation timeout; every other
        query parameter goes to redis-py.
        """
        try:
            parts = urlsplit(url)
            query = parse_qsl(parts.query, keep_blank_values=True)
        except (ValueError, TypeError):
            raise InvalidArgument(f"invalid Redis URL {redact_url(str(url))!r}") from None
        chosen = DEFAULT_PREFIX
        timeout_ms = DEFAULT_TIMEOUT_MS
        rest = []
        for key, value in query:
            if key == "prefix":
                chosen = value
            elif key == "timeout_ms":
                timeout_ms = check_timeout_ms(value)
            else:
                rest.append((key, value))
        clean = urlunsplit(parts._replace(query=urlencode(rest)))
        return cls(url=clean, prefix=chosen if prefix is None else prefix, timeout_ms=timeout_ms)

    @property
    def capabilities(self) -> Capabilities:
        """Durable and distributed, with blocking-read wake-ups, the server's clock and
        key-ordered groups."""
        return self._CAPABILITIES

    @property
    def client(self) -> Client:
        """The redis-py client in use (host-owned or built from the URL)."""
        return self._client

    @property
    def prefix(self) -> str:
        """The key prefix."""
        return self._keys.prefix

    def __repr__(self) -> str:
        where = self._url if self._url is not None else "host client"
        return f"<RedisBackend {where} prefix={self._keys.prefix!r}>"

    async def open(self) -> None:
        """Check that the server answers and is recent enough (6.2+ for ``XTRIM MINID``)."""
        try:
            info = await self._client.info("server")
        except rex.ResponseError:
            # Some managed servers refuse INFO: settle for a PING.
            await self._io(self._client.ping())
            return
        except DRIVER_ERRORS as exc:
            raise self._translate(exc) from masked_cause(exc, self._scrub)
        version = str(info.get("redis_version", "0"))
        numbers = tuple(int(part) for part in re.findall(r"\d+", version)[:2])
        if numbers < _MIN_VERSION:
            raise BackendError(f"the Redis backend needs Redis >= 6.2, the server runs {version}")

    async def close(self) -> None:
        """Close the client when it was built from a URL; a host client stays open.

        Redis consumers this backend created that hold no pending entry are
        deleted from their consumer groups first (best effort).
        """
        try:
            await self._forget_consumers()
        finally:
            if self._owned:
                await self._client.aclose()

    async def server_time_ms(self) -> int:
        """The Redis server's clock in epoch milliseconds (the clock leases use)."""
        seconds, micros = await self._io(self._client.time())
        return int(seconds) * 1000 + int(micros) // 1000

    async def drop_all(self) -> int:
        """Delete every key under this backend's prefix; returns how many were deleted.

        Meant for tests and teardown: it removes all streams, events and groups
        of the prefix.
        """
        deleted = 0
        for pattern in self._keys.patterns():
            batch: list[Any] = []
            async for key in self._client.scan_iter(match=pattern, count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    deleted += await self._io(self._client.unlink(*batch))
                    batch = []
            if batch:
                deleted += await self._io(self._client.unlink(*batch))
        self._partitions.clear()
        self._known_groups.clear()
        self._seen.clear()
        self._consumers, self._tracked = {}, 0
        return deleted


def _host_client(client: object) -> Client:
    if not isinstance(client, aioredis.Redis | RedisCluster):
        raise InvalidArgument(
            "client must be a redis.asyncio.Redis or redis.asyncio.RedisCluster, "
            f"got {type(client).__name__}"
        )
    return client
