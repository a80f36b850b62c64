"""Cases about key-ordered groups taken back: redrive and replay beside leases and held events.

A redrive puts a dead letter back into its key's order, ahead of a later
delivery already leased (``ordering.key_blocked`` lets that lease run) or
behind the key's earlier ones; a replay cuts each key's deliveries at its
sequence. A backend keeping the key's order in links or per-key records must
leave every later event reachable.
"""

from __future__ import annotations

from .._model._event import NewEvent
from .._model._lease import Lease
from .._model._settle_results import SettleKind
from ._case import CaseEnv, case, check_equal, check_results, tried
from ._cases_ordering import _at, _keyed


@case(rules=["ordering.key_blocked", "ordering.released", "replay.from_sequence",
             "settle.fencing", "frontier.contiguous"], requires=["key_ordering"])
async def case_replay_through_held_keys(env: CaseEnv) -> None:
    """A replay from the middle of keys with leased heads and held events.

    a is leased at 1 with 3, 5 and 8 held; b's 2 is acked and its 6 leased; c is
    leased at 4 with 7 held. Replaying from 6 keeps the leases of 1 and 4 and the
    events of their keys before 6 held behind them, makes the lease of b's head 6
    stale, and the replayed events of each key come back in its order again.
    """
    stream = await _keyed(env, ["a", "b", "a", "c", "a", "b", "c", "a"])
    first = _at(await env.fetch(stream, "g"))
    check_equal(sorted(first), [(0, 1), (0, 2), (0, 4)], "the heads of a, b and c")
    await env.ack_ok([first[0, 2]])
    [six] = await env.fetch(stream, "g")
    check_equal(tried([six]), [(6, 1)], "b's next once 2 is acked")
    await env.rheo.replay(stream, "g", from_sequence=6)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier after the replay")
    check_results(await env.rheo.ack(six), [six], [SettleKind.STALE_LEASE],
                  "the replayed lease of 6")
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(6, 1)], "b is free: 6 again; 5, 7 and 8 held")
    check_equal(await env.fetch(stream, "g"), [], "a and c are still held")
    await env.ack_ok([first[0, 1], *again])
    third = await env.fetch(stream, "g")
    check_equal(tried(third), [(3, 1)], "a's 3, kept behind 1 by the replay")
    await env.ack_ok([*third, first[0, 4]])
    nxt = await env.fetch(stream, "g")
    check_equal(tried(nxt), [(5, 1), (7, 1)], "then a's 5 and the replayed 7 of c")
    check_equal(await env.fetch(stream, "g"), [], "8 waits for 5")
    await env.ack_ok(nxt)
    last = await env.fetch(stream, "g")
    check_equal(tried(last), [(8, 1)], "then 8")
    await env.ack_ok(last)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 8}, "final frontier")


@case(rules=["ordering.key_blocked", "redrive.dead_letters_only", "lease.expiry", "fetch.limit"],
      requires=["key_ordering"])
async def case_redriven_head_and_a_later_lease(env: CaseEnv) -> None:
    """A redriven dead letter and a later lease of its key at once; the later one then expires.

    The redrive does not revoke the later lease, and the redriven delivery is
    eligible at once (nothing before it is unsettled); once the later lease
    expires, that delivery waits behind the redriven one like any other.
    """
    whens: tuple[str, ...] = ("before the expiry", "after the expiry")
    for when in whens:
        stream = await _keyed(env, ["a", "a", "a"])
        [first] = await env.fetch(stream, "g")
        check_results(await env.rheo.reject(first, "bad"), [first], [None], f"{when}: reject 1")
        [second] = await env.fetch(stream, "g", lease_ms=env.short_ms)
        check_equal(second.sequence, 2, f"{when}: the key is released by the reject")
        check_equal(await env.rheo.redrive(stream, "g"), 1, f"{when}: redrive 1")
        check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, f"{when}: frontier")
        if when == "before the expiry":
            redelivered = await env.fetch(stream, "g")
            await env.expire()
        else:
            await env.expire()
            redelivered = await env.fetch(stream, "g")
        check_equal(tried(redelivered), [(1, 1)], f"{when}: the redriven 1 only")
        check_equal(await env.fetch(stream, "g"), [], f"{when}: 2 (expired) and 3 wait for 1")
        check_equal(await env.rheo.dead_letters(stream, "g"), [], f"{when}: no dead letter")
        check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, f"{when}: 1 is leased")
        await env.ack_ok(redelivered)
        nxt = await env.fetch(stream, "g")
        check_equal(tried(nxt), [(2, 2)], f"{when}: 2 again once 1 is acked")
        check_equal(await env.fetch(stream, "g"), [], f"{when}: 3 waits for 2")
        await env.ack_ok(nxt)
        last = await env.fetch(stream, "g")
        check_equal(tried(last), [(3, 1)], f"{when}: then 3")
        await env.ack_ok(last)
        check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, f"{when}: final frontier")


