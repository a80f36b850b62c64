"""Redis and Redis Cluster: ``lag_report`` answers in a few round trips what the report
composed from the backend's other reads answers (tests/_lag_scenario.py)."""

from __future__ import annotations

import pytest

from _lag_scenario import build_lag_store, check_lag_report
from rheo_flow import Rheo
from test_redis_backend import scratch_backend


@pytest.mark.parametrize("server", ["single", "cluster"])
async def test_the_lag_report_is_the_composed_one(
        server: str, request: pytest.FixtureRequest) -> None:
    url = str(request.getfixturevalue("redis_url" if server == "single"
                                      else "redis_cluster_url"))
    async with scratch_backend(url) as backend, Rheo(backend) as rheo:
        await build_lag_store(rheo)
        await check_lag_report(backend)
