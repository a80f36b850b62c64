"""Server crashes and network faults under a real workload: nothing lost, no stale settle.

A short version of the ``server-kill``, ``crash-after-re-lease``, ``net-drop``,
``net-blackhole`` and ``net-delay`` scenarios (500 events, 2 worker processes,
one kill per server run): each scenario runs once or twice, PostgreSQL and Redis
and the Group and Pipeline workloads taking turns, to stay near a minute; the
long run, ``.ci/torture-servers.py``, runs every scenario over both workloads
and both backends. Everything runs on a throwaway PostgreSQL and a throwaway
Redis started for this module, never on the shared servers: the server
scenarios kill them.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from _throwaway import throwaway
from rheo_flow._faults._servers import PostgresServer, RedisServer, ThrowawayServer
from rheo_flow.testing.faults import RunSettings, Workload, report_dict, run_scenario, scenarios

pytestmark = pytest.mark.slow

SETTINGS = RunSettings(events=500, workers=2, seconds=10)
BOUND_S = 45.0
"""Room for a slow, shared machine: a run ends as soon as everything is settled."""

CELLS: list[tuple[str, str, Workload]] = [
    ("server-kill", "postgres", "group"),
    ("server-kill", "redis", "pipeline"),
    ("crash-after-re-lease", "postgres", "pipeline"),
    ("net-drop", "postgres", "pipeline"),
    ("net-drop", "redis", "group"),
    ("net-blackhole", "redis", "group"),
    ("net-delay", "postgres", "group"),
]

FAULT_NOTES = {"server-kill": "kill -9", "crash-after-re-lease": "kill -9 postgres right after",
               "net-drop": "dropping", "net-blackhole": "blackhole every", "net-delay": "delay "}
"""What each scenario notes when it injects its fault."""


@pytest.fixture(scope="module")
def servers(ci: bool) -> Iterator[dict[str, ThrowawayServer]]:
    started: dict[str, ThrowawayServer] = {}
    try:
        started["postgres"] = throwaway(PostgresServer, ci)
        started["redis"] = throwaway(RedisServer, ci)
        yield started
    finally:
        for server in started.values():
            server.close()


@pytest.mark.parametrize(("scenario", "backend", "workload"), CELLS,
                         ids=[f"{s}-{b}-{w}" for s, b, w in CELLS])
async def test_scenario_loses_nothing_and_accepts_no_stale_settle(
        servers: dict[str, ThrowawayServer], scenario: str, backend: str,
        workload: Workload) -> None:
    server = servers[backend]
    url = (f"{server.url}?schema=faults&listen=true" if backend == "postgres"
           else f"{server.url}?prefix=faults")
    report = await run_scenario(url, scenarios()[scenario], workload, SETTINGS, bound_s=BOUND_S)
    summary = report_dict(report)
    assert report.error is None, summary
    assert report.lost == (), summary
    assert report.unexpected == (), summary
    assert report.stale_accepted == (), summary
    assert report.duplicate_appends == (), summary
    # Every event settled within the bound: no worker was left hanging by the fault.
    assert report.complete, summary
    assert any(FAULT_NOTES[scenario] in note for note in report.notes), summary  # it happened
    assert server.running  # a killed server was started again
