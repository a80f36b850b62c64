"""The cyclic collector paused while a batch's objects are built."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from rheo_flow._support._collector import collector_paused


@pytest.fixture
def young_collections() -> Iterator[list[int]]:
    """The generations of the collections started while the test runs."""
    started: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(record)
    try:
        yield started
    finally:
        gc.callbacks.remove(record)


def test_the_burst_runs_no_collection_and_the_next_allocation_runs_one(
        young_collections: list[int]) -> None:
    assert gc.isenabled()
    threshold = gc.get_threshold()[0]
    kept: list[object] = []
    with collector_paused():
        assert not gc.isenabled()
        before = len(young_collections)
        kept.extend([i] for i in range(threshold * 5))  # five young collections' worth
        during = young_collections[before:]
    kept.append([0])  # the allocations counted: the first one after the burst collects
    assert during == []
    assert gc.isenabled()
    assert young_collections[before:]


def test_the_collector_is_enabled_again_when_the_burst_raises() -> None:
    with pytest.raises(ZeroDivisionError), collector_paused():
        _ = 1 / 0
    assert gc.isenabled()


def test_a_collector_the_application_switched_off_stays_off() -> None:
    gc.disable()
    try:
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
