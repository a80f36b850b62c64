"""Scheduled events (``NewEvent(deliver_at=...)``) consumed by OS processes on the real
clock (_delay_worker.py is the worker); shared by the PostgreSQL and Redis tests.

Two processes consume one group and idle between fetches on wake-ups, with a poll of
three seconds. Once both wait, events scheduled a few hundred milliseconds to two seconds
ahead, with as many unscheduled ones among them, are appended in three calls. On the
server's clock no scheduled event is leased before its time, each event is leased
once, and each scheduled one well within the poll of its time: the backend wakes the
idle consumers again when it becomes due. Returns the lateness of each scheduled
event (ms, server clock: lease deadline - lease time - deliver_at), for the test to
print.

The poll is long beside the wake-up's lateness so that the two cannot be confused on a
loaded host: with a poll of one second, a wake-up held up by other work on the machine
(a full test run on two cores) once came later than the poll would have. An idle
consumer that waited for the poll instead would be late by up to the poll, half of it
at the median: both the largest lateness and the median are bounded below that.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from _competing import wait_for_workers
from rheo_flow import NewEvent, Rheo

WORKER = Path(__file__).with_name("_delay_worker.py")
WORKERS = 2
SCHEDULED = 60
POLL_S = 3.0


async def _worker(*args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


async def scheduled_on_time(url: str, tmp_path: Path) -> list[int]:
    """Run the scenario on the store at ``url``; the lateness of each scheduled event."""
    ready = tmp_path / "ready"
    ready.mkdir()
    total = 2 * SCHEDULED
    async with Rheo(url) as rheo:
        await rheo.create_stream("timers", partitions=2)
        await rheo.create_group("timers", "g")
        workers = asyncio.gather(*(
            _worker(url, "timers", "g", f"w{i}", str(ready), str(WORKERS + 1), str(total),
                    str(POLL_S)) for i in range(WORKERS)))
        await wait_for_workers(str(ready), "appender", WORKERS + 1)  # all wait
        due: dict[tuple[int, int], int] = {}
        for batch in range(3):
            now = int(time.time() * 1000)  # the servers of the tests run on this host
            events = []
            for i in range(SCHEDULED // 3):
                at = now + 300 + 80 * i + 27 * batch
                events.append(NewEvent("timer", {"i": i}, partition=i % 2, deliver_at=at))
                events.append(NewEvent("now", {"i": i}, partition=i % 2))
            stored = await rheo.append("timers", events)
            due.update(((e.partition, e.sequence), ev.deliver_at)
                       for e, ev in zip(stored, events, strict=True)
                       if isinstance(ev.deliver_at, int))
        reports = await workers
    leased = [tuple(row) for report in reports for row in report["leased"]]
    positions = [(part, seq) for part, seq, _, _ in leased]
    assert len(positions) == len(set(positions)) == total, "each event leased once"
    assert all(attempt == 1 for *_, attempt, _ in leased)
    lateness = sorted(at - due[(part, seq)] for part, seq, _, at in leased
                      if (part, seq) in due)
    assert len(lateness) == SCHEDULED
    assert lateness[0] >= 0, f"a scheduled event was leased {-lateness[0]} ms early"
    assert lateness[-1] < POLL_S * 1000, "a scheduled event waited for the poll"
    assert statistics.median(lateness) < POLL_S * 1000 / 4, "scheduled events waited for the poll"
    return lateness


def describe(lateness: list[int]) -> str:
    """The lateness distribution in one line."""
    return (f"lateness ms over {len(lateness)} scheduled events: min {lateness[0]}, "
            f"median {statistics.median(lateness)}, "
            f"p95 {lateness[int(0.95 * len(lateness)) - 1]}, max {lateness[-1]}")
