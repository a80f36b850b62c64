"""The :class:`MongoBackend` class: construction, capabilities, and its operations combined.

The operations live in mixins by concern (``_streams``, ``_append``, ``_claim`` and
``_claim_keyed``, ``_settle``, ``_progress``, ``_retention``), all on :class:`~._core.MongoCore`;
this module builds the backend, reports what the server offers and waits for
appends.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

from ..._backend import Backend
from ..._model._capabilities import Capabilities
from ..._model._errors import InvalidArgument
from ..._model._settle_results import SettleKind
from ..._support._clock import Clock, system_clock
from .._guard import DEFAULT_TIMEOUT_MS, check_timeout_ms, guard_operations
from .._shared import Rotation, Waiters
from ._append import AppendOps
from ._claim_keyed import KeyedFetchOps
from ._client import check_client, check_url, database_name, split_url_options
from ._errors import classify
from ._lag import LagOps
from ._pauses import PauseOps
from ._progress import ProgressOps
from ._retention import RetentionOps
from ._schema import DEFAULT_PREFIX, check_prefix
from ._settle import SettleOps
from ._streams import StreamOps
from ._watcher import Watcher

__all__ = ["MongoBackend"]

_DEADLINE_GRACE_MS: Final = 500
"""PyMongo's own timeouts fire first (it knows whether it sent); the deadline backs them up."""


@guard_operations(tracks_sending=False)
class MongoBackend(
    StreamOps, AppendOps, KeyedFetchOps, SettleOps, ProgressOps, RetentionOps, PauseOps, LagOps,
    Backend,
):
    """Durable, distributed backend on MongoDB (``mongodb://host/database``).

    An event is one document, and MongoDB stores none over 16 MiB of BSON; BSON can
    be several times larger than the JSON of the same data (an array's elements
    carry their indexes as keys), so an event's data is bounded at 4 MiB of JSON.

    Build it from a URL (the backend then owns its ``AsyncMongoClient`` and closes
    it) or around a host's client: a PyMongo ``AsyncMongoClient`` or a Motor
    ``AsyncIOMotorClient`` (never closed by the backend)::

        MongoBackend("mongodb://db.example/rheo")
        MongoBackend(client=AsyncMongoClient(...), database="rheo")

    The database comes from ``database``, else from the URL's path (or the host
    client's default database), else ``"rheo"``. Collection names start with
    ``collection_prefix``, so several applications can share a database.

    :meth:`open` connects, creates the collections' indexes and probes the
    server: transactions (replica set or sharded cluster) make appends atomic
    batches, and change streams (same condition) give push wake-ups. Pass
    ``transactions=False`` or ``change_streams=False`` to never use them;
    :attr:`capabilities` reports the outcome from :meth:`open` on.

    Lease deadlines use ``clock`` (epoch milliseconds, the client's clock by
    default; tests pass a :class:`~rheo_flow.ManualClock`), so competing
    processes need reasonably synchronised clocks, as with any lease.

    ``timeout_ms`` (default 10,000; URL option ``timeout_ms``) bounds every
    operation; a client built from a URL also uses it as its server selection,
    connect and socket timeouts unless the URL sets those.
    """

    max_event_bytes_ceiling = 4 * 1_048_576

    name = "mongodb"

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        database: str | None = None,
        collection_prefix: str = DEFAULT_PREFIX,
        clock: Clock | None = None,
        transactions: bool | None = None,
        change_streams: bool | None = None,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        if (url is None) == (client is None):
            raise InvalidArgument("MongoBackend needs exactly one of a URL or a client")
        self._timeout_ms = check_timeout_ms(timeout_ms)
        self._deadline_grace_ms = _DEADLINE_GRACE_MS
        if url is not None:
            check_url(url)
        else:
            check_client(client)
        check_prefix(collection_prefix)
        for flag, value in (("transactions", transactions), ("change_streams", change_streams)):
            if value is not None and not isinstance(value, bool):
                raise InvalidArgument(f"{flag} must be True, False or None (probe), got {value!r}")
        self._url = url
        self._client = client
        self._owns_client = client is None
        self._database_name = database_name(database, url)
        self._prefix = collection_prefix
        self._clock = clock or system_clock
        self._want_transactions = transactions
        self._want_change_streams = change_streams
        self._init_state()

    def _init_state(self) -> None:
        """The state of a backend not yet opened."""
        self._capabilities = Capabilities(
            durable=True, distributed=True, push_wakeups=False, skip_locked=True,
            key_ordering=True, last_error=True, pause=True, retention=True,
            delayed_delivery=True,
        )
        self._transactions = False
        self._opened = False
        self._open_lock = asyncio.Lock()
        self._rotation = Rotation()
        self._append_locks = {}
        self._waiters = Waiters()
        self._watcher = Watcher(self._waiters, self._where)
        self._db = self._streams = self._partitions = self._events = None
        self._groups = self._deliveries = self._meta = None

    @classmethod
    def from_url(cls, url: str, *, clock: Clock | None = None) -> MongoBackend:
        """Build from ``mongodb://[user:password@]host[:port][/database][?options]``.

        The database defaults to ``rheo``. ``collection_prefix=...`` in the query
        string sets the collection prefix; every other option goes to PyMongo.
        """
        driver_url, ours = split_url_options(url)
        return cls(
            driver_url,
            collection_prefix=ours.get("collection_prefix", DEFAULT_PREFIX),
            clock=clock,
            timeout_ms=check_timeout_ms(ours.get("timeout_ms", str(DEFAULT_TIMEOUT_MS))),
        )

    @property
    def capabilities(self) -> Capabilities:
        """Durable, distributed, fenced, key-ordered groups; push wake-ups when the server
        has change streams.

        Before :meth:`open` this is the conservative declaration (no push wake-ups);
        key ordering holds either way (:meth:`open`, which every operation runs first,
        creates the index that key-ordered fetches use).
        """
        return self._capabilities

    @property
    def database_name(self) -> str | None:
        """The database holding the collections (known from :meth:`open` on)."""
        return self._database_name

    @property
    def collection_prefix(self) -> str:
        """The prefix of every collection name of this backend."""
        return self._prefix

    @property
    def transactions(self) -> bool:
        """Whether appends run in multi-document transactions (decided at :meth:`open`)."""
        return self._transactions

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        """Map PyMongo errors (Motor raises the same) to settle kinds (see ``_errors.classify``).

        Nothing sent (no server, credentials refused, client closed, not primary):
        ``backend_unavailable``; possibly applied (network error or timeout during
        the operation, write concern, unknown commit result, interrupted):
        ``ambiguous``; anything else the server refused: ``failed``.
        """
        return classify(exc)

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Wait for an append to ``stream`` (from any process, via a change stream).

        Without change streams (``capabilities.push_wakeups`` false) this sleeps
        ``timeout`` seconds and returns False, like any polling backend.
        """
        await self._ready()
        if not self._capabilities.push_wakeups:
            return await super().wait_for_append(stream, timeout)
        self._watcher.ensure(self._events, f"rheo-mongo-watch-{self._database_name}")
        return await self._waiters.wait(stream, timeout)
