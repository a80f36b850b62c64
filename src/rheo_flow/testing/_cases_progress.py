"""Cases about groups and progress: start positions, frontier, lag, dead letters, replay."""

from __future__ import annotations

from .._backend import DEFAULT_MAX_ATTEMPTS, MAX_ATTEMPTS_REASON
from .._model._event import NewEvent
from .._model._query import Query
from .._model._settle_results import SettleKind
from .._model._stream import GroupInfo
from ._case import CaseEnv, case, check, check_equal, check_results, positions, states, tried

STALE = SettleKind.STALE_LEASE


@case(rules=["group.lifecycle"])
async def case_create_group_idempotent(env: CaseEnv) -> None:
    """create_group is idempotent; max_attempts updates an existing group, start does not."""
    stream = await env.stream()
    await env.append(stream, 3)
    before = await env.now()
    info = await env.rheo.create_group(stream, "b")
    after = await env.now()
    check_equal((info.stream, info.group, info.max_attempts), (stream, "b", DEFAULT_MAX_ATTEMPTS),
                "a new group's settings")
    check(before - env.margin_ms <= info.created_at_ms <= after + env.margin_ms,
          f"created_at_ms {info.created_at_ms} is the creation time ({before}..{after})")
    check_equal(await env.rheo.create_group(stream, "b", start="latest"), info,
                "create_group again returns the existing group")
    check_equal(await env.rheo.frontier(stream, "b"), {0: 0}, "start applies at creation only")
    updated = await env.rheo.create_group(stream, "b", max_attempts=7)
    check_equal(updated, GroupInfo(stream, "b", 7, info.created_at_ms),
                "max_attempts of an existing group is updated, nothing else")
    check_equal(await env.rheo.group_info(stream, "b"), updated, "group_info")
    check_equal(await env.rheo.groups(stream), [updated], "groups lists the whole GroupInfo")
    await env.rheo.create_group(stream, "c")
    await env.rheo.create_group(stream, "a")
    check_equal([g.group for g in await env.rheo.groups(stream)], ["a", "b", "c"],
                "groups sorted by name")


@case(rules=["group.lifecycle", "attempts.max"])
async def case_updated_max_attempts_applies(env: CaseEnv) -> None:
    """A max_attempts given for an existing group governs it from then on.

    In every partition: raised from 1 to 2, a nack at attempt 1 sends the delivery
    back."""
    stream = await env.stream(2)
    await env.rheo.create_group(stream, "g", max_attempts=1)
    await env.rheo.append(stream, [NewEvent("t", partition=p) for p in (0, 1)])
    first = await env.fetch(stream, "g")
    await env.rheo.create_group(stream, "g", max_attempts=2)
    check_results(await env.rheo.nack(first, "again"), first, [None, None], "nack at attempt 1")
    again = await env.fetch(stream, "g")
    check_equal(sorted((x.partition, x.attempt) for x in again), [(0, 2), (1, 2)],
                "both come back for their second attempt")
    check_results(await env.rheo.nack(again, "again"), again, [None, None], "nack at attempt 2")
    dead = await env.rheo.dead_letters(stream, "g")
    check_equal(sorted((d.partition, d.attempts, d.reason) for d in dead),
                [(0, 2, MAX_ATTEMPTS_REASON), (1, 2, MAX_ATTEMPTS_REASON)], "then they die")


@case(rules=["group.start"])
async def case_group_start_latest(env: CaseEnv) -> None:
    """A group created at "latest" only receives events appended afterwards."""
    stream = await env.stream_with(3, 1)
    await env.rheo.create_group(stream, "late", start="latest")
    check_equal(await env.rheo.frontier(stream, "late"), {0: 3, 1: 1}, "frontier at creation")
    check_equal(await env.rheo.lag(stream, "late"), {0: 0, 1: 0}, "lag at creation")
    check_equal(await env.fetch(stream, "late"), [], "nothing to deliver")
    await env.append(stream, 2, partition=1)
    fresh = await env.fetch(stream, "late")
    check_equal(sorted(positions(fresh)), [(1, 2), (1, 3)], "only the new events")


