"""``rheo-flow worker``: real processes on real backends (SQLite, PostgreSQL).

The application module is written under ``tmp_path``. Its handlers mark files
when they start and finish an event; on a first delivery they block until the
test creates a ``release`` file, so work is in flight when the test signals the
worker. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from rheo_flow import ACK, BackendUnavailable, NewEvent, Retention, Rheo, consumer
from rheo_flow._cli.worker._retention import apply_retention_once
from rheo_flow.backends import MemoryBackend
from rheo_flow.pipeline import Message, Pipeline, PipelineHandler, Processors

WaitUntil = Callable[..., Awaitable[None]]

EVENTS = 10
LEASE_MS = 60_000
"""Long enough that a lease taken again well within it was handed back, not expired."""
HANDOVER_DEADLINE = LEASE_MS / 2000
"""How long the test waits for a second worker to take handed-back leases (half a lease)."""

APP = '''
import asyncio
import gc
import os
import pathlib

from rheo_flow import ACK, current_lease, consumer
from rheo_flow.pipeline import Pipeline, PipelineHandler, Processors

DIR = pathlib.Path(os.environ["WORKER_TEST_DIR"])
FROZEN_AT_IMPORT = gc.get_freeze_count()


async def work(role, sequence, attempt):
    (DIR / f"started-{role}-{sequence}-{attempt}").touch()
    if attempt == 1 and os.environ.get("WORKER_TEST_BLOCK") == "1":
        while not (DIR / "release").exists():
            await asyncio.sleep(0.02)  # the handler under test waits to be told
    (DIR / f"done-{role}-{sequence}-{attempt}-{os.getpid()}").touch()


async def ready(options):
    # What the worker had frozen when this module was loaded, and once it started.
    (DIR / f"ready-{os.getpid()}").write_text(f"{FROZEN_AT_IMPORT} {gc.get_freeze_count()}")
    return {}


@consumer(stream="jobs", group="g", setup=ready, concurrency=2, max_demand=10,
          lease_ms=60_000, poll_ms=50)
async def jobs(event, context):
    await work("g", event.sequence, current_lease().attempt)
    return ACK


class Handler(PipelineHandler):
    async def handle_message(self, processor, message, context):
        await work("p", message.lease.sequence, message.lease.attempt)
        return message


def pipeline(rheo):
    return Pipeline(rheo, stream="jobs", group="p", handler=Handler(),
                    processors=Processors(concurrency=2, max_demand=1), max_inflight=10,
                    lease_ms=60_000, poll_ms=50)


async def both(rheo):
    return [jobs, pipeline(rheo)]


NOT_RUNNABLE = 42
'''


@dataclass
class App:
    """The application directory, the backend URL and the worker processes started."""

    dir: Path
    url: str
    procs: list[asyncio.subprocess.Process]

    def markers(self, prefix: str) -> list[str]:
        return sorted(p.name for p in self.dir.iterdir() if p.name.startswith(prefix))

    def count(self, prefix: str) -> int:
        return len(self.markers(prefix))

    def release(self) -> None:
        (self.dir / "release").touch()

    async def worker(self, *args: str, block: bool = True,
                     url: str | None = None) -> asyncio.subprocess.Process:
        index = len(self.procs)
        # The caller's PYTHONPATH stays after the app's: the worker runs the code under test.
        path = os.pathsep.join(filter(None, [str(self.dir), os.environ.get("PYTHONPATH")]))
        env = {**os.environ, "PYTHONPATH": path, "WORKER_TEST_DIR": str(self.dir),
               "WORKER_TEST_BLOCK": "1" if block else "0"}
        env.pop("RHEO_URL", None)
        if url is not None:
            env["RHEO_URL"] = url
        with (self.dir / f"out-{index}.log").open("wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rheo_flow", "worker", *args, env=env, cwd=self.dir,
                stdout=out, stderr=asyncio.subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def log(self, proc: asyncio.subprocess.Process) -> str:
        return (self.dir / f"out-{self.procs.index(proc)}.log").read_text()

    async def exit_status(self, proc: asyncio.subprocess.Process, timeout: float = 20) -> int:
        try:
            return await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            raise AssertionError(f"worker still running after {timeout}s:\n"
                                 f"{self.log(proc)}") from None


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh SQLite file, or a PostgreSQL schema of this test only (dropped afterwards)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'events.db'}"
        return
    yield request.getfixturevalue("postgres_schema_url")


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'events.db'}"


async def _app(tmp_path: Path, url: str) -> App:
    (tmp_path / "app.py").write_text(APP)
    async with Rheo(url) as rheo:
        await rheo.create_stream("jobs", partitions=1)
        await rheo.append("jobs", [NewEvent("job", {"n": i}) for i in range(EVENTS)])
    return App(tmp_path, url, [])


@pytest.fixture
async def app(tmp_path: Path, url: str) -> AsyncIterator[App]:
    made = await _app(tmp_path, url)
    yield made
    await _cleanup(made)


@pytest.fixture
async def sqlite_app(tmp_path: Path, sqlite_url: str) -> AsyncIterator[App]:
    made = await _app(tmp_path, sqlite_url)
    yield made
    await _cleanup(made)


async def _cleanup(app: App) -> None:
    for proc in app.procs:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _get(port: int, path: str) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    status = int((await reader.readline()).split()[1])
    writer.close()
    await writer.wait_closed()
    return status


async def _response(port: int, path: str) -> tuple[int, str]:
    """The status and body of ``GET path``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
    await writer.drain()
    head, _, body = (await reader.read()).decode().partition("\r\n\r\n")
    writer.close()
    await writer.wait_closed()
    return int(head.split()[1]), body


