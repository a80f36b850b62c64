"""A Broadway-like, demand-driven pipeline over a consumer group.

::

    from rheo_flow.pipeline import Batcher, Message, Pipeline, PipelineHandler, Processors

    class Indexer(PipelineHandler):
        async def handle_message(self, processor, message, context):
            return message.update_data(transform)

        async def handle_batch(self, batcher, messages, batch_info, context):
            await context.index.bulk([m.data for m in messages])
            return messages

    pipeline = Pipeline(rheo, stream="orders", group="indexer", handler=Indexer(),
                        processors=Processors(concurrency=8),
                        batchers={"default": Batcher(batch_size=100, batch_timeout=1.0)},
                        context=ctx)
    async with pipeline:
        await stop_requested.wait()

:mod:`rheo_flow.pipeline.testing` runs messages through a handler without a backend.
"""

from ._batcher import Batcher, BatchSize
from ._handler import HandlerLike, PipelineHandler
from ._message import (
    BatchInfo,
    BatchMode,
    BatchTrigger,
    Message,
    MessageOutcome,
    OnFailure,
    Status,
    ack_immediately,
    confirm_settled,
)
from ._partition import PartitionBy
from ._pipeline import Pipeline, PipelineStats
from ._processor import Processors
from ._rate_limiter import RateLimit, RateLimiter
from ._topology import BatcherTopology, ProcessorTopology, ProducerTopology, Topology

__all__ = [
    "BatchInfo",
    "BatchMode",
    "BatchSize",
    "BatchTrigger",
    "Batcher",
    "BatcherTopology",
    "HandlerLike",
    "Message",
    "MessageOutcome",
    "OnFailure",
    "PartitionBy",
    "Pipeline",
    "PipelineHandler",
    "PipelineStats",
    "ProcessorTopology",
    "Processors",
    "ProducerTopology",
    "RateLimit",
    "RateLimiter",
    "Status",
    "Topology",
    "ack_immediately",
    "confirm_settled",
]
