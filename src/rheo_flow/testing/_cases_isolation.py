"""Cases about what must stay apart: two stores with the same stream names, two groups.

A backend may keep caches (a stream's partitions, a group's rotation, known
keys) or wake-up channels keyed by a stream's name alone; two stores holding a
stream of the same name, or two groups of one stream, must still never see each
other's state.
"""

from __future__ import annotations

import asyncio

from .._model._errors import UnknownStream
from .._model._event import NewEvent
from .._model._settle_results import SettleKind
from .._rheo import Rheo
from ._case import CaseEnv, case, check, check_equal, check_results, expect_error


async def _water(rheo: Rheo, stream: str) -> dict[int, int]:
    return dict((await rheo.stream_info(stream)).high_water)


@case(rules=["stream.lifecycle", "append.sequence", "append.idempotent", "settle.unknown_lease",
             "delete.stream"], needs_apart=True)
async def case_stores_apart_share_nothing(env: CaseEnv) -> None:
    """Two stores with a stream of the same name: partitions, sequences, ids, groups apart."""
    name = env.name("s")
    async with env.apart() as other:
        check_equal((await env.rheo.create_stream(name, partitions=2)).partitions, 2, "here")
        check_equal((await other.create_stream(name, partitions=3)).partitions, 3,
                    "the same name in the other store, with another partition count")
        await env.rheo.append(name, [NewEvent("t", id=f"e{i}", partition=0) for i in range(3)])
        [there] = await other.append(name, NewEvent("t", id="e2", partition=2))
        check_equal((there.partition, there.sequence), (2, 1), "a new event in the other store")
        check_equal(await _water(env.rheo, name), {0: 3, 1: 0}, "high water here")
        check_equal(await _water(other, name), {0: 0, 1: 0, 2: 1}, "high water there")
        mine = await env.fetch(name, "g")
        check_equal(await other.groups(name), [], "a group here is not a group there")
        theirs = await other.fetch(name, "g", lease_ms=env.long_ms)
        check_equal([(x.partition, x.sequence) for x in theirs], [(2, 1)], "there: its event")
        check_results(await other.ack(mine), mine, [SettleKind.INVALID] * 3,
                      "leases of this store in the other one (above its high water)")
        await env.rheo.delete_stream(name)
        check(name in await other.streams(), "a deletion here deletes nothing there")
        await env.rheo.create_stream(name, partitions=1)
        check_equal((await other.stream_info(name)).partitions, 3, "partitions there")
        await other.append(name, NewEvent("t", partition=2))
        check_equal(await _water(other, name), {0: 0, 1: 0, 2: 2}, "high water there")
        check_equal(await _water(env.rheo, name), {0: 0}, "high water of the new stream here")
        check_results(await other.ack(theirs), theirs, [None], "the other store's lease")
        await other.delete_stream(name)
        await expect_error(UnknownStream, other.stream_info(name), "deleted there")
        check_equal(await _water(env.rheo, name), {0: 0}, "the stream here stays")


@case(rules=["wakeup.own_stream"], requires=["push_wakeups"], needs_apart=True)
async def case_wakeups_stay_in_their_store(env: CaseEnv) -> None:
    """An append to a stream of the same name in another store does not wake a waiter."""
    name = env.name("s")
    await env.rheo.create_stream(name)
    async with env.apart() as other:
        await other.create_stream(name)
        waiter = asyncio.create_task(env.rheo.wait_for_append(name, 10.0))
        theirs: asyncio.Task[bool] | None = None
        try:
            await _quietly(other, name, waiter)
            theirs = asyncio.create_task(other.wait_for_append(name, 10.0))
            await _quietly(env.rheo, name, theirs, until_woken=waiter)
        finally:
            waiter.cancel()
            if theirs is not None:
                theirs.cancel()


async def _quietly(through: Rheo, stream: str, asleep: asyncio.Task[bool], *,
                   until_woken: asyncio.Task[bool] | None = None) -> None:
    """Append to ``stream`` through ``through``: ``asleep`` must stay asleep for 0.4 s, and
    ``until_woken`` (if given) must then be woken, True, within 10 s."""
    loop = asyncio.get_running_loop()
    # A quiet window of real time is the only way to see that nothing happens.
    quiet_until = loop.time() + 0.4
    deadline = loop.time() + 10.0
    while loop.time() < quiet_until or (until_woken is not None and not until_woken.done()):
        check(loop.time() < deadline, "no wake-up within 10 s of appending")
        await through.append(stream, NewEvent("t"))
        await asyncio.wait({asleep} | ({until_woken} if until_woken else set()), timeout=0.05)
        check(not asleep.done(), "an append in another store woke a waiter")
    if until_woken is not None:
        check_equal(until_woken.result(), True, "woken by an append to its own stream")
