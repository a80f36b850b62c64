"""The PostgreSQL sink: batches bulk-loaded with ``COPY`` in one transaction each.

Two loads, chosen by ``load``:

* ``staged``: ``COPY`` (binary, ``copy_records_to_table``) into a temporary
  staging table, then ``INSERT ... SELECT ... ON CONFLICT (key) DO NOTHING``
  into the target, in one transaction;
* ``auto`` (default): ``COPY`` straight into the target, and when that meets a
  key conflict (a row already there), the transaction is rolled back and redone
  through the staging table. The sink's frontier already skips redelivered
  rows, so conflicts are rare and most batches cost one ``COPY``.

Exactly-once effect:

* ``settle_with=backend`` (a :class:`~rheo_flow.backends.PostgresBackend` in the
  same database): the batch's leases are acked, and the group's frontier moved,
  inside the sink's transaction; rows and acks commit together or not at all.
* otherwise the sink-side frontier (progress table) is written in the sink's
  transaction and a redelivered row is skipped; the key keeps each row once.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from .._backends._guard import masked_cause
from .._backends._urls import redact_url, require_driver, scrub_secrets, unreachable
from .._model._errors import InvalidArgument
from .._support._call_retry import retried
from ._frontier import (
    GroupRows,
    Span,
    SpanPlan,
    by_group,
    create_table_sql,
    plan_spans,
    progress_table_for,
    split_replayed,
)
from ._mapping import Column, RowMapping, event_columns, quote_ident, quote_table
from ._sink import CommitInfo, Load, RowBatch, Sink, SinkStats, WriteReport, check_load

if TYPE_CHECKING:
    import asyncpg

    from .._backends.postgres import PostgresBackend

__all__ = ["PostgresSink"]

log = logging.getLogger("rheo_flow.sinks")

_CONFLICT_RETRIES: Final = 3
"""Deadlocks and serialization failures are retried this many times before ``retry``."""


def _driver() -> Any:
    require_driver("PostgreSQL sink", "postgres", "asyncpg")
    import asyncpg

    return asyncpg


class PostgresSink(Sink):
    """Writes batches to a PostgreSQL table through ``COPY``, idempotently on the key.

    Give it the host's pool (``pool=``, never closed by the sink) or a URL
    (``url=``: the sink owns a pool of up to ``pool_max_size`` connections).
    ``table`` is ``name`` or ``schema.name``; ``columns`` map messages to rows
    (default :func:`event_columns` with ``JSONB`` data); ``key`` names the
    idempotence key column. With ``create`` the table (and its schema) is
    created when missing, with a primary key on ``key``; an existing table
    must have a unique index on ``key`` alone.

    ``settle_with``: the :class:`~rheo_flow.backends.PostgresBackend` of the
    stream, when it lives in the sink's database; each batch's leases are
    then acked in the sink's own transaction (the pipeline only releases
    them). Otherwise ``progress`` (default: on unless ``settle_with``) keeps
    the sink-side frontier in ``progress_table`` (default ``rheo_sink_progress``
    in the table's schema); call :meth:`reset_progress` before a deliberate
    replay meant to rewrite rows.
    """

    name = "postgres"

    def __init__(
        self,
        *,
        table: str,
        columns: Sequence[Column] | None = None,
        key: str = "event_id",
        pool: asyncpg.Pool | None = None,
        url: str | None = None,
        create: bool = True,
        progress: bool | None = None,
        progress_table: str | None = None,
        load: Load = "auto",
        settle_with: PostgresBackend | None = None,
        pool_max_size: int = 4,
        on_commit: Callable[[CommitInfo], None] | None = None,
    ) -> None:
        _driver()
        mapping = RowMapping(event_columns(json_type="JSONB") if columns is None else columns,
                             key)
        super().__init__(mapping, on_commit=on_commit)
        if (pool is None) == (url is None):
            raise InvalidArgument("PostgresSink needs exactly one of pool= or url=")
        if url is not None and (not isinstance(url, str) or "://" not in url):
            raise InvalidArgument(f"not a PostgreSQL URL: {redact_url(str(url))!r}")
        if isinstance(pool_max_size, bool) or not isinstance(pool_max_size, int) \
                or pool_max_size < 1:
            raise InvalidArgument(f"pool_max_size must be a positive integer, "
                                  f"got {pool_max_size!r}")
        if settle_with is not None and not callable(getattr(settle_with, "ack_in_transaction",
                                                            None)):
            raise InvalidArgument(
                "settle_with must be the PostgresBackend of the stream (in the sink's database)")
        self._pool: asyncpg.Pool | None = pool
        self._owns_pool = pool is None
        self._url = url
        self._pool_max = pool_max_size
        self._table = table
        self._table_sql = quote_table(table)
        schema, _, bare = table.rpartition(".")
        self._schema = schema or None
        self._bare = bare
        self._settle_with = settle_with
        self._progress = settle_with is None if progress is None else bool(progress)
        progress_name = progress_table or progress_table_for(table)
        self._progress_sql = quote_table(progress_name, "progress table")
        self._progress_name = progress_name.rpartition(".")[2]
        self._create = bool(create)
        self._load = check_load(load)
        self._stage = "rheo_stage_" + hashlib.sha1(table.encode()).hexdigest()[:16]
        self._sql = _Statements(self._table_sql, self._progress_sql, self._stage, mapping)
        self._lock_key = f"rheo_flow.sink:{table}"

    @property
    def table(self) -> str:
        """The target table's name."""
        return self._table

    @property
    def settles(self) -> bool:
        """Whether leases are acked in the sink's transaction (``settle_with``)."""
        return self._settle_with is not None

    # Lifecycle -------------------------------------------------------------------

    async def _open(self) -> None:
        driver = _driver()
        url = self._url
        if self._pool is None and url is not None:  # a host's pool is never released here
            try:
                self._pool = await driver.create_pool(
                    url, min_size=1, max_size=self._pool_max,
                    server_settings={"application_name": "rheo_flow.sink", "jit": "off"})
            except (TimeoutError, OSError, driver.PostgresError, driver.InterfaceError) as exc:
                # asyncpg's message may quote the URL: the cause kept is a masked copy.
                raise unreachable("PostgreSQL", url, exc) from masked_cause(
                    exc, lambda text: scrub_secrets(text, url))
        try:
            if self._settle_with is not None:
                # Before the DDL below: the backend may be creating its schema, the one
                # the sink's table often shares.
                await self._settle_with.open()
            async with self._open_pool().acquire() as conn, conn.transaction():
                # Serialise concurrent creators of the same table.
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                                   self._lock_key)
                if self._create:
                    if self._schema is not None:
                        await conn.execute(
                            f"CREATE SCHEMA IF NOT EXISTS {quote_ident(self._schema)}")
                    await conn.execute(self._mapping.create_table(self._table_sql))
                await self._check_table(conn)
                if self._settle_with is not None:
                    await self._check_same_database(conn, self._settle_with)
                if self._progress:
                    await conn.execute(create_table_sql(self._progress_sql, primary_key=True))
        except BaseException:
            await self._release_pool()
            raise

    async def _check_table(self, conn: asyncpg.Connection) -> None:
        oid = await conn.fetchval("SELECT to_regclass($1)::oid", self._table_sql)
        if oid is None:
            raise InvalidArgument(f"PostgreSQL table {self._table} does not exist "
                                  "(create=False)")
        found = {r[0] for r in await conn.fetch(
            "SELECT attname FROM pg_attribute WHERE attrelid = $1 AND attnum > 0 "
            "AND NOT attisdropped", oid)}
        missing = [n for n in self._mapping.names if n not in found]
        if missing:
            raise InvalidArgument(f"PostgreSQL table {self._table} has no column(s) "
                                  f"{', '.join(missing)}")
        unique = await conn.fetchval(
            "SELECT count(*) FROM pg_index i JOIN pg_attribute a "
            "ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0] "
            "WHERE i.indrelid = $1 AND i.indisunique AND i.indnkeyatts = 1 "
            "AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2",
            oid, self._mapping.key)
        if not unique:
            raise InvalidArgument(
                f"PostgreSQL table {self._table} needs a primary key or unique index on "
                f"{self._mapping.key} alone: the sink is idempotent on it")

    @staticmethod
    async def _check_same_database(conn: asyncpg.Connection, backend: PostgresBackend
                                   ) -> None:
        # Acks in the sink's transaction need the backend's tables on this connection.
        if await conn.fetchval("SELECT to_regnamespace($1)", backend.schema) is None:
            raise InvalidArgument(
                f"settle_with: the backend's schema {backend.schema!r} is not in the sink's "
                "database; the sink must write to the database of the stream")

    async def _close(self) -> None:
        await self._release_pool()

    async def _release_pool(self) -> None:
        pool = self._pool
        if pool is not None and self._owns_pool:
            self._pool = None
            await pool.close()

    # Writing -----------------------------------------------------------------------

    def _open_pool(self) -> asyncpg.Pool:
        """The pool of an open sink."""
        if self._pool is None:
            raise InvalidArgument(f"the PostgreSQL sink of {self._table} is not open")
        return self._pool

    async def _write_rows(self, rows: RowBatch) -> WriteReport:
        pool = self._open_pool()
        load = _LoadAttempts(self._progress_name, self._stats, staged=self._load == "staged")
        async with pool.acquire() as conn:
            # The fallback to the staged load is one more attempt, not a conflict.
            return await retried(lambda _: self._transaction(conn, rows, load.staged),
                                 when=load.retry, attempts=_CONFLICT_RETRIES + 1)

    async def _transaction(self, conn: asyncpg.Connection, rows: RowBatch, staged: bool
                           ) -> WriteReport:
        async with conn.transaction():
            replayed: list[int] = []
            plans: list[tuple[GroupRows, SpanPlan]] = []
            if self._progress:
                # Spans are read without a lock: a concurrent batch of the same group
                # holds other sequences, and save_spans replaces only the spans read.
                for group in by_group(rows.messages):
                    spans = [Span(*r) for r in await conn.fetch(
                        self._sql.read_spans, self._table, group.stream, group.group,
                        *group.bounds)]
                    skipped, fresh = split_replayed(spans, group)
                    replayed += skipped
                    plans.append((group, plan_spans(spans, fresh)))
            values = rows.values_without(replayed)
            if values:
                if staged:
                    await conn.execute(self._sql.create_stage)
                    await conn.copy_records_to_table(
                        self._stage, records=values, columns=self._mapping.names,
                        schema_name="pg_temp")
                    await conn.execute(self._sql.insert_staged)
                else:
                    await conn.copy_records_to_table(
                        self._bare, records=values, columns=self._mapping.names,
                        schema_name=self._schema)
            for group, plan in plans:
                if plan:
                    await conn.execute(
                        self._sql.save_spans, self._table, group.stream, group.group,
                        [s.part for s in plan.delete], [s.lo for s in plan.delete],
                        [s.hi for s in plan.delete], [s.part for s in plan.insert],
                        [s.lo for s in plan.insert], [s.hi for s in plan.insert])
            settled: list[int] = []
            if self._settle_with is not None:
                # Acked last: the delivery and frontier row locks are held only until
                # the commit that follows.
                results = await self._settle_with.ack_in_transaction(
                    conn, [m.lease for m in rows.messages])
                settled = [i for i, result in enumerate(results) if result.ok]
        return WriteReport(replayed=replayed, settled=settled)

    async def reset_progress(self, stream: str, group: str) -> int:
        """Forget what was written for (stream, group), so that a deliberate replay
        writes rows again (rows already present are still kept once, by key).
        Returns how many spans were removed."""
        await self.open()
        if not self._progress:
            return 0
        status: str = await self._open_pool().execute(
            f"DELETE FROM {self._progress_sql} WHERE sink = $1 AND stream = $2 AND grp = $3",
            self._table, stream, group)
        return int(status.rsplit(" ", 1)[-1])

    async def progress(self, stream: str, group: str) -> list[Span]:
        """The spans of sequences written for (stream, group), by partition and sequence."""
        await self.open()
        if not self._progress:
            return []
        return [Span(*r) for r in await self._open_pool().fetch(
            f"SELECT part, lo, hi FROM {self._progress_sql} "
            "WHERE sink = $1 AND stream = $2 AND grp = $3 ORDER BY part, lo",
            self._table, stream, group)]

    def _is_data_error(self, exc: BaseException) -> bool:
        driver = _driver()
        return isinstance(exc, driver.DataError | driver.IntegrityConstraintViolationError
                          | TypeError | ValueError | OverflowError) \
            and not isinstance(exc, InvalidArgument)


