"""One process of a fault-injection run: a producer, a Group worker or a Pipeline worker.

Run as ``python -m rheo_flow._faults._worker CONFIG_JSON`` by the runner. It
records everything it does in its own history file (see ``_history``), marks
itself ready by creating a file named after it in the ready directory, and ends
on SIGTERM (a graceful stop) or when killed. A producer ends once every event
is appended.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import orjson

from .._model._errors import BackendUnavailable, RheoError
from .._model._event import Event, NewEvent
from .._model._lease import Lease
from .._model._outcome import ACK, SETTLED, Outcome, current_lease
from .._model._settle_results import SettleKind, classify
from .._rheo import Rheo
from .._runtime._group import Group, consumer
from .._runtime._retry_policy import RetryPolicy
from .._runtime._settle_calls import SettleObserver, SettleOutcome, per_outcome
from ._history import Recorder
from ._history import SettleOp as RecordedOp
from ._outbox import HOLD_MS, Effects, derived_stream, settle_in_transaction

__all__ = ["WorkerConfig", "event_id", "is_poison", "main"]

Role = Literal["producer", "group", "pipeline"]

STOP_GRACE_S = 10.0
"""How long a stopping process may take before it exits outright."""
RETRY_POLICY = RetryPolicy(base_ms=20, cap_ms=200)
"""Poison events back off as in production, on a scale that fits a scenario's bound."""
EXIT_HUNG = 70


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """What one process does (passed to it as JSON)."""

    role: Role
    name: str
    url: str
    stream: str
    group: str
    history_dir: str
    ready_dir: str
    lease_ms: int = 2_000
    max_attempts: int = 4
    concurrency: int = 4
    work_ms: int = 2
    """Upper bound of the random time a handler takes (keeps leases in flight)."""
    poison_every: int = 0
    """Every n-th event is poison: its handler always raises (0: none)."""
    events: int = 0
    batch: int = 20
    rate: float = 0.0
    """Events per second a producer appends (0: as fast as it can)."""
    lose_every: int = 0
    """A producer treats every n-th append's answer as lost and retries it (0: never)."""
    id_prefix: str = "e"
    lifetime_s: float = 600.0
    """The process ends by itself after this long, or when its parent is gone."""
    outbox: bool = False
    """Handlers ack in a transaction with their effect row and derived event (the
    ``outbox`` scenario, :mod:`._outbox`)."""

    def to_json(self) -> str:
        """The config as one JSON argument."""
        return orjson.dumps(asdict(self)).decode()


def event_id(prefix: str, n: int) -> str:
    """The id of the ``n``-th event of a run."""
    return f"{prefix}-{n:07d}"


def is_poison(n: int, poison_every: int) -> bool:
    """Whether the ``n``-th event's handler always fails."""
    return poison_every > 0 and n % poison_every == poison_every - 1


class Poison(Exception):
    """Raised by the handler of a poison event."""


async def produce(cfg: WorkerConfig, rheo: Rheo, recorder: Recorder,
                  stop: asyncio.Event) -> None:
    """Append ``cfg.events`` uniquely numbered events, recording every call's outcome.

    A call that fails or ends ambiguously is retried with the same ids (appends
    are idempotent by id) until it is acknowledged, or ``stop`` is set.
    """
    loop = asyncio.get_running_loop()
    started = loop.time()
    calls = 0
    for first in range(0, cfg.events, cfg.batch):
        numbers = range(first, min(first + cfg.batch, cfg.events))
        events = [NewEvent("torture", {"n": n, "poison": is_poison(n, cfg.poison_every)},
                           id=event_id(cfg.id_prefix, n), key=f"k{n % 97}") for n in numbers]
        ids = [e.id or "" for e in events]
        if cfg.rate > 0:
            await asyncio.sleep(max(0.0, started + first / cfg.rate - loop.time()))
        delay = 0.02
        while True:
            if stop.is_set():
                return
            calls += 1
            recorder.append_intent(ids)
            try:
                stored = await rheo.append(cfg.stream, events)
            except BackendUnavailable as exc:
                # The library's contract: the backend was not reached, nothing was written.
                recorder.append_result(ids, "failed", error=_describe(exc))
            except Exception as exc:
                recorder.append_result(ids, "ambiguous", error=_describe(exc))
            else:
                if cfg.lose_every and calls % cfg.lose_every == 0:
                    recorder.append_result(ids, "ambiguous", error="answer dropped by the test")
                    continue  # as if the answer never came: send the same ids again
                recorder.append_result(ids, "ok", [(e.partition, e.sequence) for e in stored])
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


def _observer(recorder: Recorder) -> SettleObserver:
    """Records each settle's answer (the runtime calls it after every settle call)."""

    def observe(outcome: SettleOutcome) -> None:
        lease, result = outcome.lease, outcome.result
        recorder.settle_result(lease.event.id, outcome.op, lease.lease_id, lease.attempt,
                               "ok" if result.error is None else result.error.kind.value,
                               result.repeated)

    return observe


def _delivered(recorder: Recorder, lease: Lease) -> None:
    recorder.delivery(lease.event.id, lease.partition, lease.sequence, lease.attempt,
                      lease.lease_id)


