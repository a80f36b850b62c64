"""Cases about retention policies (rules ``retention.policy`` and ``retention.settled``):
a stream keeps its policy, and applying it removes only what every group has settled."""

from __future__ import annotations

from datetime import timedelta

from .._model._errors import InvalidArgument, UnknownStream
from .._model._query import Query
from .._model._stream import Retention
from ._case import CaseEnv, case, check, check_equal, expect_error, positions

_GAP_MS = 400
"""Backend time let pass between the old events and the new ones of an age case."""


async def _retained(env: CaseEnv, stream: str) -> list[tuple[int, int]]:
    """The (partition, sequence) of every event the stream still holds."""
    return positions((await env.rheo.query_page(Query(stream=stream), limit=1000)).events)


@case(rules=["retention.policy", "stream.lifecycle", "delete.stream"],
      requires=["retention"])
async def case_retention_policy_is_kept_with_the_stream(env: CaseEnv) -> None:
    """A stream keeps its retention policy until it is replaced, cleared or deleted.

    stream_info and describe_streams report it; a stream created again after its
    deletion has none; a bad policy is an InvalidArgument."""
    name = env.name("s")
    weekly = Retention(max_age=timedelta(days=7))
    info = await env.rheo.create_stream(name, partitions=2, retention=weekly)
    check_equal(info.retention, weekly, "create_stream with a policy returns it")
    check_equal((await env.rheo.stream_info(name)).retention, weekly, "stream_info")
    check_equal((await env.rheo.create_stream(name, partitions=2)).retention, weekly,
                "create_stream without a policy leaves the stored one")
    both = Retention(max_age=timedelta(hours=12, milliseconds=5), max_events=1000)
    check_equal((await env.rheo.create_stream(name, partitions=2, retention=both)).retention,
                both, "create_stream with another policy replaces it")
    described = {info.name: info for info, _ in await env.rheo.describe_streams()}
    check_equal(described[name].retention, both, "describe_streams")
    count = Retention(max_events=3)
    check_equal((await env.rheo.set_retention(name, count)).retention, count, "set_retention")
    other = await env.stream()
    check_equal((await env.rheo.stream_info(other)).retention, None,
                "a stream created without a policy has none")
    check_equal((await env.rheo.stream_info(name)).retention, count, "stream_info after it")
    check_equal((await env.rheo.set_retention(name, None)).retention, None, "cleared")
    check_equal((await env.rheo.stream_info(name)).retention, None, "stream_info, cleared")
    await env.rheo.set_retention(name, weekly)
    await env.rheo.delete_stream(name)
    check_equal((await env.rheo.create_stream(name, partitions=2)).retention, None,
                "a stream created again after its deletion has no policy")
    await expect_error(UnknownStream, env.rheo.set_retention(env.name("missing"), weekly),
                       "set_retention of a missing stream")
    for bad in ({}, {"max_events": 0}, {"max_age": timedelta(0)},
                {"max_age": timedelta(microseconds=1500)}, {"max_events": True}):
        try:
            Retention(**bad)
        except InvalidArgument:
            continue
        check(False, f"Retention({bad}) is refused")
    await expect_error(InvalidArgument, env.rheo.set_retention(name, 3),  # type: ignore[arg-type]
                       "set_retention with no Retention")


@case(rules=["retention.settled", "trim.removed"], requires=["retention", "trim"])
async def case_retention_keeps_the_last_events(env: CaseEnv) -> None:
    """max_events removes all but each partition's last N settled events, once.

    Applying it again removes nothing more; a policy given to apply_retention is
    applied without being stored; without a policy nothing goes."""
    stream = await env.stream_with(5, 3, 0)
    await env.rheo.set_retention(stream, Retention(max_events=2))
    check_equal(await env.rheo.apply_retention(stream), {0: 3, 1: 1, 2: 0},
                "a stream without groups: the policy applies fully")
    check_equal(await _retained(env, stream), [(0, 4), (0, 5), (1, 2), (1, 3)], "retained")
    await env.append(stream, 3, partition=0)
    await env.ack_ok(await env.drain(stream, "g"))
    check_equal(await env.rheo.apply_retention(stream), {0: 3, 1: 0, 2: 0},
                "the new events push the old ones out, once settled")
    check_equal(await env.rheo.apply_retention(stream), {0: 0, 1: 0, 2: 0}, "again: nothing")
    info = await env.rheo.stream_info(stream)
    check_equal(dict(info.low_water), {0: 7, 1: 2, 2: 1}, "low water")
    check_equal(dict(info.high_water), {0: 8, 1: 3, 2: 0}, "high water stays")
    check_equal(await env.rheo.apply_retention(stream, Retention(max_events=1)),
                {0: 1, 1: 1, 2: 0}, "a policy given to apply_retention, not stored")
    check_equal((await env.rheo.stream_info(stream)).retention, Retention(max_events=2),
                "the stored policy stays")
    await env.rheo.set_retention(stream, None)
    await env.append(stream, 4, partition=1)
    await env.ack_ok(await env.drain(stream, "g"))
    check_equal(await env.rheo.apply_retention(stream), {0: 0, 1: 0, 2: 0},
                "no policy: nothing is removed")


