"""Cases about key-ordered groups (``ordering="key"``, capability ``key_ordering``).

In such a group a delivery of key K in partition p is leased only once every
earlier delivery of K in p is settled (acked, rejected or dead-lettered); a
leased, nacked or expired earlier delivery blocks it, while keyless events and
other keys keep flowing. The ordering is fixed when the group is created.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from .._model._errors import InvalidArgument
from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._settle_results import SettleKind
from ._case import CaseEnv, case, check, check_equal, check_results, expect_error, states, tried

Settle = Literal["ack", "reject", "nack at max attempts", "expiry at max attempts"]


async def _keyed(env: CaseEnv, keys: Sequence[str | None], *, partitions: int = 1,
                 max_attempts: int | None = None) -> str:
    """A stream with a key-ordered group ``g`` and one event per key, appended to
    partition 0 in order (``None``: a keyless event)."""
    stream = await env.stream(partitions)
    await env.rheo.create_group(stream, "g", ordering="key", max_attempts=max_attempts)
    await env.rheo.append(stream, [NewEvent("t", {"n": i}, key=k, partition=0)
                                   for i, k in enumerate(keys)])
    return stream


def _seqs(leases: Sequence[Lease]) -> list[int]:
    return [lease.sequence for lease in leases]


@case(rules=["ordering.key_blocked"], requires=["key_ordering"])
async def case_key_blocked_while_leased(env: CaseEnv) -> None:
    """A leased delivery of a key blocks every later delivery of that key."""
    stream = await _keyed(env, ["a", "a", "b", "a"])
    first = await env.fetch(stream, "g")
    check_equal(_seqs(first), [1, 3], "one delivery per key: the earliest of each")
    check_equal(await env.fetch(stream, "g"), [], "later deliveries of leased keys")
    await env.ack_ok([x for x in first if x.event.key == "b"])
    check_equal(await env.fetch(stream, "g"), [], "a is still leased")


@case(rules=["ordering.key_blocked", "trim.removed"], requires=["key_ordering", "trim"])
async def case_trim_leaves_keys_past_its_bound_blocked(env: CaseEnv) -> None:
    """A forced trim releases only the keys whose leased head it removes.

    A key leased past the bound still blocks its later events."""
    stream = await _keyed(env, ["a", "b", "b", "a"])
    first = await env.fetch(stream, "g")
    check_equal(_seqs(first), [1, 2], "the heads of a and b")
    check_equal(await env.rheo.trim(stream, up_to=1, force=True), {0: 1}, "trim a's head")
    check_equal(_seqs(await env.fetch(stream, "g")), [4], "a is free; b's 3 waits for 2")
    await env.ack_ok(first[1:])
    check_equal(_seqs(await env.fetch(stream, "g")), [3], "then 3")


@case(rules=["ordering.key_blocked", "append.round_trip"], requires=["key_ordering"])
async def case_keys_in_any_text_block(env: CaseEnv) -> None:
    """A key blocks whatever its text, and whatever its events' types and ids.

    Quotes, backslashes and control characters (which a store may have to escape)
    too."""
    stream = await env.stream()
    await env.rheo.create_group(stream, "g", ordering="key")
    keys = ['q"k', "b\\k", "t\tk", "a", "a"]
    events = [NewEvent("t", key=k) for k in keys[:3]]
    events += [NewEvent('t"y', key="a", id='i"d\\'), NewEvent("t\n", key="a")]
    events += [NewEvent("t", key=k) for k in keys[:3]] + [NewEvent("t", key="a")]
    await env.rheo.append(stream, events)
    first = await env.fetch(stream, "g")
    check_equal(_seqs(first), [1, 2, 3, 4], "the first delivery of each key")
    check_equal([x.event.key for x in first], keys[:4], "the keys come back as written")
    await env.ack_ok(first)
    check_equal(_seqs(await env.fetch(stream, "g")), [5, 6, 7, 8], "then the second ones")


@case(rules=["ordering.released", "attempts.max"], requires=["key_ordering"])
async def case_key_released_by_settling_for_good(env: CaseEnv) -> None:
    """An ack, a reject or a dead-lettering makes the next delivery of the key eligible."""
    hows: tuple[Settle, ...] = ("ack", "reject", "nack at max attempts",
                                "expiry at max attempts")
    for how in hows:
        stream = await _keyed(env, ["a", "a", "a"], max_attempts=1)
        short = how == "expiry at max attempts"
        [first] = await env.fetch(stream, "g", lease_ms=env.short_ms if short else None)
        check_equal(first.sequence, 1, f"{how}: first delivery")
        if how == "ack":
            await env.ack_ok([first])
        elif how == "reject":
            check_results(await env.rheo.reject(first, "bad"), [first], [None], how)
        elif how == "nack at max attempts":
            check_results(await env.rheo.nack(first, "again"), [first], [None], how)
        else:
            await env.expire()
        nxt = await env.fetch(stream, "g")
        if not nxt and short:  # the fetch that dead-letters may still hold the key
            nxt = await env.fetch(stream, "g")
        check_equal(tried(nxt), [(2, 1)],
                    f"{how}: the next delivery of the key")
        if how != "ack":
            dead = await env.rheo.dead_letters(stream, "g")
            check_equal([d.sequence for d in dead], [1], f"{how}: dead letters")


@case(rules=["ordering.key_blocked", "settle.nack"], requires=["key_ordering", "delayed_nack"])
async def case_nack_keeps_key_blocked(env: CaseEnv) -> None:
    """A nacked delivery blocks its key through its delay and until its redelivery settles."""
    stream = await _keyed(env, ["a", "a", "b"])
    first = await env.fetch(stream, "g")
    check_equal(_seqs(first), [1, 3], "first fetch")
    check_results(await env.rheo.nack(first[0], "later", delay_ms=env.short_ms),
                  first[:1], [None], "nack")
    check_equal(await env.fetch(stream, "g"), [], "during the nack delay")
    await env.expire()
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(1, 2)], "the redelivery only")
    check_equal(await env.fetch(stream, "g"), [], "while the redelivery is leased")
    check_results(await env.rheo.nack(again, "now", delay_ms=0), again, [None], "nack")
    third = await env.fetch(stream, "g")
    check_equal(tried(third), [(1, 3)], "nacked without delay")
    await env.ack_ok(third)
    check_equal(tried(await env.fetch(stream, "g")), [(2, 1)],
                "after the redelivery is acked")


@case(rules=["ordering.released", "lease.expiry"], requires=["key_ordering"])
async def case_expired_lease_re_leases_earliest_first(env: CaseEnv) -> None:
    """An expired lease re-leases the earliest delivery of its key; the later stays blocked."""
    stream = await _keyed(env, ["a", "a"])
    [first] = await env.fetch(stream, "g", lease_ms=env.short_ms)
    await env.expire_at_the_deadline(stream, "g")
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(1, 2)], "after the expiry")
    check_equal(await env.fetch(stream, "g"), [], "the later one stays blocked")
    check_results(await env.rheo.ack(first), [first], [SettleKind.STALE_LEASE],
                  "the expired lease")
    await env.ack_ok(again)
    check_equal(_seqs(await env.fetch(stream, "g")), [2], "after the ack")


@case(rules=["ordering.others_flow", "fetch.limit"], requires=["key_ordering"])
async def case_blocked_key_does_not_stall_others(env: CaseEnv) -> None:
    """Fetch passes over a blocked key and fills the batch with other keys and keyless ones."""
    stream = await _keyed(env, ["a", "a", "a", "a", "b", None, "c", "a", None, "b", "d"])
    [first] = await env.fetch(stream, "g", 1)
    check_equal(first.sequence, 1, "first fetch")
    more = await env.fetch(stream, "g", 4)
    check_equal(_seqs(more), [5, 6, 7, 9], "past the blocked key, in sequence order")
    rest = await env.fetch(stream, "g")
    check_equal(_seqs(rest), [11], "b is leased, a is blocked")
    await env.ack_ok([first, *more, *rest])
    check_equal(_seqs(await env.fetch(stream, "g")), [2, 10], "the next of a and of b")


@case(rules=["ordering.released", "attempts.max"], requires=["key_ordering"])
async def case_key_released_for_an_event_appended_after(env: CaseEnv) -> None:
    """An event of a key appended after its last delivery was settled for good is
    eligible at the next fetch, while an earlier event of another key is in flight."""
    hows: tuple[Settle, ...] = ("ack", "reject", "nack at max attempts")
    for how in hows:
        stream = await _keyed(env, ["h", "a"], max_attempts=1)
        held, first = await env.fetch(stream, "g")
        check_equal((held.sequence, first.sequence), (1, 2), f"{how}: the first fetch")
        if how == "ack":
            await env.ack_ok([first])
        elif how == "reject":
            check_results(await env.rheo.reject(first, "bad"), [first], [None], how)
        else:
            check_results(await env.rheo.nack(first, "again"), [first], [None], how)
        await env.rheo.append(stream, [NewEvent("t", key="a", partition=0)])
        check_equal(tried(await env.fetch(stream, "g")), [(3, 1)],
                    f"{how}: the key's new event, with h still leased")


@case(rules=["ordering.key_blocked"], requires=["key_ordering"])
async def case_key_order_is_per_partition(env: CaseEnv) -> None:
    """The same key in two partitions is two independent orders."""
    stream = await env.stream(2)
    await env.rheo.create_group(stream, "g", ordering="key")
    await env.rheo.append(stream, [NewEvent("t", {"n": i}, key="a", partition=i % 2)
                                   for i in range(4)])
    leased = await env.fetch(stream, "g")
    check_equal(sorted((x.partition, x.sequence) for x in leased), [(0, 1), (1, 1)],
                "the earliest of the key in each partition")
    # Settling partition 1's head releases partition 1's next, whatever partition 0
    # still holds; events appended now are ordered per partition too.
    await env.ack_ok([x for x in leased if x.partition == 1])
    await env.rheo.append(stream, [NewEvent("t", key="a", partition=1)])
    check_equal([(x.partition, x.sequence) for x in await env.fetch(stream, "g")], [(1, 2)],
                "partition 1's next a, while partition 0's first a is leased")
    # Both partitions' heads nacked at the same sequence: each comes back once.
    stream = await env.stream(2)
    await env.rheo.create_group(stream, "g", ordering="key")
    await env.rheo.append(stream, [NewEvent("t", key="a", partition=p) for p in (0, 1, 0, 1)])
    heads = await env.fetch(stream, "g")
    check_results(await env.rheo.nack(heads, "again"), heads, [None, None], "nack both heads")
    check_equal(states(await env.fetch(stream, "g")),
                [(0, 1, 2), (1, 1, 2)], "each partition's nacked head, once")


@case(rules=["ordering.released", "replay.from_sequence"], requires=["key_ordering"])
async def case_replay_orders_keys_again(env: CaseEnv) -> None:
    """After a replay (or a reset) the rule applies again from the first redelivered event."""
    stream = await _keyed(env, ["a", "a", "b", "b"])
    for _ in range(4):
        await env.ack_ok(await env.fetch(stream, "g"))
    check_equal(await env.rheo.frontier(stream, "g"), {0: 4}, "everything acked")
    await env.rheo.replay(stream, "g", from_sequence=1)
    check_equal(_seqs(await env.fetch(stream, "g")), [1, 3], "after the replay")
    await env.rheo.reset(stream, "g", to="earliest")
    check_equal(_seqs(await env.fetch(stream, "g")), [1, 3], "after the reset")


@case(rules=["ordering.declared"], requires=["key_ordering"])
async def case_group_info_reports_ordering(env: CaseEnv) -> None:
    """create_group, group_info and groups report each group's ordering."""
    stream = await env.stream()
    created = await env.rheo.create_group(stream, "keyed", ordering="key")
    check_equal(created.ordering, "key", "create_group(ordering='key')")
    check_equal((await env.rheo.create_group(stream, "plain")).ordering, "none", "default")
    check_equal((await env.rheo.group_info(stream, "keyed")).ordering, "key", "group_info")
    check_equal({g.group: g.ordering for g in await env.rheo.groups(stream)},
                {"keyed": "key", "plain": "none"}, "groups")
    again = await env.rheo.create_group(stream, "keyed", ordering="key", max_attempts=3)
    check_equal((again.ordering, again.max_attempts), ("key", 3), "create_group again")
    await env.rheo.append(stream, [NewEvent("t", key="a"), NewEvent("t", key="a")])
    check_equal(len(await env.fetch(stream, "plain")), 2, "an unordered group is not held")


