"""The Redis Streams backend, on redis-py's asyncio client.

Layout (``P`` is the key prefix, ``s`` a stream, ``p`` a partition, ``g`` a group).
Every key of one partition shares the hash tag ``{P:s:p}``, so a Redis Cluster
can spread partitions over shards and each Lua script stays on one slot:

* ``{P:s:p}:x`` — the Redis stream of the partition. The entry id of the event
  with sequence ``n`` is ``n-0``; the entry holds ``meta`` (JSON ``[id, type,
  key, headers]``), ``data`` (JSON) and ``time`` (append time, server clock).
* ``{P:s:p}:m`` — high water ``hw``, low water ``lw``, last append time ``ts``.
* ``{P:s:p}:i`` — event id -> sequence (idempotent appends).
* ``{P:s:p}:g:<g>`` — the group's frontier ``f``, cursor ``c`` and
  ``max_attempts``; the Redis consumer group ``<g>`` on ``:x`` delivers new
  entries (``XREADGROUP``) and mirrors who holds what in its PEL.
* ``{P:s:p}:g:<g>:d`` — one delivery record per materialised sequence (state,
  attempt, lease id, who settled it); ``:z`` — available and leased deliveries
  by the time they become eligible; ``:r`` — dead letters by sequence. As in
  the reference backend, acked and rejected records stay (they answer a
  repeated settle) until replay, reset or trim removes them.
* ``{P:s:p}:g:<g>:b`` — blocks: the new deliveries of one fetch share one record
  ``first|last|deadline`` under the fetch's token (their lease ids are
  ``<token>:<seq>``, attempt 1) instead of a delivery record and a ``:z`` entry
  each; ``:y`` holds the blocks still to expire, by deadline. Past the frontier
  such a delivery is leased, behind it acked by its block lease: an ack that
  moves the frontier over it writes nothing more. It gets its own record when
  acked out of order, nacked, rejected or renewed, or when its block expires (a
  fetch then writes records for the entries still leased). Replay, reset and
  trim clip or drop the blocks they reach.
* ``P:streams``, ``P:groups:<s>``, ``P:ids:<s>`` — stream and group records, and
  which partition owns an event id (streams with several partitions).

Every fetch, settle batch and renew tick is one round trip: one script per
partition, pipelined, with JSON requests and replies (orjson on this side). A
fetch whose partitions turn out uneven may take a second one to fill its limit;
an append to a multi-partition stream first records which partition owns each
event id. The layout is cluster-ready;
two mechanisms assume one server (or a primary with replicas): appends to
several partitions are one ``MULTI``/``EXEC``, and the wake-up is one ``XREAD``
over every partition of the stream. Lease deadlines, nack delays and append times use the
Redis server's clock (``TIME`` inside the scripts). A fetch finds due work
through the ``:z`` sorted set rather than ``XAUTOCLAIM``, whose single idle
threshold cannot express per-fetch lease times or nack delays; expired
entries are taken over with ``XCLAIM`` so the PEL still shows the holder.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from operator import attrgetter
from typing import Any, Final, TypeVar
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from .._backend import DEFAULT_MAX_ATTEMPTS, AppendRecord, Backend
from .._capabilities import Capabilities
from .._errors import (
    BackendError,
    BackendUnavailable,
    ConflictError,
    InvalidArgument,
    MissingExtra,
    OutcomeUnknown,
    StoreLost,
    UnknownGroup,
    UnknownStream,
)
from .._event import Event, make_event_json
from .._lease import Lease, make_lease
from .._query import Query
from .._settle_results import SettleKind, SettleResult, settle_ok
from .._stream import DeadLetter, GroupInfo, StartPosition, StreamInfo
from .._urls import redact_url, url_secrets
from .._validation import NAME_PATTERN
from ._guard import DEFAULT_TIMEOUT_MS, check_timeout_ms, guard_operations
from ._redis_lua import LOST, SCRIPTS
from ._shared import query_window

try:
    import redis.asyncio as aioredis
    from redis import exceptions as rex
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff
except ImportError:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("Redis", "redis", "redis") from None

__all__ = ["RedisBackend"]

T = TypeVar("T")

DEFAULT_PREFIX: Final = "rheo"
_PREFIX_PATTERN: Final = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_MIN_VERSION: Final = (6, 2)
_TRIM_CHUNK: Final = 5_000
_DEAD_CHUNK: Final = 64
_QUERY_CHUNK: Final = 500
_BLOCK_SLACK_MS: Final = 150
_MAX_TRACKED_CONSUMERS: Final = 10_000
_POLL_S: Final = 0.05
_DEADLINE_GRACE_MS: Final = 500
"""The socket timeouts of an owned client fire first; the operation deadline backs them up."""

# Settle codes returned by the scripts: code -> (kind, reason); "o" and "r" succeed.
_CODES: Final[dict[str, tuple[SettleKind, str]]] = {
    "S": (SettleKind.STALE_LEASE, "the delivery was leased again"),
    "K": (SettleKind.STALE_LEASE, "already settled by ack"),
    "N": (SettleKind.STALE_LEASE, "already settled by nack"),
    "J": (SettleKind.STALE_LEASE, "already settled by reject"),
    "X": (SettleKind.STALE_LEASE, "dead-lettered after max_attempts when its lease expired"),
    "P": (SettleKind.STALE_LEASE, "the delivery was replayed, reset or trimmed"),
    "M": (SettleKind.RECEIPT_MISMATCH, "receipt does not match the lease"),
    "I": (SettleKind.INVALID, "lease names no group of this backend"),
    "Q": (SettleKind.INVALID, "lease names no delivery of this backend"),
}
_OK: Final = SettleResult.success
_NOT_A_LEASE: Final = "lease names no group of this backend"
_MAX_VALID_KEYS: Final = 4096
# What a settle sends per lease (the attempt lets the script recognise a current lease
# by one string compare), what a renew sends, and where a lease points.
_SETTLE_ROW: Final = attrgetter("event.sequence", "receipt", "lease_id", "attempt")
_RENEW_ROW: Final = attrgetter("event.sequence", "receipt", "lease_id", "consumer_id")
_KEY: Final = attrgetter("event.stream", "group", "event.partition")


@guard_operations(tracks_sending=False)
class RedisBackend(Backend):
    """Durable, distributed backend on Redis Streams (Redis 6.2 or later).

    Build it from a URL (``redis://[:password@]host:port/db?prefix=myapp``,
    ``rediss://`` for TLS) or around a host-owned ``redis.asyncio.Redis``
    client::

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
    """

    name = "redis"
    _CAPABILITIES = Capabilities(
        durable=True, distributed=True, push_wakeups=True, server_clock=True,
    )

    def __init__(
        self,
        client: aioredis.Redis | None = None,
        *,
        url: str | None = None,
        prefix: str = DEFAULT_PREFIX,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        if (client is None) == (url is None):
            raise InvalidArgument("RedisBackend needs exactly one of client= or url=")
        self._timeout_ms = check_timeout_ms(timeout_ms)
        self._deadline_grace_ms = _DEADLINE_GRACE_MS
        if not isinstance(prefix, str) or not _PREFIX_PATTERN.match(prefix):
            raise InvalidArgument(
                f"invalid Redis key prefix {prefix!r}: use 1-64 characters of "
                "A-Z a-z 0-9 _ . -"
            )
        self._url = None if url is None else redact_url(url)
        self._secrets: list[str] = []
        if client is not None:
            if not isinstance(client, aioredis.Redis):
                raise InvalidArgument(
                    f"client must be a redis.asyncio.Redis, got {type(client).__name__}"
                )
            self._client = client
            self._owned = False
        else:
            assert url is not None
            try:
                self._secrets = url_secrets(url)
                self._client = aioredis.Redis.from_url(
                    url, socket_timeout=self._timeout_ms / 1000,
                    socket_connect_timeout=self._timeout_ms / 1000,
                    # Reconnecting may not outlast the operation timeout.
                    retry=_SentAwareRetry(ExponentialWithJitterBackoff(
                        base=0.01, cap=min(1.0, self._timeout_ms / 20_000)), 10))
                pool = self._client.connection_pool
                # An option redis-py does not know fails here, not at the first command.
                pool.connection_class(**pool.connection_kwargs)
            except (ValueError, TypeError) as exc:
                raise InvalidArgument(
                    f"invalid Redis URL {redact_url(url)!r}: {self._scrub(str(exc))}"
                ) from None
            self._owned = True
        self._prefix = prefix
        self._shas = {name: hashlib.sha1(text.encode()).hexdigest()
                      for name, text in SCRIPTS.items()}
        self._partitions: dict[str, int] = {}
        self._known_groups: set[tuple[str, str]] = set()
        self._rotation: dict[tuple[str, str], int] = {}
        self._seen: dict[str, list[int]] = {}
        self._stale: dict[str, set[int]] = {}
        self._keys: dict[tuple[str, str, int], tuple[str, ...]] = {}
        # (stream, group, partition) of settled leases -> whether it can name a delivery.
        self._valid_keys: dict[tuple[Any, Any, Any], bool] = {}
        self._block_cap_ms: int | None = None
        timeout = self._client.connection_pool.connection_kwargs.get("socket_timeout")
        if isinstance(timeout, int | float) and timeout > 0:
            # Blocking reads must return before the client's socket timeout fires, and
            # Redis ends a block up to 1/hz late (100 ms by default).
            self._block_cap_ms = int(timeout * 1000) - _BLOCK_SLACK_MS
        self._consumers: dict[tuple[str, str], set[str]] = {}
        self._tracked = 0

    @classmethod
    def from_url(cls, url: str, *, prefix: str | None = None) -> RedisBackend:
        """A backend owning a client built from a ``redis://`` or ``rediss://`` URL.

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
        """Durable and distributed, with blocking-read wake-ups and the server's clock."""
        return self._CAPABILITIES

    @property
    def client(self) -> aioredis.Redis:
        """The redis-py client in use (host-owned or built from the URL)."""
        return self._client

    @property
    def prefix(self) -> str:
        """The key prefix."""
        return self._prefix

    def __repr__(self) -> str:
        where = self._url if self._url is not None else "host client"
        return f"<RedisBackend {where} prefix={self._prefix!r}>"

    async def open(self) -> None:
        """Check that the server answers and is recent enough (6.2+ for ``XTRIM MINID``)."""
        try:
            info = await self._client.info("server")
        except rex.ResponseError:
            # Some managed servers refuse INFO: settle for a PING.
            await self._io(self._client.ping())
            return
        except (rex.RedisError, OSError) as exc:
            raise self._translate(exc) from None
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

    async def _forget_consumers(self) -> None:
        used, self._consumers, self._tracked = self._consumers, {}, 0
        calls: list[tuple[str, list[str], list[str]]] = []
        for (stream, group), names in used.items():
            count = self._partitions.get(stream, 0)
            ordered = sorted(names)
            for start in range(0, len(ordered), 500):
                chunk = ordered[start:start + 500]
                calls.extend(("forget_consumers", [self._pkeys(stream, p)[0]], [group, *chunk])
                             for p in range(count))
        with contextlib.suppress(BackendError):
            await self._eval(calls)

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
        for pattern in (f"{self._prefix}:*", f"{{{self._prefix}:*"):
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

    # Errors ------------------------------------------------------------------

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        """Map redis-py exceptions: unreachable -> backend_unavailable, lost
        mid-request or timed out -> ambiguous, script or command errors -> failed."""
        return _classify(exc)

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _error_prefix(self) -> str:
        return f"Redis at {self._url}" if self._url else "Redis"

    def _translate(self, exc: BaseException) -> BackendError:
        kind = _classify(exc) or SettleKind.FAILED
        message = self._scrub(f"{self._error_prefix()}: {type(exc).__name__}: {exc}")
        if kind is SettleKind.BACKEND_UNAVAILABLE:
            return BackendUnavailable(message)
        if kind is SettleKind.AMBIGUOUS:
            return OutcomeUnknown(message)
        return BackendError(message, kind.value)

    def _lost(self, stream: str) -> StoreLost:
        return StoreLost(
            f"{self._error_prefix()}: stream {stream!r} is gone from the server: it lost "
            "its data (a restart without persistence, or FLUSHDB / FLUSHALL). Nothing was "
            "written; recreate the stream once the cause is understood", stream)

    async def _io(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except (rex.RedisError, OSError) as exc:
            raise self._translate(exc) from None

    # Keys and scripts -------------------------------------------------------

    def _tag(self, stream: str, partition: int) -> str:
        return f"{{{self._prefix}:{stream}:{partition}}}"

    def _pkeys(self, stream: str, partition: int) -> tuple[str, ...]:
        key = (stream, "", partition)
        keys = self._keys.get(key)
        if keys is None:
            tag = self._tag(stream, partition)
            keys = self._keys[key] = (f"{tag}:x", f"{tag}:m", f"{tag}:i")
        return keys

    def _gkeys(self, stream: str, group: str, partition: int) -> tuple[str, ...]:
        key = (stream, group, partition)
        keys = self._keys.get(key)
        if keys is None:
            tag = self._tag(stream, partition)
            base = f"{tag}:g:{group}"
            keys = self._keys[key] = (f"{tag}:x", f"{tag}:m", base, f"{base}:d",
                                      f"{base}:z", f"{base}:r", f"{base}:b", f"{base}:y")
        return keys

    def _streams_key(self) -> str:
        return f"{self._prefix}:streams"

    def _groups_key(self, stream: str) -> str:
        return f"{self._prefix}:groups:{stream}"

    def _ids_key(self, stream: str) -> str:
        return f"{self._prefix}:ids:{stream}"

    async def _eval(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]], *,
        transaction: bool = False,
    ) -> list[Any]:
        """Run scripts ``(name, keys, args)`` in one round trip; their replies in order.

        Scripts run by ``EVALSHA``. One the server does not know (first use,
        restart, ``SCRIPT FLUSH`` at any moment, even between two calls of one
        pipeline) did not run: those calls run again by ``EVAL``, which carries
        the script's source (so no flush can race the retry) and caches it for
        the next ``EVALSHA``.
        """
        if not calls:
            return []
        if len(calls) == 1 and not transaction:
            name, keys, args = calls[0]
            try:
                return [await self._client.evalsha(self._shas[name], len(keys), *keys, *args)]
            except rex.NoScriptError:
                pass
            except (rex.RedisError, OSError) as exc:
                raise self._translate(exc) from None
            return [await self._io(self._client.eval(SCRIPTS[name], len(keys), *keys, *args))]
        results = await self._pipeline(calls, transaction, by_source=False)
        missing = [i for i, r in enumerate(results) if _no_script(r)]
        if missing:
            again = await self._pipeline([calls[i] for i in missing], transaction,
                                         by_source=True)
            for i, result in zip(missing, again, strict=True):
                results[i] = result
        for result in results:
            if isinstance(result, BaseException):
                raise self._translate(result)
        return results

    async def _pipeline(
        self, calls: Sequence[tuple[str, Sequence[str], Sequence[Any]]], transaction: bool,
        *, by_source: bool,
    ) -> list[Any]:
        """One round trip; an error reply stays in its place in the list."""
        pipe = self._client.pipeline(transaction=transaction)
        shas = self._shas
        if by_source:
            for name, keys, args in calls:
                pipe.eval(SCRIPTS[name], len(keys), *keys, *args)
        else:
            for name, keys, args in calls:
                pipe.evalsha(shas[name], len(keys), *keys, *args)
        try:
            return list(await pipe.execute(raise_on_error=False))
        except rex.NoScriptError as exc:
            # A transaction the server refused as a whole: nothing in it ran.
            return [exc] * len(calls)
        except rex.ExecAbortError as exc:
            if "NOSCRIPT" in str(exc) or "No matching script" in str(exc):
                return [rex.NoScriptError(str(exc))] * len(calls)
            raise self._translate(exc) from None
        except (rex.RedisError, OSError) as exc:
            raise self._translate(exc) from None

    # Streams -----------------------------------------------------------------

    async def _partition_count(self, stream: str) -> int:
        count = self._partitions.get(stream)
        if count is None:
            count, _ = await self._stream_record(stream)
        return count

    async def _stream_record(self, stream: str) -> tuple[int, int]:
        """(partitions, created_ms) of a stream, its partitions marked as present."""
        record = await self._io(self._client.hget(self._streams_key(), stream))
        if record is None:
            if stream in self._partitions:
                raise self._lost(stream)
            raise UnknownStream(stream)
        count, created = (int(v) for v in _text(record).split("|"))
        if stream not in self._partitions:
            # Streams created before the markers existed get theirs now, while their
            # record shows they exist.
            await self._mark(stream, count, created)
            self._partitions[stream] = count
        return count, created

    async def _mark(self, stream: str, count: int, created: int) -> None:
        """Write the presence marker of every partition (see the append script)."""
        pipe = self._client.pipeline(transaction=False)
        for p in range(count):
            pipe.hsetnx(self._pkeys(stream, p)[1], "mk", created)
        await self._io(pipe.execute())

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        [record] = await self._eval([("create_stream", [self._streams_key()],
                                      [name, partitions])])
        count, created = (int(v) for v in _text(record).split("|"))
        if count != partitions:
            raise ConflictError(
                f"stream {name!r} exists with {count} partitions, not {partitions}"
            )
        await self._mark(name, count, created)
        self._partitions[name] = count
        return await self._info(name, count, created)

    async def stream_info(self, name: str) -> StreamInfo:
        count, created = await self._stream_record(name)
        return await self._info(name, count, created)

    async def _info(self, name: str, count: int, created: int) -> StreamInfo:
        pipe = self._client.pipeline(transaction=False)
        for p in range(count):
            pipe.hmget(self._pkeys(name, p)[1], "hw", "lw")
        rows = await self._io(pipe.execute())
        high = {p: int(row[0] or 0) for p, row in enumerate(rows)}
        low = {p: int(row[1] or 1) for p, row in enumerate(rows)}
        return StreamInfo(name, count, created, high, low)

    async def list_streams(self) -> list[str]:
        names = await self._io(self._client.hkeys(self._streams_key()))
        return sorted(_text(n) for n in names)

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        count = await self._partition_count(stream)
        if not records:
            return []
        dumps = orjson.dumps
        # Encoded before anything is written: a string no store can hold fails here.
        metas = [dumps((r.id, r.type, r.key, r.headers if type(r.headers) is dict
                        else dict(r.headers))).decode() for r in records]
        targets = [r.partition for r in records]
        if count > 1:
            # An id is owned by the partition it was first appended to, even when a
            # retry routes it elsewhere (no key, another key, another partition).
            payload = orjson.dumps([[r.id, r.partition] for r in records])
            [owners] = await self._eval([("claim_ids", [self._ids_key(stream)], [payload])])
            targets = [int(p) for p in _text(owners).split(",")]
        by_partition: dict[int, list[int]] = {}
        for index, partition in enumerate(targets):
            by_partition.setdefault(partition, []).append(index)
        calls = []
        for partition, indexes in by_partition.items():
            rows = [(records[i].id, metas[i], records[i].data_json) for i in indexes]
            calls.append(("append", self._pkeys(stream, partition), [dumps(rows)]))
        replies = await self._eval(calls, transaction=len(calls) > 1)
        if any(reply == LOST or reply == b"LOST" for reply in replies):
            raise self._lost(stream)
        loads = orjson.loads
        if len(calls) == 1 and len(by_partition[targets[0]]) == len(records):
            [reply] = replies
            [(partition, _)] = by_partition.items()
            return self._appended(stream, partition, records, loads(reply))
        events: list[Event | None] = [None] * len(records)
        for (partition, indexes), reply in zip(by_partition.items(), replies, strict=True):
            built = self._appended(stream, partition, [records[i] for i in indexes],
                                   loads(reply))
            for index, event in zip(indexes, built, strict=True):
                events[index] = event
        return [e for e in events if e is not None]

    @staticmethod
    def _appended(
        stream: str, partition: int, records: Sequence[AppendRecord], reply: list[Any]
    ) -> list[Event]:
        """The events of one partition's append reply ``[time, items]`` (see _redis_lua)."""
        at, items = reply
        out: list[Event] = []
        add = out.append
        built: dict[int, Event] = {}
        for r, item in zip(records, items, strict=True):
            if type(item) is int:
                event = built.get(item)
                if event is None:
                    headers = r.headers
                    event = built[item] = make_event_json(
                        stream, partition, item, r.id, r.type, r.data_json, r.key,
                        dict(headers) if headers else {}, at)
            else:
                seq, stored_at, meta, data = item
                event = make_event_json(stream, partition, seq, meta[0], meta[1], data, meta[2],
                                        meta[3], stored_at)
            add(event)
        return out

    # Groups ------------------------------------------------------------------

    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None
    ) -> GroupInfo:
        count = await self._partition_count(stream)
        [record] = await self._eval([(
            "group_record", [self._groups_key(stream)],
            [group, "" if max_attempts is None else max_attempts, DEFAULT_MAX_ATTEMPTS,
             str(start)],
        )])
        ma, created, spec = _text(record).split("|", 2)
        # Every creator initialises every partition from the winner's start position,
        # so a racing creator never returns before the group exists everywhere.
        await self._eval([
            ("init_group", self._gkeys(stream, group, p)[:3], [group, spec, ma])
            for p in range(count)
        ])
        self._known_groups.add((stream, group))
        return GroupInfo(stream, group, int(ma), int(created))

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        await self._partition_count(stream)
        record = await self._io(self._client.hget(self._groups_key(stream), group))
        if record is None:
            raise UnknownGroup(stream, group)
        ma, created, _ = _text(record).split("|", 2)
        return GroupInfo(stream, group, int(ma), int(created))

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        await self._partition_count(stream)
        records = await self._io(self._client.hgetall(self._groups_key(stream)))
        out = []
        for name, record in records.items():
            ma, created, _ = _text(record).split("|", 2)
            out.append(GroupInfo(stream, _text(name), int(ma), int(created)))
        return sorted(out, key=lambda g: g.group)

    # Deletion ----------------------------------------------------------------

    async def delete_stream(self, stream: str) -> None:
        count, _ = await self._stream_record(stream)
        groups = [_text(g) for g in await self._io(self._client.hkeys(self._groups_key(stream)))]
        keys = [self._groups_key(stream), self._ids_key(stream)]
        for p in range(count):
            keys.extend(self._pkeys(stream, p))
            for group in groups:
                keys.extend(self._gkeys(stream, group, p)[2:])
        # One MULTI/EXEC (one server, as for appends to several partitions): no
        # reader sees a stream record whose partitions are gone.
        pipe = self._client.pipeline(transaction=True)
        pipe.unlink(*keys)
        pipe.hdel(self._streams_key(), stream)
        await self._io(pipe.execute())
        self._forget(stream, None)

    async def delete_group(self, stream: str, group: str) -> None:
        count = await self._require_group(stream, group)
        pipe = self._client.pipeline(transaction=True)
        for p in range(count):
            keys = self._gkeys(stream, group, p)
            pipe.xgroup_destroy(keys[0], group)
            pipe.unlink(*keys[2:])
        pipe.hdel(self._groups_key(stream), group)
        await self._io(pipe.execute())
        self._forget(stream, group)

    def _forget(self, stream: str, group: str | None) -> None:
        """Drop what this backend caches of a deleted stream (``group=None``) or group."""
        if group is None:
            self._partitions.pop(stream, None)
            self._seen.pop(stream, None)
            self._stale.pop(stream, None)
        def gone(cache: Iterable[tuple[Any, ...]]) -> list[Any]:
            return [k for k in cache if k[0] == stream and (group is None or k[1] == group)]

        self._known_groups.difference_update(gone(self._known_groups))
        for key in gone(self._consumers):
            self._tracked -= len(self._consumers.pop(key))
        for cache in (self._keys, self._valid_keys, self._rotation):
            for key in gone(cache):
                del cache[key]

    async def _require_group(self, stream: str, group: str) -> int:
        count = await self._partition_count(stream)
        if (stream, group) not in self._known_groups:
            exists = await self._io(self._client.hexists(self._groups_key(stream), group))
            if not exists:
                raise UnknownGroup(stream, group)
            self._known_groups.add((stream, group))
        return count

    # Leases ------------------------------------------------------------------

    async def fetch(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        limit: int,
        lease_ms: int,
        partitions: Sequence[int] | None,
    ) -> list[Lease]:
        count = await self._partition_count(stream)
        ids = list(range(count)) if partitions is None else list(partitions)
        if not ids:
            return []
        names = self._consumers.setdefault((stream, group), set())
        if consumer_id not in names and self._tracked < _MAX_TRACKED_CONSUMERS:
            names.add(consumer_id)
            self._tracked += 1
        if len(ids) > 1:
            # Start with another partition each time so no partition is always last.
            turn = self._rotation.get((stream, group), 0) + 1
            self._rotation[(stream, group)] = turn
            shift = turn % len(ids)
            ids = ids[shift:] + ids[:shift]
        per: dict[int, list[Lease]] = {}
        left: dict[int, int] = {}
        quotas = [limit // len(ids) + (1 if i < limit % len(ids) else 0)
                  for i in range(len(ids))]
        await self._fetch_round(stream, group, consumer_id, lease_ms,
                                list(zip(ids, quotas, strict=True)), per, left)
        got = sum(len(v) for v in per.values())
        if got < limit and len(ids) > 1:
            more = [p for p in ids if left.get(p, 0) > 0]
            if more:
                shares = _fill(limit - got, [left[p] for p in more])
                second = [(p, q) for p, q in zip(more, shares, strict=True) if q > 0]
                await self._fetch_round(stream, group, consumer_id, lease_ms, second, per, left)
                # A partition's second round may hold redeliveries below its first
                # round's (each round takes the earliest due): keep sequence order.
                for p, _ in second:
                    per.get(p, []).sort(key=_sequence_of)
        lists = [per[p] for p in ids if per.get(p)]
        if len(lists) <= 1:
            return lists[0] if lists else []
        # Round-robin across partitions, each in sequence order.
        out: list[Lease] = []
        for depth in range(max(len(x) for x in lists)):
            for leases in lists:
                if depth < len(leases):
                    out.append(leases[depth])
        return out

    async def _fetch_round(
        self,
        stream: str,
        group: str,
        consumer_id: str,
        lease_ms: int,
        quotas: Sequence[tuple[int, int]],
        per: dict[int, list[Lease]],
        left: dict[int, int],
    ) -> None:
        token = os.urandom(8).hex()
        calls = [
            ("fetch", self._gkeys(stream, group, p),
             [group, consumer_id, quota, lease_ms, f"{token}.{p}.", f"{token}.{p}"])
            for p, quota in quotas
        ]
        replies = await self._eval(calls)
        seen = self._seen_for(stream)
        stale = self._stale.get(stream)
        loads = orjson.loads
        for (p, _), reply in zip(quotas, replies, strict=True):
            if reply == b"NOGROUP" or reply == "NOGROUP":
                raise UnknownGroup(stream, group)
            if reply == b"LOST" or reply == LOST:
                raise self._lost(stream)
            if reply == b"AGAIN" or reply == "AGAIN":
                # A resent call that had already run: its leases went unanswered and
                # expire; fetch again for this partition.
                left[p] = 1
                continue
            high, remaining, deadline, redelivered, items = loads(reply[0])
            left[p] = remaining
            if high > seen[p]:
                seen[p] = high
            if stale:
                stale.discard(p)
            if not items:
                continue
            prefix = f"{token}.{p}."
            block = f"{token}.{p}:"
            leases = per.setdefault(p, [])
            add = leases.append
            # Items are [seq, attempt, time, [id, type, key, headers]], their data's JSON
            # text follows in the reply: the redelivered ones first, then the new ones
            # (one block, see _redis_lua). The data is decoded when first read.
            for n, ((seq, attempt, at, meta), data) in enumerate(
                    zip(items, reply[1:], strict=True), 1):
                add(make_lease(
                    f"{prefix}{n}" if n <= redelivered else f"{block}{seq}", f"{seq}-0",
                    group, consumer_id,
                    make_event_json(stream, p, seq, meta[0], meta[1], data, meta[2], meta[3], at),
                    attempt, deadline))

    def _buckets(
        self, leases: Sequence[Lease], results: list[SettleResult | None]
    ) -> dict[tuple[str, str, int], list[int]]:
        """Lease indexes by the partition they point at; ``results`` gets ``invalid``
        for every lease that cannot name a delivery of this backend."""
        buckets: dict[tuple[str, str, int], list[int]] = {}
        valid = self._valid_keys
        for index, lease in enumerate(leases):
            try:
                event = lease.event
                key = (event.stream, lease.group, event.partition)
                ok = valid.get(key)
                if ok is None:
                    ok = _lease_key_ok(key)
                    if len(valid) >= _MAX_VALID_KEYS:
                        valid.clear()
                    valid[key] = ok
                seq = event.sequence
                # True == 1 as a dict key: the cached answer may be for another type.
                ok = (ok and type(key[2]) is int and type(seq) is int and seq >= 0
                      and type(lease.lease_id) is str and type(lease.receipt) is str)
            except (AttributeError, TypeError):
                ok = False
            if ok:
                bucket = buckets.get(key)
                if bucket is None:
                    bucket = buckets[key] = []
                bucket.append(index)
            else:
                results[index] = SettleResult.failure(
                    getattr(lease, "lease_id", ""), SettleKind.INVALID, _NOT_A_LEASE)
        return buckets

    def _one_bucket(
        self, leases: Sequence[Lease], row: Callable[[Lease], tuple[Any, ...]]
    ) -> tuple[tuple[str, str, int], list[tuple[Any, ...]]] | None:
        """The common batch: well-formed leases of one group partition, with their rows."""
        try:
            keys = list(map(_KEY, leases))
            rows = list(map(row, leases))
        except AttributeError:
            return None
        key = keys[0]
        if keys.count(key) != len(keys):
            return None
        try:
            ok = self._valid_keys.get(key)
        except TypeError:
            return None
        if ok is None:
            return None
        # True == 1: the cached answer may be for another type of partition.
        if not (ok and type(key[2]) is int and all(
                type(seq) is int and seq >= 0 and type(receipt) is str and type(lid) is str
                for seq, receipt, lid, _ in rows)):
            return None
        return key, rows

    async def _settle(
        self,
        leases: Sequence[Lease],
        script: str,
        args: Callable[[str, bytes], list[Any]],
        row: Callable[[Lease], tuple[Any, ...]],
        run: bool = False,
    ) -> tuple[list[SettleResult | None], list[tuple[list[int], str]]]:
        results: list[SettleResult | None] = [None] * len(leases)
        dumps = orjson.dumps
        one = self._one_bucket(leases, row)
        if one is not None:
            (stream, group, partition), rows = one
            buckets = {one[0]: list(range(len(leases)))}
            request = args(group, dumps(rows))
            if run:
                request.extend(_run_form(rows))
            calls = [(script, self._gkeys(stream, group, partition), request)]
        else:
            buckets = self._buckets(leases, results)
            calls = [
                (script, self._gkeys(stream, group, partition),
                 args(group, dumps([row(leases[i]) for i in indexes])))
                for (stream, group, partition), indexes in buckets.items()
            ]
        replies = await self._eval(calls)
        return results, [(indexes, _text(reply))
                         for indexes, reply in zip(buckets.values(), replies, strict=True)]

    async def _settle_op(
        self, leases: Sequence[Lease], op: str, reason: str, delay_ms: int
    ) -> list[SettleResult]:
        if not leases:
            return []
        results, replies = await self._settle(
            leases, "settle",
            lambda group, payload: [group, op, reason, delay_ms, payload],
            _SETTLE_ROW, run=op == "a",
        )
        if len(replies) == 1 and len(replies[0][0]) == len(leases):
            indexes, codes = replies[0]
            if codes.count("o") == len(codes):
                return [settle_ok(lease.lease_id) for lease in leases]
        for indexes, codes in replies:
            for index, code in zip(indexes, codes, strict=True):
                results[index] = _result(leases[index].lease_id, code)
        return [r for r in results if r is not None]

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return await self._settle_op(leases, "a", "", 0)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return await self._settle_op(leases, "n", _with_error(reason, error), delay_ms)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return await self._settle_op(leases, "r", _with_error(reason, error), 0)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        if not leases:
            return []
        results, replies = await self._settle(
            leases, "renew",
            lambda group, payload: [group, lease_ms, payload],
            _RENEW_ROW,
        )
        for indexes, reply in replies:
            deadline_text, codes = reply.split(":", 1)
            deadline = int(deadline_text)
            for index, code in zip(indexes, codes, strict=True):
                lease_id = leases[index].lease_id
                results[index] = (SettleResult.success(lease_id, deadline_ms=deadline)
                                  if code == "o" else _result(lease_id, code))
        return [r for r in results if r is not None]

    # Progress ----------------------------------------------------------------

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        count = await self._partition_count(stream)
        pipe = self._client.pipeline(transaction=False)
        pipe.hexists(self._groups_key(stream), group)
        for p in range(count):
            pipe.hget(self._gkeys(stream, group, p)[2], "f")
        exists, *values = await self._io(pipe.execute())
        if not exists:
            raise UnknownGroup(stream, group)
        return {p: int(v or 0) for p, v in enumerate(values)}

    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        count = await self._require_group(stream, group)
        first = 0 if after is None else after[0]
        out: list[DeadLetter] = []
        pids = list(range(max(0, first), count))
        for start in range(0, len(pids), _DEAD_CHUNK):
            chunk = pids[start:start + _DEAD_CHUNK]
            calls = []
            for p in chunk:
                x, _, _, d, _, r, _, _ = self._gkeys(stream, group, p)
                since = after[1] if after is not None and p == after[0] else 0
                calls.append(("dead_letters", [x, d, r], [since, limit - len(out)]))
            for p, reply in zip(chunk, await self._eval(calls), strict=True):
                for seq, attempts, at, reason, meta, error in json.loads(reply):
                    out.append(DeadLetter(stream, group, p, seq, meta[0], attempts, reason,
                                          int(at), error))
                    if len(out) >= limit:
                        return out
        return out

    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        count = await self._require_group(stream, group)
        wanted: dict[int, list[int]] = {}
        if positions is None:
            arg: dict[int, str] = dict.fromkeys(range(count), "all")
        else:
            for p, seq in positions:
                if 0 <= p < count:
                    wanted.setdefault(p, []).append(seq)
            arg = {p: json.dumps(seqs) for p, seqs in wanted.items()}
        calls = [("redrive", self._gkeys(stream, group, p)[2:], [value])
                 for p, value in arg.items()]
        replies = await self._eval(calls)
        if any(int(r) < 0 for r in replies):
            raise UnknownGroup(stream, group)
        return sum(int(r) for r in replies)

    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        await self._require_group(stream, group)
        await self._group_scripts("replay", stream, group, partitions, str(from_sequence))

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        await self._require_group(stream, group)
        await self._group_scripts("reset", stream, group, partitions, str(to))

    async def _group_scripts(
        self, script: str, stream: str, group: str, partitions: Sequence[int], arg: str
    ) -> None:
        calls = [(script, self._gkeys(stream, group, p), [group, arg]) for p in partitions]
        for reply in await self._eval(calls):
            if _text(reply) == "NOGROUP":
                raise UnknownGroup(stream, group)

    # Reads and retention -----------------------------------------------------

    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        stream = query.stream
        count = await self._partition_count(stream)
        pids = range(count) if query.partitions is None else sorted(query.partitions)
        out: list[Event] = []
        for pid in pids:
            window = query_window(query, pid, after, 1, None)
            if window is None:
                continue
            lo, hi = window
            key = self._pkeys(stream, pid)[0]
            low = f"{lo}-0"
            high = "+" if hi is None else f"{hi}-0"
            while True:
                size = min(_QUERY_CHUNK, max(limit - len(out), 50))
                entries: Any = await self._io(
                    self._client.xrange(key, low, high, count=size))
                for entry_id, fields in entries:
                    event = _entry_event(stream, pid, entry_id, fields)
                    if query.until_ms is not None and event.appended_at_ms >= query.until_ms:
                        # Append times never decrease within a partition.
                        entries = []
                        break
                    if _matches(query, event):
                        out.append(event)
                        if len(out) >= limit:
                            return out
                if len(entries) < size:
                    break
                low = f"({_text(entries[-1][0])}"
        return out

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        count = await self._partition_count(stream)
        groups = [g.group for g in await self.list_groups(stream)]
        removed: dict[int, int] = {}
        for partition, bound in up_to.items():
            keys = list(self._pkeys(stream, partition))
            for group in groups:
                keys.extend(self._gkeys(stream, group, partition)[2:])
            total = 0
            while True:
                [reply] = await self._eval([(
                    "trim", keys,
                    [bound, _TRIM_CHUNK, "1" if count > 1 else "0", *groups],
                )])
                done, more, ids = json.loads(reply)
                total += done
                if ids:
                    await self._io(self._client.hdel(self._ids_key(stream), *ids))
                if not more:
                    break
            removed[partition] = total
        return removed

    # Wake-ups ----------------------------------------------------------------

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

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Block on ``XREAD`` over every partition of the stream, past the high water
        the last fetch saw; True as soon as something was appended after it."""
        count = await self._partition_count(stream)
        seen = self._seen_for(stream)
        stale = self._stale.setdefault(stream, set())
        unknown = sorted({p for p in range(count) if seen[p] < 0} | stale)
        if unknown:
            # No fetch covered these partitions since the last wake-up: wait past now.
            pipe = self._client.pipeline(transaction=False)
            for p in unknown:
                pipe.hget(self._pkeys(stream, p)[1], "hw")
            for p, value in zip(unknown, await self._io(pipe.execute()), strict=True):
                seen[p] = max(seen[p], int(value or 0))
            stale.difference_update(unknown)
        keys = {self._pkeys(stream, p)[0]: p for p in range(count)}
        loop = asyncio.get_running_loop()
        end = loop.time() + max(0.0, timeout)
        while True:
            remaining = end - loop.time()
            if remaining <= 0:
                return False
            # Rounded up: a wait never ends before its timeout.
            remaining_ms = math.ceil(remaining * 1000)
            streams: dict[Any, Any] = {key: f"{seen[p]}-0" for key, p in keys.items()}
            cap = self._block_cap_ms
            if cap is not None and cap < 10:
                # The client's socket timeout leaves no room for a blocking read: poll.
                reply = await self._io(self._client.xread(streams, count=1))
                if not reply:
                    await asyncio.sleep(min(_POLL_S, remaining))
                    continue
            else:
                block = remaining_ms if cap is None else min(remaining_ms, cap)
                reply = await self._io(self._client.xread(streams, count=1, block=block))
            if reply:
                # Only the first new entry was read: unless a fetch covers these
                # partitions first, the next wait starts past their high water.
                for key in _woken_keys(reply):
                    stale.add(keys[_text(key)])
                return True


# Helpers ---------------------------------------------------------------------


class _SentAwareRetry(Retry):
    """redis-py's retry of commands that lost their connection, except that a command
    whose first attempt may have reached the server is never reported as not sent
    because a later attempt could not reconnect (that would read as "nothing was
    written" for an append that may be stored)."""

    async def call_with_retry(
        self, do: Callable[[], Awaitable[T]], fail: Callable[..., Any],
        is_retryable: Callable[[Exception], bool] | None = None,
        with_failure_count: bool = False,
    ) -> T:
        sent = False

        async def failed(error: Exception, *count: int) -> Any:
            nonlocal sent
            if _classify(error) is not SettleKind.BACKEND_UNAVAILABLE:
                sent = True
            return await fail(error, *count)

        try:
            return await super().call_with_retry(do, failed, is_retryable, with_failure_count)
        except (rex.ConnectionError, rex.TimeoutError) as exc:
            if sent and _classify(exc) is SettleKind.BACKEND_UNAVAILABLE:
                raise rex.ConnectionError(
                    "the connection was lost after the request was sent, and reconnecting "
                    f"failed ({type(exc).__name__})") from exc
            raise


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _run_form(rows: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The run form of settle rows ``(seq, receipt, lease_id, attempt)`` (see the settle
    script): ``[token, first, last]`` when the leases are the block leases
    ``<token>:<seq>`` of consecutive sequences with receipts ``<seq>-0``, else empty."""
    first = rows[0][0]
    last = rows[-1][0]
    if last - first + 1 != len(rows):
        return []
    token, colon, tail = rows[0][2].rpartition(":")
    if not colon or tail != str(first):
        return []
    seqs = range(first, last + 1)
    if ([r[1] for r in rows] != [f"{n}-0" for n in seqs]
            or [r[2] for r in rows] != [f"{token}:{n}" for n in seqs]):
        return []
    return [token, first, last]


def _no_script(result: Any) -> bool:
    """Whether a pipelined reply says the script was not in the server's cache."""
    return isinstance(result, rex.NoScriptError) or (
        isinstance(result, rex.ResponseError) and str(result).startswith("NOSCRIPT"))


def _lease_key_ok(key: tuple[Any, Any, Any]) -> bool:
    """Whether (stream, group, partition) can name a delivery of this backend."""
    stream, group, partition = key
    return (type(stream) is str and NAME_PATTERN.match(stream) is not None
            and type(group) is str and NAME_PATTERN.match(group) is not None
            and type(partition) is int and partition >= 0)


def _result(lease_id: str, code: str) -> SettleResult:
    if code == "o":
        return settle_ok(lease_id)
    if code == "r":
        return _OK(lease_id, repeated=True)
    kind, reason = _CODES.get(code, (SettleKind.FAILED, f"unexpected reply {code!r}"))
    return SettleResult.failure(lease_id, kind, reason)


def _fill(total: int, capacity: Sequence[int]) -> list[int]:
    """Share ``total`` round-robin over slots of the given capacities."""
    shares = [0] * len(capacity)
    active = [i for i, c in enumerate(capacity) if c > 0]
    while total > 0 and active:
        step = max(1, total // len(active))
        still = []
        for i in active:
            if total == 0:
                break
            give = min(step, capacity[i] - shares[i], total)
            shares[i] += give
            total -= give
            if shares[i] < capacity[i]:
                still.append(i)
        active = still
    return shares


def _entry_event(stream: str, partition: int, entry_id: Any, fields: Mapping[Any, Any]
                 ) -> Event:
    values = {_text(k): v for k, v in fields.items()}
    meta = json.loads(values["meta"])
    seq = int(_text(entry_id).split("-", 1)[0])
    return Event(stream, partition, seq, meta[0], meta[1], json.loads(values["data"]), meta[2],
                 meta[3], int(values["time"]))


def _woken_keys(reply: Any) -> list[Any]:
    """The stream keys an ``XREAD`` reply has entries for (RESP2 list or RESP3 map)."""
    if isinstance(reply, dict):
        return list(reply)
    return [item[0] for item in reply]


def _matches(q: Query, e: Event) -> bool:
    if q.key is not None and e.key != q.key:
        return False
    if q.type is not None and e.type != q.type:
        return False
    if q.since_ms is not None and e.appended_at_ms < q.since_ms:
        return False
    return not (q.until_ms is not None and e.appended_at_ms >= q.until_ms)


def _classify(exc: BaseException) -> SettleKind | None:
    """The settle kind of a redis-py (or socket) exception; None when not recognised."""
    if isinstance(exc, BackendError):
        return SettleKind(exc.kind)
    if isinstance(exc, rex.AuthenticationError | rex.BusyLoadingError):
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, rex.ConnectionError | rex.TimeoutError):
        text = str(exc)
        if "connecting to" in text or "Timeout connecting" in text or isinstance(
                exc.__context__, ConnectionRefusedError):
            return SettleKind.BACKEND_UNAVAILABLE
        # The request may have run before the connection went away.
        return SettleKind.AMBIGUOUS
    if isinstance(exc, rex.ReadOnlyError):
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, rex.DataError):
        return SettleKind.INVALID
    if isinstance(exc, rex.RedisError):
        return SettleKind.FAILED
    if isinstance(exc, ConnectionRefusedError):
        return SettleKind.BACKEND_UNAVAILABLE
    if isinstance(exc, TimeoutError | ConnectionError):
        return SettleKind.AMBIGUOUS
    return None


def _with_error(reason: str, error: str | None) -> str:
    """The settle script's reason argument: the reason, then NUL and the error to record."""
    return reason if error is None else f"{reason}\0{error}"


def _sequence_of(lease: Lease) -> int:
    return lease.event.sequence
