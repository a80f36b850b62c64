"""What every group of Redis backend operations shares: the client, the key layout,
the script runner, error translation and the caches of what this process knows.

:class:`RedisCore` is the base of the operation mixins that make up
:class:`~rheo_flow._backends.redis.RedisBackend`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, Final, TypeVar

from ..._model._errors import BackendError, StoreLost, UnknownGroup, UnknownStream
from ..._model._event import Event, pending_json
from ..._model._settle_results import SettleKind
from ..._model._stream import Retention
from .._guard import masked_cause
from .._issued_runs import IssuedRuns
from .._shared import Rotation
from ._codec import block_token, stream_record, stream_retention, text
from ._driver import Client
from ._errors import DRIVER_ERRORS, classify, store_lost, translate
from ._keys import KeyLayout
from ._scripts import ScriptCall, ScriptRunner

__all__ = ["RedisCore"]

T = TypeVar("T")
_BLOB_MARKS: Final = ("\0", b"\0")
"""What the data field of a large event's entry starts with, as text or as bytes."""
_MARK_LENGTH: Final = 17
"""The length of that field: the mark, then a 16-character token."""


class RedisCore:
    """The state and helpers the Redis backend's operations share."""

    _client: Client
    _cluster: bool
    """Whether the client is a ``RedisCluster`` (no multi-slot transaction or read)."""
    _keys: KeyLayout
    _scripts: ScriptRunner
    _url: str | None
    """The redacted URL of an owned client (None for a host client)."""
    _secrets: list[str]
    """What must never appear in an error message (the URL's password)."""
    _partitions: dict[str, int]
    """Partition counts of the streams known to exist."""
    _known_groups: set[tuple[str, str]]
    _rotation: Rotation[tuple[str, str]]
    """Per (stream, group), where the next fetch starts its round of partitions."""
    _seen: dict[str, list[int]]
    _stale: dict[str, set[int]]
    _valid_keys: dict[tuple[Any, Any, Any], bool]
    """(stream, group, partition) of settled leases -> whether it can name a delivery."""
    _cursors: dict[tuple[str, str, int], int]
    """(stream, group, partition) -> where this backend's last fetch left the group's
    cursor: the next fetch reads the entries past it in the same round trip."""
    _issued: IssuedRuns
    """The blocks this backend's fetches leased: an ack of a run of one of them sends
    its run form at once (see ``_settle``)."""
    _swept: dict[tuple[str, str], float]
    """(stream, group) -> when (``time.monotonic``) this backend's fetch last visited every
    partition of the stream, keeping the summaries exact (see ``_fetch``)."""
    _busy: dict[tuple[str, str], list[tuple[int, int]]]
    """(stream, group) -> the partitions whose new deliveries the last summary fetch took,
    with how many: the next one reads as many of theirs in the same round trip."""
    _consumers: dict[tuple[str, str], set[str]]
    """The Redis consumers fetches created, per (stream, group); ``_tracked`` counts them."""
    _tracked: int
    _released: dict[str, asyncio.Event]
    """Per stream, set when a settle made a delivery due that was waiting for its key
    (a wake-up of this backend's next or current wait for the stream)."""

    def _init_caches(self) -> None:
        self._partitions = {}
        self._known_groups = set()
        self._rotation = Rotation()
        self._seen = {}
        self._stale = {}
        self._valid_keys = {}
        self._cursors = {}
        self._issued = IssuedRuns(block_token)
        self._swept = {}
        self._busy = {}
        self._consumers = {}
        self._tracked = 0
        self._released = {}

    def _released_for(self, stream: str) -> asyncio.Event:
        """The stream's wake-up for deliveries a settle made due (see ``_released``)."""
        event = self._released.get(stream)
        if event is None:
            event = self._released[stream] = asyncio.Event()
        return event

    # Errors ------------------------------------------------------------------

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        """Map redis-py exceptions: unreachable -> backend_unavailable, lost
        mid-request or timed out -> ambiguous, script or command errors -> failed."""
        return classify(exc)

    def _scrub(self, message: str) -> str:
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return message

    def _error_prefix(self) -> str:
        return f"Redis at {self._url}" if self._url else "Redis"

    def _translate(self, exc: BaseException) -> BackendError:
        return translate(exc, self._error_prefix(), self._scrub)

    def _lost(self, stream: str) -> StoreLost:
        return store_lost(self._error_prefix(), stream)

    async def now_ms(self) -> int:
        """The server's clock (``TIME``), the clock its scripts stamp and lease with."""
        seconds, micros = await self._io(self._client.time())
        return int(seconds) * 1000 + int(micros) // 1000

    async def _io(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except DRIVER_ERRORS as exc:
            raise self._translate(exc) from masked_cause(exc, self._scrub)

    async def _eval(self, calls: Sequence[ScriptCall], *, transaction: bool = False
                    ) -> list[Any]:
        """Run scripts ``(name, keys, args)`` in one round trip; their replies in order."""
        return await self._scripts.run(calls, transaction=transaction)

    async def _fill_blobs(self, stream: str, events: Iterable[Event]) -> None:
        """Fill in the data of the large events stored apart from their entries
        (standalone Redis; ``append_many.lua``): one ``MGET`` when there are any."""
        if not self._keys.summaries:
            return
        waiting: list[Any] = []
        keys: list[str] = []
        for event in events:
            pending = pending_json(event)
            if pending is not None and len(pending.text) == _MARK_LENGTH and (
                    pending.text[:1] in _BLOB_MARKS):
                waiting.append(pending)
                keys.append(f"{self._keys.tag(stream, event.partition)}:b:"
                            f"{text(pending.text[1:])}")
        if not keys:
            return
        for pending, value in zip(waiting, await self._io(self._client.mget(keys)),
                                  strict=True):
            if value is not None:
                pending.text = value

    # Streams and groups ------------------------------------------------------

    async def _partition_count(self, stream: str) -> int:
        count = self._partitions.get(stream)
        if count is None:
            count, _ = await self._stream_record(stream)
        return count

    async def _stream_record(self, stream: str) -> tuple[int, int]:
        """(partitions, created_ms) of a stream, its partitions marked as present."""
        count, created, _ = await self._stream_record_with_retention(stream)
        return count, created

    async def _stream_record_with_retention(self, stream: str
                                            ) -> tuple[int, int, Retention | None]:
        """:meth:`_stream_record` with the stream's retention policy."""
        record = await self._io(self._client.hget(self._keys.streams, stream))
        if record is None:
            if stream in self._partitions:
                raise self._lost(stream)
            raise UnknownStream(stream)
        count, created = stream_record(record)
        if stream not in self._partitions:
            # Streams created before the markers existed get theirs now, while their
            # record shows they exist.
            await self._mark(stream, count, created)
            self._partitions[stream] = count
        return count, created, stream_retention(record)

    async def _mark(self, stream: str, count: int, created: int) -> None:
        """Write the presence marker of every partition (see ``append.lua``)."""
        pipe = self._client.pipeline(transaction=False)
        for p in range(count):
            pipe.hsetnx(self._keys.partition(stream, p).meta, "mk", created)
        await self._io(pipe.execute())

    async def _require_group(self, stream: str, group: str) -> int:
        """The stream's partition count, once the group is known to exist."""
        count = await self._partition_count(stream)
        if (stream, group) not in self._known_groups:
            exists = await self._io(self._client.hexists(self._keys.groups(stream), group))
            if not exists:
                raise UnknownGroup(stream, group)
            self._known_groups.add((stream, group))
        return count

    async def _group_names(self, stream: str) -> list[str]:
        """The names of the stream's groups, sorted."""
        names = await self._io(self._client.hkeys(self._keys.groups(stream)))
        return sorted(text(n) for n in names)

    def _seen_for(self, stream: str) -> list[int]:
        """Per partition, the high water a wake-up waits past (-1: not known yet).

        Only a fetch sets it for the partitions it covered: an append after that
        fetch must wake the waiter, so nothing else may move it past such events.
        """
        count = self._partitions[stream]
        seen = self._seen.get(stream)
        if seen is None or len(seen) != count:
            seen = self._seen[stream] = [-1] * count
        return seen

    def _forget(self, stream: str, group: str | None) -> None:
        """Drop what this backend caches of a deleted stream (``group=None``) or group."""
        if group is None:
            self._partitions.pop(stream, None)
            self._seen.pop(stream, None)
            self._stale.pop(stream, None)
            self._released.pop(stream, None)

        def gone(cache: Iterable[tuple[Any, ...]]) -> list[Any]:
            return [k for k in cache if k[0] == stream and (group is None or k[1] == group)]

        self._known_groups.difference_update(gone(self._known_groups))
        for key in gone(self._consumers):
            self._tracked -= len(self._consumers.pop(key))
        for group_key in gone(self._rotation.groups()):
            self._rotation.forget(group_key)
        for cache in (self._keys.cache, self._keys.partition_cache, self._keys.script_cache,
                      self._valid_keys, self._cursors, self._swept, self._busy):
            for key in gone(cache):
                del cache[key]
