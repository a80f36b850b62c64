"""Cases about batches: settles whose batch is not clean, large batches, fair fetches.

Backends often settle a clean batch in one statement and fall back to another
path when a lease in it is stale or repeated, or when a batch is larger than
one statement takes; the rules must hold on every path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Sequence
from typing import Literal

from .._backend import MAX_ATTEMPTS_REASON
from .._model._errors import UnknownStream
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._settle_results import SettleKind
from ._case import CaseEnv, case, check, check_equal, check_results, expect_error, positions, tried

STALE = SettleKind.STALE_LEASE
MISMATCH = SettleKind.RECEIPT_MISMATCH
Shape = Literal["alone", "clean", "mixed", "twice", "large"]
SHAPES: tuple[Shape, ...] = ("alone", "clean", "mixed", "twice", "large")
"""How two live leases reach a settle: one call each; together; beside a stale lease and a
forged receipt of one of them; one named twice after a forged receipt of it; or after
``LARGE`` leases of sequences never appended (a batch larger than one statement takes)."""
Op = Literal["nack", "reject"]
LARGE = 300
"""A batch larger than one statement of most stores takes (SQLite binds, IN lists)."""


@case(rules=["settle.results", "settle.renew"])
async def case_renew_batch_results(env: CaseEnv) -> None:
    """A renew batch answers every lease: a settled one stale, the live ones ok, not repeated."""
    stream = await env.stream()
    await env.append(stream, 3)
    settled, live, other = await env.fetch(stream, "g")
    await env.ack_ok([settled])
    results = await env.rheo.renew([settled, live, other], lease_ms=env.long_ms)
    check_results(results, [settled, live, other], [STALE, None, None], "renew [acked, a, b]",
                  repeated=[False, False, False])
    check(all(r.repeated is False for r in results), "renew results say repeated=False")
    clean = await env.rheo.renew([live, other], lease_ms=env.long_ms)
    check_results(clean, [live, other], [None, None], "renew [a, b]")
    check(all(r.repeated is False for r in clean), "renew results say repeated=False")


@case(rules=["settle.ack_and_fetch", "settle.repeat", "settle.fencing",
             "settle.expired_unreleased"])
async def case_acks_ride_on_the_next_fetch(env: CaseEnv) -> None:
    """ack_and_fetch acks a batch and fetches the next, answering as ack then fetch would."""
    stream = await env.stream()
    await env.append(stream, 7)
    backend = env.rheo.backend
    first = await env.fetch(stream, "g", 3)
    results, second = await backend.ack_and_fetch(first, stream, "g", "c", 3, env.short_ms, None)
    check_results(results, first, [None] * 3, "acks of the first batch")
    check_equal(tried(second), [(4, 1), (5, 1), (6, 1)], "the next batch")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "the first batch is acked")
    # A repeat answers as a repeat, a superseded lease as stale, beside live acks.
    await env.expire()
    again = await env.fetch(stream, "g", 1)
    check_equal(tried(again), [(4, 2)], "4 leased again")
    acks = [first[0], second[1], second[2]]
    results, rest = await backend.ack_and_fetch(acks, stream, "g", "c", 10, env.long_ms, None)
    check_results(results, acks, [None, None, None], "a repeat and two expired, unreleased",
                  repeated=[True, False, False])
    check_equal(tried(rest), [(7, 1)], "the fetch after them")
    acks = [second[0], *rest]
    results, none = await backend.ack_and_fetch(acks, stream, "g", "c", 10, env.long_ms, None)
    check_results(results, acks, [STALE, None], "a superseded lease and a live one")
    check_equal(none, [], "nothing left to fetch")
    check_equal(await backend.ack_and_fetch([], stream, "g", "c", 10, env.long_ms, None),
                ([], []), "no acks, nothing to fetch")
    await env.ack_ok(again)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 7}, "every event acked")


@case(rules=["settle.last_error", "attempts.max", "settle.renew", "settle.reject"])
async def case_settle_effects_in_mixed_batches(env: CaseEnv) -> None:
    """A batch holding a stale lease settles the others fully: errors, max attempts, deadlines."""
    stream = await env.stream()
    await env.append(stream, 5)
    await env.rheo.create_group(stream, "g", max_attempts=2)
    acked, rejected, nacked, _expiring, last = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.ack_ok([acked])
    check_results(await env.rheo.renew([acked, rejected, nacked, last], lease_ms=env.long_ms),
                  [acked, rejected, nacked, last], [STALE, None, None, None], "renew")
    check_results(await env.rheo.reject([acked, rejected], "bad", error="E1"),
                  [acked, rejected], [STALE, None], "reject [acked, live]")
    check_results(await env.rheo.nack([acked, nacked], "again", error="E2"),
                  [acked, nacked], [STALE, None], "nack [acked, live]")
    await env.expire()  # the fourth lease was not renewed: it comes back, attempt 2
    again = await env.fetch(stream, "g", lease_ms=env.short_ms)
    check_equal(tried(again), [(3, 2), (4, 2)],
                "redeliveries: the nacked one and the expired one, not the renewed ones")
    nacked_again, renewed_again = again
    check_results(await env.rheo.nack([acked, nacked_again], "again"), [acked, nacked_again],
                  [STALE, None], "nack at max attempts in a mixed batch")
    check_equal([d.sequence for d in await env.rheo.dead_letters(stream, "g")], [2, 3],
                "the nack at max attempts dead-lettered at once")
    check_results(await env.rheo.renew([acked, renewed_again], lease_ms=env.long_ms),
                  [acked, renewed_again], [STALE, None], "renew of a redelivery, mixed batch")
    await env.expire()
    check_equal(await env.fetch(stream, "g"), [], "renewed leases are not handed out again")
    dead = {d.sequence: (d.reason, d.last_error) for d in await env.rheo.dead_letters(stream, "g")}
    check_equal(dead, {2: ("bad", "E1"), 3: (MAX_ATTEMPTS_REASON, "E2")},
                "dead letters of mixed batches, with reasons and last errors")
    check_results(await env.rheo.ack([acked, renewed_again, last]), [acked, renewed_again, last],
                  [None, None, None], "ack [acked, live, live]", repeated=[True, False, False])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 5}, "frontier")


@case(rules=["settle.results", "settle.repeat", "append.idempotent", "lease.exclusive"])
async def case_large_batches(env: CaseEnv) -> None:
    """Batches of hundreds in one partition: fetch, settle, renew and re-append them all."""
    stream = await env.stream()
    events = await env.rheo.append(stream, [NewEvent("t", {"n": i}, id=f"big-{i}")
                                            for i in range(LARGE)])
    leases = await env.drain(stream, "g", limit=LARGE)
    check_equal([lease.sequence for lease in leases], list(range(1, LARGE + 1)),
                f"{LARGE} leases in sequence order")
    renewed = await env.rheo.renew(leases, lease_ms=env.long_ms)
    check_results(renewed, leases, [None] * LARGE, f"renew of {LARGE}")
    await env.ack_ok([leases[LARGE // 2]])
    results = await env.rheo.ack(leases)
    check_results(results, leases, [None] * LARGE, f"ack of {LARGE}, one acked already",
                  repeated=[i == LARGE // 2 for i in range(LARGE)])
    check_equal(await env.rheo.frontier(stream, "g"), {0: LARGE}, "frontier")
    again = await env.rheo.append(stream, [NewEvent("t", {"other": i}, id=f"big-{i}")
                                           for i in range(LARGE)])
    check_equal(again, events, f"re-appending {LARGE} stored ids returns the stored events")
    check_equal((await env.rheo.stream_info(stream)).high_water[0], LARGE, "no new sequences")
    more = await env.drain(stream, "h", limit=LARGE)
    check_results(await env.rheo.reject(more, "bad"), more, [None] * LARGE, f"reject {LARGE}")
    check_equal(len(await env.rheo.dead_letters(stream, "h", limit=1000)), LARGE, "dead letters")


@case(rules=["fetch.fair"])
async def case_small_fetches_serve_every_partition(env: CaseEnv) -> None:
    """Fetches smaller than the partitions with work take turns: no partition starves."""
    for count in (2, 3, 4):
        stream = await env.stream(partitions=count)
        for p in range(count):
            await env.append(stream, 5, partition=p)
        for limit in range(1, count):
            served: set[int] = set()
            for _ in range(count):
                batch = await env.fetch(stream, f"g{limit}", limit)
                served |= {lease.partition for lease in batch}
            check_equal(served, set(range(count)),
                        f"partitions served by {count} fetch(limit={limit}) of {count} partitions")


@case(rules=["fetch.fair", "group.independent"])
async def case_fair_rotation_is_per_group(env: CaseEnv) -> None:
    """Two groups fetching in alternation each take turns over every partition."""
    for count in (2, 4):
        stream = await env.stream(partitions=count)
        for p in range(count):
            await env.append(stream, 2 * count, partition=p)
        served: dict[str, set[int]] = {"g1": set(), "g2": set()}
        for _ in range(count):
            for group, seen in served.items():
                seen |= {lease.partition for lease in await env.fetch(stream, group, 1)}
        for group, seen in served.items():
            check_equal(seen, set(range(count)),
                        f"partitions served to {group} by {count} fetch(limit=1) alternating "
                        f"with another group's, {count} partitions")


@case(rules=["errors.isolated"])
async def case_failing_call_fails_alone(env: CaseEnv) -> None:
    """A call that raises fails alone: concurrent calls on the same instance are unaffected."""
    stream = await env.stream()
    missing = env.name("missing")
    results = await asyncio.gather(
        env.rheo.append(stream, NewEvent("t", {"n": 1})),
        env.rheo.append(missing, NewEvent("t", {"n": 2})),
        env.rheo.append(stream, NewEvent("t", {"n": 3})),
        env.rheo.fetch(missing, "g"),
        return_exceptions=True,
    )
    check(isinstance(results[1], UnknownStream) and isinstance(results[3], UnknownStream),
          f"the calls on a missing stream raise UnknownStream, got {results[1]!r}, {results[3]!r}")
    for i in (0, 2):
        check(isinstance(results[i], list), f"a concurrent append failed with {results[i]!r}")
    check_equal(sorted(positions(await env.drain(stream, "g"))), [(0, 1), (0, 2)],
                "both appends were stored")
    await expect_error(UnknownStream, env.rheo.stream_info(missing), "nothing was created")


async def _settle_as(env: CaseEnv, shape: Shape, op: Op, live: Sequence[Lease], stale: Lease,
                     error: str | None) -> None:
    """Settle the two ``live`` leases through a batch of ``shape``; every result is exact."""
    one, two = live
    far = [dataclasses.replace(stale, lease_id=f"{stale.lease_id}-{i}",
                               event=dataclasses.replace(stale.event, sequence=10_000 + i))
           for i in range(LARGE)]
    batches: dict[Shape, list[list[Lease]]] = {
        "alone": [[one], [two]],
        "clean": [[one, two]],
        "mixed": [[stale, one, dataclasses.replace(two, receipt=two.receipt + "-x"), two]],
        "twice": [[dataclasses.replace(one, receipt=one.receipt + "-x"), one, one, two]],
        "large": [[*far, one, two]],
    }
    expected: dict[Shape, list[SettleKind | None]] = {
        "alone": [None], "clean": [None, None], "mixed": [STALE, None, MISMATCH, None],
        "twice": [MISMATCH, None, None, None], "large": [SettleKind.INVALID] * LARGE + [None] * 2,
    }
    for batch in batches[shape]:
        if op == "nack":
            results = await env.rheo.nack(batch, "again", delay_ms=0, error=error)
        else:
            results = await env.rheo.reject(batch, "bad", error=error)
        repeated = [shape == "twice" and i == 2 for i in range(len(batch))]
        check_results(results, batch, expected[shape], f"{shape}: {op} without an error"
                      if error is None else f"{shape}: {op}", repeated=repeated)


@case(rules=["settle.last_error", "dead_letters.rejected_at", "settle.results", "settle.repeat",
             "settle.fencing", "settle.unknown_lease", "attempts.max"])
async def case_settle_effects_on_every_batch_path(env: CaseEnv) -> None:
    """Last errors, max attempts and dead-letter times hold alone, in clean and mixed batches."""
    for shape in SHAPES:
        stream = await env.stream()
        await env.append(stream, 5)
        await env.rheo.create_group(stream, "g", max_attempts=3)
        old, *leases = await env.fetch(stream, "g")
        check_results(await env.rheo.nack(old, "again", delay_ms=0), [old], [None], "nack 1")
        [current] = await env.fetch(stream, "g", 1)  # ``old`` is stale from here on
        for attempt in (1, 2):
            error = "E1" if attempt == 1 else None
            await _settle_as(env, shape, "nack", leases[:2], old, error)
            await _settle_as(env, shape, "nack", leases[2:], old, error and "E2")
            leases = await env.fetch(stream, "g")
            check_equal(tried(leases),
                        [(s, attempt + 1) for s in (2, 3, 4, 5)], f"{shape}: redeliveries")
        await env.advance(env.short_ms)
        t0 = await env.now()
        await _settle_as(env, shape, "nack", leases[:2], old, None)
        await _settle_as(env, shape, "reject", leases[2:], old, None)
        t1 = await env.now()
        dead = await env.rheo.dead_letters(stream, "g")
        check_equal([(d.sequence, d.reason, d.last_error, d.attempts) for d in dead],
                    [(2, MAX_ATTEMPTS_REASON, "E1", 3), (3, MAX_ATTEMPTS_REASON, "E1", 3),
                     (4, "bad", "E2", 3), (5, "bad", "E2", 3)],
                    f"{shape}: dead letters keep the last error of the first nack")
        for letter in dead:
            stamp = letter.rejected_at_ms
            check(t0 - env.margin_ms <= stamp <= t1 + env.margin_ms,
                  f"{shape}: rejected_at_ms of {letter.sequence} is {stamp}, not in {t0}..{t1}")
        await env.ack_ok([current])
        check_equal(await env.rheo.frontier(stream, "g"), {0: 5}, f"{shape}: frontier")


@case(rules=["fetch.fair", "fetch.order"])
async def case_one_fetch_spreads_over_partitions(env: CaseEnv) -> None:
    """One fetch takes from the partitions in turns, redeliveries first; a short
    partition's share is all it had and the others make up the rest."""
    await _spread_over_partitions(env, keyed=False)