@case(rules=["group.start"])
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


@case(rules=["group.independent"])
async def case_groups_are_independent(env: CaseEnv) -> None:
    """Each group gets every event; consuming never deletes events."""
    stream = await env.stream_with(2, 2)
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


@case(rules=["frontier.contiguous"])
async def case_frontier_contiguous_with_holes(env: CaseEnv) -> None:
    """The frontier is the highest S with 1..S all settled; a hole holds it back."""
    stream = await env.stream_with(4, 0, 1)
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


@case(rules=["frontier.lag"])
async def case_lag_is_high_water_minus_frontier(env: CaseEnv) -> None:
    """lag = high water - frontier per partition, holes included."""
    stream = await env.stream_with(5, 3)
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
    check_equal((list(await env.rheo.lag(stream, "g")), list(await env.rheo.frontier(stream, "g"))),
                ([0, 1], [0, 1]), "lag and frontier list the partitions in order")


@case(rules=["dead_letters.listing"])
async def case_dead_letters_pagination(env: CaseEnv) -> None:
    """dead_letters pages by (partition, sequence) without duplicates or gaps."""
    stream = await env.stream_with(4, 3)
    leases = await env.drain(stream, "g", limit=3)
    rejected = [lease for lease in leases if (lease.partition, lease.sequence) != (0, 2)]
    acked = [lease for lease in leases if (lease.partition, lease.sequence) == (0, 2)]
    await env.ack_ok(acked)
    check_results(await env.rheo.reject(rejected, "bad"), rejected, [None] * 6, "reject")
    expected = sorted(positions(rejected))
    pages = await _dead_letter_pages(env, stream, "g", 4, max_pages=10)
    check_equal([len(p) for p in pages], [4, 2], "page sizes with limit=4")
    check_equal([p for page in pages for p in page], expected, "dead letters in order")


async def _dead_letter_pages(env: CaseEnv, stream: str, group: str, size: int, *,
                             max_pages: int) -> list[list[tuple[int, int]]]:
    """Page through a group's dead letters ``size`` at a time; positions per page."""
    pages: list[list[tuple[int, int]]] = []
    after = None
    for _ in range(max_pages):
        page = await env.rheo.dead_letters(stream, group, limit=size, after=after)
        check(len(page) <= size, f"a page of limit {size} holds {len(page)}")
        if not page:
            break
        pages.append([(d.partition, d.sequence) for d in page])
        after = page[-1]
    return pages


@case(rules=["settle.last_error"])
async def case_dead_letters_keep_the_last_error(env: CaseEnv) -> None:
    """Dead letters keep the last error of a nack or reject, through max attempts and expiry.

    Checked for an explicit reject, max attempts via nack and max attempts via lease
    expiry after a nack; a settle without an error keeps the earlier one; redrive
    forgets it.
    """
    check(env.backend.capabilities.last_error, "the backend declares last_error "
          "(without it the facade never passes nack's and reject's error)")
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
    check_equal(tried(again), [(2, 2), (3, 2), (4, 2)],
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


@case(rules=["redrive.dead_letters_only", "settle.fencing"])
async def case_redrive_all_and_selected(env: CaseEnv) -> None:
    """redrive makes dead letters deliverable again (attempt 1); their old leases are stale.

    The events share a key, which orders nothing in this (unordered) group."""
    stream = await env.stream()
    await env.append(stream, 3, key="a")
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
    check_equal(tried(rest), [(1, 1), (3, 1)],
                "the rest redelivered")
    await env.ack_ok(rest)
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "no dead letters left")
    check_equal(await env.rheo.redrive(stream, "g"), 0, "nothing to redrive")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "final frontier")


