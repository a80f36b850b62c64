"""Cases about deleting streams and groups: nothing of them survives, names start afresh."""

from __future__ import annotations

from .._model._errors import StoreLost, UnknownGroup, UnknownStream
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._query import Query
from ._case import (
    CaseEnv,
    ConformanceFailure,
    case,
    check,
    check_equal,
    expect_error,
    positions,
)


async def _settle_fails(env: CaseEnv, leases: list[Lease], what: str) -> None:
    """Leases of a deleted stream or group settle no more."""
    for result in await env.rheo.ack(leases):
        check(not result.ok, f"{what}: an ack of a deleted delivery succeeded ({result})")


@case(rules=["delete.stream"])
async def case_delete_stream_removes_everything(env: CaseEnv) -> None:
    """delete_stream removes events, groups, deliveries and dead letters; the name starts fresh."""
    stream = await env.stream(partitions=2)
    await env.rheo.append(stream, [NewEvent("t", {"n": i}, id=f"ev-{i}", key=f"k{i}")
                                   for i in range(6)])
    leases = await env.drain(stream, "g")
    check_equal(len(leases), 6, "leases before the deletion")
    await env.ack_ok(leases[:2])
    await env.rheo.reject(leases[2:3], "poison")
    await env.rheo.create_group(stream, "other")
    await env.rheo.delete_stream(stream)

    check(stream not in await env.rheo.streams(), "a deleted stream is still listed")
    await expect_error(UnknownStream, env.rheo.stream_info(stream), "stream_info of it")
    await expect_error(UnknownStream, env.rheo.groups(stream), "groups of it")
    await expect_error(UnknownStream, env.rheo.group_info(stream, "g"), "group_info of it")
    await expect_error(UnknownStream, env.rheo.append(stream, NewEvent("t")), "append to it")
    await expect_error(UnknownStream, env.rheo.delete_stream(stream), "deleting it again")
    await expect_error(UnknownStream, env.rheo.delete_stream(env.name("s")),
                       "deleting a stream that never existed")
    await _settle_fails(env, leases[3:], "after delete_stream")

    # Same name, another partition count: a new stream, nothing of the old one.
    await env.rheo.create_stream(stream, partitions=1)
    info = await env.rheo.stream_info(stream)
    check_equal((dict(info.high_water), dict(info.low_water)), ({0: 0}, {0: 1}),
                "water marks of the re-created stream")
    check_equal(await env.rheo.groups(stream), [], "groups of the re-created stream")
    page = await env.rheo.query_page(Query(stream=stream))
    check_equal(page.events, [], "events of the re-created stream")
    [event] = await env.rheo.append(stream, NewEvent("t", {"new": True}, id="ev-0"))
    check_equal((event.sequence, event.data), (1, {"new": True}),
                "an old event id appended again is a new event at sequence 1")
    await _settle_fails(env, leases[3:], "after the stream was re-created")
    [lease] = await env.drain(stream, "g")
    check_equal((lease.sequence, lease.attempt, lease.event.id), (1, 1, "ev-0"),
                "the re-created group's first delivery")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "dead letters after re-creation")
    await env.ack_ok([lease])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier after re-creation")


@case(rules=["delete.group"])
async def case_delete_group_removes_its_state(env: CaseEnv) -> None:
    """delete_group removes a group's progress, deliveries and dead letters, nothing else."""
    stream = await env.stream(partitions=1)
    await env.append(stream, 4)
    leases = await env.drain(stream, "g")
    await env.ack_ok(leases[:1])
    await env.rheo.reject(leases[1:2], "poison")
    others = await env.drain(stream, "other")
    await env.ack_ok(others)
    await env.rheo.delete_group(stream, "g")

    check_equal([g.group for g in await env.rheo.groups(stream)], ["other"],
                "groups after delete_group")
    await expect_error(UnknownGroup, env.rheo.group_info(stream, "g"), "group_info of it")
    await expect_error(UnknownGroup, env.rheo.dead_letters(stream, "g"), "dead_letters of it")
    await expect_error(UnknownGroup, env.rheo.delete_group(stream, "g"), "deleting it again")
    await expect_error(UnknownStream, env.rheo.delete_group(env.name("s"), "g"),
                       "deleting a group of a stream that does not exist")
    check_equal(await env.rheo.frontier(stream, "other"), {0: 4}, "another group's frontier")
    check_equal(len((await env.rheo.query_page(Query(stream=stream))).events), 4,
                "the stream's events stay")
    await _settle_fails(env, leases[2:], "after delete_group")

    await env.rheo.create_group(stream, "g", start="earliest")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "dead letters of the new group")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier of the new group")
    again = await env.drain(stream, "g")
    check_equal(positions(again), positions(leases), "the new group delivers every event")
    check_equal({lease.attempt for lease in again}, {1}, "attempts of the new group")
    await _settle_fails(env, leases[2:], "after the group was re-created")
    await env.ack_ok(again)


@case(rules=["delete.seen_elsewhere"], needs_peer=True)
async def case_deletion_seen_by_another_instance(env: CaseEnv) -> None:
    """An instance that used a stream or group gets UnknownGroup/UnknownStream once it is gone."""
    stream = await env.stream()
    await env.append(stream, 2)
    await env.ack_ok(await env.fetch(stream, "g", 1))
    async with env.peer() as other:
        await other.delete_group(stream, "g")
        exc = await expect_error(UnknownGroup, env.fetch(stream, "g"),
                                 "fetch of a group another instance deleted")
        check_equal((getattr(exc, "stream", None), getattr(exc, "group", None)), (stream, "g"),
                    "the stream and group the error names")
        await other.delete_stream(stream)
        try:
            await env.fetch(stream, "g")
        except (UnknownStream, StoreLost):
            pass
        else:
            raise ConformanceFailure("a fetch of a stream another instance deleted succeeded")
