"""The PostgreSQL backend, on asyncpg: durable, shared by any number of processes.

Consumer-group state lives in tables of one schema (see
:mod:`rheo_flow._backends._postgres_sql` for the layout). The hot operations are
each ONE round trip to a server-side function:

* ``fetch`` claims eligible deliveries with ``FOR UPDATE SKIP LOCKED`` (expired
  leases with attempt + 1, or dead-lettered past ``max_attempts``), then
  materialises new deliveries past the group's cursor, in round-robin order
  across partitions and sequence order within each;
* ``ack`` / ``nack`` / ``reject`` / ``renew`` take the whole batch as arrays; a
  delivery changes only while it is still leased under the very lease (and
  receipt) that settles it, and settles that finish deliveries move the stored
  contiguous frontier forward in the same call;
* ``append`` is one statement that numbers the events gaplessly under the
  partition row lock and sends one ``NOTIFY`` for the whole batch.

Lease deadlines and append times come from the database clock. Idle consumers
are woken by ``LISTEN`` on a dedicated connection; when that connection cannot
be had, :meth:`wait_for_append` falls back to sleeping (polling).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson

from .._backend import DEFAULT_MAX_ATTEMPTS, AppendRecord, Backend
from .._capabilities import Capabilities
from .._errors import (
    BackendError,
    ConflictError,
    InvalidArgument,
    UnknownGroup,
    UnknownStream,
)
from .._event import Event, decode_json, make_event_json
from .._lease import Lease, make_lease
from .._query import Query
from .._settle_results import SettleKind, SettleResult, settle_ok
from .._stream import DeadLetter, GroupInfo, StartPosition, StreamInfo
from .._urls import check_hosts, redact_url, require_driver, unreachable, url_flag
from ._guard import DEFAULT_TIMEOUT_MS, check_timeout_ms, guard_operations, mark_sent
from ._postgres_sql import (
    BOOTSTRAP,
    MIGRATIONS,
    NOW_MS,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    VERSION_TABLE,
    render,
)
from ._shared import Waiters, query_window

if TYPE_CHECKING:
    import asyncpg

__all__ = ["DEFAULT_SCHEMA", "PostgresBackend", "migrate"]

log = logging.getLogger("rheo_flow.postgres")

DEFAULT_SCHEMA: Final = "rheo_flow"
"""The schema used when neither the URL nor the constructor names one."""
_URL_OPTIONS: Final = ("schema", "pool_min_size", "pool_max_size", "listen", "migrate",
                       "timeout_ms")
_NIL_UUID: Final = "00000000000000000000000000000000"
_LEASE_ID: Final = re.compile(r"[0-9a-f]{32}")
_LEASE_IDS: Final = re.compile(r"(?:[0-9a-f]{32},)+")
"""Lease ids joined and followed by commas: a whole batch checked by one match."""
_MAX_SEQ: Final = 2**63 - 1
_MAX_ATTEMPT: Final = 10**9
"""Receipts name attempts of at most 9 digits."""
_MAX_INT: Final = 2**31 - 1
_LISTEN_RETRY_S: Final = 5.0
"""After a failed LISTEN connection, poll for this long before trying again."""
_APPEND_RETRIES: Final = 5

Op = Literal["ack", "nack", "reject"]
_OP_CODES: Final[dict[Op, int]] = {"ack": 1, "nack": 2, "reject": 3}
_OP_NAMES: Final[dict[int | None, str]] = {
    1: "ack", 2: "nack", 3: "reject", None: "expiry past max_attempts",
}


@dataclass(frozen=True, slots=True)
class _StreamMeta:
    id: int
    partitions: int
    created_at_ms: int


# A settle or renew batch travels as five array literals (text the server
# parses), not as arrays asyncpg encodes element by element: every element is
# an integer or a validated 32-digit hex lease id, so the literals need no quoting.
def _batch_arrays(first: int) -> str:
    """The five batch parameters from ``$first`` on, each cast from its literal."""
    types = ("integer", "integer", "bigint", "uuid", "integer")
    return ", ".join(f"${first + i}::text::{t}[]" for i, t in enumerate(types))


@dataclass(frozen=True, slots=True)
class _Statements:
    """Every statement, rendered once for the backend's schema."""

    append: str
    fetch: str
    settle: str
    renew: str
    stream: str
    group: str
    groups_by_name: str

    @classmethod
    def for_schema(cls, schema: str) -> _Statements:
        def r(sql: str) -> str:
            return render(sql, schema)

        return cls(
            append=r(_APPEND_SQL),
            fetch=r("SELECT * FROM {s}.fetch($1, $2, $3, $4, $5)"),
            settle=r(f"SELECT * FROM {{s}}.settle($1, {_batch_arrays(2)}, $7, $8, $9)"),
            renew=r(f"SELECT * FROM {{s}}.renew({_batch_arrays(1)}, $6)"),
            stream=r("SELECT id, partitions, created_at_ms FROM {s}.streams WHERE name = $1"),
            group=r(
                "SELECT g.id, g.max_attempts, g.created_at_ms FROM {s}.groups g "
                "WHERE g.stream_id = $1 AND g.name = $2"
            ),
            groups_by_name=r(
                "SELECT u.stream, u.grp, g.id, s.partitions, s.id, s.created_at_ms "
                "FROM unnest($1::text[], $2::text[]) AS u(stream, grp) "
                "JOIN {s}.streams s ON s.name = u.stream "
                "JOIN {s}.groups g ON g.stream_id = s.id AND g.name = u.grp"
            ),
        )


# Numbers new events under the partition row locks (taken in partition order),
# inserts them, moves the high water, and sends ONE notification. The batch
# travels as a few texts, not as arrays asyncpg encodes element by element:
# partitions as an array literal, ids, types and keys as JSON arrays of
# strings, and the events' data as one JSON array of their JSON texts (each
# element reaches the table exactly as encoded); headers, rarely set, as an
# array of JSON texts. A duplicate event id makes the insert fail as a whole:
# the caller then separates the ids already stored and appends the rest (see
# PostgresBackend.append).
_APPEND_SQL: Final = """
WITH r AS (
    SELECT * FROM ROWS FROM (unnest($2::text::integer[]), json_array_elements_text($3::json),
                             json_array_elements_text($4::json),
                             json_array_elements_text($5::json), json_array_elements($6::json),
                             unnest($7::text[]))
        WITH ORDINALITY AS r(part, event_id, type, key, data, headers, idx)
), t AS (
    SELECT """ + NOW_MS + """ AS ms
), locked AS (
    SELECT p.part, p.high_water FROM {s}.partitions p
    WHERE p.stream_id = $1 AND p.part IN (SELECT DISTINCT r.part FROM r)
    ORDER BY p.part
    FOR UPDATE
), numbered AS (
    SELECT r.idx, r.part, r.event_id, r.type, r.key, r.data, r.headers,
           l.high_water + row_number() OVER (PARTITION BY r.part ORDER BY r.idx) AS seq
    FROM r JOIN locked l ON l.part = r.part
), inserted AS (
    INSERT INTO {s}.events (stream_id, part, seq, appended_at_ms, event_id, type, key, data,
                            headers)
    SELECT $1, n.part, n.seq, t.ms, n.event_id, n.type, n.key, n.data, n.headers::json
    FROM numbered n CROSS JOIN t
), moved AS (
    UPDATE {s}.partitions p SET high_water = m.top
    FROM (SELECT n.part, max(n.seq) AS top FROM numbered n GROUP BY n.part) m
    WHERE p.stream_id = $1 AND p.part = m.part
)
SELECT (SELECT t.ms FROM t) AS appended_at_ms,
       (SELECT array_agg(n.seq ORDER BY n.idx) FROM numbered n) AS seqs,
       (SELECT pg_notify($8, $9)) AS notified
"""

