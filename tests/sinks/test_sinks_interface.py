"""The sink interface on an in-memory sink: per-message results, bisecting to the poison
rows, retries, and the pipeline integration (SinkHandler, sink_batcher)."""

from __future__ import annotations

import datetime
import math
import time
from typing import Any

import pytest

from rheo_flow import Event, InvalidArgument, Lease
from rheo_flow.pipeline import BatchSize, Message
from rheo_flow.pipeline.testing import test_batch
from rheo_flow.sinks import (
    Column,
    CommitInfo,
    RowBatch,
    RowMapping,
    RowStatus,
    Sink,
    SinkHandler,
    WriteReport,
    data_bytes,
    sink_batcher,
)

COLUMNS = [Column("event_id", "VARCHAR", "event.id"), Column("n", "BIGINT", "data.n")]


class Poison(ValueError):
    """What the fake database raises for a row it refuses."""


class MemorySink(Sink):
    """A table in a dict; rows with ``n < 0`` violate a constraint; ``down`` fails writes."""

    name = "memory"

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(RowMapping(COLUMNS), **kwargs)
        self.table: dict[str, int] = {}
        self.transactions: list[int] = []
        self.down = False
        self.settle = False
        self.opened = 0

    async def _open(self) -> None:
        self.opened += 1

    async def _close(self) -> None:
        pass

    async def _write_rows(self, rows: RowBatch) -> WriteReport:
        if self.down:
            raise ConnectionResetError("server closed the connection")
        if any(isinstance(n, int) and n < 0 for _, n in rows.values):
            raise Poison("CHECK (n >= 0) violated")
        replayed = [i for i, (key, _) in enumerate(rows.values) if key in self.table]
        for key, n in rows.values:
            self.table.setdefault(key, n)
        self.transactions.append(len(rows))
        return WriteReport(replayed=replayed,
                           settled=list(range(len(rows))) if self.settle else [])

    def _is_data_error(self, exc: BaseException) -> bool:
        return isinstance(exc, Poison)


def messages(values: list[Any]) -> list[Message]:
    now = int(time.time() * 1000)
    out = []
    for i, data in enumerate(values, start=1):
        event = Event(stream="s", partition=0, sequence=i, id=f"e{i}", type="t", data=data,
                      key=None, headers={}, appended_at_ms=now)
        out.append(Message(Lease(lease_id=f"{i:032x}", receipt="r", group="g",
                                 consumer_id="c", event=event, attempt=1,
                                 deadline_ms=now + 60_000)))
    return out


async def test_every_row_written_in_one_transaction() -> None:
    sink = MemorySink()
    results = await sink.write(messages([{"n": i} for i in range(100)]))
    assert [r.status for r in results] == [RowStatus.WRITTEN] * 100
    assert all(r.ok and not r.settled and not r.replayed for r in results)
    assert sink.transactions == [100]
    assert sink.opened == 1  # opened on first use


async def test_bisecting_isolates_the_poison_rows_and_writes_their_neighbours() -> None:
    sink = MemorySink()
    poison = {3, 64, 65, 999}
    results = await sink.write(messages([{"n": -i if i in poison else i} for i in range(1000)]))
    bad = {i for i, r in enumerate(results) if r.status is RowStatus.INVALID}
    assert bad == poison
    assert all(results[i].ok for i in range(1000) if i not in poison)
    assert len(sink.table) == 996
    assert "Poison: CHECK (n >= 0) violated" in results[3].reason
    # Each poison row costs about 2 * log2(1000) failed writes, far below one per row.
    stats = sink.stats()
    assert stats.invalid == 4
    assert stats.written == 996
    assert stats.failed_writes <= 4 * 2 * math.ceil(math.log2(1000))
    assert sum(sink.transactions) == 996


async def test_a_transient_failure_retries_the_whole_batch_without_bisecting() -> None:
    sink = MemorySink()
    sink.down = True
    results = await sink.write(messages([{"n": i} for i in range(50)]))
    assert {r.status for r in results} == {RowStatus.RETRY}
    assert "ConnectionResetError" in results[0].reason
    assert sink.stats().failed_writes == 1
    assert sink.stats().retry == 50


async def test_unmappable_rows_are_invalid_before_any_write() -> None:
    sink = MemorySink()
    results = await sink.write(messages([{"n": 1}, {"n": "x"}, {"n": 2}, "not-a-dict"]))
    assert [r.status for r in results] == [RowStatus.WRITTEN] * 4
    required = MemorySink()
    required._mapping = RowMapping([COLUMNS[0], Column("n", "BIGINT", "data.n",
                                                       nullable=False)])
    results = await required.write(messages([{"n": 1}, {}, {"n": 2}]))
    assert [r.status for r in results] == [RowStatus.WRITTEN, RowStatus.INVALID,
                                           RowStatus.WRITTEN]
    assert "column n is required" in results[1].reason
    assert required.transactions == [2]


