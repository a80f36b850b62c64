"""A long-lived worker process: runs consumer groups and pipelines until told to stop.

``rheo-flow worker MODULE:ATTR`` (see :mod:`rheo_flow._cli.worker._command`) loads what
ATTR names, builds its runtimes on one :class:`~rheo_flow.Rheo` instance and
runs them. The first SIGTERM or SIGINT starts a drain: fetching stops, leases
no handler has started are handed back at once, running handlers and open
batches finish and settle, all within a grace period; a second signal exits at
once. Health is reported through a file touched while the runtimes are ready
and a tiny HTTP endpoint (:mod:`rheo_flow._cli.worker._health`). With ``--processes`` a
supervisor (:mod:`rheo_flow._cli.worker._supervisor`) runs several such processes.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import inspect
import logging
import os
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._model._errors import InvalidArgument
from ..._rheo import Rheo
from ..._runtime._backlog import wait_producer_caught_up
from ..._runtime._group import Consumer, Group
from ..._runtime._lifecycle import State
from ..._support._waiting import first_of
from ..._telemetry._state import STATE
from ...pipeline import Pipeline
from .._common import existing
from ._drain import Runtime, describe, drain_runtimes, producer_of
from ._health import Health
from ._observe import Observation
from ._paused import PausedGroups
from ._retention import retention_schedule

__all__ = ["SIGNALS", "SUPERVISOR_ENV", "WorkerConfig", "build_runtimes", "load_target",
           "run_worker"]

log = logging.getLogger("rheo_flow.worker")


SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that start a drain (a second one exits at once)."""
SUPERVISOR_ENV = "RHEO_WORKER_SUPERVISOR_PID"
"""Set for the children of ``--processes``: the supervisor's process id."""
_SUPERVISOR_CHECK_S = 1.0

_EXPECTED = ("a Consumer class or instance, a @consumer function, a Pipeline, or a "
             "factory (sync or async) taking the Rheo instance and returning one of "
             "these or a list of them")


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What ``rheo-flow worker`` was asked to run, and how."""

    target: str
    """``MODULE:ATTR``."""
    url: str
    """The backend URL as given (the worker opens it with :func:`~.._common.existing`:
    it creates no store, file or schema)."""
    grace_seconds: float = 30.0
    until_empty: bool = False
    health_file: Path | None = None
    health_port: int | None = None
    health_host: str = "0.0.0.0"
    health_interval: float = 5.0
    retention_interval: float = 60.0
    """Seconds between applications of the consumed streams' retention policies (0: none)."""
    metrics: bool = False
    """Serve ``/metrics`` and ``/metrics/lag`` on the health port."""
    metrics_interval: float = 5.0
    """Seconds a read of the lag report serves scrapes for."""
    metrics_streams: tuple[str, ...] | None = None
    """The streams of the store gauges (``None``: the consumed ones; under ``--processes``
    every stream)."""
    probe_interval: float = 5.0
    """Seconds between readiness probes of the store (0: no probe)."""
    probe_timeout: float = 2.0
    """How long a probe may take before the store counts as unreachable."""

    def observation(self, changed: Callable[[], None], *, runtime: bool) -> Observation:
        """The metrics endpoints and store probe this configuration asks for."""
        probing = self.health_port is not None or self.health_file is not None
        return Observation(existing(self.url), metrics=self.metrics, runtime=runtime,
                           interval=self.metrics_interval, streams=self.metrics_streams,
                           probe_interval=self.probe_interval if probing else 0.0,
                           probe_timeout=self.probe_timeout, changed=changed)


