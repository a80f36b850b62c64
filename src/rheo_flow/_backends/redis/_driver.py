"""redis-py, imported in one place: without the ``redis`` extra installed, importing
the Redis backend raises :class:`~rheo_flow.MissingExtra`."""

from __future__ import annotations

from typing import TypeAlias

from ..._model._errors import MissingExtra

try:
    import redis.asyncio as aioredis
    from redis import exceptions as rex
    from redis.asyncio.cluster import ClusterNode, RedisCluster
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialWithJitterBackoff
except ImportError:  # pragma: no cover - exercised without the extra installed
    raise MissingExtra("Redis", "redis", "redis") from None

Client: TypeAlias = "aioredis.Redis | RedisCluster"
"""A single server (or a primary with replicas), or a Redis Cluster."""

__all__ = ["Client", "ClusterNode", "ExponentialWithJitterBackoff", "RedisCluster", "Retry",
           "aioredis", "rex"]
