"""Cases about what must stay apart: two stores with the same stream names, two groups.

A backend may keep caches (a stream's partitions, a group's rotation, known
keys) or wake-up channels keyed by a stream's name alone; two stores holding a
stream of the same name, or two groups of one stream, must still never see each
other's state.
"""

from __future__ import annotations

import asyncio
import dataclasses

from .._model._errors import UnknownStream
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._query import Query
from .._model._settle_results import SettleKind
from .._model._stream import DeadLetter
from .._rheo import Rheo
from ._case import (
    CaseEnv,
    case,
    check,
    check_equal,
    check_results,
    expect_error,
    positions,
    states,
    tried,
)


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


async def _mixed(env: CaseEnv, stream: str, group: str) -> tuple[list[Lease], list[DeadLetter]]:
    """Leave ``group`` of a two-partition stream of four events each with acked
    (0, 1) and (1, 1), rejected (0, 4) and (1, 2), nacked (0, 3), and leased
    (0, 2), (1, 3) and (1, 4); returns the held leases and the dead letters."""
    leases = {(x.partition, x.sequence): x for x in await env.fetch(stream, group)}
    check_equal(len(leases), 8, f"{group} leases every event")
    await env.ack_ok([leases[0, 1], leases[1, 1]])
    dead = [leases[0, 4], leases[1, 2]]
    check_results(await env.rheo.reject(dead, "poison", error=f"{group} failed"), dead,
                  [None, None], f"{group} rejects")
    check_results(await env.rheo.nack(leases[0, 3], "r"), [leases[0, 3]], [None],
                  f"{group} nacks (0, 3)")
    return [leases[0, 2], leases[1, 3], leases[1, 4]], await env.rheo.dead_letters(stream, group)


async def _still_mixed(env: CaseEnv, stream: str, group: str, held: list[Lease],
                       dead: list[DeadLetter], what: str) -> None:
    """``group`` is exactly as :func:`_mixed` left it (then acks everything it holds)."""
    check_equal(await env.rheo.dead_letters(stream, group), dead, f"{what}: dead letters")
    check_equal(await env.rheo.frontier(stream, group), {0: 1, 1: 2}, f"{what}: frontier")
    again = await env.fetch(stream, group)
    check_equal(states(again), [(0, 3, 2)], f"{what}: only its nacked delivery is eligible")
    leases = [*held, *again]
    check_results(await env.rheo.ack(leases), leases, [None] * len(leases),
                  f"{what}: its leases settle, as first settles", repeated=[False] * len(leases))
    check_equal(await env.rheo.frontier(stream, group), {0: 4, 1: 4}, f"{what}: frontier")


@case(rules=["group.independent", "redrive.dead_letters_only", "frontier.contiguous"])
async def case_redrive_leaves_other_groups_alone(env: CaseEnv) -> None:
    """A redrive in one group touches no other group's dead letters or deliveries."""
    stream = await env.stream_with(4, 4)
    held, dead = await _mixed(env, stream, "b")
    await _mixed(env, stream, "a")
    check_equal(await env.rheo.redrive(stream, "a"), 2, "a's dead letters re-driven")
    check_equal(await env.rheo.redrive(stream, "a"), 0, "a second redrive re-drives nothing")
    check_equal(await env.rheo.dead_letters(stream, "a"), [], "a's dead letters")
    check_equal(await env.rheo.frontier(stream, "a"), {0: 1, 1: 1}, "a's frontier")
    check_equal(states(await env.fetch(stream, "a")), [(0, 3, 2), (0, 4, 1), (1, 2, 1)],
                "a: its nacked delivery and its re-driven dead letters")
    await _still_mixed(env, stream, "b", held, dead, "b after a's redrive")


