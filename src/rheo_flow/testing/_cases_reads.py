"""Cases about reads, retention, wake-ups and the capability declaration."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from .._backend import Backend
from .._model._capabilities import Capabilities
from .._model._errors import InvalidArgument, InvalidCapabilities
from .._model._event import Event, NewEvent
from .._model._query import Query
from .._model._settle_results import SettleKind
from .._rheo import Rheo
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


async def _query_all(env: CaseEnv, query: Query, page_size: int) -> list[Event]:
    events: list[Event] = []
    cursor: str | None = None
    for _ in range(1000):
        page = await env.rheo.query_page(query, limit=page_size, cursor=cursor)
        check(len(page.events) <= page_size, f"a page holds at most {page_size} events")
        events.extend(page.events)
        if page.cursor is None:
            return events
        check(page.events, "a page with a cursor is not empty")
        cursor = page.cursor
    raise ConformanceFailure("query_page never returned a last page")


async def _mixed_stream(env: CaseEnv) -> tuple[str, list[Event]]:
    stream = await env.stream(partitions=3)
    events = await env.rheo.append(stream, [
        NewEvent("x" if i % 3 else "y", {"i": i}, key=("a", "b", "c", "d")[i % 4])
        for i in range(25)
    ])
    events += await env.rheo.append(stream, [NewEvent("x", {"i": 99}, partition=1)])
    return stream, sorted(events, key=lambda e: (e.partition, e.sequence))


@case(rules=["query.pages"])
async def case_query_pagination_complete(env: CaseEnv) -> None:
    """Query pages follow (partition, sequence) with no duplicate and no gap at any page size."""
    stream, expected = await _mixed_stream(env)
    for size in (1, 4, 7, 26, 100):
        got = await _query_all(env, Query(stream=stream), size)
        check_equal(positions(got), positions(expected), f"events paged by {size}")
    check_equal([e async for e in env.rheo.stream_query(Query(stream=stream), page_size=3)],
                expected, "stream_query returns every stored event")
    last = await env.rheo.query_page(Query(stream=stream), limit=26)
    check_equal(last.cursor, None, "a page that holds everything is the last page")


@case(rules=["query.filters"])
async def case_query_filters(env: CaseEnv) -> None:
    """Query filters on key, type, partitions and sequence bounds combine with AND."""
    stream, everything = await _mixed_stream(env)
    filters: list[dict[str, Any]] = [
        {"key": "a"},
        {"type": "y"},
        {"partitions": [0, 2]},
        {"from_sequence": 2, "to_sequence": 4},
        {"key": "b", "type": "x"},
        {"partitions": [1], "from_sequence": 3, "type": "x"},
        {"key": "missing"},
        {"to_sequence": 0},
    ]
    for spec in filters:
        expected = [e for e in everything if _matches(e, spec)]
        got = await _query_all(env, Query(stream=stream, **spec), 4)
        check_equal(positions(got), positions(expected), f"query with {spec}")


def _matches(event: Event, spec: dict[str, Any]) -> bool:
    return all([
        spec.get("key") in (None, event.key),
        spec.get("type") in (None, event.type),
        spec.get("partitions") is None or event.partition in spec["partitions"],
        event.sequence >= spec.get("from_sequence", 0),
        event.sequence <= spec.get("to_sequence", 2**62),
    ])


@case(rules=["query.filters"], requires=["time_range_query"])
async def case_query_time_range(env: CaseEnv) -> None:
    """Query time bounds select since <= appended_at_ms < until."""
    stream = await env.stream(partitions=2)
    early = await env.rheo.append(stream, [NewEvent("t", key=f"k{i}") for i in range(4)])
    await env.advance(env.short_ms)
    late = await env.rheo.append(stream, [NewEvent("t", key=f"k{i}") for i in range(4)])
    split = min(e.appended_at_ms for e in late)
    check(max(e.appended_at_ms for e in early) < split, "later appends have later timestamps")
    got_late = await _query_all(env, Query(stream=stream, since_ms=split), 3)
    check_equal(sorted(e.id for e in got_late), sorted(e.id for e in late), "since_ms")
    got_early = await _query_all(env, Query(stream=stream, until_ms=split), 3)
    check_equal(sorted(e.id for e in got_early), sorted(e.id for e in early), "until_ms")
    start = min(e.appended_at_ms for e in early)
    window = await _query_all(env, Query(stream=stream, since_ms=start, until_ms=start), 3)
    check_equal(window, [], "an empty time window")


@case(rules=["trim.bound"], requires=["trim"])
async def case_trim_never_removes_unsettled(env: CaseEnv) -> None:
    """Without force, trim stops at the lowest frontier of the stream's groups."""
    stream = await env.stream()
    await env.append(stream, 6)
    await expect_error(InvalidArgument, env.rheo.trim(stream),
                       "trim without a bound on a stream without groups")
    fast = await env.fetch(stream, "fast", 4)
    slow = await env.fetch(stream, "slow", 4)
    await env.ack_ok(fast)
    await env.ack_ok(slow[:2])
    check_equal(await env.rheo.trim(stream, up_to=5), {0: 2}, "removed, capped at frontier 2")
    info = await env.rheo.stream_info(stream)
    check_equal((info.low_water[0], info.high_water[0]), (3, 6), "water marks after trim")
    check_equal([e.sequence async for e in env.rheo.stream_query(Query(stream=stream))],
                [3, 4, 5, 6], "retained events")
    await env.ack_ok(slow[2:])
    check_equal([lease.sequence for lease in await env.drain(stream, "slow")], [5, 6],
                "the slow group keeps its unsettled events")
    check_equal([lease.sequence for lease in await env.drain(stream, "fast")], [5, 6],
                "the fast group keeps its unsettled events")
    check_equal(await env.rheo.trim(stream), {0: 2}, "trim up to every group's frontier")


