"""Cases about redeliveries: exclusivity, order and fencing of deliveries that come back.

A backend can keep the lease rules for first deliveries and break them for
deliveries that expired or were nacked (another code path in most stores), so
each rule is checked again on both kinds of redelivery.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Literal

from .._backend import MAX_ATTEMPTS_REASON
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._settle_results import SettleKind
from ._case import CaseEnv, case, check, check_equal, check_results, positions, states, tried

STALE = SettleKind.STALE_LEASE
How = Literal["expiry", "nack"]
HOWS: tuple[How, ...] = ("expiry", "nack")


async def _bring_back(env: CaseEnv, leases: list[Lease], how: How) -> None:
    """Make every lease's delivery eligible again: let short leases expire, or nack them.

    The nacks go in reverse order, one call each, so that a backend ordering
    redeliveries by the time they came back (not by sequence) is caught.
    """
    if how == "expiry":
        await env.expire()
        return
    for lease in reversed(leases):
        check_results(await env.rheo.nack(lease, "again", delay_ms=0), [lease], [None], "nack")


async def _lease_all(env: CaseEnv, stream: str, group: str) -> list[Lease]:
    """Lease every eligible delivery of the group on a short lease."""
    return await env.drain(stream, group, lease_ms=env.short_ms)


@case(rules=["lease.exclusive"])
async def case_lease_exclusive_on_redeliveries(env: CaseEnv) -> None:
    """Concurrent fetches never lease one redelivery twice, after expiry and after nack."""
    for how in HOWS:
        stream = await env.stream(partitions=3)
        await env.rheo.append(stream, [NewEvent("t", key=f"k{i}") for i in range(45)])
        first = await _lease_all(env, stream, "g")
        check_equal(len(first), 45, f"{how}: first deliveries")
        await _bring_back(env, first, how)
        # New events behind the redeliveries: both kinds are fought over at once.
        await env.rheo.append(stream, [NewEvent("t", key=f"n{i}") for i in range(15)])
        batches = await asyncio.gather(*(
            env.rheo.fetch(stream, "g", consumer_id=f"c{i}", limit=7, lease_ms=env.long_ms)
            for i in range(12)
        ))
        leased = [lease for batch in batches for lease in batch]
        check_equal(len(positions(leased)), len(set(positions(leased))),
                    f"{how}: redeliveries leased twice by concurrent fetches")
        everything = leased + await env.drain(stream, "g")
        check_equal(len(everything), len(set(positions(everything))),
                    f"{how}: redeliveries leased twice")
        check_equal(len(everything), 60, f"{how}: every delivery leased once")
        redelivered = set(positions(first))
        for lease in everything:
            expected = 2 if (lease.partition, lease.sequence) in redelivered else 1
            check_equal(lease.attempt, expected, f"{how}: attempt of {lease.sequence}")
        await env.ack_ok(everything)


@case(rules=["lease.exclusive"], needs_peer=True)
async def case_peer_instances_compete_on_redeliveries(env: CaseEnv) -> None:
    """Two instances fighting over expired and nacked deliveries never lease one twice."""
    async with env.peer() as other:
        for how in HOWS:
            stream = await env.stream(partitions=2)
            await env.rheo.append(stream, [NewEvent("t", key=f"k{i}") for i in range(30)])
            first = await _lease_all(env, stream, "g")
            await _bring_back(env, first, how)
            batches = await asyncio.gather(*(
                rheo.fetch(stream, "g", limit=5, lease_ms=env.long_ms)
                for rheo in [env.rheo, other] * 4
            ))
            leased = [lease for batch in batches for lease in batch]
            leased += await other.fetch(stream, "g", limit=100, lease_ms=env.long_ms)
            check_equal(len(positions(leased)), len(set(positions(leased))),
                        f"{how}: redeliveries leased by both instances")
            check_equal(len(leased), 30, f"{how}: redeliveries leased across instances")
            check_equal({lease.attempt for lease in leased}, {2}, f"{how}: attempts")
            check_results(await other.ack(leased), leased, [None] * 30, f"{how}: ack via peer")


@case(rules=["fetch.order"])
async def case_fetch_order_on_redeliveries(env: CaseEnv) -> None:
    """Each fetch returns a partition's redeliveries and new events in sequence order."""
    for how in HOWS:
        for limit in (100, 3):
            stream = await env.stream_with(10, 7)
            first = await _lease_all(env, stream, "g")
            settled = [lease for lease in first if lease.sequence in (3, 6)]
            await env.ack_ok(settled)
            back = [lease for lease in first if lease not in settled]
            if how == "expiry":
                # Later sequences get the earlier deadlines: the order within a fetch
                # must follow sequences, not deadlines.
                for lease in reversed(back):
                    check_results(await env.rheo.renew(lease, lease_ms=env.short_ms), [lease],
                                  [None], "renew")
            await _bring_back(env, back, how)
            await env.append(stream, 2, partition=0)
            delivered: dict[int, list[int]] = {0: [], 1: []}
            for _ in range(30):
                batch = await env.fetch(stream, "g", limit)
                if not batch:
                    break
                for partition in (0, 1):
                    got = [lease.sequence for lease in batch if lease.partition == partition]
                    check_equal(got, sorted(got),
                                f"{how}: one fetch(limit={limit}) in partition {partition}")
                    delivered[partition] += got
            check_equal(sorted(delivered[0]), [1, 2, 4, 5, 7, 8, 9, 10, 11, 12],
                        f"{how}: deliveries of partition 0")
            check_equal(sorted(delivered[1]), [1, 2, 4, 5, 7], f"{how}: deliveries of partition 1")
            if limit == 100:
                check_equal(delivered[0], [1, 2, 4, 5, 7, 8, 9, 10, 11, 12],
                            f"{how}: one fetch of everything, partition 0")