_EVENT_COLUMNS: Final = "part, seq, event_id, type, key, data::text, headers::text, appended_at_ms"


def _channel(schema: str) -> str:
    return f"rheo_flow.{schema}"


def _check_schema(schema: object) -> str:
    if not isinstance(schema, str) or not SCHEMA_NAME.fullmatch(schema):
        raise InvalidArgument(
            f"invalid PostgreSQL schema name {schema!r}: use 1-48 characters of "
            "A-Z a-z 0-9 _ starting with a letter or underscore"
        )
    return schema


def _check_size(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InvalidArgument(f"{name} must be an integer >= {minimum}, got {value!r}")
    return value


def _driver() -> Any:
    require_driver("PostgreSQL", "postgres", "asyncpg")
    import asyncpg

    return asyncpg


class _Pool:
    """The asyncpg pool as operations use it.

    Each call marks its request as sent once it holds a connection (see
    :func:`~rheo_flow._backends._guard.mark_sent`), and a call cancelled mid-way
    (the operation timeout, or its caller) terminates its connection: asyncpg
    would otherwise cancel the statement over a new connection and hold the old
    one until the server confirms, which never happens while the network stalls.
    """

    __slots__ = ("_pool",)

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        """A pooled connection for several statements."""
        pool = self._pool
        conn = await pool.acquire()
        mark_sent()
        try:
            yield conn
        except asyncio.CancelledError:
            conn.terminate()
            raise
        finally:
            await pool.release(conn)

    async def fetch(self, sql: str, *args: Any) -> list[Any]:
        """``Connection.fetch`` on a pooled connection."""
        rows: list[Any] = await self._call("fetch", sql, args)
        return rows

    async def fetchrow(self, sql: str, *args: Any) -> Any:
        """``Connection.fetchrow`` on a pooled connection."""
        return await self._call("fetchrow", sql, args)

    async def fetchval(self, sql: str, *args: Any) -> Any:
        """``Connection.fetchval`` on a pooled connection."""
        return await self._call("fetchval", sql, args)

    async def _call(self, method: str, sql: str, args: tuple[Any, ...]) -> Any:
        pool = self._pool
        conn = await pool.acquire()
        mark_sent()
        try:
            return await getattr(conn, method)(sql, *args)
        except asyncio.CancelledError:
            conn.terminate()
            raise
        finally:
            await pool.release(conn)


@guard_operations(tracks_sending=True)
class PostgresBackend(Backend):
    """Durable, distributed backend on PostgreSQL through an asyncpg pool.

    Build it from a URL (``PostgresBackend.from_url("postgresql://user@host/db?schema=app")``,
    or ``Rheo("postgresql://...")``): it then creates and owns its pool and closes
    it in :meth:`close`. Or hand it the host's own pool
    (``PostgresBackend(pool=pool, schema="app")``), which it uses but never closes.

    ``schema`` (default ``"rheo_flow"``) holds every table; :meth:`open` creates
    or upgrades it (see :func:`migrate`) unless ``migrate=False``, in which case a
    schema that is missing or behind is an error naming ``rheo-flow migrate``.
    ``listen`` enables push wake-ups through ``LISTEN/NOTIFY``: one dedicated
    connection (for a host pool, one connection held from it) while anything
    waits; without it idle consumers poll.

    ``timeout_ms`` (default 10,000) bounds every operation, connecting included:
    one that runs longer is abandoned (its connection closed) and raises
    :class:`~rheo_flow.BackendUnavailable` when nothing was sent yet, else
    :class:`~rheo_flow.OutcomeUnknown` for a write (a settle reports ``ambiguous``).

    URL options (query string): ``schema``, ``pool_min_size``, ``pool_max_size``,
    ``listen``, ``migrate``, ``timeout_ms``; anything else is passed on to asyncpg.
    """

    name = "postgres"

    def __init__(
        self,
        *,
        pool: asyncpg.Pool | None = None,
        url: str | None = None,
        schema: str = DEFAULT_SCHEMA,
        listen: bool = True,
        migrate: bool = True,
        pool_min_size: int = 1,
        pool_max_size: int = 10,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
    ) -> None:
        if (pool is None) == (url is None):
            raise InvalidArgument("PostgresBackend needs exactly one of pool= or url=")
        self._timeout_ms = check_timeout_ms(timeout_ms)
        self._deadline_grace_ms = 0
        if url is not None and (not isinstance(url, str) or "://" not in url):
            raise InvalidArgument(f"not a PostgreSQL URL: {redact_url(str(url))!r}")
        if url is not None:
            check_hosts(url, "PostgreSQL")
        self._schema = _check_schema(schema)
        self._pool_min = _check_size("pool_min_size", pool_min_size, 0)
        self._pool_max = _check_size("pool_max_size", pool_max_size, 1)
        if self._pool_min > self._pool_max:
            raise InvalidArgument(
                f"pool_min_size ({pool_min_size}) is larger than pool_max_size ({pool_max_size})"
            )
        _driver()
        self._url = url
        self._pool: asyncpg.Pool | None = pool
        self._calls: _Pool | None = None if pool is None else _Pool(pool)
        self._owns_pool = pool is None
        self._listen = bool(listen)
        self._migrate = bool(migrate)
        self._capabilities = Capabilities(
            durable=True, distributed=True, push_wakeups=self._listen, skip_locked=True,
            server_clock=True,
        )
        self._sql = _Statements.for_schema(self._schema)
        self._channel = _channel(self._schema)
        self._open_lock = asyncio.Lock()
        self._opened = False
        self._streams: dict[str, _StreamMeta] = {}
        self._groups: dict[tuple[str, str], int] = {}
        self._rotation: dict[int, int] = {}
        # LISTEN state: one connection, waiters per stream, notification counters
        # (see wait_for_append for how they close the fetch-then-wait race).
        self._listener: asyncpg.Connection | None = None
        self._listen_task: asyncio.Task[bool] | None = None
        self._listen_failed_at = -_LISTEN_RETRY_S
        self._waiters = Waiters()
        self._notes: dict[str, int] = {}
        self._seen: dict[str, int] = {}

    @classmethod
    def from_url(cls, url: str) -> PostgresBackend:
        """Build a backend that owns its pool from ``postgresql://`` / ``postgres://``."""
        if not isinstance(url, str) or url.split("://", 1)[0].lower() not in (
            "postgresql", "postgres"
        ):
            raise InvalidArgument(
                f"not a PostgreSQL URL: {redact_url(str(url))!r} (expected postgresql://...)"
            )
        check_hosts(url, "PostgreSQL")
        parts = urlsplit(url)
        options: dict[str, Any] = {}
        passed: list[tuple[str, str]] = []
        for key, value in parse_qsl(parts.query, keep_blank_values=True):
            if key in ("pool_min_size", "pool_max_size"):
                if not value.isdigit():
                    raise InvalidArgument(f"URL option {key} must be an integer, got {value!r}")
                options[key] = int(value)
            elif key in ("listen", "migrate"):
                options[key] = url_flag(key, value)
            elif key == "timeout_ms":
                options[key] = check_timeout_ms(value)
            elif key == "schema":
                options[key] = value
            else:
                passed.append((key, value))
        driver_url = urlunsplit(parts._replace(query=urlencode(passed)))
        return cls(url=driver_url, **options)

    @property
    def capabilities(self) -> Capabilities:
        """Durable, distributed, SKIP LOCKED claims, server clock; LISTEN/NOTIFY wake-ups
        unless built with ``listen=False``."""
        return self._capabilities

    @property
    def schema(self) -> str:
        """The schema holding this backend's tables."""
        return self._schema

    # Lifecycle ---------------------------------------------------------------

    async def open(self) -> None:
        await self._ready()

    async def _ready(self) -> _Pool:
        calls = self._calls
        if self._opened and calls is not None:
            return calls
        async with self._open_lock:
            if self._pool is None:
                self._pool = await self._create_pool()
                self._calls = _Pool(self._pool)
            pool = self._pool
            calls = self._calls
            assert calls is not None
            if not self._opened:
                try:
                    async with calls.acquire() as conn:
                        await _ensure_schema(conn, self._schema, apply=self._migrate)
                except BaseException:
                    if self._owns_pool:
                        self._pool = self._calls = None
                        pool.terminate()
                    raise
                self._opened = True
            return calls

    async def _create_pool(self) -> asyncpg.Pool:
        driver = _driver()
        assert self._url is not None
        try:
            pool: asyncpg.Pool = await driver.create_pool(
                self._url,
                min_size=self._pool_min,
                max_size=self._pool_max,
                timeout=self._timeout_ms / 1000,
                # JIT compiling the claim statements would cost more than running them.
                server_settings=self._server_settings({"jit": "off"}, "rheo_flow"),
                reset=_keep_session,
            )
        except (TimeoutError, OSError, driver.PostgresError, driver.InterfaceError) as exc:
            raise unreachable("PostgreSQL", self._url, exc) from None
        return pool

    def _server_settings(self, settings: dict[str, str], name: str) -> dict[str, str]:
        """``settings`` plus ``application_name=name`` unless the URL names the application."""
        assert self._url is not None
        if not any(key == "application_name"
                   for key, _ in parse_qsl(urlsplit(self._url).query)):
            settings["application_name"] = name
        return settings

    async def close(self) -> None:
        await self._stop_listener()
        async with self._open_lock:
            self._opened = False
            pool = self._pool
            if pool is not None and self._owns_pool:
                self._pool = self._calls = None
                try:
                    # A graceful close waits on every connection: not through a stall.
                    await asyncio.wait_for(pool.close(), self._timeout_ms / 1000)
                except Exception as exc:
                    log.debug("closing the pool failed (%s); terminating it", exc)
                    pool.terminate()

    def _error_prefix(self) -> str:
        where = redact_url(self._url) if self._url is not None else "the pool given as pool"
        return f"PostgreSQL at {where}"

    def _scrub(self, text: str) -> str:
        password = urlsplit(self._url).password if self._url is not None else None
        return text.replace(password, "***") if password else text

    def classify_error(self, exc: BaseException) -> SettleKind | None:
        """Map asyncpg errors to settle kinds.

        * could not connect, pool closed, server refusing connections, too many
          connections: nothing was sent → ``backend_unavailable``;
        * connection lost during the call, server shut down under it, timeout:
          the write may have committed → ``ambiguous``;
        * serialization failure, deadlock, constraint violation, statement timeout
          and every other server error: the statement was rolled back → ``failed``.
        """
        try:
            import asyncpg
        except ImportError:  # pragma: no cover - the backend cannot exist without it
            return None
        if isinstance(exc, asyncpg.InterfaceError):
            text = str(exc).lower()
            if "pool is clos" in text or "connection is closed" in text:
                return SettleKind.BACKEND_UNAVAILABLE
            return SettleKind.FAILED
        if isinstance(exc, asyncpg.PostgresError):
            state = getattr(exc, "sqlstate", None) or ""
            if state in ("08001", "08004", "53300", "57P03") or state.startswith("28") or (
                state == "3D000"
            ):
                return SettleKind.BACKEND_UNAVAILABLE
            if state.startswith("08") or state in ("57P01", "57P02"):
                return SettleKind.AMBIGUOUS
            if state == "RF001":
                return SettleKind.INVALID
            return SettleKind.FAILED
        if isinstance(exc, ConnectionRefusedError):
            return SettleKind.BACKEND_UNAVAILABLE
        if isinstance(exc, asyncio.TimeoutError | ConnectionError):
            return SettleKind.AMBIGUOUS
        if isinstance(exc, OSError):
            return SettleKind.BACKEND_UNAVAILABLE
        return None

    # Lookups -----------------------------------------------------------------

    async def _stream(self, name: str) -> _StreamMeta:
        meta = self._streams.get(name)
        if meta is None:
            pool = await self._ready()
            row = await pool.fetchrow(self._sql.stream, name)
            if row is None:
                raise UnknownStream(name)
            meta = _StreamMeta(row[0], row[1], row[2])
            self._streams[name] = meta
        return meta

    async def _group_id(self, stream: str, group: str) -> int:
        gid = self._groups.get((stream, group))
        if gid is None:
            meta = await self._stream(stream)
            pool = await self._ready()
            row = await pool.fetchrow(self._sql.group, meta.id, group)
            if row is None:
                raise UnknownGroup(stream, group)
            gid = row[0]
            self._groups[(stream, group)] = gid
        return gid

    def _forget(self) -> None:
        """Drop cached ids (they outlive nothing but a dropped schema)."""
        self._streams.clear()
        self._groups.clear()

    # Streams -----------------------------------------------------------------

    async def create_stream(self, name: str, partitions: int) -> StreamInfo:
        pool = await self._ready()
        q = self._q
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"INSERT INTO {q}.streams (name, partitions, created_at_ms) "
                f"VALUES ($1, $2, {NOW_MS}) ON CONFLICT (name) DO NOTHING "
                "RETURNING id, partitions, created_at_ms",
                name, partitions,
            )
            if row is not None:
                await conn.execute(
                    f"INSERT INTO {q}.partitions (stream_id, part) "
                    "SELECT $1, generate_series(0, $2 - 1)",
                    row[0], partitions,
                )
            else:
                row = await conn.fetchrow(self._sql.stream, name)
                assert row is not None
                if row[1] != partitions:
                    raise ConflictError(
                        f"stream {name!r} exists with {row[1]} partitions, not {partitions}"
                    )
            meta = _StreamMeta(row[0], row[1], row[2])
            info = await self._info(conn, name, meta)
        self._streams[name] = meta
        return info

    @property
    def _q(self) -> str:
        return render("{s}", self._schema)

    async def _info(self, conn: asyncpg.Connection | _Pool, name: str,
                    meta: _StreamMeta) -> StreamInfo:
        rows = await conn.fetch(
            f"SELECT part, high_water, low_water FROM {self._q}.partitions "
            "WHERE stream_id = $1 ORDER BY part",
            meta.id,
        )
        return StreamInfo(
            name=name,
            partitions=meta.partitions,
            created_at_ms=meta.created_at_ms,
            high_water={r[0]: r[1] for r in rows},
            low_water={r[0]: r[2] for r in rows},
        )

    async def stream_info(self, name: str) -> StreamInfo:
        meta = await self._stream(name)
        return await self._info(await self._ready(), name, meta)

    async def list_streams(self) -> list[str]:
        pool = await self._ready()
        rows = await pool.fetch(f'SELECT name FROM {self._q}.streams ORDER BY name COLLATE "C"')
        return [r[0] for r in rows]

    async def append(self, stream: str, records: Sequence[AppendRecord]) -> list[Event]:
        meta = await self._stream(stream)
        if not records:
            return []
        for r in records:
            if "\x00" in r.id or "\x00" in r.type or (r.key is not None and "\x00" in r.key):
                raise InvalidArgument(
                    "PostgreSQL cannot store NUL characters in event ids, types or keys"
                )
            if not 0 <= r.partition < meta.partitions:
                raise InvalidArgument(
                    f"partition {r.partition} is out of range: stream {stream!r} has "
                    f"partitions 0..{meta.partitions - 1}"
                )
        pool = await self._ready()
        # Repeated ids within one batch: the first occurrence is appended, the later
        # ones return the same event (as the reference backend does).
        first: dict[str, int] = {}
        for i, r in enumerate(records):
            first.setdefault(r.id, i)
        unique = [records[i] for i in sorted(first.values())]
        stored: dict[str, Event] = {}
        for _ in range(_APPEND_RETRIES):
            fresh = [r for r in unique if r.id not in stored]
            if not fresh:
                break
            try:
                stored.update(await self._append_new(pool, stream, meta, fresh))
                break
            except Exception as exc:
                if getattr(exc, "constraint_name", None) != "events_event_id":
                    raise
            # Some ids are already stored (a retried append, or a racing one).
            stored.update(await self._stored_events(pool, stream, meta, [r.id for r in fresh]))
        else:
            raise BackendError(
                f"append to {stream!r} kept conflicting with concurrent appends of the same ids"
            )
        return [stored[r.id] for r in records]

    async def _append_new(self, pool: _Pool, stream: str, meta: _StreamMeta,
                          records: list[AppendRecord]) -> dict[str, Event]:
        # Columns that are NULL for every event travel as one NULL (ROWS FROM
        # pads the shorter columns with NULLs).
        heads = (
            [json.dumps(r.headers, separators=(",", ":"), ensure_ascii=False) if r.headers
             else None for r in records]
            if any(r.headers for r in records) else None
        )
        keys = [r.key for r in records]
        try:
            ids = orjson.dumps([r.id for r in records]).decode()
            types = orjson.dumps([r.type for r in records]).decode()
            key_list = (orjson.dumps(keys).decode() if any(k is not None for k in keys)
                        else None)
        except TypeError:  # orjson refuses text that is not valid Unicode
            raise InvalidArgument(
                "event ids, types and keys must be valid Unicode text") from None
        row = await pool.fetchrow(
            self._sql.append, meta.id,
            "{" + ",".join([str(r.partition) for r in records]) + "}", ids, types, key_list,
            "[" + ",".join([r.data_json for r in records]) + "]", heads, self._channel, stream,
        )
        assert row is not None
        at, seqs = row[0], row[1]
        # data is decoded from its JSON text on first access: the stored events
        # share nothing with the caller's objects.
        return {
            r.id: make_event_json(stream, r.partition, seq, r.id, r.type, r.data_json, r.key,
                                  dict(r.headers) if r.headers else {}, at)
            for r, seq in zip(records, seqs, strict=True)
        }

    async def _stored_events(self, pool: _Pool, stream: str, meta: _StreamMeta,
                             ids: list[str]) -> dict[str, Event]:
        rows = await pool.fetch(
            f"SELECT {_EVENT_COLUMNS} FROM {self._q}.events "
            "WHERE stream_id = $1 AND event_id = ANY($2::text[])",
            meta.id, ids,
        )
        return {row[2]: _event(stream, row) for row in rows}

    # Groups ------------------------------------------------------------------

    async def create_group(
        self, stream: str, group: str, start: StartPosition, max_attempts: int | None
    ) -> GroupInfo:
        meta = await self._stream(stream)
        pool = await self._ready()
        q = self._q
        position = _position_param(start)
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"INSERT INTO {q}.groups (stream_id, name, max_attempts, created_at_ms) "
                f"VALUES ($1, $2, $3, {NOW_MS}) ON CONFLICT (stream_id, name) DO NOTHING "
                "RETURNING id, max_attempts, created_at_ms",
                meta.id, group, max_attempts or DEFAULT_MAX_ATTEMPTS,
            )
            if row is not None:
                for table, column in (("cursors", "cursor"), ("frontiers", "frontier")):
                    await conn.execute(
                        f"INSERT INTO {q}.{table} (group_id, part, {column}) "
                        "SELECT $1, p.part, GREATEST(p.low_water - 1, "
                        "LEAST(COALESCE($3::bigint, p.high_water), p.high_water)) "
                        f"FROM {q}.partitions p WHERE p.stream_id = $2",
                        row[0], meta.id, position,
                    )
            else:
                row = await conn.fetchrow(self._sql.group, meta.id, group)
                assert row is not None
                if max_attempts is not None and max_attempts != row[1]:
                    row = await conn.fetchrow(
                        f"UPDATE {q}.groups SET max_attempts = $2 WHERE id = $1 "
                        "RETURNING id, max_attempts, created_at_ms",
                        row[0], max_attempts,
                    )
                    assert row is not None
        self._groups[(stream, group)] = row[0]
        return GroupInfo(stream, group, row[1], row[2])

    async def group_info(self, stream: str, group: str) -> GroupInfo:
        meta = await self._stream(stream)
        pool = await self._ready()
        row = await pool.fetchrow(self._sql.group, meta.id, group)
        if row is None:
            raise UnknownGroup(stream, group)
        self._groups[(stream, group)] = row[0]
        return GroupInfo(stream, group, row[1], row[2])

    async def list_groups(self, stream: str) -> list[GroupInfo]:
        meta = await self._stream(stream)
        pool = await self._ready()
        rows = await pool.fetch(
            f"SELECT name, max_attempts, created_at_ms FROM {self._q}.groups "
            'WHERE stream_id = $1 ORDER BY name COLLATE "C"',
            meta.id,
        )
        return [GroupInfo(stream, r[0], r[1], r[2]) for r in rows]

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
        meta = await self._stream(stream)
        gid = await self._group_id(stream, group)
        ids = list(range(meta.partitions)) if partitions is None else list(partitions)
        if not ids:
            return []
        rotation = (self._rotation.get(gid, 0) + 1) % len(ids)
        self._rotation[gid] = rotation
        ids = ids[rotation:] + ids[:rotation]
        if self._listener is not None:
            self._seen[stream] = self._notes.get(stream, 0)
        pool = await self._ready()
        try:
            rows = await pool.fetch(self._sql.fetch, gid, ids, limit, lease_ms, consumer_id)
        except Exception as exc:
            if getattr(exc, "sqlstate", None) == "RF001":
                self._forget()
                raise UnknownGroup(stream, group) from None
            raise
        leases: list[Lease] = []
        append = leases.append
        # This loop runs once per leased event: data stays JSON text until read.
        for part, seq, attempt, lease_uuid, deadline, event_id, type_, key, data, heads, at in rows:
            event = make_event_json(stream, part, seq, event_id, type_, data, key,
                                    decode_json(heads) if heads is not None else {}, at)
            append(make_lease(lease_uuid.bytes.hex(), f"{part}-{seq}-{attempt}", group, consumer_id,
                              event, attempt, deadline))
        return leases

    async def ack(self, leases: Sequence[Lease]) -> list[SettleResult]:
        return await self._settle(leases, "ack", "", 0)

    async def nack(self, leases: Sequence[Lease], reason: str, delay_ms: int,
                   error: str | None = None) -> list[SettleResult]:
        return await self._settle(leases, "nack", reason, delay_ms, error)

    async def reject(self, leases: Sequence[Lease], reason: str,
                     error: str | None = None) -> list[SettleResult]:
        return await self._settle(leases, "reject", reason, 0, error)

    async def _settle(self, leases: Sequence[Lease], op: Op, reason: str, delay_ms: int,
                      error: str | None = None) -> list[SettleResult]:
        batch = await self._batch(leases)
        if batch.args:
            pool = await self._ready()
            row = await pool.fetchrow(
                self._sql.settle, _OP_CODES[op], *batch.args, reason, delay_ms, error
            )
            assert row is not None
            batch.apply(row[0], row[1], row[2], None)
        return batch.finish(renew=False)

    async def ack_in_transaction(self, conn: asyncpg.Connection, leases: Sequence[Lease]
                                 ) -> list[SettleResult]:
        """Ack ``leases`` on the caller's connection, inside its open transaction.

        The acks (and the frontier moves they cause) commit or roll back together
        with whatever else the caller wrote in that transaction: a sink writing
        rows and acking their leases at once has an exactly-once effect. ``conn``
        must reach this backend's database. Row locks on the settled deliveries
        and their frontiers are held until the caller's transaction ends, so keep
        it short after this call. Results are as for :meth:`ack`.
        """
        if not conn.is_in_transaction():
            raise InvalidArgument(
                "ack_in_transaction needs a connection inside a transaction "
                "(async with conn.transaction(): ...)"
            )
        batch = await self._batch(leases)
        if batch.args:
            row = await conn.fetchrow(self._sql.settle, _OP_CODES["ack"], *batch.args, "", 0,
                                      None)
            assert row is not None
            batch.apply(row[0], row[1], row[2], None)
        return batch.finish(renew=False)

    async def renew(self, leases: Sequence[Lease], lease_ms: int) -> list[SettleResult]:
        batch = await self._batch(leases)
        if batch.args:
            pool = await self._ready()
            row = await pool.fetchrow(self._sql.renew, *batch.args, lease_ms)
            assert row is not None
            batch.apply(row[1], row[2], row[3], row[0])
        return batch.finish(renew=True)

    async def _batch(self, leases: Sequence[Lease]) -> _Batch:
        """Resolve the groups a batch names (one query for those not cached yet)."""
        groups: dict[tuple[str, str], tuple[int, int]] = {}
        missing: set[tuple[str, str]] = set()
        for lease in leases:
            key = (lease.stream, lease.group)
            if key in groups or key in missing:
                continue
            gid = self._groups.get(key)
            meta = self._streams.get(lease.stream)
            if gid is not None and meta is not None:
                groups[key] = (gid, meta.partitions)
            else:
                missing.add(key)
        if missing:
            pool = await self._ready()
            names = sorted(missing)
            for row in await pool.fetch(
                self._sql.groups_by_name, [s for s, _ in names], [g for _, g in names]
            ):
                key = (row[0], row[1])
                groups[key] = (row[2], row[3])
                self._groups[key] = row[2]
                self._streams.setdefault(row[0], _StreamMeta(row[4], row[3], row[5]))
        return _Batch(leases, groups)

    # Progress ----------------------------------------------------------------

    async def frontier(self, stream: str, group: str) -> dict[int, int]:
        gid = await self._group_id(stream, group)
        pool = await self._ready()
        rows = await pool.fetch(
            f"SELECT part, frontier FROM {self._q}.frontiers WHERE group_id = $1 ORDER BY part",
            gid,
        )
        return {r[0]: r[1] for r in rows}

    async def dead_letters(
        self, stream: str, group: str, limit: int, after: tuple[int, int] | None
    ) -> list[DeadLetter]:
        meta = await self._stream(stream)
        gid = await self._group_id(stream, group)
        part, seq = after if after is not None else (-1, -1)
        pool = await self._ready()
        rows = await pool.fetch(
            "SELECT d.part, d.seq, e.event_id, d.attempt, d.reason, d.rejected_at_ms, "
            f"d.last_error FROM {self._q}.deliveries d JOIN {self._q}.events e "
            "ON e.stream_id = $2 AND e.part = d.part AND e.seq = d.seq "
            "WHERE d.group_id = $1 AND d.state = 3 AND (d.part, d.seq) > ($3, $4) "
            "ORDER BY d.part, d.seq LIMIT $5",
            gid, meta.id, part, seq, limit,
        )
        return [DeadLetter(stream, group, *r) for r in rows]

    async def redrive(
        self, stream: str, group: str, positions: Sequence[tuple[int, int]] | None
    ) -> int:
        gid = await self._group_id(stream, group)
        pool = await self._ready()
        q = self._q
        where = ""
        args: tuple[Any, ...] = ()
        if positions is not None:
            wanted = sorted({(p, s) for p, s in positions if 0 <= p <= _MAX_INT
                             and 0 < s <= _MAX_SEQ})
            where = ("AND (d.part, d.seq) IN (SELECT u.p, u.s FROM "
                     "unnest($2::integer[], $3::bigint[]) AS u(p, s))")
            args = ([p for p, _ in wanted], [s for _, s in wanted])
        count: int = await pool.fetchval(
            f"""WITH back AS (
                UPDATE {q}.deliveries d SET state = 0, attempt = 0, lease_id = NULL,
                    settled_by = NULL, reason = '', last_error = NULL,
                    available_at_ms = {NOW_MS}
                WHERE d.group_id = $1 AND d.state = 3 {where}
                RETURNING d.part, d.seq
            ), lowered AS (
                UPDATE {q}.frontiers f SET frontier = LEAST(f.frontier, m.low - 1)
                FROM (SELECT back.part, min(back.seq) AS low FROM back GROUP BY back.part) m
                WHERE f.group_id = $1 AND f.part = m.part
            )
            SELECT count(*) FROM back""",
            gid, *args,
        )
        return count

    async def replay(
        self, stream: str, group: str, from_sequence: int, partitions: Sequence[int]
    ) -> None:
        meta = await self._stream(stream)
        gid = await self._group_id(stream, group)
        parts = sorted(set(partitions))
        if not parts:
            return
        pool = await self._ready()
        q = self._q
        async with pool.acquire() as conn, conn.transaction():
            await self._lock_group(conn, gid, parts)
            # Trimmed events are gone and count as settled: replay starts at the low water.
            rows = await conn.fetch(
                f"SELECT part, GREATEST($3::bigint, low_water) FROM {q}.partitions "
                "WHERE stream_id = $1 AND part = ANY($2::integer[]) ORDER BY part",
                meta.id, parts, min(from_sequence, _MAX_SEQ),
            )
            starts = ([r[0] for r in rows], [r[1] for r in rows])
            # Deleting a delivery fences its lease; it is materialised again, attempt 1.
            await conn.execute(
                f"DELETE FROM {q}.deliveries d USING unnest($2::integer[], $3::bigint[]) "
                "AS u(p, s) WHERE d.group_id = $1 AND d.part = u.p AND d.seq >= u.s",
                gid, *starts,
            )
            await self._move(conn, gid, starts, "LEAST")

    async def reset(
        self, stream: str, group: str, to: StartPosition, partitions: Sequence[int]
    ) -> None:
        meta = await self._stream(stream)
        gid = await self._group_id(stream, group)
        parts = sorted(set(partitions))
        if not parts:
            return
        pool = await self._ready()
        q = self._q
        async with pool.acquire() as conn, conn.transaction():
            await self._lock_group(conn, gid, parts)
            rows = await conn.fetch(
                "SELECT part, GREATEST(low_water - 1, "
                "LEAST(COALESCE($3::bigint, high_water), high_water)) "
                f"FROM {q}.partitions WHERE stream_id = $1 AND part = ANY($2::integer[]) "
                "ORDER BY part",
                meta.id, parts, _position_param(to),
            )
            positions = ([r[0] for r in rows], [r[1] for r in rows])
            await conn.execute(
                f"DELETE FROM {q}.deliveries WHERE group_id = $1 AND part = ANY($2::integer[])",
                gid, parts,
            )
            await self._move(conn, gid, positions, "SET")

    async def _lock_group(self, conn: asyncpg.Connection, gid: int, parts: list[int]) -> None:
        """Take the cursor rows first (the lock order of every claim)."""
        await conn.execute(
            f"SELECT 1 FROM {self._q}.cursors WHERE group_id = $1 AND part = ANY($2::integer[]) "
            "ORDER BY part FOR UPDATE",
            gid, parts,
        )

    async def _move(self, conn: asyncpg.Connection, gid: int,
                    positions: tuple[list[int], list[int]], how: str) -> None:
        """Set (``SET``) or lower (``LEAST``) cursor and frontier to per-partition positions."""
        q = self._q
        for table, column in (("cursors", "cursor"), ("frontiers", "frontier")):
            value = "u.s" if how == "SET" else f"LEAST(t.{column}, u.s - 1)"
            if table == "frontiers":
                await conn.execute(
                    f"SELECT 1 FROM {q}.frontiers WHERE group_id = $1 "
                    "AND part = ANY($2::integer[]) ORDER BY part FOR UPDATE",
                    gid, positions[0],
                )
            await conn.execute(
                f"UPDATE {q}.{table} t SET {column} = {value} "
                "FROM unnest($2::integer[], $3::bigint[]) AS u(p, s) "
                "WHERE t.group_id = $1 AND t.part = u.p",
                gid, *positions,
            )

    # Reads and retention -----------------------------------------------------

    async def query(self, query: Query, limit: int, after: tuple[int, int] | None) -> list[Event]:
        meta = await self._stream(query.stream)
        pool = await self._ready()
        info = await self._info(pool, query.stream, meta)
        filters = ""
        extra: list[Any] = []
        for clause, value in (
            ("key = ${}", query.key),
            ("type = ${}", query.type),
            ("appended_at_ms >= ${}", query.since_ms),
            ("appended_at_ms < ${}", query.until_ms),
        ):
            if value is not None:
                extra.append(min(value, _MAX_SEQ) if isinstance(value, int) else value)
                filters += " AND " + clause.format(5 + len(extra))
        sql = (
            f"SELECT {_EVENT_COLUMNS} FROM {self._q}.events WHERE stream_id = $1 AND part = $2 "
            f"AND seq BETWEEN $3 AND $4{filters} ORDER BY seq LIMIT $5"
        )
        parts = range(meta.partitions) if query.partitions is None else sorted(query.partitions)
        out: list[Event] = []
        for part in parts:
            window = query_window(
                query, part, after, info.low_water[part], info.high_water[part])
            if window is None:
                continue
            lo, hi = window
            rows = await pool.fetch(sql, meta.id, part, lo, hi, limit - len(out), *extra)
            out.extend(_event(query.stream, row) for row in rows)
            if len(out) >= limit:
                break
        return out

    async def delete_stream(self, stream: str) -> None:
        pool = await self._ready()
        q = self._q
        async with pool.acquire() as conn, conn.transaction():
            # Locking the stream row first orders this against appends and group creation.
            stream_id = await conn.fetchval(
                f"SELECT id FROM {q}.streams WHERE name = $1 FOR UPDATE", stream)
            if stream_id is None:
                raise UnknownStream(stream)
            groups = [r[0] for r in await conn.fetch(
                f"SELECT id FROM {q}.groups WHERE stream_id = $1 ORDER BY id", stream_id)]
            await self._delete_groups(conn, groups)
            await conn.execute(f"DELETE FROM {q}.events WHERE stream_id = $1", stream_id)
            await conn.execute(f"DELETE FROM {q}.partitions WHERE stream_id = $1", stream_id)
            await conn.execute(f"DELETE FROM {q}.streams WHERE id = $1", stream_id)
        self._streams.pop(stream, None)
        for key in [k for k in self._groups if k[0] == stream]:
            del self._groups[key]

    async def delete_group(self, stream: str, group: str) -> None:
        pool = await self._ready()
        q = self._q
        async with pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT s.id, g.id FROM {q}.streams s LEFT JOIN {q}.groups g "
                "ON g.stream_id = s.id AND g.name = $2 WHERE s.name = $1 FOR UPDATE OF s",
                stream, group)
            if row is None:
                raise UnknownStream(stream)
            if row[1] is None:
                raise UnknownGroup(stream, group)
            await self._delete_groups(conn, [row[1]])
        self._groups.pop((stream, group), None)

    async def _delete_groups(self, conn: asyncpg.Connection, groups: list[int]) -> None:
        q = self._q
        for table, column in (("deliveries", "group_id"), ("frontiers", "group_id"),
                              ("cursors", "group_id"), ("groups", "id")):
            await conn.execute(
                f"DELETE FROM {q}.{table} WHERE {column} = ANY($1::integer[])", groups)

    async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
        meta = await self._stream(stream)
        parts = sorted(up_to)
        if not parts:
            return {}
        pool = await self._ready()
        q = self._q
        async with pool.acquire() as conn, conn.transaction():
            highs = await conn.fetch(
                f"SELECT part, high_water FROM {q}.partitions WHERE stream_id = $1 "
                "AND part = ANY($2::integer[]) ORDER BY part FOR UPDATE",
                meta.id, parts,
            )
            bounds = ([r[0] for r in highs],
                      [min(max(up_to[r[0]], 0), r[1]) for r in highs])
            counted = await conn.fetch(
                f"""WITH gone AS (
                    DELETE FROM {q}.events e USING unnest($2::integer[], $3::bigint[]) AS u(p, b)
                    WHERE e.stream_id = $1 AND e.part = u.p AND e.seq <= u.b
                    RETURNING e.part
                ) SELECT gone.part, count(*) FROM gone GROUP BY gone.part""",
                meta.id, *bounds,
            )
            removed = dict.fromkeys(parts, 0)
            removed.update({r[0]: r[1] for r in counted})
            await conn.execute(
                f"UPDATE {q}.partitions p SET low_water = GREATEST(p.low_water, u.b + 1) "
                "FROM unnest($2::integer[], $3::bigint[]) AS u(p, b) "
                "WHERE p.stream_id = $1 AND p.part = u.p",
                meta.id, *bounds,
            )
            # Deliveries of removed events are dropped (fencing their leases) and count
            # as settled: cursors and frontiers move up to the bound, then on.
            groups = [r[0] for r in await conn.fetch(
                f"SELECT id FROM {q}.groups WHERE stream_id = $1 ORDER BY id", meta.id)]
            if groups:
                pairs = [(g, p, b) for g in groups for p, b in zip(*bounds, strict=True)]
                args = ([g for g, _, _ in pairs], [p for _, p, _ in pairs],
                        [b for _, _, b in pairs])
                unnested = "unnest($1::integer[], $2::integer[], $3::bigint[]) AS u(g, p, b)"
                await conn.execute(
                    f"SELECT 1 FROM {q}.cursors c JOIN {unnested} "
                    "ON c.group_id = u.g AND c.part = u.p ORDER BY c.group_id, c.part "
                    "FOR UPDATE OF c",
                    *args,
                )
                await conn.execute(
                    f"DELETE FROM {q}.deliveries d USING {unnested} "
                    "WHERE d.group_id = u.g AND d.part = u.p AND d.seq <= u.b",
                    *args,
                )
                await conn.execute(
                    f"UPDATE {q}.cursors c SET cursor = GREATEST(c.cursor, u.b) FROM {unnested} "
                    "WHERE c.group_id = u.g AND c.part = u.p",
                    *args,
                )
                await conn.execute(
                    f"SELECT 1 FROM {q}.frontiers f JOIN {unnested} "
                    "ON f.group_id = u.g AND f.part = u.p ORDER BY f.group_id, f.part "
                    "FOR UPDATE OF f",
                    *args,
                )
                await conn.execute(
                    f"UPDATE {q}.frontiers f SET frontier = GREATEST(f.frontier, u.b) "
                    f"FROM {unnested} WHERE f.group_id = u.g AND f.part = u.p",
                    *args,
                )
                await conn.execute(
                    f"SELECT {q}.advance_frontiers($1::integer[], $2::integer[])",
                    args[0], args[1],
                )
        return removed

    # Wake-ups ----------------------------------------------------------------

    async def wait_for_append(self, stream: str, timeout: float) -> bool:
        """Wait for a ``NOTIFY`` from an append to ``stream``, or ``timeout`` seconds.

        Falls back to sleeping when ``listen`` is off or no LISTEN connection can
        be had. A notification that arrived after this backend's latest fetch of
        the stream started (so that fetch may have missed its events) returns at
        once instead of being lost between the fetch and the wait.
        """
        await self._stream(stream)
        if not self._listen or not await self._ensure_listener():
            await asyncio.sleep(timeout)
            return False
        notes = self._notes.get(stream, 0)
        if stream in self._seen and notes > self._seen[stream]:
            self._seen[stream] = notes
            return True
        return await self._waiters.wait(stream, timeout)

    async def _ensure_listener(self) -> bool:
        if self._listener is not None and not self._listener.is_closed():
            return True
        if time.monotonic() - self._listen_failed_at < _LISTEN_RETRY_S:
            return False
        task = self._listen_task
        if task is None or task.done():
            task = self._listen_task = asyncio.get_running_loop().create_task(
                self._start_listener())
        # A waiter cancelled while the connection is being made (a consumer that
        # fetched meanwhile) must not abort it half-way: the next wait uses it.
        return await asyncio.shield(task)

    async def _start_listener(self) -> bool:
        try:
            conn = await self._listen_connection()
        except Exception as exc:
            self._listen_failed_at = time.monotonic()
            log.warning("LISTEN on %s failed (%s: %s); polling for %.0fs",
                        self._channel, type(exc).__name__, exc, _LISTEN_RETRY_S)
            return False
        try:
            await conn.add_listener(self._channel, self._on_notify)
        except Exception as exc:
            self._listen_failed_at = time.monotonic()
            log.warning("LISTEN on %s failed (%s: %s); polling for %.0fs",
                        self._channel, type(exc).__name__, exc, _LISTEN_RETRY_S)
            await self._drop_listen_connection(conn)
            return False
        conn.add_termination_listener(self._on_listener_lost)
        self._listener = conn
        return True

    async def _listen_connection(self) -> asyncpg.Connection:
        if self._owns_pool:
            driver = _driver()
            assert self._url is not None
            conn: asyncpg.Connection = await driver.connect(
                self._url, server_settings=self._server_settings({}, "rheo_flow.listen"),
                timeout=self._timeout_ms / 1000,
            )
            return conn
        await self._ready()
        assert self._pool is not None
        held: asyncpg.Connection = await self._pool.acquire(timeout=self._timeout_ms / 1000)
        return held

    def _on_notify(self, conn: object, pid: int, channel: str, payload: object) -> None:
        stream = str(payload)
        self._notes[stream] = self._notes.get(stream, 0) + 1
        self._waiters.wake(stream)

    def _on_listener_lost(self, conn: object) -> None:
        if self._listener is conn:
            self._listener = None
        # Wake everyone: they fetch now, and the next wait reconnects (or polls).
        self._waiters.wake_all()

    async def _stop_listener(self) -> None:
        task, self._listen_task = self._listen_task, None
        if task is not None and not task.done():
            with contextlib.suppress(Exception):
                await task  # let a connection being made finish, then close it
        conn, self._listener = self._listener, None
        if conn is not None:
            conn.remove_termination_listener(self._on_listener_lost)
            with contextlib.suppress(Exception):
                await conn.remove_listener(self._channel, self._on_notify)
            await self._drop_listen_connection(conn)
        self._on_listener_lost(None)

    async def _drop_listen_connection(self, conn: asyncpg.Connection) -> None:
        try:
            if self._owns_pool:
                await conn.close(timeout=5)
            else:
                assert self._pool is not None
                await self._pool.release(conn)
        except Exception as exc:  # closing must not fail the caller's shutdown
            log.debug("closing the LISTEN connection failed: %s", exc)
            conn.terminate()


