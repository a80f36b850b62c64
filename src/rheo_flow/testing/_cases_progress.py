"""Cases about groups and progress: start positions, frontier, lag, dead letters, replay."""

from __future__ import annotations

from .._backend import DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_REASON
from .._query import Query
from .._settle import SettleKind
from ._case import CaseEnv, case, check, check_equal, check_results, positions

STALE = SettleKind.STALE_LEASE


@case()
async def case_create_group_idempotent(env: CaseEnv) -> None:
    """create_group is idempotent; max_attempts updates an existing group, start does not."""
    stream = await env.stream()
    await env.append(stream, 3)
    before = await env.now()
    info = await env.rheo.create_group(stream, "b")
    check_equal((info.stream, info.group, info.max_attempts), (stream, "b", DEFAULT_MAX_ATTEMPTS),
                "a new group's settings")
    check(info.created_at_ms >= before - env.margin_ms, "created_at_ms is the creation time")
    check_equal(await env.rheo.create_group(stream, "b", start="latest"), info,
                "create_group again returns the existing group")
    check_equal(await env.rheo.frontier(stream, "b"), {0: 0}, "start applies at creation only")
    updated = await env.rheo.create_group(stream, "b", max_attempts=7)
    check_equal(updated.max_attempts, 7, "max_attempts of an existing group is updated")
    check_equal(await env.rheo.group_info(stream, "b"), updated, "group_info")
    await env.rheo.create_group(stream, "c")
    await env.rheo.create_group(stream, "a")
    check_equal([g.group for g in await env.rheo.groups(stream)], ["a", "b", "c"],
                "groups sorted by name")


@case()
async def case_group_start_latest(env: CaseEnv) -> None:
    """A group created at "latest" only receives events appended afterwards."""
    stream = await env.stream(partitions=2)
    await env.append(stream, 3, partition=0)
    await env.append(stream, 1, partition=1)
    await env.rheo.create_group(stream, "late", start="latest")
    check_equal(await env.rheo.frontier(stream, "late"), {0: 3, 1: 1}, "frontier at creation")
    check_equal(await env.rheo.lag(stream, "late"), {0: 0, 1: 0}, "lag at creation")
    check_equal(await env.fetch(stream, "late"), [], "nothing to deliver")
    await env.append(stream, 2, partition=1)
    fresh = await env.fetch(stream, "late")
    check_equal(sorted(positions(fresh)), [(1, 2), (1, 3)], "only the new events")


@case()
async def case_group_start_sequence(env: CaseEnv) -> None:
    """A group created at a sequence receives the events after it (capped at the high water)."""
    stream = await env.stream()
    await env.append(stream, 5)
    await env.rheo.create_group(stream, "mid", start=2)
    check_equal(await env.rheo.frontier(stream, "mid"), {0: 2}, "frontier at start=2")
    check_equal([lease.sequence for lease in await env.drain(stream, "mid")], [3, 4, 5],
                "events after sequence 2")
    await env.rheo.create_group(stream, "far", start=50)
    check_equal(await env.rheo.frontier(stream, "far"), {0: 5}, "start beyond the high water")
    await env.append(stream, 1)
    check_equal([lease.sequence for lease in await env.drain(stream, "far")], [6],
                "events appended after a start beyond the high water")


@case()
async def case_groups_are_independent(env: CaseEnv) -> None:
    """Each group gets every event; consuming never deletes events."""
    stream = await env.stream(partitions=2)
    await env.append(stream, 2, partition=0)
    await env.append(stream, 2, partition=1)
    first = await env.drain(stream, "one")
    second = await env.drain(stream, "two")
    check_equal(sorted(positions(first)), sorted(positions(second)), "both groups get all")
    check_equal(len(first), 4, "events per group")
    await env.ack_ok(first)
    check_results(await env.rheo.nack(second, "r"), second, [None] * 4, "nack in group two")
    check_equal(await env.rheo.frontier(stream, "one"), {0: 2, 1: 2}, "frontier of group one")
    check_equal(await env.rheo.frontier(stream, "two"), {0: 0, 1: 0}, "frontier of group two")
    again = await env.drain(stream, "two")
    check_equal({lease.attempt for lease in again}, {2}, "group two redelivers")
    check_equal(await env.fetch(stream, "one"), [], "group one is done")
    events = [e async for e in env.rheo.stream_query(Query(stream=stream))]
    check_equal(len(events), 4, "acked events are still in the stream")
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.low_water), {0: 1, 1: 1}, "acking does not trim")
    fresh_stream = await env.stream()
    await env.append(fresh_stream, 1)
    check_equal(len(await env.fetch(fresh_stream, "one")), 1, "streams do not share groups")


