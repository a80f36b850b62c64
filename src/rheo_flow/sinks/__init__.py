"""Sinks: write pipeline batches to warehouses, exactly once in effect.

::

    from rheo_flow.pipeline import Pipeline
    from rheo_flow.sinks import Column, DuckDBSink, SinkHandler, sink_batcher

    sink = DuckDBSink("warehouse.duckdb", table="orders", columns=[
        Column("event_id", "VARCHAR", "event.id"),
        Column("customer", "VARCHAR", "data.customer"),
        Column("amount", "DECIMAL(12, 2)", "data.amount", check="amount >= 0"),
    ])
    async with sink:
        pipeline = Pipeline(rheo, stream="orders", group="warehouse",
                            handler=SinkHandler(sink),
                            batchers={"default": sink_batcher(max_rows=2000)})
        async with pipeline:
            ...

A sink writes each batch in one transaction, idempotently on a key (the
event id by default), and reports a result per message: written, retry
later, or invalid (dead-lettered; a failed batch is bisected so that only the
rows at fault are). :class:`DuckDBSink` needs the ``duckdb`` extra,
:class:`PostgresSink` the ``postgres`` extra. See ``docs/sinks.md`` for the
delivery guarantee of each combination of sink and stream backend.
"""

from ._duckdb import DuckDBSink
from ._frontier import Span
from ._handler import SinkHandler, data_bytes, sink_batcher
from ._mapping import Column, MappingError, RowMapping, event_columns
from ._model_columns import model_columns
from ._postgres import PostgresSink
from ._sink import (
    CommitInfo,
    Load,
    RowBatch,
    RowResult,
    RowStatus,
    Sink,
    SinkStats,
    WriteReport,
)

__all__ = [
    "Column",
    "CommitInfo",
    "DuckDBSink",
    "Load",
    "MappingError",
    "PostgresSink",
    "RowBatch",
    "RowMapping",
    "RowResult",
    "RowStatus",
    "Sink",
    "SinkHandler",
    "SinkStats",
    "Span",
    "WriteReport",
    "data_bytes",
    "event_columns",
    "model_columns",
    "sink_batcher",
]
