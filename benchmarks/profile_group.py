"""Flame graph of a ``Group`` consuming and acking a prepared backlog, under py-spy.

``python benchmarks/profile_group.py BACKEND [--events N] [--out FILE.svg] [--rate HZ]``

``BACKEND`` is ``memory``, ``sqlite``, ``postgres`` (``RHEO_POSTGRES_URL``, default
``postgresql://postgres@127.0.0.1:5432/test``, in a schema of its own) or ``redis``
(``RHEO_REDIS_URL``, default ``redis://127.0.0.1:6379/0``, under a key prefix of its
own). A worker process appends the backlog first; py-spy (``pip install py-spy``, in
the ``bench`` extra) attaches to it only once the backlog is ready and is stopped as
soon as the last event is acked, so the graph shows the consume + ack hot path and
nothing else. The ``Group`` is configured as in the suites: on Redis ``max_demand``
500 and concurrency 10 (the ``redis`` suite), elsewhere ``max_demand`` 400,
``fetch_size`` 100 and concurrency 100 (the ``postgres`` and ``sqlite`` suites).
Everything the worker created is removed when it ends. ``RHEO_PYSPY_FORMAT=raw`` writes
py-spy's collapsed stacks instead of an SVG (one line per stack and its sample count,
for counting by function).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

# `python benchmarks/profile_group.py` puts benchmarks/ first on sys.path, where the
# suite redis.py would shadow the redis driver: leave it out.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

BACKENDS = ("memory", "sqlite", "postgres", "redis")
PG_URL = os.environ.get("RHEO_POSTGRES_URL") or "postgresql://postgres@127.0.0.1:5432/test"
REDIS_URL = os.environ.get("RHEO_REDIS_URL") or "redis://127.0.0.1:6379/0"
CHUNK = 5_000


# The worker: prepare, wait for the go, consume, report, wait for the end, clean up. --


async def _worker(backend_name: str, events: int) -> None:
    from rheo_flow import ACK, NewEvent, Rheo, consumer
    from rheo_flow.backends import MemoryBackend, PostgresBackend, RedisBackend, SQLiteBackend

    scratch = tempfile.mkdtemp(prefix="rheo-profile-")
    schema = f"rheo_profile_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    backend: Any
    if backend_name == "memory":
        backend = MemoryBackend()
    elif backend_name == "sqlite":
        backend = SQLiteBackend(Path(scratch) / "profile.db")
    elif backend_name == "postgres":
        backend = PostgresBackend.from_url(
            f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}")
    else:
        backend = RedisBackend.from_url(REDIS_URL,
                                        prefix=f"rheo-profile-{uuid.uuid4().hex[:10]}")
    options: dict[str, Any] = (
        {"max_demand": 500, "concurrency": 10} if backend_name == "redis"
        else {"max_demand": 400, "fetch_size": 100, "concurrency": 100, "poll_ms": 50})
    rheo = await Rheo(backend).open()
    try:
        await rheo.create_stream("bench")
        for start in range(0, events, CHUNK):
            await rheo.append("bench", [
                NewEvent("bench.event", {"n": i, "kind": "bench", "tags": ["a", "b"]})
                for i in range(start, min(events, start + CHUNK))])
        acked = 0
        done = asyncio.Event()

        @consumer(stream="bench", group="g", **options)
        async def noop(event: Any, context: Any) -> Any:
            nonlocal acked
            acked += 1
            if acked >= events:
                done.set()
            return ACK

        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        started = time.perf_counter()
        async with noop.start(rheo) as group:
            await done.wait()
            await group.drain(timeout=60)
            elapsed = time.perf_counter() - started
        print(f"done {events / elapsed:.0f}", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
    finally:
        if backend_name == "redis":
            await backend.drop_all()
        await rheo.close()
        if backend_name == "postgres":
            import asyncpg

            conn = await asyncpg.connect(PG_URL)
            try:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            finally:
                await conn.close()
        shutil.rmtree(scratch, ignore_errors=True)


# The driver ----------------------------------------------------------------------------


def _py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install py-spy (or 'rheo-flow[bench]')")
    return found


def _retitle(svg: Path, title: str) -> None:
    """Put ``title`` in place of py-spy's (its command line, with local paths and a pid)."""
    text = svg.read_text()
    svg.write_text(re.sub(r'(<text id="title"[^>]*>)[^<]*(</text>)',
                          lambda m: f"{m.group(1)}{title}{m.group(2)}", text, count=1))


def profile(backend: str, events: int, out: Path, rate: int | None) -> float:
    """Run the worker, record it under py-spy while it consumes; events/s it reported."""
    root = Path(__file__).resolve().parent.parent
    worker = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), backend, "--events", str(events),
         "--worker"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=root,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(root / "src"), os.environ.get("PYTHONPATH")) if p)})
    assert worker.stdin is not None
    assert worker.stdout is not None
    spy: subprocess.Popen[bytes] | None = None
    try:
        if worker.stdout.readline().strip() != "ready":
            raise SystemExit("the worker failed before its backlog was ready")
        command = [_py_spy(), "record", "--pid", str(worker.pid), "--format",
                   os.environ.get("RHEO_PYSPY_FORMAT", "flamegraph"), "--output", str(out)]
        if rate:
            command += ["--rate", str(rate)]
        spy = subprocess.Popen(command)
        time.sleep(1.0)  # py-spy has no ready signal; it attaches well within this
        worker.stdin.write("go\n")
        worker.stdin.flush()
        line = worker.stdout.readline().split()
        if not line or line[0] != "done":
            raise SystemExit("the worker failed while consuming")
        spy.send_signal(signal.SIGINT)  # py-spy writes the graph on Ctrl-C
        spy.wait(timeout=60)
        _retitle(out, f"Group consume+ack, {backend}, {events} events "
                      "(benchmarks/profile_group.py)")
        return float(line[1])
    finally:
        if spy is not None and spy.poll() is None:
            spy.kill()
        if worker.poll() is None:
            worker.stdin.write("end\n")
            worker.stdin.flush()
        worker.wait(timeout=120)


def main(argv: list[str] | None = None) -> int:
    """Parse arguments; run the worker (``--worker``) or profile it."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=BACKENDS)
    parser.add_argument("--events", type=int, default=30_000, help="backlog size (30,000)")
    parser.add_argument("--out", type=Path, help="SVG path (flame-group-BACKEND.svg)")
    parser.add_argument("--rate", type=int, help="py-spy samples per second (its default)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        asyncio.run(_worker(args.backend, args.events))
        return 0
    out = args.out or Path(f"flame-group-{args.backend}.svg")
    rate = profile(args.backend, args.events, out, args.rate)
    print(f"{args.backend}: {args.events} events consumed+acked at {rate:,.0f} events/s "
          f"(under py-spy); flame graph in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