@case(rules=["ordering.key_blocked", "redrive.dead_letters_only"], requires=["key_ordering"])
async def case_redriven_dead_letters_head_a_free_key(env: CaseEnv) -> None:
    """Dead letters redriven when their key has nothing unsettled: they flow in order, and
    block the key's new events."""
    stream = await _keyed(env, ["a", "a", "a"])
    for n in (1, 2):
        [lease] = await env.fetch(stream, "g")
        check_results(await env.rheo.reject(lease, "bad"), [lease], [None], f"reject {n}")
    await env.ack_ok(await env.fetch(stream, "g"))
    check_equal(await env.rheo.redrive(stream, "g"), 2, "redrive 1 and 2")
    await env.rheo.append(stream, NewEvent("t", key="a", partition=0))
    await _flow_one_at_a_time(env, stream, [1, 2, 4])


@case(rules=["ordering.key_blocked", "ordering.released", "redrive.dead_letters_only"],
      requires=["key_ordering"])
async def case_later_lease_rejected_behind_a_redriven_head(env: CaseEnv) -> None:
    """The later lease beside a redriven head is rejected, then redriven too.

    Both flow in order, and the key's held event after them still comes.
    """
    stream = await _keyed(env, ["a", "a", "a"])
    [first] = await env.fetch(stream, "g")
    check_results(await env.rheo.reject(first, "bad"), [first], [None], "reject 1")
    [second] = await env.fetch(stream, "g")
    check_equal(tried([second]), [(2, 1)], "2 leased, 3 held")
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive 1")
    check_results(await env.rheo.reject(second, "bad"), [second], [None], "reject 2")
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive 2")
    await _flow_one_at_a_time(env, stream, [1, 2, 3])


async def _flow_one_at_a_time(env: CaseEnv, stream: str, sequences: list[int]) -> None:
    """Key a's deliveries ``sequences`` of partition 0 come one fetch at a time, each a
    first attempt holding the key until acked; the frontier ends at the last."""
    for n in sequences:
        got = await env.fetch(stream, "g")
        check_equal(tried(got), [(n, 1)], f"{n}, alone")
        check_equal(await env.fetch(stream, "g"), [], f"a is held by {n}")
        await env.ack_ok(got)
    check_equal(await env.rheo.frontier(stream, "g"), {0: sequences[-1]}, "final frontier")


@case(rules=["ordering.released", "redrive.dead_letters_only", "settle.results"],
      requires=["key_ordering"])
async def case_redriven_head_and_later_lease_acked_in_one_batch(env: CaseEnv) -> None:
    """A redriven head and the later lease beside it, acked in one batch in either order,
    release the key: its held event comes next."""
    orders: tuple[str, ...] = ("later first", "head first")
    for order in orders:
        stream = await _keyed(env, ["a", "a", "a"])
        [first] = await env.fetch(stream, "g")
        check_results(await env.rheo.reject(first, "bad"), [first], [None], f"{order}: reject 1")
        [second] = await env.fetch(stream, "g")
        check_equal(await env.rheo.redrive(stream, "g"), 1, f"{order}: redrive 1")
        [again] = await env.fetch(stream, "g")
        check_equal(tried([second, again]), [(2, 1), (1, 1)], f"{order}: 2, then 1 again")
        both = [second, again] if order == "later first" else [again, second]
        await env.ack_ok(both)
        check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, f"{order}: frontier")
        last = await env.fetch(stream, "g")
        check_equal(tried(last), [(3, 1)], f"{order}: then a's held 3")
        await env.ack_ok(last)
        check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, f"{order}: final frontier")