@case(rules=["trim.removed", "settle.fencing", "frontier.contiguous"], requires=["trim"])
async def case_trim_force_fences_and_skips(env: CaseEnv) -> None:
    """A forced trim removes events: never fetched again, their leases stale, frontier moved."""
    stream = await env.stream()
    await env.append(stream, 5)
    held = await env.fetch(stream, "g", 2)
    check_equal(await env.rheo.trim(stream, up_to={0: 3}, force=True), {0: 3}, "removed")
    check_results(await env.rheo.ack(held), held, [SettleKind.STALE_LEASE] * 2,
                  "leases on trimmed events")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3},
                "trimmed deliveries count as settled; 4 is not delivered yet")
    check_equal(await env.rheo.lag(stream, "g"), {0: 2}, "lag after the trim")
    check_equal([lease.sequence for lease in await env.drain(stream, "g")], [4, 5],
                "only retained events are delivered")
    check_equal([lease.sequence for lease in await env.drain(stream, "new")], [4, 5],
                "a group created after the trim starts at the low water")
    await env.rheo.reset(stream, "g", to="earliest")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "reset earliest after a trim")
    page = await env.rheo.query_page(Query(stream=stream, from_sequence=1))
    check_equal([e.sequence for e in page.events], [4, 5], "query skips trimmed events")


@case(rules=["trim.removed", "append.sequence"], requires=["trim"])
async def case_trim_sequences_not_reused(env: CaseEnv) -> None:
    """After trimming everything, new events continue the sequence."""
    stream = await env.stream_with(3, 2)
    check_equal(await env.rheo.trim(stream, up_to=10, force=True), {0: 3, 1: 2}, "removed")
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.high_water), {0: 3, 1: 2}, "high water survives the trim")
    check_equal(dict(info.low_water), {0: 4, 1: 3}, "low water is high water + 1")
    events = await env.append(stream, 2, partition=0)
    check_equal([e.sequence for e in events], [4, 5], "sequences after a trim")
    check_equal([lease.sequence for lease in await env.drain(stream, "g")], [4, 5],
                "a new group sees only the new events")