@case()
async def case_frontier_contiguous_with_holes(env: CaseEnv) -> None:
    """The frontier is the highest S with 1..S all settled; a hole holds it back."""
    stream = await env.stream(partitions=3)
    await env.append(stream, 4, partition=0)
    await env.append(stream, 1, partition=2)
    await env.rheo.create_group(stream, "g")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0, 1: 0, 2: 0}, "initial frontier")
    l1, l2, l3, l4 = await env.fetch(stream, "g", partitions=[0])
    await env.ack_ok([l1, l3])
    check_equal((await env.rheo.frontier(stream, "g"))[0], 1, "hole at 2 (ack 1 and 3)")
    check_results(await env.rheo.reject(l4, "bad"), [l4], [None], "reject 4")
    check_equal((await env.rheo.frontier(stream, "g"))[0], 1, "hole at 2 (4 rejected)")
    check_results(await env.rheo.nack(l2, "r"), [l2], [None], "nack 2")
    check_equal((await env.rheo.frontier(stream, "g"))[0], 1, "a nacked delivery is a hole")
    [again] = await env.fetch(stream, "g", partitions=[0])
    await env.ack_ok([again])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4, 1: 0, 2: 0},
                "the frontier jumps over settled deliveries once the hole closes")


@case()
async def case_lag_is_high_water_minus_frontier(env: CaseEnv) -> None:
    """lag = high water - frontier per partition, holes included."""
    stream = await env.stream(partitions=2)
    await env.append(stream, 5, partition=0)
    await env.append(stream, 3, partition=1)
    await env.rheo.create_group(stream, "g")
    check_equal(await env.rheo.lag(stream, "g"), {0: 5, 1: 3}, "lag before consuming")
    p0 = await env.fetch(stream, "g", partitions=[0])
    p1 = await env.fetch(stream, "g", partitions=[1])
    await env.ack_ok(p0[:2])
    await env.ack_ok(p1[1:2])
    check_equal(await env.rheo.lag(stream, "g"), {0: 3, 1: 3}, "lag with a hole in partition 1")
    await env.ack_ok(p0[2:] + p1[:1] + p1[2:])
    check_equal(await env.rheo.lag(stream, "g"), {0: 0, 1: 0}, "lag after acking all")
    await env.append(stream, 2, partition=1)
    check_equal(await env.rheo.lag(stream, "g"), {0: 0, 1: 2}, "lag after new appends")


@case()
async def case_dead_letters_pagination(env: CaseEnv) -> None:
    """dead_letters pages by (partition, sequence) without duplicates or gaps."""
    stream = await env.stream(partitions=2)
    await env.append(stream, 4, partition=0)
    await env.append(stream, 3, partition=1)
    leases = await env.drain(stream, "g", limit=3)
    rejected = [lease for lease in leases if (lease.partition, lease.sequence) != (0, 2)]
    acked = [lease for lease in leases if (lease.partition, lease.sequence) == (0, 2)]
    await env.ack_ok(acked)
    check_results(await env.rheo.reject(rejected, "bad"), rejected, [None] * 6, "reject")
    expected = sorted(positions(rejected))
    pages: list[list[tuple[int, int]]] = []
    after = None
    for _ in range(10):
        page = await env.rheo.dead_letters(stream, "g", limit=4, after=after)
        if not page:
            break
        pages.append([(d.partition, d.sequence) for d in page])
        after = page[-1]
    check_equal([len(p) for p in pages], [4, 2], "page sizes with limit=4")
    check_equal([p for page in pages for p in page], expected, "dead letters in order")


