"""A separate OS process running the read-process-write loop (tests/_outbox_app.py's
``Billing`` in a Group), for test_outbox_kill9.py to kill with SIGKILL at a named step.

``_outbox_child.py KIND URL TARGET SCHEMA STEP EVENT LEASE_FILE``: consume ``orders``
until its backlog is settled; when the handler handling ``EVENT`` reaches ``STEP``
(``written``, ``acked`` or ``committed``), pickle its lease to ``LEASE_FILE``, print
``reached STEP`` on stdout and block until killed.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
from pathlib import Path
from typing import Any

# tests/, for the shared application: run by path, a script has only its own folder on
# sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _outbox_app import App, Billing
from rheo_flow import Lease, Rheo
from rheo_flow.backends import SQLiteBackend

LEASE_MS = 1_000


async def main(kind: str, url: str, target: str, schema: str, stop_step: str, stop_event: str,
               lease_file: str) -> None:
    app = App(kind, url, target, schema)
    backend: Any = SQLiteBackend(target) if kind == "sqlite" else url

    async def step(name: str, lease: Lease) -> None:
        if name == stop_step and lease.event.id == stop_event:
            with open(lease_file, "wb") as file:  # noqa: ASYNC230 - once, before blocking
                pickle.dump(lease, file)
            print(f"reached {name}", flush=True)
            await asyncio.Event().wait()  # until SIGKILL

    async with Rheo(backend) as rheo:
        billing = Billing(rheo, app, step=step, joined=stop_step == "acked",
                          lease_ms=LEASE_MS, concurrency=1, fetch_size=1)
        await billing.start(rheo).run_until_empty(timeout=60)
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:8]))
