"""Scenarios that break the network between the workload and the server (PostgreSQL, Redis).

Their endpoints put a :class:`~._proxy.FaultProxy` in front of the run's server:
producers and workers connect through it, the checker connects directly. The
faults land on whatever is in flight at that moment: fetches, settles, renewals
and appends alike (the report's ambiguous counts show the appends and settles
hit).

* ``net-drop`` — from 10% settled until 85%, every 0.2-0.6 s, either reset
  every open connection or swallow the server's next answer (the request took
  effect; the client never hears of it).
* ``net-blackhole`` — hold every connection for twice the lease, then reset
  them; later hold half of the open connections for twice the lease and let
  their bytes through afterwards (renewals and settles sent on a held
  connection arrive after the lease ran out, while the same worker's other
  connections fetched again: they must be refused as stale).
* ``net-delay`` — delay every chunk by a quarter of the lease for 2 s, then by
  three quarters of it for 1 s (round trips longer than the lease: renewals
  come too late, leases expire under running handlers), twice.

SQLite and the in-memory backend have no network: these scenarios do not apply.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator
from typing import Final

from ._proxy import FaultProxy
from ._scenario import Endpoints, RunControl, Scenario, register

__all__ = ["NET_BLACKHOLE", "NET_DELAY", "NET_DROP", "proxy_endpoints", "proxy_of"]

_NETWORK_BACKENDS: Final = frozenset({"postgres", "redis"})

_runs: dict[str, FaultProxy] = {}
"""The proxy of each running scenario, by the URL its workload uses."""


def proxy_of(run: RunControl) -> FaultProxy:
    """The proxy between ``run``'s workload and its server (the endpoints registered it)."""
    try:
        return _runs[run.url]
    except KeyError:
        raise RuntimeError("this run has no proxy: the scenario must use "
                           "proxy_endpoints") from None


@contextlib.asynccontextmanager
async def proxy_endpoints(url: str) -> AsyncIterator[Endpoints]:
    """Endpoints through a fresh proxy to ``url``'s server; the checker reads ``url`` itself."""
    async with FaultProxy.for_url(url) as proxy:
        workload_url = proxy.url(url)
        _runs[workload_url] = proxy
        try:
            yield Endpoints(workload_url, url)
        finally:
            _runs.pop(workload_url, None)


def _note_stats(run: RunControl, proxy: FaultProxy) -> None:
    s = proxy.stats
    run.note(f"proxy: {s.accepted} connections, {s.dropped} reset, "
             f"{s.replies_lost} answers lost")


async def _drops(run: RunControl) -> None:
    """Reset every connection or lose the next answer, every 0.2-0.6 s, from 10% to 85%."""
    proxy = proxy_of(run)
    if not await run.wait_progress(0.1):
        return
    run.note("dropping connections and answers")
    try:
        turn = 0
        while not run.finished.is_set() and run.remaining() > 0:
            p = await _progress(run)
            if p is not None and p >= 0.85:
                break
            if turn % 2:
                proxy.lose_replies(1)
            else:
                proxy.drop()
            turn += 1
            await run.sleep(random.uniform(0.2, 0.6))  # the faults' pace
    finally:
        proxy.pass_traffic()
        _note_stats(run, proxy)


async def _blackholes(run: RunControl) -> None:
    """Cut every connection off for two leases then reset them; later, half of them, healed."""
    proxy = proxy_of(run)
    hold_s = 2 * run.settings.lease_ms / 1000
    try:
        if not await run.wait_progress(0.25):
            return
        run.note(f"blackhole every connection for {hold_s:.1f} s, then reset")
        await proxy.blackhole(hold_s, then="drop")
        if not await run.wait_progress(0.55):
            return
        run.note(f"blackhole half the connections for {hold_s:.1f} s, then resume")
        await proxy.blackhole(hold_s, then="resume", share=0.5)
    finally:
        proxy.pass_traffic()
        _note_stats(run, proxy)


async def _delays(run: RunControl) -> None:
    """Slow every chunk by lease/4 for 2 s then by 3*lease/4 for 1 s, at 20% and 60%."""
    proxy = proxy_of(run)
    lease_s = run.settings.lease_ms / 1000
    try:
        for fraction in (0.2, 0.6):
            if not await run.wait_progress(fraction):
                return
            for delay, period in ((lease_s / 4, 2.0), (3 * lease_s / 4, 1.0)):
                proxy.set_delay(delay)
                run.note(f"delay {delay * 1000:.0f} ms per chunk for {period:.0f} s")
                await run.sleep(period)  # the slow period itself
            proxy.set_delay(0)
    finally:
        proxy.pass_traffic()
        _note_stats(run, proxy)


async def _progress(run: RunControl) -> float | None:
    """The settled fraction, or None when the checker cannot read it now."""
    try:
        p = await run.progress()
    except Exception:  # the server may be unreachable for a moment: ask again later
        return None
    return p.settled / max(1, p.target)


NET_DROP = register(Scenario(
    "net-drop",
    "through a proxy: reset every connection or lose the server's next answer, every "
    "0.2-0.6 s, from 10% to 85% settled",
    _drops, backends=_NETWORK_BACKENDS, endpoints=proxy_endpoints))
NET_BLACKHOLE = register(Scenario(
    "net-blackhole",
    "through a proxy: hold every connection for two leases then reset them; later hold "
    "half of them for two leases and let their late bytes through",
    _blackholes, backends=_NETWORK_BACKENDS, endpoints=proxy_endpoints))
NET_DELAY = register(Scenario(
    "net-delay",
    "through a proxy: delay every chunk by lease/4 for 2 s, then by 3*lease/4 for 1 s "
    "(twice)",
    _delays, backends=_NETWORK_BACKENDS, endpoints=proxy_endpoints))