@case()
async def case_dead_letters_keep_the_last_error(env: CaseEnv) -> None:
    """Dead letters keep the last error of a nack or reject, through max attempts and expiry.

    Checked for an explicit reject, max attempts via nack and max attempts via lease
    expiry after a nack; a settle without an error keeps the earlier one; redrive
    forgets it.
    """
    stream = await env.stream()
    await env.append(stream, 4)
    await env.rheo.create_group(stream, "g", max_attempts=2)
    leases = await env.fetch(stream, "g", limit=4)
    check_equal([lease.sequence for lease in leases], [1, 2, 3, 4], "first attempts")
    one, two, three, four = leases
    long = "ValueError: " + "x" * 988
    check_results(await env.rheo.reject(one, "bad input", error="KeyError: 'sku'"), [one],
                  [None], "reject with an error")
    check_results(await env.rheo.nack(two, "handler_error", error="TimeoutError: first"),
                  [two], [None], "nack with an error")
    check_results(await env.rheo.nack(three, "handler_error", error=long), [three], [None],
                  "nack with a 1,000-character error")
    check_results(await env.rheo.nack(four, "shutdown"), [four], [None], "nack without error")
    again = await env.fetch(stream, "g", limit=4, lease_ms=env.short_ms)
    check_equal([(lease.sequence, lease.attempt) for lease in again], [(2, 2), (3, 2), (4, 2)],
                "second attempts")
    two, three, four = again
    # The last nack's error replaces the earlier one; a nack without one keeps it.
    check_results(await env.rheo.nack(two, "handler_error", error="RuntimeError: last"),
                  [two], [None], "nack at max attempts with an error")
    check_results(await env.rheo.nack(four, "handler_error"), [four], [None],
                  "nack at max attempts without an error")
    await env.expire()  # three's lease runs out at its last attempt
    check_equal(await env.fetch(stream, "g"), [], "nothing left to deliver")
    dead = await env.rheo.dead_letters(stream, "g")
    check_equal([(d.sequence, d.reason, d.last_error) for d in dead],
                [(1, "bad input", "KeyError: 'sku'"),
                 (2, MAX_ATTEMPTS_REASON, "RuntimeError: last"),
                 (3, MAX_ATTEMPTS_REASON, long),
                 (4, MAX_ATTEMPTS_REASON, None)],
                "dead letters with their last errors")
    check_equal(await env.rheo.redrive(stream, "g", dead[:2]), 2, "redrive two")
    redriven = await env.fetch(stream, "g", limit=4)
    check_equal([lease.sequence for lease in redriven], [1, 2], "redelivered")
    check_results(await env.rheo.reject(redriven, "again"), redriven, [None, None],
                  "reject without an error")
    check_equal([(d.sequence, d.last_error) for d in await env.rheo.dead_letters(stream, "g")],
                [(1, None), (2, None), (3, long), (4, None)],
                "a redrive forgets the last error")


@case()
async def case_redrive_all_and_selected(env: CaseEnv) -> None:
    """redrive makes dead letters deliverable again (attempt 1); their old leases are stale."""
    stream = await env.stream()
    await env.append(stream, 3)
    leases = await env.fetch(stream, "g")
    check_results(await env.rheo.reject(leases, "bad"), leases, [None] * 3, "reject")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "frontier after rejects")
    dead = await env.rheo.dead_letters(stream, "g")
    check_equal(await env.rheo.redrive(stream, "g", [dead[1]]), 1, "redrive one")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier after redriving 2")
    check_equal([d.sequence for d in await env.rheo.dead_letters(stream, "g")], [1, 3],
                "dead letters left")
    check_results(await env.rheo.reject(leases[1], "bad"), leases[1:2], [STALE],
                  "the rejected lease after a redrive")
    [again] = await env.fetch(stream, "g")
    check_equal((again.sequence, again.attempt), (2, 1), "a redriven delivery starts over")
    await env.ack_ok([again])
    check_equal(await env.rheo.redrive(stream, "g"), 2, "redrive the rest")
    rest = await env.fetch(stream, "g")
    check_equal([(lease.sequence, lease.attempt) for lease in rest], [(1, 1), (3, 1)],
                "the rest redelivered")
    await env.ack_ok(rest)
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "no dead letters left")
    check_equal(await env.rheo.redrive(stream, "g"), 0, "nothing to redrive")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "final frontier")