@case(rules=["settle.fencing", "settle.expired_unreleased"])
async def case_fencing_on_redeliveries(env: CaseEnv) -> None:
    """Each redelivery fences the lease before it; the current one settles, forged ones do not."""
    for how in HOWS:
        stream = await env.stream()
        await env.append(stream, 1)
        [one] = await env.fetch(stream, "g", lease_ms=env.short_ms)
        await _bring_back(env, [one], how)
        [two] = await env.fetch(stream, "g", lease_ms=env.short_ms)
        check_equal((two.sequence, two.attempt), (1, 2), f"{how}: second delivery")
        check(two.lease_id != one.lease_id, f"{how}: a redelivery gets a new lease id")
        forged = dataclasses.replace(two, receipt=one.receipt)
        if forged.receipt != two.receipt:
            check_results(await env.rheo.ack(forged), [forged], [SettleKind.RECEIPT_MISMATCH],
                          f"{how}: the current lease id with the old receipt")
        old_receipt = dataclasses.replace(one, receipt=two.receipt)
        for stale in (one, old_receipt):
            check_results(await env.rheo.ack(stale), [stale], [STALE], f"{how}: ack, old lease")
            check_results(await env.rheo.nack(stale, "r"), [stale], [STALE],
                          f"{how}: nack, old lease")
            check_results(await env.rheo.reject(stale, "r"), [stale], [STALE],
                          f"{how}: reject, old lease")
            check_results(await env.rheo.renew(stale), [stale], [STALE],
                          f"{how}: renew, old lease")
        await env.expire()  # the second lease runs out too; nobody has leased it again
        [three] = await env.fetch(stream, "g")
        check_equal(three.attempt, 3, f"{how}: third delivery")
        check_results(await env.rheo.ack(two), [two], [STALE], f"{how}: ack of the second lease")
        await env.ack_ok([three])
        check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, f"{how}: frontier")
        check_equal(await env.rheo.dead_letters(stream, "g"), [], f"{how}: no dead letters")

    stream = await env.stream()
    await env.append(stream, 1)
    [one] = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.expire()
    [two] = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.expire()
    check_results(await env.rheo.renew(two), [two], [None],
                  "renew of an expired redelivery nobody leased again")
    check_equal(await env.fetch(stream, "g"), [], "the renewed redelivery is not handed out")
    await env.ack_ok([two])


def _in_order_per_partition(leases: list[Lease]) -> bool:
    for partition in {lease.partition for lease in leases}:
        seqs = [lease.sequence for lease in leases if lease.partition == partition]
        if seqs != sorted(set(seqs)):
            return False
    return True


