"""The sink interface: write a batch of messages, get one result per message.

:meth:`Sink.write` maps every message to a row, writes the rows in one
transaction and reports, per message, whether the row is written, should be
retried later (a transient failure: nothing was written), or is invalid (the
database refused it: dead-letter it). A batch the database refuses because of
its data is split in halves, each written on its own, down to the rows at
fault: one poison row costs about ``2 * log2(batch size)`` extra writes, and
its neighbours are still written.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Self, cast

from .._model._errors import InvalidArgument
from .._model._failure import truncated
from ._mapping import MappingError, RowMapping

if TYPE_CHECKING:
    from ..pipeline import Message

__all__ = [
    "CommitInfo",
    "Load",
    "RowBatch",
    "RowResult",
    "RowStatus",
    "Sink",
    "SinkStats",
    "WriteReport",
    "check_load",
]

log = logging.getLogger("rheo_flow.sinks")

MAX_REASON = 500

Load = Literal["auto", "staged"]
"""``auto``: load straight into the table, and redo the batch through the staging
table when it meets a key conflict; ``staged``: always through the staging table."""


def check_load(load: object) -> Load:
    """``auto`` or ``staged``."""
    if load not in ("auto", "staged"):
        raise InvalidArgument(f'load must be "auto" or "staged", got {load!r}')
    return load


class RowStatus(enum.StrEnum):
    """What became of one message's row."""

    WRITTEN = "written"
    """The row is in the table (written now, or already written before)."""
    RETRY = "retry"
    """A transient failure (connection lost, lock conflict...): nothing was written; retry."""
    INVALID = "invalid"
    """The database refused the row (type, constraint) or it could not be mapped: dead-letter."""


@dataclass(frozen=True, slots=True)
class RowResult:
    """The outcome of writing one message."""

    status: RowStatus
    reason: str = ""
    """Why the row was not written (empty when written)."""
    settled: bool = False
    """The message's lease was acked in the sink's own transaction: only release it."""
    replayed: bool = False
    """The row had been written by an earlier batch (a redelivery); it was skipped."""

    @property
    def ok(self) -> bool:
        """Whether the row is written."""
        return self.status is RowStatus.WRITTEN


_WRITTEN = RowResult(RowStatus.WRITTEN)
_WRITTEN_SETTLED = RowResult(RowStatus.WRITTEN, settled=True)
_WRITTEN_REPLAYED = (RowResult(RowStatus.WRITTEN, replayed=True),
                     RowResult(RowStatus.WRITTEN, settled=True, replayed=True))


@dataclass(frozen=True, slots=True)
class RowBatch:
    """Rows to write in one transaction, as a sink implementation receives them:
    three parallel lists."""

    positions: list[int]
    """Position of each row's message in the batch given to :meth:`Sink.write`."""
    messages: list[Message]
    values: list[tuple[Any, ...]]
    """The row tuples, in the mapping's column order."""

    def __len__(self) -> int:
        return len(self.values)

    def halves(self) -> tuple[RowBatch, RowBatch]:
        """The first and the second half."""
        mid = len(self.values) // 2
        return (RowBatch(self.positions[:mid], self.messages[:mid], self.values[:mid]),
                RowBatch(self.positions[mid:], self.messages[mid:], self.values[mid:]))

    def values_without(self, skip: Sequence[int]) -> list[tuple[Any, ...]]:
        """The row tuples, except those at the given indexes (of this batch)."""
        if not skip:
            return self.values
        gone = set(skip)
        return [v for i, v in enumerate(self.values) if i not in gone]


@dataclass(frozen=True, slots=True)
class WriteReport:
    """What one committed transaction did, by position in the rows it was given."""

    replayed: Sequence[int] = ()
    """Indexes (in the :class:`RowBatch`) of rows skipped as already written."""
    settled: Sequence[int] = ()
    """Indexes of rows whose lease was acked in the same transaction."""


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """Passed to ``on_commit`` right after each committed transaction, before any ack."""

    rows: int
    """Rows in the transaction."""
    replayed: int
    """Of which skipped as already written."""
    settled: int
    """Of which acked in the same transaction."""
    seconds: float
    """Time spent in the transaction."""


@dataclass(slots=True)
class SinkStats:
    """Counters of one sink since it was built."""

    batches: int = 0
    """Calls to :meth:`Sink.write`."""
    transactions: int = 0
    """Committed write transactions (bisecting makes several per batch)."""
    written: int = 0
    """Rows written (including rows the key showed already present)."""
    replayed: int = 0
    """Rows skipped as already written (redeliveries)."""
    settled: int = 0
    """Rows whose lease was acked in the sink's transaction."""
    invalid: int = 0
    retry: int = 0
    failed_writes: int = 0
    """Transactions that failed (each bisection step that hit a bad row counts)."""
    fallbacks: int = 0
    """Direct loads that met a key conflict and were redone through the staging table."""
    exports: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    """Failed transactions by exception type."""

    def copy(self) -> SinkStats:
        """A detached copy."""
        return replace(self, errors=dict(self.errors))