@case(rules=["fetch.fair", "fetch.order", "ordering.key_blocked"], requires=["key_ordering"])
async def case_blocked_events_take_no_turn(env: CaseEnv) -> None:
    """In a key-ordered group one fetch's turns go to eligible deliveries only: the
    events a key blocks take no turn, in a partition's share or in another's."""
    await _spread_over_partitions(env, keyed=True)


async def _spread_over_partitions(env: CaseEnv, *, keyed: bool) -> None:
    what = f"ordering={'key' if keyed else 'none'!r}"
    stream = await env.stream(partitions=3)
    await env.rheo.create_group(stream, "g", ordering="key" if keyed else "none")

    async def add(partition: int, keys: list[str]) -> None:
        await env.rheo.append(stream, [NewEvent("t", {"k": k}, key=k, partition=partition)
                                       for k in keys])

    # Redeliveries waiting: three in partition 0, one in partition 2.
    await add(0, ["a0", "b0", "c0"])
    await add(2, ["a2"])
    first = await env.fetch(stream, "g", 10)
    check_equal(sorted(positions(first)), [(0, 1), (0, 2), (0, 3), (2, 1)],
                f"the first fetch, {what}")
    check_results(await env.rheo.nack(first, "again"), first, [None] * 4, "nack")
    # New events: partition 0's a0 and partition 1's second k wait behind an
    # earlier delivery of their key in a key-ordered group.
    await add(0, ["a0", "d0", "e0", "f0", "g0"])  # seqs 4-8
    await add(1, ["k", "k", "a1", "b1", "c1"])  # seqs 1-5
    await add(2, ["b2", "c2", "d2", "e2", "f2"])  # seqs 2-6

    def shares(leases: list[Lease]) -> dict[int, list[tuple[int, int]]]:
        out: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}
        for lease in leases:
            out[lease.partition].append((lease.sequence, lease.attempt))
        return {p: sorted(v) for p, v in out.items()}

    one = shares(await env.fetch(stream, "g", 6))
    check_equal(len(one[0]), 2, f"partition 0's share of fetch(limit=6), {what}: {one}")
    check(all(seq <= 3 and attempt == 2 for seq, attempt in one[0]),
          f"partition 0's share is two of its redeliveries, {what}: {one[0]}")
    check_equal(one[1], [(1, 1), (3, 1)] if keyed else [(1, 1), (2, 1)],
                f"partition 1's share of fetch(limit=6), {what}")
    check_equal(one[2], [(1, 2), (2, 1)], f"partition 2's share of fetch(limit=6), {what}")
    left = ({1, 2, 3} - {seq for seq, _ in one[0]}).pop()
    # Eligible now: partition 0 one redelivery and 5 (keyed: 4) new, partition 1
    # 3 (keyed: 2, its second k waits behind the first), partition 2 four.
    limit = 8 if keyed else 9
    two = shares(await env.fetch(stream, "g", limit))
    check_equal(two, {0: sorted([(left, 2), (5, 1), (6, 1)] if keyed
                                else [(left, 2), (4, 1), (5, 1)]),
                      1: [(4, 1), (5, 1)] if keyed else [(3, 1), (4, 1), (5, 1)],
                      2: [(3, 1), (4, 1), (5, 1)]},
                f"the shares of fetch(limit={limit}), {what}")
    three = shares(await env.fetch(stream, "g", 100))
    check_equal(three, {0: [(7, 1), (8, 1)] if keyed else [(6, 1), (7, 1), (8, 1)],
                        1: [], 2: [(6, 1)]},
                f"what is left eligible, {what}")


