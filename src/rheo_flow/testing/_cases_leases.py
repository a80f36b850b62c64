"""Cases about leases: fetch, exclusivity, fencing, settle results, renew, expiry, nack."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from .._backend import MAX_ATTEMPTS_REASON
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._settle_results import SettleKind
from ._case import CaseEnv, case, check, check_equal, check_results, positions, tried

STALE = SettleKind.STALE_LEASE


@case(rules=["fetch.limit"])
async def case_fetch_respects_limit(env: CaseEnv) -> None:
    """fetch returns at most ``limit`` leases, and all available work up to it."""
    stream = await env.stream(partitions=3)
    await env.rheo.append(stream, [NewEvent("t", key=f"k{i}") for i in range(10)])
    first = await env.fetch(stream, "g", 3)
    check_equal(len(first), 3, "leases from fetch(limit=3) with 10 available")
    one = await env.fetch(stream, "g", 1)
    check_equal(len(one), 1, "leases from fetch(limit=1)")
    rest = await env.fetch(stream, "g", 100)
    check_equal(len(rest), 6, "leases from fetch(limit=100) with 6 left")
    check_equal(await env.fetch(stream, "g", 100), [], "fetch with everything leased")
    check_equal(len(set(positions(first + one + rest))), 10, "distinct events leased")


@case(rules=["fetch.partitions"])
async def case_fetch_partition_filter(env: CaseEnv) -> None:
    """fetch(partitions=[...]) only leases events of those partitions."""
    stream = await env.stream(partitions=3)
    for p in range(3):
        await env.append(stream, 4, partition=p)
    only_one = await env.drain(stream, "g", limit=3, partitions=[1])
    check_equal(sorted(positions(only_one)), [(1, s) for s in range(1, 5)],
                "leases of partitions=[1]")
    others = await env.drain(stream, "g", limit=3, partitions=[0, 2])
    check_equal({lease.partition for lease in others}, {0, 2}, "partitions of partitions=[0, 2]")
    check_equal(len(others), 8, "leases of partitions=[0, 2]")
    check_equal(await env.fetch(stream, "g"), [], "nothing left in any partition")


@case(rules=["fetch.order"])
async def case_fetch_order_within_partition(env: CaseEnv) -> None:
    """Within a partition, events are delivered in sequence order."""
    stream = await env.stream_with(10, 7)
    delivered: dict[int, list[int]] = {0: [], 1: []}
    for _ in range(20):
        batch = await env.fetch(stream, "g", 3)
        if not batch:
            break
        for lease in batch:
            delivered[lease.partition].append(lease.sequence)
    check_equal(delivered[0], list(range(1, 11)), "delivery order in partition 0")
    check_equal(delivered[1], list(range(1, 8)), "delivery order in partition 1")


@case(rules=["lease.fields"])
async def case_lease_fields(env: CaseEnv) -> None:
    """A lease names its group, consumer, event, attempt 1 and a deadline of now + lease_ms."""
    stream = await env.stream()
    events = await env.append(stream, 3)
    before = await env.now()
    leases = await env.rheo.fetch(stream, "billing", consumer_id="worker-1", limit=10,
                                  lease_ms=env.long_ms)
    after = await env.now()
    check_equal(len(leases), 3, "leases")
    check_equal(len({lease.lease_id for lease in leases}), 3, "lease ids are unique")
    for lease, event in zip(leases, events, strict=True):
        check_equal(lease.event, event, "the leased event is the stored event")
        check_equal((lease.group, lease.consumer_id, lease.attempt, lease.stream),
                    ("billing", "worker-1", 1, stream), "group, consumer, attempt, stream")
        check(isinstance(lease.lease_id, str) and lease.lease_id, "lease_id is a non-empty str")
        check(isinstance(lease.receipt, str), "receipt is a str")
        low, high = before + env.long_ms - env.margin_ms, after + env.long_ms + env.margin_ms
        check(low <= lease.deadline_ms <= high,
              f"deadline_ms {lease.deadline_ms} is not now + lease_ms ({low}..{high})")


@case(rules=["lease.exclusive"])
async def case_lease_exclusive_under_concurrent_fetch(env: CaseEnv) -> None:
    """Concurrent fetches of one group never lease the same event twice."""
    stream = await env.stream(partitions=3)
    await env.rheo.append(stream, [NewEvent("t", key=f"k{i}") for i in range(60)])
    await env.rheo.create_group(stream, "g")
    batches = await asyncio.gather(*(
        env.rheo.fetch(stream, "g", consumer_id=f"c{i}", limit=7, lease_ms=env.long_ms)
        for i in range(12)
    ))
    leased = [p for batch in batches for p in positions(batch)]
    check_equal(len(leased), len(set(leased)), "events leased twice by concurrent fetches")
    rest = await env.drain(stream, "g")
    everything = leased + positions(rest)
    check_equal(len(everything), len(set(everything)), "events leased twice")
    check_equal(len(everything), 60, "every event leased exactly once")


@case(rules=["lease.exclusive"], needs_peer=True)
async def case_peer_instances_compete(env: CaseEnv) -> None:
    """Two instances on one store share a group's work: no event twice, leases portable."""
    stream = await env.stream(partitions=2)
    await env.rheo.append(stream, [NewEvent("t", key=f"k{i}") for i in range(40)])
    await env.rheo.create_group(stream, "g")
    async with env.peer() as other:
        batches = await asyncio.gather(*(
            rheo.fetch(stream, "g", limit=6, lease_ms=env.long_ms)
            for rheo in [env.rheo, other] * 4
        ))
        leased = [lease for batch in batches for lease in batch]
        check_equal(len(positions(leased)), len(set(positions(leased))),
                    "events leased by both instances")
        more = await other.fetch(stream, "g", limit=100, lease_ms=env.long_ms)
        all_leases = leased + more
        check_equal(len(set(positions(all_leases))), 40, "events leased across instances")
        mine = [lease for lease in all_leases if lease.sequence % 2]
        theirs = [lease for lease in all_leases if not lease.sequence % 2]
        check_results(await other.ack(mine), mine, [None] * len(mine), "ack via the peer")
        check_results(await env.rheo.ack(theirs), theirs, [None] * len(theirs), "ack via self")
        check_equal(await other.frontier(stream, "g"),
                    await env.rheo.frontier(stream, "g"), "both instances see one frontier")
    check_equal(sum((await env.rheo.lag(stream, "g")).values()), 0, "lag after acking all")