@case(rules=["replay.from_sequence", "settle.fencing"])
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
    check_equal(tried(again), [(3, 1), (4, 1), (5, 1)],
                "replayed deliveries")
    check_equal([lease.event for lease in again], [lease.event for lease in leases[2:]],
                "replay delivers the same events")
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.high_water), {0: 5}, "replay copies no events")
    check_equal(await env.rheo.frontier(stream, "other"), {0: 0}, "other groups unaffected")
    await env.ack_ok(again)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 5}, "frontier after re-acking")
    await env.rheo.replay(stream, "g", from_sequence=5)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4}, "frontier after replay from 5")
    check_equal(tried(await env.fetch(stream, "g")), [(5, 1)],
                "replay from the last event read re-delivers it")
    await env.append(stream, 3)
    check_equal([x.sequence for x in await env.fetch(stream, "g", 1)], [6], "one more read")
    await env.rheo.replay(stream, "g", from_sequence=8)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4},
                "replay from past what the group read moves no frontier")
    check_equal(tried(await env.fetch(stream, "g")),
                [(7, 1), (8, 1)], "nothing skipped, nothing repeated")


@case(rules=["replay.from_sequence", "settle.fencing", "redrive.dead_letters_only",
             "frontier.contiguous"])
async def case_replay_forgets_every_kind_of_delivery(env: CaseEnv) -> None:
    """A replay from the first event, or from the second, forgets what each delivery
    went through: a nack, a dead letter, an ack, a renewal; none is left to redrive."""
    for start in (1, 2):
        stream = await env.stream()
        await env.append(stream, 5)
        leases = await env.fetch(stream, "g")
        check_results(await env.rheo.nack(leases[1], "again", delay_ms=0), leases[1:2], [None],
                      f"from {start}: nack 2")
        [two] = await env.fetch(stream, "g")
        check_results(await env.rheo.reject(leases[2], "bad", error="E"), leases[2:3], [None],
                      f"from {start}: reject 3")
        check_results(await env.rheo.renew(leases[3]), leases[3:4], [None],
                      f"from {start}: renew 4")
        await env.ack_ok([leases[0], leases[4]])
        await env.rheo.replay(stream, "g", from_sequence=start)
        check_equal(await env.rheo.frontier(stream, "g"), {0: start - 1},
                    f"from {start}: frontier")
        check_equal(await env.rheo.dead_letters(stream, "g"), [], f"from {start}: dead letters")
        check_equal(await env.rheo.redrive(stream, "g"), 0, f"from {start}: nothing to redrive")
        old = [two, leases[3]]
        check_results(await env.rheo.ack(old), old, [STALE, STALE], f"from {start}: old leases")
        again = await env.fetch(stream, "g")
        check_equal(tried(again),
                    [(n, 1) for n in range(start, 6)], f"from {start}: every one once more")
        await env.ack_ok(again)
        check_equal(await env.rheo.frontier(stream, "g"), {0: 5}, f"from {start}: at the end")


@case(rules=["replay.from_sequence"])
async def case_replay_selected_partitions(env: CaseEnv) -> None:
    """replay(partitions=[...]) only re-drives those partitions."""
    stream = await env.stream_with(3, 3)
    await env.ack_ok(await env.drain(stream, "g"))
    await env.rheo.replay(stream, "g", from_sequence=2, partitions=[1])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3, 1: 1}, "frontier after replay")
    again = await env.drain(stream, "g")
    check_equal(sorted(positions(again)), [(1, 2), (1, 3)], "replayed deliveries")