@case(rules=["fetch.fair", "fetch.limit", "fetch.order"])
async def case_turns_match_a_model(env: CaseEnv) -> None:
    """Fetches of every size over uneven partitions: each takes the first eligible
    events of each partition in turns, as a model of the rule predicts."""
    await _turns_against_model(env, keyed=False)


@case(rules=["fetch.fair", "fetch.limit", "ordering.key_blocked", "ordering.released",
             "ordering.others_flow"], requires=["key_ordering"])
async def case_keyed_turns_match_a_model(env: CaseEnv) -> None:
    """The same in a key-ordered group with runs of blocked keys: each fetch takes
    the first eligible events of each partition in turns, as a model predicts."""
    await _turns_against_model(env, keyed=True)


async def _turns_against_model(env: CaseEnv, *, keyed: bool) -> None:
    """Layouts drawn from fixed seeds (3 partitions, runs of one key, a few keys,
    keyless events); fetches of limits 1..9, acking every other one. After each fetch:
    each partition's share is eligible events, those a key held back first (in any
    order), then the newer ones in sequence order, and the shares are a water-filling
    of ``limit`` over what each partition had."""
    for seed in (3, 11, 29, 47, 83):
        rng = random.Random(seed)
        stream = await env.stream(partitions=3)
        await env.rheo.create_group(stream, "g", ordering="key" if keyed else "none")
        layout = [_model_keys(rng) for _ in range(3)]
        for partition, keys in enumerate(layout):
            if keys:
                await env.rheo.append(stream, [NewEvent("t", key=k, partition=partition)
                                               for k in keys])
        leased: dict[int, dict[int, Lease]] = {0: {}, 1: {}, 2: {}}  # in flight
        done: dict[int, set[int]] = {0: set(), 1: set(), 2: set()}  # acked
        read = [0, 0, 0]  # the highest sequence delivered so far, per partition
        for step in range(40):
            eligible = {p: _model_eligible(layout[p], leased[p], done[p], keyed)
                        for p in range(3)}
            total = sum(map(len, eligible.values()))
            if total == 0 and not any(leased.values()):
                break
            limit = 1 + step % 9
            got: dict[int, list[int]] = {0: [], 1: [], 2: []}
            batch = await env.fetch(stream, "g", limit)
            for lease in batch:
                got[lease.partition].append(lease.sequence)
                leased[lease.partition][lease.sequence] = lease
            what = f"seed {seed}, fetch {step} (limit {limit}), eligible {eligible}: got {got}"
            check_equal(len(batch), min(limit, total), f"{what}: how many")
            for p in range(3):
                # Events a fetch passed over while their key was blocked are, once
                # released, eligible again like redeliveries: in any order among
                # themselves, before the partition's newer events, which go in order.
                share = sorted(got[p])
                waiting = [seq for seq in eligible[p] if seq < read[p]]
                newer = [seq for seq in eligible[p] if seq > read[p]]
                fresh = [seq for seq in share if seq > read[p]]
                check(set(share) <= set(eligible[p]) and fresh == newer[:len(fresh)]
                      and (not fresh or set(waiting) <= set(share)),
                      f"{what}: partition {p} takes eligible events, released ones first, "
                      "newer ones in order")
                read[p] = max([read[p], *share])
            level = _water_level(limit, [len(e) for e in eligible.values()])
            for p in range(3):
                low, high = min(len(eligible[p]), level), min(len(eligible[p]), level + 1)
                check(low <= len(got[p]) <= high,
                      f"{what}: partition {p}'s share is {low}..{high} (turns)")
            if step % 2:  # ack everything in flight
                flying = [x for per in leased.values() for x in per.values()]
                await env.ack_ok(flying)
                for p in range(3):
                    done[p] |= set(leased[p])
                    leased[p].clear()