class Sink(ABC):
    """Base class of sinks: a table written in batches through a :class:`RowMapping`.

    Subclasses implement :meth:`_open`, :meth:`_close`, :meth:`_write_rows` (one
    transaction, raising on failure) and :meth:`_is_data_error` (whether a
    failure was caused by the rows, so that bisecting can isolate them).
    ``on_commit`` is called with a :class:`CommitInfo` after every committed
    transaction (metrics, tests).

    Use it as ``async with sink:`` or call :meth:`open` / :meth:`close`;
    :meth:`write` opens it on first use.
    """

    name: str = "sink"
    """Short name used in logs."""

    def __init__(self, mapping: RowMapping, *,
                 on_commit: Callable[[CommitInfo], None] | None = None) -> None:
        if not isinstance(mapping, RowMapping):
            raise InvalidArgument(f"mapping must be a RowMapping, got {type(mapping).__name__}")
        if on_commit is not None and not callable(on_commit):
            raise InvalidArgument("on_commit must be a function of a CommitInfo")
        self._mapping = mapping
        self._on_commit = on_commit
        self._stats = SinkStats()
        self._opened = False
        self._closed = False
        self._open_lock = asyncio.Lock()

    @property
    def mapping(self) -> RowMapping:
        """The columns and key of the sink's table."""
        return self._mapping

    def stats(self) -> SinkStats:
        """A snapshot of the counters."""
        return self._stats.copy()

    # Lifecycle -------------------------------------------------------------------

    async def open(self) -> Self:
        """Connect and create the table (and the progress table) when missing. Idempotent."""
        if self._opened:
            return self
        async with self._open_lock:
            if self._closed:
                raise InvalidArgument(f"{self.name} sink was closed; build a new one")
            if not self._opened:
                await self._open()
                self._opened = True
        return self

    async def close(self) -> None:
        """Release what :meth:`open` acquired (never a host-owned pool or connection)."""
        async with self._open_lock:
            self._closed = True
            if self._opened:
                self._opened = False
                await self._close()

    async def __aenter__(self) -> Self:
        return await self.open()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    # Writing -----------------------------------------------------------------------

    async def write(self, messages: Sequence[Message]) -> list[RowResult]:
        """Write one row per message; returns one result per message, in order.

        Never raises for a bad row or a failed database: those are results
        (``invalid``, ``retry``).
        """
        await self.open()
        self._stats.batches += 1
        results: list[RowResult | None] = [None] * len(messages)
        try:
            batch = RowBatch(list(range(len(messages))), list(messages),
                             self._mapping.rows(messages))
        except Exception:
            batch = self._map_one_by_one(messages, results)
        if batch.values:
            await self._write_or_split(batch, results)
        stats = self._stats
        if results.count(_WRITTEN) == len(results):  # the common case, counted at C speed
            stats.written += len(results)
            return cast(list[RowResult], results)
        out: list[RowResult] = []
        invalid: list[str] = []
        for index, r in enumerate(results):
            if r is None:
                raise RuntimeError(f"{self.name} sink: row {index} of the batch got no result")
            out.append(r)
            if r.status is RowStatus.WRITTEN:
                stats.written += 1
                stats.replayed += r.replayed
                stats.settled += r.settled
            elif r.status is RowStatus.RETRY:
                stats.retry += 1
            else:
                stats.invalid += 1
                invalid.append(r.reason)
        if invalid:
            log.warning("%s sink: %d of %d rows are invalid, e.g. %s", self.name, len(invalid),
                        len(messages), invalid[0])
        return out

    def _map_one_by_one(self, messages: Sequence[Message], results: list[RowResult | None]
                        ) -> RowBatch:
        batch = RowBatch([], [], [])
        row_of = self._mapping.row
        for i, m in enumerate(messages):
            try:
                batch.values.append(row_of(m))
            except MappingError as exc:
                results[i] = RowResult(RowStatus.INVALID, _bounded(str(exc)))
                continue
            batch.positions.append(i)
            batch.messages.append(m)
        return batch

    async def _write_or_split(self, rows: RowBatch, results: list[RowResult | None]) -> None:
        started = time.perf_counter()
        try:
            report = await self._write_rows(rows)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._stats.failed_writes += 1
            name = type(exc).__name__
            self._stats.errors[name] = self._stats.errors.get(name, 0) + 1
            reason = _bounded(f"{name}: {exc}")
            if not self._is_data_error(exc):
                log.warning("%s sink: writing %d rows failed, to retry: %s", self.name,
                            len(rows), reason)
                retry = RowResult(RowStatus.RETRY, reason)
                for position in rows.positions:
                    results[position] = retry
                return
            if len(rows) == 1:
                results[rows.positions[0]] = RowResult(RowStatus.INVALID, reason)
                return
            first, second = rows.halves()
            await self._write_or_split(first, results)
            await self._write_or_split(second, results)
            return
        self._stats.transactions += 1
        positions = rows.positions
        if len(positions) == len(results):
            results[:] = [_WRITTEN] * len(results)
        else:
            for position in positions:
                results[position] = _WRITTEN
        for i in report.settled:
            results[positions[i]] = _WRITTEN_SETTLED
        for i in report.replayed:
            results[positions[i]] = _WRITTEN_REPLAYED[results[positions[i]] is _WRITTEN_SETTLED]
        if self._on_commit is not None:
            self._on_commit(CommitInfo(len(rows), len(report.replayed), len(report.settled),
                                       time.perf_counter() - started))

    # Implementation hooks ----------------------------------------------------------

    @abstractmethod
    async def _open(self) -> None:
        """Connect; create the tables when asked to."""

    @abstractmethod
    async def _close(self) -> None:
        """Disconnect."""

    @abstractmethod
    async def _write_rows(self, rows: RowBatch) -> WriteReport:
        """Write ``rows`` in one transaction (all or nothing); raise on failure."""

    @abstractmethod
    def _is_data_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` was caused by the rows' values (so retrying cannot help)."""


def _bounded(text: str) -> str:
    return truncated(" ".join(text.split()), MAX_REASON)
