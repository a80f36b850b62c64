"""The DuckDB sink: batches appended to a table of an embedded DuckDB database.

DuckDB calls block, so every one of them runs in one dedicated thread that
owns the sink's connection; each batch is one hop to that thread running a
whole transaction. Rows go in through DuckDB's appender. The table has a
primary key on the mapping's key column, so a row is never stored twice; the
sink-side frontier (:mod:`._frontier`) written in the same transaction lets a
redelivered batch be skipped instead of written again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from .._backends._urls import require_driver
from .._model._errors import InvalidArgument
from .._support._waiting import cancel_and_wait
from ._frontier import (
    Span,
    by_group,
    create_table_sql,
    progress_table_for,
    split_replayed,
    union,
)
from ._mapping import Column, RowMapping, event_columns, quote_ident, quote_table
from ._sink import CommitInfo, Load, RowBatch, Sink, WriteReport, check_load

if TYPE_CHECKING:
    import duckdb

__all__ = ["DuckDBSink"]

log = logging.getLogger("rheo_flow.sinks")

T = TypeVar("T")

_STAGE: Final = "rheo_sink_stage"


def _driver() -> Any:
    require_driver("DuckDB sink", "duckdb", "duckdb")
    import duckdb

    return duckdb


class DuckDBSink(Sink):
    """Writes batches to a DuckDB table, idempotently on the mapping's key.

    ``database`` is a file path (``":memory:"`` for a private in-memory
    database), or pass ``connection=`` to share a host connection (the sink
    works on its own cursor of it, in its own thread, and never closes it).
    ``columns`` map messages to rows (default :func:`event_columns`); ``key``
    names the idempotence key column. With ``create`` the table is created
    when missing, with a primary key on ``key``; an existing table must have a
    primary key or unique constraint on it.

    ``progress`` records what was written per (stream, group, partition) in
    ``progress_table`` (default ``rheo_sink_progress``, in the table's schema),
    in the same transaction as the rows, so a batch
    redelivered after a crash between the commit and the ack is recognised and
    skipped; call :meth:`reset_progress` before a deliberate replay meant to
    rewrite rows.

    Parquet: :meth:`export_parquet` writes the whole table to a directory,
    partitioned by ``partition_by`` columns (hive style, ``col=value/``),
    replacing the previous export at once; with ``export_interval`` (seconds)
    and ``export_dir`` it runs periodically while rows keep arriving, and once
    more on :meth:`close`.
    """

    name = "duckdb"

    def __init__(
        self,
        database: str | os.PathLike[str] = ":memory:",
        *,
        table: str,
        columns: Sequence[Column] | None = None,
        key: str = "event_id",
        create: bool = True,
        progress: bool = True,
        progress_table: str | None = None,
        load: Load = "auto",
        connection: duckdb.DuckDBPyConnection | None = None,
        config: Mapping[str, Any] | None = None,
        export_dir: str | os.PathLike[str] | None = None,
        export_partition_by: str | Sequence[str] | None = None,
        export_interval: float | None = None,
        on_commit: Callable[[CommitInfo], None] | None = None,
    ) -> None:
        _driver()
        mapping = RowMapping(event_columns() if columns is None else columns, key)
        super().__init__(mapping, on_commit=on_commit)
        if connection is not None and database != ":memory:":
            raise InvalidArgument("pass either database= or connection=, not both")
        if not isinstance(database, str | os.PathLike):
            raise InvalidArgument(f"database must be a path or ':memory:', got {database!r}")
        self._database = os.fspath(database)
        self._host_connection = connection
        self._config = dict(config or {})
        self._table = table
        self._table_sql = quote_table(table)
        self._progress = bool(progress)
        self._progress_sql = quote_table(progress_table or progress_table_for(table),
                                         "progress table")
        self._create = bool(create)
        self._load = check_load(load)
        self._export_dir = None if export_dir is None else Path(export_dir)
        self._export_partition_by = self._partition_columns(export_partition_by)
        if export_interval is not None:
            if isinstance(export_interval, bool) or not isinstance(export_interval, int | float) \
                    or export_interval <= 0:
                raise InvalidArgument(f"export_interval must be a positive number of seconds, "
                                      f"got {export_interval!r}")
            if self._export_dir is None:
                raise InvalidArgument("export_interval needs export_dir")
        self._export_interval = export_interval
        self._executor: ThreadPoolExecutor | None = None
        self._con: duckdb.DuckDBPyConnection | None = None
        self._appender: duckdb.Appender | None = None
        self._stage: duckdb.Appender | None = None
        self._progress_appender: duckdb.Appender | None = None
        self._exporter: asyncio.Task[None] | None = None
        self._spans: dict[tuple[str, str], list[Span]] = {}
        self._logged: dict[tuple[str, str], int] = {}
        """Rows of the progress table per (stream, group) (a log of runs until compacted)."""
        self._written_since_export = 0
        self._sql = _Statements(self._table_sql, self._progress_sql, mapping)

    @property
    def table(self) -> str:
        """The target table's name."""
        return self._table

    def _partition_columns(self, value: str | Sequence[str] | None) -> tuple[str, ...]:
        if value is None:
            return ()
        names = (value,) if isinstance(value, str) else tuple(value)
        unknown = [n for n in names if n not in self._mapping.names]
        if not names or unknown:
            raise InvalidArgument(f"partition_by must name columns of {self._table} "
                                  f"({', '.join(self._mapping.names)}), got {value!r}")
        return names

    # Lifecycle -------------------------------------------------------------------

    async def _open(self) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rheo-duckdb")
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._connect)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor
        if self._export_interval is not None:
            self._exporter = asyncio.create_task(self._export_loop(self._export_interval),
                                                 name=f"rheo-duckdb-export-{self._table}")

    async def _close(self) -> None:
        task, self._exporter = self._exporter, None
        if task is not None:
            await cancel_and_wait([task])
            if self._written_since_export and self._export_dir is not None:
                try:
                    await self._export_now(self._export_dir, self._export_partition_by)
                except Exception:
                    log.exception("duckdb sink: the final Parquet export of %s failed",
                                  self._table)
        executor, self._executor = self._executor, None
        if executor is not None:
            try:
                await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
            finally:
                executor.shutdown(wait=True)

    def _connect(self) -> None:
        """Runs in the sink thread: connect, create or check the tables, make the appender."""
        driver = _driver()
        if self._host_connection is not None:
            con = self._host_connection.cursor()
        else:
            try:
                con = driver.connect(self._database, config=self._config)
            except driver.Error as exc:
                raise InvalidArgument(
                    f"cannot open DuckDB database {self._database!r}: {exc}") from exc
        try:
            if "." in self._table and self._create:
                con.execute(f"CREATE SCHEMA IF NOT EXISTS {self._table_sql.split('.')[0]}")
            if self._create:
                con.execute(self._mapping.create_table(self._table_sql))
            self._check_table(con)
            if self._progress:
                # No key: the table holds a few rows per partition, read by one scan.
                con.execute(create_table_sql(self._progress_sql, primary_key=False))
                self._progress_appender = con.appender(self._progress_sql)
            self._appender = con.appender(self._table_sql, columns=list(self._mapping.names))
        except BaseException:
            con.close()
            raise
        self._con = con

    def _check_table(self, con: duckdb.DuckDBPyConnection) -> None:
        schema, _, name = self._table.rpartition(".")
        where = "table_name = ?" + (" AND schema_name = ?" if schema else "")
        params: list[Any] = [name, schema] if schema else [name]
        found = {r[0] for r in con.execute(
            f"SELECT column_name FROM duckdb_columns() WHERE {where}", params).fetchall()}
        if not found:
            raise InvalidArgument(f"DuckDB table {self._table} does not exist (create=False)")
        missing = [n for n in self._mapping.names if n not in found]
        if missing:
            raise InvalidArgument(f"DuckDB table {self._table} has no column(s) "
                                  f"{', '.join(missing)}")
        keys = con.execute(
            f"SELECT constraint_column_names FROM duckdb_constraints() WHERE {where} "
            "AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')", params).fetchall()
        if [self._mapping.key] not in [list(k[0]) for k in keys]:
            raise InvalidArgument(
                f"DuckDB table {self._table} needs a PRIMARY KEY or UNIQUE constraint on "
                f"{self._mapping.key} alone: the sink is idempotent on it")

    def _disconnect(self) -> None:
        con, self._con = self._con, None
        self._appender = self._stage = self._progress_appender = None
        if con is not None:
            con.close()

    def _live(self, part: T | None) -> T:
        """``part`` (the connection, an appender) of the open sink; set together by open."""
        if part is None:
            raise InvalidArgument(f"the DuckDB sink of {self._table} is closed")
        return part

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        executor = self._executor
        if executor is None:
            raise InvalidArgument(f"the DuckDB sink of {self._table} is not open")
        return await asyncio.get_running_loop().run_in_executor(executor, fn, *args)

    # Writing -----------------------------------------------------------------------

    async def _write_rows(self, rows: RowBatch) -> WriteReport:
        report, conflicted = await self._run(self._transaction, rows, self._load == "staged")
        if conflicted:
            self._stats.fallbacks += 1
            report, _ = await self._run(self._transaction, rows, True)
        self._written_since_export += len(rows) - len(report.replayed)
        return report

    def _transaction(self, rows: RowBatch, staged: bool) -> tuple[WriteReport, bool]:
        """Runs in the sink thread: one transaction; ``(report, False)`` once committed,
        ``(empty, True)`` when a direct load met a key conflict (rolled back)."""
        con = self._live(self._con)
        driver = _driver()
        con.execute("BEGIN TRANSACTION")
        try:
            replayed: list[int] = []
            progress: list[tuple[tuple[str, str], list[Span], int]] = []
            if self._progress:
                for group in by_group(rows.messages):
                    key = (group.stream, group.group)
                    spans = self._spans_of(con, key)
                    skipped, fresh = split_replayed(spans, group)
                    replayed += skipped
                    new = [Span(part, lo, hi) for part, part_runs in fresh.items()
                           for lo, hi in part_runs]
                    if new:
                        merged = union(spans + new)
                        logged = self._logged[key] + len(new)
                        # The table is a log of written runs; compact it once it holds
                        # many more rows than the merged spans.
                        compact = logged > 64 + 4 * len(merged)
                        self._log_spans(con, key, merged if compact else new, compact)
                        progress.append((key, merged, len(merged) if compact else logged))
            values = rows.values_without(replayed)
            if values:
                if staged:
                    self._load_staged(con, values)
                else:
                    appender = self._live(self._appender)
                    appender.append_rows(values)
                    appender.flush()
            con.execute("COMMIT")
        except driver.ConstraintException as exc:
            self._abort(con)
            if staged or "duplicate key" not in str(exc).lower():
                raise
            return WriteReport(), True
        except BaseException:
            self._abort(con)
            raise
        for key, merged, logged in progress:
            self._spans[key] = merged
            self._logged[key] = logged
        return WriteReport(replayed=replayed), False

    def _spans_of(self, con: duckdb.DuckDBPyConnection, key: tuple[str, str]) -> list[Span]:
        """The merged spans of (stream, group): read once, then kept up to date here
        (this sink's thread is the only writer of its rows of the progress table)."""
        spans = self._spans.get(key)
        if spans is None:
            stored = [Span(*r) for r in con.execute(
                self._sql.read_spans, [self._table, *key]).fetchall()]
            spans = self._spans[key] = union(stored)
            self._logged[key] = len(stored)
        return spans

    def _log_spans(self, con: duckdb.DuckDBPyConnection, key: tuple[str, str],
                   spans: list[Span], replace: bool) -> None:
        if replace:
            con.execute(self._sql.clear_spans, [self._table, *key])
        appender = self._live(self._progress_appender)
        # An appender, not an INSERT: no statement to parse and plan for every batch.
        appender.append_rows([(self._table, *key, s.part, s.lo, s.hi) for s in spans])
        appender.flush()

    def _abort(self, con: duckdb.DuckDBPyConnection) -> None:
        for appender in (self._appender, self._stage, self._progress_appender):
            if appender is not None:
                with contextlib.suppress(Exception):
                    appender.clear()
        with contextlib.suppress(Exception):
            con.execute("ROLLBACK")

    def _load_staged(self, con: duckdb.DuckDBPyConnection, values: list[tuple[Any, ...]]
                     ) -> None:
        stage = self._stage
        if stage is None:
            con.execute(self._sql.create_stage)
            stage = self._stage = con.appender(_STAGE)
        stage.append_rows(values)
        stage.flush()
        con.execute(self._sql.insert_staged)
        con.execute(self._sql.clear_stage)

    async def reset_progress(self, stream: str, group: str) -> int:
        """Forget what was written for (stream, group), so that a deliberate replay
        writes rows again (rows already present are still kept once, by key).
        Returns how many progress rows were removed."""
        await self.open()
        if not self._progress:
            return 0

        def reset() -> int:
            con = self._live(self._con)
            key = (stream, group)
            removed = len(con.execute(self._sql.clear_spans + " RETURNING 1",
                                      [self._table, *key]).fetchall())
            self._spans.pop(key, None)
            self._logged.pop(key, None)
            return removed

        return await self._run(reset)

    async def progress(self, stream: str, group: str) -> list[Span]:
        """The spans of sequences written for (stream, group), by partition and sequence."""
        await self.open()
        if not self._progress:
            return []

        def read() -> list[Span]:
            con = self._live(self._con)
            return list(self._spans_of(con, (stream, group)))

        return await self._run(read)

    # Reading and exporting ------------------------------------------------------------

    async def query(self, sql: str, parameters: Sequence[Any] | None = None
                    ) -> list[tuple[Any, ...]]:
        """Run ``sql`` on the sink's connection (in its thread) and return every row."""
        await self.open()

        def run() -> list[tuple[Any, ...]]:
            con = self._live(self._con)
            return con.execute(sql, parameters or []).fetchall()

        return await self._run(run)

    async def export_parquet(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        partition_by: str | Sequence[str] | None = None,
    ) -> Path:
        """Write the whole table as Parquet into ``directory`` (default ``export_dir``),
        partitioned by the ``partition_by`` columns (default ``export_partition_by``;
        none: one ``data.parquet`` file).

        The export is written beside the directory and then swapped in, so readers
        see the previous export or the new one, never a half-written one.
        Returns the directory.
        """
        await self.open()
        target = self._export_dir if directory is None else Path(directory)
        if target is None:
            raise InvalidArgument("export_parquet needs a directory (or export_dir=)")
        columns = (self._export_partition_by if partition_by is None
                   else self._partition_columns(partition_by))
        return await self._export_now(target, columns)

    async def _export_now(self, target: Path, columns: tuple[str, ...]) -> Path:
        pending = self._written_since_export
        await self._run(self._export, target, columns)
        self._written_since_export -= pending
        self._stats.exports += 1
        return target

    def _export(self, target: Path, partition_by: tuple[str, ...]) -> None:
        con = self._live(self._con)
        target = target.absolute()
        target.parent.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex[:12]
        fresh = target.with_name(f".{target.name}.new-{tag}")
        old = target.with_name(f".{target.name}.old-{tag}")
        if partition_by:
            dest = fresh
            options = "FORMAT parquet, PARTITION_BY (" + ", ".join(
                quote_ident(c) for c in partition_by) + ")"
        else:
            fresh.mkdir()
            dest = fresh / "data.parquet"
            options = "FORMAT parquet"
        try:
            literal = "'" + str(dest).replace("'", "''") + "'"
            con.execute(f"COPY (SELECT * FROM {self._table_sql}) TO {literal} ({options})")
            if target.exists():
                target.rename(old)
            fresh.rename(target)
        finally:
            shutil.rmtree(fresh, ignore_errors=True)
            shutil.rmtree(old, ignore_errors=True)

    async def _export_loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            if not self._written_since_export:
                continue
            try:
                await self.export_parquet()
            except Exception:
                log.exception("duckdb sink: the periodic Parquet export of %s failed",
                              self._table)

    def _is_data_error(self, exc: BaseException) -> bool:
        driver = _driver()
        return isinstance(exc, driver.DataError | driver.IntegrityError
                          | driver.InvalidInputException | TypeError | ValueError
                          | OverflowError) and not isinstance(exc, InvalidArgument)


class _Statements:
    """Every statement, built once for the sink's table."""

    def __init__(self, table_sql: str, progress_sql: str, mapping: RowMapping) -> None:
        cols = mapping.column_list
        self.create_stage = (
            f"CREATE TEMP TABLE IF NOT EXISTS {_STAGE} AS SELECT {cols} FROM {table_sql} LIMIT 0")
        self.insert_staged = (
            f"INSERT OR IGNORE INTO {table_sql} ({cols}) SELECT {cols} FROM {_STAGE}")
        self.clear_stage = f"DELETE FROM {_STAGE}"
        where = "sink = ? AND stream = ? AND grp = ?"
        self.read_spans = f"SELECT part, lo, hi FROM {progress_sql} WHERE {where}"
        self.clear_spans = f"DELETE FROM {progress_sql} WHERE {where}"