@case(rules=["settle.ack"])
async def case_ack_is_final(env: CaseEnv) -> None:
    """An acked event is never delivered again to that group, even after its lease time."""
    stream = await env.stream()
    await env.append(stream, 2)
    leases = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.ack_ok(leases[:1])
    await env.expire()
    again = await env.fetch(stream, "g")
    check_equal(positions(again), [(0, 2)], "only the unacked event is redelivered")
    await env.ack_ok(again)
    await env.expire()
    check_equal(await env.fetch(stream, "g"), [], "nothing after acking everything")


@case(rules=["settle.repeat"])
async def case_repeated_settle_is_ok_repeated(env: CaseEnv) -> None:
    """Repeating the settle that took effect, with the same lease, is ok with repeated=True."""
    stream = await env.stream()
    await env.append(stream, 3)
    acked, nacked, rejected = await env.fetch(stream, "g")
    check_results(await env.rheo.ack(acked), [acked], [None], "first ack", repeated=[False])
    check_results(await env.rheo.ack(acked), [acked], [None], "second ack", repeated=[True])
    check_results(await env.rheo.nack(nacked, "retry", delay_ms=0), [nacked], [None],
                  "first nack", repeated=[False])
    check_results(await env.rheo.nack(nacked, "retry", delay_ms=0), [nacked], [None],
                  "second nack", repeated=[True])
    check_results(await env.rheo.reject(rejected, "bad"), [rejected], [None], "first reject",
                  repeated=[False])
    check_results(await env.rheo.reject(rejected, "bad"), [rejected], [None], "second reject",
                  repeated=[True])
    [redelivered] = await env.fetch(stream, "g")
    check_equal((redelivered.sequence, redelivered.attempt), (nacked.sequence, 2),
                "a repeated nack does not count as another attempt")


