"""Sink columns from a model (``model_columns``): one column per field, typed from its
annotation, filled from a pipeline's typed messages, into DuckDB and PostgreSQL."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pydantic
import pytest

from rheo_flow import InvalidArgument, NewEvent, Rheo
from rheo_flow.pipeline import Pipeline
from rheo_flow.sinks import Sink, SinkHandler, model_columns, sink_batcher

WaitUntil = Callable[..., Awaitable[None]]
AT = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


class Line(msgspec.Struct):
    sku: str
    qty: int


class OrderStruct(msgspec.Struct):
    order_id: int
    customer: str
    total: float
    paid: bool
    placed_at: dt.datetime
    lines: list[Line]
    note: str | None = None


class OrderModel(pydantic.BaseModel):
    order_id: int
    customer: str
    total: float
    paid: bool
    placed_at: dt.datetime
    lines: list[dict[str, Any]]
    note: str | None = None


@dataclasses.dataclass
class OrderData:
    order_id: int
    customer: str
    total: float
    paid: bool
    placed_at: dt.datetime
    lines: list[dict[str, Any]]
    note: str | None = None


EVENT = ["event_id", "stream", "part", "seq", "type", "appended_at"]
FIELDS = ["order_id", "customer", "total", "paid", "placed_at", "lines", "note"]


@pytest.mark.parametrize("model", [OrderStruct, OrderModel, OrderData])
def test_fields_become_typed_columns(model: type) -> None:
    columns = model_columns(model)
    assert [c.name for c in columns] == EVENT + FIELDS
    fields = {c.name: (c.type, c.nullable) for c in columns[len(EVENT):]}
    assert fields == {"order_id": ("BIGINT", False), "customer": ("VARCHAR", False),
                      "total": ("DOUBLE", False), "paid": ("BOOLEAN", False),
                      "placed_at": ("TIMESTAMPTZ", False), "lines": ("JSON", False),
                      "note": ("VARCHAR", True)}
    postgres = {c.name: c.type for c in model_columns(model, dialect="postgres", event=False)}
    assert postgres == {"order_id": "BIGINT", "customer": "TEXT", "total": "DOUBLE PRECISION",
                        "paid": "BOOLEAN", "placed_at": "TIMESTAMPTZ", "lines": "JSONB",
                        "note": "TEXT"}


def test_bad_models_and_clashing_fields_are_refused() -> None:
    @dataclasses.dataclass
    class Clash:
        seq: int

    with pytest.raises(InvalidArgument, match="must be a pydantic model"):
        model_columns(dict)
    with pytest.raises(InvalidArgument, match="clashes with an event column"):
        model_columns(Clash)
    assert [c.name for c in model_columns(Clash, exclude=["seq"])] == EVENT
    with pytest.raises(InvalidArgument, match="dialect"):
        model_columns(OrderData, dialect="sqlite")  # type: ignore[arg-type]


def order(n: int) -> OrderStruct:
    return OrderStruct(n, f"c{n}", n / 4, n % 2 == 0, AT, [Line("sku-1", n)],
                       None if n % 3 else "gift")


async def sink_orders(sink: Sink, wait_until: WaitUntil, count: int) -> None:
    """Append ``count`` orders and run a typed pipeline into ``sink`` until all settled."""
    async with Rheo("memory://") as rheo:
        await rheo.create_stream("orders")
        await rheo.append("orders", [NewEvent("order.placed", order(n), id=f"o{n}")
                                     for n in range(count)])
        pipeline = Pipeline(rheo, stream="orders", group="warehouse",
                            handler=SinkHandler(sink), models={"order.placed": OrderStruct},
                            batchers={"default": sink_batcher(max_rows=50, max_age=0.1)})
        async with pipeline:
            async def settled() -> bool:
                return sum((await rheo.frontier("orders", "warehouse")).values()) >= count

            await wait_until(settled, timeout=30, message="every order settled")
        assert pipeline.stats().acked == count


async def test_duckdb_sink_takes_its_columns_from_the_model(
        tmp_path: Path, wait_until: WaitUntil) -> None:
    duckdb = pytest.importorskip("duckdb")
    from rheo_flow.sinks import DuckDBSink

    path = tmp_path / "warehouse.duckdb"
    async with DuckDBSink(path, table="orders", columns=model_columns(OrderStruct)) as sink:
        await sink_orders(sink, wait_until, 120)
    con = duckdb.connect(str(path))
    try:
        rows = con.execute("SELECT seq, order_id, customer, total, paid, placed_at, lines, "
                           "note FROM orders ORDER BY seq").fetchall()
    finally:
        con.close()
    assert len(rows) == 120
    seq, order_id, customer, total, paid, placed_at, lines, note = rows[3]
    assert (seq, order_id, customer, total, paid, note) == (4, 3, "c3", 0.75, False, "gift")
    assert placed_at == AT
    assert msgspec.json.decode(lines) == [{"sku": "sku-1", "qty": 3}]


@pytest.fixture
async def pg_pool(postgres_url: str) -> AsyncIterator[Any]:
    asyncpg = pytest.importorskip("asyncpg")
    pool = await asyncpg.create_pool(postgres_url, min_size=1, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


async def test_postgres_sink_takes_its_columns_from_the_model(
        pg_pool: Any, postgres_schema: str, wait_until: WaitUntil) -> None:
    from rheo_flow.sinks import PostgresSink

    table = f"{postgres_schema}.orders"
    async with PostgresSink(pool=pg_pool, table=table,
                            columns=model_columns(OrderStruct, dialect="postgres")) as sink:
        await sink_orders(sink, wait_until, 60)
    rows = await pg_pool.fetch(f'SELECT seq, order_id, customer, total, paid, placed_at, '
                               f'lines::text, note FROM "{postgres_schema}".orders ORDER BY seq')
    assert len(rows) == 60
    assert tuple(rows[3]) == (4, 3, "c3", 0.75, False, AT, '[{"qty": 3, "sku": "sku-1"}]',
                              "gift")
