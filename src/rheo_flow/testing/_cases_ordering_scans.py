"""Cases about how far a key-ordered fetch reads past its cursor.

A key-ordered fetch reads new events past its cursor and passes over the ones a
key blocks: it must find the free events behind long runs of blocked ones, stop
where its limit cuts the batch (and go on from there next time), and never let a
run of one key stall the others, within one fetch or across a few.
"""

from __future__ import annotations

from .._model._event import NewEvent
from ._case import CaseEnv, case, check, check_equal, tried
from ._cases_ordering import _keyed, _seqs

BLOCKED = 1_200
"""More blocked events of one key than a backend reads in one round (1,000 is common)."""


@case(rules=["ordering.others_flow", "fetch.limit"], requires=["key_ordering"])
async def case_free_events_behind_many_blocked(env: CaseEnv) -> None:
    """A fetch finds the free events behind more than a thousand blocked events of one key."""
    stream = await _keyed(env, ["a"] * (BLOCKED + 1) + ["b", None, "c"])
    free = [BLOCKED + 2, BLOCKED + 3, BLOCKED + 4]
    check_equal(_seqs(await env.fetch(stream, "g", 10)), [1, *free],
                "a's head, then past every blocked event of a")
    check_equal(await env.fetch(stream, "g", 10), [], "nothing more is eligible")
    await env.rheo.create_group(stream, "h", ordering="key")
    check_equal(_seqs(await env.fetch(stream, "h", 1)), [1], "another group: a's head")
    check_equal(_seqs(await env.fetch(stream, "h", 10)), free, "then the free events")
    await env.rheo.append(stream, [NewEvent("t", key="a", partition=0),
                                   NewEvent("t", key="d", partition=0)])
    check_equal(_seqs(await env.fetch(stream, "h", 10)), [BLOCKED + 6],
                "a new free event behind them")


@case(rules=["ordering.key_blocked", "ordering.others_flow", "fetch.fair"],
      requires=["key_ordering"])
async def case_blocked_runs_within_one_fetch(env: CaseEnv) -> None:
    """Within one fetch a key met earlier stays blocked however far the fetch reads,
    and a partition whose first events are blocked still gets its turns from the
    free events behind them."""
    free = ["f1", "f2", "f3", "f4", "f5", "f6"]
    for keys, want in (
        # x's second event is read only once partition 1 has come up short.
        ((["x", "w", "x", "y"], ["a", "a", "a"]), {0: [1, 2, 4], 1: [1]}),
        # b waits behind a run of a: it takes partition 1's second turn.
        ((["x", "w", "x", "y", "z"], ["a", "a", "a", "a", "b"]), {0: [1, 2], 1: [1, 5]}),
        # A longer run, beside two partitions of free events.
        ((["a", "a", "a", "a", "a", "b", "c"], free, free), {0: [1, 6], 1: [1, 2], 2: [1, 2]}),
        # A run beside a partition that runs dry and one that does not.
        ((["a", "a", "a", "a", "b", "c"], ["x", "y", "z", "w"], ["q"]), None),
    ):
        stream = await env.stream(partitions=len(keys))
        await env.rheo.create_group(stream, "g", ordering="key")
        for partition, part_keys in enumerate(keys):
            await env.rheo.append(stream, [NewEvent("t", key=k, partition=partition)
                                           for k in part_keys])
        got: dict[int, list[int]] = {p: [] for p in range(len(keys))}
        for lease in await env.fetch(stream, "g", 6 if len(keys) == 3 else 4):
            got[lease.partition].append(lease.sequence)
        got = {p: sorted(v) for p, v in got.items()}
        what = f"fetch over partitions keyed {keys}"
        if want is not None:
            check_equal(got, want, what)
        else:  # partition 0: a1, b5, c6 free; 1: four; 2: one. Shares 2 or 3, 2 or 3, 1.
            check(got[0] in ([1, 5], [1, 5, 6]) and got[1] in ([1, 2], [1, 2, 3])
                  and got[2] == [1] and sum(map(len, got.values())) == 6,
                  f"{what}: partition 0 takes turns from a1, b5 and c6: {got}")


@case(rules=["fetch.limit", "fetch.order", "ordering.others_flow"], requires=["key_ordering"])
async def case_key_ordered_fetch_cut_by_its_limit(env: CaseEnv) -> None:
    """A key-ordered fetch cut by its limit leaves the rest, and later appends, to next fetches."""
    # The read that finds b reads on to c (past a's blocked 2): c is cut off, not read.
    stream = await _keyed(env, ["a", "a", "b", "c"])
    check_equal(tried(await env.fetch(stream, "g", 2)), [(1, 1), (3, 1)],
                "a's head and b; the limit cuts c off (2 waits for 1)")
    await env.rheo.append(stream, [NewEvent("t", key="d", partition=0),
                                   NewEvent("t", key="a", partition=0)])
    check_equal(tried(await env.fetch(stream, "g", 10)), [(4, 1), (5, 1)],
                "c, first delivered now, then the new d (2 and 6 wait for 1)")
    check_equal(await env.fetch(stream, "g", 10), [], "nothing more is eligible")


LONG_RUN = 4_200
"""A run of blocked events longer than a backend may read in one fetch (4,096)."""


@case(rules=["ordering.others_flow", "fetch.limit"], requires=["key_ordering"])
async def case_free_events_behind_a_run_longer_than_one_read(env: CaseEnv) -> None:
    """Free events behind a blocked run longer than one fetch reads come within two fetches."""
    stream = await _keyed(env, ["a"])
    head = await env.fetch(stream, "g")
    check_equal(_seqs(head), [1], "a's head is leased")
    await env.rheo.append(stream, [NewEvent("t", key="a", partition=0)] * LONG_RUN
                          + [NewEvent("t", key="b", partition=0)])
    got = await env.fetch(stream, "g", 10)
    if not got:  # allowed once: the fetch read as far as it may and stopped there
        got = await env.fetch(stream, "g", 10)
    check_equal(tried(got), [(LONG_RUN + 2, 1)], "b, behind the whole run of a")
    await env.ack_ok(head)
    check_equal(tried(await env.fetch(stream, "g", 10)), [(2, 1)], "then a's next event")