@case(rules=["settle.repeat", "settle.fencing"])
async def case_other_settle_after_settle_is_stale(env: CaseEnv) -> None:
    """Once a lease is settled, another settle or a renew with it is stale_lease."""
    stream = await env.stream()
    await env.append(stream, 3)
    acked, nacked, rejected = await env.fetch(stream, "g")
    await env.ack_ok([acked])
    check_results(await env.rheo.nack(nacked, "r"), [nacked], [None], "nack")
    check_results(await env.rheo.reject(rejected, "r"), [rejected], [None], "reject")
    check_results(await env.rheo.nack(acked, "r"), [acked], [STALE], "nack after ack")
    check_results(await env.rheo.reject(acked, "r"), [acked], [STALE], "reject after ack")
    check_results(await env.rheo.renew(acked), [acked], [STALE], "renew after ack")
    check_results(await env.rheo.ack(nacked), [nacked], [STALE], "ack after nack")
    check_results(await env.rheo.reject(nacked, "r"), [nacked], [STALE], "reject after nack")
    check_results(await env.rheo.renew(nacked), [nacked], [STALE], "renew after nack")
    check_results(await env.rheo.ack(rejected), [rejected], [STALE], "ack after reject")
    check_results(await env.rheo.nack(rejected, "r"), [rejected], [STALE], "nack after reject")
    check_results(await env.rheo.renew(rejected), [rejected], [STALE], "renew after reject")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier: 1 acked, 2 available")
    [again] = await env.fetch(stream, "g")
    check_equal((again.sequence, again.attempt), (2, 2), "the nacked event comes back")


@case(rules=["settle.unknown_lease"])
async def case_foreign_lease_is_invalid(env: CaseEnv) -> None:
    """A lease that could never have been issued (stream, group, partition, sequence) is invalid.

    Unknown stream or group, sequence 0, a partition equal to the partition count,
    and a sequence above its own partition's high water (though below another's).
    """
    stream = await env.stream_with(2, partitions=2)
    [real, _] = await env.fetch(stream, "g")

    def forged(**event: Any) -> Lease:
        return dataclasses.replace(real, event=dataclasses.replace(real.event, **event))

    foreign = [
        forged(stream=env.name("ghost")),
        dataclasses.replace(real, group="no-such-group"),
        forged(sequence=999),
        forged(sequence=0),
        forged(partition=2),
        forged(partition=1, sequence=2),
    ]
    invalid = [SettleKind.INVALID] * len(foreign)
    check_results(await env.rheo.ack(foreign), foreign, invalid, "ack of foreign leases")
    check_results(await env.rheo.nack(foreign, "r"), foreign, invalid, "nack of foreign leases")
    check_results(await env.rheo.reject(foreign, "r"), foreign, invalid,
                  "reject of foreign leases")
    check_results(await env.rheo.renew(foreign), foreign, invalid, "renew of foreign leases")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0, 1: 0}, "nothing was settled")
    await env.ack_ok([real])


