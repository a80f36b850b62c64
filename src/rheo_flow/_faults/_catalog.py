"""The catalogue of scenarios: the built-in, worker-level ones, and :func:`scenarios`.

Scenarios that fault the backend server or the network register themselves in
modules imported here too, so every module that reads the catalogue (through
:func:`scenarios`) finds the built-in scenarios registered.
"""

from __future__ import annotations

from dataclasses import replace

from ._scenario import _REGISTRY, RunControl, RunSettings, Scenario, register

__all__ = ["AMBIGUOUS_APPEND", "BASELINE", "KILL_RESTART", "OUTBOX", "POISON", "STOP_CONT",
           "scenarios"]


def scenarios() -> dict[str, Scenario]:
    """Every registered scenario, by name (the built-in ones included)."""
    return dict(_REGISTRY)


async def _kill_and_restart(run: RunControl) -> None:
    """kill -9 a worker at 20% and another at 55% settled, restarting each at once."""
    for i, fraction in enumerate((0.2, 0.55)):
        if not await run.wait_progress(fraction):
            return
        worker = run.workers[i % len(run.workers)]
        worker.kill()
        await worker.wait()
        run.note(f"kill -9 {worker.name}")
        await worker.restart()
        run.note(f"restarted {worker.name}")


async def _stop_past_lease(run: RunControl) -> None:
    """SIGSTOP a worker holding leases until they expired, then SIGCONT it."""
    if not await run.wait_progress(0.25):
        return
    worker = run.workers[0]
    worker.stop()
    run.note(f"SIGSTOP {worker.name}")
    lease_s = run.settings.lease_ms / 1000
    await run.sleep(max(1.5 * lease_s, lease_s + 0.5))
    worker.cont()
    run.note(f"SIGCONT {worker.name}")


async def _kill_producer(run: RunControl) -> None:
    """kill -9 the producer mid-append; its restart appends every id again from the first."""
    producer = run.producers[0]
    while producer.alive and (await run.progress()).appended < run.settings.events // 3:
        await run.sleep(0.02)
    if not producer.alive:
        return
    producer.kill()
    await producer.wait()
    run.note(f"kill -9 {producer.name}")
    await producer.restart(replace(producer.config, rate=0))
    run.note(f"restarted {producer.name}: every id again, at full speed")


def _poison(settings: RunSettings) -> RunSettings:
    return replace(settings, poison_every=50)


def _lose_answers(settings: RunSettings) -> RunSettings:
    return replace(settings, lose_every=3)


def _outbox(settings: RunSettings) -> RunSettings:
    return replace(settings, outbox=True, poison_every=50)


async def _kill_mid_transaction(run: RunControl) -> None:
    """kill -9 the workers in turn, four times, while their handlers' transactions run
    (each holds one from before its write to its commit), restarting each at once."""
    for i, fraction in enumerate((0.15, 0.35, 0.55, 0.75)):
        if not await run.wait_progress(fraction):
            return
        worker = run.workers[i % len(run.workers)]
        worker.kill()
        await worker.wait()
        run.note(f"kill -9 {worker.name}")
        await worker.restart()
        run.note(f"restarted {worker.name}")


BASELINE = register(Scenario(
    "baseline", "no fault: the workload alone (a control run)", default=False))
KILL_RESTART = register(Scenario(
    "kill-restart", "kill -9 a worker mid-run and restart it (twice)", _kill_and_restart))
STOP_CONT = register(Scenario(
    "stop-cont", "SIGSTOP a worker past its lease, then SIGCONT: its late settles must be stale",
    _stop_past_lease))
POISON = register(Scenario(
    "poison", "every 50th event's handler always raises: dead-lettered at max_attempts",
    tune=_poison))
AMBIGUOUS_APPEND = register(Scenario(
    "ambiguous-append", "every 3rd append's answer is dropped and the producer is killed "
    "mid-run: appends are retried with the same ids", _kill_producer, tune=_lose_answers))

OUTBOX = register(Scenario(
    "outbox", "handlers ack in the application's transaction with a row and a derived "
    "event (Rheo.transaction); workers are killed -9 mid-transaction: each effect exactly "
    "once", _kill_mid_transaction, backends=frozenset({"sqlite", "postgres"}),
    tune=_outbox))

# Server, network and cluster faults (PostgreSQL, Redis, Redis Cluster) register
# themselves on import.
from . import _cluster_faults, _network_faults, _server_faults  # noqa: E402, F401