class _Batch:
    """A settle or renew batch: invalid leases answered locally, exact duplicates
    folded onto their first occurrence, the rest as arrays sorted by delivery
    (so concurrent batches lock rows in one order)."""

    def __init__(self, leases: Sequence[Lease],
                 groups: Mapping[tuple[str, str], tuple[int, int]]) -> None:
        self.leases = leases
        self.results: list[SettleResult | None] = [None] * len(leases)
        self.duplicates: list[tuple[int, int]] = []
        self.order: list[int] = []
        self.args: tuple[str, ...] = ()
        if leases and not self._common(leases, groups):
            self._general(leases, groups)

    def _common(self, leases: Sequence[Lease],
                groups: Mapping[tuple[str, str], tuple[int, int]]) -> bool:
        """The batch as one fetch hands it back (one group, every lease well formed,
        no two alike), checked with no per-lease fallbacks: the lease ids by one
        match over the whole batch. False (nothing recorded) for anything else,
        which :meth:`_general` then answers lease by lease."""
        first = leases[0]
        group = first.group
        stream = first.event.stream
        found = groups.get((stream, group))
        if found is None:
            return False
        gid, partitions = found
        ids = [lease.lease_id for lease in leases]
        if not all(type(lease_id) is str for lease_id in ids):
            return False
        if (_LEASE_IDS.fullmatch(",".join(ids) + ",") is None
                or len(set(ids)) != len(ids)):
            return False
        entries: list[tuple[int, int, int, int]] = []
        append = entries.append
        for i, lease in enumerate(leases):
            event = lease.event
            part, seq, attempt = event.partition, event.sequence, lease.attempt
            if (type(part) is not int or type(seq) is not int or type(attempt) is not int
                    or not 0 <= part < partitions or not 0 < seq <= _MAX_SEQ
                    or not 0 < attempt < _MAX_ATTEMPT
                    or lease.group != group or event.stream != stream
                    or lease.receipt != f"{part}-{seq}-{attempt}"):
                return False
            append((part, seq, attempt, i))
        entries.sort()
        self.order = order = [e[3] for e in entries]
        self.args = (
            "{" + ",".join([str(gid)] * len(entries)) + "}",
            "{" + ",".join([str(e[0]) for e in entries]) + "}",
            "{" + ",".join([str(e[1]) for e in entries]) + "}",
            "{" + ",".join([ids[i] for i in order]) + "}",
            "{" + ",".join([str(e[2]) for e in entries]) + "}",
        )
        return True

    def _general(self, leases: Sequence[Lease],
                 groups: Mapping[tuple[str, str], tuple[int, int]]) -> None:
        """Any batch: invalid leases answered here, duplicates folded, the rest sorted."""
        firsts: dict[tuple[str, str, str, str, int, int], int] = {}
        entries: list[tuple[int, int, int, str, int, int]] = []
        lease_pattern = _LEASE_ID.fullmatch
        for i, lease in enumerate(leases):
            event = lease.event
            stream, part, seq = event.stream, event.partition, event.sequence
            found = groups.get((stream, lease.group))
            if found is None or type(part) is not int or not 0 <= part < found[1]:
                self.results[i] = SettleResult.failure(
                    lease.lease_id, SettleKind.INVALID, "lease names no group of this backend")
                continue
            if type(seq) is not int or not 0 < seq <= _MAX_SEQ:
                self.results[i] = SettleResult.failure(
                    lease.lease_id, SettleKind.INVALID, "lease names no delivery of this backend")
                continue
            lease_id, receipt = lease.lease_id, lease.receipt
            key = (lease_id, receipt, stream, lease.group, part, seq)
            if key in firsts:
                self.duplicates.append((i, firsts[key]))
                continue
            firsts[key] = i
            # Our lease ids are 32 lowercase hex digits and receipts
            # "{partition}-{sequence}-{attempt}"; anything else matches nothing.
            if type(lease_id) is not str or lease_pattern(lease_id) is None:
                lease_id = _NIL_UUID
            attempt = lease.attempt
            if (type(attempt) is not int or not 0 < attempt < _MAX_ATTEMPT
                    or receipt != f"{part}-{seq}-{attempt}"):
                # Not the receipt this lease was issued with: the receipt decides.
                attempt = _receipt_attempt(receipt, part, seq)
            entries.append((found[0], part, seq, lease_id, attempt, i))
        entries.sort()
        self.order = [e[5] for e in entries]
        self.args = (
            tuple("{" + ",".join(map(str, column)) + "}"
                  for column in zip(*entries, strict=True))[:5]
            if entries else ()
        )

    def apply(self, bad_idx: list[int] | None, bad_code: list[int] | None,
              bad_by: list[int | None] | None, deadline_ms: int | None) -> None:
        """Record the function's answer: listed positions failed, the rest took effect."""
        leases, results = self.leases, self.results
        if not bad_idx:  # the common case: every lease took effect
            if deadline_ms is None:
                for i in self.order:
                    results[i] = settle_ok(leases[i].lease_id)
            else:
                for i in self.order:
                    results[i] = SettleResult(leases[i].lease_id, None, False, deadline_ms)
            return
        assert bad_code is not None
        assert bad_by is not None
        bad = {i: (c, b) for i, c, b in zip(bad_idx, bad_code, bad_by, strict=True)}
        for position, i in enumerate(self.order, start=1):
            code, by = bad.get(position, (0, None))
            results[i] = _result(leases[i].lease_id, code, by, deadline_ms)

    def finish(self, *, renew: bool) -> list[SettleResult]:
        for i, first in self.duplicates:
            prior = self.results[first]
            assert prior is not None
            lease_id = self.leases[i].lease_id
            if prior.ok:
                self.results[i] = (
                    SettleResult.success(lease_id, deadline_ms=prior.deadline_ms) if renew
                    else SettleResult.success(lease_id, repeated=True)
                )
            else:
                self.results[i] = SettleResult(lease_id, prior.error)
        out: list[SettleResult] = []
        for r in self.results:
            assert r is not None
            out.append(r)
        return out