@case(rules=["settle.fencing"])
async def case_receipt_mismatch(env: CaseEnv) -> None:
    """A lease whose id matches but whose receipt does not is receipt_mismatch."""
    stream = await env.stream()
    await env.append(stream, 1)
    [lease] = await env.fetch(stream, "g")
    forged = dataclasses.replace(lease, receipt=lease.receipt + "-forged")
    mismatch = [SettleKind.RECEIPT_MISMATCH]
    check_results(await env.rheo.ack(forged), [forged], mismatch, "ack with a wrong receipt")
    check_results(await env.rheo.nack(forged, "r"), [forged], mismatch, "nack, wrong receipt")
    check_results(await env.rheo.reject(forged, "r"), [forged], mismatch, "reject, wrong receipt")
    check_results(await env.rheo.renew(forged), [forged], mismatch, "renew, wrong receipt")
    check_equal(await env.fetch(stream, "g"), [], "the delivery is still leased")
    await env.ack_ok([lease])


@case(rules=["settle.fencing", "lease.expiry"])
async def case_fencing_after_expiry_and_release(env: CaseEnv) -> None:
    """An expired lease whose event was leased again can no longer ack, nack, reject or renew."""
    stream = await env.stream()
    await env.append(stream, 1)
    [old] = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.expire()
    [new] = await env.fetch(stream, "g", consumer_id="newer")
    check_equal((new.sequence, new.attempt), (old.sequence, 2), "redelivery")
    check(new.lease_id != old.lease_id, "a redelivery gets a new lease id")
    check_results(await env.rheo.ack(old), [old], [STALE], "ack with the stale lease")
    check_results(await env.rheo.nack(old, "r"), [old], [STALE], "nack with the stale lease")
    check_results(await env.rheo.reject(old, "r"), [old], [STALE], "reject with the stale lease")
    check_results(await env.rheo.renew(old), [old], [STALE], "renew with the stale lease")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "nothing was rejected")
    await env.ack_ok([new])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "the newer lease settled")


@case(rules=["settle.expired_unreleased"])
async def case_expired_lease_not_yet_released_may_settle(env: CaseEnv) -> None:
    """An expired lease may still settle while nobody has leased the event again."""
    stream = await env.stream()
    await env.append(stream, 2)
    first, second = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.expire()
    await env.ack_ok([first])
    check_results(await env.rheo.renew(second), [second], [None], "renew of an expired lease")
    check_equal(await env.fetch(stream, "g"), [], "the renewed lease is not redelivered")
    await env.ack_ok([second])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "frontier")


@case(rules=["settle.results"])
async def case_settle_results_in_order(env: CaseEnv) -> None:
    """A settle batch returns one result per lease, in order, each classified on its own."""
    stream = await env.stream()
    await env.append(stream, 5)
    leases = await env.fetch(stream, "g")
    await env.ack_ok([leases[1]])
    forged = dataclasses.replace(leases[3], receipt="forged")
    foreign = dataclasses.replace(leases[4], group="other-group")
    batch = [leases[0], leases[1], forged, leases[2], foreign, leases[4]]
    results = await env.rheo.ack(batch)
    check_results(results, batch, [None, None, SettleKind.RECEIPT_MISMATCH, None,
                                   SettleKind.INVALID, None], "mixed ack batch",
                  repeated=[False, True, False, False, False, False])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "frontier after the mixed batch")
    renewed = await env.rheo.renew([leases[3], leases[0]], lease_ms=env.long_ms)
    check_results(renewed, [leases[3], leases[0]], [None, STALE], "mixed renew batch")


@case(rules=["settle.results"])
async def case_empty_batch_settles(env: CaseEnv) -> None:
    """Settling or renewing no leases returns no results, from the facade and the backend."""
    check_equal(await env.rheo.ack([]), [], "facade ack([])")
    check_equal(await env.rheo.nack([], "r"), [], "facade nack([])")
    check_equal(await env.rheo.reject([], "r"), [], "facade reject([])")
    check_equal(await env.rheo.renew([]), [], "facade renew([])")
    check_equal(await env.backend.ack([]), [], "backend ack([])")
    check_equal(await env.backend.nack([], "r", 0), [], "backend nack([])")
    check_equal(await env.backend.reject([], "r"), [], "backend reject([])")
    check_equal(await env.backend.renew([], 1000), [], "backend renew([])")


