"""Scenarios: a named disruption run concurrently with a workload, and its controls.

A :class:`Scenario` says which backends it applies to, optionally supplies the
URLs (a proxy may sit between the workload and the backend, or the scenario may
run its own server) and disrupts the run through a :class:`RunControl`::

    async def pause_everyone(run: RunControl) -> None:
        await run.wait_progress(0.3)
        for worker in run.workers:
            worker.stop()
        await run.sleep(run.settings.lease_ms / 1000 * 2)
        for worker in run.workers:
            worker.cont()

    register(Scenario("pause-all", "every worker paused past its lease", pause_everyone))
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .._model._errors import InvalidArgument
from ._worker import WorkerConfig

__all__ = [
    "BACKEND_FAMILIES",
    "DURABLE",
    "Disrupt",
    "Endpoints",
    "EndpointsFactory",
    "Progress",
    "RunControl",
    "RunSettings",
    "Scenario",
    "WorkerProcess",
    "Workload",
    "backend_family",
    "direct_endpoints",
    "register",
]

Workload = Literal["group", "pipeline"]
"""The consuming runtime: a :class:`~rheo_flow.Group` or a ``Pipeline``."""

BACKEND_FAMILIES = {
    "sqlite": "sqlite", "postgresql": "postgres", "postgres": "postgres",
    "redis": "redis", "rediss": "redis", "redis+cluster": "redis-cluster",
    "rediss+cluster": "redis-cluster", "mongodb": "mongo", "mongodb+srv": "mongo",
    "memory": "memory",
}
"""URL scheme -> backend family (what :attr:`Scenario.backends` names)."""

DURABLE = frozenset({"sqlite", "postgres", "redis", "redis-cluster", "mongo"})
"""Backends shared by separate processes (every one but ``memory``)."""


def backend_family(url: str) -> str:
    """The backend family of a URL (``sqlite``, ``postgres``, ``redis``, ``redis-cluster``,
    ``mongo``, ``memory``)."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    family = BACKEND_FAMILIES.get(scheme)
    if family is None:
        raise InvalidArgument(f"not a backend URL with a known scheme: {scheme or url[:20]!r}")
    return family


@dataclass(frozen=True, slots=True)
class Endpoints:
    """The URLs of one run: what producers and workers use, and what the checker reads."""

    workload_url: str
    check_url: str


EndpointsFactory = Callable[[str], AbstractAsyncContextManager[Endpoints]]
"""Given the run's backend URL, an async context manager yielding its :class:`Endpoints`
for the run's duration (e.g. a proxy started in front of the backend)."""

Disrupt = Callable[["RunControl"], Awaitable[None]]
"""The coroutine function a scenario runs concurrently with the workload."""


@contextlib.asynccontextmanager
async def direct_endpoints(url: str) -> AsyncIterator[Endpoints]:
    """The default endpoints: everyone uses ``url`` itself."""
    yield Endpoints(url, url)


async def _no_disruption(run: RunControl) -> None:
    return None