@case(rules=["ordering.key_blocked", "redrive.dead_letters_only", "settle.fencing"],
      requires=["key_ordering"])
async def case_redrives_one_by_one_ahead_of_a_lease(env: CaseEnv) -> None:
    """Dead letters of a key redriven one call each, while a later delivery is leased.

    Each takes its place in the key's order (the earliest ahead of the lease, each
    next one past those redriven before it): they flow in sequence order, then
    the key's held events; the later lease stays current throughout.
    """
    stream = await _keyed(env, ["a"] * 6)
    for n in (1, 2, 3):
        [lease] = await env.fetch(stream, "g")
        check_results(await env.rheo.reject(lease, "bad"), [lease], [None], f"reject {n}")
    [fourth] = await env.fetch(stream, "g")
    check_equal(tried([fourth]), [(4, 1)], "4 is leased, 5 and 6 held")
    dead = await env.rheo.dead_letters(stream, "g")
    for d in dead:
        check_equal(await env.rheo.redrive(stream, "g", [d]), 1, f"redrive {d.sequence}")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, "frontier")
    for n in (1, 2, 3):
        got = await env.fetch(stream, "g")
        check_equal(tried(got), [(n, 1)], f"the redriven {n}, alone")
        check_equal(await env.fetch(stream, "g"), [], f"a is held by {n}")
        await env.ack_ok(got)
    await env.ack_ok([fourth])
    for n in (5, 6):
        got = await env.fetch(stream, "g")
        check_equal(tried(got), [(n, 1)], f"then {n}")
        await env.ack_ok(got)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 6}, "final frontier")