@case(rules=["settle.repeat"])
async def case_concurrent_settles_of_one_lease(env: CaseEnv) -> None:
    """Racing settles of one lease: exactly one takes effect; the rest repeat or are stale."""
    stream = await env.stream()
    await env.append(stream, 2)
    first, second = await env.fetch(stream, "g")
    acks = await asyncio.gather(*(env.rheo.ack(first) for _ in range(4)))
    results = [r for batch in acks for r in batch]
    check(all(r.ok for r in results), "every racing ack of one lease is ok")
    check_equal(sum(not r.repeated for r in results), 1, "racing acks that took effect")
    mixed = await asyncio.gather(env.rheo.ack(second), env.rheo.nack(second, "r"),
                                 env.rheo.reject(second, "r"))
    outcomes = [batch[0] for batch in mixed]
    winners = [r for r in outcomes if r.ok]
    check_equal(len(winners), 1, "racing ack/nack/reject of one lease that succeeded")
    check(not winners[0].repeated, "the winner took effect")
    check(all(r.kind == STALE for r in outcomes if not r.ok), "the losers are stale_lease")


@case(rules=["settle.renew"])
async def case_renew_extends_deadline(env: CaseEnv) -> None:
    """renew moves the deadline to now + lease_ms: no redelivery after the old deadline."""
    stream = await env.stream()
    await env.append(stream, 3)
    leases = await env.fetch(stream, "g", lease_ms=env.short_ms)
    before = await env.now()
    results = await env.rheo.renew(leases[:2], lease_ms=env.long_ms)
    after = await env.now()
    check_results(results, leases[:2], [None, None], "renew")
    for result in results:
        check(result.deadline_ms is not None, "a successful renew reports the new deadline")
        deadline = result.deadline_ms or 0
        check(before + env.long_ms - env.margin_ms <= deadline
              <= after + env.long_ms + env.margin_ms,
              f"renewed deadline {deadline} is not now + lease_ms")
    await env.expire()
    again = await env.fetch(stream, "g")
    check_equal(positions(again), [(0, 3)], "only the lease that was not renewed expired")
    check_equal(again[0].attempt, 2, "attempt of the expired one")
    await env.ack_ok(leases[:2])
    await env.ack_ok(again)


@case(rules=["lease.expiry"])
async def case_expiry_redelivers_next_attempt(env: CaseEnv) -> None:
    """An expired lease is redelivered with attempt + 1, a new lease id, the same event."""
    stream = await env.stream()
    [event] = await env.append(stream, 1)
    [first] = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.expire_at_the_deadline(stream, "g")
    [second] = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.expire()
    [third] = await env.fetch(stream, "g")
    check_equal([first.attempt, second.attempt, third.attempt], [1, 2, 3], "attempts")
    check_equal(len({first.lease_id, second.lease_id, third.lease_id}), 3, "distinct lease ids")
    check_equal([first.event, second.event, third.event], [event] * 3, "the same event")
    await env.ack_ok([third])


@case(rules=["settle.nack"])
async def case_nack_redelivers_immediately(env: CaseEnv) -> None:
    """nack with no delay makes the event available at once, with attempt + 1."""
    stream = await env.stream()
    await env.append(stream, 2)
    first, _ = await env.fetch(stream, "g")
    check_results(await env.rheo.nack(first, "try again"), [first], [None], "nack")
    [again] = await env.fetch(stream, "g")
    check_equal((again.sequence, again.attempt), (first.sequence, 2), "the nacked event")
    check(again.lease_id != first.lease_id, "a new lease id")
    check_results(await env.rheo.ack(first), [first], [STALE], "ack with the nacked lease")
    await env.ack_ok([again])


