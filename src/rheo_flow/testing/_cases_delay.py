"""Cases about delayed delivery (``NewEvent(deliver_at=...)``, docs/contract.md,
"Delayed delivery"): a scheduled event takes its sequence at append, and no group
leases it before its time.

On a harness with a manual clock the time is checked to the millisecond (a fetch
a millisecond before finds nothing); on a real clock the event is scheduled
:attr:`~._case.CaseEnv.short_ms` ahead and the case lets that run out.
"""

from __future__ import annotations

from .._model._event import Event, NewEvent
from .._model._lease import Lease
from ._case import CaseEnv, case, check, check_equal, positions

Position = tuple[int, int]

_NEEDS = ["delayed_delivery"]


async def _until_due(env: CaseEnv, stream: str, group: str) -> None:
    """Let an event scheduled :attr:`~CaseEnv.short_ms` ahead become due: with exact
    time, to the millisecond, after a fetch a millisecond before found nothing."""
    await env.expire_at_the_deadline(stream, group)


async def _scheduled(env: CaseEnv, stream: str, *events: NewEvent) -> list[Event]:
    """Append ``events`` in one call and return the stored events."""
    return await env.rheo.append(stream, list(events))


def _leased_on_time(env: CaseEnv, leases: list[Lease], scheduled: dict[Position, int]
                    ) -> bool:
    """Whether ``leases`` (taken by ``env.fetch``, for ``long_ms``) hold a scheduled event
    (``scheduled``: its time by position), each leased no earlier than its time by the
    backend's clock (its deadline - ``long_ms``). With exact time, where no time passes
    unless the case says so, they must hold none; on a real clock the time may have
    come meanwhile (then the case checks no more of what waits)."""
    found = [lease for lease in leases if (lease.partition, lease.sequence) in scheduled]
    for lease in found:
        at = scheduled[(lease.partition, lease.sequence)]
        leased_at = lease.deadline_ms - env.long_ms
        check(leased_at >= at, f"{(lease.partition, lease.sequence)} was leased at {leased_at}, "
              f"before its time {at}")
    check(not (found and env.exact_time), f"a scheduled event was leased before its time: "
          f"{positions(found)}")
    return bool(found)


def _others(items: list[Lease], scheduled: dict[Position, int]) -> list[Position]:
    """The positions of ``items`` that are not scheduled."""
    return [p for p in positions(items) if p not in scheduled]


@case(rules=["delay.sequence", "delay.not_before", "delay.unordered"], requires=_NEEDS)
async def case_scheduled_event_waits_for_its_time(env: CaseEnv) -> None:
    """A scheduled event takes its sequence at append; later events flow past it."""
    stream = await env.stream()
    at = await env.now() + env.short_ms
    stored = await _scheduled(env, stream, NewEvent("t", 1), NewEvent("t", 2, deliver_at=at),
                              NewEvent("t", 3))
    check_equal([e.sequence for e in stored], [1, 2, 3], "the sequences taken at append")
    leases = await env.fetch(stream, "g")
    scheduled = {(0, 2): at}
    check_equal(_others(leases, scheduled), [(0, 1), (0, 3)], "a fetch before its time")
    await env.ack_ok(leases)
    if _leased_on_time(env, leases, scheduled):
        return
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1},
                "the frontier waits behind the scheduled event")
    await _until_due(env, stream, "g")
    due = await env.fetch(stream, "g")
    check_equal([(lease.sequence, lease.attempt) for lease in due], [(2, 1)],
                "a fetch at its time: its first attempt")
    check_equal(due[0].event, stored[1], "the event leased is the event stored")
    await env.ack_ok(due)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "the frontier once it is acked")


@case(rules=["delay.not_before"], requires=_NEEDS)
async def case_scheduled_run_at_the_head_waits(env: CaseEnv) -> None:
    """Scheduled events at the head of a partition and behind a backlog wait alike."""
    stream = await env.stream(partitions=2)
    at = await env.now() + env.short_ms
    await _scheduled(env, stream, *[NewEvent("t", n, partition=0, deliver_at=at)
                                    for n in range(3)])
    await _scheduled(env, stream, *[NewEvent("t", n, partition=1, deliver_at=at if n >= 4
                                             else None) for n in range(6)])
    first = await env.drain(stream, "g", limit=2)
    scheduled = {(0, 1): at, (0, 2): at, (0, 3): at, (1, 5): at, (1, 6): at}
    check_equal(sorted(_others(first, scheduled)), [(1, n) for n in range(1, 5)],
                "every fetch before their time")
    _leased_on_time(env, first, scheduled)
    await _until_due(env, stream, "g")
    due = await env.drain(stream, "g", limit=2)
    check_equal(sorted(positions(first + due)), sorted([*scheduled, *_others(first, scheduled)]),
                "the fetches at their time: every event once")
    await env.ack_ok(first + due)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3, 1: 6}, "the frontiers")