@case(rules=["ordering.declared"], requires=["key_ordering"])
async def case_ordering_mismatch_is_refused(env: CaseEnv) -> None:
    """Asking an existing group for another ordering raises InvalidArgument naming both."""
    stream = await env.stream()
    await env.rheo.create_group(stream, "keyed", ordering="key")
    await env.rheo.create_group(stream, "plain")
    exc = await expect_error(InvalidArgument, env.rheo.create_group(
        stream, "keyed", ordering="none", max_attempts=9),
        "ordering 'none' for a key-ordered group")
    check("'key'" in str(exc) and "'none'" in str(exc), f"the message names both: {exc}")
    exc = await expect_error(InvalidArgument, env.rheo.create_group(
        stream, "plain", ordering="key", max_attempts=9),
        "ordering 'key' for an unordered group")
    check("'key'" in str(exc) and "'none'" in str(exc), f"the message names both: {exc}")
    unknown: Any = "keys"
    await expect_error(InvalidArgument, env.rheo.create_group(stream, "other", ordering=unknown),
                       "an unknown ordering")
    check_equal({g.group: (g.ordering, g.max_attempts) for g in await env.rheo.groups(stream)},
                {"keyed": ("key", 5), "plain": ("none", 5)}, "nothing changed")


@case(rules=["ordering.declared", "ordering.key_blocked"], requires=["key_ordering"],
      needs_peer=True)