@case(rules=["reset.position", "settle.fencing"])
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
    check_equal(tried(after_four), [(5, 1), (6, 1)],
                "after reset to 4")
    await env.rheo.reset(stream, "g", to="earliest")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier after reset earliest")
    check_results(await env.rheo.ack(after_four), after_four, [STALE, STALE],
                  "leases held over reset earliest")
    everything = await env.drain(stream, "g")
    check_equal(tried(everything),
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


@case(rules=["reset.position", "frontier.contiguous", "trim.bound"])
async def case_reset_forgets_dead_letters(env: CaseEnv) -> None:
    """reset forgets a partition's dead letters; its frontier is the position, trim-safe."""
    stream = await env.stream_with(5, 3)
    p0 = await env.fetch(stream, "g", partitions=[0])
    p1 = await env.fetch(stream, "g", partitions=[1])
    await env.ack_ok([p0[0], p0[2], p1[0]])
    check_results(await env.rheo.reject([p0[1], p0[3], p1[1]], "bad"), [p0[1], p0[3], p1[1]],
                  [None] * 3, "reject")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4, 1: 2}, "frontier before reset")
    await env.rheo.reset(stream, "g", to=3, partitions=[0])
    check_equal([(d.partition, d.sequence) for d in await env.rheo.dead_letters(stream, "g")],
                [(1, 2)], "dead letters after resetting partition 0")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3, 1: 2}, "frontier after reset")
    check_equal(await env.rheo.lag(stream, "g"), {0: 2, 1: 1}, "lag after reset")
    check_results(await env.rheo.reject(p0[3], "bad"), [p0[3]], [STALE],
                  "repeating a reject from before the reset")
    if env.backend.capabilities.trim:
        check_equal(await env.rheo.trim(stream, up_to={0: 5}), {0: 3},
                    "an unforced trim after the reset stops at the frontier")
    again = await env.drain(stream, "g", partitions=[0])
    check_equal(tried(again), [(4, 1), (5, 1)],
                "deliveries after the position start over")
    await env.ack_ok(again)
    check_equal(await env.rheo.redrive(stream, "g"), 1, "only the other partition's dead letter")

    await env.rheo.reset(stream, "g", to="earliest")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "dead letters after reset earliest")
    trimmed = 3 if env.backend.capabilities.trim else 0
    check_equal(await env.rheo.frontier(stream, "g"), {0: trimmed, 1: 0},
                "frontier after reset earliest: the low water - 1")
    everything = await env.drain(stream, "g")
    check_equal(states(everything),
                [(0, s, 1) for s in range(trimmed + 1, 6)] + [(1, s, 1) for s in (1, 2, 3)],
                "every retained event is delivered again, first attempts")


@case(rules=["redrive.dead_letters_only"])
async def case_redrive_touches_only_dead_letters(env: CaseEnv) -> None:
    """redrive leaves acked, available and leased deliveries alone; a second run re-drives none.

    A dead letter listed twice in one call is re-driven (and counted) once."""
    stream = await env.stream()
    await env.append(stream, 4)
    leases = await env.fetch(stream, "g")
    check_results(await env.rheo.reject(leases, "bad"), leases, [None] * 4, "reject all")
    dead = await env.rheo.dead_letters(stream, "g")
    check_equal(await env.rheo.redrive(stream, "g", [dead[0], dead[0]]), 1,
                "redrive 1, listed twice: re-driven once")
    [one] = await env.fetch(stream, "g")
    check_equal((one.sequence, one.attempt), (1, 1), "the re-driven delivery, once")
    await env.ack_ok([one])
    check_equal(await env.rheo.redrive(stream, "g", dead[:2]), 1,
                "redrive of 1 (now acked) and 2 re-drives 2 only")
    [two] = await env.fetch(stream, "g")
    check_equal((two.sequence, two.attempt), (2, 1), "the re-driven delivery")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier with 2 leased")
    check_equal(await env.rheo.redrive(stream, "g", dead[:2]), 0, "the same redrive again")
    check_results(await env.rheo.renew(two), [two], [None],
                  "the lease of a re-driven delivery survives a second redrive")
    check_equal(await env.rheo.redrive(stream, "g", dead[2:3]), 1, "redrive 3")
    [three] = await env.fetch(stream, "g")
    check_results(await env.rheo.nack(three, "later", delay_ms=0), [three], [None], "nack 3")
    check_equal(await env.rheo.redrive(stream, "g", dead[2:3]), 0,
                "redrive of a delivery that is available")
    [three_again] = await env.fetch(stream, "g")
    check_equal((three_again.sequence, three_again.attempt), (3, 2),
                "an available delivery keeps its attempts through a redrive")
    await env.ack_ok([two, three_again])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4}, "frontier: 4 is still rejected")
    check_equal(await env.rheo.redrive(stream, "g", dead), 1, "redrive every old dead letter")
    [four] = await env.fetch(stream, "g")
    check_equal((four.sequence, four.attempt), (4, 1), "only 4 was re-driven")
    check_equal(await env.rheo.redrive(stream, "g"), 0, "redrive all with none left")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "frontier with 4 leased")