@case()
async def case_replay_from_sequence(env: CaseEnv) -> None:
    """replay re-delivers from a sequence (attempt 1), fences old leases, copies nothing."""
    stream = await env.stream()
    await env.append(stream, 5)
    leases = await env.fetch(stream, "g")
    await env.ack_ok(leases[:4])
    await env.drain(stream, "other")
    await env.rheo.replay(stream, "g", from_sequence=3)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "frontier after replay from 3")
    check_results(await env.rheo.ack(leases[4]), leases[4:], [STALE], "a lease held over replay")
    check_results(await env.rheo.ack(leases[2]), leases[2:3], [STALE],
                  "repeating an ack of a replayed delivery")
    again = await env.fetch(stream, "g")
    check_equal([(lease.sequence, lease.attempt) for lease in again], [(3, 1), (4, 1), (5, 1)],
                "replayed deliveries")
    check_equal([lease.event for lease in again], [lease.event for lease in leases[2:]],
                "replay delivers the same events")
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.high_water), {0: 5}, "replay copies no events")
    check_equal(await env.rheo.frontier(stream, "other"), {0: 0}, "other groups unaffected")
    await env.ack_ok(again)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 5}, "frontier after re-acking")


@case()
async def case_replay_selected_partitions(env: CaseEnv) -> None:
    """replay(partitions=[...]) only re-drives those partitions."""
    stream = await env.stream(partitions=2)
    await env.append(stream, 3, partition=0)
    await env.append(stream, 3, partition=1)
    await env.ack_ok(await env.drain(stream, "g"))
    await env.rheo.replay(stream, "g", from_sequence=2, partitions=[1])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3, 1: 1}, "frontier after replay")
    again = await env.drain(stream, "g")
    check_equal(sorted(positions(again)), [(1, 2), (1, 3)], "replayed deliveries")


@case()
async def case_reset_positions(env: CaseEnv) -> None:
    """reset to a sequence, "earliest" or "latest" sets what is left to deliver; fences leases."""
    stream = await env.stream()
    await env.append(stream, 6)
    leases = await env.fetch(stream, "g", 4)
    await env.ack_ok(leases[:2])
    await env.rheo.reset(stream, "g", to=4)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4}, "frontier after reset to 4")
    check_results(await env.rheo.ack(leases[2:]), leases[2:], [STALE, STALE],
                  "leases held over a reset")
    after_four = await env.drain(stream, "g")
    check_equal([(lease.sequence, lease.attempt) for lease in after_four], [(5, 1), (6, 1)],
                "after reset to 4")
    await env.rheo.reset(stream, "g", to="earliest")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier after reset earliest")
    check_results(await env.rheo.ack(after_four), after_four, [STALE, STALE],
                  "leases held over reset earliest")
    everything = await env.drain(stream, "g")
    check_equal([(lease.sequence, lease.attempt) for lease in everything],
                [(s, 1) for s in range(1, 7)], "after reset earliest")
    await env.rheo.reset(stream, "g", to="latest")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 6}, "frontier after reset latest")
    check_equal(await env.rheo.lag(stream, "g"), {0: 0}, "lag after reset latest")
    check_equal(await env.fetch(stream, "g"), [], "nothing after reset latest")
    await env.append(stream, 1)
    check_equal([lease.sequence for lease in await env.drain(stream, "g")], [7],
                "new events after reset latest")
    await env.rheo.reset(stream, "g", to=100)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 7}, "reset beyond the high water")
