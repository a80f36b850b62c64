"""Cases about deleting streams and groups: nothing of them survives, names start afresh."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .._model._errors import StoreLost, UnknownGroup, UnknownStream
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._query import Query
from .._model._settle_results import SettleKind
from ._case import (
    CaseEnv,
    ConformanceFailure,
    case,
    check,
    check_equal,
    check_results,
    expect_error,
    positions,
    tried,
)

INVALID = SettleKind.INVALID
STALE = SettleKind.STALE_LEASE


async def _settle_gets(env: CaseEnv, leases: Sequence[Lease],
                      kinds: Callable[[Lease], SettleKind], what: str) -> None:
    """Every settle and renew of ``leases`` gets the exact kind ``kinds`` names for it."""
    expected = [kinds(lease) for lease in leases]
    check_results(await env.rheo.ack(leases), leases, expected, f"{what}: ack")
    check_results(await env.rheo.nack(leases, "r"), leases, expected, f"{what}: nack")
    check_results(await env.rheo.reject(leases, "r"), leases, expected, f"{what}: reject")
    check_results(await env.rheo.renew(leases), leases, expected, f"{what}: renew")


def _always(kind: SettleKind) -> Callable[[Lease], SettleKind]:
    return lambda lease: kind


@case(rules=["delete.stream", "settle.unknown_lease"])
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
    for name in (stream, env.name("s")):
        exc = await expect_error(UnknownStream, env.rheo.delete_stream(name),
                                 "deleting a deleted or never created stream")
        check_equal(getattr(exc, "stream", None), name, "the stream the error names")
    exc = await expect_error(UnknownStream, env.rheo.delete_group(stream, "g"),
                             "delete_group on a deleted stream")
    check_equal(getattr(exc, "stream", None), stream, "the stream the delete_group error names")
    await _settle_gets(env, leases[3:], _always(INVALID), "leases of a deleted stream")

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
    await _settle_gets(env, leases[3:], _always(INVALID),
                       "old leases on the re-created stream, before its group exists")
    [lease] = await env.drain(stream, "g")
    await _settle_gets(env, leases[3:],
                       lambda x: STALE if (x.partition, x.sequence) == (0, 1) else INVALID,
                       "old leases once the group exists again (one partition, one event)")
    check_equal((lease.sequence, lease.attempt, lease.event.id), (1, 1, "ev-0"),
                "the re-created group's first delivery")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "dead letters after re-creation")
    await env.ack_ok([lease])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier after re-creation")


@case(rules=["delete.group", "settle.unknown_lease"])
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
    for what, call in (("group_info", env.rheo.group_info(stream, "g")),
                       ("dead_letters", env.rheo.dead_letters(stream, "g")),
                       ("delete_group again", env.rheo.delete_group(stream, "g"))):
        exc = await expect_error(UnknownGroup, call, f"{what} of a deleted group")
        check_equal((getattr(exc, "stream", None), getattr(exc, "group", None)), (stream, "g"),
                    f"the stream and group the {what} error names")
    missing = env.name("s")
    exc = await expect_error(UnknownStream, env.rheo.delete_group(missing, "g"),
                             "deleting a group of a stream that does not exist")
    check_equal(getattr(exc, "stream", None), missing, "the stream the error names")
    check_equal(await env.rheo.frontier(stream, "other"), {0: 4}, "another group's frontier")
    check_equal(len((await env.rheo.query_page(Query(stream=stream))).events), 4,
                "the stream's events stay")
    await _settle_gets(env, leases[2:], _always(INVALID), "leases of a deleted group")

    await env.rheo.create_group(stream, "g", start="earliest")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "dead letters of the new group")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier of the new group")
    again = await env.drain(stream, "g")
    check_equal(positions(again), positions(leases), "the new group delivers every event")
    check_equal({lease.attempt for lease in again}, {1}, "attempts of the new group")
    await _settle_gets(env, leases[2:], _always(STALE), "old leases of the re-created group")
    await env.ack_ok(again)


@case(rules=["delete.seen_elsewhere", "delete.group", "settle.unknown_lease"], needs_peer=True)
async def case_deletion_seen_by_another_instance(env: CaseEnv) -> None:
    """An instance that used a stream or group gets UnknownGroup/UnknownStream once it is gone."""
    stream = await env.stream()
    await env.append(stream, 3)
    await env.ack_ok(await env.fetch(stream, "g", 1))
    held = await env.fetch(stream, "g", 2)
    async with env.peer() as other:
        await other.delete_group(stream, "g")
        check_results(await env.rheo.ack(held), held, [INVALID, INVALID],
                      "leases of a group another instance deleted")
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


async def _leave_traces(env: CaseEnv, stream: str, keyed: bool) -> None:
    """Give groups ``g`` (and ``k``, key-ordered) dead letters, leases, acks and held events."""
    await env.rheo.create_group(stream, "g", max_attempts=1)
    await env.rheo.append(stream, [NewEvent("t", {"n": i}, key="a", partition=0)
                                   for i in range(4)])
    one, two, _leased, four = await env.fetch(stream, "g")
    check_results(await env.rheo.reject(one, "bad", error="E"), [one], [None], "reject 1")
    check_results(await env.rheo.nack(two, "again"), [two], [None], "nack 2 at max attempts")
    await env.ack_ok([four])
    check_equal(len(await env.rheo.dead_letters(stream, "g")), 2, "dead letters before")
    if keyed:
        await env.rheo.create_group(stream, "k", ordering="key")
        [head] = await env.fetch(stream, "k")
        check_results(await env.rheo.reject(head, "bad"), [head], [None], "reject k's 1")
        check_equal([x.sequence for x in await env.fetch(stream, "k")], [2], "k's next")


async def _check_fresh(env: CaseEnv, stream: str, keyed: bool, what: str) -> None:
    """Groups ``g`` and ``k`` created again over events 1..4 of key a start from nothing."""
    await env.rheo.create_group(stream, "g")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], f"{what}: dead letters")
    check_equal(await env.rheo.redrive(stream, "g"), 0, f"{what}: redrive of everything")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, f"{what}: frontier")
    leases = await env.fetch(stream, "g")
    check_equal(tried(leases), [(s, 1) for s in (1, 2, 3, 4)],
                f"{what}: every event, first attempts")
    await env.ack_ok(leases)
    if keyed:
        await env.rheo.create_group(stream, "k", ordering="key")
        check_equal(await env.rheo.dead_letters(stream, "k"), [], f"{what}: k's dead letters")
        [head] = await env.fetch(stream, "k")
        check_equal((head.sequence, head.attempt), (1, 1), f"{what}: k starts at its head")
        check_equal(await env.fetch(stream, "k"), [], f"{what}: k's 2 waits for 1")
        await env.ack_ok([head])
        check_equal([x.sequence for x in await env.fetch(stream, "k")], [2], f"{what}: k's 2")
    check_equal(await env.rheo.redrive(stream, "g"), 0, f"{what}: redrive after consuming")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], f"{what}: dead letters after")


@case(rules=["delete.group", "redrive.dead_letters_only", "dead_letters.listing",
             "group.lifecycle"])
async def case_nothing_survives_a_group_deletion(env: CaseEnv) -> None:
    """A group deleted and created again has no dead letters, leases or held keys of the old."""
    keyed = env.backend.capabilities.key_ordering
    stream = await env.stream()
    await _leave_traces(env, stream, keyed)
    for group in ("g", "k") if keyed else ("g",):
        await env.rheo.delete_group(stream, group)
    check_equal(await env.rheo.groups(stream), [], "groups after deleting them all")
    await _check_fresh(env, stream, keyed, "groups created again")


@case(rules=["delete.stream", "redrive.dead_letters_only", "dead_letters.listing",
             "stream.lifecycle"])
async def case_nothing_survives_a_stream_deletion(env: CaseEnv) -> None:
    """A stream deleted and created again has no groups, dead letters or held keys of the old."""
    keyed = env.backend.capabilities.key_ordering
    stream = await env.stream()
    await _leave_traces(env, stream, keyed)
    await env.rheo.delete_stream(stream)
    check(stream not in await env.rheo.streams(), "the deleted stream is listed")
    await env.rheo.create_stream(stream)
    check_equal((await env.rheo.streams()).count(stream), 1, "the stream created again, once")
    check_equal(await env.rheo.groups(stream), [], "groups of the stream created again")
    await env.rheo.append(stream, [NewEvent("t", {"n": i}, key="a", partition=0)
                                   for i in range(4)])
    await _check_fresh(env, stream, keyed, "stream created again")
