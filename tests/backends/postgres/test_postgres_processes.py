"""PostgreSQL: OS processes competing for one group (_pg_worker.py, beside it, is the worker).

Four processes consume 20,000 events of one group in batches of 200 while a fifth
leases a batch with a short lease and dies without settling it. On the server
clock, no event is ever leased while an earlier lease on it is still live; every
event is acked exactly once, the abandoned batch comes back with attempt 2, and
the frontier reaches the high water mark. The same runs directly against the server
and through PgBouncer in transaction pooling (``RHEO_PGBOUNCER_URL``, see
tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from _pgbouncer import through_pgbouncer
from rheo_flow import NewEvent, Rheo

WORKER = Path(__file__).with_name("_pg_worker.py")
EVENTS = 20_000
WORKERS = 4
CRASH_LEASE_MS = 1_500


@pytest.fixture(params=["direct", "pgbouncer"])
def url(request: pytest.FixtureRequest, postgres_url: str, postgres_schema_url: str) -> str:
    """A URL on a schema of this test only (dropped afterwards): the server's, or PgBouncer's
    in front of it (wake-ups LISTEN on the server)."""
    if request.param == "direct":
        return postgres_schema_url
    schema = dict(parse_qsl(urlsplit(postgres_schema_url).query))["schema"]
    return through_pgbouncer(request.getfixturevalue("pgbouncer_url"), postgres_url, schema)


async def _worker(*args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def test_four_processes_share_one_group(url: str, tmp_path: Path) -> None:
    asyncio.run(_compete(url, tmp_path))


async def _compete(url: str, tmp_path: Path) -> None:
    async with Rheo(url) as rheo:
        await rheo.create_stream("jobs", partitions=4)
        for start in range(0, EVENTS, 5_000):
            await rheo.append("jobs", [NewEvent("job", {"n": i}, key=f"k{i}")
                                       for i in range(start, start + 5_000)])
        await rheo.create_group("jobs", "workers")
        high = await rheo.high_water("jobs")
    assert sum(high.values()) == EVENTS

    ready = tmp_path / "ready"
    ready.mkdir()
    everyone = str(WORKERS + 1)
    reports = await asyncio.gather(
        _worker("crash", url, "jobs", "workers", "crasher", str(ready), everyone,
                str(CRASH_LEASE_MS)),
        *(_worker("compete", url, "jobs", "workers", f"w{i}", str(ready), everyone)
          for i in range(WORKERS)),
    )
    crashed, competitors = reports[0], reports[1:]

    leases: dict[tuple[int, int], list[list[Any]]] = defaultdict(list)
    for report in reports:
        for part, seq, attempt, lease_id, start, deadline in report["leased"]:
            leases[(part, seq)].append([start, deadline, attempt, lease_id, report["name"]])
    assert len(leases) == EVENTS, "every event was leased"
    assert len(crashed["leased"]) > 0

    # Never leased to two live consumers at once: each later lease starts after
    # the previous one's deadline, on the server clock.
    for position, history in leases.items():
        history.sort()
        for before, after in itertools.pairwise(history):
            assert after[0] >= before[1], f"{position} leased while a lease was live: {history}"
            assert after[2] == before[2] + 1, f"attempts of {position}: {history}"
        assert len({entry[3] for entry in history}) == len(history), "lease ids are unique"

    abandoned = {(part, seq) for part, seq, *_ in crashed["leased"]}
    for position in abandoned:
        assert [entry[2] for entry in leases[position]] == [1, 2], position
    assert all(len(leases[p]) == 1 for p in leases if p not in abandoned)

    acked = [tuple(entry) for report in competitors for entry in report["acked"]]
    assert len(acked) == EVENTS, "each event acked exactly once"
    assert all(ok and not repeated for _, _, ok, repeated in acked)
    assert {(part, seq) for part, seq, _, _ in acked} == set(leases)
    # They competed: at least two took work. (Which ones, and how much, is the
    # scheduler's: through PgBouncer on a busy machine one may start after the rest
    # have drained the backlog.)
    assert sum(1 for r in competitors if r["leased"]) >= 2, "the load was shared"
    for report in competitors:
        assert {int(p): s for p, s in report["frontier"].items()} == high

    async with Rheo(url) as rheo:
        assert await rheo.frontier("jobs", "workers") == high
        assert await rheo.lag("jobs", "workers") == dict.fromkeys(high, 0)
        assert await rheo.dead_letters("jobs", "workers") == []
