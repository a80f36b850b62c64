"""Cases about writing in the application's own transaction (capability
``in_transaction``, docs/outbox.md): appends and acks commit or roll back with it."""

from __future__ import annotations

from .._model._event import NewEvent
from ._case import CaseEnv, case, check, check_equal


@case(rules=["transaction.append"], requires=["in_transaction"], needs_transaction=True)
async def case_an_append_commits_with_the_application(env: CaseEnv) -> None:
    """Events appended in the application's transaction appear when it commits, once."""
    stream = await env.stream()
    async with env.transaction() as tx:
        events = await env.rheo.append(stream, [NewEvent("t", {"n": n}, id=f"e{n}")
                                                for n in range(3)], connection=tx.connection)
        check_equal([e.sequence for e in events], [1, 2, 3], "the sequences appended")
        again = await env.rheo.append(stream, NewEvent("t", {"n": 0}, id="e0"),
                                      connection=tx.connection)
        check_equal([e.sequence for e in again], [1], "an id appended earlier in it")
        await tx.commit()
    check_equal((await env.rheo.stream_info(stream)).high_water, {0: 3}, "after the commit")
    leases = await env.fetch(stream, "g")
    check_equal([lease.event.id for lease in leases], ["e0", "e1", "e2"], "delivered once")


@case(rules=["transaction.append"], requires=["in_transaction"], needs_transaction=True)
async def case_a_rolled_back_append_leaves_no_trace(env: CaseEnv) -> None:
    """A rolled-back append leaves nothing: the next append takes the same sequence."""
    stream = await env.stream()
    await env.rheo.append(stream, NewEvent("t", {}, id="first"))
    async with env.transaction() as tx:
        await env.rheo.append(stream, NewEvent("t", {}, id="gone"), connection=tx.connection)
        await tx.rollback()
    check_equal((await env.rheo.stream_info(stream)).high_water, {0: 1}, "after the rollback")
    [kept] = await env.rheo.append(stream, NewEvent("t", {}, id="next"))
    check_equal(kept.sequence, 2, "the next append's sequence (no gap)")
    check_equal([lease.event.id for lease in await env.fetch(stream, "g")], ["first", "next"],
                "what a group is given")


@case(rules=["transaction.ack"], requires=["in_transaction"], needs_transaction=True)
async def case_an_ack_commits_or_rolls_back_with_the_application(env: CaseEnv) -> None:
    """An ack in the application's transaction takes effect only when it commits."""
    stream = await env.stream()
    await env.rheo.append(stream, [NewEvent("t", {}), NewEvent("t", {})])
    first, second = await env.fetch(stream, "g")
    async with env.transaction() as tx:
        [result] = await env.rheo.ack(first, connection=tx.connection)
        check(result.ok and not result.repeated, f"the ack in the transaction: {result}")
        await tx.rollback()
    [result] = await env.rheo.ack(first)
    check(result.ok and not result.repeated, f"the ack after a rollback takes effect: {result}")
    async with env.transaction() as tx:
        await env.rheo.ack(second, connection=tx.connection)
        await tx.commit()
    [result] = await env.rheo.ack(second)
    check(result.ok and result.repeated, f"an ack after the commit repeats it: {result}")
    check_equal(await env.rheo.frontier(stream, "g"), {0: 2}, "the frontier")
