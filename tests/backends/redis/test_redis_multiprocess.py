"""Four OS processes compete for one Redis consumer group (see _redis_worker.py beside it).

The same runs on one Redis server and on the Redis Cluster test server
(``RHEO_REDIS_CLUSTER_URL``), where the partitions live on several primaries.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from rheo_flow import NewEvent, Rheo
from rheo_flow.backends import RedisBackend

WORKER = Path(__file__).with_name("_redis_worker.py")
WORKERS = 4
EVENTS = 20_000
PARTITIONS = 4


async def _worker(*args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


@pytest.fixture(params=["single", "cluster"])
def url(request: pytest.FixtureRequest) -> str:
    """One Redis server's URL, or the Redis Cluster's."""
    return str(request.getfixturevalue("redis_url" if request.param == "single"
                                       else "redis_cluster_url"))


async def test_four_processes_share_a_group_without_double_leases(
    url: str, tmp_path: Path
) -> None:
    prefix = f"rheo-test-mp-{uuid.uuid4().hex[:10]}"
    backend = RedisBackend.from_url(url, prefix=prefix)
    try:
        async with Rheo(backend) as rheo:
            await rheo.create_stream("jobs", partitions=PARTITIONS)
            for start in range(0, EVENTS, 5_000):
                await rheo.append("jobs", [NewEvent("job", {"i": i}, key=f"k{i}")
                                           for i in range(start, start + 5_000)])
            await rheo.create_group("jobs", "workers")
            ready = tmp_path / "ready"
            ready.mkdir()
            reports = await asyncio.gather(*(
                _worker("compete", url, prefix, "jobs", "workers", f"w{i}", str(ready),
                        str(WORKERS))
                for i in range(WORKERS)
            ))
            leased = Counter((p, s) for report in reports for p, s, _ in report["leased"])
            assert sum(leased.values()) == EVENTS, "every event leased exactly once in total"
            assert max(leased.values()) == 1, "no event was leased twice"
            assert {a for report in reports for _, _, a in report["leased"]} == {1}
            assert sum(r["acked"] for r in reports) == EVENTS
            assert sum(r["repeated"] + r["failed"] for r in reports) == 0
            # They competed: at least two took work (which ones is the scheduler's).
            assert sum(1 for r in reports if r["leased"]) >= 2, "the load was shared"
            high = await rheo.high_water("jobs")
            assert sum(high.values()) == EVENTS
            assert await rheo.frontier("jobs", "workers") == high
            assert sum((await rheo.lag("jobs", "workers")).values()) == 0
            assert await rheo.fetch("jobs", "workers", limit=10) == []
            # Redis' own view agrees: nothing pending in any partition's consumer group.
            for p in range(PARTITIONS):
                key = f"{{{prefix}:jobs:{p}}}:x"
                assert (await backend.client.xpending(key, "workers"))["pending"] == 0
    finally:
        await backend.drop_all()
        await backend.close()
