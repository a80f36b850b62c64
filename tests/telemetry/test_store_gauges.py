"""The store gauges behind ``/metrics``: one read serves concurrent scrapes, a failed read
keeps the last values with ``rheo_store_up`` at 0, and the page parses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from _tcp_proxy import Proxy
from rheo_flow import NewEvent, Rheo
from rheo_flow._cli.metrics._endpoints import lag_json, routes
from rheo_flow._cli.metrics._exporter import PrometheusExport
from rheo_flow._cli.metrics._store import StoreGauges, observer_url


async def _fill(url: str) -> None:
    async with Rheo(url) as rheo:
        await rheo.create_stream("orders", partitions=2)
        await rheo.create_group("orders", "billing")
        await rheo.append("orders", [NewEvent("o", {"n": i}, key=str(i)) for i in range(5)])


@pytest.fixture
async def sqlite_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'events.db'}"
    await _fill(url)
    return url


@pytest.fixture
async def export() -> AsyncIterator[PrometheusExport]:
    made = PrometheusExport(runtime=False)
    yield made
    made.close()


def _values(page: str, name: str) -> dict[tuple[str, ...], float]:
    return {tuple(sorted(s.labels.values())): s.value
            for family in text_string_to_metric_families(page) if family.name == name
            for s in family.samples}


async def test_concurrent_scrapes_share_one_read(sqlite_url: str,
                                                 export: PrometheusExport) -> None:
    store = StoreGauges(sqlite_url, interval=60)
    try:
        reports = await asyncio.gather(*(store.current() for _ in range(5)))
        assert reports[0] is not None
        assert all(report is reports[0] for report in reports)  # one read, five answers
        assert await store.current() is reports[0]  # still fresh
        entry = reports[0].group("orders", "billing")
        assert entry is not None
        assert entry.lag == 5
    finally:
        await store.aclose()


async def test_the_page_parses_and_labels_match_the_runtime_gauges(
        sqlite_url: str, export: PrometheusExport) -> None:
    store = StoreGauges(sqlite_url, interval=60)
    try:
        status, content_type, body = await routes(export, store)["/metrics"]({})
        assert (status, content_type) == (200, "text/plain; version=0.0.4; charset=utf-8")
        page = body.decode()
        lag = _values(page, "rheo_store_lag")
        assert sum(lag.values()) == 5
        for family in text_string_to_metric_families(page):
            if family.name in ("rheo_store_lag", "rheo_store_frontier"):
                assert {frozenset(s.labels) for s in family.samples} == {frozenset({
                    "messaging_system", "messaging_destination_name",
                    "messaging_consumer_group_name", "messaging_destination_partition_id"})}
        assert list(_values(page, "rheo_store_up").values()) == [1]
        assert list(_values(page, "rheo_store_dead_letters").values()) == [0]
        assert list(_values(page, "rheo_store_paused").values()) == [0]
        ages = _values(page, "rheo_store_oldest_unsettled_age_seconds")
        assert len(ages) == 2
        assert all(age >= 0 for age in ages.values())
    finally:
        await store.aclose()


async def test_a_failed_read_keeps_the_last_values_and_says_the_store_is_down(
        postgres_schema_url: str, export: PrometheusExport) -> None:
    await _fill(postgres_schema_url)
    proxy = Proxy.to(postgres_schema_url, 5432)
    await proxy.open()
    # A password the server (trust authentication) ignores: it must never show.
    secret_url = proxy.url(postgres_schema_url).replace("://postgres@", "://postgres:s3cr3t@")
    assert "s3cr3t" in secret_url
    store = StoreGauges(secret_url, interval=0, timeout=2)
    try:
        first = await store.current()
        assert store.up
        await proxy.cut()
        assert await store.current() is first  # the last values, kept
        assert not store.up
        assert store.error is not None
        assert "s3cr3t" not in store.error
        page = (await routes(export, store)["/metrics"]({}))[2].decode()
        assert list(_values(page, "rheo_store_up").values()) == [0]
        assert sum(_values(page, "rheo_store_lag").values()) == 5
        status, _, body = await lag_json(store, {"stream": "orders", "group": "billing"})
        assert status == 200
        assert b'"store_up":false' in body
        await proxy.open()
        again = await store.current()
        assert store.up
        assert again is not first
    finally:
        await store.aclose()
        await proxy.cut()


def test_the_observer_instance_uses_a_small_pool_without_listen() -> None:
    url = "postgresql://postgres@127.0.0.1:5432/test?schema=s"
    assert observer_url(url) == f"{url}&pool_min_size=0&pool_max_size=2&listen=false"
    assert observer_url("postgresql://h/db?pool_max_size=5").endswith(
        "?pool_max_size=5&pool_min_size=0&listen=false")
    assert observer_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


async def test_every_series_of_a_big_store_is_on_the_page(
        tmp_path: Path, export: PrometheusExport) -> None:
    # 70 streams x 4 groups x 8 partitions: 2,240 series of rheo_store_lag, past the
    # OpenTelemetry SDK's default limit of 2,000 (which folds the rest into one
    # otel_metric_overflow series).
    url = f"sqlite:///{tmp_path / 'big.db'}"
    async with Rheo(url) as rheo:
        for s in range(70):
            await rheo.create_stream(f"s{s:02d}", partitions=8)
            for g in range(4):
                await rheo.create_group(f"s{s:02d}", f"g{g}")
            await rheo.append(f"s{s:02d}", [NewEvent("t", partition=s % 8)])
    store = StoreGauges(url, interval=60)
    try:
        _, _, body = await routes(export, store)["/metrics"]({})
        page = body.decode()
        lag = _values(page, "rheo_store_lag")
        assert len(lag) == 70 * 4 * 8
        assert sum(lag.values()) == 70 * 4
        assert "otel_metric_overflow" not in page
    finally:
        await store.aclose()
