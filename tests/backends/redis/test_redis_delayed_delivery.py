"""Redis: scheduled events consumed by other OS processes on the real clock (the
scenario is tests/_delayed.py), on one server and on the Redis Cluster test server:
never leased early, and on time because an idle consumer's blocking read ends when
the partitions' next scheduled event is due. Run with ``-s`` for the lateness
distribution."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from _delayed import describe, scheduled_on_time
from rheo_flow.backends import RedisBackend


@pytest.fixture(params=["single", "cluster"])
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    """One Redis server's URL, or the Redis Cluster's, with a prefix of this test only,
    whose keys are removed afterwards."""
    base = str(request.getfixturevalue("redis_url" if request.param == "single"
                                       else "redis_cluster_url"))
    url = f"{base}{'&' if '?' in base else '?'}prefix=rheo-test-delay-{uuid.uuid4().hex[:10]}"
    yield url

    async def drop() -> None:
        backend = RedisBackend.from_url(url)
        try:
            await backend.drop_all()
        finally:
            await backend.close()

    asyncio.run(drop())


def test_scheduled_events_are_leased_on_time_by_other_processes(
        url: str, tmp_path: Path) -> None:
    print(f"\nredis {url.split('://')[0]} " + describe(
        asyncio.run(scheduled_on_time(url, tmp_path))))
