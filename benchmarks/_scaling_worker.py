"""One worker process of the ``scaling`` suite: a consumer group draining a shared backlog.

Run as ``python -m benchmarks._scaling_worker URL STREAM DIR NAME FETCH_SIZE`` from the
repository root: it opens
the store, marks itself ready in ``DIR``, waits for ``DIR/go``, runs a ``Group``
with a no-op handler until ``DIR/stop`` appears, and writes how many events it
acked, and the CPU time it spent from ``go`` to ``stop``, to ``DIR/NAME.json``.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from rheo_flow import ACK, Rheo, consumer

DEADLINE_S = 600.0


def _exists(path: Path) -> bool:
    # A stat per poll: the markers are local files, checked between fetches.
    return path.exists()


async def _until(path: Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not _exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {path}")
        await asyncio.sleep(0.002)


async def main(url: str, stream: str, directory: str, name: str, fetch_size: int) -> None:
    """Drain ``stream`` with one group until told to stop; report the acks."""
    folder = Path(directory)
    rheo = await Rheo(url).open()
    try:
        @consumer(stream=stream, group="g", max_demand=2 * fetch_size, fetch_size=fetch_size,
                  concurrency=fetch_size, poll_ms=20)
        async def noop(event: Any, context: Any) -> Any:
            return ACK

        (folder / f"{name}.ready").touch()
        await _until(folder / "go")
        cpu = time.process_time()
        async with noop.start(rheo) as group:
            await _until(folder / "stop")
            acked = group.stats.acked
        cpu = time.process_time() - cpu
    finally:
        await rheo.close()
    (folder / f"{name}.json").write_text(json.dumps({"acked": acked, "cpu_s": cpu}))


if __name__ == "__main__":
    url, stream, directory, name, fetch_size = sys.argv[1:6]
    asyncio.run(main(url, stream, directory, name, int(fetch_size)))