@case(rules=["trim.removed", "replay.from_sequence"], requires=["trim"])
async def case_replay_after_trim(env: CaseEnv) -> None:
    """Replay from before the low water re-delivers only the retained events."""
    stream = await env.stream()
    await env.append(stream, 5)
    await env.ack_ok(await env.drain(stream, "g"))
    check_equal(await env.rheo.trim(stream, up_to=2), {0: 2}, "removed")
    await env.rheo.replay(stream, "g", from_sequence=1)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "frontier after replay from 1")
    check_equal([lease.sequence for lease in await env.drain(stream, "g")], [3, 4, 5],
                "replayed retained events")


@case(rules=["trim.removed", "settle.nack", "lease.expiry"], requires=["trim"])
async def case_trim_keeps_redeliveries_past_its_bound(env: CaseEnv) -> None:
    """A forced trim forgets deliveries up to its bound and keeps the later ones.

    A nacked one at the bound is forgotten too; a nacked or expired delivery past
    the bound comes back."""
    stream = await env.stream()
    await env.append(stream, 6)
    leases = await env.fetch(stream, "g")
    nacked = [leases[1], leases[3]]
    check_results(await env.rheo.nack(nacked, "again"), nacked, [None, None], "nack 2 and 4")
    check_results(await env.rheo.renew(leases[4], lease_ms=env.short_ms), leases[4:5], [None],
                  "renew 5 to a short lease")
    check_equal(await env.rheo.trim(stream, up_to=2, force=True), {0: 2}, "trim 1 and 2")
    await env.expire()
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(4, 2), (5, 2)], "4 (nacked) and 5 (expired) come back, 2 not")
    await env.ack_ok([leases[2], leases[5], *again])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 6}, "frontier at the end")


@case(rules=["replay.from_sequence", "settle.ack", "lease.expiry"])
async def case_replay_keeps_redeliveries_before_its_start(env: CaseEnv) -> None:
    """A replay forgets deliveries from its start and keeps the earlier ones.

    A leased one at the start is forgotten too (its deadline with it); a nacked or
    expired delivery before the start comes back as a redelivery."""
    stream = await env.stream()
    await env.append(stream, 6)
    leases = await env.fetch(stream, "g")
    check_results(await env.rheo.nack(leases[0], "again"), leases[:1], [None], "nack 1")
    short = [leases[1], leases[3]]
    check_results(await env.rheo.renew(short, lease_ms=env.short_ms), short, [None, None],
                  "renew 2 and 4 to a short lease")
    await env.rheo.replay(stream, "g", from_sequence=4)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier after the replay")
    first = await env.fetch(stream, "g")
    check_equal(tried(first), [(1, 2), (4, 1), (5, 1), (6, 1)],
                "1 (nacked) comes back, 4..6 are delivered afresh")
    await env.ack_ok(first[1:2])
    await env.expire()
    second = await env.fetch(stream, "g")
    check_equal(tried(second), [(2, 2)],
                "2 (expired) comes back; 4, acked since the replay, does not")
    old = [leases[3], *leases[4:]]
    check_results(await env.rheo.ack(old), old, [SettleKind.STALE_LEASE] * 3,
                  "leases held over the replay")
    await env.ack_ok([leases[2], first[0], *first[2:], *second])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 6}, "frontier at the end")