async def _lease_after_a_dead_letter(env: CaseEnv, stream: str,
                                     how: str) -> tuple[Lease, list[Lease]]:
    """After a's dead letter 1: a's next delivery leased by a fetch of new events, and
    the other leases left current (none but with ``how == "acked amid other fetches"``:
    the keyless 2 before it on a shorter lease, the keyless 5 after it on a shorter one
    still, 4 held)."""
    if how == "acked amid other fetches":
        await env.rheo.append(stream, NewEvent("t", key=None, partition=0))
        others = await env.fetch(stream, "g", lease_ms=env.long_ms // 2)
        await env.rheo.append(stream, [NewEvent("t", key="a", partition=0)] * 2)
        [second] = await env.fetch(stream, "g")
        await env.rheo.append(stream, NewEvent("t", key=None, partition=0))
        others += await env.fetch(stream, "g", lease_ms=env.long_ms // 4)
        check_equal(tried([others[0], second, others[1]]), [(2, 1), (3, 1), (5, 1)],
                    f"{how}: the leases, 4 held")
        return second, others
    # a's next first (3 held, 4 keyless) or last (2 keyless, 4 held) of the fetch.
    keys = ("a", "a", None) if how != "acked after its expiry" else (None, "a", "a")
    await env.rheo.append(stream, [NewEvent("t", key=k, partition=0) for k in keys])
    got = await env.fetch(stream, "g", lease_ms=env.short_ms)
    check_equal(tried(got), [(2, 1), (3 if keys[0] is None else 4, 1)],
                f"{how}: a's next and the keyless one")
    second = got[0] if keys[0] == "a" else got[1]
    await env.ack_ok([lease for lease in got if lease is not second])
    return second, []


@case(rules=["ordering.key_blocked", "redrive.dead_letters_only", "settle.fencing",
             "settle.expired_unreleased", "lease.expiry"], requires=["key_ordering"])
async def case_redrive_ahead_of_a_first_lease(env: CaseEnv) -> None:
    """A dead letter redriven ahead of its key's next delivery, leased for the first time.

    The later delivery of a was leased by a fetch of new events, first or last of
    that fetch (with a keyless event, and a's next one held), or alone between
    fetches of other events (a keyless one dead-lettered and redriven along).
    The redrive leaves its lease as it was: it acks while the redriven one is
    out; once expired it settles while no one leased it again, and comes back
    with attempt 2 only after the redriven one; a nack taken before the redrive
    stays taken (its lease stale, its attempt counted).
    """
    hows: tuple[str, ...] = ("expires", "acked after its expiry", "nacked before",
                             "acked amid other fetches")
    for how in hows:
        stream = await _keyed(env, ["a"])
        [first] = await env.fetch(stream, "g")
        check_results(await env.rheo.reject(first, "bad"), [first], [None], f"{how}: reject 1")
        second, others = await _lease_after_a_dead_letter(env, stream, how)
        if how == "nacked before":
            check_results(await env.rheo.nack(second, "later", delay_ms=0), [second], [None],
                          f"{how}: nack {second.sequence}")
        if others:
            # The keyless 5; 2 stays leased, so both fetches' leases stay current.
            check_results(await env.rheo.reject(others[1], "bad"), others[1:], [None],
                          f"{how}: reject the keyless 5")
        check_equal(await env.rheo.redrive(stream, "g"), 2 if others else 1, f"{how}: redrive")
        check_equal(await env.rheo.frontier(stream, "g"), {0: 0}, f"{how}: frontier")
        if how == "nacked before":
            check_results(await env.rheo.ack(second), [second], [SettleKind.STALE_LEASE],
                          f"{how}: the nacked lease after the redrive")
        if others:
            await env.ack_ok([second, others[0]])
            redelivered = await env.fetch(stream, "g")
            check_equal(tried(redelivered), [(1, 1), (5, 1)], f"{how}: the redriven 1 and 5")
            await env.ack_ok(redelivered)
        else:
            await env.expire()
            redelivered = await env.fetch(stream, "g")
            check_equal(tried(redelivered), [(1, 1)], f"{how}: the redriven 1 only")
        if how == "acked after its expiry":
            check_results(await env.rheo.ack(second), [second], [None],
                          f"{how}: the expired lease of {second.sequence}, not leased again")
            await env.ack_ok(redelivered)
        elif not others:
            check_equal(await env.fetch(stream, "g"), [], f"{how}: a waits for 1")
            await env.ack_ok(redelivered)
            again = await env.fetch(stream, "g")
            check_equal(tried(again), [(second.sequence, 2)], f"{how}: again once 1 is acked")
            await env.ack_ok(again)
        last = await env.fetch(stream, "g")
        check_equal(tried(last), [(second.sequence + 1, 1)], f"{how}: then a's held one")
        await env.ack_ok(last)
        check_equal(await env.rheo.frontier(stream, "g"), {0: 5 if others else 4},
                    f"{how}: final frontier")


@case(rules=["ordering.released", "settle.nack", "redrive.dead_letters_only"],
      requires=["key_ordering"])
async def case_release_keeps_a_nacked_head_waiting(env: CaseEnv) -> None:
    """Settling a later lease of a key whose redriven head is nacked with a delay
    does not make the head due early: it waits for its delay."""
    stream = await _keyed(env, ["a", "a", "a"])
    [first] = await env.fetch(stream, "g")
    check_results(await env.rheo.reject(first, "bad"), [first], [None], "reject 1")
    [second] = await env.fetch(stream, "g")
    check_equal(second.sequence, 2, "the key is released by the reject")
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive 1")
    [again] = await env.fetch(stream, "g")
    check_equal(tried([again]), [(1, 1)], "the redriven 1, beside 2's lease")
    check_results(await env.rheo.nack(again, "later", delay_ms=env.long_ms), [again], [None],
                  "nack 1 with a delay")
    await env.ack_ok([second])
    check_equal(await env.fetch(stream, "g"), [],
                "1 waits for its delay, 3 waits for 1, after 2 is acked")


@case(rules=["ordering.key_blocked", "redrive.dead_letters_only", "settle.nack"],
      requires=["key_ordering"])
async def case_nacked_later_lease_waits_for_redriven_head(env: CaseEnv) -> None:
    """A later lease of a key nacked after an earlier delivery was redriven waits
    behind that one: only the redriven head is eligible."""
    stream = await _keyed(env, ["a", "a"])
    [first] = await env.fetch(stream, "g")
    check_results(await env.rheo.reject(first, "bad"), [first], [None], "reject a1")
    [second] = await env.fetch(stream, "g")
    check_equal(await env.rheo.redrive(stream, "g"), 1, "redrive a1")
    check_results(await env.rheo.nack(second, "again"), [second], [None], "nack a2")
    head = await env.fetch(stream, "g")
    check_equal(tried(head), [(1, 1)], "a1 only; a2 waits behind it")
    await env.ack_ok(head)
    check_equal(tried(await env.fetch(stream, "g")), [(2, 2)], "then a2")


@case(rules=["ordering.released", "lease.exclusive", "redrive.dead_letters_only",
             "wakeup.own_stream"], requires=["key_ordering"])
async def case_redriven_heads_pass_their_key_on(env: CaseEnv) -> None:
    """A redriven head settled ahead of its key's later deliveries passes the key on.

    It passes the key on as the later deliveries stand: a later one still leased
    keeps its lease (nothing becomes due, no one is woken), a later one rejected
    meanwhile is passed over, and the key is free.

    d holds 1 and 2, e holds 3 and 4. The heads 1 and 3 are rejected, so 2 and 4 are
    leased; both dead letters are redriven and leased again ahead of them; 4 is rejected.
    """
    stream = await _keyed(env, ["d", "d", "e", "e"])
    heads = await env.fetch(stream, "g")
    check_equal(tried(heads), [(1, 1), (3, 1)], "the heads of d and e")
    check_results(await env.rheo.reject(heads, "bad"), heads, [None, None], "reject 1 and 3")
    later = await env.fetch(stream, "g")
    check_equal(tried(later), [(2, 1), (4, 1)], "then 2 and 4")
    dead = await env.rheo.dead_letters(stream, "g")
    check_equal(await env.rheo.redrive(stream, "g", dead), 2, "redrive 1 and 3")
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(1, 1), (3, 1)], "the redriven heads, ahead of 2 and 4")
    check_results(await env.rheo.reject(later[1], "bad"), later[1:], [None], "reject 4")
    await env.rheo.wait_for_append(stream, 0.01)  # a wake-up the earlier settles may have left
    await env.ack_ok(again[:1])
    check_equal(await env.rheo.wait_for_append(stream, 0.05), False,
                "acking 1 made nothing due: 2 is leased")
    check_equal(await env.fetch(stream, "g"), [], "2 is leased")
    await env.ack_ok(again[1:])
    await env.rheo.append(stream, [NewEvent("t", key="e", partition=0)])
    last = await env.fetch(stream, "g")
    check_equal(tried(last), [(5, 1)], "e is free once 3 is acked: its new event 5")
    await env.ack_ok([later[0], *last])
    check_equal(await env.rheo.frontier(stream, "g"), {0: 5}, "frontier at the end")


@case(rules=["ordering.key_blocked", "lease.expiry", "fetch.limit"], requires=["key_ordering"])
async def case_expired_heads_of_every_key_come_back_together(env: CaseEnv) -> None:
    """Expired heads of several keys all come back in one fetch.

    Each heads its key, so one fetch leases every one of them again, not only the
    first key's."""
    stream = await env.stream()
    await env.rheo.create_group(stream, "g", ordering="key")
    await env.rheo.append(stream, [NewEvent("t", key=k, partition=0) for k in "cab" * 2])
    heads = await env.fetch(stream, "g", lease_ms=env.short_ms)
    check_equal(tried(heads), [(1, 1), (2, 1), (3, 1)], "the head of c, a and b")
    await env.expire()
    again = await env.fetch(stream, "g")
    check_equal(tried(again), [(1, 2), (2, 2), (3, 2)], "all three heads again, in one fetch")
    await env.ack_ok(again)
    check_equal(tried(await env.fetch(stream, "g")), [(4, 1), (5, 1), (6, 1)],
                "then the next event of each key")