class _LoadAttempts:
    """What a failed write of one batch does next (the ``when`` of its retry loop).

    Two batches of one group merging spans at once (a unique violation on the
    progress table), a deadlock or a serialization failure: retry, up to
    ``_CONFLICT_RETRIES`` tries in all. A row already in the table (any other
    unique violation) under the direct ``COPY``: redo the batch through the
    staging table, whose INSERT skips rows already present.
    """

    def __init__(self, progress_table: str, stats: SinkStats, *, staged: bool) -> None:
        self._progress_table = progress_table
        self._stats = stats
        self.staged = staged
        """Whether the next attempt loads through the staging table."""
        self._conflicts = 0

    def retry(self, exc: BaseException) -> bool:
        """Whether to try again after ``exc`` (switching to the staged load if it says so)."""
        driver = _driver()
        if isinstance(exc, driver.UniqueViolationError) and (
                getattr(exc, "table_name", None) != self._progress_table):
            if self.staged:
                return False
            self._stats.fallbacks += 1
            self.staged = True
            return True
        if isinstance(exc, driver.UniqueViolationError | driver.DeadlockDetectedError
                      | driver.SerializationError):
            self._conflicts += 1
            return self._conflicts < _CONFLICT_RETRIES
        return False


class _Statements:
    """Every statement, built once for the sink's table."""

    def __init__(self, table_sql: str, progress_sql: str, stage: str,
                 mapping: RowMapping) -> None:
        cols = mapping.column_list
        stage_sql = f"pg_temp.{quote_ident(stage)}"
        # Only the mapped columns, without constraints; emptied by every commit (only
        # transactions that touched it pay for that).
        self.create_stage = (
            f"CREATE TEMP TABLE IF NOT EXISTS {quote_ident(stage)} ON COMMIT DELETE ROWS "
            f"AS SELECT {cols} FROM {table_sql} WITH NO DATA")
        self.insert_staged = (
            f"INSERT INTO {table_sql} ({cols}) SELECT {cols} FROM {stage_sql} "
            f"ON CONFLICT ({quote_ident(mapping.key)}) DO NOTHING")
        where = "sink = $1 AND stream = $2 AND grp = $3"
        self.read_spans = (
            f"SELECT part, lo, hi FROM {progress_sql} WHERE {where} AND hi >= $4 AND lo <= $5")
        # Merged spans replace exactly the spans they absorb (part, lo and hi: a span
        # a concurrent batch replaced meanwhile is left alone), in one statement;
        # reading `gone` makes the delete run first (a merged span may keep the key
        # of one it replaces).
        self.save_spans = (
            f"WITH gone AS (DELETE FROM {progress_sql} p WHERE {where} "
            "AND (p.part, p.lo, p.hi) IN "
            "(SELECT * FROM unnest($4::integer[], $5::bigint[], $6::bigint[])) RETURNING 1) "
            f"INSERT INTO {progress_sql} (sink, stream, grp, part, lo, hi) "
            "SELECT $1, $2, $3, u.part, u.lo, u.hi "
            "FROM unnest($7::integer[], $8::bigint[], $9::bigint[]) AS u(part, lo, hi) "
            "WHERE (SELECT count(*) FROM gone) >= 0")