@dataclass(frozen=True, slots=True)
class RunSettings:
    """The size and timing of one run (one scenario over one workload)."""

    events: int = 600
    workers: int = 2
    partitions: int = 4
    seconds: float = 8.0
    """The duration a run is paced for: the producer spreads its appends over a third
    of it and handlers are sized so that the workers could settle every event in a
    quarter of it. It is also the run's time bound unless the runner is given
    another; what is not settled by the bound is reported unfinished."""
    lease_ms: int = 1_000
    max_attempts: int = 4
    concurrency: int = 4
    work_ms: int | None = None
    """Upper bound of a handler's random duration; ``None``: sized so that the workers,
    all up, would need a quarter of the run for every event (they hold leases most of
    the time, so kills and stops catch some in flight)."""
    poison_every: int = 0
    lose_every: int = 0
    batch: int = 20
    outbox: bool = False
    """Handlers settle in the application's transaction, with an effect row and a derived
    event each; the checker counts those too (the ``outbox`` scenario)."""

    @property
    def handler_ms(self) -> int:
        """The resolved :attr:`work_ms`."""
        if self.work_ms is not None:
            return self.work_ms
        mean_s = self.workers * self.concurrency * self.seconds / 4 / self.events
        return max(1, min(200, round(2_000 * mean_s)))

    @property
    def produce_s(self) -> float:
        """How long the producer spreads its appends over (a third of the run)."""
        return self.seconds / 3

    def __post_init__(self) -> None:
        for name in ("events", "workers", "partitions", "lease_ms", "max_attempts",
                     "concurrency", "batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidArgument(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.seconds, int | float) or self.seconds <= 0:
            raise InvalidArgument(f"seconds must be positive, got {self.seconds!r}")


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named fault injected into a run.

    ``disrupt`` runs concurrently with the workload (from the moment every worker
    is ready); once the run is over it has a few seconds to end (its
    :meth:`RunControl.sleep` and :meth:`RunControl.wait_progress` return at once
    then), after which it is cancelled. ``backends`` names the backend
    families it applies to; ``endpoints`` (default: the run's URL for everyone)
    supplies the URL workers and producers use and the one the checker reads;
    ``tune`` adjusts the run's settings (e.g. poison events, dropped answers).
    ``workloads`` lists the runtimes it is run over; ``default`` scenarios run
    when ``rheo-flow torture`` is given no ``--scenario``.
    """

    name: str
    description: str
    disrupt: Disrupt = _no_disruption
    backends: frozenset[str] = DURABLE
    workloads: tuple[Workload, ...] = ("group", "pipeline")
    endpoints: EndpointsFactory = direct_endpoints
    tune: Callable[[RunSettings], RunSettings] = lambda settings: settings
    default: bool = True

    def applies_to(self, url: str) -> bool:
        """Whether the scenario can run against ``url``'s backend."""
        return backend_family(url) in self.backends


_REGISTRY: dict[str, Scenario] = {}


def register(scenario: Scenario) -> Scenario:
    """Add a scenario to the catalogue ``rheo-flow torture`` runs (names are unique)."""
    if not isinstance(scenario, Scenario):
        raise InvalidArgument(f"expected a Scenario, got {type(scenario).__name__}")
    if scenario.name in _REGISTRY and _REGISTRY[scenario.name] is not scenario:
        raise InvalidArgument(f"a scenario named {scenario.name!r} is already registered")
    _REGISTRY[scenario.name] = scenario
    return scenario


@dataclass(frozen=True, slots=True)
class Progress:
    """How far a run is: events appended and settled by the group (from the backend)."""

    appended: int
    settled: int
    target: int
    """Events the producers will append."""


class WorkerProcess:
    """One OS process of a run (a producer or a worker), which a scenario may signal."""

    def __init__(self, config: WorkerConfig, log_dir: Path) -> None:
        self.config = config
        """What the process runs."""
        self._log_dir = log_dir
        self._proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        """How many times it was started."""
        self.stopped = False
        """Whether it is stopped by SIGSTOP (and not continued yet)."""

    @property
    def name(self) -> str:
        """The process's name (stable across restarts)."""
        return self.config.name

    @property
    def role(self) -> str:
        """``producer``, ``group`` or ``pipeline``."""
        return self.config.role

    @property
    def pid(self) -> int | None:
        """The current OS process id (``None`` before the first start)."""
        return None if self._proc is None else self._proc.pid

    @property
    def alive(self) -> bool:
        """Whether the process runs (stopped counts as running)."""
        return self._proc is not None and self._proc.returncode is None

    @property
    def returncode(self) -> int | None:
        """The exit status once it ended (negative: killed by that signal)."""
        return None if self._proc is None else self._proc.returncode

    async def start(self) -> None:
        """Start (or start again, after it ended) the process."""
        if self.alive:
            raise InvalidArgument(f"{self.name} is already running")
        self.starts += 1
        log = open(self._log_dir / f"{self.name}.{self.starts}.log", "wb")  # noqa: ASYNC230, SIM115
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rheo_flow._faults._worker", self.config.to_json(),
                stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            log.close()
        self.stopped = False

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the process (nothing when it has ended)."""
        if self.alive and self._proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signum)

    def kill(self) -> None:
        """``kill -9``: end it at once, mid-whatever it was doing."""
        self.signal(signal.SIGKILL)

    def stop(self) -> None:
        """``SIGSTOP``: freeze it (its leases keep running out)."""
        self.signal(signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        """``SIGCONT``: let a stopped process run again."""
        self.signal(signal.SIGCONT)
        self.stopped = False

    def terminate(self) -> None:
        """``SIGTERM``: ask it to stop gracefully (a worker settles what it finished)."""
        if self.stopped:
            self.cont()
        self.signal(signal.SIGTERM)

    async def wait(self, timeout: float | None = None) -> int | None:
        """Wait until it ends (up to ``timeout`` seconds); its exit status or ``None``."""
        if self._proc is None:
            return None
        try:
            return await asyncio.wait_for(self._proc.wait(), timeout)
        except TimeoutError:
            return None

    async def restart(self, config: WorkerConfig | None = None) -> None:
        """Kill it if it still runs, wait for it to end, and start it again (with
        ``config`` instead of its own, when given)."""
        if self.alive:
            self.kill()
            self.cont()
            await self.wait()
        if config is not None:
            self.config = config
        await self.start()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "alive" if self.alive else "ended"
        return f"<WorkerProcess {self.name} {self.role} pid={self.pid} {state}>"


ProgressReader = Callable[[], Awaitable[Progress]]


@dataclass(slots=True)
class RunControl:
    """What a scenario's ``disrupt`` sees and drives during a run."""

    scenario: Scenario
    workload: Workload
    settings: RunSettings
    endpoints: Endpoints
    workers: list[WorkerProcess]
    """The consuming processes (a restart keeps the same object)."""
    producers: list[WorkerProcess]
    _progress: ProgressReader
    deadline: float
    """When the run stops waiting for the workload (``time.monotonic()`` clock)."""
    _started: float = field(default_factory=time.monotonic)
    notes: list[str] = field(default_factory=list)
    """What the scenario did, with times (shown in the report)."""
    finished: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once every event is settled: a scenario may stop disrupting."""

    @property
    def url(self) -> str:
        """The URL producers and workers use."""
        return self.endpoints.workload_url

    @property
    def check_url(self) -> str:
        """The URL the checker (and :meth:`progress`) reads."""
        return self.endpoints.check_url

    def elapsed(self) -> float:
        """Seconds since the workers were ready."""
        return time.monotonic() - self._started

    def remaining(self) -> float:
        """Seconds left until :attr:`deadline`."""
        return self.deadline - time.monotonic()

    def note(self, text: str) -> None:
        """Record what the scenario did (with the elapsed time)."""
        self.notes.append(f"{self.elapsed():.1f}s {text}")

    async def progress(self) -> Progress:
        """Events appended and settled so far (read through :attr:`check_url`)."""
        return await self._progress()

    async def sleep(self, seconds: float) -> None:
        """Sleep, but never past the run's bound, nor once the run is :attr:`finished`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.finished.wait(), max(0.0, min(seconds, self.remaining())))

    async def wait_progress(self, fraction: float, *, timeout: float | None = None) -> bool:
        """Wait until ``fraction`` of the events are settled; False on timeout or run end."""
        deadline = time.monotonic() + (self.remaining() if timeout is None else timeout)
        while time.monotonic() < deadline and not self.finished.is_set():
            try:
                p = await self.progress()
            except Exception:  # a disrupted backend: ask again
                p = Progress(0, 0, 1)
            if p.settled >= fraction * p.target:
                return True
            await asyncio.sleep(0.05)
        return False

    def live_workers(self) -> list[WorkerProcess]:
        """Workers running and not stopped."""
        return [w for w in self.workers if w.alive and not w.stopped]