async def case_ordering_persists_for_peers(env: CaseEnv) -> None:
    """Another instance on the same store sees the group's ordering and obeys it."""
    stream = await _keyed(env, ["a", "a", "b"])
    async with env.peer() as other:
        check_equal((await other.group_info(stream, "g")).ordering, "key", "peer group_info")
        mine = await env.fetch(stream, "g", 1)
        check_equal(_seqs(mine), [1], "first instance")
        theirs = await other.fetch(stream, "g", limit=10, lease_ms=env.long_ms)
        check_equal(_seqs(theirs), [3], "the peer skips the key the first one holds")
        await expect_error(InvalidArgument, other.create_group(stream, "g", ordering="none"),
                           "the peer asks for another ordering")
        check_equal((await other.create_group(stream, "g", ordering="key")).ordering, "key",
                    "the peer asks for the same ordering")
        check_results(await other.ack(mine), mine, [None], "ack via the peer")
        check_equal(_seqs(await other.fetch(stream, "g", limit=10, lease_ms=env.long_ms)), [2],
                    "the next of the key, on the peer")


@case(rules=["ordering.key_blocked", "fetch.limit"], requires=["key_ordering"])
async def case_new_event_of_leased_key_waits(env: CaseEnv) -> None:
    """An event of a leased (or nacked) key appended after an empty fetch still waits."""
    heads: tuple[str, ...] = ("leased", "nacked")
    for head in heads:
        stream = await _keyed(env, ["a"])
        [first] = await env.fetch(stream, "g")
        if head == "nacked":
            delay = env.long_ms if env.backend.capabilities.delayed_nack else 0
            check_results(await env.rheo.nack(first, "later", delay_ms=delay), [first], [None],
                          "nack")
            if not delay:
                [first] = await env.fetch(stream, "g")
        check_equal(await env.fetch(stream, "g"), [], f"{head}: nothing is eligible")
        await env.rheo.append(stream, [NewEvent("t", key="a", partition=0),
                                       NewEvent("t", key=None, partition=0)])
        check_equal(_seqs(await env.fetch(stream, "g")), [3],
                    f"{head}: the keyless event, not the second event of a")
        check_equal(await env.fetch(stream, "g"), [], f"{head}: a is still blocked")
        await env.rheo.append(stream, [NewEvent("t", key="a", partition=0)])
        check_equal(await env.fetch(stream, "g"), [], f"{head}: a third event of a waits too")
        if head == "leased":
            await env.ack_ok([first])
            check_equal(tried(await env.fetch(stream, "g")), [(2, 1)], f"{head}: after the ack")
            check_equal(await env.fetch(stream, "g"), [], f"{head}: 4 waits for 2")


