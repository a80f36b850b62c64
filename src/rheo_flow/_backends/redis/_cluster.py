"""Redis Cluster clients of the Redis backend: building one from a ``redis+cluster://``
URL (several seed nodes, comma-separated), and what differs on a cluster."""

from __future__ import annotations

from typing import Final
from urllib.parse import urlsplit, urlunsplit

from ._driver import ClusterNode, ExponentialWithJitterBackoff, RedisCluster, Retry

__all__ = ["CLUSTER_SCHEMES", "cluster_client", "is_cluster_url"]

CLUSTER_SCHEMES: Final = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
"""Cluster scheme -> the redis-py scheme of its seed nodes."""
_DEFAULT_PORT: Final = 6379


def is_cluster_url(url: str) -> bool:
    """Whether the URL names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def cluster_client(url: str, timeout_ms: int) -> RedisCluster:
    """A ``RedisCluster`` over the URL's seed nodes; the query goes to redis-py.

    Raises ``ValueError`` or ``TypeError`` for a malformed URL or an unknown option.
    """
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    seeds = [h for h in hosts.split(",") if h]
    if not seeds:
        raise ValueError("a redis+cluster:// URL names at least one host:port")
    nodes = []
    for seed in seeds:
        node = urlsplit(f"//{seed}")
        nodes.append(ClusterNode(node.hostname or "127.0.0.1", node.port or _DEFAULT_PORT))
    if parts.path.strip("/") not in ("", "0"):
        raise ValueError("a Redis Cluster has only database 0")
    first = urlunsplit((CLUSTER_SCHEMES[parts.scheme.lower()], f"{userinfo}{at}{seeds[0]}",
                        "", parts.query, ""))
    return RedisCluster.from_url(
        first, startup_nodes=nodes[1:], socket_timeout=timeout_ms / 1000,
        socket_connect_timeout=timeout_ms / 1000,
        # A failover takes the cluster's node timeout and an election: retries on
        # refused or lost connections re-read the slot map between attempts.
        retry=Retry(ExponentialWithJitterBackoff(base=0.05, cap=min(1.0, timeout_ms / 20_000)),
                    6))
