"""Running a scenario: processes, the disruption, completion, the final state, the check."""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from dataclasses import replace
from pathlib import Path

import tenacity

from .._model._errors import InvalidArgument
from .._model._query import Query
from .._rheo import Rheo
from ._catalog import scenarios
from ._checker import FinalState, Report, check
from ._history import read_history
from ._outbox import Effects, derived_counts, derived_stream
from ._scenario import (
    Endpoints,
    Progress,
    RunControl,
    RunSettings,
    Scenario,
    WorkerProcess,
    Workload,
    backend_family,
)
from ._worker import WorkerConfig, event_id, is_poison

__all__ = ["STREAM_PREFIX", "run_scenario", "run_torture", "selected_scenarios"]

STREAM_PREFIX = "torture-"
"""Every stream a run creates is named ``torture-<run id>-<scenario>-<workload>``."""

GROUP = "torture"
SHUTDOWN_S = 2.5
"""Time kept at the end of a run to stop the workers and read the final state."""
DISRUPT_GRACE_S = 5.0
"""How long a scenario's ``disrupt`` may go on once the run is over, before it is cancelled."""
FINAL_READ_S = 15.0
"""How long reading the final state is retried while the backend fails."""


def selected_scenarios(url: str, names: Iterable[str] = ()) -> list[Scenario]:
    """The scenarios named (all registered ones when none) that apply to ``url``'s backend.

    Raises :class:`~rheo_flow.InvalidArgument` for an unknown name, for a named
    scenario that does not apply, and for a backend no separate process can share.
    """
    family = backend_family(url)
    if family == "memory":
        raise InvalidArgument("memory:// lives in one process; torture needs a backend that "
                              "worker processes share (sqlite, postgresql, redis, mongodb)")
    catalogue = scenarios()
    wanted = list(names)
    unknown = [n for n in wanted if n not in catalogue]
    if unknown:
        raise InvalidArgument(f"unknown scenario(s) {', '.join(unknown)}; known: "
                              f"{', '.join(sorted(catalogue))}")
    if wanted:
        chosen = [catalogue[n] for n in dict.fromkeys(wanted)]
        refused = [s.name for s in chosen if not s.applies_to(url)]
        if refused:
            raise InvalidArgument(f"scenario(s) {', '.join(refused)} do not apply to {family}")
        return chosen
    return [s for s in catalogue.values() if s.applies_to(url) and s.default]


async def run_torture(
    url: str,
    chosen: Iterable[Scenario],
    settings: RunSettings,
    *,
    workloads: Iterable[Workload] | None = None,
    work_dir: str | Path | None = None,
    total_s: float | None = None,
) -> AsyncIterator[Report]:
    """Run each scenario over each of its workloads, one after the other; yield the reports.

    Each run is paced for ``settings.seconds``. With ``total_s`` (at least
    ``settings.seconds`` per run), a run may go on until only ``settings.seconds``
    per run still to come is left, so that all of them end within ``total_s``
    while a slow run can use the time quicker ones left. ``work_dir`` keeps every
    run's histories (see :func:`run_scenario`).
    """
    wanted = None if workloads is None else set(workloads)
    runs = [(s, w) for s in chosen for w in s.workloads if wanted is None or w in wanted]
    end = None if total_s is None else time.monotonic() + total_s
    for i, (scenario, workload) in enumerate(runs):
        bound = None
        if end is not None:
            later = (len(runs) - i - 1) * settings.seconds
            bound = max(settings.seconds, end - time.monotonic() - later)
        yield await run_scenario(url, scenario, workload, settings, work_dir=work_dir,
                                 bound_s=bound)