async def _work(cfg: WorkerConfig, lease: Lease, recorder: Recorder) -> None:
    """The handler's body: take a little time, fail for poison; record the settle intent."""
    if cfg.work_ms:
        await asyncio.sleep(random.random() * cfg.work_ms / 1000)
    data: Any = lease.event.data
    op: RecordedOp = "nack" if isinstance(data, dict) and data.get("poison") else "ack"
    recorder.settle_intent(lease.event.id, op, lease.lease_id, lease.attempt)
    if op == "nack":
        raise Poison(f"poison event {lease.event.id}")


async def _effects(cfg: WorkerConfig, rheo: Rheo) -> Effects | None:
    """The outbox scenario's application table (``None`` in other scenarios)."""
    if not cfg.outbox:
        return None
    # The derived stream's partition count, read now: read inside an application's
    # SQLite transaction, it would wait behind the backend's writes, which wait for it.
    await rheo.stream_info(derived_stream(cfg.stream))
    return Effects(cfg.url, rheo)


async def consume_group(cfg: WorkerConfig, rheo: Rheo, recorder: Recorder,
                        stop: asyncio.Event) -> None:
    """Run a :class:`~rheo_flow.Group` until ``stop`` is set."""
    effects = await _effects(cfg, rheo)

    @consumer(stream=cfg.stream, group=cfg.group, concurrency=cfg.concurrency,
              max_demand=cfg.concurrency * 4, fetch_size=cfg.concurrency * 2,
              lease_ms=cfg.lease_ms, poll_ms=50, max_attempts=cfg.max_attempts,
              consumer_id=cfg.name, retry_policy=RETRY_POLICY)
    async def handle(event: Event, context: Any) -> Outcome:
        lease = current_lease()
        _delivered(recorder, lease)
        await _work(cfg, lease, recorder)
        if effects is None:
            return ACK
        await settle_in_transaction(rheo, effects, cfg.stream, [lease], recorder,
                                    min(cfg.work_ms, HOLD_MS))
        return SETTLED

    async with Group(rheo, handle, observer=_observer(recorder)):
        _ready(cfg)
        await stop.wait()


async def consume_pipeline(cfg: WorkerConfig, rheo: Rheo, recorder: Recorder,
                           stop: asyncio.Event) -> None:
    """Run a :class:`~rheo_flow.pipeline.Pipeline` (processors and a batcher) until ``stop``."""
    from ..pipeline import Batcher, Message, Pipeline, Processors, confirm_settled

    effects = await _effects(cfg, rheo)

    class Handler:
        async def handle_message(self, processor: str, message: Message,
                                 context: Any) -> Message:
            _delivered(recorder, message.lease)
            await _work(cfg, message.lease, recorder)
            return message

        async def handle_batch(self, batcher: str, messages: list[Message], info: Any,
                               context: Any) -> list[Message]:
            if effects is None:
                return messages
            ok = [m for m in messages if m.status == "ok"]
            await settle_in_transaction(rheo, effects, cfg.stream, [m.lease for m in ok],
                                        recorder, min(cfg.work_ms, HOLD_MS))
            confirm_settled(ok)
            return messages

    pipeline = Pipeline(
        rheo, stream=cfg.stream, group=cfg.group, handler=Handler(),
        processors=Processors(concurrency=cfg.concurrency, max_demand=4),
        batchers={"default": Batcher(batch_size=10, batch_timeout=0.05)},
        lease_ms=cfg.lease_ms, poll_ms=50, consumer_id=cfg.name,
        max_attempts=cfg.max_attempts, shutdown_timeout=5.0, retry_policy=RETRY_POLICY,
    )
    pipeline.producer._observer = per_outcome(_observer(recorder))
    await pipeline.start()
    try:
        _ready(cfg)
        await stop.wait()
    finally:
        await pipeline.stop()


def _ready(cfg: WorkerConfig) -> None:
    (Path(cfg.ready_dir) / cfg.name).touch()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RheoError):
        return f"{type(exc).__name__}: {exc}"[:300]
    kind = classify(exc).kind if isinstance(exc, Exception) else SettleKind.FAILED
    return f"{kind.value}: {type(exc).__name__}"


async def run(cfg: WorkerConfig) -> None:
    """Run one process's part of the workload."""
    # Unique per process even should a pid come back within a run.
    path = Path(cfg.history_dir) / f"{cfg.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
    recorder = Recorder(path, cfg.name)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    watchdog = asyncio.create_task(_watchdog(stop, cfg.lifetime_s))
    try:
        async with Rheo(cfg.url) as rheo:
            if cfg.role == "producer":
                _ready(cfg)
                await produce(cfg, rheo, recorder, stop)
            elif cfg.role == "group":
                await consume_group(cfg, rheo, recorder, stop)
            else:
                await consume_pipeline(cfg, rheo, recorder, stop)
    finally:
        watchdog.cancel()
        recorder.close()


async def _watchdog(stop: asyncio.Event, lifetime_s: float) -> None:
    """Stop when the run's process is gone (killed itself) or the lifetime is over;
    exit outright should stopping hang."""
    parent = os.getppid()
    loop = asyncio.get_running_loop()
    end = loop.time() + lifetime_s
    while os.getppid() == parent and loop.time() < end:
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
            break
        except TimeoutError:
            continue
    stop.set()
    await asyncio.sleep(STOP_GRACE_S)
    os._exit(EXIT_HUNG)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point: ``python -m rheo_flow._faults._worker CONFIG_JSON``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        raise SystemExit("usage: python -m rheo_flow._faults._worker CONFIG_JSON")
    cfg = WorkerConfig(**orjson.loads(args[0]))
    asyncio.run(run(cfg))


if __name__ == "__main__":
    main()