@case(rules=["settle.nack"], requires=["delayed_nack"])
async def case_nack_with_delay(env: CaseEnv) -> None:
    """nack(delay_ms) keeps the event back until the delay has passed."""
    stream = await env.stream()
    await env.append(stream, 2)
    later, soon = await env.fetch(stream, "g")
    check_results(await env.rheo.nack(later, "later", delay_ms=env.long_ms), [later], [None],
                  "nack with a long delay")
    check_results(await env.rheo.nack(soon, "soon", delay_ms=env.short_ms), [soon], [None],
                  "nack with a short delay")
    if env.exact_time:
        check_equal(await env.fetch(stream, "g"), [], "fetch before any delay passed")
    else:
        check((0, 1) not in positions(await env.fetch(stream, "g")),
              "the long-delayed event came back early")
    await env.expire_at_the_deadline(stream, "g")
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(2, 2)],
                "after the short delay only that event is back")
    await env.ack_ok(again)


@case(rules=["settle.reject"])
async def case_reject_dead_letters(env: CaseEnv) -> None:
    """reject dead-letters a delivery for its group: listed, never redelivered, settled."""
    stream = await env.stream()
    await env.append(stream, 2)
    leases = await env.fetch(stream, "g")
    before = await env.now()
    check_results(await env.rheo.reject(leases[0], "poison pill"), leases[:1], [None], "reject")
    after = await env.now()
    await env.ack_ok(leases[1:])
    [dead] = await env.rheo.dead_letters(stream, "g")
    check_equal((dead.stream, dead.group, dead.partition, dead.sequence, dead.event_id),
                (stream, "g", 0, 1, leases[0].event.id), "dead letter position")
    check_equal((dead.attempts, dead.reason), (1, "poison pill"), "dead letter attempts, reason")
    check(before - env.margin_ms <= dead.rejected_at_ms <= after + env.margin_ms,
          "rejected_at_ms is the time of the reject")
    await env.expire()
    check_equal(await env.fetch(stream, "g"), [], "a rejected delivery is not redelivered")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "rejected counts as settled")
    other = await env.fetch(stream, "other")
    check_equal([lease.sequence for lease in other], [1, 2], "another group gets every event")
    check_equal(await env.rheo.dead_letters(stream, "other"), [], "other group's dead letters")


@case(rules=["attempts.max"])
async def case_max_attempts_via_nack(env: CaseEnv) -> None:
    """A nack at attempt >= max_attempts dead-letters with reason "max_attempts"."""
    stream = await env.stream()
    await env.append(stream, 1)
    await env.rheo.create_group(stream, "g", max_attempts=2)
    [first] = await env.fetch(stream, "g")
    check_results(await env.rheo.nack(first, "boom"), [first], [None], "first nack")
    [second] = await env.fetch(stream, "g")
    check_equal(second.attempt, 2, "second attempt")
    check_results(await env.rheo.nack(second, "boom"), [second], [None], "nack at max attempts")
    check_results(await env.rheo.nack(second, "boom"), [second], [None],
                  "repeating the nack that dead-lettered", repeated=[True])
    check_equal(await env.fetch(stream, "g"), [], "no third attempt")
    [dead] = await env.rheo.dead_letters(stream, "g")
    check_equal((dead.sequence, dead.attempts, dead.reason), (1, 2, MAX_ATTEMPTS_REASON),
                "dead letter")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "dead-lettered counts as settled")


@case(rules=["attempts.max"])
async def case_max_attempts_via_expiry(env: CaseEnv) -> None:
    """A lease that expires at attempt >= max_attempts is dead-lettered, not redelivered."""
    stream = await env.stream()
    await env.append(stream, 2)
    await env.rheo.create_group(stream, "g", max_attempts=2)
    first = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.expire()
    second = await env.fetch(stream, "g", lease_ms=env.short_ms)
    check_equal([lease.attempt for lease in second], [2, 2], "second attempts")
    await env.ack_ok(second[1:])
    await env.expire()
    check_equal(await env.fetch(stream, "g"), [], "no attempt past max_attempts")
    [dead] = await env.rheo.dead_letters(stream, "g")
    check_equal((dead.sequence, dead.attempts, dead.reason), (1, 2, MAX_ATTEMPTS_REASON),
                "dead letter")
    check_results(await env.rheo.ack(second[0]), second[:1], [STALE],
                  "ack of a lease that was dead-lettered on expiry")
    check_results(await env.rheo.ack(first[0]), first[:1], [STALE], "ack of the first lease")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "frontier")


