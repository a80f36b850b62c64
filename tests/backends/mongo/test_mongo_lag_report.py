"""MongoDB, through PyMongo's async API and through Motor: ``lag_report`` answers in a
few queries what the report composed from the backend's other reads answers
(tests/_lag_scenario.py)."""

from __future__ import annotations

import pytest

from _lag_scenario import build_lag_store, check_lag_report
from _mongo_backends import Backends
from rheo_flow import Rheo


@pytest.mark.parametrize("driver", ["pymongo", "motor"])
async def test_the_lag_report_is_the_composed_one(driver: str, backends: Backends) -> None:
    backend = backends.make() if driver == "pymongo" else backends.motor()
    async with Rheo(backend) as rheo:
        await build_lag_store(rheo)
        await check_lag_report(backend)