@case(rules=["retention.settled", "trim.bound", "frontier.contiguous"],
      requires=["retention", "trim"])
async def case_retention_never_removes_an_unsettled_event(env: CaseEnv) -> None:
    """A retention policy never removes an event some group has not settled.

    Not one leased, nacked, not yet fetched or behind a group's start, whichever
    group it is; force lifts the cap, as for trim."""
    stream = await env.stream_with(6, 6)
    await env.rheo.create_group(stream, "late", start=2)  # settled up to 2 by its start
    await env.ack_ok(await env.drain(stream, "g"))
    held = await env.fetch(stream, "h", 3, partitions=[0])  # (0, 1..3) leased
    await env.ack_ok([held[0]])
    nacked = await env.fetch(stream, "h", 2, partitions=[1])
    await env.ack_ok([nacked[0]])
    await env.rheo.nack(nacked[1:], "later", delay_ms=env.long_ms)  # (1, 2) waits
    await env.rheo.set_retention(stream, Retention(max_events=1))
    check_equal(await env.rheo.apply_retention(stream), {0: 1, 1: 1},
                "only what every group settled: (0, 1) and (1, 1)")
    check_equal(await env.rheo.frontier(stream, "h"), {0: 1, 1: 1}, "h's frontier")
    check_equal(await _retained(env, stream),
                [(0, s) for s in range(2, 7)] + [(1, s) for s in range(2, 7)], "retained")
    await env.ack_ok(held[1:])
    check_equal(await env.rheo.apply_retention(stream), {0: 1, 1: 0},
                "h settled (0, 2..3); late has settled only up to 2")
    check_equal(await env.rheo.apply_retention(stream, force=True), {0: 3, 1: 4},
                "forced: all but the last event of each partition")
    check_equal(await _retained(env, stream), [(0, 6), (1, 6)], "retained after the force")


@case(rules=["retention.settled", "position.time"], requires=["retention", "trim"])
async def case_retention_removes_events_past_their_age(env: CaseEnv) -> None:
    """max_age removes the settled events appended longer ago than it (backend clock).

    An event exactly max_age old stays, one a millisecond older goes."""
    stream = await env.stream(partitions=2)
    old = await env.append(stream, 2, partition=0)
    await env.advance(_GAP_MS)
    new = await env.append(stream, 2, partition=0) + await env.append(stream, 1, partition=1)
    await env.ack_ok(await env.drain(stream, "g"))
    if env.exact_time:  # time moves only when told: the cut is exact
        age = await env.now() - old[-1].appended_at_ms
        check(age >= _GAP_MS, "the backend's now is past its stamps")
        policy = Retention(max_age=timedelta(milliseconds=age))
        check_equal(await env.rheo.apply_retention(stream, policy), {0: 0, 1: 0},
                    "events exactly max_age old stay")
        await env.advance(1)
        check_equal(await env.rheo.apply_retention(stream, policy), {0: 2, 1: 0},
                    "a millisecond later the old events are older than max_age")
        check_equal(await _retained(env, stream), [(0, 3), (0, 4), (1, 1)], "retained")
        return
    await env.rheo.set_retention(stream, Retention(max_age=timedelta(
        milliseconds=_GAP_MS // 2)))
    before = await env.now()
    removed = await env.rheo.apply_retention(stream)
    after = await env.now()
    check(before - old[-1].appended_at_ms > _GAP_MS // 2 + env.margin_ms,
          "the old events are older than max_age")
    check(removed[0] >= 2, f"the old events go: removed {removed}")
    if after - new[0].appended_at_ms < _GAP_MS // 2 - env.margin_ms:
        check_equal(removed, {0: 2, 1: 0}, "the new ones, younger than max_age, stay")