@case(rules=["delay.not_before", "delay.at_once"], requires=_NEEDS)
async def case_deliver_at_now_or_past_is_at_once(env: CaseEnv) -> None:
    """An event whose deliver_at is not ahead is delivered at once, in sequence order."""
    stream = await env.stream()
    now = await env.now()
    await _scheduled(env, stream, NewEvent("t", 1, deliver_at=0),
                     NewEvent("t", 2, deliver_at=now - 1_000), NewEvent("t", 3))
    check_equal(positions(await env.fetch(stream, "g")), [(0, 1), (0, 2), (0, 3)],
                "events due already")


@case(rules=["delay.key_ordered"], requires=[*_NEEDS, "key_ordering"])
async def case_scheduled_event_holds_its_key(env: CaseEnv) -> None:
    """In a key-ordered group a scheduled event holds its key; other keys flow."""
    stream = await env.stream()
    await env.rheo.create_group(stream, "g", ordering="key")
    at = await env.now() + env.short_ms
    await _scheduled(env, stream, NewEvent("t", 1, key="a", deliver_at=at),
                     NewEvent("t", 2, key="a"), NewEvent("t", 3, key="b"))
    leases = await env.fetch(stream, "g")
    scheduled = {(0, 1): at}
    check_equal(_others(leases, scheduled), [(0, 3)], "before its time: only the other key")
    await env.ack_ok(leases)
    if _leased_on_time(env, leases, scheduled):
        return
    await _until_due(env, stream, "g")
    due = await env.fetch(stream, "g")
    check_equal(positions(due), [(0, 1)], "at its time: the scheduled event, its key held")
    await env.ack_ok(due)
    after = await env.fetch(stream, "g")
    check_equal(positions(after), [(0, 2)], "once it is acked: the next of its key")
    await env.ack_ok(after)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 3}, "the frontier")


@case(rules=["delay.replay", "delay.not_before"], requires=_NEEDS)
async def case_replay_respects_deliver_at(env: CaseEnv) -> None:
    """Replay and reset deliver a scheduled event again, still not before its time."""
    stream = await env.stream()
    at = await env.now() + env.long_ms
    await _scheduled(env, stream, NewEvent("t", 1), NewEvent("t", 2, deliver_at=at),
                     NewEvent("t", 3))
    await env.ack_ok(await env.fetch(stream, "g"))
    await env.rheo.replay(stream, "g")
    check_equal(positions(await env.fetch(stream, "g")), [(0, 1), (0, 3)], "after a replay")
    await env.rheo.reset(stream, "g", to="latest")
    await env.rheo.reset(stream, "g", to="earliest")
    again = await env.fetch(stream, "g")
    check_equal(positions(again), [(0, 1), (0, 3)], "after a reset")
    await env.ack_ok(again)
    check_equal(await env.rheo.frontier(stream, "g"), {0: 1}, "the frontier waits")


@case(rules=["delay.lag"], requires=_NEEDS)
async def case_lag_counts_scheduled_apart(env: CaseEnv) -> None:
    """scheduled() counts, within the lag, the events waiting for their time."""
    stream = await env.stream(partitions=2)
    at = await env.now() + env.long_ms
    await _scheduled(env, stream, NewEvent("t", 1, partition=0, deliver_at=at),
                     NewEvent("t", 2, partition=0), NewEvent("t", 3, partition=1, deliver_at=0))
    await env.rheo.create_group(stream, "g")
    check_equal(await env.rheo.scheduled(stream, "g"), {0: 1, 1: 0}, "before any fetch")
    await env.ack_ok(await env.fetch(stream, "g"))
    check_equal(await env.rheo.lag(stream, "g"), {0: 2, 1: 0}, "the lag")
    check_equal(await env.rheo.scheduled(stream, "g"), {0: 1, 1: 0}, "scheduled")
    await env.rheo.reset(stream, "g", to="latest")
    check_equal(await env.rheo.scheduled(stream, "g"), {0: 0, 1: 0},
                "none past the frontier after a reset to the latest")


@case(rules=["delay.sequence", "append.idempotent"], requires=_NEEDS)
async def case_scheduled_append_is_idempotent(env: CaseEnv) -> None:
    """Appending a scheduled event's id again returns it as stored, its time unchanged."""
    stream = await env.stream()
    at = await env.now() + env.long_ms
    first = await _scheduled(env, stream, NewEvent("t", 1, id="x", deliver_at=at))
    again = await _scheduled(env, stream, NewEvent("t", 1, id="x"),
                             NewEvent("t", 2, id="y", deliver_at=at))
    check_equal(again[0], first[0], "the stored event, returned again")
    check_equal(again[1].sequence, 2, "the second event's sequence")
    check_equal(await env.fetch(stream, "g"), [], "neither is due: the retry kept its time")