@case(rules=["ordering.key_blocked", "group.independent", "settle.nack", "lease.expiry"],
      requires=["key_ordering"])
async def case_two_key_ordered_groups_block_only_themselves(env: CaseEnv) -> None:
    """A key leased in one key-ordered group never holds back the same key's
    redeliveries in another: nacked, expired or new."""
    stream = await _keyed(env, ["a", "a", "a"])
    await env.rheo.create_group(stream, "h", ordering="key")
    [held] = await env.fetch(stream, "g")  # g holds a1; its a2 and a3 wait
    [one] = await env.fetch(stream, "h")
    await env.ack_ok([one])
    [two] = await env.fetch(stream, "h", lease_ms=env.short_ms)
    check_equal(two.sequence, 2, "h: a2 once a1 is acked")
    check_results(await env.rheo.nack(two, "again"), [two], [None], "h nacks a2")
    [again] = await env.fetch(stream, "h", lease_ms=env.short_ms)
    check_equal((again.sequence, again.attempt), (2, 2), "h: the nacked a2, while g holds a1")
    await env.expire()
    [third] = await env.fetch(stream, "h")
    check_equal((third.sequence, third.attempt), (2, 3), "h: the expired a2, while g holds a1")
    await env.ack_ok([third])
    check_equal(tried(await env.fetch(stream, "h")), [(3, 1)], "h: a3, new")
    check_equal(await env.fetch(stream, "g"), [], "g: a2 still waits behind its own a1")
    await env.ack_ok([held])