def _receipt_attempt(receipt: object, part: int, seq: int) -> int:
    """The attempt a receipt names for (part, seq), or -1 (matches no delivery)."""
    if type(receipt) is str:
        head, _, tail = receipt.rpartition("-")
        if (tail.isascii() and tail.isdigit() and len(tail) < 10
                and head == f"{part}-{seq}"):
            return int(tail)
    return -1


def _result(lease_id: str, code: int, by: int | None, deadline_ms: int | None) -> SettleResult:
    if code == 0:
        return SettleResult(lease_id, None, False, deadline_ms)
    if code == 1:
        return SettleResult.success(lease_id, repeated=True)
    if code == 2:
        return SettleResult.failure(lease_id, SettleKind.STALE_LEASE,
                                    "the delivery was leased again")
    if code == 3:
        return SettleResult.failure(lease_id, SettleKind.RECEIPT_MISMATCH,
                                    "receipt does not match the lease")
    if code == 4:
        return SettleResult.failure(lease_id, SettleKind.STALE_LEASE,
                                    f"already settled by {_OP_NAMES.get(by, by)}")
    if code == 5:
        return SettleResult.failure(lease_id, SettleKind.STALE_LEASE,
                                    "the delivery was replayed, reset or trimmed")
    if code == 6:
        return SettleResult.failure(lease_id, SettleKind.INVALID,
                                    "lease names no delivery of this backend")
    return SettleResult.failure(lease_id, SettleKind.FAILED,
                                "the delivery changed concurrently; retry")