@case(rules=["settle.repeat", "settle.results"])
async def case_same_lease_twice_in_a_batch(env: CaseEnv) -> None:
    """A batch naming one lease twice settles it once; the second occurrence is its repeat."""
    stream = await env.stream()
    await env.append(stream, 5)
    acked, nacked, rejected, renewed, other = await env.fetch(stream, "g")
    check_results(await env.rheo.ack([acked, other, acked]), [acked, other, acked],
                  [None, None, None], "ack [a, b, a]", repeated=[False, False, True])
    check_results(await env.rheo.nack([nacked, nacked], "r"), [nacked, nacked], [None, None],
                  "nack [n, n]", repeated=[False, True])
    check_results(await env.rheo.reject([rejected, rejected], "r"), [rejected, rejected],
                  [None, None], "reject [r, r]", repeated=[False, True])
    results = await env.rheo.renew([renewed, renewed], lease_ms=env.long_ms)
    check_results(results, [renewed, renewed], [None, None], "renew [w, w]")
    check(all(r.deadline_ms is not None for r in results), "both renews report a deadline")
    [again] = await env.fetch(stream, "g")
    check_equal((again.sequence, again.attempt), (nacked.sequence, 2),
                "the nack named twice counts as one attempt")
    check_equal([d.sequence for d in await env.rheo.dead_letters(stream, "g")],
                [rejected.sequence], "the reject named twice is one dead letter")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier")


@case(rules=["settle.repeat", "settle.fencing", "settle.results", "replay.from_sequence"])
async def case_old_and_new_lease_of_one_delivery_in_a_batch(env: CaseEnv) -> None:
    """A batch naming a delivery's replayed lease and its new lease classifies each on
    its own, in either order: the old one is stale, the new one is current (ok) or,
    once settled, its repeat."""
    stream = await env.stream()
    await env.append(stream, 4)
    first = await env.fetch(stream, "g")
    await env.rheo.replay(stream, "g", from_sequence=2)
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(2, 1), (3, 1), (4, 1)],
                "the replayed deliveries come back with attempt 1")
    old2, old3, old4 = first[1:]
    new2, new3, new4 = again
    # Current leases past the frontier (sequence 1 is still leased).
    check_results(await env.rheo.renew([old2, new2], lease_ms=env.long_ms), [old2, new2],
                  [STALE, None], "renew [old, new]")
    check_results(await env.rheo.ack([old3, new3]), [old3, new3], [STALE, None],
                  "ack [old, new] past the frontier", repeated=[False, False])
    check_results(await env.rheo.ack([new2, old2]), [new2, old2], [None, STALE],
                  "ack [new, old] past the frontier", repeated=[False, False])
    # Settled at or behind the frontier: the new lease's ack repeats.
    await env.ack_ok([first[0]])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "frontier after the acks")
    for name, batch, kinds, repeated in (
        ("[old, new]", [old2, new2], [STALE, None], [False, True]),
        ("[new, old]", [new3, old3], [None, STALE], [True, False]),
    ):
        check_results(await env.rheo.ack(batch), batch, kinds, f"ack {name} again",
                      repeated=repeated)
    # The old lease of a delivery still leased changes nothing, named before its new one.
    check_results(await env.rheo.ack([old4]), [old4], [STALE], "ack [old] of a leased one")
    check_results(await env.rheo.nack([old4, new4], "r"), [old4, new4], [STALE, None],
                  "nack [old, new]")
    [redelivered] = await env.fetch(stream, "g")
    check_equal((redelivered.sequence, redelivered.attempt), (4, 2),
                "the new lease's nack took effect once")
    await env.ack_ok([redelivered])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4}, "frontier")


