"""Scenarios that break the network between the workload and the server (PostgreSQL, Redis).

Their endpoints put a :class:`~._proxy.FaultProxy` in front of the run's server:
producers and workers connect through it, the checker connects directly. The
faults land on whatever is in flight at that moment: fetches, settles, renewals
and appends alike (the report's ambiguous counts show the appends and settles
hit).

* ``net-drop`` — from 10% settled until 85%, every 0.2-0.6 s, either reset
  every open connection or swallow the server's next answer (the request took
  effect; the client never hears of it).
* ``net-blackhole`` — from 20% settled until 80%: hold every connection for
  twice the lease, then reset them; later hold half of the open connections for
  twice the lease and let their bytes through afterwards (renewals and settles
  sent on a held connection arrive after the lease ran out, while the same
  worker's other connections fetched again: they must be refused as stale).
* ``net-delay`` — from 20% settled until 80%: delay every chunk by a quarter of
  the lease for 1.5 s, then by three quarters of it for 1 s (round trips longer
  than the lease: renewals come too late, leases expire under running
  handlers), then pass traffic for 2 s.

SQLite and the in-memory backend have no network: these scenarios do not apply.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import AsyncIterator

from ._proxy import FaultProxy
from ._run_objects import NETWORKED, RunObjects
from ._scenario import Endpoints, RunControl, Scenario, register

__all__ = ["NET_BLACKHOLE", "NET_DELAY", "NET_DROP", "proxy_endpoints", "proxy_of"]

_proxies: RunObjects[FaultProxy] = RunObjects("proxy", "proxy_endpoints")


def proxy_of(run: RunControl) -> FaultProxy:
    """The proxy between ``run``'s workload and its server (the endpoints registered it)."""
    return _proxies.of(run)


@contextlib.asynccontextmanager
async def proxy_endpoints(url: str) -> AsyncIterator[Endpoints]:
    """Endpoints through a fresh proxy to ``url``'s server; the checker reads ``url`` itself."""
    async with FaultProxy.for_url(url) as proxy:
        workload_url = proxy.url(url)
        with _proxies.registered(workload_url, proxy):
            yield Endpoints(workload_url, url)


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
        while await _before(run, 0.85):
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
    """From 20% to 80% settled: cut every connection off for two leases then reset them,
    then hold half of them for two leases and let their bytes through; and again."""
    proxy = proxy_of(run)
    hold_s = 2 * run.settings.lease_ms / 1000
    try:
        if not await run.wait_progress(0.2):
            return
        while await _before(run, 0.8):
            run.note(f"blackhole every connection for {hold_s:.1f} s, then reset")
            await proxy.blackhole(hold_s, then="drop")
            await run.sleep(hold_s)  # normal traffic between the faults
            if not await _before(run, 0.8):
                break
            run.note(f"blackhole half the connections for {hold_s:.1f} s, then resume")
            await proxy.blackhole(hold_s, then="resume", share=0.5)
            await run.sleep(hold_s)  # normal traffic between the faults
    finally:
        proxy.pass_traffic()
        _note_stats(run, proxy)


async def _delays(run: RunControl) -> None:
    """From 20% to 80% settled: slow every chunk by lease/4 for 1.5 s, then by 3*lease/4
    for 1 s, then pass traffic for 2 s; and again."""
    proxy = proxy_of(run)
    lease_s = run.settings.lease_ms / 1000
    try:
        if not await run.wait_progress(0.2):
            return
        while await _before(run, 0.8):
            for delay, period in ((lease_s / 4, 1.5), (3 * lease_s / 4, 1.0)):
                proxy.set_delay(delay)
                run.note(f"delay {delay * 1000:.0f} ms per chunk for {period:.1f} s")
                await run.sleep(period)  # the slow period itself
            proxy.set_delay(0)
            await run.sleep(2.0)  # normal traffic between the faults
    finally:
        proxy.pass_traffic()
        _note_stats(run, proxy)


async def _before(run: RunControl, fraction: float) -> bool:
    """Whether the run goes on and less than ``fraction`` of its events are settled."""
    if run.finished.is_set() or run.remaining() <= 0:
        return False
    p = await _progress(run)
    return p is None or p < fraction


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
    _drops, backends=NETWORKED, endpoints=proxy_endpoints))
NET_BLACKHOLE = register(Scenario(
    "net-blackhole",
    "through a proxy, from 20% to 80% settled: hold every connection for two leases then "
    "reset them; hold half of them for two leases and let their late bytes through",
    _blackholes, backends=NETWORKED, endpoints=proxy_endpoints))
NET_DELAY = register(Scenario(
    "net-delay",
    "through a proxy, from 20% to 80% settled: delay every chunk by lease/4 for 1.5 s, "
    "then by 3*lease/4 for 1 s, then none for 2 s",
    _delays, backends=NETWORKED, endpoints=proxy_endpoints))
