"""The Redis backend on a Redis Cluster (``RHEO_REDIS_CLUSTER_URL``, see tests/conftest.py).

URLs and clients; partitions spread over the primaries; an append over many
partitions (one script call per partition, no cross-slot transaction); push
wake-ups from a partition on another node; deleting a stream across slots. The
conformance kit's ``redis-cluster`` column runs the whole contract and
``tests/backends/redis/test_redis_multiprocess.py`` four competing processes on the same
cluster; ``tests/faults/test_faults_cluster.py`` fails a primary over.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import RedisCluster

from rheo_flow import InvalidArgument, NewEvent, Rheo
from rheo_flow.backends import RedisBackend
from test_redis_backend import scratch_backend


@pytest.fixture
async def backend(redis_cluster_url: str) -> AsyncIterator[RedisBackend]:
    """A backend on the cluster under a fresh prefix; its keys are deleted afterwards."""
    async with scratch_backend(redis_cluster_url) as b:
        yield b


def test_cluster_urls_build_a_cluster_client() -> None:
    backend = RedisBackend.from_url("redis+cluster://10.0.0.1:7000,10.0.0.2:7001/?prefix=app")
    assert isinstance(backend.client, RedisCluster)
    assert backend.prefix == "app"
    seeds = {(n.host, n.port) for n in backend.client.nodes_manager.startup_nodes.values()}
    assert seeds == {("10.0.0.1", 7000), ("10.0.0.2", 7001)}
    assert isinstance(RedisBackend.from_url("rediss+cluster://h:7000").client, RedisCluster)


@pytest.mark.parametrize(("url", "message"), [
    ("redis+cluster:///?prefix=x", "at least one host"),
    ("redis+cluster://h:7000/3", "only database 0"),
])
def test_bad_cluster_urls_are_clear_errors(url: str, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        RedisBackend.from_url(url)


def test_a_cluster_url_password_never_shows() -> None:
    backend = RedisBackend.from_url("redis+cluster://:hunter2@h:7000,h:7001")
    assert "hunter2" not in repr(backend)
    assert "hunter2" not in repr(Rheo(backend))


async def test_a_host_cluster_client_is_used_and_never_closed(redis_cluster_url: str) -> None:
    port = int(redis_cluster_url.rsplit(":", 1)[1].split("/", 1)[0].split(",", 1)[0])
    client = RedisCluster(host="127.0.0.1", port=port)
    try:
        backend = RedisBackend(client=client, prefix=f"rheo-test-cl-{uuid.uuid4().hex[:10]}")
        async with Rheo(backend) as rheo:
            await rheo.create_stream("s", partitions=3)
            await rheo.append("s", [NewEvent("t", key=str(i)) for i in range(30)])
            leases = await rheo.fetch("s", "g", limit=100)
            assert len(leases) == 30
            assert all(r.ok for r in await rheo.ack(leases))
            await backend.drop_all()
        assert await client.ping()
    finally:
        await client.aclose()


async def test_partitions_spread_over_every_primary(backend: RedisBackend) -> None:
    client = backend.client
    assert isinstance(client, RedisCluster)
    async with Rheo(backend) as rheo:
        await rheo.create_stream("spread", partitions=16)
        await rheo.append("spread", [NewEvent("t", key=str(i)) for i in range(400)])
        primaries = {node.name for node in client.get_primaries()}
        homes = {client.get_node_from_key(f"{{{backend.prefix}:spread:{p}}}:x").name
                 for p in range(16)}
        assert homes == primaries
        assert len(primaries) >= 3
        # Every partition got events: one append reached every primary.
        high = await rheo.high_water("spread")
        assert all(high[p] > 0 for p in range(16))
        assert sum(high.values()) == 400


async def test_an_append_on_another_node_wakes_a_waiting_consumer(
        backend: RedisBackend) -> None:
    async with Rheo(backend) as rheo:
        await rheo.create_stream("s", partitions=8)
        await rheo.fetch("s", "g")  # the wait starts past what this fetch saw
        waiter = asyncio.create_task(rheo.wait_for_append("s", 30))
        await asyncio.sleep(0)
        assert not waiter.done()
        await rheo.append("s", NewEvent("t", key="k", partition=5))
        assert await asyncio.wait_for(waiter, 30)


async def test_deleting_a_stream_removes_every_partitions_keys(backend: RedisBackend) -> None:
    client = backend.client
    async with Rheo(backend) as rheo:
        await rheo.create_stream("gone", partitions=6)
        await rheo.append("gone", [NewEvent("t", key=str(i)) for i in range(60)])
        await rheo.create_group("gone", "g")
        await rheo.fetch("gone", "g", limit=10)
        await rheo.delete_stream("gone")
        keys = [key async for key in client.scan_iter(match=f"{{{backend.prefix}:gone:*")]
        assert keys == []
        assert "gone" not in [s.name for s in await rheo.streams()]