def load_target(spec: str) -> object:
    """Import ``MODULE:ATTR`` (ATTR may be dotted); :class:`InvalidArgument` explains
    what is wrong. The working directory is importable, as with ``python -m``."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name.strip() or not attr.strip():
        raise InvalidArgument(f"expected MODULE:ATTR (e.g. myapp.workers:billing), got {spec!r}")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name
                                     or module_name.startswith(exc.name + ".")):
            raise InvalidArgument(f"cannot import {module_name!r}: no module named "
                                  f"{exc.name!r} (is it on PYTHONPATH?)") from None
        raise InvalidArgument(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise InvalidArgument(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}") from exc
    found: Any = module
    for part in attr.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise InvalidArgument(f"module {module_name!r} has no attribute {attr!r}") from None
    if not _runnable_kind(found) and not callable(found):
        raise InvalidArgument(f"{spec} is a {type(found).__name__}: expected {_EXPECTED}")
    return found


def _runnable_kind(value: object) -> bool:
    return (isinstance(value, Consumer | Group | Pipeline)
            or (isinstance(value, type) and issubclass(value, Consumer)))


async def build_runtimes(target: object, rheo: Rheo, spec: str = "target") -> list[Runtime]:
    """The groups and pipelines ``target`` stands for, on ``rheo`` (not started)."""
    made: Any = target
    if not _runnable_kind(made):
        made = made(rheo) if _takes_argument(made) else made()
        if inspect.isawaitable(made):
            made = await made
    items: list[Any]
    if _runnable_kind(made):
        items = [made]
    elif isinstance(made, Iterable) and not isinstance(made, str | bytes):
        items = list(made)
    else:
        items = [made]
    runtimes: list[Runtime] = []
    for item in items:
        if isinstance(item, type) and issubclass(item, Consumer):
            item = item()
        if isinstance(item, Consumer):
            runtimes.append(item.start(rheo))
        elif isinstance(item, Group | Pipeline):
            runtimes.append(item)
        else:
            raise InvalidArgument(f"{spec} gave a {type(item).__name__}: expected {_EXPECTED}")
    if not runtimes:
        raise InvalidArgument(f"{spec} gave nothing to run: expected {_EXPECTED}")
    return runtimes


def _takes_argument(factory: Any) -> bool:
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in parameters)


def _ready(runtime: Runtime) -> bool:
    return runtime.state is State.RUNNING


async def _ended(runtime: Runtime) -> None:
    """Returns when the runtime stopped on its own (a crash, a lost store)."""
    await runtime._life.done.wait()


class _Signals:
    """The first SIGTERM/SIGINT asks for a drain; the second exits at once."""

    def __init__(self, on_second: Health | None = None) -> None:
        self.stop = asyncio.Event()
        self._health = on_second

    def install(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, self._received, sig)

    def _received(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if not self.stop.is_set():
            log.info("%s received: draining (a second signal exits at once)", name)
            self.stop.set()
            return
        log.warning("second signal (%s): exiting now; unsettled leases are left to expire",
                    name)
        if self._health is not None:
            self._health.remove_file()
        logging.shutdown()
        os._exit(128 + sig)


async def run_worker(config: WorkerConfig, target: object) -> int:
    """Run ``target`` until a signal (or, with ``until_empty``, until the backlog
    seen at the start is settled), drain, and return the exit status: 0 after a
    clean drain, 1 when a runtime ended on its own or the grace period ran out."""
    state = {"draining": False}
    runtimes: list[Runtime] = []
    opened: list[Rheo] = []
    paused = PausedGroups(lambda: opened[0] if opened else None,
                          lambda: [_stream_group(r) for r in runtimes], _poll_s(runtimes))
    retention: asyncio.Task[None] | None = None
    # A meter provider the application configured (its module is loaded by now) keeps
    # rheo_flow's runtime metrics: /metrics then serves the store gauges alone.
    own_metrics = STATE.current_meter_provider() is None
    if config.metrics and not own_metrics:
        log.info("runtime metrics go to the meter provider the application configured; "
                 "/metrics serves the store gauges and process metrics")
    observation = config.observation(lambda: health.changed(), runtime=own_metrics)

    async def notes() -> list[str]:
        return [*await observation.lines(), *await paused.lines()]

    health = Health(
        ready=lambda: (not state["draining"] and bool(runtimes) and all(map(_ready, runtimes))
                       and observation.problem is None),
        live=lambda: True, file=config.health_file, port=config.health_port,
        host=config.health_host, interval=config.health_interval, notes=notes,
        routes=observation.routes(),
    )
    signals = _Signals(health)
    signals.install()
    orphaned = _watch_supervisor(signals.stop)
    await health.start()
    try:
        async with Rheo(existing(config.url)) as rheo:
            opened.append(rheo)
            runtimes.extend(await build_runtimes(target, rheo, config.target))
            _freeze_startup()
            try:
                for runtime in runtimes:
                    await runtime.start()
                log.info("worker running %s", ", ".join(map(describe, runtimes)))
                observation.start(sorted({_stream_group(r)[0] for r in runtimes}), rheo)
                health.changed()
                retention = _start_retention(config, rheo, runtimes, signals.stop)
                ended_on_its_own = await _wait_for_end(config, runtimes, signals.stop)
            finally:
                if retention is not None:
                    retention.cancel()
                state["draining"] = True
                health.changed()
                clean = await drain_runtimes(runtimes, config.grace_seconds)
    finally:
        if orphaned is not None:
            orphaned.cancel()
        await health.close()
        await observation.aclose()
    if ended_on_its_own:
        return 1
    return 0 if clean else 1


def _freeze_startup() -> None:
    """Move what loading the application and opening the store built (its modules, the
    driver's, the runtimes: they live until the process ends) out of the cyclic
    collector's way, as the command line does for its own start-up
    (:func:`rheo_flow._cli._app.main`). Otherwise every full collection while consuming
    walks all of it again: a redis-py client alone is some 35,000 objects, and a ``Group``
    on Redis ran 1.27x as fast once frozen (docs/benchmarks.md). What
    is garbage already is collected first, so that nothing unreachable stays frozen."""
    gc.collect()
    gc.freeze()


def _start_retention(config: WorkerConfig, rheo: Rheo, runtimes: list[Runtime],
                     stop: asyncio.Event) -> asyncio.Task[None] | None:
    """The task applying the consumed streams' retention policies (``None``: turned off)."""
    if config.retention_interval <= 0:
        return None
    streams = sorted({producer_of(r).stream for r in runtimes})
    return asyncio.create_task(
        retention_schedule(rheo, streams, config.retention_interval, config.url, stop),
        name="rheo-worker-retention")


def _watch_supervisor(stop: asyncio.Event) -> asyncio.Task[None] | None:
    """Under ``--processes``, drain when the supervisor is gone (killed with SIGKILL,
    say): a child in a session of its own would otherwise run on unsupervised."""
    expected = os.environ.get(SUPERVISOR_ENV)
    if not expected:
        return None

    async def watch() -> None:
        while True:  # no event tells a process that its parent died: poll
            if os.getppid() != int(expected):
                log.warning("the supervisor process %s is gone: draining", expected)
                stop.set()
                return
            await asyncio.sleep(_SUPERVISOR_CHECK_S)

    return asyncio.create_task(watch(), name="rheo-worker-supervisor-watch")


async def _wait_for_end(config: WorkerConfig, runtimes: list[Runtime],
                        stop: asyncio.Event) -> bool:
    """Wait for the stop signal (or the backlog, with ``until_empty``); True when a
    runtime ended on its own first."""
    async def all_caught_up() -> None:
        if config.until_empty:
            await asyncio.gather(*(_caught_up(r) for r in runtimes))
        else:
            await stop.wait()  # never first: the stop signal is its own awaitable

    signalled, caught_up, *ended = await first_of(
        stop.wait(), all_caught_up(), *(_ended(r) for r in runtimes))
    if _ended_well(caught_up) and not _ended_well(signalled):
        log.info("the backlog seen at the start is settled: draining")
        return False
    if any(_ended_well(runtime_ended) for runtime_ended in ended):
        log.error("a runtime stopped on its own: draining the others and exiting")
        return True
    return False


def _ended_well(future: asyncio.Future[Any]) -> bool:
    return future.done() and not future.cancelled() and future.exception() is None


async def _caught_up(runtime: Runtime) -> None:
    await wait_producer_caught_up(producer_of(runtime), stopped=lambda: False)


def _stream_group(runtime: Runtime) -> tuple[str, str]:
    producer = producer_of(runtime)
    return producer.stream, producer.group


def _poll_s(runtimes: list[Runtime]) -> Callable[[], float]:
    """How often the paused groups may be read: the runtimes' shortest poll interval."""
    def poll() -> float:
        return min((producer_of(r).poll_ms for r in runtimes), default=200) / 1000
    return poll
