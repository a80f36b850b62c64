"""PostgreSQL: scheduled events (``NewEvent(deliver_at=...)``) consumed by OS processes
on the real clock (_pg_delay_worker.py, beside it, is the worker).

Two processes consume one group, idle between fetches on wake-ups with a poll of a
second. Events scheduled a few hundred milliseconds to two seconds ahead, with
unscheduled ones among them, are appended once both listen. On the server's clock no
scheduled event is leased before its time, each is leased once, and each comes well
within the poll interval of its time: the append's notification wakes the idle
consumers again at each scheduled time. The lateness distribution is printed (run
with ``-s``); docs/benchmarks.md keeps the figures.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rheo_flow import NewEvent, Rheo

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for _competing

from _competing import wait_for_workers

WORKER = Path(__file__).with_name("_pg_delay_worker.py")
WORKERS = 2
SCHEDULED = 60
POLL_S = 1.0


async def _worker(*args: str) -> Any:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(WORKER), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    return json.loads(out)


def test_scheduled_events_are_leased_on_time_by_other_processes(
        postgres_schema_url: str, tmp_path: Path) -> None:
    asyncio.run(_run(postgres_schema_url, tmp_path))


async def _run(url: str, tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    ready.mkdir()
    total = 2 * SCHEDULED
    async with Rheo(url) as rheo:
        await rheo.create_stream("timers", partitions=2)
        await rheo.create_group("timers", "g")
        workers = asyncio.gather(*(
            _worker(url, "timers", "g", f"w{i}", str(ready), str(WORKERS + 1), str(total),
                    str(POLL_S)) for i in range(WORKERS)))
        await wait_for_workers(str(ready), "appender", WORKERS + 1)  # all listen
        due: dict[tuple[int, int], int] = {}
        for batch in range(3):
            now = int(time.time() * 1000)  # the server runs on this host
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
    print(f"\nlateness ms over {len(lateness)} scheduled events: "
          f"min {lateness[0]}, median {statistics.median(lateness)}, "
          f"p95 {lateness[int(0.95 * len(lateness)) - 1]}, max {lateness[-1]}")