@case(rules=["append.idempotent", "append.routing", "trim.removed"], requires=["trim"])
async def case_trimmed_id_is_new_again(env: CaseEnv) -> None:
    """An id whose event was trimmed is new again, in any partition.

    Appended in another partition, it goes where its record says, as a new event."""
    stream = await env.stream(2)
    [old] = await env.rheo.append(stream, [NewEvent("t", {"v": 1}, id="once", partition=0)])
    check_equal(await env.rheo.trim(stream, up_to={0: 1}, force=True), {0: 1}, "trim it")
    [new] = await env.rheo.append(stream, [NewEvent("t", {"v": 2}, id="once", partition=1)])
    check_equal((new.partition, new.sequence, new.data), (1, 1, {"v": 2}), "a new event")
    check(new.appended_at_ms >= old.appended_at_ms, "appended now")
    [same] = await env.rheo.append(stream, [NewEvent("t", {"v": 3}, id="once", partition=0)])
    check_equal(same, new, "the id is held again: the new event is returned")


@case(rules=["capabilities.declared"])
async def case_capabilities_declaration(env: CaseEnv) -> None:
    """The backend declares valid capabilities; contradictory declarations are refused."""
    caps = env.backend.capabilities
    check(isinstance(caps, Capabilities), "capabilities is a Capabilities instance")
    check_equal(Capabilities(**caps.as_dict()), caps, "the declaration validates again")
    check_equal(env.rheo.capabilities, caps, "the facade reports the backend's capabilities")
    check(isinstance(env.backend.name, str) and env.backend.name, "backend.name is set")
    _check_declared_arguments(env.backend)
    invalid: list[dict[str, Any]] = [
        {"durable": True, "distributed": True, "fenced_settle": False},
        {"durable": True, "distributed": False, "ordered_partitions": False},
        {"durable": False, "distributed": True},
        {"durable": False, "distributed": False, "skip_locked": True},
        {"durable": "yes", "distributed": False},
    ]
    for declaration in invalid:
        try:
            Capabilities(**declaration)
        except InvalidCapabilities:
            continue
        raise ConformanceFailure(f"Capabilities({declaration}) should raise InvalidCapabilities")


def _check_declared_arguments(backend: Backend) -> None:
    """A declared ``key_ordering`` or ``last_error`` comes with the argument that the
    facade, trusting the declaration, passes to the backend."""
    caps = backend.capabilities
    for declared, method, argument in ((caps.key_ordering, backend.create_group, "ordering"),
                                       (caps.last_error, backend.nack, "error"),
                                       (caps.last_error, backend.reject, "error")):
        if declared:
            check(argument in inspect.signature(method).parameters,
                  f"{method.__name__} takes {argument!r}, as its declared capability says")


@case(rules=["wakeup.append"], requires=["push_wakeups"])
async def case_wakeup_on_append(env: CaseEnv) -> None:
    """A backend with push wake-ups wakes a waiter when its stream gets an append."""
    stream = await env.stream()
    waiter = asyncio.create_task(env.rheo.wait_for_append(stream, 10.0))
    try:
        await _append_until_woken(env, stream, waiter, env.rheo)
    finally:
        waiter.cancel()


@case(rules=["wakeup.append"])
async def case_wait_for_append_times_out(env: CaseEnv) -> None:
    """wait_for_append on a quiet stream returns False after its timeout."""
    stream = await env.stream()
    check_equal(await env.rheo.wait_for_append(stream, 0.05), False, "wait on a quiet stream")


@case(rules=["wakeup.own_stream"], requires=["key_ordering"])
async def case_settles_releasing_nothing_wake_no_one(env: CaseEnv) -> None:
    """Settles in a key-ordered group that make nothing due leave a wait on the quiet
    stream to time out: an ack, a reject, a nack of keys with no later event."""
    stream = await env.stream()
    await env.rheo.create_group(stream, "g", ordering="key")
    await env.rheo.append(stream, [NewEvent("t", key=k, partition=0) for k in "abc"])
    one, two, three = await env.fetch(stream, "g")
    await env.ack_ok([one])
    check_results(await env.rheo.reject(two, "bad"), [two], [None], "reject 2")
    check_results(await env.rheo.nack(three, "later", delay_ms=env.long_ms), [three], [None],
                  "nack 3")
    check_equal(await env.rheo.wait_for_append(stream, 0.05), False, "wait on the quiet stream")