@case(rules=["ordering.key_blocked", "ordering.released", "trim.removed"],
      requires=["key_ordering", "trim"])
async def case_trim_releases_by_key_and_partition(env: CaseEnv) -> None:
    """Trimming a key's leased head releases its next event whatever other keys, or
    the same key in another partition, still hold in flight."""
    stream = await env.stream(2)
    await env.rheo.create_group(stream, "g", ordering="key")
    await env.rheo.append(stream, [NewEvent("t", key=k, partition=0)
                                   for k in ("a", "x", "a", "b")])
    await env.rheo.append(stream, [NewEvent("t", key="a", partition=1)])
    leased = await env.fetch(stream, "g")
    check_equal(sorted((x.partition, x.sequence) for x in leased),
                [(0, 1), (0, 2), (0, 4), (1, 1)],
                "a1, x2 and b4 of partition 0, a1 of partition 1; a3 waits")
    later = [x for x in leased if (x.partition, x.sequence) == (0, 4)]
    check_results(await env.rheo.nack(later, "later", delay_ms=env.long_ms), later, [None],
                  "nack b4 with a delay")
    await env.rheo.trim(stream, up_to={0: 1}, force=True)
    check_equal([(x.partition, x.sequence) for x in await env.fetch(stream, "g")], [(0, 3)],
                "a3 once a1 is trimmed, with x2 and partition 1's a1 still leased (and b4 "
                "waiting for its delay)")


@case(rules=["ordering.released", "trim.removed"], requires=["key_ordering", "trim"])
async def case_trim_of_several_partitions_releases_each(env: CaseEnv) -> None:
    """One forced trim over several partitions releases the held keys of every one."""
    stream = await env.stream(2)
    await env.rheo.create_group(stream, "g", ordering="key")
    for partition in (0, 1):
        await env.rheo.append(stream, [NewEvent("t", key="a", partition=partition)] * 2)
    check_equal(states(await env.fetch(stream, "g")), [(0, 1, 1), (1, 1, 1)],
                "a1 of each partition; both a2s wait")
    check_equal(await env.rheo.trim(stream, up_to={0: 1, 1: 1}, force=True), {0: 1, 1: 1},
                "trim both leased heads")
    check_equal(states(await env.fetch(stream, "g")), [(0, 2, 1), (1, 2, 1)],
                "both a2s, released by the one trim")


@case(rules=["ordering.released", "settle.nack"], requires=["key_ordering"])
async def case_release_leaves_other_delays_alone(env: CaseEnv) -> None:
    """Releasing a key makes only its next delivery due: another key's delivery
    nacked with a delay in the same partition keeps its delay."""
    stream = await _keyed(env, ["a", "a", "b"])
    first, other = await env.fetch(stream, "g")
    check_equal((first.sequence, other.sequence), (1, 3), "a1 and b3; a2 waits")
    check_results(await env.rheo.nack(other, "later", delay_ms=env.long_ms), [other], [None],
                  "nack b3 with a delay")
    await env.ack_ok([first])
    check_equal(tried(await env.fetch(stream, "g")), [(2, 1)],
                "a2, released; b3 waits for its delay")


@case(rules=["ordering.key_blocked", "trim.removed", "fetch.limit"],
      requires=["key_ordering", "trim"])