@case(rules=["dead_letters.listing"])
async def case_dead_letters_paging_every_size(env: CaseEnv) -> None:
    """Paging dead letters over several partitions gives each once, in order, at every size."""
    stream = await env.stream_with(4, 2, 3)
    leases = await env.drain(stream, "g")
    kept = {(0, 3), (1, 1), (1, 2)}
    await env.ack_ok([lease for lease in leases if (lease.partition, lease.sequence) in kept])
    rejected = [lease for lease in leases if (lease.partition, lease.sequence) not in kept]
    await env.rheo.reject(rejected, "bad")
    expected = [(0, 1), (0, 2), (0, 4), (2, 1), (2, 2), (2, 3)]
    listed = await env.rheo.dead_letters(stream, "g")
    check_equal([(d.partition, d.sequence) for d in listed], expected, "every dead letter")
    check_equal({d.event_id for d in listed},
                {lease.event.id for lease in rejected}, "dead letters name their events")
    for size in range(1, len(expected) + 2):
        pages = await _dead_letter_pages(env, stream, "g", size, max_pages=len(expected) + 2)
        got = [p for page in pages for p in page]
        check_equal(got, expected, f"dead letters paged by {size}")


@case(rules=["dead_letters.rejected_at", "attempts.max"])
async def case_dead_letter_times_by_path(env: CaseEnv) -> None:
    """rejected_at_ms is the reject's time, the nack's time, or after an expired deadline."""
    stream = await env.stream()
    await env.append(stream, 3)
    await env.rheo.create_group(stream, "g", max_attempts=1)
    rejected, nacked, expired = await env.fetch(stream, "g", lease_ms=env.long_ms)
    await env.advance(env.short_ms)
    t0 = await env.now()
    await env.rheo.reject(rejected, "bad")
    t1 = await env.now()
    await env.advance(env.short_ms)
    t2 = await env.now()
    await env.rheo.nack(nacked, "failed")
    t3 = await env.now()
    renewed = await env.rheo.renew(expired, lease_ms=env.short_ms)
    deadline = renewed[0].deadline_ms or 0
    await env.expire()
    await env.advance(env.short_ms)
    check_equal(await env.fetch(stream, "g"), [], "nothing to redeliver at max attempts")
    t4 = await env.now()
    dead = {d.sequence: d for d in await env.rheo.dead_letters(stream, "g")}
    check_equal(sorted(dead), [1, 2, 3], "dead letters")
    margin = env.margin_ms
    for sequence, low, high, path in ((1, t0, t1, "an explicit reject"),
                                      (2, t2, t3, "a nack at max attempts"),
                                      (3, deadline, t4, "an expiry at max attempts")):
        stamp = dead[sequence].rejected_at_ms
        check(low - margin <= stamp <= high + margin,
              f"rejected_at_ms of {path} is {stamp}, expected {low}..{high}")
    check_equal(dead[2].reason, MAX_ATTEMPTS_REASON, "reason of a nack at max attempts")
    check_equal(dead[3].reason, MAX_ATTEMPTS_REASON, "reason of an expiry at max attempts")