async def run_scenario(
    url: str,
    scenario: Scenario,
    workload: Workload = "group",
    settings: RunSettings | None = None,
    *,
    work_dir: str | Path | None = None,
    bound_s: float | None = None,
) -> Report:
    """Run ``scenario`` over ``workload`` against ``url`` and check what happened.

    Creates a fresh stream (``torture-<run id>-<scenario>-<workload>``, left in
    place afterwards) and group, starts one producer and ``settings.workers``
    worker processes, runs ``scenario.disrupt`` meanwhile, waits until every event
    is settled or the run's bound passes, stops the processes and returns the
    checker's :class:`Report`. The run ends within ``bound_s`` seconds (default
    ``settings.seconds``). The histories go to ``work_dir`` (kept) or to a
    temporary directory (removed).
    """
    settings = scenario.tune(settings or RunSettings())
    started = time.monotonic()
    run_id = uuid.uuid4().hex[:8]
    stream = f"{STREAM_PREFIX}{run_id}-{scenario.name}-{workload}"[:128]
    with contextlib.ExitStack() as stack:
        if work_dir is None:
            base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rheo-torture-")))
        else:
            base = Path(work_dir) / stream
        dirs = {name: base / name for name in ("history", "ready", "logs")}
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        async with scenario.endpoints(url) as endpoints:
            bound = settings.seconds if bound_s is None else bound_s
            return await _run(scenario, workload, settings, endpoints, stream, dirs,
                              started + bound - SHUTDOWN_S, backend_family(url))
    raise AssertionError("unreachable")  # pragma: no cover - for mypy


async def _run(scenario: Scenario, workload: Workload, settings: RunSettings,
               endpoints: Endpoints, stream: str, dirs: dict[str, Path], deadline: float,
               family: str) -> Report:
    started = time.monotonic()
    prefix = stream.removeprefix(STREAM_PREFIX)
    workers, producer = _processes(workload, settings, endpoints, stream, prefix, dirs,
                                   lifetime_s=deadline - time.monotonic() + SHUTDOWN_S + 30)
    poison = [event_id(prefix, n) for n in range(settings.events)
              if is_poison(n, settings.poison_every)]
    error: str | None = None
    control: RunControl | None = None
    async with Rheo(endpoints.check_url) as rheo:
        await rheo.create_stream(stream, partitions=settings.partitions)
        await rheo.create_group(stream, GROUP, max_attempts=settings.max_attempts)
        effects = None
        if settings.outbox:
            await rheo.create_stream(derived_stream(stream))
            effects = Effects(endpoints.check_url, rheo)
            await effects.create()

        async def progress() -> Progress:
            high = await rheo.high_water(stream)
            frontier = await rheo.frontier(stream, GROUP)
            return Progress(sum(high.values()), sum(min(frontier.get(p, 0), h)
                                                    for p, h in high.items()), settings.events)

        try:
            await asyncio.gather(*(w.start() for w in workers))
            if not await _wait_ready(dirs["ready"], len(workers), workers,
                                     deadline):
                raise _RunFailed("the workers did not start in time" + _logs(dirs["logs"]))
            await producer.start()
            control = RunControl(scenario, workload, settings, endpoints, workers, [producer],
                                 progress, deadline)
            disrupt = asyncio.create_task(_disrupt(scenario, control))
            try:
                error = await _until_settled(control, producer, deadline)
            finally:
                control.finished.set()
                grace = min(DISRUPT_GRACE_S, deadline + SHUTDOWN_S / 2 - time.monotonic())
                await _finish(disrupt, max(0.5, grace))
                if disrupt.done() and not disrupt.cancelled() and disrupt.exception():
                    exc = disrupt.exception()
                    error = error or f"the scenario failed: {type(exc).__name__}: {exc}"
        except _RunFailed as exc:
            error = str(exc)
        finally:
            await _stop_all([producer, *workers])
        final = await _final_state_retrying(rheo, stream, effects)
    history = read_history(dirs["history"])
    report = check(history, final, scenario=scenario.name, workload=workload, backend=family,
                   poison=poison, elapsed_s=time.monotonic() - started, error=error)
    notes = [] if control is None else list(control.notes)
    notes += _crashes([producer, *workers], dirs["logs"])
    return replace(report, notes=tuple(notes), stream=stream)


def _processes(workload: Workload, settings: RunSettings, endpoints: Endpoints, stream: str,
               prefix: str, dirs: dict[str, Path], *, lifetime_s: float
               ) -> tuple[list[WorkerProcess], WorkerProcess]:
    """The run's worker processes and its producer process (not started)."""
    base = WorkerConfig(
        role=workload, name="w", url=endpoints.workload_url, stream=stream, group=GROUP,
        history_dir=str(dirs["history"]), ready_dir=str(dirs["ready"]),
        lease_ms=settings.lease_ms, max_attempts=settings.max_attempts,
        concurrency=settings.concurrency, work_ms=settings.handler_ms,
        poison_every=settings.poison_every, lifetime_s=lifetime_s, outbox=settings.outbox)
    workers = [WorkerProcess(replace(base, name=f"w{i}"), dirs["logs"])
               for i in range(settings.workers)]
    producer = WorkerProcess(replace(
        base, role="producer", name="p0", events=settings.events, batch=settings.batch,
        rate=settings.events / settings.produce_s, lose_every=settings.lose_every,
        id_prefix=prefix), dirs["logs"])
    return workers, producer


