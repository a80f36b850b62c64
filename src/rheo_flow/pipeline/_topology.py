"""A pipeline's structure, for introspection (``pipeline.topology()``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ._batcher import Batcher, BatchSize
from ._partition import PartitionBy
from ._processor import Processors
from ._rate_limiter import RateLimit

__all__ = [
    "BatcherTopology",
    "ProcessorTopology",
    "ProducerTopology",
    "Topology",
    "describe_partition_by",
]


@dataclass(frozen=True, slots=True)
class ProducerTopology:
    """The producer: where it fetches from and how much it keeps inflight."""

    stream: str
    group: str
    consumer_id: str
    max_demand: int
    """The bound on inflight leases (the pipeline's ``max_inflight``)."""
    lease_ms: int
    poll_ms: int
    partitions: str | list[int]
    rate_limit: RateLimit | None


@dataclass(frozen=True, slots=True)
class ProcessorTopology:
    """The processor stage."""

    name: str
    concurrency: int
    max_demand: int
    partition_by: str | None


@dataclass(frozen=True, slots=True)
class BatcherTopology:
    """One batcher."""

    name: str
    concurrency: int
    batch_size: int
    """The count, or the ``max`` of a :class:`BatchSize`."""
    batch_size_unit: str
    """``messages``, or the name of the ``BatchSize.size_of`` function."""
    batch_timeout: float
    partition_by: str | None


@dataclass(frozen=True, slots=True)
class Topology:
    """The stages of a pipeline and their settings."""

    producer: ProducerTopology
    processors: list[ProcessorTopology]
    batchers: list[BatcherTopology]

    def as_dict(self) -> dict[str, Any]:
        """The topology as plain data (for logs, JSON, a CLI)."""
        return asdict(self)


def describe_partition_by(partition_by: PartitionBy | None) -> str | None:
    """A short description of a ``partition_by`` setting."""
    if partition_by is None or isinstance(partition_by, str):
        return partition_by
    return getattr(partition_by, "__qualname__", None) or repr(partition_by)


def processor_topology(config: Processors) -> ProcessorTopology:
    """The topology entry of a processor stage."""
    return ProcessorTopology(config.name, config.concurrency, config.max_demand,
                             describe_partition_by(config.partition_by))


def batcher_topology(name: str, config: Batcher) -> BatcherTopology:
    """The topology entry of a batcher."""
    size = config.batch_size
    if isinstance(size, BatchSize):
        unit = getattr(size.size_of, "__qualname__", None) or "size_of"
        amount = size.max
    else:
        unit, amount = "messages", size
    return BatcherTopology(name, config.concurrency, amount, unit, float(config.batch_timeout),
                           describe_partition_by(config.partition_by))