def _model_keys(rng: random.Random) -> list[str | None]:
    """One partition's keys: 0 to 25 events, runs of one key, a few keys, keyless ones."""
    keys: list[str | None] = []
    for _ in range(rng.choice((0, 6, 14, 25))):
        if keys and rng.random() < 0.4:  # runs of one key
            keys.append(keys[-1])
        else:
            keys.append(None if rng.random() < 0.2 else rng.choice("abcdef"))
    return keys


def _model_eligible(keys: Sequence[str | None], leased: dict[int, Lease], done: set[int],
                    keyed: bool) -> list[int]:
    """The sequences a fetch may lease in one partition, in order: never delivered,
    and (keyed) every earlier event of the key acked."""
    out: list[int] = []
    for seq, key in enumerate(keys, start=1):
        if seq in leased or seq in done:
            continue
        if keyed and key is not None and any(
                k == key and s not in done for s, k in enumerate(keys[:seq - 1], start=1)):
            continue
        out.append(seq)
    return out


def _water_level(limit: int, sizes: Sequence[int]) -> int:
    """The largest d with sum(min(size, d)) <= limit: every share is min(size, d) or
    min(size, d + 1)."""
    d = 0
    while sum(min(size, d + 1) for size in sizes) <= limit and d < max(sizes, default=0):
        d += 1
    return d