class _RunFailed(Exception):
    """The run could not proceed (its reason becomes the report's error)."""


async def _disrupt(scenario: Scenario, control: RunControl) -> None:
    await scenario.disrupt(control)


async def _wait_ready(ready: Path, count: int, workers: list[WorkerProcess],
                      deadline: float) -> bool:
    while time.monotonic() < deadline:
        if len(os.listdir(ready)) >= count:
            return True
        if any(not w.alive for w in workers):
            return False
        await asyncio.sleep(0.05)
    return False


async def _until_settled(control: RunControl, producer: WorkerProcess,
                         deadline: float) -> str | None:
    """Wait until the producer is done and the group settled everything, or the deadline."""
    while time.monotonic() < deadline:
        if not producer.alive and producer.returncode not in (0, None) and not _was_killed(
                producer):
            return f"the producer exited with status {producer.returncode}"
        if not producer.alive:
            with contextlib.suppress(Exception):  # a disrupted backend: ask again
                p = await control.progress()
                if p.appended >= p.target and p.settled >= p.appended:
                    return None
        await asyncio.sleep(0.1)
    return None  # what is not settled is reported unfinished


def _was_killed(process: WorkerProcess) -> bool:
    return (process.returncode or 0) < 0


async def _finish(task: asyncio.Task[None], grace: float) -> None:
    """Let the disruption end by itself for ``grace`` seconds, then cancel it."""
    done, _ = await asyncio.wait([task], timeout=grace)
    if not done:
        task.cancel()
        await asyncio.wait([task])


async def _stop_all(processes: list[WorkerProcess]) -> None:
    for p in processes:
        p.terminate()
    results = await asyncio.gather(*(p.wait(SHUTDOWN_S / 2) for p in processes))
    for p, code in zip(processes, results, strict=True):
        if code is None and p.alive:
            p.kill()
            await p.wait()


async def _final_state_retrying(rheo: Rheo, stream: str, effects: Effects | None
                                ) -> FinalState:
    """The final state, asked again for a while should the backend still be coming back
    (a scenario may have restarted the server or cut the connections)."""
    async for attempt in tenacity.AsyncRetrying(
        stop=tenacity.stop_after_delay(FINAL_READ_S), wait=tenacity.wait_fixed(0.25),
        retry=tenacity.retry_if_not_exception_type(InvalidArgument), reraise=True,
    ):
        with attempt:
            final = await _final_state(rheo, stream)
            if effects is None:
                return final
            return replace(final, effects=await effects.counts(stream),
                           derived=await derived_counts(rheo, stream))
    raise AssertionError("unreachable")  # pragma: no cover - for mypy


async def _final_state(rheo: Rheo, stream: str) -> FinalState:
    high = await rheo.high_water(stream)
    frontier = await rheo.frontier(stream, GROUP)
    letters: dict[str, int] = {}
    after = None
    while True:
        page = await rheo.dead_letters(stream, GROUP, limit=500, after=after)
        letters.update((d.event_id, d.attempts) for d in page)
        if len(page) < 500:
            break
        after = page[-1]
    stored: dict[str, tuple[tuple[int, int], ...]] = {}
    async for e in rheo.stream_query(Query(stream=stream), page_size=1000):
        stored[e.id] = (*stored.get(e.id, ()), (e.partition, e.sequence))
    return FinalState(high, frontier, letters, stored)


def _crashes(processes: list[WorkerProcess], logs: Path) -> list[str]:
    """Notes on processes that ended with an error of their own (not a signal)."""
    notes = []
    for p in processes:
        if p.returncode not in (None, 0) and not _was_killed(p):
            notes.append(f"{p.name} exited with status {p.returncode}"
                         + _logs(logs, p.name))
    return notes


def _logs(logs: Path, name: str = "") -> str:
    """The last lines of the processes' logs (for errors)."""
    tails = []
    for path in sorted(logs.glob(f"{name}*.log")):
        lines = path.read_text(errors="replace").strip().splitlines()[-3:]
        if lines:
            tails.append(f"{path.stem}: " + " | ".join(lines))
    return ("; " + "; ".join(tails))[:1500] if tails else ""