async def _status_when_up(port: int, path: str) -> int | None:
    try:
        return await _get(port, path)
    except OSError:
        return None


@pytest.mark.parametrize("target", ["app:jobs", "app:pipeline"])
async def test_sigterm_hands_back_unstarted_leases_and_finishes_the_running_ones(
    app: App, target: str, wait_until: WaitUntil
) -> None:
    first = await app.worker(target, "--url", app.url, "--grace-seconds", "30")
    # One fetch took all ten leases; two handlers (concurrency 2) are blocked on them.
    await wait_until(lambda: app.count("started-") == 2, timeout=20,
                     message="two handlers running")
    first.send_signal(signal.SIGTERM)

    second = await app.worker(target, block=False, url=app.url)
    # The eight leases no handler had started were handed back: the second worker
    # takes them (attempt 2) long before their 60 s lease would have expired.
    await wait_until(lambda: app.count("done-") == EVENTS - 2, timeout=HANDOVER_DEADLINE,
                     message="second worker finished the handed-back events")
    assert all(name.split("-")[3] == "2" for name in app.markers("done-"))
    assert first.returncode is None  # still finishing its two running handlers

    app.release()
    assert await app.exit_status(first) == 0, app.log(first)
    assert "drained: every lease settled or handed back" in app.log(first)
    done = app.markers("done-")
    assert len(done) == EVENTS
    assert sorted(int(name.split("-")[2]) for name in done) == list(range(1, EVENTS + 1))
    second.send_signal(signal.SIGTERM)
    assert await app.exit_status(second) == 0, app.log(second)
    async with Rheo(app.url) as rheo:
        group = "g" if target == "app:jobs" else "p"
        assert await rheo.lag("jobs", group) == {0: 0}


async def test_a_second_signal_exits_at_once(sqlite_app: App, wait_until: WaitUntil) -> None:
    app = sqlite_app
    health = app.dir / "healthy"
    proc = await app.worker("app:jobs", "--url", app.url, "--health-file", str(health),
                            "--health-interval", "0.1")
    await wait_until(lambda: app.count("started-") == 2, timeout=20)
    proc.send_signal(signal.SIGTERM)
    await wait_until(lambda: not health.exists(), message="health file removed on drain")
    proc.send_signal(signal.SIGINT)
    status = await app.exit_status(proc)
    assert status == 128 + signal.SIGINT, app.log(proc)
    assert "second signal (SIGINT): exiting now" in app.log(proc)
    assert app.count("done-") == 0  # the blocked handlers never finished


async def test_health_file_and_endpoint(sqlite_app: App, wait_until: WaitUntil) -> None:
    app = sqlite_app
    health = app.dir / "healthy"
    port = _free_port()
    proc = await app.worker("app:both", "--url", app.url, "--health-file", str(health),
                            "--health-interval", "0.1", "--health-port", str(port),
                            "--health-host", "127.0.0.1")
    await wait_until(lambda: health.exists(), timeout=20, message="health file")
    await wait_until(lambda: _status_when_up(port, "/readyz"), timeout=20)
    assert await _get(port, "/readyz") == 200
    assert await _get(port, "/healthz") == 200
    assert await _get(port, "/metrics") == 200  # on by default with a health port
    assert await _get(port, "/nowhere") == 404
    first_touch = health.stat().st_mtime_ns
    await wait_until(lambda: health.stat().st_mtime_ns > first_touch,
                     message="health file touched again")
    await wait_until(lambda: app.count("started-") == 4, timeout=20)  # 2 group, 2 pipeline

    proc.send_signal(signal.SIGTERM)
    await wait_until(lambda: not health.exists(), message="health file removed on drain")
    assert await _get(port, "/readyz") == 503  # draining: take no traffic
    assert await _get(port, "/healthz") == 200  # but alive: do not kill it
    app.release()
    assert await app.exit_status(proc) == 0, app.log(proc)
    assert not health.exists()