@case(rules=["trim.removed", "frontier.contiguous", "frontier.lag"], requires=["trim"])
async def case_trim_below_a_hole_walks_the_frontier(env: CaseEnv) -> None:
    """A forced trim below a hole moves the frontier over every settled delivery after it."""
    stream = await env.stream()
    await env.append(stream, 6)
    leases = await env.fetch(stream, "g")
    one, two, three, four, five, six = leases
    check_results(await env.rheo.reject(one, "bad"), [one], [None], "reject 1")
    await env.ack_ok([three, five])
    check_results(await env.rheo.reject(four, "bad"), [four], [None], "reject 4")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier with a hole at 2")
    check_equal(await env.rheo.trim(stream, up_to={0: 2}, force=True), {0: 2}, "removed")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 5},
                "frontier after trimming the hole: 3, 4 and 5 are settled")
    check_equal(await env.rheo.lag(stream, "g"), {0: 1}, "lag after the trim")
    check_equal([d.sequence for d in await env.rheo.dead_letters(stream, "g")], [4],
                "a trimmed dead letter is not listed")
    check_results(await env.rheo.ack([two, six]), [two, six], [SettleKind.STALE_LEASE, None],
                  "ack of the trimmed hole and of 6")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 6}, "frontier after acking 6")
    check_equal(await env.rheo.lag(stream, "g"), {0: 0}, "lag after acking 6")


@case(rules=["wakeup.own_stream"], requires=["push_wakeups"])
async def case_wait_for_append_ignores_other_streams(env: CaseEnv) -> None:
    """Appends to another stream do not wake a waiter; an append to its own stream does."""
    mine = await env.stream()
    other = await env.stream()
    waiter = asyncio.create_task(env.rheo.wait_for_append(mine, 10.0))
    loop = asyncio.get_running_loop()
    try:
        # The waiter must stay asleep through appends to the other stream (a quiet
        # window of real time is the only way to see that nothing happens).
        quiet_until = loop.time() + 0.4
        while loop.time() < quiet_until:
            await env.append(other, 1)
            await asyncio.wait({waiter}, timeout=0.05)
            check(not waiter.done(), "an append to another stream woke the waiter")
        await _append_until_woken(env, mine, waiter, env.rheo)
    finally:
        waiter.cancel()


@case(rules=["trim.removed", "append.idempotent", "settle.fencing"], requires=["trim"])
async def case_trim_edges(env: CaseEnv) -> None:
    """Trim at the bound: a repeated ack is stale, a trimmed id is new, other streams' groups."""
    decoy = await env.stream()
    await env.rheo.create_group(decoy, "g")
    stream = await env.stream()
    await env.rheo.append(stream, [NewEvent("t", {"n": i}, id=f"x{i}") for i in range(4)])
    leases = await env.fetch(stream, "g", 2)
    await env.ack_ok(leases)
    check_equal(await env.rheo.trim(stream, up_to=2), {0: 2}, "removed")
    check_results(await env.rheo.ack(leases), leases, [SettleKind.STALE_LEASE] * 2,
                  "repeating an ack of events trimmed at the bound")
    [again] = await env.rheo.append(stream, NewEvent("t", {"new": True}, id="x1"))
    check_equal((again.sequence, again.data), (5, {"new": True}),
                "a trimmed event's id appended again is a new event")
    check_equal(await env.rheo.trim(stream, up_to=3, force=True), {0: 1}, "forced trim of 3")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3},
                "the group's frontier after the trim (another stream has a group too)")
    check_equal([lease.sequence for lease in await env.drain(stream, "g")], [4, 5],
                "retained events after the trims")
    check_equal(await env.rheo.frontier(decoy, "g"), {0: 0}, "the other stream's group")


