"""Plugging a sink into a pipeline: the batch handler and the batcher settings."""

from __future__ import annotations

import logging
from typing import Any

from .._model._errors import InvalidArgument
from ..pipeline import (
    Batcher,
    BatchInfo,
    BatchSize,
    Message,
    PartitionBy,
    PipelineHandler,
    confirm_settled,
)
from ._json import dumps
from ._sink import RowStatus, Sink

__all__ = ["SinkHandler", "data_bytes", "sink_batcher"]

log = logging.getLogger("rheo_flow.sinks")

def data_bytes(message: Message) -> int:
    """A message's size for byte-based batching: the length of its data as compact JSON
    (the sinks' own encoding, so dates and the like count as the text they are written as).

    Data the sinks cannot encode is sized by its ``repr``: batching must not fail on
    it; the sink dead-letters it when it maps the row, with the encoder's error.
    """
    try:
        return len(dumps(message.data).encode())
    except (TypeError, ValueError):
        return len(repr(message.data).encode())


def sink_batcher(
    *,
    max_rows: int = 1000,
    max_bytes: int | None = None,
    max_age: float = 1.0,
    concurrency: int = 2,
    partition_by: PartitionBy | None = None,
) -> Batcher:
    """Batcher settings for a sink: a batch is written once it holds ``max_rows``
    messages, or ``max_bytes`` of data (:func:`data_bytes`), or ``max_age``
    seconds after its first message, whichever comes first.

    The pipeline also flushes batches when it drains and before the oldest
    lease of a batch would expire. ``concurrency`` batches are written at once
    (two by default: one is mapped to rows while the database loads the other).
    """
    if max_bytes is None:
        return Batcher(batch_size=max_rows, batch_timeout=max_age, concurrency=concurrency,
                       partition_by=partition_by)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise InvalidArgument(f"max_bytes must be a positive integer, got {max_bytes!r}")
    return Batcher(batch_size=BatchSize(max_bytes, data_bytes, max_messages=max_rows),
                   batch_timeout=max_age, concurrency=concurrency, partition_by=partition_by)


class SinkHandler(PipelineHandler):
    """A pipeline handler writing every batch to a :class:`Sink`::

        sink = DuckDBSink("warehouse.duckdb", table="orders", columns=[...])
        pipeline = Pipeline(rheo, stream="orders", group="warehouse",
                            handler=SinkHandler(sink),
                            batchers={"default": sink_batcher(max_rows=2000)})

    Messages pass through :meth:`handle_message` unchanged (subclass and
    override it to transform ``data`` or route messages to other batchers).
    Each batch becomes one :meth:`Sink.write`; per message, a written row is
    acked (or only released when the sink acked it in its own transaction), a
    transient failure is retried after ``retry_delay_ms``, and an invalid row
    is dead-lettered with the database's reason while its neighbours are
    written. ``batcher`` names the batcher that writes to the sink (batches of
    other batchers are acked as they are).
    """

    def __init__(self, sink: Sink, *, batcher: str = "default", retry_delay_ms: int = 1000
                 ) -> None:
        if not isinstance(sink, Sink):
            raise InvalidArgument(f"sink must be a Sink, got {type(sink).__name__}")
        if isinstance(retry_delay_ms, bool) or not isinstance(retry_delay_ms, int) \
                or retry_delay_ms < 0:
            raise InvalidArgument(f"retry_delay_ms must be a non-negative integer, "
                                  f"got {retry_delay_ms!r}")
        self.sink = sink
        self.batcher = batcher
        self.retry_delay_ms = retry_delay_ms

    async def handle_message(self, processor: str, message: Message, context: Any) -> Message:
        """Pass the message on to the sink's batcher unchanged."""
        return message

    async def handle_batch(self, batcher: str, messages: list[Message], batch_info: BatchInfo,
                           context: Any) -> list[Message]:
        """Write the batch to the sink and set every message's status from its result."""
        if batcher != self.batcher:
            return messages
        results = await self.sink.write(messages)
        settled: list[Message] = []
        for m, r in zip(messages, results, strict=True):
            if r.status is RowStatus.WRITTEN:
                if r.settled:
                    settled.append(m)
            elif r.status is RowStatus.RETRY:
                m.failed(f"sink_retry: {r.reason}").configure_ack(
                    on_failure="retry", retry_delay_ms=self.retry_delay_ms)
            else:
                m.failed(f"sink_invalid: {r.reason}").configure_ack(on_failure="reject")
        if settled:
            confirm_settled(settled)
        return messages