@case(rules=["group.independent", "replay.from_sequence", "reset.position"])
async def case_replay_and_reset_leave_other_groups_alone(env: CaseEnv) -> None:
    """A replay of one partition and a reset of another in one group touch no other group."""
    stream = await env.stream_with(4, 4)
    held, dead = await _mixed(env, stream, "b")
    await _mixed(env, stream, "a")
    await env.rheo.replay(stream, "a", from_sequence=2, partitions=[0])
    check_equal(await env.rheo.frontier(stream, "a"), {0: 1, 1: 2}, "a's frontier after replay")
    check_equal([(d.partition, d.sequence) for d in await env.rheo.dead_letters(stream, "a")],
                [(1, 2)], "a's dead letters after a replay of partition 0")
    await env.rheo.reset(stream, "a", to="earliest", partitions=[1])
    check_equal(await env.rheo.frontier(stream, "a"), {0: 1, 1: 0}, "a's frontier after reset")
    check_equal(await env.rheo.dead_letters(stream, "a"), [], "a's dead letters after reset")
    check_equal(states(await env.fetch(stream, "a")),
                [(0, 2, 1), (0, 3, 1), (0, 4, 1), (1, 1, 1), (1, 2, 1), (1, 3, 1), (1, 4, 1)],
                "a: everything replayed or reset, as first deliveries")
    await _still_mixed(env, stream, "b", held, dead, "b after a's replay and reset")


@case(rules=["group.independent", "delete.group"])
async def case_delete_group_leaves_other_groups_alone(env: CaseEnv) -> None:
    """Deleting a group leaves another group's deliveries, leases and dead letters as they were."""
    stream = await env.stream_with(4, 4)
    held, dead = await _mixed(env, stream, "b")
    await _mixed(env, stream, "a")
    await env.rheo.delete_group(stream, "a")
    check_equal([g.group for g in await env.rheo.groups(stream)], ["b"], "groups")
    await _still_mixed(env, stream, "b", held, dead, "b after deleting a")
    check_equal(states(await env.fetch(stream, "a")),
                [(p, s, 1) for p in (0, 1) for s in (1, 2, 3, 4)], "a created again starts fresh")


@case(rules=["group.independent", "trim.removed", "delete.stream"], requires=["trim"])
async def case_trim_and_delete_leave_other_streams_alone(env: CaseEnv) -> None:
    """A forced trim of one stream to its high water and then its deletion leave
    another stream's events, groups, positions, leases and dead letters as they were,
    whatever names and positions the two share."""
    other = await env.stream_with(4, 4)
    held, dead = await _mixed(env, other, "g")
    await env.rheo.create_group(other, "unread")  # its cursors stay at the start
    stream = await env.stream_with(4, 4)
    await _mixed(env, stream, "g")
    await env.rheo.create_group(stream, "unread")
    removed = await env.rheo.trim(stream, up_to=4, force=True)
    check_equal(removed, {0: 4, 1: 4}, "the trimmed stream loses all its events")
    every = [(p, s) for p in (0, 1) for s in (1, 2, 3, 4)]
    page = await env.rheo.query_page(Query(stream=other))
    check_equal(positions(page.events), every, "the other stream keeps its events")
    check_equal(dict((await env.rheo.stream_info(other)).low_water), {0: 1, 1: 1},
                "the other stream's low water")
    check_equal(await env.rheo.frontier(other, "unread"), {0: 0, 1: 0},
                "the other stream's unread group: its frontier")
    await env.rheo.delete_stream(stream)
    check_equal(positions((await env.rheo.query_page(Query(stream=other))).events), every,
                "the other stream keeps its events after the deletion")
    check_equal(sorted(g.group for g in await env.rheo.groups(other)), ["g", "unread"],
                "the other stream's groups")
    check_equal(sorted(positions(await env.fetch(other, "unread"))), every,
                "the other stream's unread group gets every event, first deliveries")
    await _still_mixed(env, other, "g", held, dead, "the other stream after trim and delete")


@case(rules=["trim.bound", "trim.removed", "frontier.contiguous", "group.start"],
      requires=["trim"])