@case(rules=["wakeup.own_stream", "wakeup.append"], requires=["push_wakeups"])
async def case_waiters_do_not_block_each_other(env: CaseEnv) -> None:
    """A waiter that timed out does not keep another waiter of its stream from waking."""
    stream = await env.stream()
    short = asyncio.create_task(env.rheo.wait_for_append(stream, 0.05))
    long = asyncio.create_task(env.rheo.wait_for_append(stream, 10.0))
    try:
        check_equal(await short, False, "the short wait times out")
        await _append_until_woken(env, stream, long, env.rheo)
    finally:
        long.cancel()


@case(rules=["wakeup.append"], requires=["push_wakeups"], needs_peer=True)
async def case_wakeup_from_another_instance(env: CaseEnv) -> None:
    """An append through another instance over the same store wakes a waiter."""
    stream = await env.stream()
    async with env.peer() as other:
        waiter = asyncio.create_task(env.rheo.wait_for_append(stream, 10.0))
        try:
            await _append_until_woken(env, stream, waiter, other)
        finally:
            waiter.cancel()


async def _append_until_woken(env: CaseEnv, stream: str, waiter: asyncio.Task[bool],
                              through: Rheo) -> None:
    """Append to ``stream`` through ``through`` until ``waiter`` returns; it must say True."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10.0
    while not waiter.done():
        check(loop.time() < deadline, "no wake-up within 10 s of appending")
        await through.append(stream, NewEvent("t"))
        await asyncio.wait({waiter}, timeout=0.05)
    check_equal(waiter.result(), True, "wait_for_append woken by an append")


@case(rules=["trim.removed", "redrive.dead_letters_only", "dead_letters.listing"],
      requires=["trim"])
async def case_nothing_survives_a_trim(env: CaseEnv) -> None:
    """Trimmed dead letters are not listed and not redriven; trimmed leases and holes are gone."""
    stream = await env.stream_with(6, 2)
    p0 = await env.fetch(stream, "g", partitions=[0])
    p1 = await env.fetch(stream, "g", partitions=[1])
    check_results(await env.rheo.reject([p0[0], p0[1], p1[1]], "bad"), [p0[0], p0[1], p1[1]],
                  [None] * 3, "reject 1 and 2 of partition 0, 2 of partition 1")
    old = await env.rheo.dead_letters(stream, "g")
    check_equal(await env.rheo.trim(stream, up_to={0: 2}), {0: 2},
                "an unforced trim of the dead letters")
    check_equal([(d.partition, d.sequence) for d in await env.rheo.dead_letters(stream, "g")],
                [(1, 2)],
                "the other partition's dead letter is left")
    check_equal(await env.rheo.redrive(stream, "g", old[:2]), 0, "redrive of trimmed ones")
    check_results(await env.rheo.nack([p0[2], p0[4]], "again", delay_ms=0), [p0[2], p0[4]],
                  [None, None], "nack 3 and 5")
    await env.ack_ok([p0[5], p1[0]])
    check_equal(await env.rheo.trim(stream, up_to={0: 6, 1: 2}, force=True), {0: 4, 1: 2},
                "a forced trim of the rest")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "no dead letter is left")
    check_equal(await env.rheo.redrive(stream, "g"), 0, "redrive of everything")
    check_equal(await env.rheo.redrive(stream, "g", old), 0, "redrive of the old dead letters")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 6, 1: 2}, "frontier after the trim")
    check_equal(await env.rheo.lag(stream, "g"), {0: 0, 1: 0}, "lag after the trim")
    check_equal(await env.fetch(stream, "g"), [], "nothing is left to deliver")
    check_results(await env.rheo.ack(p0[3]), [p0[3]], [SettleKind.STALE_LEASE],
                  "the lease of a trimmed delivery")
    check_equal([g.group for g in await env.rheo.groups(stream)], ["g"], "the group stays")
    await env.append(stream, 1, partition=0)
    [fresh] = await env.fetch(stream, "g")
    check_equal((fresh.partition, fresh.sequence, fresh.attempt), (0, 7, 1), "a new event")
