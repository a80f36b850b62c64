"""The Redis Cluster failover scenario: ``kill -9`` a primary, its replica takes over.

* ``cluster-failover`` — on a throwaway Redis Cluster (:mod:`._redis_cluster`:
  three primaries with one replica each, ``appendfsync always``), SIGKILL the
  primary holding the most keys at 50% settled, wait until the cluster has
  promoted its replica, then start the killed node again (it rejoins as a
  replica). Redis replicates asynchronously: a write the old primary
  acknowledged but had not yet sent to its replica is gone after the promotion.
  What the checker reports for such writes is what docs/backends.md promises
  across a failover.

A run never touches the cluster its URL names: as the server scenarios do, it
starts a throwaway cluster, unless the URL names one this process started.
"""

from __future__ import annotations

import asyncio
import contextlib

from ._redis_cluster import ThrowawayRedisCluster, own_cluster, track
from ._run_objects import RunObjects, throwaway_endpoints_of
from ._scenario import Endpoints, RunControl, Scenario, register

__all__ = ["CLUSTER_FAILOVER", "cluster_endpoints"]

_clusters: RunObjects[ThrowawayRedisCluster] = RunObjects("throwaway Redis Cluster",
                                                          "cluster_endpoints")


def cluster_endpoints(url: str) -> contextlib.AbstractAsyncContextManager[Endpoints]:
    """Endpoints on a throwaway Redis Cluster (the URL's query string is kept).

    Reuses the throwaway cluster ``url`` names when this process started it.
    """
    return throwaway_endpoints_of(
        _clusters, url, own_cluster(url), lambda: track(ThrowawayRedisCluster().start()),
        ThrowawayRedisCluster.rejoin)


async def _fail_over(run: RunControl) -> None:
    """At 50% settled, kill -9 the busiest primary; once promoted, bring the node back."""
    cluster = _clusters.of(run)
    if not await run.wait_progress(0.5):
        return
    failover = await asyncio.to_thread(cluster.fail_over)
    run.note(f"kill -9 primary :{failover.killed_port} ({failover.keys_on_killed} keys); "
             f"replica :{failover.promoted_port} promoted after {failover.seconds:.1f} s")
    await asyncio.to_thread(cluster.rejoin)
    run.note(f":{failover.killed_port} rejoined as a replica")


CLUSTER_FAILOVER = register(Scenario(
    "cluster-failover",
    "kill -9 a Redis Cluster primary (a throwaway cluster, appendfsync always) at 50% "
    "settled; its replica is promoted and the node rejoins as a replica",
    _fail_over, backends=frozenset({"redis-cluster"}), endpoints=cluster_endpoints))
