"""The conformance kit against the MongoDB backend as it runs on a standalone server.

A standalone ``mongod`` has neither transactions nor change streams: appends then
take the optimistic path (insert at the next free sequence, unique index, retry)
and consumers poll. The test server is a replica set, so the backend is told not
to use either feature; ``conformance/`` runs the kit with both.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from hypothesis import HealthCheck, settings

from rheo_flow import ManualClock
from rheo_flow.backends import Backend, MongoBackend
from rheo_flow.testing import BackendHarness, Case, all_cases, run_case, run_stateful


def _standalone_harness(url: str) -> BackendHarness:
    def build(clock: ManualClock, prefix: str | None = None) -> Backend:
        # The wire emulator CI runs answers one client at a time, slowly when the
        # machine is busy: the cases check what the backend does, not how fast, so a
        # call may take longer than the default 10 s before it is given up on.
        return MongoBackend(url, collection_prefix=prefix or f"s{uuid.uuid4().hex[:10]}_",
                            clock=clock, transactions=False, change_streams=False,
                            timeout_ms=60_000)

    def peer(backend: Backend, clock: ManualClock) -> Backend:
        assert isinstance(backend, MongoBackend)
        return build(clock, backend.collection_prefix)

    base = BackendHarness.with_manual_clock("mongo-standalone", build, peer=peer)

    @asynccontextmanager
    async def factory() -> AsyncIterator[Backend]:
        async with base.factory() as backend:
            assert isinstance(backend, MongoBackend)
            await backend.open()
            try:
                yield backend
            finally:
                await backend.drop_all()

    # Every factory call makes collections of their own: a store apart.
    return dataclasses.replace(base, factory=factory, apart=factory)


@pytest.fixture(scope="module")
def harness(mongo_url: str) -> BackendHarness:
    """The MongoDB backend without transactions or change streams, one prefix per case."""
    return _standalone_harness(mongo_url)


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.name)
def test_kit_case_without_transactions(harness: BackendHarness, case: Case) -> None:
    result = run_case(harness, case)
    if result.status == "skip":
        # Only for a capability a standalone server cannot give (change streams), or
        # one this backend does not declare at all.
        assert "is not declared by backend" in result.detail, result.detail
        pytest.skip(result.detail)
    assert result.status == "pass", result.detail


def test_stateful_model_without_transactions(harness: BackendHarness) -> None:
    run_stateful(harness, config=settings(
        max_examples=10, stateful_step_count=30, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))