async def test_a_paused_group_stays_ready_and_its_health_says_so(
        sqlite_app: App, wait_until: WaitUntil) -> None:
    app = sqlite_app
    async with Rheo(app.url) as rheo:
        await rheo.create_group("jobs", "g")
        await rheo.pause_group("jobs", "g")
    port = _free_port()
    proc = await app.worker("app:jobs", "--url", app.url, "--health-port", str(port),
                            "--health-host", "127.0.0.1", block=False)
    await wait_until(lambda: _status_when_up(port, "/readyz"), timeout=20)

    async def says(path: str, expected: tuple[int, str]) -> bool:
        return await _response(port, path) == expected

    await wait_until(lambda: says("/readyz", (200, "ready\npaused: jobs/g\n")), timeout=20)
    assert await _response(port, "/healthz") == (200, "ok\npaused: jobs/g\n")
    assert app.count("started-") == 0  # paused before the worker started
    async with Rheo(app.url) as rheo:
        await rheo.resume_group("jobs", "g")
    await wait_until(lambda: app.count("done-g-") == EVENTS, timeout=20)
    await wait_until(lambda: says("/readyz", (200, "ready\n")), timeout=20)
    proc.send_signal(signal.SIGTERM)
    assert await app.exit_status(proc) == 0, app.log(proc)
    assert "WARNING" not in app.log(proc)  # idling while paused logs nothing


async def test_two_processes(sqlite_app: App, wait_until: WaitUntil) -> None:
    app = sqlite_app
    health = app.dir / "healthy"
    proc = await app.worker("app:jobs", "--url", app.url, "--processes", "2",
                            "--health-file", str(health), "--health-interval", "0.1",
                            block=False)
    await wait_until(lambda: app.count("ready-") == 2, timeout=20,
                     message="two worker processes started the group")
    await wait_until(lambda: app.count("done-") == EVENTS, timeout=20)
    await wait_until(lambda: health.exists(), timeout=10, message="supervisor health file")
    pids = {name.split("-")[1] for name in app.markers("ready-")}
    assert str(proc.pid) not in pids  # the supervisor runs none itself
    proc.send_signal(signal.SIGTERM)
    assert await app.exit_status(proc) == 0, app.log(proc)
    assert app.log(proc).count("drained: every lease settled or handed back") == 2
    assert not health.exists()


