"""A separate OS process consuming a key-ordered group, driven by
tests/runtime/test_key_ordering_processes.py.

``URL STREAM GROUP NAME READY_DIR WORKERS OUT SEED [--option=value ...]``: wait
until ``WORKERS`` processes are ready, then run a :class:`~rheo_flow.Group` with
``ordering="key"`` (several handlers at once) whose handler sleeps a random short
while and then acks, or retries after a short delay (about one handling in eight),
until the group's frontier reaches the high water. Every handling is written to
``OUT`` as one JSON line: ``[key, partition, sequence, attempt, start_ns, end_ns,
outcome]`` with ``time.time_ns()`` stamps (the processes share a host, so they
compare).

``--concurrency``, ``--max-demand``, ``--fetch-size`` and ``--poll-ms`` override
the group's settings below; ``--deadline-s`` is the time the group has to catch up,
``--check-s`` how often the worker looks whether it has (a slow server is spared
the reads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

# tests/, for the shared loop (_competing.py): run by path, a script has only its own
# folder on sys.path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _competing import DEADLINE_S, wait_for_workers
from rheo_flow import ACK, Consumer, Event, Outcome, Retry, Rheo, current_lease

RETRY_ONE_IN = 8
RETRY_DELAY_MS = 5
SETTINGS = ("concurrency", "max_demand", "fetch_size", "poll_ms")
"""The group's settings a command-line option may override."""


class Recorder(Consumer):
    """Records every handling; acks most, retries some."""

    concurrency = 16
    max_demand = 64
    fetch_size = 32
    poll_ms = 20
    ordering = "key"
    max_attempts = 1_000

    def __init__(self, records: list[list[Any]], seed: int, **options: Any) -> None:
        super().__init__(**options)
        self._records = records
        self._random = random.Random(seed)

    async def handle_event(self, event: Event, context: Any) -> Outcome:
        lease = current_lease()
        start = time.time_ns()
        await asyncio.sleep(self._random.random() * 0.002)
        outcome: Outcome = ACK
        if self._random.randrange(RETRY_ONE_IN) == 0:
            outcome = Retry("try again", delay_ms=RETRY_DELAY_MS)
        self._records.append([event.key, event.partition, event.sequence, lease.attempt, start,
                              time.time_ns(), "ack" if outcome is ACK else "retry"])
        return outcome


async def _caught_up(rheo: Rheo, stream: str, group: str) -> bool:
    frontier = await rheo.frontier(stream, group)
    return frontier == await rheo.high_water(stream)


async def run(args: argparse.Namespace) -> list[list[Any]]:
    records: list[list[Any]] = []
    async with Rheo(args.url) as rheo:
        await wait_for_workers(args.ready_dir, args.name, args.workers)
        consumer = Recorder(records, args.seed, stream=args.stream, group=args.group,
                            **{name: value for name in SETTINGS
                               if (value := getattr(args, name)) is not None})
        deadline = time.monotonic() + args.deadline_s
        async with consumer.start(rheo):
            while not await _caught_up(rheo, args.stream, args.group):
                if time.monotonic() > deadline:
                    raise SystemExit("the group did not catch up in time")
                await asyncio.sleep(args.check_s)
    return records


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "stream", "group", "name", "ready_dir"):
        parser.add_argument(name)
    parser.add_argument("workers", type=int)
    parser.add_argument("out")
    parser.add_argument("seed", type=int)
    for name in SETTINGS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int)
    parser.add_argument("--deadline-s", type=float, default=DEADLINE_S)
    parser.add_argument("--check-s", type=float, default=0.1)
    args = parser.parse_args()
    records = asyncio.run(run(args))
    Path(args.out).write_text("".join(json.dumps(record) + "\n" for record in records),
                              encoding="utf-8")


if __name__ == "__main__":
    main()