async def case_trimmed_head_releases_its_key(env: CaseEnv) -> None:
    """Trimming a key's leased or nacked head releases the next event, and only that one."""
    heads: tuple[str, ...] = ("leased", "nacked")
    for head in heads:
        stream = await _keyed(env, ["a", "a", "a", "b"])
        first, other = await env.fetch(stream, "g")
        check_equal(_seqs([first, other]), [1, 4], f"{head}: the heads of a and b")
        if head == "nacked":
            delay = env.long_ms if env.backend.capabilities.delayed_nack else 0
            check_results(await env.rheo.nack(first, "later", delay_ms=delay), [first], [None],
                          f"{head}: nack 1")
            if not delay:
                [first] = await env.fetch(stream, "g")
        check_equal(await env.fetch(stream, "g"), [], f"{head}: 2 and 3 are held behind 1")
        check_equal(await env.rheo.trim(stream, up_to={0: 1}, force=True), {0: 1},
                    f"{head}: trim 1")
        check_results(await env.rheo.ack(first), [first], [SettleKind.STALE_LEASE],
                      f"{head}: the trimmed head's lease")
        check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, f"{head}: frontier")
        second = await env.fetch(stream, "g")
        check_equal(tried(second), [(2, 1)], f"{head}: the next event of a, alone")
        check_equal(await env.fetch(stream, "g"), [], f"{head}: 3 waits for 2")
        await env.ack_ok([*second, other])
        check_equal(tried(await env.fetch(stream, "g")), [(3, 1)], f"{head}: then 3")
        check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, f"{head}: frontier at the end")


@case(rules=["ordering.key_blocked", "ordering.released", "trim.removed"],
      requires=["key_ordering", "trim"])
async def case_blocked_key_after_a_trim(env: CaseEnv) -> None:
    """A trim past a blocked key's head and some held events leaves the first retained one next."""
    stream = await _keyed(env, ["a", "a", "a", "a", "b"])
    first, other = await env.fetch(stream, "g")
    check_equal(_seqs([first, other]), [1, 5], "the heads of a and b")
    check_equal(await env.fetch(stream, "g"), [], "2, 3 and 4 are held")
    check_results(await env.rheo.renew(first, lease_ms=env.short_ms), [first], [None],
                  "renew a's head to a short lease")
    check_equal(await env.rheo.trim(stream, up_to={0: 2}, force=True), {0: 2}, "trim 1 and 2")
    await env.expire()  # the trimmed head's lease runs out: nothing may come back of it
    third = await env.fetch(stream, "g")
    check_equal(tried(third), [(3, 1)], "3 is a's head now")
    check_equal(await env.fetch(stream, "g"), [], "4 waits for 3, b is leased")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "frontier after the trim")
    await env.ack_ok(third)
    fourth = await env.fetch(stream, "g")
    check_equal(tried(fourth), [(4, 1)], "then 4")
    await env.ack_ok([*fourth, other])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 5}, "frontier at the end")


def _at(leases: Sequence[Lease]) -> dict[tuple[int, int], Lease]:
    return {(lease.partition, lease.sequence): lease for lease in leases}


async def _cross_two_groups(env: CaseEnv, stream: str) -> dict[tuple[int, int], Lease]:
    """Group ``n`` (unordered) and group ``k`` (key-ordered) each leave nacked, expiring
    and held deliveries where the other has others; returns ``k``'s first leases.

    Both partitions hold keys x, x, z, z. ``n``: (0, 1) and (1, 2) acked, (0, 2) and
    (1, 4) held, (0, 3) and (0, 4) expiring, (1, 1) and (1, 3) nacked. ``k``: (1, 1)
    acked, (0, 3) and (1, 3) held then (1, 3) nacked, (0, 1) and (1, 2) expiring.
    """
    for partition in (0, 1):
        await env.rheo.append(stream, [NewEvent("t", {"n": i}, key=k, partition=partition)
                                       for i, k in enumerate("xxzz")])
    n = _at(await env.fetch(stream, "n", partitions=[0], lease_ms=env.short_ms))
    n |= _at(await env.fetch(stream, "n", partitions=[1]))
    await env.ack_ok([n[0, 1], n[1, 2]])
    check_results(await env.rheo.renew(n[0, 2], lease_ms=env.long_ms), [n[0, 2]], [None],
                  "n renews (0, 2)")
    check_results(await env.rheo.nack([n[1, 1], n[1, 3]], "r"), [n[1, 1], n[1, 3]],
                  [None, None], "n nacks (1, 1) and (1, 3)")
    k = _at(await env.fetch(stream, "k", lease_ms=env.short_ms))
    check_equal(sorted(k), [(0, 1), (0, 3), (1, 1), (1, 3)], "k leases the head of each key")
    await env.ack_ok([k[1, 1]])
    held = [k[0, 3], k[1, 3]]
    check_results(await env.rheo.renew(held, lease_ms=env.long_ms), held, [None, None],
                  "k renews (0, 3) and (1, 3)")
    [k12] = await env.fetch(stream, "k", lease_ms=env.short_ms)
    check_equal((k12.partition, k12.sequence, k12.attempt), (1, 2, 1), "k's next of x in 1")
    check_results(await env.rheo.nack(k[1, 3], "r"), [k[1, 3]], [None], "k nacks (1, 3)")
    return k


