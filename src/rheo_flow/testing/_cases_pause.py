"""Cases about pausing a group: its fetches return nothing while leases out still settle,
a resume (or the end of the pause) makes its events fetchable again."""

from __future__ import annotations

import asyncio

from .._model._errors import UnknownGroup, UnknownStream
from .._model._stream import GroupInfo
from ._case import CaseEnv, case, check, check_equal, check_results, expect_error, positions


def _paused(info: GroupInfo) -> tuple[bool, int | None]:
    return info.paused, info.paused_until_ms


@case(rules=["pause.fetch"], requires=["pause"], needs_peer=True)
async def case_paused_group_fetches_nothing(env: CaseEnv) -> None:
    """A paused group's fetches return nothing anywhere; its leases still settle and renew.

    Other groups of the stream go on."""
    stream = await env.stream(partitions=2)
    await env.append(stream, 8)
    first, second, third, fourth = await env.fetch(stream, "g", 4)
    await env.rheo.create_group(stream, "other")
    info = await env.rheo.pause_group(stream, "g")
    check_equal(_paused(info), (True, None), "pause_group's info (until resumed)")
    check_equal(_paused(await env.rheo.group_info(stream, "g")), (True, None), "group_info")
    check_equal({g.group: g.paused for g in await env.rheo.groups(stream)},
                {"g": True, "other": False}, "groups() while g is paused")
    check_equal(await env.fetch(stream, "g"), [], "fetch of the paused group")
    check_equal(await env.fetch(stream, "g", partitions=[1]), [], "fetch of one partition")
    async with env.peer() as peer:
        check_equal(await peer.fetch(stream, "g", limit=10, lease_ms=env.long_ms), [],
                    "fetch of the paused group through another instance")
    results, leases = await env.backend.ack_and_fetch([first], stream, "g", "c", 10,
                                                      env.long_ms, None)
    check_results(results, [first], [None], "ack_and_fetch's ack while paused")
    check_equal(leases, [], "ack_and_fetch's fetch while paused")
    check_results(await env.rheo.renew([second], lease_ms=env.long_ms), [second], [None],
                  "renew while paused")
    check_results(await env.rheo.nack([third], "later"), [third], [None], "nack while paused")
    check_results(await env.rheo.reject([fourth], "bad"), [fourth], [None],
                  "reject while paused")
    check_equal(await env.fetch(stream, "g"), [], "fetch while paused, after a nack")
    check_equal(len(await env.drain(stream, "other")), 8, "the other group fetches every event")
    await env.ack_ok([second])
    check_equal(_paused(await env.rheo.pause_group(stream, "g")), (True, None),
                "pausing a paused group")


@case(rules=["pause.resume", "pause.fetch"], requires=["pause"])
async def case_resume_makes_events_fetchable(env: CaseEnv) -> None:
    """After resume_group, a fetch leases what it would have leased without the pause."""
    stream = await env.stream(partitions=2)
    await env.append(stream, 6)
    leased = await env.fetch(stream, "g", 2)
    await env.rheo.pause_group(stream, "g")
    await env.append(stream, 2)
    check_equal(await env.fetch(stream, "g"), [], "fetch while paused")
    check_results(await env.rheo.nack(leased, "again"), leased, [None, None], "nack while paused")
    info = await env.rheo.resume_group(stream, "g")
    check_equal(_paused(info), (False, None), "resume_group's info")
    check_equal(_paused(await env.rheo.group_info(stream, "g")), (False, None), "group_info")
    check_equal(_paused(await env.rheo.resume_group(stream, "g")), (False, None),
                "resuming a group that is not paused")
    high = (await env.rheo.stream_info(stream)).high_water
    rest = await env.drain(stream, "g")
    check_equal(sorted(positions(rest)),
                [(p, s) for p, top in sorted(high.items()) for s in range(1, top + 1)],
                "every event is fetched after the resume, the nacked ones again")
    await env.ack_ok(rest)
    check_equal(await env.rheo.frontier(stream, "g"), dict(high), "frontier after the acks")


@case(rules=["pause.resume"], requires=["pause"])
async def case_pause_until_ends_by_itself(env: CaseEnv) -> None:
    """A pause with an end time ends by itself once the backend's clock passes it."""
    stream = await env.stream()
    await env.append(stream, 3)
    await env.rheo.create_group(stream, "g")
    until = await env.now() + env.short_ms
    info = await env.backend.pause_group(stream, "g", until)
    check_equal(_paused(info), (True, until), "pause_group's info (with an end)")
    check_equal(await env.fetch(stream, "g"), [], "fetch before the end of the pause")
    await env.expire()
    check_equal(_paused(await env.rheo.group_info(stream, "g")), (False, None),
                "group_info once the pause ended")
    check_equal(len(await env.drain(stream, "g")), 3, "events fetched once the pause ended")
    info = await env.backend.pause_group(stream, "g", await env.now() + env.long_ms)
    info = await env.backend.pause_group(stream, "g", None)
    check_equal(_paused(info), (True, None), "a pause replaces the end of the last one")
    await env.expire()
    await env.append(stream, 1)
    check_equal(await env.fetch(stream, "g"), [], "fetch of a group paused until resumed")


@case(rules=["pause.resume", "wakeup.own_stream"], requires=["pause", "push_wakeups"])
async def case_resume_wakes_waiters(env: CaseEnv) -> None:
    """A resume wakes the consumers waiting on the group's stream."""
    stream = await env.stream()
    await env.rheo.create_group(stream, "g")
    await env.rheo.pause_group(stream, "g")
    waiter = asyncio.create_task(env.rheo.wait_for_append(stream, 10.0))
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while not waiter.done():  # until the waiter is registered, a resume may miss it
            check(loop.time() < deadline, "no wake-up within 10 s of resuming")
            await env.rheo.resume_group(stream, "g")
            await asyncio.wait({waiter}, timeout=0.05)
        check_equal(waiter.result(), True, "wait_for_append woken by a resume")
    finally:
        waiter.cancel()


@case(rules=["pause.resume", "errors.unknown"], requires=["pause"])
async def case_pause_of_unknown_group(env: CaseEnv) -> None:
    """Pausing or resuming a missing group or stream raises UnknownGroup / UnknownStream."""
    stream = await env.stream()
    await env.rheo.create_group(stream, "g")
    for call, what in ((env.rheo.pause_group, "pause_group"),
                       (env.rheo.resume_group, "resume_group")):
        await expect_error(UnknownGroup, call(stream, "missing"), f"{what} of a missing group")
        await expect_error(UnknownStream, call(env.name("nope"), "g"),
                           f"{what} of a missing stream")
    await env.rheo.pause_group(stream, "g")
    await env.rheo.delete_group(stream, "g")
    await expect_error(UnknownGroup, env.rheo.resume_group(stream, "g"),
                       "resume_group of a deleted group")
    await env.rheo.create_group(stream, "g")
    check_equal(_paused(await env.rheo.group_info(stream, "g")), (False, None),
                "a group created again after its deletion is not paused")