def _position_param(start: StartPosition) -> int | None:
    """A start position as the SQL parameter: a sequence, or NULL for the high water."""
    if start == "earliest":
        return 0
    if start == "latest":
        return None
    return min(int(start), _MAX_SEQ)


def _event(stream: str, row: Any) -> Event:
    part, seq, event_id, type_, key, data, headers, appended_at_ms = row
    return make_event_json(stream, part, seq, event_id, type_, data, key,
                           decode_json(headers) if headers is not None else {}, appended_at_ms)


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Release hook of an owned pool: nothing to reset.

    asyncpg's default runs ``RESET ALL; UNLISTEN *; ...`` on every release: a
    round trip per operation. This backend never changes session state on pooled
    connections (LISTEN has its own connection, transactions are scoped), and
    asyncpg still rolls back a transaction left open before calling this.
    """


# Migrations ------------------------------------------------------------------


async def _ensure_schema(conn: asyncpg.Connection, schema: str, *, apply: bool) -> int:
    """Check the schema version; create or upgrade it when ``apply`` (else refuse)."""
    driver = _driver()
    table = render("{s}." + VERSION_TABLE, schema)
    try:
        version: int = await conn.fetchval(f"SELECT COALESCE(max(version), 0) FROM {table}")
    except driver.UndefinedTableError:
        version = 0
    if version > SCHEMA_VERSION:
        raise BackendError(
            f"PostgreSQL schema {schema!r} is at version {version}, newer than this "
            f"rheo-flow supports ({SCHEMA_VERSION}): upgrade rheo-flow"
        )
    if version == SCHEMA_VERSION:
        return version
    if not apply and version == 0:
        raise BackendError(
            f"PostgreSQL schema {schema!r} holds no rheo_flow tables: create them with "
            "rheo-flow migrate --url URL  (or open with migrate=True)"
        )
    if not apply:
        raise BackendError(
            f"PostgreSQL schema {schema!r} is at version {version}, this rheo-flow needs "
            f"{SCHEMA_VERSION}: run  rheo-flow migrate --url URL  (or open with migrate=True)"
        )
    return await _apply_migrations(conn, schema)


async def _apply_migrations(conn: asyncpg.Connection, schema: str) -> int:
    async with conn.transaction():
        # Several processes may start at once: one migrates, the others wait here
        # and then find the schema current.
        await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                           f"rheo_flow.migrate:{schema}")
        exists = await conn.fetchval(
            "SELECT to_regclass($1) IS NOT NULL", render("{s}." + VERSION_TABLE, schema))
        if not exists:
            for statement in BOOTSTRAP:
                await conn.execute(render(statement, schema))
        table = render("{s}." + VERSION_TABLE, schema)
        version: int = await conn.fetchval(f"SELECT COALESCE(max(version), 0) FROM {table}")
        if version > SCHEMA_VERSION:
            raise BackendError(
                f"PostgreSQL schema {schema!r} is at version {version}, newer than this "
                f"rheo-flow supports ({SCHEMA_VERSION}): upgrade rheo-flow"
            )
        for migration in MIGRATIONS:
            if migration.version <= version:
                continue
            for statement in migration.statements:
                await conn.execute(render(statement, schema))
            await conn.execute(
                f"INSERT INTO {table} (version, description) VALUES ($1, $2)",
                migration.version, migration.description,
            )
            log.info("applied rheo_flow schema migration %d to %s", migration.version, schema)
        return SCHEMA_VERSION


async def migrate(url_or_pool: str | asyncpg.Pool | asyncpg.Connection,
                  schema: str = DEFAULT_SCHEMA) -> int:
    """Create or upgrade the rheo_flow schema; returns the schema version now in place.

    ``url_or_pool`` is a ``postgresql://`` URL (its ``schema`` query option, when
    present, wins over ``schema``), an asyncpg pool or a connection. Safe to run
    from several processes at once: migrations apply under a transaction-scoped
    advisory lock, each exactly once. A schema newer than this code is refused.
    """
    driver = _driver()
    if isinstance(url_or_pool, str):
        backend = PostgresBackend.from_url(url_or_pool)
        schema = backend.schema if "schema=" in url_or_pool else _check_schema(schema)
        assert backend._url is not None
        try:
            conn = await driver.connect(backend._url)
        except (TimeoutError, OSError, driver.PostgresError, driver.InterfaceError) as exc:
            raise unreachable("PostgreSQL", url_or_pool, exc) from None
        try:
            return await _ensure_schema(conn, schema, apply=True)
        finally:
            await conn.close()
    schema = _check_schema(schema)
    if isinstance(url_or_pool, driver.Pool):
        async with url_or_pool.acquire() as pooled:
            return await _ensure_schema(pooled, schema, apply=True)
    if isinstance(url_or_pool, driver.Connection):
        return await _ensure_schema(url_or_pool, schema, apply=True)
    raise InvalidArgument(
        f"migrate() needs a postgresql:// URL, an asyncpg pool or a connection, "
        f"got {type(url_or_pool).__name__}"
    )
