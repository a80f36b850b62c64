#!/usr/bin/env python3
"""The long run of the server and network fault scenarios: every cell, one table per backend.

Starts a throwaway PostgreSQL and a throwaway Redis (AOF, appendfsync always) on
free loopback ports, in temporary directories, and runs each of the scenarios
``server-kill``, ``crash-after-re-lease``, ``net-drop``, ``net-blackhole`` and
``net-delay`` over the Group and the Pipeline workloads against each of them,
then prints the checker's table per backend. The shared servers are never
touched, and nothing is left behind. Exit status: 0 when every run is clean
and complete, 1 on a violation or a failed run, 3 when clean but some events
were not settled within a run's bound.

    .venv/bin/python .ci/torture-servers.py                   # 20,000 events per cell
    .venv/bin/python .ci/torture-servers.py --events 2000 --seconds 40 -s net-drop
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from rich.console import Console

from rheo_flow._faults._servers import PostgresServer, RedisServer
from rheo_flow.testing.faults import (
    Report,
    RunSettings,
    Scenario,
    Workload,
    report_table,
    run_scenario,
    scenarios,
)

SCENARIOS = ("server-kill", "crash-after-re-lease", "net-drop", "net-blackhole", "net-delay")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=20_000, help="events per cell")
    parser.add_argument("--seconds", type=float, default=120.0,
                        help="pace of one cell: appends spread over a third of it; a cell "
                             "ends once everything is settled, at the latest after twice this")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--backend", action="append", choices=("postgres", "redis"))
    parser.add_argument("-s", "--scenario", action="append", choices=SCENARIOS)
    parser.add_argument("-w", "--workload", action="append", choices=("group", "pipeline"))
    args = parser.parse_args()
    # The checker's own pool reports every failed reconnection while a server is down.
    logging.getLogger("asyncpg.pool").setLevel(logging.CRITICAL)
    workloads: list[Workload] | None = args.workload
    settings = RunSettings(events=args.events, workers=args.workers, seconds=args.seconds)
    chosen = [scenarios()[name] for name in (args.scenario or SCENARIOS)]
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 180)
    verdicts: list[Report] = []
    for backend in args.backend or ("postgres", "redis"):
        kind = PostgresServer if backend == "postgres" else RedisServer
        with kind() as server:
            url = (f"{server.url}?schema=torture" if backend == "postgres"
                   else f"{server.url}?prefix=torture")
            reports = asyncio.run(_run(url, chosen, settings, workloads, console))
        console.print(report_table(reports, f"{backend}: {args.events:,} events per cell"))
        verdicts += reports
    if not all(r.ok and r.error is None for r in verdicts):
        return 1
    return 0 if all(r.complete for r in verdicts) else 3


async def _run(url: str, chosen: list[Scenario], settings: RunSettings,
               workloads: list[Workload] | None, console: Console) -> list[Report]:
    reports = []
    for scenario, workload in [(s, w) for s in chosen for w in s.workloads
                               if workloads is None or w in workloads]:
        report = await run_scenario(url, scenario, workload, settings,
                                    bound_s=2 * settings.seconds)
        mark = "ok" if report.ok and report.complete else "NOT OK"
        console.print(f"{mark}: {report.scenario} / {report.workload} on "
                      f"{report.backend}: {report.elapsed_s:.1f} s; " + "; ".join(report.notes))
        reports.append(report)
    return reports


if __name__ == "__main__":
    sys.exit(main())