async def test_replayed_and_settled_rows_are_reported_and_on_commit_is_called() -> None:
    commits: list[CommitInfo] = []
    sink = MemorySink(on_commit=commits.append)
    batch = messages([{"n": i} for i in range(10)])
    await sink.write(batch[:4])
    sink.settle = True
    results = await sink.write(batch)
    assert [r.replayed for r in results] == [True] * 4 + [False] * 6
    assert all(r.settled for r in results)
    assert [(c.rows, c.replayed, c.settled) for c in commits] == [(4, 0, 0), (10, 4, 10)]
    assert sink.stats().replayed == 4


async def test_a_closed_sink_cannot_be_reopened() -> None:
    sink = MemorySink()
    async with sink:
        pass
    with pytest.raises(InvalidArgument, match="was closed"):
        await sink.write(messages([{"n": 1}]))


# Pipeline integration -----------------------------------------------------------------------


async def test_sink_handler_acks_writes_rejects_poison_and_retries_failures() -> None:
    sink = MemorySink()
    handler = SinkHandler(sink, retry_delay_ms=250)
    result = await test_batch(handler, [{"n": 1}, {"n": -2}, {"n": 3}],
                              batchers={"default": sink_batcher(max_rows=10)})
    assert [m.data for m in result.acked] == [{"n": 1}, {"n": 3}]
    (rejected,) = result.rejected
    assert rejected.data == {"n": -2}
    assert rejected.reason is not None
    assert rejected.reason.startswith("sink_invalid: Poison")
    sink.down = True
    result = await test_batch(handler, [{"n": 4}, {"n": 5}],
                              batchers={"default": sink_batcher(max_rows=10)})
    assert len(result.nacked) == 2
    assert all(m.retry_delay_ms == 250 for m in result.nacked)
    assert all((m.reason or "").startswith("sink_retry: ConnectionResetError") for m in
               result.nacked)


async def test_rows_settled_by_the_sink_are_only_released() -> None:
    sink = MemorySink()
    sink.settle = True
    result = await test_batch(SinkHandler(sink), [{"n": 1}, {"n": 2}],
                              batchers={"default": sink_batcher(max_rows=10)})
    # Recorded as acked, through confirm: no second settle call of their leases.
    assert [m.outcome for m in result.successful] == ["ack", "ack"]


async def test_other_batchers_pass_through_untouched() -> None:
    sink = MemorySink()
    handler = SinkHandler(sink, batcher="sink")
    result = await test_batch(handler, [{"n": 1}], batchers={"default": sink_batcher()})
    assert len(result.acked) == 1
    assert sink.table == {}


async def test_sink_batcher_triggers_by_count_bytes_and_age() -> None:
    count = sink_batcher(max_rows=3, max_age=5)
    assert count.batch_size == 3
    assert count.batch_timeout == 5
    both = sink_batcher(max_rows=3, max_bytes=45)
    assert isinstance(both.batch_size, BatchSize)
    assert both.max_messages == 3
    sink = MemorySink()
    # 3 small rows fill a batch by count; a 35-byte row leaves no room for another.
    data = [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4, "pad": "x" * 20},
            {"n": 5, "pad": "y" * 20}, {"n": 6}]
    result = await test_batch(SinkHandler(sink), data, batchers={"default": both})
    assert [info.size for info, _ in result.batches] == [3, 1, 2]
    assert [info.trigger for info, _ in result.batches] == ["size", "size", "drain"]
    assert data_bytes(messages([{"n": 1}])[0]) == len('{"n":1}')
    # Sized as the sinks write it: a date is its ISO text, a non-ASCII letter two bytes.
    assert data_bytes(messages([{"d": datetime.date(2026, 12, 2), "s": "é"}])[0]) == len(
        '{"d":"2026-12-02","s":"xx"}')
    assert data_bytes(messages([{"x": {1, 2}}])[0]) > 0  # not encodable: never raises
    with pytest.raises(InvalidArgument, match="max_bytes"):
        sink_batcher(max_bytes=0)


def test_sink_handler_checks_its_arguments() -> None:
    with pytest.raises(InvalidArgument, match="sink must be a Sink"):
        SinkHandler(object())  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="retry_delay_ms"):
        SinkHandler(MemorySink(), retry_delay_ms=-1)