@case(rules=["settle.nack", "attempts.max", "frontier.contiguous", "group.independent"])
async def case_nack_across_groups_with_one_at_its_last_attempt(env: CaseEnv) -> None:
    """One nack of two groups' leases, one at its last attempt: that one is dead-
    lettered and its group's frontier moves; the other goes back, whichever comes first."""
    for order in ("back first", "dead first"):
        stream = await env.stream_with(1, 1)
        await env.rheo.create_group(stream, "a", max_attempts=5)
        await env.rheo.create_group(stream, "b", max_attempts=1)
        [back] = await env.fetch(stream, "a", partitions=[0])
        [dead] = await env.fetch(stream, "b", partitions=[1])
        batch = [back, dead] if order == "back first" else [dead, back]
        check_results(await env.rheo.nack(batch, "again"), batch, [None, None],
                      f"{order}: nack of both")
        check_equal(await env.rheo.frontier(stream, "b"), {0: 0, 1: 1},
                    f"{order}: b's frontier passes its dead letter")
        check_equal(await env.rheo.frontier(stream, "a"), {0: 0, 1: 0}, f"{order}: a's frontier")
        check_equal([(d.partition, d.sequence, d.reason)
                     for d in await env.rheo.dead_letters(stream, "b")],
                    [(1, 1, MAX_ATTEMPTS_REASON)], f"{order}: b's dead letter")
        check_equal([(x.partition, x.sequence, x.attempt)
                     for x in await env.fetch(stream, "a", partitions=[0])],
                    [(0, 1, 2)], f"{order}: a's delivery comes back")
