"""Short fault-injection runs with real worker processes, per durable backend.

Each run appends a few hundred events while one scenario disrupts two worker
processes, then the checker must find nothing lost, unexpected, appended twice
or settled stale, and everything settled. SQLite runs every scenario; the
PostgreSQL and Redis servers run the two process faults (kill -9, SIGSTOP), on
a schema or key prefix of their own removed afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rheo_flow import InvalidArgument
from rheo_flow.testing.faults import (
    STREAM_PREFIX,
    Endpoints,
    Report,
    RunControl,
    RunSettings,
    Scenario,
    Workload,
    register,
    run_scenario,
    scenarios,
    selected_scenarios,
)

SETTINGS = RunSettings(events=300, workers=2, seconds=8)
BOUND_S = 40.0
"""Room for a slow, shared machine: a run ends as soon as everything is settled."""


def assert_clean(report: Report) -> None:
    assert report.error is None, report
    assert report.ok, report
    assert report.complete, report


async def run(url: str, name: str, workload: Workload) -> Report:
    report = await run_scenario(url, scenarios()[name], workload, SETTINGS, bound_s=BOUND_S)
    assert_clean(report)
    assert report.acknowledged == SETTINGS.events
    # An ack whose answer died with its worker counts as settled once the frontier passed it.
    assert report.acked + report.dead_letters + report.ambiguous_settles >= SETTINGS.events
    assert report.lag == 0
    return report


def assert_killed_and_restarted(report: Report) -> None:
    notes = " ".join(report.notes)
    for worker in ("w0", "w1"):
        assert f"kill -9 {worker}" in notes, notes
        assert f"restarted {worker}" in notes, notes


def assert_stopped_and_continued(report: Report) -> None:
    notes = " ".join(report.notes)
    assert "SIGSTOP w0" in notes, notes
    assert "SIGCONT w0" in notes, notes


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'torture.db'}"


async def test_sqlite_kill_restart_group(sqlite_url: str) -> None:
    assert_killed_and_restarted(await run(sqlite_url, "kill-restart", "group"))


async def test_sqlite_stop_cont_pipeline(sqlite_url: str) -> None:
    assert_stopped_and_continued(await run(sqlite_url, "stop-cont", "pipeline"))


async def test_sqlite_poison_events_end_in_dead_letters(sqlite_url: str) -> None:
    report = await run(sqlite_url, "poison", "pipeline")
    assert report.dead_letters == SETTINGS.events // 50
    assert report.unexpected_dead_letters == ()
    assert report.poison_not_dead_lettered == ()


async def test_sqlite_ambiguous_appends_are_retried_without_duplicates(sqlite_url: str) -> None:
    report = await run(sqlite_url, "ambiguous-append", "group")
    calls = SETTINGS.events // SETTINGS.batch
    assert report.ambiguous_appends >= calls // 3
    assert report.duplicate_appends == ()
    assert "kill -9 p0" in " ".join(report.notes)


async def test_a_custom_scenario_drives_the_run_through_its_controls(sqlite_url: str) -> None:
    seen: dict[str, object] = {}

    async def pause_everyone(run: RunControl) -> None:
        assert await run.wait_progress(0.2)
        seen["progress"] = await run.progress()
        seen["url"] = (run.url, run.check_url)
        for worker in run.workers:
            worker.stop()
        run.note("paused all")
        await run.sleep(0.3)
        for worker in run.workers:
            worker.cont()
        seen["live"] = len(run.live_workers())

    scenario = Scenario("pause-all", "every worker paused briefly", pause_everyone,
                        workloads=("group",))
    report = await run_scenario(sqlite_url, scenario, "group", SETTINGS, bound_s=BOUND_S)
    assert_clean(report)
    assert seen["url"] == (sqlite_url, sqlite_url)
    assert seen["live"] == 2
    assert report.notes[0].endswith("paused all")
    assert report.scenario == "pause-all"


async def test_a_scenario_can_give_the_workers_and_the_checker_their_own_urls(
        tmp_path: Path) -> None:
    given: list[str] = []
    seen: list[tuple[str, str]] = []
    url = f"sqlite:///{tmp_path / 'own.db'}"
    # The same file under another spelling: what a proxy in between would look like.
    workers_url = f"sqlite:///{tmp_path}/./own.db"

    @contextlib.asynccontextmanager
    async def endpoints(url: str) -> AsyncIterator[Endpoints]:
        given.append(url)
        yield Endpoints(workers_url, url)

    async def look(run: RunControl) -> None:
        seen.append((run.url, run.check_url))
        await asyncio.Event().wait()  # never ends by itself: cancelled after the run

    scenario = Scenario("own-urls", "workers through their own URL", look,
                        endpoints=endpoints, workloads=("group",))
    report = await run_scenario(url, scenario, "group", SETTINGS, bound_s=BOUND_S)
    assert given == [url]
    assert seen == [(workers_url, url)]
    assert_clean(report)
    assert report.elapsed_s < BOUND_S


@pytest.fixture
def redis_prefix_url(redis_url: str) -> Iterator[str]:
    from redis.asyncio import Redis

    prefix = f"rheo-test-faults-{uuid.uuid4().hex[:10]}"
    separator = "&" if "?" in redis_url else "?"
    yield f"{redis_url}{separator}prefix={prefix}"

    async def delete() -> None:
        client = Redis.from_url(redis_url)
        try:
            keys = [k async for k in client.scan_iter(match=f"*{prefix}*")]
            if keys:
                await client.delete(*keys)
        finally:
            await client.aclose()

    asyncio.run(delete())


async def test_postgres_kill_restart_pipeline(postgres_schema_url: str) -> None:
    assert_killed_and_restarted(await run(postgres_schema_url, "kill-restart", "pipeline"))


async def test_postgres_stop_cont_group(postgres_schema_url: str) -> None:
    assert_stopped_and_continued(await run(postgres_schema_url, "stop-cont", "group"))


async def test_redis_kill_restart_group(redis_prefix_url: str) -> None:
    assert_killed_and_restarted(await run(redis_prefix_url, "kill-restart", "group"))


async def test_redis_stop_cont_pipeline(redis_prefix_url: str) -> None:
    report = await run(redis_prefix_url, "stop-cont", "pipeline")
    assert_stopped_and_continued(report)
    assert report.scenario == "stop-cont"
    assert report.backend == "redis"
    assert report.stream.startswith(f"{STREAM_PREFIX}")
    assert report.stream.endswith("-stop-cont-pipeline")


def test_the_catalogue_picks_what_applies_and_refuses_the_rest() -> None:
    defaults = [s.name for s in selected_scenarios("sqlite:///x.db")]
    assert defaults == ["kill-restart", "stop-cont", "poison", "ambiguous-append", "outbox"]
    assert [s.name for s in selected_scenarios("redis://h", ["baseline"])] == ["baseline"]
    with pytest.raises(InvalidArgument, match="one process"):
        selected_scenarios("memory://")
    with pytest.raises(InvalidArgument, match="unknown scenario"):
        selected_scenarios("sqlite:///x.db", ["nope"])
    only_pg = Scenario("pg-only", "PostgreSQL only", backends=frozenset({"postgres"}))
    assert only_pg.applies_to("postgresql://h/db")
    assert not only_pg.applies_to("sqlite:///x.db")


def test_scenario_names_are_unique() -> None:
    # Not a default scenario: it stays out of the runs of the other tests.
    first = register(Scenario("unique-name-test", "one", default=False))
    assert register(first) is first  # registering the same object again is harmless
    with pytest.raises(InvalidArgument, match="already registered"):
        register(Scenario("unique-name-test", "another", default=False))
