"""``rheo-flow worker --processes N``: a supervisor running N worker processes.

Each child is ``rheo-flow worker`` with the same target (see
:mod:`rheo_flow._cli.worker._run`), in a session of its own, with the supervisor's
process id in its environment so that it drains should the supervisor vanish.
The supervisor passes signals on, reports health for all of them, and stops
the others when one exits on its own. Its health port also serves the store's
``/metrics`` and ``/metrics/lag`` (the store gauges only, every stream unless
``--metrics-streams`` says otherwise): the children's own instruments are not on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
from pathlib import Path

from ._health import Health
from ._run import SIGNALS, SUPERVISOR_ENV, WorkerConfig

__all__ = ["supervise"]

log = logging.getLogger("rheo_flow.worker")


async def supervise(config: WorkerConfig, processes: int, child_argv: list[str]) -> int:
    """Run ``processes`` worker processes (``child_argv`` each) and pass signals on.

    The first signal is forwarded (each child drains); a second one too (each
    exits at once) and the supervisor exits with 128 + the signal. Health is
    ready while every child reports ready; a child that exits on its own stops
    the others. Returns the status of the child that exited on its own, if one did;
    else the worst child status.
    """
    from ..._rheo import Rheo
    from .._common import existing

    async with Rheo(existing(config.url)):
        pass  # a missing store or an unreachable server: said once, before any child runs
    with tempfile.TemporaryDirectory(prefix="rheo-worker-") as tmp:
        children = _Children(config, [Path(tmp) / f"child-{i}" for i in range(processes)])
        loop = asyncio.get_running_loop()
        for sig in SIGNALS:
            loop.add_signal_handler(sig, children.forward, sig)
        await children.spawn(child_argv)
        await children.health.start()
        children.observation.start(config.metrics_streams)
        try:
            codes = await children.wait()
        finally:
            await children.health.close()
            await children.observation.aclose()
    # A child that exited on its own is why the others were stopped: its status is the
    # run's (the others' may say only that the forwarded SIGTERM found them starting).
    return children.cause if children.cause is not None else max(codes)


class _Children:
    """The child processes of a supervisor, their joint health, and the stop signal."""

    def __init__(self, config: WorkerConfig, health_files: list[Path]) -> None:
        self._config = config
        self._files = health_files
        """One health file per child, which the child touches while it is ready."""
        self._processes: list[asyncio.subprocess.Process] = []
        self._stop = asyncio.Event()
        self.cause: int | None = None
        """The status of the first child that exited on its own (it stopped the others)."""
        self.observation = config.observation(lambda: self.health.changed(), runtime=False)
        """The store gauges and the store probe of the supervisor."""
        self.health = Health(ready=self._all_ready, live=self._all_alive,
                             file=config.health_file, port=config.health_port,
                             host=config.health_host, interval=config.health_interval,
                             notes=self.observation.lines, routes=self.observation.routes())
        """The supervisor's health: live while every child runs, ready while each is."""

    def _all_alive(self) -> bool:
        return bool(self._processes) and all(c.returncode is None for c in self._processes)

    def _all_ready(self) -> bool:
        return self._all_alive() and not self._stop.is_set() and (
            self.observation.problem is None) and all(
            Health.fresh(f, self._config.health_interval) for f in self._files)

    async def spawn(self, child_argv: list[str]) -> None:
        """Start one child per health file."""
        env = {**os.environ, "RHEO_URL": self._config.url, SUPERVISOR_ENV: str(os.getpid())}
        for path in self._files:
            # A session of its own: a terminal's Ctrl-C reaches the supervisor only,
            # which forwards it once (not twice, which would mean "exit now").
            self._processes.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "rheo_flow", "worker", *child_argv,
                "--health-file", str(path), env=env, start_new_session=True))

    def forward(self, sig: int) -> None:
        """Pass ``sig`` on to every child still running; at the second, exit at once."""
        second = self._stop.is_set()
        self._stop.set()
        for child in self._processes:
            if child.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(sig)
        if second:
            log.warning("second signal: children told to exit now")
            self.health.remove_file()
            logging.shutdown()
            os._exit(128 + sig)

    async def wait(self) -> list[int]:
        """Wait until every child exited (stopping the others when one exits on its
        own); their statuses, a child killed by signal N as 128 + N, as a shell says."""
        waits = [asyncio.ensure_future(c.wait()) for c in self._processes]
        pending = set(waits)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            finished = self._config.until_empty and all(t.result() == 0 for t in done)
            if not self._stop.is_set() and not finished:
                log.error("a worker process exited on its own: stopping the others")
                self.cause = max(_status(t.result()) for t in done)
                self.forward(signal.SIGTERM)
        return [_status(c.returncode) for c in self._processes]


def _status(returncode: int | None) -> int:
    """A child's exit status as a shell gives it: killed by signal N is 128 + N."""
    if returncode is not None and returncode < 0:
        return 128 - returncode
    return returncode or 0