async def case_trim_bound_per_partition(env: CaseEnv) -> None:
    """A trim with a bound per partition moves each partition's low water to its own bound.

    Group ``g`` has consumed partition 1 only up to 2, group ``late`` nothing: the
    events the trim keeps are all delivered, in each partition, to each group.
    """
    stream = await env.stream_with(5, 5, 5)
    await env.rheo.create_group(stream, "late")
    await env.ack_ok(await env.fetch(stream, "g", 2, partitions=[1]))
    leases = {(x.partition, x.sequence): x for x in
              await env.fetch(stream, "g", partitions=[0, 2])}
    dead = [leases[0, 1], leases[0, 4], leases[2, 3]]
    check_results(await env.rheo.reject(dead, "bad"), dead, [None] * 3, "reject")
    removed = await env.rheo.trim(stream, up_to={0: 2, 2: 4}, force=True)
    check_equal([(d.partition, d.sequence) for d in await env.rheo.dead_letters(stream, "g")],
                [(0, 4)], "only the dead letter above its partition's bound stays")
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive finds that one only")
    check_equal({p: n for p, n in removed.items() if n}, {0: 2, 2: 4}, "removed per partition")
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.low_water), {0: 3, 1: 1, 2: 5}, "low water per partition")
    check_equal(dict(info.high_water), {0: 5, 1: 5, 2: 5}, "high water stays")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2, 1: 2, 2: 4}, "frontier of g")
    check_equal(await env.rheo.frontier(stream, "late"), {0: 2, 1: 0, 2: 4}, "of late")
    removed = await env.rheo.trim(stream, up_to={0: 5, 1: 1})
    check_equal({p: n for p, n in removed.items() if n}, {},
                "an unforced trim capped at the lowest frontier of each partition")
    page = await env.rheo.query_page(Query(stream=stream))
    retained = [(0, 3), (0, 4), (0, 5), (1, 1), (1, 2), (1, 3), (1, 4), (1, 5), (2, 5)]
    check_equal(positions(page.events), retained, "the retained events")
    gone = [leases[0, 2], leases[2, 1], leases[2, 4]]
    check_results(await env.rheo.ack(gone), gone, [SettleKind.STALE_LEASE] * 3,
                  "leases of trimmed events")
    rest = await env.fetch(stream, "g", partitions=[1])
    check_equal(states(rest), [(1, 3, 1), (1, 4, 1), (1, 5, 1)],
                "g: the rest of partition 1, which the trim did not touch")
    check_equal(sorted(positions(await env.fetch(stream, "late"))), retained,
                "late: every retained event")
    await env.ack_ok([leases[0, 3], leases[2, 5], *rest])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3, 1: 5, 2: 5}, "frontier of g")