@case(rules=["redrive.dead_letters_only", "frontier.contiguous", "frontier.lag"])
async def case_redrive_reopens_the_frontier(env: CaseEnv) -> None:
    """A re-driven delivery is a hole again: later settles do not carry the frontier past it."""
    stream = await env.stream()
    await env.append(stream, 3)
    one, two, three = await env.fetch(stream, "g")
    check_results(await env.rheo.reject(two, "bad"), [two], [None], "reject 2")
    await env.ack_ok([one, three])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "frontier before the redrive")
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier after the redrive")
    [again] = await env.fetch(stream, "g")
    check_equal((again.sequence, again.attempt), (2, 1), "the re-driven delivery")
    await env.append(stream, 1)
    await env.ack_ok(await env.fetch(stream, "g"))
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "2 is still a hole")
    check_equal(await env.rheo.lag(stream, "g"), {0: 3}, "lag with the hole")
    await env.ack_ok([again])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4}, "frontier once 2 is acked")


@case(rules=["redrive.dead_letters_only", "frontier.contiguous"])
async def case_redrive_above_a_leased_hole(env: CaseEnv) -> None:
    """Redriving a dead letter above a leased delivery keeps the frontier below that hole."""
    stream = await env.stream_with(5, 3)
    one, two, three, four, five = await env.fetch(stream, "g", partitions=[0])
    others = await env.fetch(stream, "g", partitions=[1])
    await env.ack_ok([one, four, *others])
    check_results(await env.rheo.reject([three, five], "bad"), [three, five], [None, None],
                  "reject 3 and 5")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1, 1: 3}, "2 is leased: a hole")
    dead = await env.rheo.dead_letters(stream, "g")
    check_equal(await env.rheo.redrive(stream, "g", dead[:1]), 1, "redrive 3")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1, 1: 3},
                "the frontier stays below the leased 2, not below the redriven 3")
    check_equal(await env.rheo.lag(stream, "g"), {0: 4, 1: 0}, "lag")
    await env.ack_ok([two])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2, 1: 3}, "3 is a hole now")
    [again] = await env.fetch(stream, "g")
    check_equal((again.sequence, again.attempt), (3, 1), "the redriven delivery")
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive 5 while 3 is leased")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2, 1: 3}, "still below the leased 3")
    await env.ack_ok([again])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4, 1: 3}, "5 is a hole now")
    await env.ack_ok(await env.fetch(stream, "g"))
    check_equal(await env.rheo.frontier(stream, "g"), {0: 5, 1: 3}, "final frontier")


@case(rules=["redrive.dead_letters_only", "frontier.contiguous", "group.independent"])
async def case_redrive_frontier_ignores_other_groups(env: CaseEnv) -> None:
    """A redrive lowers its group's frontier to just below the re-driven letter,
    whatever another group holds lower in the partition; a partition's only event
    re-drives like any other."""
    stream = await env.stream_with(4)
    [held] = await env.fetch(stream, "b", 1)  # b holds (0, 1)
    leases = await env.fetch(stream, "a")
    await env.ack_ok(leases[:3])
    check_results(await env.rheo.reject(leases[3], "bad"), [leases[3]], [None], "a rejects 4")
    check_equal(await env.rheo.frontier(stream, "a"), {0: 4}, "a's frontier past its letter")
    check_equal(await env.rheo.redrive(stream, "a"), 1, "a re-drives 4")
    check_equal(await env.rheo.frontier(stream, "a"), {0: 3}, "a's frontier just below 4")
    check_equal(await env.rheo.frontier(stream, "b"), {0: 0}, "b's frontier")
    await env.ack_ok([held])
    single = await env.stream_with(1)
    [only] = await env.fetch(single, "g")
    check_results(await env.rheo.reject(only, "bad"), [only], [None], "reject the only event")
    check_equal(await env.rheo.redrive(single, "g"), 1, "the only event re-driven")
    check_equal(tried(await env.fetch(single, "g")), [(1, 1)],
                "the only event again, a first attempt")
