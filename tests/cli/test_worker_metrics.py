"""``/metrics``, ``/metrics/lag`` and ``/readyz`` of real ``rheo-flow worker`` processes, and
the ``rheo-flow metrics`` exporter, on SQLite, PostgreSQL and Redis.

The store gauges are compared with what ``rheo-flow lag --json`` prints, before a
backlog, while it is held (the handlers block until the test creates a ``release``
file, so nothing settles and both readings see one state), and after it is released.
Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from _tcp_proxy import Proxy, free_port
from rheo_flow import NewEvent, Rheo

WaitUntil = Callable[..., Awaitable[None]]

EVENTS = 12
PARTITIONS = 2

APP = '''
import asyncio
import os
import pathlib

from rheo_flow import ACK, consumer

DIR = pathlib.Path(os.environ["WORKER_TEST_DIR"])


@consumer(stream="jobs", group="g", concurrency=2, max_demand=10, lease_ms=60_000,
          poll_ms=50)
async def jobs(event, context):
    while not (DIR / "release").exists():
        await asyncio.sleep(0.02)  # the handler under test waits to be told
    return ACK
'''

APP_WITH_ITS_OWN_METRICS = APP + '''
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

from rheo_flow.telemetry import set_meter_provider

set_meter_provider(MeterProvider(metric_readers=[PeriodicExportingMetricReader(
    ConsoleMetricExporter(out=open(os.devnull, "w")), export_interval_millis=60_000)]))
'''

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "docs" / "grafana" / "rheo-flow-dashboard.json"
DEPLOYING = ROOT / "docs" / "deploying.md"

STREAM_LABEL = "messaging_destination_name"
GROUP_LABEL = "messaging_consumer_group_name"
PARTITION_LABEL = "messaging_destination_partition_id"


@dataclass
class Store:
    """A backend URL of this test only, with the application module beside it."""

    dir: Path
    url: str
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        path = os.pathsep.join(filter(None, [str(self.dir), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "WORKER_TEST_DIR": str(self.dir)}
        env.pop("RHEO_URL", None)
        return env

    async def start(self, *args: str) -> asyncio.subprocess.Process:
        index = len(self.procs)
        with (self.dir / f"out-{index}.log").open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rheo_flow", *args, env=self.env(), cwd=self.dir,
                stdout=out, stderr=asyncio.subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, proc: asyncio.subprocess.Process) -> str:
        return (self.dir / f"out-{self.procs.index(proc)}.log").read_text()

    async def cli_lag(self) -> dict[int, int]:
        """``rheo-flow lag jobs g --json``: the lag per partition."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "rheo_flow", "lag", "jobs", "g", "--json", "--url", self.url,
            env=self.env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        rows = [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        return {row["partition"]: row["lag"] for row in rows
                if row["stream"] == "jobs" and row["group"] == "g"}

    async def append(self, count: int) -> None:
        async with Rheo(self.url) as rheo:
            await rheo.append("jobs", [NewEvent("job", {"n": i}, key=str(i))
                                       for i in range(count)])


@pytest.fixture(params=["sqlite", "postgres", "redis"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh SQLite file, a PostgreSQL schema or a Redis prefix of this test only."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'events.db'}"
    elif request.param == "postgres":
        yield request.getfixturevalue("postgres_schema_url")
    else:
        yield from _redis_url(request.getfixturevalue("redis_url"))


def _redis_url(base: str) -> Iterator[str]:
    from rheo_flow.backends import RedisBackend

    url = f"{base}{'&' if '?' in base else '?'}prefix=metrics_{uuid.uuid4().hex[:8]}"
    yield url

    async def drop() -> None:
        backend = RedisBackend.from_url(url)
        try:
            await backend.drop_all()
        finally:
            await backend.close()

    asyncio.run(drop())


async def _store(tmp_path: Path, url: str) -> Store:
    (tmp_path / "app.py").write_text(APP)
    async with Rheo(url) as rheo:
        await rheo.create_stream("jobs", partitions=PARTITIONS)
        await rheo.create_group("jobs", "g")
    return Store(tmp_path, url)


@pytest.fixture
async def store(tmp_path: Path, url: str) -> AsyncIterator[Store]:
    made = await _store(tmp_path, url)
    yield made
    await _stop_all(made)


async def _stop_all(store: Store) -> None:
    (store.dir / "release").touch()
    for proc in store.procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def _get(port: int, path: str) -> tuple[int, str, str]:
    """Status, content type and body of ``GET path``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    head, _, body = (await reader.read()).decode().partition("\r\n\r\n")
    writer.close()
    await writer.wait_closed()
    lines = head.split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers.get("Content-Type", ""), body


async def _up(port: int, path: str = "/metrics") -> bool:
    try:
        return (await _get(port, path))[0] == 200
    except OSError:
        return False


def _samples(page: str, name: str) -> list[Any]:
    """The samples of metric family ``name`` of a parsed page."""
    return [s for family in text_string_to_metric_families(page) if family.name == name
            for s in family.samples]


async def _store_lag(port: int) -> dict[int, int]:
    """``rheo_store_lag`` of jobs/g per partition, from a scrape."""
    _, _, page = await _get(port, "/metrics")
    return {int(s.labels[PARTITION_LABEL]): int(s.value) for s in _samples(page, "rheo_store_lag")
            if s.labels[STREAM_LABEL] == "jobs" and s.labels[GROUP_LABEL] == "g"}


async def _agree(store: Store, port: int, total: int) -> bool:
    """Whether the scraped gauge and the CLI both say ``total``, partition by partition."""
    scraped = await _store_lag(port)
    if sum(scraped.values()) != total:
        return False
    printed = await store.cli_lag()
    assert scraped == printed  # nothing settles in between: one state, two readings
    assert len(scraped) == PARTITIONS
    return True


async def _backlog_is_tracked(store: Store, port: int, wait_until: WaitUntil) -> None:
    """Before, during and after a held backlog, the gauge equals the CLI's lag."""
    await wait_until(lambda: _agree(store, port, 0), timeout=20, message="no lag at first")
    await store.append(EVENTS)
    await wait_until(lambda: _agree(store, port, EVENTS), timeout=20, message="backlog seen")
    (store.dir / "release").touch()
    await wait_until(lambda: _agree(store, port, 0), timeout=30, message="backlog settled")


async def test_worker_metrics_follow_the_lag_the_cli_prints(
        store: Store, wait_until: WaitUntil) -> None:
    port = free_port()
    proc = await store.start("worker", "app:jobs", "--url", store.url, "--health-port",
                             str(port), "--health-host", "127.0.0.1",
                             "--metrics-interval", "100ms")
    await wait_until(lambda: _up(port), timeout=20, message="/metrics served")
    status, content_type, page = await _get(port, "/metrics")
    assert status == 200
    assert content_type.startswith("text/plain; version=0.0.4")
    names = {family.name for family in text_string_to_metric_families(page)}
    assert {"rheo_store_lag", "rheo_store_up", "rheo_store_read_duration_seconds",
            "process_cpu_seconds"} <= names
    await _backlog_is_tracked(store, port, wait_until)
    _, _, page = await _get(port, "/metrics")
    names = {family.name for family in text_string_to_metric_families(page)}
    # The runtime's own instruments are on the same page, with the same labels.
    assert {"rheo_consumer_fetch_size", "rheo_consumer_leases_inflight",
            "messaging_client_consumed_messages", "rheo_settle_outcomes"} <= names
    consumed = _samples(page, "messaging_client_consumed_messages")
    assert sum(s.value for s in consumed) == EVENTS
    assert {s.labels[GROUP_LABEL] for s in consumed} == {"g"}
    assert [s.value for s in _samples(page, "rheo_store_up")] == [1]
    proc.terminate()
    assert await asyncio.wait_for(proc.wait(), 20) == 0, store.log(proc)


async def test_the_inflight_gauge_counts_held_leases(
        store: Store, wait_until: WaitUntil) -> None:
    port = free_port()
    await store.append(EVENTS)
    await store.start("worker", "app:jobs", "--url", store.url, "--health-port", str(port),
                      "--health-host", "127.0.0.1")

    async def held() -> float:
        if not await _up(port):
            return -1
        _, _, page = await _get(port, "/metrics")
        return sum(s.value for s in _samples(page, "rheo_consumer_leases_inflight"))

    # max_demand 10: the group holds ten leases while its two handlers block.
    await wait_until(lambda: _equals(held, 10), timeout=20, message="ten leases held")


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
async def test_a_meter_provider_of_the_application_keeps_the_runtime_metrics(
        store: Store, wait_until: WaitUntil) -> None:
    # The application's module sets rheo_flow's meter provider (an OTLP exporter, say):
    # the worker leaves it in place, and /metrics serves the store gauges alone.
    (store.dir / "app.py").write_text(APP_WITH_ITS_OWN_METRICS)
    port = free_port()
    await store.append(EVENTS)
    (store.dir / "release").touch()
    proc = await store.start("worker", "app:jobs", "--url", store.url, "--health-port",
                             str(port), "--health-host", "127.0.0.1",
                             "--metrics-interval", "100ms")
    await wait_until(lambda: _up(port), timeout=20, message="/metrics served")
    await wait_until(lambda: _agree(store, port, 0), timeout=30, message="backlog settled")
    _, _, page = await _get(port, "/metrics")
    names = {family.name for family in text_string_to_metric_families(page)}
    assert "rheo_store_lag" in names
    assert not {"rheo_consumer_fetch_size", "messaging_client_consumed_messages"} & names
    proc.terminate()
    assert await asyncio.wait_for(proc.wait(), 20) == 0, store.log(proc)
    assert "runtime metrics go to the meter provider the application configured" in (
        store.log(proc))


async def _equals(read: Callable[[], Awaitable[float]], expected: float) -> bool:
    return await read() == expected


async def test_lag_json_for_keda(store: Store, wait_until: WaitUntil) -> None:
    port = free_port()
    await store.start("worker", "app:jobs", "--url", store.url, "--health-port", str(port),
                      "--health-host", "127.0.0.1", "--metrics-interval", "100ms")
    await wait_until(lambda: _up(port), timeout=20)
    await store.append(EVENTS)

    async def lag() -> int:
        status, content_type, body = await _get(port, "/metrics/lag?stream=jobs&group=g")
        assert (status, content_type) == (200, "application/json")
        answer = json.loads(body)
        assert {"stream", "group", "lag", "scheduled", "oldest_unsettled_age_seconds",
                "dead_letters", "paused"} <= answer.keys()
        assert (answer["stream"], answer["group"], answer["paused"]) == ("jobs", "g", False)
        return int(answer["lag"])

    await wait_until(lambda: _equals(lag, EVENTS), timeout=20, message="lag in the JSON")
    status, content_type, body = await _get(port, "/metrics/lag?stream=jobs&group=nope")
    assert (status, content_type) == (404, "application/json")
    assert "nope" in json.loads(body)["error"]
    status, _, body = await _get(port, "/metrics/lag?stream=jobs")
    assert status == 400
    assert "group=" in json.loads(body)["error"]


async def test_the_exporter_needs_no_worker(store: Store, wait_until: WaitUntil) -> None:
    port = free_port()
    proc = await store.start("metrics", "--port", str(port), "--host", "127.0.0.1",
                             "--url", store.url, "--interval", "100ms", "--streams", "jobs")
    await wait_until(lambda: _up(port, "/readyz"), timeout=20, message="exporter ready")
    await store.start("worker", "app:jobs", "--url", store.url)
    await _backlog_is_tracked(store, port, wait_until)
    _, _, page = await _get(port, "/metrics")
    names = {family.name for family in text_string_to_metric_families(page)}
    assert "rheo_consumer_leases_inflight" not in names  # no runtime in the exporter
    assert {"rheo_store_lag", "rheo_store_dead_letters", "rheo_store_paused",
            "rheo_store_oldest_unsettled_age_seconds"} <= names
    status, _, body = await _get(port, "/metrics/lag?stream=jobs&group=g")
    assert status == 200
    assert json.loads(body)["lag"] == 0
    proc.terminate()
    assert await asyncio.wait_for(proc.wait(), 20) == 0, store.log(proc)


async def test_readiness_follows_the_store(
        tmp_path: Path, postgres_schema_url: str, wait_until: WaitUntil) -> None:
    proxy = Proxy.to(postgres_schema_url, 5432)
    await proxy.open()
    proxied = proxy.url(postgres_schema_url)
    store = await _store(tmp_path, proxied)
    try:
        port = free_port()
        proc = await store.start("worker", "app:jobs", "--url", proxied, "--health-port",
                                 str(port), "--health-host", "127.0.0.1",
                                 "--probe-interval", "100ms", "--probe-timeout", "1s")
        await wait_until(lambda: _up(port, "/readyz"), timeout=20, message="ready")
        await proxy.cut()

        async def down() -> bool:
            status, _, body = await _get(port, "/readyz")
            return status == 503 and "store unreachable" in body

        await wait_until(down, timeout=20, message="/readyz down while the store is cut off")
        _, _, body = await _get(port, "/readyz")
        assert "password" not in body
        assert (await _get(port, "/healthz"))[0] == 200  # alive: do not restart it
        await proxy.open()
        await wait_until(lambda: _up(port, "/readyz"), timeout=30, message="ready again")
        assert proc.returncode is None, store.log(proc)
    finally:
        await _stop_all(store)
        await proxy.cut()


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
async def test_the_supervisor_serves_the_store_gauges(
        store: Store, wait_until: WaitUntil) -> None:
    port = free_port()
    proc = await store.start("worker", "app:jobs", "--url", store.url, "--processes", "2",
                             "--health-port", str(port), "--health-host", "127.0.0.1",
                             "--metrics-interval", "100ms")
    await wait_until(lambda: _up(port, "/readyz"), timeout=30, message="both children ready")
    await _backlog_is_tracked(store, port, wait_until)
    _, _, page = await _get(port, "/metrics")
    names = {family.name for family in text_string_to_metric_families(page)}
    assert "rheo_consumer_leases_inflight" not in names  # the children's stay with them
    proc.terminate()
    assert await asyncio.wait_for(proc.wait(), 30) == 0, store.log(proc)


def _dashboard_metrics() -> set[str]:
    """Every metric name the Grafana dashboard's queries (and variables) read."""
    import re

    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    queries = [target["expr"] for panel in board["panels"] for target in panel["targets"]]
    queries += [variable["definition"] for variable in board["templating"]["list"]
                if variable["type"] == "query"]
    names = set()
    for query in queries:
        # Label lists and selectors name labels, not metrics: leave them out.
        bare = re.sub(r"\b(by|without)\s*\([^)]*\)|\{[^}]*\}", "", query)
        bare = re.sub(r"label_values\(([a-z_]+),[^)]*\)", r"\1", bare)
        names |= set(re.findall(r"\b(?:rheo|messaging|process)_[a-z_]+\b", bare))
    assert names, "no metric found in the dashboard"
    return names


def _documented_metrics_api_trigger() -> dict[str, str]:
    """The metadata of the metrics-api trigger in docs/deploying.md's KEDA example."""
    import re

    import yaml

    for block in re.findall(r"```yaml\n(.*?)```", DEPLOYING.read_text(encoding="utf-8"),
                            re.DOTALL):
        doc = yaml.safe_load(block)
        for trigger in (doc or {}).get("spec", {}).get("triggers", []):
            if trigger["type"] == "metrics-api":
                metadata: dict[str, str] = trigger["metadata"]
                return metadata
    raise AssertionError("no metrics-api trigger in docs/deploying.md")


def _value_at(document: Any, location: str) -> Any:
    """KEDA's valueLocation (a GJSON path; dotted keys are all the docs use)."""
    for key in location.split("."):
        document = document[int(key)] if isinstance(document, list) else document[key]
    return document


@pytest.mark.parametrize("url", ["sqlite"], indirect=True)
async def test_the_dashboard_and_the_keda_trigger_read_what_a_worker_serves(
        store: Store, wait_until: WaitUntil) -> None:
    from urllib.parse import urlsplit

    port = free_port()
    await store.append(EVENTS)
    proc = await store.start("worker", "app:jobs", "--url", store.url, "--health-port",
                             str(port), "--health-host", "127.0.0.1",
                             "--metrics-interval", "100ms")
    await wait_until(lambda: _up(port), timeout=20, message="/metrics served")
    await wait_until(lambda: _agree(store, port, EVENTS), timeout=20, message="backlog held")
    # The docs' KEDA trigger, on this worker's port: its value is the group's lag.
    trigger = _documented_metrics_api_trigger()
    documented = urlsplit(trigger["url"])
    query = documented.query.replace("stream=orders", "stream=jobs").replace(
        "group=billing", "group=g")
    status, _, body = await _get(port, f"{documented.path}?{query}")
    assert status == 200, body
    assert _value_at(json.loads(body), trigger["valueLocation"]) == sum(
        (await store.cli_lag()).values()) == EVENTS
    (store.dir / "release").touch()
    await wait_until(lambda: _agree(store, port, 0), timeout=30, message="backlog settled")
    _, _, page = await _get(port, "/metrics")
    served = {sample.name for family in text_string_to_metric_families(page)
              for sample in family.samples}
    assert _dashboard_metrics() <= served
    proc.terminate()
    assert await asyncio.wait_for(proc.wait(), 20) == 0, store.log(proc)
