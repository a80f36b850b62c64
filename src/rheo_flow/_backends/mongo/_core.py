"""What every part of the MongoDB backend shares: its state, its lifecycle, the common reads.

:class:`MongoCore` is the base of the operation mixins (``_streams``, ``_append``,
``_claim``, ``_settle``, ``_progress``, ``_retention``) that
:class:`~rheo_flow._backends.mongo.MongoBackend` combines: it opens and closes the
connection, names the collections, and reads streams, partitions, groups and
events the way all operations need them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from ..._model._capabilities import Capabilities
from ..._model._errors import UnknownGroup, UnknownStream
from ..._model._event import Event
from ..._support._clock import Clock
from .._shared import Rotation, Waiters
from .._urls import redact_url, scrub_secrets
from ._client import DEFAULT_DATABASE, greet, make_client, resolve, supports_transactions
from ._documents import Group, event_id, event_of, partition_id
from ._schema import check_schema, create_indexes
from ._watcher import Watcher, probe_change_streams

__all__ = ["MongoCore"]


class MongoCore:
    """The backend's connection, collections and the reads every operation makes.

    Set up by :class:`~rheo_flow._backends.mongo.MongoBackend`'s constructor; the
    collections are bound by :meth:`open` (or :meth:`drop_all`).
    """

    _url: str | None
    """The URL the client is built from; ``None`` with a host client."""
    _client: Any
    _owns_client: bool
    _database_name: str | None
    _prefix: str
    _clock: Clock
    _timeout_ms: int
    _want_transactions: bool | None
    _want_change_streams: bool | None
    _capabilities: Capabilities
    _transactions: bool
    _opened: bool
    _open_lock: asyncio.Lock
    _rotation: Rotation[Any]
    """Per group id: where the next fetch starts its round of partitions."""
    _append_locks: dict[str, asyncio.Lock]
    _waiters: Waiters
    _watcher: Watcher
    _db: Any
    _streams: Any
    _partitions: Any
    _events: Any
    _groups: Any
    _deliveries: Any
    _meta: Any

    # Naming the server in errors ----------------------------------------------

    def _error_prefix(self) -> str:
        return f"MongoDB at {self._where()}"

    def _where(self) -> str:
        if self._url is not None:
            return redact_url(self._url)
        return f"the {type(self._client).__name__} given as client"

    def _scrub(self, text: str) -> str:
        """``text`` without the URL's password, should a driver message quote it."""
        return scrub_secrets(text, self._url)

    # Lifecycle ---------------------------------------------------------------

    async def open(self) -> None:
        """Connect, create the indexes and probe transactions and change streams. Idempotent."""
        async with self._open_lock:
            if self._opened:
                return
            created = self._client is None
            if created:
                self._client = self._make_client()
            self._bind()
            try:
                await self._prepare()
            except BaseException:
                if created:
                    client, self._client = self._client, None
                    with contextlib.suppress(Exception):
                        await resolve(client.close())
                raise
            self._opened = True

    def _make_client(self) -> Any:
        if self._url is None:  # built on a host's client, which close() leaves in place
            raise RuntimeError("a MongoBackend built on a client makes no client of its own")
        return make_client(self._url, self._timeout_ms, self._scrub)

    def _bind(self) -> None:
        """Name the database and the collections (no I/O)."""
        client = self._client
        if self._database_name is None:
            self._database_name = client.get_default_database(DEFAULT_DATABASE).name
        db = client.get_database(self._database_name)
        self._db = db
        self._streams = db[f"{self._prefix}streams"]
        self._partitions = db[f"{self._prefix}partitions"]
        self._events = db[f"{self._prefix}events"]
        self._groups = db[f"{self._prefix}groups"]
        self._deliveries = db[f"{self._prefix}deliveries"]
        self._meta = db[f"{self._prefix}meta"]

    async def _prepare(self) -> None:
        hello = await greet(self._db, self._where(), self._scrub)
        await check_schema(self._meta, f"{self._prefix}* in {self._database_name!r}")
        await create_indexes(self._events, self._groups, self._deliveries)
        probe = supports_transactions(hello)
        self._transactions = probe if self._want_transactions is None else (
            self._want_transactions and probe
        )
        push = False
        if self._want_change_streams is not False:
            push = await probe_change_streams(self._events, self._where())
        self._capabilities = Capabilities(
            durable=True, distributed=True, push_wakeups=push, skip_locked=True,
            key_ordering=True, last_error=True, pause=True, retention=True,
            delayed_delivery=True,
        )

    async def close(self) -> None:
        """Stop the change-stream watcher and close the client if the backend created it."""
        async with self._open_lock:
            await self._watcher.stop()
            # Waiters return (as if woken) rather than see a cancellation that is not theirs.
            self._waiters.wake_all()
            self._opened = False
            if self._owns_client and self._client is not None:
                client, self._client = self._client, None
                await resolve(client.close())

    async def drop_all(self) -> None:
        """Drop every collection of this backend (those named with its prefix), then close it.

        Irreversible; meant for tests and tear-downs. Opening the backend again
        recreates empty collections.
        """
        async with self._open_lock:
            # Not open(): a store this version refuses (newer schema) can still be dropped.
            if self._client is None:
                self._client = self._make_client()
            self._bind()
            for collection in (self._streams, self._partitions, self._events, self._groups,
                               self._deliveries, self._meta):
                await collection.drop()
        await self.close()

    async def _ready(self) -> None:
        if not self._opened:
            await self.open()

    # Shared reads ------------------------------------------------------------

    async def _stream_doc(self, name: str) -> dict[str, Any]:
        doc: dict[str, Any] | None = await self._streams.find_one({"_id": name})
        if doc is None:
            raise UnknownStream(name)
        return doc

    async def _waters(
        self, stream: str, partitions: Sequence[int], session: Any = None
    ) -> dict[int, tuple[int, int]]:
        """(high, low) water per partition; a partition without a document is empty."""
        ids = [partition_id(stream, p) for p in partitions]
        waters = dict.fromkeys(partitions, (0, 1))
        if not ids:
            return waters
        query = {"_id": ids[0]} if len(ids) == 1 else {"_id": {"$in": ids}}
        # One reply for them all: a first batch holds 101 documents unless told more,
        # and a limit lets the server close the cursor with it.
        async for doc in self._partitions.find(query, {"p": 1, "hw": 1, "lw": 1},
                                               session=session, limit=len(ids),
                                               batch_size=len(ids)):
            waters[doc["p"]] = (doc["hw"], doc["lw"])
        return waters

    async def _highs(
        self, stream: str, partitions: Sequence[int], session: Any = None
    ) -> dict[int, int]:
        """The high water (last sequence appended) per partition."""
        waters = await self._waters(stream, partitions, session)
        return {p: high for p, (high, _) in waters.items()}

    async def _group(self, stream: str, group: str, *, whole: bool = True) -> Group:
        """The group; without its per-partition entries unless ``whole`` (a fetch reads
        those of the partitions it visits: :meth:`_group_parts`)."""
        doc = await self._groups.find_one({"s": stream, "n": group},
                                          None if whole else {"parts": 0})
        if doc is None:
            await self._stream_doc(stream)
            raise UnknownGroup(stream, group)
        return Group.of(doc)

    async def _group_parts(self, g: Group, partitions: Sequence[int]) -> Group:
        """``g`` read again with the entries of ``partitions`` (the range they span)."""
        first, last = min(partitions), max(partitions)
        doc = await self._groups.find_one(
            {"_id": g.id}, {"parts": {"$slice": [first, last - first + 1]}})
        if doc is None:
            raise UnknownGroup(g.stream, g.name)
        return Group.of(doc, first)

    async def _load_events(
        self, stream: str, positions: list[tuple[int, int]]
    ) -> dict[tuple[int, int], Event]:
        ids = [event_id(stream, p, seq) for p, seq in positions]
        docs = await self._events.find({"_id": {"$in": ids}}).to_list(None)
        return {(d["p"], d["n"]): event_of(d) for d in docs}