@case(rules=["fetch.limit", "fetch.order", "attempts.max", "lease.expiry", "settle.nack"])
async def case_more_redeliveries_than_the_limit(env: CaseEnv) -> None:
    """With more redeliveries than the limit, each fetch fills its batch with eligible ones.

    Deliveries dead-lettered at max attempts by the fetch that sees their expiry sit
    below and between the eligible ones, in both partitions; they take no place.
    """
    stream = await env.stream_with(8, 8)
    await env.rheo.create_group(stream, "g", max_attempts=2)
    first = {(x.partition, x.sequence): x for x in
             await env.fetch(stream, "g", 16, lease_ms=env.short_ms)}
    odd = [first[p, s] for p in (0, 1) for s in (1, 3, 5, 7)]
    check_results(await env.rheo.nack(odd, "r"), odd, [None] * 8, "nack the odd sequences")
    last = await env.fetch(stream, "g", 8, lease_ms=env.short_ms)
    check_equal(states(last),
                sorted((x.partition, x.sequence, 2) for x in odd), "the last attempts")
    nacked = [first[p, s] for p in (0, 1) for s in (6, 8)]
    check_results(await env.rheo.nack(nacked, "r"), nacked, [None] * 4, "nack 6 and 8")
    await env.expire()
    eligible = sorted((p, s) for p in (0, 1) for s in (2, 4, 6, 8))
    got: list[Lease] = []
    for size in (3, 3, 2):
        batch = await env.fetch(stream, "g", 3)
        check_equal(len(batch), size, f"a fetch of limit 3 after {len(got)} of 8 eligible")
        check(_in_order_per_partition(batch),
              f"each delivery once, in sequence order per partition: {positions(batch)}")
        got.extend(batch)
    check_equal(await env.fetch(stream, "g"), [], "nothing else is eligible")
    check_equal(sorted(positions(got)), eligible, "every eligible redelivery, once")
    check_equal({x.attempt for x in got}, {2}, "attempts of the redeliveries")
    dead = await env.rheo.dead_letters(stream, "g")
    check_equal([(d.partition, d.sequence, d.attempts, d.reason) for d in dead],
                [(x.partition, x.sequence, 2, MAX_ATTEMPTS_REASON) for x in odd],
                "the expired last attempts are dead letters")
    await env.ack_ok(got)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 8, 1: 8}, "frontier")


@case(rules=["settle.repeat", "redrive.dead_letters_only", "settle.expired_unreleased"])
async def case_repeated_acks_after_expiries_and_a_redrive(env: CaseEnv) -> None:
    """Acks repeat as acks whatever happened around them since.

    What happens around them: the expiry of their batch's other leases, the expiry
    of their settled batch, a redrive of an earlier dead letter that takes the
    frontier back below them."""
    stream = await env.stream()
    await env.append(stream, 8)
    [dead] = await env.fetch(stream, "g", 1)
    check_results(await env.rheo.reject(dead, "bad"), [dead], [None], "reject 1")
    part = await env.fetch(stream, "g", 3, lease_ms=env.short_ms)
    await env.ack_ok(part[:1])
    await env.expire()
    back = await env.fetch(stream, "g", 2)
    check_equal(tried(back), [(3, 2), (4, 2)],
                "3 and 4 expired, 2 was acked")
    check_results(await env.rheo.ack(part[:1]), part[:1], [None], "ack 2 again",
                  repeated=[True])
    early = await env.fetch(stream, "g", 2, lease_ms=env.short_ms)
    late = await env.fetch(stream, "g", 2)
    await env.ack_ok(early)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "3 and 4 are leased")
    await env.ack_ok(back)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 6}, "7 and 8 are leased")
    await env.ack_ok(late)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 8}, "every event settled")
    await env.expire()
    check_equal(await env.fetch(stream, "g"), [], "the acked leases expire to nothing")
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive 1")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier below 1")
    acked = [part[0], *back, *early, *late]
    check_results(await env.rheo.ack(acked), acked, [None] * 7, "the acks again",
                  repeated=[True] * 7)
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(1, 1)], "only 1 comes back")
    await env.ack_ok(again)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 8}, "frontier at the end")


FETCHES = 520
"""Fetches of one event each: more batches than a store may keep in the order it took
them (a small Redis hash keeps insertion order, up to 512 fields by default)."""


@case(rules=["settle.repeat", "redrive.dead_letters_only"])
async def case_repeated_acks_after_a_redrive_behind_many_fetches(env: CaseEnv) -> None:
    """Acks of many small fetches repeat as acks after a redrive behind them.

    The redriven dead letter comes before them all, so the redrive takes the
    frontier back below every one of them."""
    stream = await env.stream()
    await env.append(stream, FETCHES)
    leases = [x for _ in range(FETCHES) for x in await env.fetch(stream, "g", 1)]
    check_equal([x.sequence for x in leases], list(range(1, FETCHES + 1)), "one event a fetch")
    check_results(await env.rheo.reject(leases[0], "bad"), leases[:1], [None], "reject 1")
    await env.ack_ok(leases[1:])
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive 1")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier below 1")
    check_results(await env.rheo.ack(leases[1:]), leases[1:], [None] * (FETCHES - 1),
                  "the acks again", repeated=[True] * (FETCHES - 1))
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(1, 1)], "only 1 comes back")
    await env.ack_ok(again)
    check_equal(await env.rheo.frontier(stream, "g"), {0: FETCHES}, "frontier at the end")