@case(rules=["settle.unknown_lease"])
async def case_lease_on_unleased_sequence_is_stale(env: CaseEnv) -> None:
    """A lease naming an appended sequence the group holds no lease for is stale_lease."""
    stream = await env.stream()
    await env.append(stream, 3)
    [real] = await env.fetch(stream, "g", 1)
    never_fetched = dataclasses.replace(real, event=dataclasses.replace(real.event, sequence=3))
    check_results(await env.rheo.ack(never_fetched), [never_fetched], [STALE],
                  "ack naming sequence 3")
    check_results(await env.rheo.nack(never_fetched, "r"), [never_fetched], [STALE],
                  "nack naming sequence 3")
    check_results(await env.rheo.reject(never_fetched, "r"), [never_fetched], [STALE],
                  "reject naming sequence 3")
    check_results(await env.rheo.renew(never_fetched), [never_fetched], [STALE],
                  "renew naming sequence 3")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "nothing was settled")
    check_equal(await env.rheo.dead_letters(stream, "g"), [], "nothing was rejected")
    rest = await env.fetch(stream, "g")
    check_equal(tried(rest), [(2, 1), (3, 1)],
                "the never-fetched deliveries are untouched")
    await env.ack_ok([real, *rest])


@case(rules=["settle.unknown_lease", "settle.fencing", "group.independent"])
async def case_lease_naming_another_delivery_is_stale(env: CaseEnv) -> None:
    """A real lease presented with another group, partition or sequence is stale_lease.

    Each named delivery exists and is leased, under another lease; the forged
    lease (with the real lease's receipt, or with the named delivery's own) settles
    nothing, and every real lease still settles as a first settle.
    """
    stream = await env.stream_with(3, 3)
    await env.rheo.create_group(stream, "idle")
    mine = await env.fetch(stream, "a")
    theirs = await env.fetch(stream, "b")
    check_equal(sorted(positions(mine)), sorted(positions(theirs)), "both groups lease all")
    at = {(lease.partition, lease.sequence): lease for lease in mine}
    real = at[0, 1]

    def moved(**event: Any) -> Lease:
        return dataclasses.replace(real, event=dataclasses.replace(real.event, **event))

    forged = [
        dataclasses.replace(real, group="b"),
        dataclasses.replace(real, group="idle"),
        moved(partition=1),
        moved(sequence=2),
        moved(partition=1, sequence=3),
        # The other delivery's own lease (its receipt, event, attempt) under real's id.
        *(dataclasses.replace(at[p, s], lease_id=real.lease_id) for p, s in ((1, 1), (0, 2))),
    ]
    stale = [STALE] * len(forged)
    check_results(await env.rheo.ack(forged), forged, stale, "ack naming another delivery")
    check_results(await env.rheo.nack(forged, "r"), forged, stale, "nack naming another delivery")
    check_results(await env.rheo.reject(forged, "r"), forged, stale,
                  "reject naming another delivery")
    check_results(await env.rheo.renew(forged, lease_ms=env.short_ms), forged, stale,
                  "renew naming another delivery")
    await env.expire()
    for group in ("a", "b", "idle"):
        check_equal(await env.rheo.frontier(stream, group), {0: 0, 1: 0}, f"frontier of {group}")
        check_equal(await env.rheo.dead_letters(stream, group), [], f"dead letters of {group}")
    check_equal(await env.fetch(stream, "a"), [], "group a's deliveries are all still leased")
    check_equal(await env.fetch(stream, "b"), [], "group b's deliveries are all still leased")
    for leases in (mine, theirs):
        check_results(await env.rheo.ack(leases), leases, [None] * len(leases),
                      "the real leases settle", repeated=[False] * len(leases))
    check_equal(await env.rheo.frontier(stream, "a"), {0: 3, 1: 3}, "frontier of a")