async def _twin(env: CaseEnv, stream: str, tag: str) -> list[Lease]:
    """Append ids e0..e5 alternately to partitions 0 and 1 of ``stream``; lease them in ``g``."""
    events = await env.rheo.append(stream, [NewEvent("t", {"in": tag, "n": i}, id=f"e{i}",
                                                     partition=i % 2) for i in range(6)])
    check_equal([(e.stream, e.id, e.partition, e.sequence, e.data) for e in events],
                [(stream, f"e{i}", i % 2, i // 2 + 1, {"in": tag, "n": i}) for i in range(6)],
                f"the ids are new in stream {tag}")
    leases = await env.fetch(stream, "g")
    check_equal(sorted((x.stream, x.partition, x.sequence, x.attempt, x.event.data["in"])
                       for x in leases),
                sorted((stream, i % 2, i // 2 + 1, 1, tag) for i in range(6)),
                f"stream {tag}: its own events, first deliveries")
    return sorted(leases, key=lambda x: (x.partition, x.sequence))


@case(rules=["append.idempotent", "query.filters", "group.independent", "settle.unknown_lease"])
async def case_streams_sharing_ids_and_positions_stay_apart(env: CaseEnv) -> None:
    """Two streams with the same event ids, partitions and sequences never see each other."""
    one, two = await env.stream(2), await env.stream(2)
    first = await _twin(env, one, "one")
    await env.ack_ok([first[0]])
    check_results(await env.rheo.nack(first[1], "r"), [first[1]], [None], "nack (0, 2) in one")
    check_results(await env.rheo.reject(first[3], "r"), [first[3]], [None], "reject (1, 1)")
    second = await _twin(env, two, "two")
    [again] = await env.rheo.append(one, NewEvent("t", {"in": "neither"}, id="e2"))
    check_equal((again.stream, again.sequence, again.data), (one, 2, {"in": "one", "n": 2}),
                "an id stored in both streams returns its own stream's event")
    for stream, tag in ((one, "one"), (two, "two")):
        page = await env.rheo.query_page(Query(stream=stream, partitions=[1], from_sequence=2,
                                               to_sequence=3))
        check_equal([(e.stream, e.sequence, e.data) for e in page.events],
                    [(stream, 2, {"in": tag, "n": 3}), (stream, 3, {"in": tag, "n": 5})],
                    f"query of partition 1, sequences 2..3, in stream {tag}")
    crossed = [dataclasses.replace(x, event=dataclasses.replace(x.event, stream=two))
               for x in first[2:]]
    check_results(await env.rheo.ack(crossed), crossed, [SettleKind.STALE_LEASE] * 4,
                  "leases of stream one naming stream two")
    check_equal(await env.rheo.frontier(two, "g"), {0: 0, 1: 0}, "nothing settled in two")
    check_equal(await env.rheo.dead_letters(two, "g"), [], "no dead letter in two")
    check_equal(await env.fetch(two, "g"), [], "two: every delivery still leased")
    await env.ack_ok(second)
    check_equal(await env.rheo.frontier(one, "g"), {0: 1, 1: 1}, "one's frontier")
    check_equal([(d.partition, d.sequence) for d in await env.rheo.dead_letters(one, "g")],
                [(1, 1)], "one's dead letters")
    redelivered = await env.fetch(one, "g")
    check_equal([(x.partition, x.sequence, x.attempt, x.event.id, x.event.data)
                 for x in redelivered], [(0, 2, 2, "e2", {"in": "one", "n": 2})],
                "one: its nacked delivery, with one's event")
    await env.append(two, 3, partition=0)
    above = [dataclasses.replace(first[2], event=dataclasses.replace(first[2].event, sequence=s))
             for s in (4, 6)]
    check_results(await env.rheo.ack(above), above, [SettleKind.INVALID] * 2,
                  "one's leases naming sequences above one's high water, not above two's")
    # New events of the older stream at positions the newer one holds too.
    await env.rheo.append(one, [NewEvent("t", {"in": "one", "n": i}, id=f"f{i}", partition=0)
                                for i in (6, 7)])
    await env.rheo.append(two, [NewEvent("t", {"in": "two", "n": i}, id=f"f{i}", partition=0)
                                for i in (6, 7)])
    fresh = await env.fetch(one, "g")
    check_equal(sorted((x.partition, x.sequence, x.event.id, x.event.data["in"])
                       for x in fresh), [(0, 4, "f6", "one"), (0, 5, "f7", "one")],
                "one: its new events, not two's at the same positions")
    await env.ack_ok([*redelivered, *fresh])


@case(rules=["group.independent", "lease.expiry"])
async def case_expired_leases_come_back_to_their_own_group(env: CaseEnv) -> None:
    """Leases of one group that run out come back to that group only.

    A second group fetching the same partition afterwards gets none of them."""
    stream = await env.stream()
    await env.append(stream, 3)
    mine = await env.fetch(stream, "a", lease_ms=env.short_ms)
    theirs = await env.fetch(stream, "b", limit=1)
    check_equal(positions(theirs), [(0, 1)], "b leases 1 for long")
    await env.expire()
    check_equal(tried(await env.fetch(stream, "b")),
                [(2, 1), (3, 1)], "b gets its own 2 and 3, first attempts, not a's expired leases")
    again = await env.fetch(stream, "a")
    check_equal(tried(again), [(1, 2), (2, 2), (3, 2)],
                "a's expired leases come back to a")
    check_results(await env.rheo.ack(mine), mine, [SettleKind.STALE_LEASE] * 3,
                  "a's superseded leases")
    await env.ack_ok(again)