@case(rules=["settle.ack", "settle.fencing", "settle.nack", "settle.renew",
             "frontier.contiguous"])
async def case_ack_of_a_whole_fetch_after_changes_to_it(env: CaseEnv) -> None:
    """The leases of one fetch acked together, in order, after one of them changed.

    A lease of the fetch renewed (its own deadline), nacked (stale, its
    delivery back), or cut off by a replay (stale from there on): the ack acts on
    each lease alone, the frontier is exact, and nothing acked comes back.
    """
    changes: tuple[str, ...] = ("renewed", "nacked", "replayed", "untouched")
    for change in changes:
        stream = await env.stream()
        await env.append(stream, 5)
        leases = await env.fetch(stream, "g")
        kinds: list[SettleKind | None] = [None] * 5
        if change == "renewed":
            check_results(await env.rheo.renew(leases[2], lease_ms=env.short_ms), leases[2:3],
                          [None], f"{change}: renew 3")
        elif change == "nacked":
            check_results(await env.rheo.nack(leases[2], "later", delay_ms=0), leases[2:3],
                          [None], f"{change}: nack 3")
            kinds[2] = STALE
        elif change == "replayed":
            await env.rheo.replay(stream, "g", from_sequence=4)
            kinds[3:] = [STALE, STALE]
        check_results(await env.rheo.ack(leases), leases, kinds, f"{change}: ack all five")
        frontier = {"nacked": 2, "replayed": 3}.get(change, 5)
        check_equal(await env.rheo.frontier(stream, "g"), {0: frontier}, f"{change}: frontier")
        await env.expire()
        back = {"nacked": [(3, 2)], "replayed": [(4, 1), (5, 1)]}.get(change, [])
        again = await env.fetch(stream, "g")
        check_equal(tried(again), back,
                    f"{change}: only what the ack did not settle comes back")
        await env.ack_ok(again)
        check_equal(await env.rheo.frontier(stream, "g"), {0: 5}, f"{change}: final frontier")