@case(rules=["group.independent", "ordering.key_blocked", "lease.expiry", "settle.nack",
             "fetch.limit"], requires=["key_ordering"])
async def case_two_groups_redeliver_only_their_own(env: CaseEnv) -> None:
    """A key-ordered and an unordered group crossing redeliveries each fetch only their own.

    Both groups hold nacked, expired and held deliveries at sequences where the
    other holds deliveries in another state, in two partitions.
    """
    stream = await env.stream(2)
    await env.rheo.create_group(stream, "k", ordering="key")
    await env.rheo.create_group(stream, "n")
    k = await _cross_two_groups(env, stream)
    await env.expire()
    again = await env.fetch(stream, "k")
    check_equal(states(again), [(0, 1, 2), (1, 2, 2), (1, 3, 2)],
                "k: its expired heads of x and its nacked head of z, nothing of n's")
    check_equal(states(await env.fetch(stream, "n")),
                [(0, 3, 2), (0, 4, 2), (1, 1, 2), (1, 3, 2)],
                "n: its expired and nacked deliveries, nothing of k's")
    check_equal(await env.fetch(stream, "k"), [], "k: every other delivery blocked or held")
    check_equal(await env.fetch(stream, "n"), [], "n: every other delivery settled or held")
    check_equal(await env.rheo.frontier(stream, "k"), {0: 0, 1: 1}, "frontier of k")
    check_equal(await env.rheo.frontier(stream, "n"), {0: 1, 1: 0}, "frontier of n")
    await env.ack_ok([lease for lease in again if lease.partition == 0] + [k[0, 3]])
    check_equal(states(await env.fetch(stream, "k")), [(0, 2, 1), (0, 4, 1)],
                "k: the next of x and of z once their heads are acked")


@case(rules=["ordering.key_blocked", "ordering.released", "lease.expiry", "settle.nack"],
      requires=["key_ordering"])
async def case_key_with_settled_history_flows_exactly(env: CaseEnv) -> None:
    """A key's delivery that expires, is held and released after acked and rejected ones.

    It still gates exactly the key's later events, which then flow one at a time."""
    stream = await _keyed(env, ["a", "a", "b", "a", "a", None, "a"])
    first = await env.fetch(stream, "g")
    check_equal(_seqs(first), [1, 3, 6], "the head of a, of b and the keyless event")
    await env.ack_ok(first)
    [second] = await env.fetch(stream, "g")
    check_equal(tried([second]), [(2, 1)], "a after its acked first delivery")
    check_results(await env.rheo.reject(second, "bad"), [second], [None], "reject 2")
    [third] = await env.fetch(stream, "g", lease_ms=env.short_ms)
    check_equal(tried([third]), [(4, 1)], "a after an acked and a rejected delivery")
    await env.expire()
    held = await env.fetch(stream, "g")
    check_equal(tried(held), [(4, 2)], "the expired delivery comes back, the later ones wait")
    await env.rheo.append(stream, NewEvent("t", key="a", partition=0))
    check_equal(await env.fetch(stream, "g"), [], "a is held: 5, 7 and the new 8 wait")
    check_results(await env.rheo.nack(held, "again"), held, [None], "nack the redelivery")
    released = await env.fetch(stream, "g")
    check_equal(tried(released), [(4, 3)], "the nacked delivery, before any later one")
    await env.ack_ok(released)
    for sequence in (5, 7, 8):
        nxt = await env.fetch(stream, "g")
        check_equal(tried(nxt), [(sequence, 1)], "the key's next event, alone")
        check_equal(await env.fetch(stream, "g"), [], f"a is held by {sequence}")
        await env.ack_ok(nxt)
    check_equal(await env.fetch(stream, "g"), [], "the key is exhausted")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 8}, "frontier")
    check_equal([d.sequence for d in await env.rheo.dead_letters(stream, "g")], [2],
                "dead letters")
