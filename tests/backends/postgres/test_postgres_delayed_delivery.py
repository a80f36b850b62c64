"""PostgreSQL: scheduled events consumed by other OS processes on the real clock
(the scenario is tests/_delayed.py): never leased early, and on time because the
append's notification names their times and the listeners wake the idle consumers
again at each. Run with ``-s`` for the lateness distribution."""

from __future__ import annotations

import asyncio
from pathlib import Path

from _delayed import describe, scheduled_on_time


def test_scheduled_events_are_leased_on_time_by_other_processes(
        postgres_schema_url: str, tmp_path: Path) -> None:
    print("\npostgres " + describe(asyncio.run(scheduled_on_time(postgres_schema_url,
                                                                  tmp_path))))