@case(rules=["settle.repeat", "frontier.contiguous"])
async def case_repeated_ack_of_part_of_a_fetch(env: CaseEnv) -> None:
    """The leases of one fetch acked together, then a part of them (or all) acked again
    behind the frontier: each a repeat, the frontier where it was."""
    stream = await env.stream()
    await env.append(stream, 4)
    [one] = await env.fetch(stream, "g", 1)
    fetched = await env.fetch(stream, "g")
    await env.ack_ok([one, *fetched])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4}, "frontier after acking all")
    for part in (fetched[:1], fetched[:2], fetched[1:], fetched, [one]):
        check_results(await env.rheo.ack(part), part, [None] * len(part),
                      f"a repeated ack of {[x.sequence for x in part]}",
                      repeated=[True] * len(part))
        check_equal(await env.rheo.frontier(stream, "g"), {0: 4},
                    "a repeated ack leaves the frontier")


@case(rules=["lease.expiry", "settle.ack", "frontier.contiguous"])
async def case_fetch_acked_from_the_front_then_the_rest_expires(env: CaseEnv) -> None:
    """The leases of one fetch acked from the front, one settle each: the rest still
    expire and come back, once, with attempt 2."""
    stream = await env.stream()
    await env.append(stream, 4)
    one, two, *_rest = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.ack_ok([one])
    await env.ack_ok([two])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "frontier")
    await env.expire()
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(3, 2), (4, 2)], "the expired rest")
    await env.ack_ok(again)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4}, "final frontier")


@case(rules=["settle.results", "settle.fencing", "frontier.contiguous"])
async def case_replayed_lease_beside_the_current_one(env: CaseEnv) -> None:
    """A lease from before a replay and the current lease of the same delivery, acked
    together at the frontier: the old one is stale, the new one takes effect."""
    stream = await env.stream()
    await env.append(stream, 2)
    old = await env.fetch(stream, "g")
    await env.rheo.replay(stream, "g", from_sequence=1)
    new = await env.fetch(stream, "g")
    check_results(await env.rheo.ack([old[0], new[0]]), [old[0], new[0]], [STALE, None],
                  "the replayed lease, then the current one")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "frontier")
    check_results(await env.rheo.ack([new[1], old[1]]), [new[1], old[1]], [None, STALE],
                  "the current lease, then the replayed one")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "final frontier")


HUGE = 4_100
"""Events in one append: more than a server takes in one variadic command (Redis' Lua
unpacks 8,000 values at most, two per event id: a backend must send them in pieces)."""
RUN = 2_001
"""Events read in one fetch: a replay of all but the first forgets a range longer than a
server handles in one command of a chunked loop (2,000 for the Redis scripts)."""


@case(rules=["append.batch", "replay.from_sequence", "frontier.contiguous"])
async def case_replay_of_a_long_run(env: CaseEnv) -> None:
    """Thousands of events in one append, fetch and replay keep an exact frontier.

    The replay forgets the ack behind a hole in the run, and once the hole closes
    the frontier jumps every ack behind it at once."""
    stream = await env.stream()
    events = await env.append(stream, HUGE)
    check_equal([e.sequence for e in events], list(range(1, HUGE + 1)), "one append")
    leases = await env.fetch(stream, "g", RUN)
    check_equal([x.sequence for x in leases], list(range(1, RUN + 1)), "one fetch")
    await env.ack_ok(leases[2:3])
    await env.rheo.replay(stream, "g", from_sequence=2)
    again = await env.fetch(stream, "g", 50)
    check_equal(tried(again), [(n, 1) for n in range(2, 52)],
                "the replayed run, delivered afresh")
    await env.ack_ok(again[1:40])
    await env.ack_ok(leases[:1])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "2 is a hole")
    await env.ack_ok(again[:1])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 41}, "the hole closes")