def _gone(pid: int) -> bool:
    """Whether a process has exited (reaped, or a zombie nobody reaped yet)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    return "\nState:\tZ" in status


async def test_children_drain_when_the_supervisor_is_killed(
    sqlite_app: App, wait_until: WaitUntil
) -> None:
    app = sqlite_app
    proc = await app.worker("app:jobs", "--url", app.url, "--processes", "2", block=False)
    await wait_until(lambda: app.count("ready-") == 2, timeout=20)
    children = [int(name.split("-")[1]) for name in app.markers("ready-")]
    proc.kill()
    await proc.wait()
    await wait_until(lambda: all(map(_gone, children)), timeout=15,
                     message="children exited after their supervisor died")
    assert app.log(proc).count("the supervisor process") == 2


async def test_until_empty_exits_once_the_backlog_is_settled(app: App) -> None:
    proc = await app.worker("app:both", "--url", app.url, "--until-empty", block=False)
    assert await app.exit_status(proc) == 0, app.log(proc)
    assert app.count("done-") == 2 * EVENTS  # the group's and the pipeline's
    async with Rheo(app.url) as rheo:
        assert await rheo.lag("jobs", "g") == {0: 0}
        assert await rheo.lag("jobs", "p") == {0: 0}


@pytest.mark.parametrize(("target", "url", "expected"), [
    ("app", "sqlite:///x.db", "expected MODULE:ATTR"),
    ("nowhere_at_all:jobs", "sqlite:///x.db", "no module named 'nowhere_at_all'"),
    ("app:missing", "sqlite:///x.db", "module 'app' has no attribute 'missing'"),
    ("app:NOT_RUNNABLE", "sqlite:///x.db", "app:NOT_RUNNABLE is a int: expected"),
    ("app:jobs", None, "no backend URL: pass --url or set RHEO_URL"),
])
async def test_a_bad_target_is_a_usage_error(
    sqlite_app: App, target: str, url: str | None, expected: str
) -> None:
    args = [target] if url is None else [target, "--url", url]
    proc = await sqlite_app.worker(*args)
    assert await sqlite_app.exit_status(proc) == 2
    assert expected in sqlite_app.log(proc)
    assert "Traceback" not in sqlite_app.log(proc)


# The API behind --until-empty ----------------------------------------------------


async def test_the_worker_freezes_what_its_start_up_built(sqlite_app: App,
                                                          wait_until: WaitUntil) -> None:
    # Loading the application and opening the store come after the command line froze its
    # own start-up: the worker freezes them too before its runtimes start (the setup hook
    # runs at start), so full collections while consuming do not walk them again.
    app = sqlite_app
    proc = await app.worker("app:jobs", "--url", app.url, block=False)
    await wait_until(lambda: app.count("ready-") == 1, timeout=20, message="group started")
    (ready,) = app.markers("ready-")
    at_import, at_start = map(int, (app.dir / ready).read_text().split())
    assert at_import > 0  # the command line's own freeze
    assert at_start > at_import, (at_import, at_start)
    proc.send_signal(signal.SIGTERM)
    assert await app.exit_status(proc) == 0, app.log(proc)


async def test_group_run_until_empty(sqlite_app: App) -> None:
    seen: list[int] = []

    @consumer(stream="jobs", group="api", poll_ms=20)
    async def handle(event: object, context: object) -> object:
        seen.append(event.sequence)  # type: ignore[attr-defined]
        return ACK

    async with Rheo(sqlite_app.url) as rheo:
        group = handle.start(rheo)
        assert await group.run_until_empty(timeout=20)
        assert not group.running
        assert sorted(seen) == list(range(1, EVENTS + 1))
        assert await rheo.lag("jobs", "api") == {0: 0}


async def test_pipeline_run_until_empty(sqlite_app: App) -> None:
    class Collect(PipelineHandler):
        def __init__(self) -> None:
            self.seen: list[int] = []

        async def handle_message(self, processor: str, message: Message,
                                 context: object) -> Message:
            self.seen.append(message.lease.sequence)
            return message

    handler = Collect()
    async with Rheo(sqlite_app.url) as rheo:
        pipeline = Pipeline(rheo, stream="jobs", group="api", handler=handler, poll_ms=20,
                            processors=Processors(concurrency=2))
        assert await pipeline.run_until_empty(timeout=20)
        assert pipeline.state == "stopped"
        assert sorted(handler.seen) == list(range(1, EVENTS + 1))
        assert await rheo.lag("jobs", "api") == {0: 0}


async def test_run_until_empty_times_out_and_hands_back(sqlite_app: App) -> None:
    never = asyncio.Event()

    @consumer(stream="jobs", group="api", poll_ms=20, lease_ms=LEASE_MS)
    async def stuck(event: object, context: object) -> object:
        await never.wait()
        return ACK

    async with Rheo(sqlite_app.url) as rheo:
        assert not await stuck.start(rheo).run_until_empty(timeout=0.5)
        again = await rheo.fetch("jobs", "api", limit=EVENTS)
        assert len(again) == EVENTS  # handed back at the stop, not left to expire


# drain(hand_back=True) in one process ---------------------------------------------


async def test_group_drain_hand_back_returns_unstarted_leases_at_once(
    rheo: Rheo, wait_until: WaitUntil
) -> None:
    await rheo.create_stream("jobs")
    await rheo.append("jobs", [NewEvent("job", {"n": i}) for i in range(5)])
    release = asyncio.Event()
    started: list[int] = []

    @consumer(stream="jobs", group="g", max_demand=5, lease_ms=LEASE_MS)
    async def slow(event: object, context: object) -> object:
        started.append(event.sequence)  # type: ignore[attr-defined]
        await release.wait()
        return ACK

    async with slow.start(rheo) as group:
        await wait_until(lambda: started == [1])
        draining = asyncio.create_task(group.drain(10, hand_back=True))
        await wait_until(lambda: group.inflight == 1, message="four handed back")
        again = await rheo.fetch("jobs", "g", limit=10)  # no clock advance: not expired
        assert [(lease.sequence, lease.attempt) for lease in again] == [
            (2, 2), (3, 2), (4, 2), (5, 2)]
        release.set()
        assert await draining
    assert started == [1]
    assert group.stats.acked == 1
    assert group.stats.nacked == 4


async def test_pipeline_drain_hand_back_returns_queued_messages_at_once(
    rheo: Rheo, wait_until: WaitUntil
) -> None:
    await rheo.create_stream("jobs")
    await rheo.append("jobs", [NewEvent("job", {"n": i}) for i in range(5)])
    release = asyncio.Event()

    class Slow(PipelineHandler):
        started: list[int] = []

        async def handle_message(self, processor: str, message: Message,
                                 context: object) -> Message:
            self.started.append(message.lease.sequence)
            await release.wait()
            return message

    handler = Slow()
    pipeline = Pipeline(rheo, stream="jobs", group="p", handler=handler, max_inflight=5,
                        lease_ms=LEASE_MS, processors=Processors(concurrency=1, max_demand=1))
    await pipeline.start()
    await wait_until(lambda: handler.started == [1])
    draining = asyncio.create_task(pipeline.drain(10, hand_back=True))
    await wait_until(lambda: len(pipeline.producer.inflight) == 1, message="four handed back")
    again = await rheo.fetch("jobs", "p", limit=10)
    assert [(lease.sequence, lease.attempt) for lease in again] == [
        (2, 2), (3, 2), (4, 2), (5, 2)]
    release.set()
    assert await draining
    assert handler.started == [1]
    stats = pipeline.stats()
    assert (stats.acked, stats.nacked) == (1, 4)


async def test_the_worker_applies_the_retention_policy(sqlite_app: App,
                                                       wait_until: WaitUntil) -> None:
    """A worker applies the stored policy of the streams it consumes on its schedule: the
    events its group settled go, all but the last three (max_events)."""
    app = sqlite_app
    async with Rheo(app.url) as rheo:
        await rheo.set_retention("jobs", Retention(max_events=3))
    proc = await app.worker("app:jobs", "--url", app.url, "--retention-interval", "100ms",
                            "--log-level", "DEBUG", block=False)

    async def low_water() -> int:
        async with Rheo(app.url) as rheo:
            return (await rheo.stream_info("jobs")).low_water[0]

    await wait_until(lambda: app.count("done-") == EVENTS, timeout=20)
    await wait_until(lambda: _equals(low_water(), EVENTS - 2), timeout=20,
                     message="the worker trimmed all but the last 3 events")
    proc.send_signal(signal.SIGTERM)
    assert await app.exit_status(proc) == 0, app.log(proc)
    assert "retention removed" in app.log(proc)


async def test_no_retention_with_interval_zero(sqlite_app: App) -> None:
    app = sqlite_app
    async with Rheo(app.url) as rheo:
        await rheo.set_retention("jobs", Retention(max_events=1))
    proc = await app.worker("app:jobs", "--url", app.url, "--retention-interval", "0",
                            "--until-empty", block=False)
    assert await app.exit_status(proc) == 0, app.log(proc)
    async with Rheo(app.url) as rheo:
        assert (await rheo.stream_info("jobs")).low_water[0] == 1


async def _equals(value: Awaitable[int], expected: int) -> bool:
    return await value == expected


async def test_a_failed_retention_round_is_logged_not_raised(
        caplog: pytest.LogCaptureFixture) -> None:
    """A failing trim is logged with the stream's name and the round goes on with the
    next stream; nothing is raised (the worker's schedule tries again next time)."""

    class Failing(MemoryBackend):
        async def trim(self, stream: str, up_to: Mapping[int, int]) -> dict[int, int]:
            if stream == "bad":
                raise BackendUnavailable("the store is away")
            return await super().trim(stream, up_to)

    async with Rheo(Failing()) as rheo:
        for name in ("bad", "good", "plain"):
            await rheo.create_stream(name, retention=None if name == "plain" else
                                     Retention(max_events=1))
            await rheo.append(name, [NewEvent("t", {}) for _ in range(3)])
        with caplog.at_level("INFO", logger="rheo_flow.worker"):
            removed = await apply_retention_once(rheo, ["bad", "good", "plain"], "memory://")
    assert removed == {"good": 2}
    assert "retention of stream bad failed" in caplog.text
    assert "the store is away" in caplog.text
    assert "retention removed 2 event(s) from stream good" in caplog.text
